"""The NumPy reference evaluates a window two ways (per-block runs, or table
gathers per position); both must give identical bits for every window shape."""

import numpy as np
import pytest

from umlos_cuda import reference
from umlos_cuda.epoch import build_plan_reference, epoch_seed

CASES = [
    # (N, block_size, start, count)
    (10**6, 1 << 20, 0, 10**6),
    (10**6, 1000, 12_345, 500_000),
    (2**16 + 1, 256, 0, 2**16 + 1),
    (2**20 - 1, 4096, 4095, 2**20 - 4096),
    (5 * 2**33 + 7, 2**33, 2**33 - 100, 300),  # blocks > 2^32: the 128-bit mulmod path
    (1000, 7, 3, 997),
]


@pytest.mark.parametrize("n,block_size,start,count", CASES)
def test_block_runs_and_gathers_agree(n, block_size, start, count):
    plan = build_plan_reference(epoch_seed(b"\x01" * 32, b"\x02" * 32, "train", 3), n, block_size)
    runs = reference._map_by_block_runs(plan, start, count, np.empty(count, dtype=np.uint64))
    gathers = reference._map_by_gather(plan, start, count, np.empty(count, dtype=np.uint64))
    np.testing.assert_array_equal(runs, gathers)
    assert np.all(runs < np.uint64(n))
