"""Manifests: loading, validation, canonicalisation, ``manifest_hash``, replay token.

Resolution R3 fixes the bytes. A manifest is a mapping with at least
``global_batch_size`` and ``datasets: {KEY: {id, version, hash, cardinality}}``.
Defaults are filled *before* hashing so that stating a default and omitting it
hash the same. The replay token hashes what the manifest declares (``policy``,
``env``), never the machine, so a sequence is the same everywhere.

Type errors are caught here, at load (``INVALID_MANIFEST``); whether the values
make a usable configuration for one call (``global_batch_size = 0``, a world
size that does not divide it, ...) is checked by the call, with R8's codes,
because it depends on the call's arguments.
"""

from __future__ import annotations

import copy
import json
import math
import os
import struct
from dataclasses import dataclass, field
from typing import Any, Mapping

from . import errors
from .errors import UmlosError, require_uint64
from .hashing import hash_canonical, sha256

#: R3 defaults, filled before hashing.
DEFAULT_SPEC_VERSION = "UML_OS-v3.8-OS"
DEFAULT_SEED = 0
DEFAULT_BLOCK_SIZE = 1 << 20  # seed 000 §0.C DEFAULT_BLOCK_SIZE = 1_048_576
DEFAULT_DROP_LAST = False

#: The dataset fields seed 000 §0.F makes mandatory.
DATASET_REQUIRED_FIELDS = ("id", "version", "hash", "cardinality")

#: Nesting bound for untrusted manifests: deep enough for any real config,
#: shallow enough that a hostile file cannot exhaust the stack.
MAX_NESTING = 64


@dataclass(frozen=True, slots=True)
class DatasetSpec:
    """One entry of ``manifest.datasets``; ``cardinality`` is N."""

    key: str
    cardinality: int
    id: Any
    version: Any
    hash: Any


@dataclass(frozen=True)
class Manifest:
    """A validated, canonicalised manifest.

    Build one with :meth:`load` (YAML or JSON file) or :meth:`from_dict`.
    ``hash`` is ``manifest_hash`` and ``replay_token`` is ``kernel_replay_token``,
    32 bytes each (R3).
    """

    canonical: Mapping[str, Any]
    hash: bytes
    replay_token: bytes
    policy_hash: bytes
    env_manifest_hash: bytes
    datasets: Mapping[str, DatasetSpec] = field(repr=False)

    # -- construction -----------------------------------------------------
    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "Manifest":
        """Validate ``raw``, fill the R3 defaults and compute the hashes."""
        canonical = canonicalize(raw)
        policy_hash = hash_canonical(canonical.get("policy") or {})
        env_manifest_hash = hash_canonical(canonical.get("env") or {})
        token = sha256(
            canonical["spec_version"].encode("utf-8")
            + policy_hash
            + env_manifest_hash
            + struct.pack(">Q", canonical["seed"])
        )
        datasets = {
            key: DatasetSpec(key, entry["cardinality"], entry["id"], entry["version"], entry["hash"])
            for key, entry in canonical["datasets"].items()
        }
        return cls(canonical, hash_canonical(canonical), token, policy_hash, env_manifest_hash, datasets)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "Manifest":
        """Load a YAML (``.yaml``/``.yml``) or JSON manifest file."""
        return cls.from_dict(read_manifest_file(path))

    # -- accessors --------------------------------------------------------
    @property
    def global_batch_size(self) -> int:
        return self.canonical["global_batch_size"]

    @property
    def seed(self) -> int:
        return self.canonical["seed"]

    @property
    def spec_version(self) -> str:
        return self.canonical["spec_version"]

    @property
    def sampler_block_size(self) -> int:
        return self.canonical["data"]["sampler_block_size"]

    @property
    def drop_last(self) -> bool:
        return self.canonical["data"]["drop_last"]

    def dataset(self, dataset_key: Any) -> DatasetSpec:
        """The dataset entry for ``dataset_key``, or ``INVALID_DATASET_KEY``."""
        if not isinstance(dataset_key, str) or dataset_key not in self.datasets:
            known = ", ".join(sorted(self.datasets)) or "(none)"
            raise UmlosError(
                errors.INVALID_DATASET_KEY,
                f"dataset_key {dataset_key!r} is not in the manifest; known keys: {known}",
                dataset_key=dataset_key if isinstance(dataset_key, str) else None,
            )
        return self.datasets[dataset_key]

    def with_overrides(self, **top_level: Any) -> "Manifest":
        """A new manifest with some top-level fields replaced (re-validated, re-hashed)."""
        raw = copy.deepcopy(dict(self.canonical))
        raw.update(top_level)
        return Manifest.from_dict(raw)

    def to_dict(self) -> dict[str, Any]:
        """A deep copy of the canonical manifest (defaults filled)."""
        return copy.deepcopy(dict(self.canonical))

    def resolve_replay_token(self, replay_token: bytes | None) -> bytes:
        """R3: an explicit 32-byte token replaces the derived one."""
        if replay_token is None:
            return self.replay_token
        if not isinstance(replay_token, (bytes, bytearray)) or len(replay_token) != 32:
            raise UmlosError(
                errors.INVALID_MANIFEST,
                f"replay_token must be 32 bytes, got {type(replay_token).__name__}"
                + (f" of length {len(replay_token)}" if isinstance(replay_token, (bytes, bytearray)) else ""),
            )
        return bytes(replay_token)


