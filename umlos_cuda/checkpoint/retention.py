"""Retention: keep the newest ``keep_last`` checkpoints of a store, collect the older ones.

Why only containers: a store's bytes are almost all in its checkpoint
containers (tensors, optimizer state). The certificates and lineage records
(under a kilobyte per commit) are the signed hash chain from the first commit
to the head, and the tape is the run's trace; removing them would make the
store's history start at an unsigned point. So garbage collection removes
the containers ``checkpoints/commit=<n>/`` of older commits and nothing
else: every certificate still binds its checkpoint's ``checkpoint_hash``,
which is enough to check the ``checkpoint_hash_prev`` chain across the
collected ones.

``retention.cbor`` (top level, canonical CBOR)
``{format: "UML_OS.Checkpoint.Retention_v1", collected_through: j}`` says
that the checkpoints of commits ``1..j`` are collected: verification does not
read them (each may be absent, complete, or partly removed by an interrupted
collection) and takes their hashes from their certificates. ``j`` is below
the newest checkpoint's commit, so the newest checkpoint (and the newest
commit) is never collected.

Collection (:func:`collect_garbage`, ``umlos-cuda checkpoint gc STORE
--keep-last K``, or ``CheckpointStore.open(..., keep_last=K)`` after each
commit) holds the writer's lock and:

1. reads the certificates; ``j`` = the commit just before the ``K``-th newest
   checkpoint (never lower than the ``j`` already recorded);
2. writes ``retention.cbor`` atomically (temp file, fsync, rename, fsync);
3. removes the containers of commits ``1..j`` that are still there, oldest
   first, fsyncing ``checkpoints/`` after each.

A crash (SIGKILL) at any instant leaves either the old ``retention.cbor``
with every container it did not collect, or the new one with some of
commits ``1..j``'s containers left: both verify, and the newest checkpoint is
untouched. Running collection again finishes the removal.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from .. import checks, errors
from ..hashing import cbor_canonical
from . import atomic, cbor_safe, paths
from .codes import COMMIT, error, exact_map
from .lock import StoreLock
from .store import MARKER_NAME, CommitRecord, checkpoint_dir, open_store

RETENTION_FORMAT = "UML_OS.Checkpoint.Retention_v1"
RETENTION_NAME = "retention.cbor"
MAX_RETENTION_BYTES = 4096


@dataclass
class CollectionReport:
    """What a collection did: the commits whose checkpoints it keeps, and what it removed."""

    collected_through: int
    kept: list[int] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def check_keep_last(keep_last: Any) -> int:
    """``keep_last`` is an integer >= 1 (the newest checkpoint is always kept)."""
    return checks.integer(keep_last, "keep_last", 1, None,
                          fail=partial(error, errors.CHECKPOINT_STATE_INVALID, operator=COMMIT),
                          message="{name} must be an integer >= {low} (the newest checkpoint is always kept), "
                                  "got {value!r}")


def read_collected(store_dir: str) -> int:
    """``collected_through`` of ``retention.cbor`` (0 without one), its shape checked."""
    root = paths.open_root(store_dir)
    try:
        data = paths.read_bytes(root, RETENTION_NAME, MAX_RETENTION_BYTES)
    except errors.UmlosError as exc:
        if exc.code == errors.CHECKPOINT_FILE_MISSING:
            return 0
        raise
    finally:
        os.close(root)
    value = cbor_safe.decode(data, what=RETENTION_NAME, max_bytes=MAX_RETENTION_BYTES, max_depth=1)
    exact_map(value, ("format", "collected_through"),
              f"{RETENTION_NAME} must be {{format: {RETENTION_FORMAT}, collected_through: uint64}}",
              errors.CHECKPOINT_SCHEMA_INVALID,
              where={"format": RETENTION_FORMAT, "collected_through": checks.is_uint64})
    return value["collected_through"]


def check_collected(collected_through: int, commits: Sequence[CommitRecord]) -> int:
    """The verifier's rule: ``collected_through`` is 0 or below the newest
    checkpoint's commit (``CHECKPOINT_CHAIN_MISMATCH``)."""
    latest = next((r.seq for r in reversed(commits) if r.checkpoint), None)
    if collected_through and (latest is None or collected_through >= latest):
        raise error(errors.CHECKPOINT_CHAIN_MISMATCH,
                    f"{RETENTION_NAME} collects the checkpoints of commits 1..{collected_through}, but the newest "
                    f"checkpoint is {'commit ' + str(latest) if latest else 'absent'}: the newest is never collected")
    return collected_through


def collected_for(store_dir: str, commits: Sequence[CommitRecord]) -> int:
    """``collected_through`` for a reader: read and checked against ``commits``."""
    return check_collected(read_collected(store_dir), commits)


def plan(commits: Sequence[CommitRecord], keep_last: int) -> int:
    """The ``collected_through`` that keeps the ``keep_last`` newest checkpoints."""
    with_checkpoint = [r.seq for r in commits if r.checkpoint]
    if len(with_checkpoint) <= check_keep_last(keep_last):
        return 0
    return with_checkpoint[-keep_last] - 1


def collect_locked(store_dir: str, commits: Sequence[CommitRecord], keep_last: int) -> CollectionReport:
    """Steps 1-3 of the module docstring; the caller holds the store's lock
    and passes the store's checked certificates."""
    previous = collected_for(store_dir, commits)
    through = max(previous, plan(commits, keep_last))
    atomic.crash_point("gc_begin")
    if through > previous:
        final = os.path.join(store_dir, RETENTION_NAME)
        atomic.remove(final + ".tmp")
        atomic.write_file(final + ".tmp", cbor_canonical({"format": RETENTION_FORMAT, "collected_through": through}))
        atomic.crash_point("gc_marker_temp")
        atomic.rename(final + ".tmp", final)
        atomic.crash_point("gc_marker_written")
    report = CollectionReport(through, kept=[r.seq for r in commits if r.checkpoint and r.seq > through])
    folder = os.path.join(store_dir, "checkpoints")
    for record in commits:
        if record.seq > through:
            break
        if record.checkpoint and atomic.remove(os.path.join(store_dir, checkpoint_dir(record.seq))):
            atomic.fsync_dir(folder)
            report.removed.append(checkpoint_dir(record.seq))
            atomic.crash_point("gc_removed")
    return report


def collect_garbage(store_dir: str | os.PathLike[str], keep_last: int, *,
                    lock_timeout: float = 0.0) -> CollectionReport:
    """Keep the ``keep_last`` newest checkpoints of a store and remove the
    older containers (module docstring), under the writer's lock
    (``CHECKPOINT_LOCKED`` while a writer holds the store)."""
    store_dir = os.fspath(store_dir)
    check_keep_last(keep_last)
    if not os.path.isfile(os.path.join(store_dir, MARKER_NAME)):
        raise error(errors.CHECKPOINT_NOT_FOUND, f"{store_dir} is not a checkpoint store", operator=COMMIT)
    lock = StoreLock(store_dir).acquire(lock_timeout)
    try:
        _, commits = open_store(store_dir)
        return collect_locked(store_dir, commits, keep_last)
    finally:
        lock.release()
