"""Every backend gives the NumPy reference's bits, through the public API.

One parametrised test body per entry point (``uc.epoch_indices``,
``uc.next_batch``), run for each accelerated backend (``native``, ``cupy``)
against ``numpy``; a backend this machine lacks is skipped with its reason.

Sizes. A configuration is one (N, sampler_block_size, seed, epoch). Where the
epoch has at least 10^7 positions, at least 10^7 are compared, in windows at
the start, across a block boundary in the middle, and at the very end of the
epoch; smaller epochs are compared whole, over several epochs and seeds. NumPy
maps about 3*10^7 positions a second here, so each 10^7 costs it ~0.3 s.
The exceptions are blocks above 2^32, where the reference reduces the 128-bit
product bit by bit (~300 ns a position): 2*10^6 positions there, still far
more than the few thousand blocks such epochs have boundaries for. The whole
file runs in about a minute on two cores with native (the reference dominates).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import umlos_cuda as uc
from umlos_cuda.backends import get_backend, to_numpy
from umlos_cuda.errors import UmlosError

from nbcases import raw_manifest

KEY = "train"
U64 = (1 << 64) - 1
BACKENDS = ("native", "cupy")
#: Positions compared per configuration whose epoch is at least this long.
BUDGET = 10**7
#: Blocks above 2^32 (NumPy's bit-by-bit 128-bit reduction): see the module docstring.
BUDGET_WIDE = 2 * 10**6

# (id, N, sampler_block_size, manifest seed, epochs)
CONFIGS = [
    ("n1", 1, None, 0, (0, 1, U64)),
    ("n2-b1", 2, 1, 3, (0, 1, 2)),
    ("n3-b2", 3, 2, U64, (0, 5)),
    ("n7-b7", 7, 7, 1, (0, 1)),
    ("n7-b8", 7, 8, 2, (0, 1)),
    ("n1023-b1", 2**10 - 1, 1, 0, (0, 9)),
    ("n1024-b1024", 2**10, 2**10, 0, (0, 1)),
    ("n1025-b1024", 2**10 + 1, 2**10, 5, (0, 1)),  # a tail block of one sample
    ("n1025-b3", 2**10 + 1, 3, 6, (0, 1)),
    ("n65537-b256", 2**16 + 1, 256, 7, (0, 3)),
    ("n100003-b1", 100_003, 1, 8, (0,)),
    ("n100003-b1000", 100_003, 1000, 9, (0, 1)),
    ("n100003-b2^40", 100_003, 2**40, 10, (0, 1)),  # block > N: one short block
    ("n100003-b2^32+1", 100_003, 2**32 + 1, 11, (0,)),
    ("n2^24+1-b2^20", 2**24 + 1, 2**20, 0, (0, 1)),
    ("n2^24-1-b1000", 2**24 - 1, 1000, 12, (3,)),
    ("n2^24-b4095", 2**24, 4095, 13, (0,)),
    ("n1e9+7-default", 10**9 + 7, None, 0, (0, 1)),
    ("n1e9+7-b1e6", 10**9 + 7, 10**6, 14, (2,)),
    ("n1e11-default", 10**11, None, 0, (0,)),
    ("n1e11-b1e6+1", 10**11, 10**6 + 1, U64, (U64,)),
    ("n5*2^33+7-b2^33", 5 * 2**33 + 7, 2**33, 15, (0,)),
    ("n5*2^33+7-b2^33+3", 5 * 2**33 + 7, 2**33 + 3, 16, (1,)),
    ("nU64-b2^61", U64, 2**61, 17, (0,)),
    ("nU64-b3*2^62", U64, 3 * 2**62, 18, (0,)),
    ("nU64-bU64", U64, U64, 19, (0,)),
]


def _manifest(n: int, block_size: int | None, seed: int, **kw) -> uc.Manifest:
    return uc.Manifest.from_dict(raw_manifest(n, block_size, seed=seed, **kw))


def budget_for(n: int, block_size: int) -> int:
    return BUDGET_WIDE if min(block_size, n) > 2**32 else BUDGET


def windows(n: int, block_size: int) -> list[tuple[int, int]]:
    """(start, count) windows covering the budget: the start, a middle block boundary, the end."""
    budget = budget_for(n, block_size)
    if n <= budget:
        return [(0, n)]
    third = budget // 3
    middle_block = (n // block_size) // 2
    middle = min(max(middle_block * block_size - third // 2, third), n - 2 * third)
    return [(0, third), (middle, third), (n - (budget - 2 * third), budget - 2 * third)]


@functools.lru_cache(maxsize=1)
def reference_run(config_id: str) -> list[tuple[int, int, int, np.ndarray]]:
    """The NumPy indices of every (epoch, window) of a configuration (kept for the next backend)."""
    _, n, block_size, seed, epochs = next(c for c in CONFIGS if c[0] == config_id)
    manifest = _manifest(n, block_size, seed)
    runs = []
    for epoch in epochs:
        for start, count in windows(n, manifest.sampler_block_size):
            runs.append((epoch, start, count, uc.epoch_indices(manifest, KEY, epoch, start, count, backend="numpy")))
    return runs


def test_every_backend_implements_the_one_protocol():
    """build_plan, map_train and sequential have the Backend protocol's signature on
    every backend class (importable without the backend's hardware), and each has name and xp."""
    import inspect

    from umlos_cuda.backends import Backend, cupy_backend, native, numpy_backend

    classes = (numpy_backend.NumpyBackend, native.NativeBackend, cupy_backend.CupyBackend)
    for method in ("build_plan", "map_train", "sequential"):
        want = inspect.signature(getattr(Backend, method))
        for cls in classes:
            got = inspect.signature(getattr(cls, method))
            assert [(p.name, p.kind) for p in got.parameters.values()] == [
                (p.name, p.kind) for p in want.parameters.values()
            ], (cls.__name__, method)
            assert [p.default for p in got.parameters.values()] == [p.default for p in want.parameters.values()]
    for cls in classes[:2]:
        assert cls.xp is np and isinstance(cls.name, str)
    assert "xp" in Backend.__annotations__ and "name" in Backend.__annotations__


def _usable(backend: str) -> None:
    try:
        get_backend(backend)
    except UmlosError as exc:
        pytest.skip(f"backend {backend!r} unavailable: {exc.message}")


@pytest.mark.parametrize(
    "config_id,backend", [(c[0], b) for c in CONFIGS for b in BACKENDS],
    ids=[f"{c[0]}-{b}" for c in CONFIGS for b in BACKENDS]
)
def test_epoch_indices_bit_identical(config_id, backend):
    _usable(backend)
    _, n, block_size, seed, epochs = next(c for c in CONFIGS if c[0] == config_id)
    manifest = _manifest(n, block_size, seed)
    compared = 0
    for epoch, start, count, expected in reference_run(config_id):
        got = to_numpy(uc.epoch_indices(manifest, KEY, epoch, start, count, backend=backend))
        assert got.dtype == np.uint64
        if not np.array_equal(got, expected):
            first = int(np.flatnonzero(got != expected)[0])
            pytest.fail(
                f"{backend} differs from numpy at epoch {epoch}, position {start + first}: "
                f"{int(got[first])} != {int(expected[first])}"
            )
        compared += count
    assert compared >= len(epochs) * min(n, budget_for(n, manifest.sampler_block_size))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_epoch_indices_signed_outputs(backend, dtype):
    _usable(backend)
    manifest = _manifest(2**31 - 1, 10**6 + 1, 21)
    start, count = 2**31 - 1 - 3 * 10**6, 3 * 10**6
    expected = uc.epoch_indices(manifest, KEY, 4, start, count, backend="numpy")
    got = to_numpy(uc.epoch_indices(manifest, KEY, 4, start, count, backend=backend, dtype=dtype))
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.astype(np.uint64), expected)


