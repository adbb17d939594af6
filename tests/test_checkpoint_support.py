"""Shared cases for the checkpoint tests (imported by the other test_checkpoint_* modules),
and the checks that the cases themselves are what the other tests assume."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

import umlos_cuda as uc
from umlos_cuda.checkpoint import CheckpointState, RunIdentity, save_checkpoint
from umlos_cuda.checkpoint.container import TraceLink

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
DATASET = "train"


def manifest(seed: int = 7, cardinality: int = 1000, batch: int = 8, block: int = 64) -> uc.Manifest:
    return uc.Manifest.from_dict(
        {
            "global_batch_size": batch,
            "seed": seed,
            "data": {"sampler_block_size": block},
            "datasets": {DATASET: {"id": "corpus", "version": "1", "hash": "sha256:00", "cardinality": cardinality},
                         "val": {"id": "corpus-val", "version": "1", "hash": "sha256:01", "cardinality": 100}},
        }
    )


def identity(**overrides) -> RunIdentity:
    fields = {"tenant_id": "tenant-a", "run_id": "run-1", "manifest": manifest()}
    fields.update(overrides)
    return RunIdentity(**fields)


def reference_cursors(m: uc.Manifest, steps: int) -> list[uc.Cursor]:
    """``[cursor after 0 steps, after 1 step, ...]`` of an uninterrupted W = 1 run."""
    out = [uc.Cursor()]
    for _ in range(steps):
        out.append(uc.next_batch(m, DATASET, 1, 0, cursor=out[-1], backend="numpy").cursor)
    return out


def state(t: int, cursor: uc.Cursor | None = None, *, dp: bool = True, shards: int = 2,
          ranks: int = 2) -> CheckpointState:
    """A small deterministic state whose every array depends on ``t``."""
    cursor = cursor or uc.Cursor(0, (8 * t) % 1000)
    tensors = {
        rank: [
            {"weight": (np.arange(6, dtype=np.float32).reshape(2, 3) + t + 10 * rank + 100 * k),
             "bias": np.full(3, t * (k + 1), dtype=np.int64)}
            for k in range(shards)
        ]
        for rank in range(ranks)
    }
    optimizer = {rank: {"momentum": np.linspace(0, 1, 4, dtype=np.float64) * (t + rank)} for rank in range(ranks)}
    return CheckpointState(
        t,
        {DATASET: cursor, "val": uc.Cursor(0, t % 100)},
        tensors=tensors,
        optimizer=optimizer,
        dp_accountant={"epsilon_spent": 0.25 * t, "delta": 1e-5, "steps": t} if dp else None,
        tmmu_plan={"arena_bytes": 1 << 20, "slots": [1, 2, 3]},
        user_state={"rng_torch": bytes([t % 256]) * 5, "loss_hist": np.array([0.5, 0.25, 0.125 * t])},
    )


def write_container(path: str, t: int = 3, **kwargs) -> uc.checkpoint.ContainerInfo:
    link = TraceLink(bytes([1]) * 32, bytes([2]) * 32, 5,
                     ({"path": "trace/segment=1.tape", "size": 100, "sha256": bytes([3]) * 32,
                       "first_seq": 0, "event_count": 5},))
    return save_checkpoint(path, identity(), state(t), trace_link=link, lineage_root_hash=bytes([4]) * 32,
                           checkpoint_hash_prev=kwargs.pop("prev", None), **kwargs)


def reseal(path: str, changes: dict[str, bytes]) -> None:
    """Replace files of the container at ``path`` and rewrite its manifest so
    that every hash, Merkle root and the header agree again: a container as a
    writer without this package's checks (or a forger without the store's
    key) could produce. Only content checks can then refuse it."""
    from umlos_cuda.checkpoint import paths
    from umlos_cuda.checkpoint.container import component_roots, encode_manifest, parse_manifest
    from umlos_cuda.hashing import sha256

    info = parse_manifest(Path(os.path.join(path, paths.MANIFEST_NAME)).read_bytes())
    for rel, data in changes.items():
        with open(os.path.join(path, rel), "wb") as handle:
            handle.write(data)
    entries = [dict(e, size=len(changes[e["path"]]), sha256=sha256(changes[e["path"]])) if e["path"] in changes else e
               for e in info.entries]
    header = dict(info.header, **{k: v for k, v in component_roots(entries).items() if k in info.header})
    for rel, field in ((paths.ARTIFACT_INDEX_PATH, "artifact_index_hash"), (paths.TMMU_PATH, "tmmu_plan_hash")):
        if rel in changes:
            header[field] = sha256(changes[rel])
    with open(os.path.join(path, paths.MANIFEST_NAME), "wb") as handle:
        handle.write(encode_manifest(header, entries))


def files_of(root: str) -> list[str]:
    """Every file under ``root`` as a relative path, sorted."""
    out = []
    for folder, _, names in os.walk(root):
        for name in names:
            out.append(os.path.relpath(os.path.join(folder, name), root))
    return sorted(out)


def test_state_is_deterministic_and_depends_on_t():
    a, b, c = state(3), state(3), state(4)
    assert all(np.array_equal(a.tensors[0][1][k], b.tensors[0][1][k]) for k in ("weight", "bias"))
    assert not np.array_equal(a.tensors[0][1]["weight"], c.tensors[0][1]["weight"])


def test_reference_cursors_advance():
    cursors = reference_cursors(manifest(), 3)
    assert [c.global_index for c in cursors] == [0, 8, 16, 24]
