"""R5-R6: every train epoch is a bijection on [0, N) (scatter
check), over a matrix of dataset and block sizes that includes the shapes
shufflers have shipped bugs at (N < block size, a one-sample tail block, block
size 1, N = 1, 2^k - 1, 2^k, 2^k + 1, non-power-of-two blocks)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import oracle
import umlos_cuda as uc
from nbcases import indices_list, raw_manifest
from umlos_cuda.backends import to_numpy

SIZES = [1, 2, 3, 7, 8, 9, 15, 16, 17, 255, 256, 257, 1000, 4095, 4096, 4097, 65535, 65536, 65537]
BLOCK_SIZES = [1, 2, 3, 7, 16, 100, 1000, 4096, 1 << 20]
#: Full-epoch comparisons with the oracle are pure Python; keep them to the sizes that are quick.
ORACLE_MAX_N = 4097


def scatter_check(indices: np.ndarray, n: int) -> None:
    """Every index in [0, N) exactly once."""
    assert indices.dtype == np.uint64
    assert indices.shape == (n,)
    assert int(indices.max()) < n
    seen = np.zeros(n, dtype=np.int64)
    np.add.at(seen, indices.astype(np.int64), 1)
    assert np.all(seen == 1), f"{int(np.sum(seen == 0))} indices missing, {int(np.sum(seen > 1))} repeated"


def block_locality_check(indices: np.ndarray, n: int, block_size: int, order: list[int]) -> None:
    """Virtual block b lands in original block order[b]; the tail block stays last."""
    full = n // block_size
    for b in range(full + (1 if n % block_size else 0)):
        window = indices[b * block_size : min(n, (b + 1) * block_size)]
        target = order[b] if b < full else full
        assert np.all(window // np.uint64(block_size) == np.uint64(target))


@pytest.mark.slow
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("n", SIZES)
def test_train_epoch_is_a_bijection(n, block_size):
    raw = raw_manifest(n, block_size, seed=n * 31 + block_size)
    manifest = uc.Manifest.from_dict(raw)
    indices = to_numpy(uc.epoch_indices(manifest, "train", epoch=1, backend="numpy"))
    scatter_check(indices, n)
    epoch = oracle.Oracle(raw).epoch("train", 1)
    if block_size < n and n // block_size <= 5000:
        block_locality_check(indices, n, block_size, epoch.order)
    if n <= ORACLE_MAX_N:
        assert indices.tolist() == epoch.window(0, n)
    else:  # sampled positions: each block's first, last and a middle position
        positions = sorted({p for b in range(0, n, block_size) for p in (b, min(n - 1, b + block_size // 2),
                                                                         min(n - 1, b + block_size - 1))})[:600]
        assert [int(indices[p]) for p in positions] == [epoch.index(p) for p in positions]


def test_the_shuffle_moves_samples():
    """A bijection could be the identity; with real randomness it is not, and
    blocks are reordered when there are several."""
    n, block_size = 4096, 256
    indices = to_numpy(uc.epoch_indices(raw_manifest(n, block_size, seed=3), "train", backend="numpy"))
    assert np.sum(indices == np.arange(n, dtype=np.uint64)) < n // 10
    first_blocks = (indices[::block_size] // np.uint64(block_size)).tolist()
    assert first_blocks != sorted(first_blocks)


def test_tail_block_of_one_sample_is_fixed_at_the_end():
    n, block_size = 4097, 4096
    indices = to_numpy(uc.epoch_indices(raw_manifest(n, block_size, seed=9), "train", backend="numpy"))
    assert int(indices[-1]) == 4096
    scatter_check(indices, n)


@settings(max_examples=120)
@given(n=st.integers(1, 20000), block_size=st.one_of(st.integers(1, 64), st.integers(1, 25000)),
       seed=st.integers(0, 2**64 - 1), epoch=st.integers(0, 2**64 - 1))
def test_random_shapes_are_bijections(n, block_size, seed, epoch):
    indices = to_numpy(uc.epoch_indices(raw_manifest(n, block_size, seed=seed), "train", epoch=epoch, backend="numpy"))
    scatter_check(indices, n)


@pytest.mark.parametrize("n,block_size", [(1, 1), (1, 1 << 20), (2, 1), (2, 2), (3, 2)])
def test_tiny_epochs(n, block_size):
    raw = raw_manifest(n, block_size)
    got = indices_list(uc.epoch_indices(raw, "train", backend="numpy"))
    assert sorted(got) == list(range(n))
    assert got == oracle.Oracle(raw).epoch("train", 0).window(0, n)
