"""Large N: exact indices at sampled positions up to the uint64 boundary
(docs/spec/nextbatch-v2.md §3.5, R6's no-wrap rule, the 128-bit mulmod path), and
memory that does not grow with N (N = 10^9 and more, no out-of-memory)."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

import oracle
import umlos_cuda as uc
from nbcases import indices_list, raw_manifest
from umlos_cuda import nextbatch

U64_MAX = 2**64 - 1


@st.composite
def large_shapes(draw):
    """(N, block_size) with N from 10^10 to 2^64 - 1 and at most ~2000 full blocks."""
    n = draw(st.one_of(st.integers(10**10, 10**12), st.integers(10**12, U64_MAX),
                       st.sampled_from([U64_MAX, U64_MAX - 1, 2**63, 2**63 + 1, 2**64 - 2**32])))
    k = draw(st.integers(1, 2000))
    block_size = draw(st.one_of(
        st.just(-(-n // k)),                         # k blocks, short tail
        st.integers(max(1, n // k), n // k + 1000),  # around N/k
        st.integers(n, U64_MAX),                     # one (tail) block larger than N
        st.sampled_from([2**32, 2**32 + 1]).filter(lambda b: n // b <= 4_300_000_000 // 2**21),
    ))
    return n, max(1, block_size)


@settings(max_examples=80)
@given(shape=large_shapes(), seed=st.integers(0, U64_MAX), epoch=st.integers(0, U64_MAX), data=st.data())
def test_sampled_positions_match_oracle(backend, shape, seed, epoch, data):
    n, block_size = shape
    assume(n // block_size <= 5000)
    raw = raw_manifest(n, block_size, seed=seed)
    model = oracle.Oracle(raw).epoch("train", epoch)
    bs = block_size
    starts = data.draw(st.lists(st.one_of(
        st.integers(0, n - 1),
        st.sampled_from([0, n - 1, max(0, n - 8), min(n - 1, bs - 1), min(n - 1, bs), (n // bs) * bs % n]),
    ), min_size=1, max_size=6), label="starts")
    manifest = uc.Manifest.from_dict(raw)
    for start in starts:
        count = min(8, n - start)
        got = indices_list(uc.epoch_indices(manifest, "train", epoch=epoch, start=start, count=count, backend=backend))
        assert got == model.window(start, count)
        assert all(0 <= i < n for i in got)


@pytest.mark.parametrize("block_size", [2**63, 2**62 + 1, 2**61 - 1, 3 * 2**60, 2**50 + 3, U64_MAX])
def test_end_of_a_uint64_epoch(backend, block_size):
    """N = 2^64 - 1: the last positions of the epoch, the last block's end, and
    block sizes above 2^32 (the 128-bit product path)."""
    n = U64_MAX
    if n // block_size > 20_000_000:
        pytest.skip("too many blocks for a quick test")
    raw = raw_manifest(n, block_size, seed=12345)
    manifest = uc.Manifest.from_dict(raw)
    model = oracle.Oracle(raw).epoch("train", 0) if n // block_size <= 20_000 else None
    windows = [(n - 64, 64), (0, 16), (min(n, block_size) - 16, 16)]
    for start, count in windows:
        got = indices_list(uc.epoch_indices(manifest, "train", start=start, count=count, backend=backend))
        if model is not None:
            assert got == model.window(start, count)
        assert len(set(got)) == count and all(0 <= i < n for i in got)


def test_eval_and_train_batches_at_the_end_of_a_uint64_epoch(backend):
    n, g, world_size = U64_MAX, 96, 8  # N mod 96 = 15: the last batch has 15 positions
    raw = raw_manifest(n, 2**61 - 1, g, seed=99)
    model = oracle.Oracle(raw)
    manifest = uc.Manifest.from_dict(raw)
    last = n - n % g
    for stage in ("train", "eval"):
        for gi in (last - g, last):
            for rank in range(world_size):
                batch = uc.next_batch(manifest, "train", world_size, rank, stage, uc.Cursor(3, gi), backend=backend)
                expected = model.next_batch("train", world_size, rank, stage, 3, gi)
                assert indices_list(batch) == expected.indices
                assert (batch.cursor.epoch, batch.cursor.global_index) == expected.cursor
    batch = uc.next_batch(manifest, "train", 1, 0, "eval", uc.Cursor(3, last), backend=backend)
    assert indices_list(batch) == list(range(last, n))
    assert batch.cursor == uc.Cursor(4, 0)


@pytest.mark.parametrize("block_size", [2**32 - 1, 2**32, 2**32 + 1, 2**33 + 7])
def test_mulmod_boundary_block_sizes(backend, block_size):
    """Just below, at and above the 64-bit product limit: the last positions of
    each block have the largest products."""
    n = 3 * block_size + 5
    raw = raw_manifest(n, block_size, seed=2024)
    model = oracle.Oracle(raw).epoch("train", 0)
    manifest = uc.Manifest.from_dict(raw)
    for b in range(4):
        start = max(0, min(n, (b + 1) * block_size) - 40)
        count = min(n, (b + 1) * block_size) - start
        got = indices_list(uc.epoch_indices(manifest, "train", start=start, count=count, backend=backend))
        assert got == model.window(start, count)


def _peak_bytes(function) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        function()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_tracemalloc_sees_numpy_allocations():
    """The memory test below means something only if NumPy buffers are traced."""
    peak = _peak_bytes(lambda: np.ones(16 << 20, dtype=np.uint64).sum())
    assert peak >= 128 << 20


MEMORY_LIMIT = 64 << 20


def test_batch_at_1e11_allocates_nothing_proportional_to_n():
    """N = 10^11, blocks of 2^20: 95,367 blocks. Building the epoch plan and
    emitting a batch stays far below what one byte per sample (93 GiB) would take."""
    raw = raw_manifest(10**11, 1 << 20, 4096, seed=7)
    manifest = uc.Manifest.from_dict(raw)
    nextbatch._plans.clear()
    holder = {}

    def call():
        holder["batch"] = uc.next_batch(manifest, "train", 8, 5, "train", uc.Cursor(2, 10**11 // 2), backend="numpy")

    peak = _peak_bytes(call)
    assert peak < MEMORY_LIMIT, f"peak {peak / 2**20:.1f} MiB"
    got = indices_list(holder["batch"])
    assert len(got) == 512 and len(set(got)) == 512 and all(0 <= i < 10**11 for i in got)

    window = {}
    peak = _peak_bytes(lambda: window.setdefault(
        "w", uc.epoch_indices(manifest, "train", epoch=2, start=10**11 - (1 << 20), count=1 << 20, backend="numpy")))
    assert peak < MEMORY_LIMIT, f"peak {peak / 2**20:.1f} MiB"
    assert len(np.unique(window["w"])) == 1 << 20


@pytest.mark.slow
def test_positions_at_1e11_match_oracle():
    n = 10**11
    raw = raw_manifest(n, 1 << 20, 4096, seed=7)
    model = oracle.Oracle(raw).epoch("train", 2)
    manifest = uc.Manifest.from_dict(raw)
    for start in (0, 1 << 20, 12_345_678_901, n // 2, n - (n % (1 << 20)) - 3, n - 50):
        count = min(50, n - start)
        got = indices_list(uc.epoch_indices(manifest, "train", epoch=2, start=start, count=count, backend="numpy"))
        assert got == model.window(start, count)
    # next_batch, last (partial) global batch, every rank of 8
    last = n - n % 4096
    for rank in range(8):
        batch = uc.next_batch(manifest, "train", 8, rank, "train", uc.Cursor(2, last), backend="numpy")
        expected = oracle.Oracle(raw).next_batch("train", 8, rank, "train", 2, last)
        assert indices_list(batch) == expected.indices


def test_1e9_is_identical_across_runs():
    """N = 10^9, block size 2^20, identical across runs (fresh plans)."""
    raw = raw_manifest(10**9, 1 << 20, 4096, seed=3)
    windows = []
    for _ in range(2):
        nextbatch._plans.clear()
        manifest = uc.Manifest.from_dict(raw)
        windows.append(np.concatenate([
            uc.epoch_indices(manifest, "train", start=s, count=1 << 16, backend="numpy")
            for s in (0, 5 * 10**8, 10**9 - (1 << 16))
        ]))
    np.testing.assert_array_equal(windows[0], windows[1])
