"""Manifests: loading, validation, canonicalisation, ``manifest_hash``, replay token.

Resolution R3 fixes the bytes. A manifest is a mapping with at least
``global_batch_size`` and ``datasets: {KEY: {id, version, hash, cardinality}}``
(or the v3.8 kernel's list, which becomes that map: manifest/datasets.py).
Defaults are filled *before* hashing so that stating a default and omitting it
hash the same. The replay token hashes what the manifest declares (``policy``,
``env``), never the machine, so a sequence is the same everywhere.

Type errors and unknown keys are caught here, at load (``INVALID_MANIFEST``,
with a pointer to docs/manifest.md, which lists every key); whether the values
make a usable configuration for one call (``global_batch_size = 0``, a world
size that does not divide it, ...) is checked by the call, with R8's codes,
because it depends on the call's arguments. Reading files (size bounds, YAML
aliases, duplicate keys) is manifest/file.py's job; the allowed keys are
manifest/schema.py's.

A :class:`Manifest` cannot change once built: its hashes and the fields the
engine reads are computed together from a private copy, and what it shows
(``canonical``, ``datasets``) are read-only views (manifest/view.py), so an
edit can never make ``next_batch`` use values other than those ``hash``
names. :func:`as_manifest` is the one conversion from what entry points
accept (a Manifest, a mapping, a file path).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import checks, errors
from ..errors import UmlosError
from ..hashing import hash_canonical, sha256
from .file import MAX_EXPANDED_BYTES, MAX_EXPANDED_NODES, MAX_MANIFEST_BYTES, MAX_NESTING, read_manifest_file
from .datasets import check_split, datasets_as_map
from .schema import (ANY, DATA_KEYS, DATASET_KEYS, DATASET_OPTIONAL_KEYS, DOCS, FREE_FORM_KEYS, TOP_LEVEL_KEYS,
                     invalid_manifest, refuse_unknown_keys, unknown_keys)
from .view import HOW_TO_CHANGE, ReadOnlyDict, freeze, thaw
from ..modes import DEFAULT_MODE, mode_names

__all__ = ["DatasetSpec", "Manifest", "as_manifest", "canonicalize", "read_manifest_file", "MAX_MANIFEST_BYTES",
           "MAX_NESTING"]

#: R3 defaults, filled before hashing.
DEFAULT_SPEC_VERSION = "UML_OS-v3.8-OS"
DEFAULT_SEED = 0
DEFAULT_BLOCK_SIZE = 1 << 20  # 1_048_576, docs/spec/nextbatch-v2.md §1
DEFAULT_DROP_LAST = False
#: ``data.sampling_mode`` when absent. Unlike the defaults above it is never
#: written into the canonical manifest (stating it is removed instead), so
#: manifests from before sampling modes keep their hashes and their bits.
DEFAULT_SAMPLING_MODE = DEFAULT_MODE

#: The dataset fields every entry must have (docs/manifest.md).
DATASET_REQUIRED_FIELDS = DATASET_KEYS

#: Wordings of the checks below (templates of umlos_cuda.checks).
_A_MAPPING = "{name} must be a mapping, got {type}"
_NEEDS_DATASETS = ("manifest needs datasets: {{KEY: {{id, version, hash, cardinality}}}} or a list of "
                   "{{id, version, hash, split, cardinality}}")


@dataclass(frozen=True, slots=True)
class DatasetSpec:
    """One entry of ``manifest.datasets``, frozen; ``cardinality`` is N; ``split``
    is ``"train"``, ``"val"`` or None (not stated)."""

    key: str
    cardinality: int
    id: Any
    version: Any
    hash: Any
    split: str | None = None


class Manifest:
    """A validated, canonicalised manifest that cannot change once hashed.

    Build one with :meth:`load` (YAML or JSON file), :meth:`from_dict` (or
    ``Manifest(raw)``, the same) or :func:`as_manifest`. ``hash`` is
    ``manifest_hash`` and ``replay_token`` is ``kernel_replay_token``, 32
    bytes each (R3).

    Everything is computed once, from a private plain copy of the input: the
    hashes and the typed fields the engine reads (``spec_version``, ``seed``,
    ``global_batch_size``, ``sampler_block_size``, ``drop_last``,
    ``sampling_mode``, ``datasets``), so what a call does is always what ``hash`` names.
    ``canonical`` (the manifest with defaults filled) and ``datasets`` (key ->
    frozen :class:`DatasetSpec`) are deep read-only views (manifest/view.py).

    Immutability is enforced with Python's own errors: setting or deleting an
    attribute raises ``AttributeError``, changing ``canonical`` or
    ``datasets`` at any depth raises ``TypeError``. Trying to edit a manifest
    is a mistake in the calling code, not bad input data, so these are not
    ``UmlosError`` failures with a code. To change a manifest, build a new one:
    :meth:`with_overrides`, or :meth:`from_dict` on an edited :meth:`to_dict`.

    Two manifests are equal when their ``manifest_hash`` is, and ``hash(m)``
    follows it, so a manifest can key a dict. ``copy.copy`` and
    ``copy.deepcopy`` return the manifest itself; ``pickle`` stores the plain
    canonical data and unpickling validates and hashes it again (PyTorch
    DataLoader workers unpickle samplers that hold manifests).
    """

    __slots__ = (
        "canonical",
        "hash",
        "replay_token",
        "policy_hash",
        "env_manifest_hash",
        "datasets",
        "spec_version",
        "seed",
        "global_batch_size",
        "sampler_block_size",
        "drop_last",
        "sampling_mode",
        "_plain",
        "__weakref__",
    )

    canonical: Mapping[str, Any]
    hash: bytes
    replay_token: bytes
    policy_hash: bytes
    env_manifest_hash: bytes
    datasets: Mapping[str, DatasetSpec]
    spec_version: str
    seed: int
    global_batch_size: int
    sampler_block_size: int
    drop_last: bool
    sampling_mode: str
    _plain: dict[str, Any]  # the validated manifest as plain data (canonical is its read-only view)

    def __init__(self, raw: Mapping[str, Any]) -> None:
        """Validate ``raw``, fill the R3 defaults and compute the hashes (``INVALID_MANIFEST`` on bad input)."""
        try:
            plain = canonicalize(raw)
        except UmlosError as exc:
            raise _pointing_to_docs(exc) from None
        policy_hash = hash_canonical(plain.get("policy") or {})
        env_manifest_hash = hash_canonical(plain.get("env") or {})
        token = sha256(
            plain["spec_version"].encode("utf-8") + policy_hash + env_manifest_hash + struct.pack(">Q", plain["seed"])
        )
        datasets = {
            key: DatasetSpec(key, entry["cardinality"], entry["id"], entry["version"], entry["hash"],
                             entry.get("split"))
            for key, entry in plain["datasets"].items()
        }
        fields = {
            "_plain": plain,
            "canonical": freeze(plain),
            "hash": hash_canonical(plain),
            "replay_token": token,
            "policy_hash": policy_hash,
            "env_manifest_hash": env_manifest_hash,
            "datasets": ReadOnlyDict(datasets),
            "spec_version": plain["spec_version"],
            "seed": plain["seed"],
            "global_batch_size": plain["global_batch_size"],
            "sampler_block_size": plain["data"]["sampler_block_size"],
            "drop_last": plain["data"]["drop_last"],
            "sampling_mode": plain["data"].get("sampling_mode", DEFAULT_SAMPLING_MODE),
        }
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    # -- construction -----------------------------------------------------
    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Manifest:
        """Validate ``raw``, fill the R3 defaults and compute the hashes; ``raw`` is copied, never kept."""
        return cls(raw)

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, max_bytes: int = MAX_MANIFEST_BYTES) -> Manifest:
        """Load a JSON (``.json``) or YAML (any other suffix) manifest file of at most ``max_bytes``."""
        try:
            raw = read_manifest_file(path, max_bytes=max_bytes)
        except UmlosError as exc:
            raise _pointing_to_docs(exc) from None
        return cls(raw)

    # -- immutability -----------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"cannot set Manifest.{name}: {HOW_TO_CHANGE}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete Manifest.{name}: {HOW_TO_CHANGE}")

    def __reduce__(self) -> tuple:
        return type(self), (self._plain,)

    def __copy__(self) -> Manifest:
        return self

    def __deepcopy__(self, memo: dict) -> Manifest:
        return self

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Manifest):
            return NotImplemented
        return self.hash == other.hash

    def __hash__(self) -> int:
        return hash(self.hash)

    def __repr__(self) -> str:
        return f"Manifest(hash={self.hash.hex()!r}, canonical={self._plain!r})"

    # -- accessors --------------------------------------------------------
    def dataset(self, dataset_key: Any) -> DatasetSpec:
        """The dataset entry for ``dataset_key``, or ``INVALID_DATASET_KEY``."""
        fail = checks.raising(errors.INVALID_DATASET_KEY, operator=errors.MANIFEST_OPERATOR,
                              dataset_key=dataset_key if isinstance(dataset_key, str) else None)
        checks.choice(dataset_key, "dataset_key", sorted(self.datasets), fail=fail,
                      message="{name} {value!r} is not in the manifest; known keys: {choices}")
        return self.datasets[dataset_key]

    def with_overrides(self, **top_level: Any) -> Manifest:
        """A new manifest with some top-level fields replaced (re-validated, re-hashed)."""
        raw = self.to_dict()
        raw.update(top_level)
        return Manifest.from_dict(raw)

    def to_dict(self) -> dict[str, Any]:
        """The canonical manifest (defaults filled) as new plain, mutable ``dict`` and ``list`` data."""
        return thaw(self._plain)

    def resolve_replay_token(self, replay_token: bytes | None) -> bytes:
        """R3: an explicit 32-byte token replaces the derived one."""
        if replay_token is None:
            return self.replay_token
        checks.instance(replay_token, "replay_token", (bytes, bytearray), length=32, fail=invalid_manifest,
                        message=("{name} must be 32 bytes, got {type}",
                                 "{name} must be 32 bytes, got {type} of length {size}"))
        return bytes(replay_token)


def as_manifest(value: Any) -> Manifest:
    """A :class:`Manifest` from what every entry point accepts: a Manifest (returned as is),
    a mapping (:meth:`Manifest.from_dict`) or the path of a YAML or JSON file (:meth:`Manifest.load`).

    Anything else is ``INVALID_MANIFEST``, naming the three accepted kinds.
    """
    if isinstance(value, Manifest):
        return value
    if isinstance(value, Mapping):
        return Manifest.from_dict(value)
    if isinstance(value, (str, os.PathLike)):
        return Manifest.load(value)
    raise invalid_manifest(
        f"a manifest must be a Manifest, a mapping or the path of a YAML or JSON file, "
        f"got {type(value).__name__} (see {DOCS})",
    )


def _pointing_to_docs(exc: UmlosError) -> UmlosError:
    """The same failure, its message ending with where every manifest key is described."""
    return UmlosError(exc.code, f"{exc.message} (see {DOCS})", operator=exc.record["failure_operator"])


def canonicalize(raw: Any) -> dict[str, Any]:
    """Validate a raw manifest and return its canonical form (R3 defaults filled).

    Only plain data hashes reproducibly, so every value must be a mapping with
    text keys, a list, text, bytes, an integer, a finite float, a boolean or null.
    Every mapping has a fixed set of keys (manifest/schema.py) except the
    free-form ``policy``, ``env`` and ``extra``.
    """
    checks.instance(raw, "a manifest", Mapping, fail=invalid_manifest, message=_A_MAPPING)
    manifest = _PlainCopy().copy(raw, "manifest", 0)
    refuse_unknown_keys(manifest, TOP_LEVEL_KEYS, "manifest")

    manifest.setdefault("spec_version", DEFAULT_SPEC_VERSION)
    checks.text(manifest["spec_version"], "spec_version", fail=invalid_manifest, message="{name} must be a string")
    manifest.setdefault("seed", DEFAULT_SEED)
    manifest["seed"] = checks.uint64(manifest["seed"], "seed", fail=invalid_manifest)

    if "global_batch_size" not in manifest:
        raise invalid_manifest("manifest lacks global_batch_size")
    manifest["global_batch_size"] = checks.uint64(manifest["global_batch_size"], "global_batch_size",
                                                  fail=invalid_manifest)

    data = manifest.setdefault("data", {})
    if data is None:
        data = manifest["data"] = {}
    checks.instance(data, "data", dict, fail=invalid_manifest, message=_A_MAPPING)
    refuse_unknown_keys(data, DATA_KEYS, "data")
    data.setdefault("sampler_block_size", DEFAULT_BLOCK_SIZE)
    data["sampler_block_size"] = checks.uint64(data["sampler_block_size"], "data.sampler_block_size",
                                               fail=invalid_manifest)
    data.setdefault("drop_last", DEFAULT_DROP_LAST)
    checks.instance(data["drop_last"], "data.drop_last", bool, fail=invalid_manifest,
                    message="{name} must be true or false, got {value!r}")
    _canonical_sampling_mode(data)

    for name in FREE_FORM_KEYS:
        # null is kept as written (it hashes as it did before keys were checked);
        # anything but a mapping is refused, so `policy: false` cannot pass for
        # "no policy" in the replay token (R3 hashes `policy or {}`).
        if manifest.get(name) is not None:
            checks.instance(manifest[name], name, dict, fail=invalid_manifest,
                            message="{name} must be a mapping (or null, or left out), got {type} {value!r}")

    datasets = datasets_as_map(manifest.get("datasets"))  # the list form becomes the map (manifest/datasets.py)
    if datasets is None:
        raise invalid_manifest(_NEEDS_DATASETS.format())
    checks.instance(datasets, "datasets", dict, fail=invalid_manifest, message=_NEEDS_DATASETS + ", got {type}")
    manifest["datasets"] = datasets
    for key, entry in datasets.items():
        checks.instance(entry, f"datasets.{key}", dict, fail=invalid_manifest, message="{name} must be a mapping")
        checks.record(entry, dict.fromkeys(DATASET_REQUIRED_FIELDS, ANY),
                      optional=dict.fromkeys(DATASET_OPTIONAL_KEYS, ANY), fail=invalid_manifest, what=f"datasets.{key}",
                      unknown=unknown_keys(DATASET_KEYS + DATASET_OPTIONAL_KEYS, f"datasets.{key}"),
                      missing="{what} lacks {missing} (every dataset names all four)")
        if "split" in entry:
            check_split(entry["split"], f"datasets.{key}.split")
        entry["cardinality"] = checks.uint64(entry["cardinality"], f"datasets.{key}.cardinality", fail=invalid_manifest)
        for name in ("id", "version", "hash"):
            checks.instance(entry[name], f"datasets.{key}.{name}", (str, int, bytes), fail=invalid_manifest,
                            message="{name} must be a string or integer, got {type}")
    return manifest


def _canonical_sampling_mode(data: dict[str, Any]) -> None:
    """Check ``data.sampling_mode`` against the registered modes, and drop it when it
    names the default: stating ``block_affine`` and leaving it out hash the same,
    as manifests written before the key existed do."""
    if "sampling_mode" not in data:
        return
    mode = checks.choice(data["sampling_mode"], "data.sampling_mode", mode_names(), fail=invalid_manifest)
    if mode == DEFAULT_SAMPLING_MODE:
        del data["sampling_mode"]


class _PlainCopy:
    """Deep-copies a manifest as plain data, refusing anything that would not hash reproducibly.

    It also counts what it copies: a mapping built in Python can share one list
    many times over (as a YAML alias does), and copying and hashing expands
    every share, so the copy stops at :data:`MAX_EXPANDED_NODES` values or
    :data:`MAX_EXPANDED_BYTES` bytes of text.
    """

    def __init__(self) -> None:
        self.nodes = 0
        self.bytes = 0

    def copy(self, value: Any, where: str, depth: int) -> Any:
        if depth > MAX_NESTING:
            raise invalid_manifest(f"{where}: nested deeper than {MAX_NESTING} levels")
        self.nodes += 1
        if self.nodes > MAX_EXPANDED_NODES:
            raise invalid_manifest(f"a manifest may hold at most {MAX_EXPANDED_NODES} values")
        if isinstance(value, Mapping):
            out = {}
            for key, item in value.items():
                checks.text(key, where, fail=invalid_manifest,
                            message="{name}: map keys must be text, got {value!r} (R2)")
                self._count_text(key, f"{where}: key")
                out[key] = self.copy(item, f"{where}.{key}", depth + 1)
            return out
        if isinstance(value, (list, tuple)):
            return [self.copy(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value)]
        if isinstance(value, str):
            self._count_text(value, where)
            return value
        if isinstance(value, bytes):
            self._count_bytes(len(value))
            return value
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int):
            return checks.integer(value, where, -(1 << 64), errors.UINT64_MAX, fail=invalid_manifest,
                                  message="{name}: {value} is outside the CBOR integer range [-2^64, 2^64 - 1]")
        if isinstance(value, float):
            checks.number(value, where, fail=invalid_manifest, message="{name}: {value} is not a finite number")
            return value  # as given: a float subclass (NumPy's float64) hashes as it always has
        if checks.is_integer(value):  # NumPy scalars and other Integral types that are not int subclasses
            self.nodes -= 1
            return self.copy(int(value), where, depth)
        raise invalid_manifest(
            f"{where}: {type(value).__name__} values are not allowed in a manifest (plain data only)",
        )

    def _count_text(self, text: str, where: str) -> None:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise invalid_manifest(
                f"{where}: {_short(text)} is not valid Unicode text "
                "(a lone surrogate such as \\ud800 has no UTF-8 form)",
            ) from None
        self._count_bytes(size)

    def _count_bytes(self, size: int) -> None:
        self.bytes += size
        if self.bytes > MAX_EXPANDED_BYTES:
            raise invalid_manifest(f"a manifest may hold at most {MAX_EXPANDED_BYTES} bytes of text")


def _short(text: str) -> str:
    """``repr`` of text for messages, cut short (a megabyte of text is not a message)."""
    shown = repr(text)
    return shown if len(shown) <= 80 else shown[:77] + "..."
