"""R7 cursor advance, epoch roll-over, and checkpoint/restore (docs/spec/nextbatch-v2.md §4.3): a cursor
saved as CBOR mid-epoch and restored gives the identical continuation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

import oracle
import umlos_cuda as uc
from nbcases import WORLD_SIZES, indices_list, raw_manifest, run_epoch
from umlos_cuda import errors


@pytest.mark.parametrize("stage,drop_last,expected_indices",
                         [("train", False, [24, 48, 72, 96]), ("train", True, [24, 48, 72]),
                          ("eval", True, [24, 48, 72, 96]), ("infer", False, [24, 48, 72, 96])])
def test_cursor_advance_sequence(stage, drop_last, expected_indices):
    """N = 100, G = 24: train without drop_last and eval take 5 steps (the last
    produces 4), train with drop_last takes 4 steps (96 positions); the step
    that ends the epoch moves the cursor to (epoch + 1, 0)."""
    raw = raw_manifest(100, 16, 24, drop_last=drop_last)
    steps, cursors = run_epoch(uc.Manifest.from_dict(raw), 2, stage, epoch=7)
    assert cursors == [uc.Cursor(7, i) for i in expected_indices] + [uc.Cursor(8, 0)]
    assert sum(len(x) for s in steps for x in s) == (96 if drop_last and stage == "train" else 100)


@settings(max_examples=120)
@given(n=st.integers(1, 400), g_per=st.integers(1, 10), world_size=st.sampled_from(WORLD_SIZES),
       stage=st.sampled_from(["train", "eval", "infer"]), drop_last=st.booleans(), data=st.data())
def test_cursor_after_matches_oracle(n, g_per, world_size, stage, drop_last, data):
    g = g_per * world_size
    if stage == "train" and drop_last and g > n:
        return
    raw = raw_manifest(n, 8, g, drop_last=drop_last)
    limit = (n // g) * g if (stage == "train" and drop_last) else n
    gi = data.draw(st.integers(0, limit - 1))
    epoch = data.draw(st.integers(0, 2**64 - 2))
    batch = uc.next_batch(raw, "train", world_size, world_size - 1, stage, uc.Cursor(epoch, gi), backend="numpy")
    expected = oracle.Oracle(raw).next_batch("train", world_size, world_size - 1, stage, epoch, gi)
    assert (batch.cursor.epoch, batch.cursor.global_index) == expected.cursor
    produced = min(g, limit - gi)
    assert batch.metadata["produced_global_count"] == produced


def test_epochs_roll_over_into_a_new_permutation():
    raw = raw_manifest(1000, 100, 40, seed=8)
    manifest = uc.Manifest.from_dict(raw)
    first, cursors0 = run_epoch(manifest, 4, "train", epoch=0)
    second, _ = run_epoch(manifest, 4, "train", epoch=cursors0[-1].epoch)
    a = [i for s in first for r in s for i in r]
    b = [i for s in second for r in s for i in r]
    assert sorted(a) == sorted(b) == list(range(1000))
    assert a != b
    assert b == oracle.Oracle(raw).epoch("train", 1).window(0, 1000)


@settings(max_examples=40)
@given(stop_after=st.integers(0, 30), world_size=st.sampled_from([1, 3, 8]),
       stage=st.sampled_from(["train", "eval"]), seed=st.integers(0, 2**64 - 1))
def test_mid_epoch_restore_gives_the_identical_continuation(stop_after, world_size, stage, seed):
    """Run a few steps, checkpoint the cursor as CBOR bytes, restore it in a
    fresh manifest object and continue: identical to never stopping, across the
    epoch boundary."""
    raw = raw_manifest(700, 64, 48, seed=seed)

    def step(manifest, cursor):
        out = [indices_list(uc.next_batch(manifest, "train", world_size, r, stage, cursor, backend="numpy"))
               for r in range(world_size)]
        return out, uc.next_batch(manifest, "train", world_size, 0, stage, cursor, backend="numpy").cursor

    manifest = uc.Manifest.from_dict(raw)
    cursor = uc.Cursor(0, 0)
    straight = []
    for _ in range(40):
        out, cursor = step(manifest, cursor)
        straight.append(out)

    cursor = uc.Cursor(0, 0)
    resumed = []
    for _ in range(stop_after):
        out, cursor = step(manifest, cursor)
        resumed.append(out)
    saved = cursor.to_cbor()
    restored_manifest = uc.Manifest.from_dict(raw)  # as a new process would
    cursor = uc.Cursor.from_cbor(saved)
    for _ in range(40 - stop_after):
        out, cursor = step(restored_manifest, cursor)
        resumed.append(out)
    assert resumed == straight


def test_epoch_counter_overflow_is_refused():
    raw = raw_manifest(20, 4, 10)
    # Mid-epoch in the last representable epoch is fine ...
    batch = uc.next_batch(raw, "train", 1, 0, "eval", uc.Cursor(2**64 - 1, 0), backend="numpy")
    assert batch.cursor == uc.Cursor(2**64 - 1, 10)
    assert indices_list(batch) == list(range(10))
    # ... but the call that ends it would need epoch 2^64.
    for stage in ("train", "eval"):
        with pytest.raises(uc.UmlosError) as info:
            uc.next_batch(raw, "train", 1, 0, stage, uc.Cursor(2**64 - 1, 10), backend="numpy")
        assert info.value.code == errors.UINT64_OVERFLOW
        with pytest.raises(oracle.OracleError) as oinfo:
            oracle.Oracle(raw).next_batch("train", 1, 0, stage, 2**64 - 1, 10)
        assert oinfo.value.codes == {"UINT64_OVERFLOW"}


def test_next_batch_is_pure():
    """Same inputs, same outputs; the input cursor is not changed."""
    manifest = uc.Manifest.from_dict(raw_manifest(300, 32, 24, seed=4))
    cursor = uc.Cursor(5, 48)
    first = uc.next_batch(manifest, "train", 2, 1, "train", cursor, backend="numpy")
    second = uc.next_batch(manifest, "train", 2, 1, "train", cursor, backend="numpy")
    assert cursor == uc.Cursor(5, 48)
    assert indices_list(first) == indices_list(second)
    assert first.cursor == second.cursor == uc.Cursor(5, 72)
    assert first.metadata == second.metadata
