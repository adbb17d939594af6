"""Checkpoint, crash, restore and compare: the checkpoint part of ``umlos-cuda demo``.

It lives with the command, not in the library: it is a user of
:mod:`umlos_cuda.checkpoint` (a job that checkpoints, crashes and resumes),
like any training loop, and nothing in the library depends on it.

:func:`run_checkpoint_demo` plays a data-parallel job on a manifest: every step
each of the ``world_size`` ranks asks NextBatch_v2 for its micro-batch, the
tape records one ``iter`` per call, and a toy model (per rank: how many samples
it has seen and a running digest of their indices, uint64 arithmetic so the
comparison is exact) absorbs the batch. Every ``every_k`` steps the job commits
a checkpoint to a store in ``workdir``. Partway through, the writer stops
without committing (a crash: its last records exist only as temp objects).
A new writer then opens the store, which rolls the uncommitted objects back,
restores the latest checkpoint (anchored: the store must still hold the head
hash logged at the last commit, see ``anchor``) and runs to the end.

The demo then checks, against the same job run in memory without
interruption, that every step's indices, cursors and model state are identical
(E0), that the committed tape holds each step's ``iter`` records exactly once
and equal to the uninterrupted run's, and that the store verifies. The signing
key is a fixed, published demo key (see ``DEMO_KEY_SEED``): fine for a demo,
never for real checkpoints.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from .. import checks, errors
from ..backends import to_numpy
from ..checkpoint import atomic, signing
from ..checkpoint.commit import MANAGED_DIRS, MARKER_NAME, CheckpointStore, read_marker, restore_latest, verify_store
from ..checkpoint.state import CheckpointState, RunIdentity
from ..checkpoint.tape import iter_fields, read_tape
from ..cursor import Cursor
from ..errors import UmlosError
from ..hashing import sha256
from ..manifest.core import Manifest, as_manifest
from ..nextbatch import next_batch

DEMO_TENANT = "umlos-demo"
DEMO_RUN = "checkpoint-demo"
#: The demo's signing key seed: public on purpose, so anyone can rerun the demo.
DEMO_KEY_SEED = sha256(b"umlos-cuda checkpoint demo key: public, never use for real checkpoints")
_MIX = np.uint64(0x9E3779B97F4A7C15)


def error(code: str, message: str) -> UmlosError:
    """A failure of the demo itself; its record names umlos_cuda.demo (the store's own name their operators)."""
    return UmlosError(code, message, operator=errors.DEMO_OPERATOR)


def demo_public_key() -> str:
    return signing.public_key_bytes(DEMO_KEY_SEED).hex()


def _hash16(checkpoint_hash: bytes | None) -> str:
    """The first 16 hex digits of the checkpoint a commit of a state wrote."""
    assert checkpoint_hash is not None  # commit(state) always writes a checkpoint
    return checkpoint_hash.hex()[:16]


class _Job:
    """The toy job: cursor, per-rank model state, and the NextBatch calls of a step."""

    def __init__(self, manifest: Manifest, dataset_key: str, world_size: int, backend: str) -> None:
        self.manifest = manifest
        self.dataset_key = dataset_key
        self.world_size = world_size
        self.backend = backend
        self.cursor = Cursor()
        self.seen = {rank: np.zeros(1, dtype=np.uint64) for rank in range(world_size)}
        self.digest = {rank: np.zeros(4, dtype=np.uint64) for rank in range(world_size)}

    def step(self, t: int) -> list[dict[str, Any]]:
        records = []
        cursor_after = None
        for rank in range(self.world_size):
            batch = next_batch(self.manifest, self.dataset_key, self.world_size, rank, "train", self.cursor,
                               backend=self.backend, t=t)
            indices = to_numpy(batch.indices).astype(np.uint64)
            records.append(iter_fields(batch, t))
            self.seen[rank] = self.seen[rank] + np.uint64(indices.size)
            with np.errstate(over="ignore"):
                lanes = np.zeros(4, dtype=np.uint64)
                for lane in range(4):
                    lanes[lane] = np.bitwise_xor.reduce(indices[lane::4] * _MIX) if indices[lane::4].size else 0
                self.digest[rank] = self.digest[rank] * _MIX + lanes
            cursor_after = batch.cursor
        assert cursor_after is not None  # world_size >= 1: some rank ran
        self.cursor = cursor_after
        return records

    def state(self, t: int) -> CheckpointState:
        return CheckpointState(
            t,
            {self.dataset_key: self.cursor},
            tensors={rank: [{"indices_digest": self.digest[rank]}] for rank in range(self.world_size)},
            optimizer={rank: {"samples_seen": self.seen[rank]} for rank in range(self.world_size)},
            tmmu_plan={"world_size": self.world_size},
            user_state={"job": f"demo job at step {t}".encode()},
        )

    def load(self, restored) -> None:
        self.cursor = restored.cursors[self.dataset_key]
        for rank in range(self.world_size):
            self.digest[rank] = restored.tensors[rank][0]["indices_digest"]
            self.seen[rank] = restored.optimizer[rank]["samples_seen"]

    def snapshot(self) -> tuple:
        return (self.cursor,) + tuple(self.digest[r].tobytes() + self.seen[r].tobytes() for r in range(self.world_size))


def _clear_previous_demo(workdir: str) -> None:
    """Remove a store an earlier demo left in ``workdir`` (only the demo's own store)."""
    if not os.path.lexists(os.path.join(workdir, MARKER_NAME)):
        return
    marker = read_marker(workdir)
    if (marker["tenant_id"], marker["run_id"]) != (DEMO_TENANT, DEMO_RUN):
        raise error(errors.CHECKPOINT_STATE_INVALID,
                    f"{workdir} holds the store of run {marker['run_id']!r}; choose another --workdir")
    for name in MANAGED_DIRS + (MARKER_NAME,):
        atomic.remove(os.path.join(workdir, name))


def run_checkpoint_demo(
    workdir: str | os.PathLike[str],
    manifest: Manifest | str | os.PathLike[str],
    dataset_key: str = "train",
    world_size: int = 8,
    steps: int = 48,
    every_k: int = 8,
    backend: str = "auto",
    log: Callable[[str], Any] = print,
) -> dict[str, Any]:
    """Run the checkpoint demo in ``workdir`` (see the module docstring).

    Returns a summary dict (``store``, ``container``, ``checkpoint_hash``,
    ``public_key``, ``commits``, ``head``, ``crash_after_step``, ``restored_from_step``,
    ``rolled_back``, ``steps_compared``, ``iter_records_compared``,
    ``identical``, ``final_cursor``, ``verify``). Raises
    ``UmlosError(CONTRACT_VIOLATION)`` if the continuation differs.
    """
    workdir = os.path.abspath(os.fspath(workdir))
    manifest = as_manifest(manifest)
    for name, value, low in (("steps", steps, 2), ("every_k", every_k, 1), ("world_size", world_size, 1)):
        checks.integer(value, name, low, None, fail=partial(error, errors.INVALID_ARGUMENT), message=checks.AT_LEAST,
                       strict=True)
    if every_k >= steps:
        raise error(errors.INVALID_ARGUMENT, f"every_k ({every_k}) must be smaller than steps ({steps})")
    os.makedirs(workdir, exist_ok=True)
    _clear_previous_demo(workdir)
    identity = RunIdentity(DEMO_TENANT, DEMO_RUN, manifest)
    # Crash halfway between two checkpoints, two thirds into the run.
    last_commit_before = max(every_k, ((2 * steps) // 3) // every_k * every_k)
    crash_after = min(last_commit_before + max(1, every_k // 2), steps - 1)

    # The uninterrupted run, in memory.
    reference = _Job(manifest, dataset_key, world_size, backend)
    expected_records: dict[int, list[dict]] = {}
    expected_state: dict[int, tuple] = {}
    for t in range(1, steps + 1):
        expected_records[t] = reference.step(t)
        expected_state[t] = reference.snapshot()
    log(f"reference run: {steps} steps x {world_size} ranks on {dataset_key!r}, cursor -> {reference.cursor.to_dict()}")

    # First writer: checkpoints every K steps, then stops without committing,
    # as a crashed writer would (abandon: its last records stay temp objects).
    job = _Job(manifest, dataset_key, world_size, backend)
    store = CheckpointStore.open(workdir, identity, DEMO_KEY_SEED)
    try:
        store.start_run(dataset_key, world_size=world_size)
        for t in range(1, crash_after + 1):
            for record in job.step(t):
                store.tape.append(record)
            if t % every_k == 0:
                commit = store.commit(job.state(t))
                log(f"step {t:>4}: committed checkpoint {_hash16(commit.checkpoint_hash)} (commit {commit.seq}, "
                    f"head {commit.head})")
        log(f"step {crash_after:>4}: writer stops without committing (steps {crash_after - crash_after % every_k + 1}"
            f"..{crash_after} exist only as temp objects)")
    finally:
        store.abandon()
    anchor = commit.head

    # Second writer: recovery, restore, continue.
    job = _Job(manifest, dataset_key, world_size, backend)
    with CheckpointStore.open(workdir, identity, DEMO_KEY_SEED) as store:
        rolled_back = list(store.recovery.rolled_back)
        log(f"recovery: rolled back {len(rolled_back)} uncommitted object(s): {', '.join(rolled_back) or 'none'}")
        restored = store.restore_latest(expect_head=anchor)
        if restored is None:
            raise error(errors.CONTRACT_VIOLATION, "the first writer committed no checkpoint to restore")
        job.load(restored)
        start = restored.t
        log(f"restored checkpoint {restored.checkpoint_hash.hex()[:16]} at step {start}, cursor {job.cursor.to_dict()} "
            f"(the store still holds head {anchor[:16]})")
        if job.snapshot() != expected_state[start]:
            raise error(errors.CONTRACT_VIOLATION,
                        f"the restored state differs from the uninterrupted run at step {start}")
        for t in range(start + 1, steps + 1):
            for record in job.step(t):
                store.tape.append(record)
            if job.snapshot() != expected_state[t]:
                raise error(errors.CONTRACT_VIOLATION, f"step {t} after restore differs from the uninterrupted run")
            if t % every_k == 0 and t != steps:
                store.commit(job.state(t))
        store.tape.append({
            "type": "run_end", "status": "success", "final_epoch_count": job.cursor.epoch,
            "total_samples_seen": int(sum(int(job.seen[r][0]) for r in range(world_size))),
            "checkpoint_hash": restored.checkpoint_hash, "restore_status": "restored",
            "final_cursors": {dataset_key: job.cursor.to_dict()},
        })
        final = store.commit(job.state(steps))
        log(f"step {steps:>4}: run_end, final checkpoint {_hash16(final.checkpoint_hash)} (commit {final.seq}, "
            f"head {final.head})")
        commits = final.seq

    # The committed tape holds every step's iter records once, equal to the reference.
    summary = verify_store(workdir, expect_head=final.head)
    _, store_commits = _read(workdir)
    iters: dict[int, list[dict]] = {}

    def collect(record: dict, _digest: bytes) -> None:
        if record["type"] == "iter":
            fields = {k: v for k, v in record.items() if k not in ("seq", "prev")}
            iters.setdefault(fields["t"], []).append(fields)

    read_tape(workdir, [s for c in store_commits for s in c.trace["segments"]], on_record=collect)
    if sorted(iters) != list(range(1, steps + 1)) or any(iters[t] != expected_records[t] for t in iters):
        raise error(errors.CONTRACT_VIOLATION, "the committed tape's iter records differ from the uninterrupted run")
    latest = restore_latest(workdir, identity, public_key=demo_public_key(), expect_head=final.head)
    check = _Job(manifest, dataset_key, world_size, backend)
    check.load(latest)
    if check.snapshot() != expected_state[steps]:
        raise error(errors.CONTRACT_VIOLATION, "the final checkpoint differs from the uninterrupted run")
    records_compared = sum(len(v) for v in iters.values())
    log(f"identical: steps {start + 1}..{steps} after restore match the uninterrupted run; "
        f"{records_compared} iter records on the tape match; store verified ({summary['commits']} commits)")
    return {
        "workdir": workdir,
        "store": workdir,
        "container": summary["latest_checkpoint"],
        "checkpoint_hash": summary["latest_checkpoint_hash"],
        "public_key": demo_public_key(),
        "steps": steps,
        "every_k": every_k,
        "world_size": world_size,
        "commits": commits,
        "crash_after_step": crash_after,
        "restored_from_step": start,
        "rolled_back": rolled_back,
        "steps_compared": steps - start,
        "iter_records_compared": records_compared,
        "identical": True,
        "final_cursor": job.cursor.to_dict(),
        "head": final.head,
        "verify": summary,
    }


def _read(workdir: str):
    from ..checkpoint.commit import open_store

    return open_store(workdir)
