"""Small builders shared by the NextBatch tests (manifests, whole-epoch runs)."""

from __future__ import annotations

import numpy as np

import umlos_cuda as uc
from umlos_cuda.backends import to_numpy

KEY = "train"
WORLD_SIZES = (1, 2, 3, 4, 6, 8, 12)


def raw_manifest(n: int, block_size: int | None = None, global_batch_size: int = 24, seed: int = 0,
                 drop_last: bool | None = None, key: str = KEY, **extra) -> dict:
    """A plain manifest dict with one dataset ``key`` of cardinality ``n``."""
    data = {}
    if block_size is not None:
        data["sampler_block_size"] = block_size
    if drop_last is not None:
        data["drop_last"] = drop_last
    raw = {
        "seed": seed,
        "global_batch_size": global_batch_size,
        "datasets": {key: {"id": f"ds-{n}", "version": "1", "hash": "sha256:" + "0" * 64, "cardinality": n}},
    }
    if data:
        raw["data"] = data
    raw.update(extra)
    return raw


def indices_list(batch_or_array) -> list[int]:
    array = getattr(batch_or_array, "indices", batch_or_array)
    array = to_numpy(array)
    assert array.dtype == np.uint64
    return [int(x) for x in array.tolist()]


def run_epoch(manifest, world_size: int, stage: str = "train", epoch: int = 0, backend: str = "numpy",
              key: str = KEY, preset: str | None = None):
    """Call next_batch for every rank until the cursor leaves ``epoch``.

    Returns ``(steps, cursors)``: ``steps[t][r]`` is rank r's indices (list of
    int) at step t, ``cursors[t]`` the cursor after step t (the same for every
    rank, which is asserted).
    """
    cursor = uc.Cursor(epoch, 0)
    steps, cursors = [], []
    while cursor.epoch == epoch:
        per_rank = []
        after = None
        for rank in range(world_size):
            batch = uc.next_batch(manifest, key, world_size, rank, stage, cursor, backend=backend, preset=preset)
            per_rank.append(indices_list(batch))
            assert after is None or batch.cursor == after, "ranks disagree on the next cursor"
            after = batch.cursor
        steps.append(per_rank)
        cursors.append(after)
        cursor = after
        assert len(steps) < 10**6
    return steps, cursors


def flatten(steps) -> list[int]:
    return [i for per_rank in steps for indices in per_rank for i in indices]
