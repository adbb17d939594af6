"""Verifying a store and restoring through it: one validation path for both.

``verify_store`` checks everything a store holds; a restore checks, with the
same functions, everything the restored checkpoint depends on: the
certificates ``1..M``, the lineage records and the tape up to the commit of
the checkpoint (its header binds their hashes), the container under the
restore profile, and the container's binding to its certificate, lineage
record and the previous committed checkpoint. So whatever of that verify
refuses, restore refuses too, with the same code. A restore does not read the
other checkpoints' containers (damage there does not change the one it
restores), nor the tape past its commit.

Readers take no lock and follow only certificates, so a crashed or running
writer's temp objects never change what they read. ``verify_store`` also
reports *leftovers*: store-named objects no certificate binds. They are
leftovers of an interrupted commit only if no writer holds the store; a
running writer's in-flight objects are not (``lock.while_no_writer`` tells
the two apart, and the summary's ``writer_active`` says which it was).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .. import errors
from ..hashing import sha256
from . import cbor_safe, paths, retention, schema
from .anchor import check_anchor
from .codes import RESTORE, error, exact_map
from .container import verify_container
from .lock import while_no_writer
from .restore import RestoredCheckpoint, restore_checkpoint
from .state import RunIdentity
from .store import MAX_CERTIFICATE_BYTES, CommitRecord, lineage_path, open_store, store_leftovers
from .tape import TapeState, read_tape

LINEAGE_KEYS = frozenset({"kind", "seq", "tenant_id", "run_id", "t", "prev_lineage_root_hash", "manifest_hash",
                          "dataset_snapshot_id", "trace_tail_hash", "checkpoint_merkle_root"})


# -- the checks both share ----------------------------------------------------------------


def check_lineage(store_dir: str, marker: Mapping[str, Any], commits: Sequence[CommitRecord]) -> list[dict]:
    """The lineage records of ``commits`` (certificates 1..k, in order): each
    hashes to its certified root, matches its commit and chains the previous one."""
    root = paths.open_root(store_dir)
    records = []
    try:
        previous = schema.ZERO_HASH
        for record in commits:
            what = lineage_path(record.seq)
            data = paths.read_bytes(root, what, MAX_CERTIFICATE_BYTES)
            if sha256(data) != record.lineage_root_hash:
                raise error(errors.CHECKPOINT_COMMIT_MISMATCH,
                            f"{what} does not hash to the certified lineage_root_hash")
            lineage = cbor_safe.decode(data, what=what, max_bytes=MAX_CERTIFICATE_BYTES, max_depth=2)
            expected = {
                "kind": "lineage", "seq": record.seq, "tenant_id": marker["tenant_id"], "run_id": marker["run_id"],
                "t": record.t, "prev_lineage_root_hash": previous, "trace_tail_hash": record.trace["tail_hash"],
                "checkpoint_merkle_root": record.checkpoint["checkpoint_merkle_root"] if record.checkpoint else None,
            }
            exact_map(lineage, LINEAGE_KEYS, f"{what} does not match commit {record.seq}",
                      errors.CHECKPOINT_COMMIT_MISMATCH, where=expected)
            previous = record.lineage_root_hash
            records.append(lineage)
    finally:
        os.close(root)
    return records


def check_bound(checkpoint_hash: bytes, header: Mapping[str, Any], record: CommitRecord) -> None:
    """The container is the one certificate ``record`` binds."""
    checkpoint = record.checkpoint
    assert checkpoint is not None  # the callers pass commits that carry a checkpoint
    if checkpoint_hash != record.checkpoint_hash:
        raise error(errors.CHECKPOINT_COMMIT_MISMATCH,
                    f"{checkpoint['path']} is not the checkpoint commit {record.seq} certifies")
    if header["lineage_root_hash"] != record.lineage_root_hash:
        raise error(errors.CHECKPOINT_COMMIT_MISMATCH,
                    f"commit {record.seq}: lineage_root_hash differs from the header")
    if header["trace_tail_hash_at_checkpoint"] != record.trace["tail_hash"] or header["t"] != record.t:
        raise error(errors.CHECKPOINT_COMMIT_MISMATCH, f"commit {record.seq}: trace tail or t differs from the header")
    if header["checkpoint_merkle_root"] != checkpoint["checkpoint_merkle_root"] \
            or header["trace_root_hash"] != record.trace["root_hash"]:
        raise error(errors.CHECKPOINT_COMMIT_MISMATCH, f"commit {record.seq}: header differs from the certificate")


def check_binding(header: Mapping[str, Any], checkpoint_hash: bytes, record: CommitRecord, lineage: Mapping[str, Any],
                  previous_checkpoint: bytes | None, marker: Mapping[str, Any]) -> None:
    """A committed container against its certificate, its lineage record, the
    previous committed checkpoint (``checkpoint_hash_prev``) and the store."""
    check_bound(checkpoint_hash, header, record)
    assert record.checkpoint is not None  # check_bound's callers pass commits that carry a checkpoint
    path = record.checkpoint["path"]
    if header.get("checkpoint_hash_prev") != previous_checkpoint:
        raise error(errors.CHECKPOINT_CHAIN_MISMATCH,
                    f"{path}: checkpoint_hash_prev does not name the previous checkpoint")
    if header["manifest_hash"] != lineage["manifest_hash"] \
            or header["dataset_snapshot_id"] != lineage["dataset_snapshot_id"]:
        raise error(errors.CHECKPOINT_COMMIT_MISMATCH,
                    f"{lineage_path(record.seq)}: manifest or dataset snapshot differs from the checkpoint")
    if header["tenant_id"] != marker["tenant_id"] or header["run_id"] != marker["run_id"]:
        raise error(errors.CHECKPOINT_IDENTITY_MISMATCH, f"{path} belongs to another run")


def check_tape(store_dir: str, commits: Sequence[CommitRecord]) -> TapeState:
    """The tape's committed segments up to the last of ``commits``: the chain,
    each commit's tail at its cut, and the end state the last one certifies."""
    segments = [s for r in commits for s in r.trace["segments"]]

    def tail_check(commit: CommitRecord):
        def check(digest: bytes) -> None:
            if commit.trace["tail_hash"] != digest:
                raise error(errors.TRACE_CHAIN_MISMATCH, f"commit {commit.seq}: trace tail differs from the tape")
        return check

    # Only the tails at commit cuts are compared, so the reader need not decode records (its fast path).
    tape = read_tape(store_dir, segments, cuts={r.trace["event_count"]: tail_check(r) for r in commits})
    if commits:
        trace = commits[-1].trace
        if (tape.next_seq, tape.tail_hash, tape.ended) != (trace["event_count"], trace["tail_hash"], trace["ended"]) \
                or (tape.next_seq and tape.root_hash != trace["root_hash"]):
            raise error(errors.TRACE_CHAIN_MISMATCH, "the tape differs from the latest certificate")
    return tape