def read_manifest_file(path: str | os.PathLike[str]) -> Any:
    """Parse a manifest file; unreadable or unparsable files raise ``INVALID_MANIFEST``."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as handle:
            text = handle.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UmlosError(errors.INVALID_MANIFEST, f"cannot read manifest {path!r}: {exc}") from exc
    if path.endswith(".json"):
        try:
            return json.loads(text)
        except ValueError as exc:
            raise UmlosError(errors.INVALID_MANIFEST, f"{path}: not valid JSON: {exc}") from exc
        except RecursionError as exc:  # a hostile file nested deeper than the parser's stack
            raise UmlosError(errors.INVALID_MANIFEST, f"{path}: nested too deeply to parse") from exc
    import yaml

    try:
        # SafeLoader builds only plain data (no Python objects from tags). JSON
        # is a subset of YAML 1.2, so a JSON file with another suffix loads too.
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UmlosError(errors.INVALID_MANIFEST, f"{path}: not valid YAML: {exc}") from exc
    except RecursionError as exc:
        raise UmlosError(errors.INVALID_MANIFEST, f"{path}: nested too deeply to parse") from exc


def canonicalize(raw: Any) -> dict[str, Any]:
    """Validate a raw manifest and return its canonical form (R3 defaults filled).

    Only plain data hashes reproducibly, so every value must be a mapping with
    text keys, a list, text, bytes, an integer, a finite float, a boolean or null.
    """
    if not isinstance(raw, Mapping):
        raise UmlosError(errors.INVALID_MANIFEST, f"a manifest must be a mapping, got {type(raw).__name__}")
    manifest = _plain_copy(raw, "manifest", 0)

    manifest.setdefault("spec_version", DEFAULT_SPEC_VERSION)
    if not isinstance(manifest["spec_version"], str):
        raise UmlosError(errors.INVALID_MANIFEST, "spec_version must be a string")
    manifest.setdefault("seed", DEFAULT_SEED)
    manifest["seed"] = require_uint64(manifest["seed"], "seed")

    if "global_batch_size" not in manifest:
        raise UmlosError(errors.INVALID_MANIFEST, "manifest lacks global_batch_size")
    manifest["global_batch_size"] = require_uint64(manifest["global_batch_size"], "global_batch_size")

    data = manifest.setdefault("data", {})
    if data is None:
        data = manifest["data"] = {}
    if not isinstance(data, dict):
        raise UmlosError(errors.INVALID_MANIFEST, f"data must be a mapping, got {type(data).__name__}")
    data.setdefault("sampler_block_size", DEFAULT_BLOCK_SIZE)
    data["sampler_block_size"] = require_uint64(data["sampler_block_size"], "data.sampler_block_size")
    data.setdefault("drop_last", DEFAULT_DROP_LAST)
    if not isinstance(data["drop_last"], bool):
        raise UmlosError(errors.INVALID_MANIFEST, f"data.drop_last must be true or false, got {data['drop_last']!r}")

    datasets = manifest.get("datasets")
    if not isinstance(datasets, dict):
        raise UmlosError(
            errors.INVALID_MANIFEST,
            "manifest needs datasets: {KEY: {id, version, hash, cardinality}}"
            + ("" if datasets is None else f", got {type(datasets).__name__}"),
        )
    for key, entry in datasets.items():
        if not isinstance(entry, dict):
            raise UmlosError(errors.INVALID_MANIFEST, f"datasets.{key} must be a mapping")
        missing = [name for name in DATASET_REQUIRED_FIELDS if name not in entry]
        if missing:
            raise UmlosError(errors.INVALID_MANIFEST, f"datasets.{key} lacks {', '.join(missing)} (seed 000 §0.F)")
        entry["cardinality"] = require_uint64(entry["cardinality"], f"datasets.{key}.cardinality")
        for name in ("id", "version", "hash"):
            value = entry[name]
            if isinstance(value, bool) or not isinstance(value, (str, int, bytes)):
                raise UmlosError(
                    errors.INVALID_MANIFEST,
                    f"datasets.{key}.{name} must be a string or integer, got {type(value).__name__}",
                )
    return manifest


def _plain_copy(value: Any, where: str, depth: int) -> Any:
    """Deep-copy ``value`` as plain data, refusing anything that would not hash reproducibly."""
    if depth > MAX_NESTING:
        raise UmlosError(errors.INVALID_MANIFEST, f"{where}: nested deeper than {MAX_NESTING} levels")
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise UmlosError(errors.INVALID_MANIFEST, f"{where}: map keys must be text, got {key!r} (R2)")
            out[key] = _plain_copy(item, f"{where}.{key}", depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain_copy(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value)]
    if value is None or isinstance(value, (str, bytes, bool)):
        return value
    if isinstance(value, int):
        if value < -(1 << 64) or value > errors.UINT64_MAX:
            raise UmlosError(errors.INVALID_MANIFEST, f"{where}: integer {value} is outside the CBOR integer range")
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UmlosError(errors.INVALID_MANIFEST, f"{where}: {value} is not a finite number")
        return value
    try:  # NumPy scalars and other Integral types that are not int subclasses
        import numbers

        if isinstance(value, numbers.Integral):
            return _plain_copy(int(value), where, depth)
    except TypeError:  # pragma: no cover - defensive
        pass
    raise UmlosError(
        errors.INVALID_MANIFEST,
        f"{where}: {type(value).__name__} values are not allowed in a manifest (plain data only)",
    )
