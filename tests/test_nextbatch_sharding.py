"""R7 ranks and epoch ends: any world size gives the same global sequence,
ranks take contiguous slices, eval/infer are sequential and emit the final
partial batch, drop_last stops train at floor(N/G)*G, and the equivalence matrix of
docs/spec/README.md, "Conformance" (5 seeds x 3 world sizes x 2 modes) against the oracle."""

from __future__ import annotations

import numpy as np
import pytest

import oracle
import umlos_cuda as uc
from nbcases import WORLD_SIZES, flatten, indices_list, raw_manifest, run_epoch

G = 24  # divisible by every world size in WORLD_SIZES


@pytest.mark.parametrize("stage", ["train", "eval", "infer"])
@pytest.mark.parametrize("n,block_size,drop_last",
                         [(1000, 64, False), (1000, 64, True), (997, 1000, False), (50, 7, True), (5, 3, False)])
def test_every_world_size_gives_the_same_global_sequence(n, block_size, drop_last, stage):
    raw = raw_manifest(n, block_size, G, seed=77, drop_last=drop_last)
    manifest = uc.Manifest.from_dict(raw)
    sequences = {}
    cursor_runs = {}
    for world_size in WORLD_SIZES:
        steps, cursors = run_epoch(manifest, world_size, stage, epoch=2)
        sequences[world_size] = flatten(steps)
        cursor_runs[world_size] = cursors
    reference = sequences[1]
    for world_size in WORLD_SIZES:
        assert sequences[world_size] == reference, f"world_size {world_size} differs"
        assert cursor_runs[world_size] == cursor_runs[1]
    limit = (n // G) * G if (stage == "train" and drop_last) else n
    assert len(reference) == limit
    if stage == "train":
        expected = indices_list(uc.epoch_indices(manifest, "train", epoch=2, backend="numpy"))
        assert reference == expected
        assert len(set(reference)) == limit  # no repeats within an epoch
        assert set(reference) <= set(range(n))
        if not drop_last:
            assert sorted(reference) == list(range(n))
    else:
        assert reference == list(range(n))


@pytest.mark.parametrize("world_size", [2, 3, 4, 6, 8, 12])
def test_contiguous_shards_reconstruct_the_global_batch(world_size):
    n, block_size = 10_000, 128
    manifest = uc.Manifest.from_dict(raw_manifest(n, block_size, 96, seed=5))
    for global_index in (0, 96 * 7, n - n % 96, n - 1):
        whole = uc.next_batch(manifest, "train", 1, 0, "train", uc.Cursor(3, global_index), backend="numpy")
        mb = 96 // world_size
        pieces = []
        for rank in range(world_size):
            part = indices_list(uc.next_batch(manifest, "train", world_size, rank, "train", uc.Cursor(3, global_index),
                                              backend="numpy"))
            # Rank r's slice is exactly positions [gp + r*mb, gp + (r+1)*mb) clipped to the epoch.
            lo, hi = min(n, global_index + rank * mb), min(n, global_index + (rank + 1) * mb)
            assert part == indices_list(uc.epoch_indices(manifest, "train", epoch=3, start=lo, count=hi - lo,
                                                         backend="numpy"))
            pieces.extend(part)
        assert pieces == indices_list(whole)


def test_eval_final_partial_batch_and_empty_ranks():
    n, world_size, g = 1000, 12, 48  # 1000 = 20*48 + 40: the last batch has 40 samples
    manifest = uc.Manifest.from_dict(raw_manifest(n, 16, g, drop_last=True))  # drop_last is ignored by eval
    cursor = uc.Cursor(0, 960)
    sizes = []
    for rank in range(world_size):
        batch = uc.next_batch(manifest, "train", world_size, rank, "eval", cursor, backend="numpy")
        got = indices_list(batch)
        sizes.append(len(got))
        assert got == list(range(960 + rank * 4, min(1000, 960 + (rank + 1) * 4)))
        assert batch.cursor == uc.Cursor(1, 0)
        assert batch.indices.dtype == np.uint64
    assert sizes == [4] * 10 + [0, 0]


def test_eval_never_wraps_even_when_g_exceeds_n():
    manifest = uc.Manifest.from_dict(raw_manifest(5, 2, 24))
    batch = uc.next_batch(manifest, "train", 3, 0, "eval", uc.Cursor(4, 0), backend="numpy")
    assert indices_list(batch) == [0, 1, 2, 3, 4]
    assert batch.cursor == uc.Cursor(5, 0)
    for rank in (1, 2):
        assert indices_list(uc.next_batch(manifest, "train", 3, rank, "eval", uc.Cursor(4, 0), backend="numpy")) == []


def test_drop_last_train_stops_at_whole_batches():
    n, g = 1000, 48  # 20 whole batches = 960 positions
    raw = raw_manifest(n, 64, g, seed=11, drop_last=True)
    steps, cursors = run_epoch(uc.Manifest.from_dict(raw), 4, "train", epoch=0)
    assert len(steps) == 20
    assert cursors[-1] == uc.Cursor(1, 0)
    assert all(len(indices) == 12 for per_rank in steps for indices in per_rank)
    sequence = flatten(steps)
    assert sequence == oracle.Oracle(raw).epoch("train", 0).window(0, 960)
    assert len(set(sequence)) == 960
    # drop_last is part of the manifest hash, hence of the epoch seed: the order
    # is not the first 960 positions of the drop_last = false order.
    undropped = flatten(run_epoch(uc.Manifest.from_dict(raw_manifest(n, 64, g, seed=11, drop_last=False)), 4)[0])
    assert sequence != undropped[:960]


def test_drop_last_false_emits_the_partial_train_batch():
    n, g = 1000, 48
    raw = raw_manifest(n, 64, g, seed=11, drop_last=False)
    steps, _ = run_epoch(uc.Manifest.from_dict(raw), 4, "train", epoch=0)
    assert len(steps) == 21
    assert [len(x) for x in steps[-1]] == [12, 12, 12, 4]
    assert sorted(flatten(steps)) == list(range(n))


MATRIX_SEEDS = [0, 1, 20260218, 2**32 + 5, 2**64 - 1]


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["train", "eval"])
@pytest.mark.parametrize("world_size", [1, 8, 12])
@pytest.mark.parametrize("seed", MATRIX_SEEDS)
def test_equivalence_matrix_against_oracle(seed, world_size, stage):
    """The equivalence matrix: full batch index sequences, exact match, for every call."""
    n, block_size, g = 3001, 97, 96
    raw = raw_manifest(n, block_size, g, seed=seed)
    manifest = uc.Manifest.from_dict(raw)
    model = oracle.Oracle(raw)
    cursor = uc.Cursor(1, 0)
    calls = 0
    while cursor.epoch == 1:
        after = None
        for rank in range(world_size):
            batch = uc.next_batch(manifest, "train", world_size, rank, stage, cursor, backend="numpy")
            expected = model.next_batch("train", world_size, rank, stage, cursor.epoch, cursor.global_index)
            assert indices_list(batch) == expected.indices
            assert (batch.cursor.epoch, batch.cursor.global_index) == expected.cursor
            assert batch.metadata["data_replay_t"] == expected.data_replay_t
            assert batch.metadata["sampler_config_hash"] == expected.sampler_config_hash
            after = batch.cursor
            calls += 1
        cursor = after
    assert calls == world_size * -(-n // g)


def test_different_seeds_give_different_orders():
    orders = {tuple(indices_list(uc.epoch_indices(raw_manifest(500, 50, seed=s), "train", backend="numpy")))
              for s in MATRIX_SEEDS}
    assert len(orders) == len(MATRIX_SEEDS)
