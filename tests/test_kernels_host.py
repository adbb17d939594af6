"""The real ``__global__`` bodies of kernels/*.cu, run on the CPU.

tests/kernel_harness/harness.cpp includes the kernel files after a shim that
defines ``__global__`` and the grid variables (Random123's KAT_KERNEL trick);
it is compiled here with the host C++ compiler and driven through ctypes. Every
launcher runs over several emulated grid shapes, including grids that do not
divide the work and grids with more threads than items, and must reproduce the
NumPy reference bit for bit: the kernels' Philox, the position map (contiguous
and strided windows) near 2^64, sequential positions. The header functions no
kernel runs are checked directly against the reference: R5 draws and R6 tables
(built on the host), the divider, the exact mulmod (including the bit-by-bit
128-bit path that device code takes) and the native backend's incremental run.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np
import oracle
import pytest
from native_build import load_harness, pointer

from umlos_cuda import reference
from umlos_cuda.epoch import build_plan_reference, epoch_seed
from umlos_cuda.philox import philox4x32_10
from umlos_cuda.reference import divider_params

U64 = (1 << 64) - 1

#: (grid blocks, threads per block): one thread; grids that do not divide the
#: work; more threads than items; a realistic block of 256.
GRIDS = [(1, 1), (1, 7), (3, 5), (13, 32), (2, 256)]

KAT = oracle.PHILOX_KATS  # R1, from the independent oracle


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    """The harness shared library, compiled from the installed kernel files."""
    u32, u64, ptr = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p
    signatures = {
        "harness_block_permute_j": [u64, u32, u32, u32, u32, ptr],
        "harness_block_affine_params": [ptr, u64, u64, u64, u32, u32, u32, u32, ptr, ptr, ptr, ptr],
        "harness_map_positions": [u32, u32, ctypes.c_int, ptr, ptr, ptr, ptr, u64, u64, u32, u64, u64, u64, ptr],
        "harness_sequential_u64": [u32, u32, u64, u64, u64, ptr],
        "harness_philox4x32_10_batch": [u32, u32, ptr, u64, ptr],
        "harness_divider": [u64, ptr, ptr],
        "harness_divide": [u64, ptr, u64, ptr],
        "harness_mulmod_add": [ptr, ptr, ptr, ptr, u64, ptr],
        "harness_mulmod_add_u128": [ptr, ptr, ptr, ptr, u64, ptr],
        "harness_mulmod_add_divider": [u64, ptr, ptr, ptr, u64, ptr],
        "harness_gcd": [ptr, ptr, u64, ptr],
        "harness_map_run": [u64, u64, u64, u64, u64, u64, u64, ptr],
    }
    return load_harness(tmp_path_factory.mktemp("kernel_harness"), signatures)


def _u64(values) -> np.ndarray:
    return np.ascontiguousarray(np.array([int(v) for v in values], dtype=np.uint64))


def _plan(n: int, block_size: int, epoch: int = 0):
    return build_plan_reference(epoch_seed(b"\x11" * 32, b"\x22" * 32, "train", epoch), n, block_size)


def _sentinel(count: int, dtype=np.uint64) -> np.ndarray:
    """An output buffer of recognisable garbage, so an unwritten element shows."""
    out = np.empty(count, dtype=dtype)
    out.fill(np.iinfo(dtype).max - 3)
    return out


# ---------------------------------------------------------------- Philox


@pytest.mark.parametrize("grid,block", GRIDS)
def test_philox_known_answers_through_the_kernel(harness, grid, block):
    rows = np.array([ctr + key for ctr, key, _ in KAT] * 3, dtype=np.uint32)
    out = np.zeros((len(rows), 4), dtype=np.uint32)
    harness.harness_philox4x32_10_batch(grid, block, pointer(rows), len(rows), pointer(out))
    for row, (_, _, expected) in zip(out, KAT * 3):
        assert tuple(int(w) for w in row) == expected


def test_philox_kernel_matches_numpy_on_random_words(harness):
    rng = np.random.default_rng(5)
    rows = rng.integers(0, 1 << 32, size=(4097, 6), dtype=np.uint64).astype(np.uint32)
    out = np.zeros((len(rows), 4), dtype=np.uint32)
    harness.harness_philox4x32_10_batch(3, 5, pointer(rows), len(rows), pointer(out))
    for lane in range(0, len(rows), 257):
        c0, c1, c2, c3, k0, k1 = (int(v) for v in rows[lane])
        expected = [int(x) for x in philox4x32_10(c0, c1, c2, c3, k0, k1)]
        assert [int(w) for w in out[lane]] == expected


# ---------------------------------------------------------------- R5 draws and R6 tables (host-built plan)


@pytest.mark.parametrize("num_full_blocks", [0, 1, 2, 3, 255, 4097])
def test_block_permute_j_header(harness, num_full_blocks):
    plan = _plan(10**6, 1000)
    j = _sentinel(num_full_blocks)
    harness.harness_block_permute_j(num_full_blocks, plan.key[0], plan.key[1], plan.w2, plan.w3, pointer(j))
    expected = reference.block_permute_j(num_full_blocks, plan.key, plan.w2, plan.w3)
    np.testing.assert_array_equal(j, expected)
    assert np.all(j <= np.arange(num_full_blocks, dtype=np.uint64))


PARAM_CASES = [
    # (N, block_size): a tail of one sample, block 1, block > N, 2^k +- 1,
    # blocks above 2^32 (power of two and not), N near 2^64.
    (10**6 + 1, 1000),
    (1000, 1),
    (12_345, 10**9),
    (2**20 + 1, 2**10 - 1),
    (2**20 - 1, 2**10 + 1),
    (5 * 2**33 + 7, 2**33),
    (5 * 2**33 + 7, 2**33 + 3),
    (U64, 2**61),
    (U64, 3 * 2**62),
    (U64, U64),
]


@pytest.mark.parametrize("n,block_size", PARAM_CASES)
def test_block_affine_params_header(harness, n, block_size):
    plan = _plan(n, block_size, epoch=7)
    ids = plan.block_order if n % block_size == 0 else np.append(plan.block_order, np.uint64(n // block_size))
    ids = np.ascontiguousarray(ids, dtype=np.uint64)
    tables = [_sentinel(len(ids)) for _ in range(4)]
    harness.harness_block_affine_params(
        pointer(ids), len(ids), n, block_size, plan.key[0], plan.key[1], plan.w2, plan.w3,
        *(pointer(t) for t in tables),
    )  # fmt: skip
    for name, got in zip(("base", "m", "a", "c"), tables):
        np.testing.assert_array_equal(got, getattr(plan, name), err_msg=name)
    m = [int(v) for v in plan.m]
    a = [int(v) for v in plan.a]
    assert all(math.gcd(ai, mi) == 1 for ai, mi in zip(a, m) if mi > 1)


# ---------------------------------------------------------------- the position map

MAP_CASES = [
    # (N, block_size, windows as (start, count))
    (10**6, 1 << 20, [(0, 10**6), (999_999, 1), (5, 0)]),
    (10**6 + 1, 1000, [(0, 10**6 + 1), (10**6, 1), (999_000, 1001)]),
    (2**16 + 1, 256, [(0, 2**16 + 1)]),
    (1000, 7, [(0, 1000), (994, 6)]),
    (1000, 1, [(0, 1000)]),
    (12_345, 10**9, [(0, 12_345)]),
    (5 * 2**33 + 7, 2**33 + 3, [(2**33 - 100, 300), (5 * 2**33 + 7 - 50, 50)]),
    (U64, 2**61, [(0, 64), (2**61 - 10, 20), (U64 - 200, 200)]),
    (U64, 3 * 2**62, [(3 * 2**62 - 7, 14), (U64 - 1, 1), (U64 - 99, 99)]),
    (U64, U64, [(U64 - 1000, 1000), (0, 10)]),
]


@pytest.mark.parametrize("n,block_size,windows", MAP_CASES)
def test_map_positions_kernel_u64(harness, n, block_size, windows):
    plan = _plan(n, block_size, epoch=1)
    magic, info = divider_params(block_size)
    for grid, block in GRIDS:
        for start, count in windows:
            out = _sentinel(count)
            harness.harness_map_positions(
                grid, block, 0, pointer(plan.base), pointer(plan.m), pointer(plan.a), pointer(plan.c),
                block_size, int(magic), int(info), start, count, 1, pointer(out),
            )  # fmt: skip
            expected = reference.map_positions(plan, start, count, np.empty(count, dtype=np.uint64))
            np.testing.assert_array_equal(out, expected, err_msg=f"grid {grid}x{block} window {start}+{count}")


#: (N, block_size, (start, count, stride)): strides below, at and above the block
#: size, a stride that lands every position in a new block, a window that ends
#: at the last position, and strides near 2^64.
STRIDED_CASES = [
    (10**6 + 1, 1000, [(3, 1000, 7), (0, 1001, 1000), (999, 998, 1001), (5, 3, 333_332), (0, 1, 10**9)]),
    (1000, 7, [(2, 250, 4), (6, 142, 7), (0, 1000, 1)]),
    (U64, 2**61, [(0, 8, 2**61 - 1), (U64 - 301, 100, 3), (4, 3, (U64 - 5) // 2)]),
    (U64, 3 * 2**62, [(3 * 2**62 - 70, 20, 7), (0, 2, U64 - 1)]),
]


@pytest.mark.parametrize("n,block_size,windows", STRIDED_CASES)
def test_map_positions_kernel_strided(harness, n, block_size, windows):
    plan = _plan(n, block_size, epoch=6)
    magic, info = divider_params(block_size)
    for grid, block in ((1, 1), (3, 5), (2, 256)):
        for start, count, stride in windows:
            assert start + (count - 1) * stride < n
            out = _sentinel(count)
            harness.harness_map_positions(
                grid, block, 0, pointer(plan.base), pointer(plan.m), pointer(plan.a), pointer(plan.c),
                block_size, int(magic), int(info), start, count, stride, pointer(out),
            )  # fmt: skip
            expected = reference.map_positions(plan, start, count, np.empty(count, dtype=np.uint64), stride)
            one_by_one = [int(reference.map_positions(plan, start + i * stride, 1, np.empty(1, np.uint64))[0])
                          for i in range(0, count, max(1, count // 50))]  # fmt: skip
            assert [int(v) for v in expected[:: max(1, count // 50)]] == one_by_one
            np.testing.assert_array_equal(out, expected, err_msg=f"grid {grid}x{block} {start}+{count}x{stride}")


@pytest.mark.parametrize("dtype,code", [(np.int64, 1), (np.int32, 2)])
def test_map_positions_kernel_signed(harness, dtype, code):
    n, block_size = 2**31 - 1, 2**20 + 1  # every index fits in int32
    plan = _plan(n, block_size, epoch=2)
    magic, info = divider_params(block_size)
    for start, count in ((0, 5000), (n - 3000, 3000), (2**21, 1)):
        out = _sentinel(count, dtype)
        harness.harness_map_positions(
            3, 5, code, pointer(plan.base), pointer(plan.m), pointer(plan.a), pointer(plan.c), block_size, int(magic),
            int(info),
            start, count, 1, pointer(out),
        )  # fmt: skip
        expected = reference.map_positions(plan, start, count, np.empty(count, dtype=np.uint64))
        np.testing.assert_array_equal(out.astype(np.uint64), expected)


@pytest.mark.parametrize("grid,block", GRIDS)
def test_sequential_kernel_near_the_top(harness, grid, block):
    for start, count, stride in ((0, 0, 1), (0, 1, 1), (U64 - 1000, 1000, 1), (12345, 777, 1), (7, 500, 3),
                                 (U64 - 2 * 999, 1000, 2), (0, 2, U64)):  # fmt: skip
        out = _sentinel(count)
        harness.harness_sequential_u64(grid, block, start, count, stride, pointer(out))
        assert [int(v) for v in out] == [start + i * stride for i in range(count)]


def test_map_run_matches_the_reference(harness):
    for n, block_size in ((10**6 + 3, 1000), (U64, 3 * 2**62), (2**20, 2**20), (10**6, 1)):
        plan = _plan(n, block_size, epoch=4)
        b = len(plan.base) - 1
        m = int(plan.m[b])
        for l0, count, step in ((0, min(m, 3000), 1), (m - 1, 1, 1), (max(0, m - 2000), min(m, 2000), 1),
                                (1, min(3000, (m - 2) // 3 + 1), 3), (0, 2, m - 1), (m - 1, 1, U64)):  # fmt: skip
            if count < 1 or step < 1 or l0 + (count - 1) * step >= m:
                continue
            out = _sentinel(count)
            harness.harness_map_run(int(plan.base[b]), m, int(plan.a[b]), int(plan.c[b]), l0, step, count, pointer(out))
            start = b * block_size + l0
            expected = reference.map_positions(plan, start, count, np.empty(count, dtype=np.uint64), step)
            np.testing.assert_array_equal(out, expected, err_msg=f"block {b} l0 {l0} count {count} step {step}")


# ---------------------------------------------------------------- integer helpers

EDGE_DIVISORS = [1, 2, 3, 5, 7, 10, 641, 1000, 10**6, 2**20, 2**20 - 1, 2**20 + 1, 2**31 - 1, 2**32 - 1, 2**32,
                 2**32 + 1, 2**33 + 3, 2**62, 3 * 2**62, 2**63 - 1, 2**63, 2**63 + 1, U64 - 1, U64]  # fmt: skip


def _random_u64(rng, size) -> list[int]:
    hi = rng.integers(0, 1 << 32, size=size, dtype=np.uint64)
    lo = rng.integers(0, 1 << 32, size=size, dtype=np.uint64)
    return [int(v) for v in (hi << np.uint64(32)) | lo]


def test_divider_params_match_the_header(harness):
    rng = np.random.default_rng(11)
    divisors = EDGE_DIVISORS + _random_u64(rng, 200) + [int(v) for v in rng.integers(1, 1 << 20, size=200)]
    for d in divisors:
        magic, info = ctypes.c_uint64(), ctypes.c_uint32()
        harness.harness_divider(d, ctypes.byref(magic), ctypes.byref(info))
        assert (magic.value, info.value) == tuple(int(v) for v in divider_params(d)), d


def test_divider_divides_exactly(harness):
    rng = np.random.default_rng(12)
    xs = [0, 1, 2, U64, U64 - 1, 2**63, 2**63 - 1, 2**32, 2**32 - 1] + _random_u64(rng, 2000)
    xs += [int(v) for v in rng.integers(0, 1 << 40, size=500)]
    x = _u64(xs)
    for d in EDGE_DIVISORS + _random_u64(rng, 20) + [int(v) for v in rng.integers(1, 1 << 24, size=20)]:
        edges = [d - 1, d, d + 1, 2 * d - 1, 2 * d, (U64 // d) * d, (U64 // d) * d - 1]
        values = np.concatenate([x, _u64(v for v in edges if v <= U64)])
        q = _sentinel(len(values))
        harness.harness_divide(d, pointer(values), len(values), pointer(q))
        assert [int(v) for v in q] == [int(v) // d for v in values], d


@pytest.mark.parametrize("symbol", ["harness_mulmod_add", "harness_mulmod_add_u128"])
def test_mulmod_add_is_exact(harness, symbol):
    rng = np.random.default_rng(13)
    moduli = [2, 3, 7, 2**20, 2**20 + 1, 2**32, 2**32 + 1, 2**33, 3 * 2**62, 2**63, 2**63 + 1, U64]
    moduli += _random_u64(rng, 30) + [int(v) for v in rng.integers(2, 1 << 32, size=10)]
    rows = []
    for m in moduli:
        rows.append((m - 1, m - 1, m - 1, m))
        rows.append((0, 0, 0, m))
        for _ in range(20):
            rows.append(tuple(int(v) % m for v in _random_u64(rng, 3)) + (m,))
    a, x, c, m = (_u64(column) for column in zip(*rows))
    out = _sentinel(len(rows))
    getattr(harness, symbol)(pointer(a), pointer(x), pointer(c), pointer(m), len(rows), pointer(out))
    assert [int(v) for v in out] == [(ai * xi + ci) % mi for ai, xi, ci, mi in rows]
    np.testing.assert_array_equal(out, reference.mulmod_add(a, x, c, m, int(m.max())))


def test_mulmod_add_divider_is_exact(harness):
    rng = np.random.default_rng(14)
    for d in [1, 2, 3, 1000, 2**20, 2**20 - 1, 2**32 - 1, 2**32, 2**32 + 1, 2**40, 3 * 2**62, U64]:
        rows = [(d - 1, d - 1, d - 1), (0, 0, 0)] + [tuple(int(v) % d for v in _random_u64(rng, 3)) for _ in range(300)]
        a, x, c = (_u64(column) for column in zip(*rows))
        out = _sentinel(len(rows))
        harness.harness_mulmod_add_divider(d, pointer(a), pointer(x), pointer(c), len(rows), pointer(out))
        assert [int(v) for v in out] == [(ai * xi + ci) % d for ai, xi, ci in rows], d


def test_gcd_matches_math_gcd(harness):
    rng = np.random.default_rng(15)
    pairs = [(0, 0), (0, 7), (7, 0), (1, U64), (U64, U64), (2**63, 2**62), (12, 18), (2**20, 3 * 2**19)]
    pairs += list(zip(_random_u64(rng, 500), _random_u64(rng, 500)))
    small = rng.integers(1, 1 << 20, size=(500, 2))
    pairs += [(int(p), int(q)) for p, q in small]
    a, b = _u64([p for p, _ in pairs]), _u64([q for _, q in pairs])
    out = _sentinel(len(pairs))
    harness.harness_gcd(pointer(a), pointer(b), len(pairs), pointer(out))
    assert [int(v) for v in out] == [math.gcd(p, q) for p, q in pairs]