# -- restore --------------------------------------------------------------------------------


def restore_committed(store_dir: str, record: CommitRecord, expect: Mapping[str, Any] | None = None, *,
                      profile: str = schema.FULL_PROFILE, ranks: Iterable[int] | None = None) -> RestoredCheckpoint:
    """Restore the container of a checked commit record; its certificate
    supplies ``trace_root_hash`` and ``checkpoint_merkle_root`` for the identity
    check, and the container must be the one the certificate binds."""
    if not record.checkpoint:
        raise error(errors.CHECKPOINT_NOT_FOUND, f"commit {record.seq} has no checkpoint", operator=RESTORE)
    expected = dict(expect or {})
    expected.setdefault("trace_root_hash", record.trace["root_hash"])
    expected.setdefault("checkpoint_merkle_root", record.checkpoint["checkpoint_merkle_root"])
    path = os.path.join(store_dir, record.checkpoint["path"])
    restored = restore_checkpoint(path, profile=profile, expect=expected, ranks=ranks)
    check_bound(restored.checkpoint_hash, restored.header, record)
    return restored


def restore_checked(store_dir: str, marker: Mapping[str, Any], commits: Sequence[CommitRecord],
                    expect: Mapping[str, Any] | None, *, profile: str = schema.FULL_PROFILE,
                    ranks: Iterable[int] | None = None) -> RestoredCheckpoint | None:
    """Restore the latest checkpoint of ``commits`` (None if there is none)
    after the checks of the module docstring."""
    index = next((i for i in range(len(commits) - 1, -1, -1) if commits[i].checkpoint), None)
    if index is None:
        return None
    chosen = commits[: index + 1]
    lineage = check_lineage(store_dir, marker, chosen)
    check_tape(store_dir, chosen)
    record = chosen[-1]
    restored = restore_committed(store_dir, record, expect, profile=profile, ranks=ranks)
    previous = next((r.checkpoint_hash for r in reversed(chosen[:-1]) if r.checkpoint), None)
    check_binding(restored.header, restored.checkpoint_hash, record, lineage[-1], previous, marker)
    return restored