# (id, N, sampler_block_size, manifest seed, epoch, start, count, stride): rank-strided reads
# (stride = world size), a stride above the block size, strides crossing blocks above 2^32.
STRIDED_CONFIGS = [
    ("n1e11-w8", 10**11, None, 0, 1, 5 * 10**10 + 3, 10**6, 8),
    ("n1e11-w1000", 10**11, None, 4, 0, 999, 10**6, 1000),
    ("n1e9+7-stride-block+1", 10**9 + 7, 10**6, 14, 2, 5, 999, 10**6 + 1),
    ("n2^24+1-w3", 2**24 + 1, 2**20, 0, 1, 2, (2**24 - 2) // 3 + 1, 3),
    ("n5*2^33+7-b2^33+3-w7", 5 * 2**33 + 7, 2**33 + 3, 16, 1, 2**33 - 700, 200_000, 7),
    ("nU64-b3*2^62-w5", U64, 3 * 2**62, 18, 0, U64 - 1 - 5 * 199_999, 200_000, 5),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("config", STRIDED_CONFIGS, ids=[c[0] for c in STRIDED_CONFIGS])
def test_strided_epoch_indices_bit_identical(backend, config):
    _usable(backend)
    _, n, block_size, seed, epoch, start, count, stride = config
    assert start + (count - 1) * stride < n
    manifest = _manifest(n, block_size, seed)
    want = uc.epoch_indices(manifest, KEY, epoch, start, count, stride=stride, backend="numpy")
    got = to_numpy(uc.epoch_indices(manifest, KEY, epoch, start, count, stride=stride, backend=backend))
    assert got.dtype == np.uint64
    np.testing.assert_array_equal(got, want)
    probe = range(0, count, max(1, count // 20))  # a few positions one at a time, contiguously
    assert [int(want[i]) for i in probe] == [
        int(uc.epoch_indices(manifest, KEY, epoch, start + i * stride, 1, backend="numpy")[0]) for i in probe
    ]


def test_native_writes_into_a_reused_buffer():
    _usable("native")
    manifest = _manifest(10**8 + 5, None, 22)
    out = np.empty(10**6, dtype=np.uint64)
    for epoch, start in ((0, 0), (1, 10**8 + 5 - 10**6), (1, 5 * 10**7)):
        result = uc.epoch_indices(manifest, KEY, epoch, start, 10**6, backend="native", out=out)
        assert result is out
        np.testing.assert_array_equal(out, uc.epoch_indices(manifest, KEY, epoch, start, 10**6, backend="numpy"))


# (id, N, block_size, global_batch_size, drop_last, world sizes, stage, first global_index)
NEXT_BATCH_CONFIGS = [
    ("train-w1-w8", 10**6 + 3, None, 2**15, False, (1, 8), "train", 0),
    ("train-drop-last", 10**6 + 3, 1000, 2**15, True, (4,), "train", 0),
    ("train-small-blocks", 50_001, 7, 96, False, (3, 12), "train", 0),
    ("eval", 10**6 + 3, None, 2**15, False, (8,), "eval", 0),
    ("train-1e11-tail", 10**11, None, 2**20, False, (8,), "train", 10**11 - 5 * 2**20 + 12345),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("config", NEXT_BATCH_CONFIGS, ids=[c[0] for c in NEXT_BATCH_CONFIGS])
def test_next_batch_bit_identical(backend, config):
    _usable(backend)
    _, n, block_size, g, drop_last, world_sizes, stage, first = config
    manifest = _manifest(n, block_size, 23, global_batch_size=g, drop_last=drop_last)
    compared = 0
    for world_size in world_sizes:
        cursor = uc.Cursor(1, first)
        while cursor.epoch == 1:
            after = None
            for rank in range(world_size):
                want = uc.next_batch(manifest, KEY, world_size, rank, stage, cursor, backend="numpy")
                got = uc.next_batch(manifest, KEY, world_size, rank, stage, cursor, backend=backend)
                got_indices = to_numpy(got.indices)
                assert got_indices.dtype == np.uint64
                np.testing.assert_array_equal(got_indices, want.indices)
                assert got.cursor == want.cursor
                assert got.metadata["backend"] == backend
                for name in ("sampling_mode", "sampler_config_hash", "data_replay_t", "epoch_seed_hash"):
                    assert got.metadata[name] == want.metadata[name]
                compared += len(got_indices)
                after = got.cursor
            cursor = after
    assert compared >= min(n - first, 1)
