"""What a checkpoint holds (``CheckpointState``) and whose run it is (``RunIdentity``).

``CheckpointState`` is plain data: the step ``t``, the data cursors per
dataset key, tensor shards per rank, optimizer state per rank, the DP
accountant's state, the TMMU plan, named user state (byte blobs or
arrays) and the cursors of registered kinds (:mod:`.extensions`).
``RunIdentity`` carries the fields a restore must match (the identity rule,
docs/checkpoint-format.md §7): tenant, run, manifest (hence manifest_hash,
replay token, policy and env hashes), the stage whose ``sampler_config_hash``
the cursors belong to, and the engine's contract hashes (defaults in
:mod:`.schema`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from .._version import __version__ as _version
from .. import checks, errors
from ..cursor import Cursor
from ..hashing import hash_canonical
from ..manifest.core import Manifest
from ..sampler import resolve_sampler
from . import limits, paths, schema
from .codes import SERIALIZE, error

#: Nesting bound for plain-data state (DP accountant, TMMU plan).
MAX_STATE_DEPTH = limits.MAX_STATE_DEPTH


@dataclass(frozen=True)
class CheckpointState:
    """Everything a checkpoint stores besides identity and trace.

    Args:
        t: the step counter (uint64).
        cursors: ``{dataset_key: Cursor}`` (or ``{epoch, global_index}`` maps).
        tensors: ``{rank: [shard_0, shard_1, ...]}``, each shard ``{name: ndarray}``.
        optimizer: ``{rank: {name: ndarray}}``.
        dp_accountant: the DP accountant's state as plain data, or None (no DP).
        tmmu_plan: the memory plan as plain data.
        user_state: ``{name: bytes | ndarray}``; names match ``paths.NAME_PATTERN``.
        extra_cursors: ``{kind name: state}`` for cursor kinds a subsystem
            registered (``register_cursor_kind``), each encoded by its kind.
    """

    t: int
    cursors: Mapping[str, Any]
    tensors: Mapping[int, Sequence[Mapping[str, np.ndarray]]] = field(default_factory=dict)
    optimizer: Mapping[int, Mapping[str, np.ndarray]] = field(default_factory=dict)
    dp_accountant: Any = None
    tmmu_plan: Any = field(default_factory=dict)
    user_state: Mapping[str, Any] = field(default_factory=dict)
    extra_cursors: Mapping[str, Any] = field(default_factory=dict)

    def cursor_map(self) -> dict[str, Cursor]:
        fail = partial(error, errors.CHECKPOINT_STATE_INVALID, operator=SERIALIZE)
        checks.instance(self.cursors, "cursors", Mapping, fail=fail, message="{name} must map dataset keys to cursors")
        out = {}
        for key, value in self.cursors.items():
            checks.text(key, "cursor key", empty=False, fail=fail, message="{name} {value!r} must be non-empty text")
            try:
                out[key] = value if isinstance(value, Cursor) else Cursor.from_dict(value)
            except errors.UmlosError as exc:
                raise error(errors.CHECKPOINT_STATE_INVALID, f"cursor {key!r}: {exc.message}",
                            operator=SERIALIZE) from None
        return out


@dataclass(frozen=True)
class RunIdentity:
    """Who and what a checkpoint belongs to; see the module docstring."""

    tenant_id: str
    run_id: str
    manifest: Manifest
    stage: str = "train"
    preset: str | None = None
    replay_token: bytes | None = None
    backend_binary_hash: bytes = field(default_factory=schema.backend_binary_hash)
    determinism_profile_hash: bytes = field(default_factory=schema.determinism_profile_hash)
    dependencies_lock_hash: bytes = field(default_factory=schema.dependencies_lock_hash)
    operator_contracts_root_hash: bytes = field(default_factory=schema.operator_contracts_root_hash)
    code_commit_hash: bytes = field(default_factory=lambda: schema.code_commit_hash(_version))

    def __post_init__(self) -> None:
        code = errors.CHECKPOINT_STATE_INVALID
        schema.check_text(self.tenant_id, "tenant_id", code)
        schema.check_text(self.run_id, "run_id", code)
        if not isinstance(self.manifest, Manifest):
            raise error(code, "RunIdentity.manifest must be a umlos_cuda.Manifest", operator=SERIALIZE)
        for name in ("backend_binary_hash", "determinism_profile_hash", "dependencies_lock_hash",
                     "operator_contracts_root_hash", "code_commit_hash"):
            schema.check_hash(getattr(self, name), name, code)
        # The two properties raise CHECKPOINT_STATE_INVALID on a bad replay_token, stage or preset.
        _ = self.token
        _ = self.sampler_config_hash

    @property
    def token(self) -> bytes:
        try:
            return self.manifest.resolve_replay_token(self.replay_token)
        except errors.UmlosError as exc:
            raise error(errors.CHECKPOINT_STATE_INVALID, exc.message, operator=SERIALIZE) from None

    @property
    def sampler_config_hash(self) -> bytes:
        try:
            return resolve_sampler(self.manifest, self.stage, self.preset).config_hash
        except errors.UmlosError as exc:
            raise error(errors.CHECKPOINT_STATE_INVALID, exc.message, operator=SERIALIZE) from None

    @property
    def dataset_snapshot_id(self) -> bytes:
        return dataset_snapshot_id(self.manifest.canonical)

    def expected(self, tmmu_plan: Any = None) -> dict[str, Any]:
        """The §II.I identity fields this run expects of a checkpoint it restores.

        ``trace_root_hash`` and ``checkpoint_merkle_root`` come from the store
        (tape and commit certificate); ``tmmu_plan_hash`` only when the plan is given.
        """
        expected: dict[str, Any] = {
            "tenant_id": self.tenant_id,
            "run_id": self.run_id,
            "replay_token": self.token,
            "manifest_hash": self.manifest.hash,
            "sampler_config_hash": self.sampler_config_hash,
            "backend_binary_hash": self.backend_binary_hash,
            "determinism_profile_hash": self.determinism_profile_hash,
        }
        if tmmu_plan is not None:
            expected["tmmu_plan_hash"] = hash_canonical({"plan": plain(tmmu_plan, "tmmu_plan")})
        return expected


def dataset_snapshot_id(canonical_manifest: Mapping[str, Any]) -> bytes:
    """``SHA-256(CBOR_CANONICAL(manifest.datasets))``: ids, versions, hashes and cardinalities."""
    return hash_canonical(canonical_manifest["datasets"])


class _NotPlain(Exception):
    """Raised inside :func:`plain`; carries the reason and the path to the value."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.path: list[str] = []