def restore_latest(
    store_dir: str | os.PathLike[str],
    identity: RunIdentity | None = None,
    *,
    public_key: Any = None,
    profile: str = schema.FULL_PROFILE,
    expect: Mapping[str, Any] | None = None,
    tmmu_plan: Any = None,
    ranks: Iterable[int] | None = None,
    expect_head: Any = None,
    min_commit: int | None = None,
) -> RestoredCheckpoint:
    """Restore the latest committed checkpoint of a store (read-only, no lock).

    Uncommitted leftovers of a crashed writer are ignored: only what a valid
    certificate binds is read. ``identity`` supplies the expected identity
    fields; ``expect`` adds or overrides some. ``expect_head`` (a commit's
    head hash) and ``min_commit`` refuse a store rolled back past what the
    caller knows was committed (``CHECKPOINT_STALE``, see :mod:`.anchor`).
    """
    store_dir = os.fspath(store_dir)
    marker, commits = open_store(store_dir, public_key)
    check_anchor(commits, expect_head=expect_head, min_commit=min_commit)
    expected: dict[str, Any] = {"tenant_id": marker["tenant_id"], "run_id": marker["run_id"]}
    if identity is not None:
        expected.update(identity.expected(tmmu_plan))
    expected.update(expect or {})
    restored = restore_checked(store_dir, marker, commits, expected, profile=profile, ranks=ranks)
    if restored is None:
        raise error(errors.CHECKPOINT_NOT_FOUND, f"{store_dir} has no committed checkpoint", operator=RESTORE)
    return restored


# -- verify ---------------------------------------------------------------------------------


def read_for_verify(store_dir: str, public_key: Any) -> tuple[dict, list[CommitRecord], list[str], list[str], bool]:
    """``(marker, commits, uncommitted, unknown, writer_active)``.

    The certificates and the folders are read together while no writer holds
    the store, so every uncommitted object is a leftover. If a writer holds it,
    its in-flight objects (store names no certificate binds yet) are not
    leftovers: ``uncommitted`` is then empty; names the store never uses are
    reported either way.
    """
    def look():
        marker, commits = open_store(store_dir, public_key)
        return marker, commits, store_leftovers(store_dir, commits)

    quiet, result = while_no_writer(store_dir, look)
    if not quiet:
        result = look()
    marker, commits, (uncommitted, unknown) = result
    return marker, commits, uncommitted if quiet else [], unknown, not quiet


def verify_store(store_dir: str | os.PathLike[str], public_key: Any = None, *, strict: bool = True,
                 expect_head: Any = None, min_commit: int | None = None) -> dict[str, Any]:
    """Check a whole store: marker and layout, every certificate and the chain,
    every lineage record, every container (completely) and its binding to its
    certificate, the checkpoint chain, and the whole tape. ``strict`` also
    refuses leftovers of an interrupted commit when no writer holds the store
    (``CHECKPOINT_UNCOMMITTED``: run recovery) and unknown names in the
    store's folders. ``expect_head`` / ``min_commit``: see :mod:`.anchor`.
    Returns a summary (``head`` is the latest commit's head hash)."""
    store_dir = os.fspath(store_dir)
    marker, commits, writer_active = read_store(store_dir, public_key, strict)
    check_anchor(commits, expect_head=expect_head, min_commit=min_commit)
    lineages = check_lineage(store_dir, marker, commits)
    checkpoints, collected = check_checkpoints(store_dir, marker, commits, lineages)
    tape = check_tape(store_dir, commits)
    return store_summary(store_dir, marker, commits, tape, key_trusted=public_key is not None,
                         checkpoints=checkpoints, collected=collected, writer_active=writer_active)


