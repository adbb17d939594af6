"""Manifests (resolution R3): load, validate, canonicalise, hash (docs/manifest.md).

Modules:
    core       :class:`Manifest`, :func:`as_manifest`: validation, defaults, ``manifest_hash``, replay token
    schema     the keys a manifest may hold
    datasets   ``datasets`` as a map or the UML_OS kernel's list
    file       reading a manifest file: regular, bounded, no duplicate keys
    yaml_safe  YAML for untrusted files: safe tags, bounded aliases
    view       the read-only views a Manifest shows

``umlos_cuda.manifest`` exports what the one module of that name exported before
it became this package.
"""

from .core import (DEFAULT_BLOCK_SIZE, MAX_MANIFEST_BYTES, MAX_NESTING, DatasetSpec, Manifest, as_manifest,
                   canonicalize, read_manifest_file)

__all__ = ["DEFAULT_BLOCK_SIZE", "DatasetSpec", "Manifest", "as_manifest", "canonicalize", "read_manifest_file",
           "MAX_MANIFEST_BYTES", "MAX_NESTING"]
