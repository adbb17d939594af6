"""The sampling modes feistel and block_feistel (docs/spec/feistel.md) on every host backend.

* the header functions and the real ``__global__`` bodies of kernels/feistel.cu
  and kernels/block_feistel.cu, compiled for the host (tests/kernel_harness),
  against the NumPy reference over emulated grids, every output dtype;
* the native backend against NumPy over 10^7 positions per configuration,
  every SIMD path of the native lanes, strided windows, the cipher's edge widths;
* the golden file golden/sampling_modes.json on numpy and native;
* the bijection: whole epochs are permutations at N = 2^20 +- 1 (NumPy) and
  N = 2^24 (native), and the inverse map undoes the order at N = 2^k - 1,
  2^k, 2^k + 1 for every k up to 64, for every mode;
* the manifest key ``data.sampling_mode``, the modes' strings and hashes, and
  the refusals (unknown modes, modes the installed kernels lack).
"""

from __future__ import annotations

import ctypes
import types

import numpy as np
import pytest
from native_build import load_harness, pointer
from spec_examples_feistel import spec_feistel, spec_feistel_inverse

import umlos_cuda as uc
from umlos_cuda import errors
from umlos_cuda.commands import _golden_vectors as golden
from umlos_cuda.backends import get_backend
from umlos_cuda.backends.native import NativeBackend
from umlos_cuda.errors import UmlosError
from umlos_cuda.feistel import feistel_decrypt, feistel_encrypt, feistel_invert, feistel_key, feistel_permute
from umlos_cuda.modes import block_affine, block_feistel, feistel, get_mode, mode_names
from umlos_cuda.reference import DOMAIN_BLOCK_FEISTEL, DOMAIN_FEISTEL, divider_params, philox_key_words

MODES = ("block_affine", "feistel", "block_feistel")
FEISTEL_MODES = ("feistel", "block_feistel")
SEED16 = bytes(range(16))
U64 = (1 << 64) - 1
GRIDS = [(1, 1), (3, 5), (13, 32), (2, 256)]
DTYPES = {0: np.uint64, 1: np.int64, 2: np.int32}


def edge_sizes(k: int) -> list[int]:
    return [n for n in ((1 << k) - 1, 1 << k, (1 << k) + 1) if 1 <= n <= U64]


def block_size_for(n: int) -> int:
    """A block size giving a few hundred blocks and a tail (the plans stay small)."""
    return max(1, (n >> 9) + 3)


@pytest.fixture(scope="module")
def native():
    return get_backend("native")


@pytest.fixture(scope="module")
def numpy_backend():
    return get_backend("numpy")


# ---------------------------------------------------------------- the compiled headers and kernel bodies


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    u32, u64, ptr, i = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_int
    signatures = {
        "harness_feistel": [i, u64, ptr, ptr, u64, ptr],
        "harness_feistel_key": [u32, u32, u32, u32, u32, u64, ptr],
        "harness_feistel_map": [u32, u32, i, u64, u64, u64, u64, u64, u64, u64, u64, ptr],
        "harness_block_feistel_map": [u32, u32, i, ptr, ptr, ptr, ptr, ptr, ptr, u64, u64, u32, u64, u64, u64, ptr],
        "harness_block_feistel_params": [ptr, u64, u64, u64, u32, u32, u32, u32, ptr, ptr, ptr, ptr, ptr, ptr],
    }
    return load_harness(tmp_path_factory.mktemp("feistel_harness"), signatures)


def _random_values(rng, n: int, count: int) -> np.ndarray:
    return np.array([int(rng.integers(0, 1 << 62)) * 4 % n for _ in range(count)], dtype=np.uint64)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 30, (1 << 20) + 1, 10**11, (1 << 63) + 1, U64])
def test_header_functions_equal_the_reference(harness, n):
    rng = np.random.default_rng(n % 1000)
    words = np.array([int(v) for v in rng.integers(0, 1 << 63, 4, dtype=np.uint64)], dtype=np.uint64)
    keys = tuple(int(w) for w in words)
    x = _random_values(rng, n, 500)
    width = max(2, (n - 1).bit_length())
    full = (x * np.uint64(3) + np.uint64(1)) & np.uint64((1 << width) - 1)  # any value of the cipher's domain
    for op, values, want in (
        (0, full, feistel_encrypt(full, n, keys)),
        (1, full, feistel_decrypt(full, n, keys)),
        (2, x, feistel_permute(x, n, keys)),
        (3, x, feistel_invert(x, n, keys)),
    ):
        out = np.zeros_like(values)
        harness.harness_feistel(op, n, pointer(words), pointer(values), values.shape[0], pointer(out))
        assert np.array_equal(out, want), op
    assert [spec_feistel(int(v), n, keys) for v in x[:50]] == [int(v) for v in feistel_permute(x[:50], n, keys)]


