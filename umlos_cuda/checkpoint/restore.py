"""Restoring a container: profiles, the identity rule and the chain (docs/checkpoint-format.md §7).

A restore names a *profile* (``restore_profile_id``):

``train_full``
    everything (the training restore of docs/checkpoint-format.md §7: model, optimizer, RNG, DP
    accountant, data cursors, TMMU plan); the container is verified completely
    first, including the absence of unlisted files. Always allowed.
``eval_params``
    the tensor shards and the run manifest (model parameters + minimal runtime config).
``data_cursors``
    the data cursors (NextBatch's and the registered cursor kinds') and the
    run manifest: what a data loader needs to resume.
``shard_subset``
    for the ranks given: their tensor shards and optimizer state, plus every
    small file (cursors, manifest, DP, TMMU, trace link, user state).

A partial profile must be declared by the container (header field
``restore_profiles``, schema 1.1; a 1.0 container declares only the full
restore); otherwise ``CHECKPOINT_RESTORE_PROFILE``. Partial restores check the
manifest completely (header hash, entries, Merkle roots) and each file they
read, so files they do not need may be absent (a node that fetched only its
rank's shards restores it).

Before any file is read, the header's identity fields are compared with what
the caller expects (``expect``, any subset of :data:`schema.IDENTITY_FIELDS`);
any difference aborts with ``CHECKPOINT_IDENTITY_MISMATCH`` naming the field.
``expect_prev`` checks the chain (``checkpoint_hash_prev``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from .. import checks, errors
from ..cursor import Cursor
from ..manifest.core import Manifest
from . import paths, schema
from .codes import RESTORE, error
from .container import ContainerReader, TraceLink

_UNSET = object()


@dataclass
class RestoredCheckpoint:
    """What a restore returns. Fields a profile does not read stay empty/None."""

    restore_profile_id: str
    checkpoint_hash: bytes
    header: dict[str, Any]
    manifest: Manifest | None = None
    cursors: dict[str, Cursor] = field(default_factory=dict)
    #: ``{kind: decoded state}`` of the registered cursor kinds the checkpoint holds.
    extra_cursors: dict[str, Any] = field(default_factory=dict)
    tensors: dict[int, list[dict[str, np.ndarray]]] = field(default_factory=dict)
    optimizer: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    dp_enabled: bool | None = None
    dp_accountant: Any = None
    tmmu_plan: Any = None
    user_state: dict[str, Any] = field(default_factory=dict)
    trace_link: TraceLink | None = None
    report: dict[str, Any] = field(default_factory=dict)

    @property
    def t(self) -> int:
        return self.header["t"]

    @property
    def sampler_config_hash(self) -> bytes:
        return self.header["sampler_config_hash"]


def check_identity(header: Mapping[str, Any], expect: Mapping[str, Any] | None) -> None:
    """The identity rule (docs/checkpoint-format.md §7): abort on any mismatch of an expected identity field."""
    if not expect:
        return
    unknown = sorted(set(expect) - set(schema.IDENTITY_FIELDS))
    if unknown:
        raise error(
            errors.CHECKPOINT_STATE_INVALID,
            f"expect names field(s) {', '.join(unknown)} outside the identity set {', '.join(schema.IDENTITY_FIELDS)}",
            operator=RESTORE,
        )
    for name in schema.IDENTITY_FIELDS:
        if name in expect and header.get(name) != expect[name]:
            have, want = header.get(name), expect[name]
            raise error(
                errors.CHECKPOINT_IDENTITY_MISMATCH,
                f"{name} of the checkpoint is {_show(have)}, this run expects {_show(want)}",
                operator=RESTORE,
                field=name,
            )


def _show(value: Any) -> str:
    return value.hex() if isinstance(value, bytes) else repr(value)


def check_profile(header: Mapping[str, Any], profile: Any) -> str:
    if profile not in schema.RESTORE_PROFILES:
        raise error(
            errors.CHECKPOINT_RESTORE_PROFILE,
            f"unknown restore profile {profile!r}; choose one of {', '.join(schema.RESTORE_PROFILES)}",
            operator=RESTORE,
        )
    declared = schema.declared_profiles(header)
    if profile not in declared:
        raise error(
            errors.CHECKPOINT_RESTORE_PROFILE,
            f"restore profile {profile!r} is not declared by this checkpoint (declared: {', '.join(declared)})",
            operator=RESTORE,
        )
    return profile


def normalize_ranks(ranks: Any) -> list[int] | None:
    """``ranks=`` as a list of rank numbers (None stays None); anything else is
    ``CHECKPOINT_STATE_INVALID`` naming what is allowed."""
    if ranks is None:
        return None
    fail = partial(error, errors.CHECKPOINT_STATE_INVALID, operator=RESTORE)
    checks.sequence(ranks, "ranks", iterable=True, fail=fail,
                    message="{name} must be a list of rank numbers (integers in [0, 2^32 - 1]), got {type}")
    return [checks.integer(rank, "rank", 0, errors.UINT32_MAX, fail=fail,
                           message="ranks holds {value!r}; ranks are integers in [0, 2^32 - 1]") for rank in ranks]


#: What each profile reads besides the header and the run manifest (module docstring):
#: ``cursors`` (NextBatch's and the registered kinds'), ``small`` (DP accountant,
#: TMMU plan, trace link, user state), ``tensors`` and ``optimizer`` (of the wanted ranks).
PROFILE_READS = {
    "train_full": ("cursors", "small", "tensors", "optimizer"),
    "shard_subset": ("cursors", "small", "tensors", "optimizer"),
    "data_cursors": ("cursors",),
    "eval_params": ("tensors",),
}


def restore_checkpoint(
    path: str | os.PathLike[str],
    *,
    profile: str = schema.FULL_PROFILE,
    expect: Mapping[str, Any] | None = None,
    expect_prev: Any = _UNSET,
    ranks: Iterable[int] | None = None,
) -> RestoredCheckpoint:
    """Restore the container at ``path`` under ``profile`` (see the module docstring).

    Args:
        profile: a ``restore_profile_id``.
        expect: identity fields the checkpoint must have (the identity rule).
        expect_prev: the ``checkpoint_hash_prev`` it must have (None: none).
        ranks: the ranks to restore, for ``shard_subset`` only.

    Raises:
        UmlosError: any integrity, identity, chain or profile failure; nothing
        is returned unless every check of the profile passed.
    """
    started = time.perf_counter()
    ranks = normalize_ranks(ranks)
    with ContainerReader(path) as reader:
        check_request(reader.header, profile, expect, expect_prev, ranks)
        if profile == schema.FULL_PROFILE:
            verify_opened(reader)
        wanted = wanted_ranks(reader, profile, ranks)
        out = RestoredCheckpoint(profile, reader.checkpoint_hash, reader.header, manifest=reader.run_manifest())
        read_profile(reader, out, wanted)
        out.report = restore_report(reader, profile, started)
        return out


def check_request(header: Mapping[str, Any], profile: Any, expect: Mapping[str, Any] | None, expect_prev: Any,
                  ranks: list[int] | None) -> None:
    """Before any file but the manifest is read: the profile is declared, the
    identity is the expected one, the chain names the expected previous
    checkpoint, and ``ranks`` goes with ``shard_subset`` only."""
    check_profile(header, profile)
    check_identity(header, expect)
    if expect_prev is not _UNSET:
        if expect_prev is not None:
            schema.check_hash(expect_prev, "expect_prev", errors.CHECKPOINT_STATE_INVALID)
        if header.get("checkpoint_hash_prev") != expect_prev:
            raise error(errors.CHECKPOINT_CHAIN_MISMATCH,
                        "checkpoint_hash_prev does not name the expected previous checkpoint", operator=RESTORE)
    if (ranks is not None) != (profile == "shard_subset"):
        raise error(errors.CHECKPOINT_RESTORE_PROFILE, "ranks= goes with profile shard_subset, and only with it",
                    operator=RESTORE)


def verify_opened(reader: ContainerReader) -> None:
    """The full verification of ``verify_container`` on an opened container (``train_full``)."""
    reader.check_all_files()
    reader.check_no_extra()
    reader.check_content()


def wanted_ranks(reader: ContainerReader, profile: str, ranks: list[int] | None) -> set[int]:
    """The ranks whose tensors and optimizer state to read: ``ranks`` for
    ``shard_subset`` (each must have state here), else every rank."""
    layout, optimizer_ranks = reader.tensor_layout(), reader.optimizer_ranks()
    if profile != "shard_subset":
        return set(layout) | set(optimizer_ranks)
    for rank in ranks:  # type: ignore[union-attr]
        if rank not in layout and rank not in optimizer_ranks:
            raise error(errors.CHECKPOINT_RESTORE_PROFILE, f"rank {rank!r} has no state in this checkpoint",
                        operator=RESTORE)
    return set(ranks)  # type: ignore[arg-type]


def read_profile(reader: ContainerReader, out: RestoredCheckpoint, wanted: set[int]) -> None:
    """Fill ``out`` with what its profile reads (:data:`PROFILE_READS`), each file checked as it is read."""
    reads = PROFILE_READS[out.restore_profile_id]
    if "cursors" in reads:
        out.cursors = reader.cursors()
        out.extra_cursors = reader.extra_cursors()
    if "small" in reads:
        out.dp_enabled, out.dp_accountant = reader.dp_state()
        out.tmmu_plan = reader.tmmu_plan()
        out.trace_link = reader.trace_link()
        for name, item in sorted(reader.artifact_index().items()):
            out.user_state[name] = reader.user_value(item)
    if "tensors" in reads:
        layout = reader.tensor_layout()
        for rank in sorted(set(layout) & wanted):
            out.tensors[rank] = [reader.arrays(paths.tensor_path(rank, k)) for k in range(layout[rank])]
    if "optimizer" in reads:
        for rank in reader.optimizer_ranks():
            if rank in wanted:
                out.optimizer[rank] = reader.arrays(paths.optimizer_path(rank))


def restore_report(reader: ContainerReader, profile: str, started: float) -> dict[str, Any]:
    """The restore report: what was restored, from which version, and how long it took."""
    version = reader.header["checkpoint_schema_version"]
    return {
        "restore_profile_id": profile,
        "checkpoint_hash": reader.checkpoint_hash.hex(),
        "checkpoint_size_bytes": sum(e["size"] for e in reader.entries.values()) + len(reader.info.manifest_bytes),
        "compatibility_level": "E0" if version in schema.WRITTEN_VERSIONS else "E0-minor",
        "schema_version": version,
        "files_checked": len(reader.checked),
        "restore_time_ms": (time.perf_counter() - started) * 1000.0,
    }