def plain(value: Any, where: str) -> Any:
    """``value`` as plain CBOR-able data (text-keyed maps, lists, text, bytes,
    integers in CBOR range, finite floats, booleans, null), nested at most
    MAX_STATE_DEPTH levels and holding at most ``limits.MAX_CBOR_ITEMS``
    values (map keys count, as readers count them); refuse anything else
    (``CHECKPOINT_STATE_INVALID``, naming where in ``where`` it is)."""
    budget = [limits.MAX_CBOR_ITEMS]
    try:
        return _plain(value, 0, budget)
    except _NotPlain as exc:
        raise error(errors.CHECKPOINT_STATE_INVALID, f"{where}{''.join(reversed(exc.path))}: {exc.reason}",
                    operator=SERIALIZE) from None


_KEY_TEXT = "{name} must be UTF-8 text, got {value!r}"


def _plain(value: Any, depth: int, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise _NotPlain(f"more than {limits.MAX_CBOR_ITEMS} values; readers accept at most that many per file")
    if depth > MAX_STATE_DEPTH:
        raise _NotPlain(f"nested deeper than {MAX_STATE_DEPTH} levels")
    if value is None or type(value) is bool:
        return value
    if isinstance(value, str):
        if schema.utf8_length(value) is None:
            raise _NotPlain(f"text {value!r} holds a lone surrogate (not UTF-8)")
        return str(value)
    if isinstance(value, (float, np.floating)):
        return checks.number(value, "", fail=_NotPlain, message="{value} is not finite")
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return checks.integer(value, "", -(1 << 64), errors.UINT64_MAX, fail=_NotPlain,
                              message="{value} is outside the CBOR integer range [-2^64, 2^64 - 1]")
    if isinstance(value, bytes):
        return bytes(value)
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            budget[0] -= 1
            checks.text(key, "map keys", fail=_NotPlain, message=_KEY_TEXT)
            if schema.utf8_length(key) is None:
                raise _NotPlain(_KEY_TEXT.format(name="map keys", value=key))
            try:
                out[str(key)] = _plain(item, depth + 1, budget)
            except _NotPlain as exc:
                exc.path.append(f".{key}")
                raise
        return out
    if isinstance(value, (list, tuple)):
        items = []
        for index, item in enumerate(value):
            try:
                items.append(_plain(item, depth + 1, budget))
            except _NotPlain as exc:
                exc.path.append(f"[{index}]")
                raise
        return items
    raise _NotPlain(f"{type(value).__name__} is not plain data")


def check_user_name(name: Any) -> str:
    if not paths.valid_name(name):
        raise error(
            errors.CHECKPOINT_STATE_INVALID,
            f"user state name {name!r} must match {paths.NAME_PATTERN}",
            operator=SERIALIZE,
        )
    return name