@pytest.mark.parametrize("domain,first", [(DOMAIN_FEISTEL, 0), (DOMAIN_BLOCK_FEISTEL, 2 * 12345)])
def test_round_keys_come_from_the_domains_draws(harness, domain, first):
    key, w2, w3 = philox_key_words(SEED16)
    words = feistel_key(key, w2, w3, domain, first)
    out = np.zeros(8, dtype=np.uint32)
    harness.harness_feistel_key(key[0], key[1], w2, w3, domain, first, pointer(out))
    assert out.tolist() == [(w >> s) & 0xFFFFFFFF for w in words for s in (0, 32)]


@pytest.mark.parametrize("grid,block", GRIDS)
@pytest.mark.parametrize("dtype", [0, 1, 2])
def test_feistel_kernel_bodies_equal_the_reference(harness, numpy_backend, grid, block, dtype):
    n = {0: (1 << 64) - 59, 1: (1 << 63) - 25, 2: (1 << 31) - 5}[dtype]  # the largest epochs the dtype holds
    plan = numpy_backend.build_plan(SEED16, n, 1 << 20, "feistel")
    for start, count, stride in ((0, 1000, 1), (n - 777, 777, 1), (5, 400, (n - 6) // 400)):
        want = numpy_backend.map_train(plan, start, count, stride=stride, dtype=DTYPES[dtype])
        out = np.full(count, 0x5A5A5A5A, dtype=DTYPES[dtype])  # garbage an unwritten element shows
        harness.harness_feistel_map(grid, block, dtype, *(int(v) for v in plan.kernel_params()), start, count, stride,
                                    pointer(out))
        assert np.array_equal(out, want)


@pytest.mark.parametrize("grid,block", GRIDS)
@pytest.mark.parametrize("dtype", [0, 1, 2])
def test_block_feistel_kernel_bodies_and_tables_equal_the_reference(harness, numpy_backend, grid, block, dtype):
    n, block_size = 1_000_003, 4096
    plan = numpy_backend.build_plan(SEED16, n, block_size, "block_feistel")
    key, w2, w3 = philox_key_words(SEED16)
    ids = np.append(plan.block_order, np.uint64(n // block_size))
    tables = [np.zeros(ids.shape[0], dtype=np.uint64) for _ in range(6)]
    harness.harness_block_feistel_params(pointer(ids), ids.shape[0], n, block_size, key[0], key[1], w2, w3,
                                         *map(pointer, tables))
    assert all(np.array_equal(a, b) for a, b in zip(tables, plan.kernel_tables()))
    size, magic, info = (int(v) for v in plan.kernel_params())
    assert (magic, info) == tuple(int(v) for v in divider_params(block_size))
    for start, count, stride in ((0, 5000, 1), (n - 3000, 3000, 1), (7, 900, 1111)):
        want = numpy_backend.map_train(plan, start, count, stride=stride, dtype=DTYPES[dtype])
        out = np.full(count, 0x5A5A5A5A, dtype=DTYPES[dtype])  # garbage an unwritten element shows
        harness.harness_block_feistel_map(grid, block, dtype, *map(pointer, plan.kernel_tables()), size, magic, info,
                                          start, count, stride, pointer(out))  # fmt: skip
        assert np.array_equal(out, want)


# ---------------------------------------------------------------- native against numpy


PARITY = [
    ("feistel", 10**8, 1 << 20, 12_345, 1),
    ("feistel", (1 << 27) + 1, 1 << 20, 0, 1),
    ("feistel", U64, 1 << 20, U64 - 10**7, 1),
    ("block_feistel", 10**8, 1 << 20, 3, 1),
    ("block_feistel", 10**8 + 7, 1000, 50, 1),
]


@pytest.mark.parametrize("mode,n,block_size,start,stride", PARITY)
def test_native_equals_numpy_over_ten_million_positions(native, numpy_backend, mode, n, block_size, start, stride):
    count = 10**7
    want = numpy_backend.map_train(numpy_backend.build_plan(SEED16, n, block_size, mode), start, count, stride=stride)
    plan = native.build_plan(SEED16, n, block_size, mode)
    assert np.array_equal(native.map_train(plan, start, count, stride=stride), want)
    if n < 1 << 31:
        assert np.array_equal(native.map_train(plan, start, count, stride=stride, dtype=np.int32),
                              want.astype(np.int32))


@pytest.mark.parametrize("mode", FEISTEL_MODES)
@pytest.mark.parametrize("start,count,stride", [(0, 200_000, 3), (17, 5000, 4099), (1, 300, 10**5), (99, 7, 1)])
def test_native_equals_numpy_on_strided_windows(native, numpy_backend, mode, start, count, stride):
    n, block_size = 10**9 + 9, 4096
    want = numpy_backend.map_train(numpy_backend.build_plan(SEED16, n, block_size, mode), start, count, stride=stride)
    got = native.map_train(native.build_plan(SEED16, n, block_size, mode), start, count, stride=stride)
    assert np.array_equal(got, want)


def test_every_simd_path_gives_the_same_bits(native, numpy_backend):
    from umlos_cuda import _native

    default = _native.feistel_isa()
    paths = [name for name in ("avx512f", "avx2", "sse2", "scalar") if _accepts(_native, name)]
    assert "scalar" in paths and default in paths
    try:
        for n in (3, 1000, (1 << 20) + 1, 10**11, U64):
            plan = numpy_backend.build_plan(SEED16, n, 1 << 20, "feistel")
            count = min(n, 100_000)
            want = numpy_backend.map_train(plan, n - count, count)
            for name in paths:
                _native.feistel_isa(name)
                assert np.array_equal(native.map_train(plan, n - count, count), want), (name, n)
    finally:
        _native.feistel_isa(default)
    with pytest.raises(ValueError):
        _native.feistel_isa("neon")


def _accepts(module, name: str) -> bool:
    try:
        module.feistel_isa(name)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("k", [1, 2, 5, 13, 20, 31, 32, 33, 47, 63, 64])
def test_native_equals_numpy_at_the_cipher_edge_widths(native, numpy_backend, k):
    for n in edge_sizes(k):
        for mode in FEISTEL_MODES:
            block_size = block_size_for(n)
            count = min(n, 20_000)
            want = numpy_backend.map_train(numpy_backend.build_plan(SEED16, n, block_size, mode), n - count, count)
            got = native.map_train(native.build_plan(SEED16, n, block_size, mode), n - count, count)
            assert np.array_equal(got, want), (mode, n)


def test_native_refuses_a_window_outside_the_epoch(native):
    from umlos_cuda import _native

    out = np.empty(2, dtype=np.uint64)
    with pytest.raises(ValueError):
        _native.feistel_map(10, 1, 2, 3, 4, 9, 2, 1, out)
    with pytest.raises(UmlosError) as info:
        native.map_train(native.build_plan(SEED16, 10, 4, "feistel"), 9, 2)
    assert info.value.code == errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY


@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_the_golden_file_of_the_modes(backend):
    report = golden.verify("golden/sampling_modes.json", backend=backend)
    assert report.ok, report.summary()
    assert len(report.failures) == 0 and len(report.results) == 40


# ---------------------------------------------------------------- the bijection and its inverse


@pytest.mark.parametrize("n", [(1 << 20) - 1, (1 << 20) + 1])
@pytest.mark.parametrize("mode", MODES)
def test_whole_epochs_are_permutations_and_invert_exactly_numpy(numpy_backend, mode, n):
    plan = numpy_backend.build_plan(SEED16, n, 4099, mode)
    order = numpy_backend.map_train(plan, 0, n)
    assert np.array_equal(np.sort(order), np.arange(n, dtype=np.uint64))
    assert np.array_equal(get_mode(mode).inverse(plan, order), np.arange(n, dtype=np.uint64))


@pytest.mark.parametrize("mode", MODES)
def test_a_whole_epoch_of_two_to_the_24_is_a_permutation_on_native(native, mode):
    n = 1 << 24
    plan = native.build_plan(SEED16, n, 1 << 20, mode)
    order = native.map_train(plan, 0, n)
    positions = np.concatenate([get_mode(mode).inverse(plan, order[i : i + (1 << 21)]) for i in range(0, n, 1 << 21)])
    assert np.array_equal(positions, np.arange(n, dtype=np.uint64))
    order.sort()
    assert np.array_equal(order, np.arange(n, dtype=np.uint64))


@pytest.mark.parametrize("mode", MODES)
def test_the_inverse_undoes_the_order_at_every_edge_size(numpy_backend, mode):
    rng = np.random.default_rng(7)
    for k in range(1, 65):
        for n in edge_sizes(k):
            plan = numpy_backend.build_plan(SEED16, n, block_size_for(n), mode)
            drawn = [int(v) % n for v in rng.integers(0, 1 << 63, 200, dtype=np.uint64)]
            positions = np.unique(np.array(drawn + [0, n - 1], dtype=np.uint64))
            indices = np.array([int(numpy_backend.map_train(plan, int(p), 1)[0]) for p in positions], dtype=np.uint64)
            assert (indices < np.uint64(n)).all()
            assert np.array_equal(get_mode(mode).inverse(plan, indices), positions), (mode, n)
            if mode == "feistel":
                assert [spec_feistel_inverse(int(i), n, plan.keys) for i in indices[:5]] == positions[:5].tolist()


def raw_manifest(n: int, mode: str | None, **data) -> dict:
    if mode is not None:
        data["sampling_mode"] = mode
    return {"seed": 5, "global_batch_size": 8, "data": data,
            "datasets": {"train": {"id": "c", "version": "1", "hash": "h", "cardinality": n}}}  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
def test_position_of_is_the_inverse_of_epoch_indices(mode):
    raw = raw_manifest(10**6 + 3, mode, sampler_block_size=4096)
    order = uc.epoch_indices(raw, "train", epoch=2, backend="numpy")
    positions = uc.position_of(raw, "train", 2, order)
    assert positions.dtype == np.uint64 and np.array_equal(positions, np.arange(10**6 + 3, dtype=np.uint64))
    assert uc.position_of(raw, "train", 2, int(order[12345])) == 12345
    assert uc.position_of(raw, "train", 2, np.int64(order[7])) == 7
    square = order[:12].astype(np.int32).reshape(3, 4)
    assert uc.position_of(raw, "train", 2, square).tolist() == np.arange(12).reshape(3, 4).tolist()
    assert uc.position_of(raw, "train", 2, np.array([], dtype=np.int64)).shape == (0,)


@pytest.mark.parametrize("index", [10, -1, [3, 10], np.array([1.5]), "3", None, True])
def test_position_of_refuses_what_is_not_an_index(index):
    with pytest.raises(UmlosError) as info:
        uc.position_of(raw_manifest(10, "feistel"), "train", 0, index)
    assert info.value.code == errors.INVALID_ARGUMENT
    assert info.value.record["failure_operator"] == errors.NEXTBATCH_OPERATOR


def test_position_of_checks_the_call_like_epoch_indices():
    with pytest.raises(UmlosError) as info:
        uc.position_of(raw_manifest(10, "feistel"), "nope", 0, 1)
    assert info.value.code == errors.INVALID_DATASET_KEY
    with pytest.raises(UmlosError) as info:
        uc.position_of(raw_manifest(10, "feistel"), "train", -1, 1)
    assert info.value.code == errors.INVALID_MANIFEST


# ---------------------------------------------------------------- the manifest key, strings and refusals


def test_the_default_mode_is_not_hashed_and_the_others_are():
    default = uc.Manifest.from_dict(raw_manifest(100, None))
    stated = uc.Manifest.from_dict(raw_manifest(100, "block_affine"))
    assert stated.hash == default.hash and "sampling_mode" not in stated.canonical["data"]
    assert stated.sampling_mode == default.sampling_mode == "block_affine"
    hashes = {default.hash}
    for mode in FEISTEL_MODES:
        m = uc.Manifest.from_dict(raw_manifest(100, mode))
        assert m.sampling_mode == mode and m.canonical["data"]["sampling_mode"] == mode
        hashes.add(m.hash)
    assert len(hashes) == 3


@pytest.mark.parametrize("value", ["aes", "Feistel", "", 3, None, ["feistel"]])
def test_an_unknown_mode_in_the_manifest_names_the_allowed_values(value):
    raw = raw_manifest(100, None)
    raw["data"]["sampling_mode"] = value
    with pytest.raises(UmlosError) as info:
        uc.Manifest.from_dict(raw)
    assert info.value.code == errors.INVALID_MANIFEST
    assert f"data.sampling_mode must be one of {', '.join(mode_names())}" in info.value.message


@pytest.mark.parametrize("mode", MODES)
def test_every_stage_and_preset_runs_each_mode(mode):
    raw = raw_manifest(1000, mode, sampler_block_size=64)
    spec_mode = get_mode(mode)
    train = uc.next_batch(raw, "train", world_size=2, rank=1, backend="numpy")
    assert train.metadata["sampling_mode"] == spec_mode.train_sampling_mode
    assert train.metadata["blocks_materialized"] == spec_mode.plan_blocks(1000, 64)
    assert train.indices.tolist() == uc.epoch_indices(raw, "train", start=4, count=4, backend="numpy").tolist()
    evaluation = uc.next_batch(raw, "train", stage="eval", cursor=uc.Cursor(0, 992), backend="numpy")
    assert evaluation.indices.tolist() == list(range(992, 1000))
    assert evaluation.metadata["sampling_mode"] == "SEQUENTIAL_V1"
    streaming = uc.next_batch(raw, "train", preset="streaming_infinite", cursor=uc.Cursor(0, 996), backend="numpy")
    assert streaming.metadata["sampling_mode"] == spec_mode.streaming_sampling_mode
    expected = np.concatenate([uc.epoch_indices(raw, "train", 0, 996, 4, backend="numpy"),
                               uc.epoch_indices(raw, "train", 1, 0, 4, backend="numpy")])  # fmt: skip
    assert streaming.indices.tolist() == expected.tolist() and streaming.cursor == uc.Cursor(1, 4)
    hashes = {train.metadata["sampler_config_hash"], streaming.metadata["sampler_config_hash"]}
    assert len(hashes) == 2
    for backend in ("native",):
        again = uc.next_batch(raw, "train", world_size=2, rank=1, backend=backend)
        assert again.indices.tolist() == train.indices.tolist()


def test_feistel_needs_no_block_tables_even_for_the_largest_epoch():
    raw = raw_manifest(U64, "feistel", sampler_block_size=1)  # 2^64 - 1 blocks of one sample
    batch = uc.next_batch(raw, "train", cursor=uc.Cursor(0, U64 - 3), backend="numpy")
    assert batch.metadata["blocks_materialized"] == 0 and len(batch.indices) == 3
    with pytest.raises(UmlosError) as info:  # the same epoch with blocks is refused
        uc.next_batch(raw_manifest(U64, "block_feistel", sampler_block_size=1), "train", backend="numpy")
    assert info.value.code == errors.BLOCK_TABLE_TOO_LARGE


@pytest.mark.parametrize("mode", FEISTEL_MODES)
def test_native_refuses_a_mode_its_module_lacks(mode):
    from umlos_cuda import _native

    entry = get_mode(mode).native_map
    stripped = types.SimpleNamespace(**{name: getattr(_native, name) for name in dir(_native)
                                        if not name.startswith("_") and name != entry})  # fmt: skip
    backend = NativeBackend(stripped)
    plan = block_feistel.build_plan(SEED16, 100, 8) if mode == "block_feistel" else feistel.build_plan(SEED16, 100, 8)
    with pytest.raises(UmlosError) as info:
        backend.map_train(plan, 0, 10)
    assert info.value.code == errors.INVALID_MANIFEST
    assert f"needs umlos_cuda._native.{entry}, which the installed module lacks" in info.value.message
    assert "backend 'native' runs block_affine" in info.value.message


def test_the_modes_have_their_own_strings_tokens_and_kernels():
    records = [get_mode(name) for name in MODES]
    assert records[0] is block_affine.MODE
    strings = [text for mode in records for text in mode.sampling_modes]
    assert len(set(strings)) == 6
    assert len({mode.config_tokens for mode in records}) == 3
    for mode in records:
        assert set(mode.cuda_map) == {"uint64", "int64", "int32"} and mode.native_map and mode.inverse