def read_store(store_dir: str, public_key: Any, strict: bool) -> tuple[dict, list[CommitRecord], bool]:
    """``(marker, commits, writer_active)``: the marker and checked
    certificates; ``strict`` refuses leftovers of an interrupted commit
    (``CHECKPOINT_UNCOMMITTED``) and names the store never uses."""
    if not strict:
        marker, commits = open_store(store_dir, public_key)
        return marker, commits, False
    marker, commits, uncommitted, unknown, writer_active = read_for_verify(store_dir, public_key)
    if uncommitted:
        raise error(errors.CHECKPOINT_UNCOMMITTED,
                    f"uncommitted objects from an interrupted commit: {', '.join(uncommitted[:5])}; "
                    "open the store as a writer (or run 'umlos-cuda checkpoint recover') to roll them back")
    if unknown:
        raise error(errors.CHECKPOINT_UNEXPECTED_FILE, f"{unknown[0]} is not a store object")
    return marker, commits, writer_active


def check_checkpoints(store_dir: str, marker: Mapping[str, Any], commits: Sequence[CommitRecord],
                      lineages: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """``(verified, collected)``: every checkpoint the certificates bind,
    verified completely and bound to its certificate, lineage record and
    predecessor, with one identity across the run; those retention collected
    are not read (their certificates give the chain their hashes)."""
    collected_through = retention.collected_for(store_dir, commits)
    previous: bytes | None = None
    identity: dict[str, Any] | None = None
    verified = collected = 0
    for record, lineage in zip(commits, lineages):
        if not record.checkpoint:
            continue
        if record.seq <= collected_through:
            previous = record.checkpoint_hash
            collected += 1
            continue
        info = verify_container(os.path.join(store_dir, record.checkpoint["path"]))
        check_binding(info.header, info.checkpoint_hash, record, lineage, previous, marker)
        identity = check_same_identity(info.header, identity, record)
        previous = info.checkpoint_hash
        verified += 1
    return verified, collected


def check_same_identity(header: Mapping[str, Any], identity: dict[str, Any] | None,
                        record: CommitRecord) -> dict[str, Any]:
    """The identity fields a run keeps (all of §II.I but the Merkle root and
    the TMMU plan hash) equal the previous checkpoint's; return them."""
    fixed = {name: header[name] for name in schema.IDENTITY_FIELDS
             if name not in ("checkpoint_merkle_root", "tmmu_plan_hash")}
    if identity is not None and fixed != identity:
        assert record.checkpoint is not None  # the caller verified this commit's container
        changed = sorted(k for k in fixed if fixed[k] != identity[k])
        raise error(errors.CHECKPOINT_IDENTITY_MISMATCH,
                    f"{record.checkpoint['path']}: identity field(s) {', '.join(changed)} change within the run")
    return fixed


def store_summary(store_dir: str, marker: Mapping[str, Any], commits: Sequence[CommitRecord], tape: TapeState, *,
                  key_trusted: bool, checkpoints: int, collected: int, writer_active: bool) -> dict[str, Any]:
    """What ``verify_store`` reports about the store it checked."""
    latest = commits[-1] if commits else None
    latest_checkpoint = next((r.checkpoint for r in reversed(commits) if r.checkpoint), None)
    return {
        "store": store_dir,
        "tenant_id": marker["tenant_id"],
        "run_id": marker["run_id"],
        "public_key": marker["public_key"].hex(),
        "key_trusted": key_trusted,
        "commits": len(commits),
        "checkpoints": checkpoints,
        "checkpoints_collected": collected,
        "head": latest.head if latest else None,
        "writer_active": writer_active,
        "latest_t": latest.t if latest else None,
        "latest_checkpoint": os.path.join(store_dir, latest_checkpoint["path"]) if latest_checkpoint else None,
        "latest_checkpoint_hash": latest_checkpoint["checkpoint_hash"].hex() if latest_checkpoint else None,
        "trace_events": tape.next_seq,
        "trace_tail_hash": tape.tail_hash.hex(),
        "trace_segments": len(tape.segments),
    }
