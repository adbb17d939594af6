"""The CuPy backend against the NumPy reference, bit for bit; and its unavailable path.

Three groups:

* **Parity** (``cupy_engine`` fixture, two parameters). ``gpu`` is the real
  backend: CuPy, NVRTC and a CUDA device; it is skipped with the reason where
  any is missing. ``emulated`` runs the same test bodies everywhere on a
  stand-in ``cupy`` module (``make_fake_cupy``) whose arrays refuse implicit
  NumPy conversion as CuPy's do, and whose ``RawModule`` reads the kernel
  signatures from the real assembled source (``kernel_source()``), checks each
  launch's argument count and types against them (a Python ``int`` where the
  ABI wants ``u64`` fails), and runs the kernel's arithmetic in NumPy. It
  proves the launch plumbing (tables, divider, window, dtype, ``out``, stream,
  device, compile caching), not the CUDA compiler; ``gpu`` proves that.
* **Unavailable**: with CuPy absent (forced, so this runs on GPU machines too),
  with no device, with a failing compile and with wrong Philox bits,
  ``create()`` raises BACKEND_UNAVAILABLE with the reason, and ``"auto"``
  falls back and says which backend it used in ``metadata["backend"]``. A CUDA
  failure during a call of a backend that did start (a failed launch, an
  asynchronous error at ``synchronize``) is DEVICE_ERROR instead.
* **Through the public API**: ``epoch_indices(..., backend="cupy", dtype=,
  stream=)`` and ``next_batch``.
"""

from __future__ import annotations

import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

import umlos_cuda as uc
from umlos_cuda import backends, errors, modes, nextbatch, reference
from umlos_cuda.backends import cupy_backend, get_backend, to_numpy
from umlos_cuda.backends.numpy_backend import NumpyBackend
from umlos_cuda.modes import SamplingMode, block_affine
from umlos_cuda.epoch import PlanCache, build_plan_reference
from umlos_cuda.errors import UmlosError
from umlos_cuda.feistel import feistel_permute
from umlos_cuda.philox import philox4x32_10

# --------------------------------------------------------------------------------------
# A stand-in for the few CuPy APIs the backend uses.
# --------------------------------------------------------------------------------------


def kernel_signatures() -> dict[str, list[str]]:
    """Each ``extern "C" __global__`` kernel of the assembled source -> its parameter kinds.

    Kinds: ``u64``, ``u32`` (scalars), ``*u64``, ``*i64``, ``*i32``, ``*u32`` (device pointers).
    """
    from umlos_cuda.kernel_source import kernel_source

    kinds = {"u64": "u64", "unsigned long long": "u64", "u32": "u32", "unsigned int": "u32", "long long": "i64",
             "int": "i32"}
    signatures = {}
    for name, params in re.findall(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)', kernel_source()):
        parsed = []
        for param in params.split(","):
            text = param.replace("const", " ").replace("umlos::", " ")
            pointer = "*" in text
            words = text.replace("*", " ").split()[:-1]  # drop the parameter name
            parsed.append(("*" if pointer else "") + kinds[" ".join(words)])
        signatures[name] = parsed
    return signatures


class FakeCudaError(RuntimeError):
    """Raised by the stand-in where CuPy raises its CUDA errors."""


FakeCudaError.__module__ = "cupy.cuda.memory"


def make_fake_cupy(devices: int = 2, *, device_count_error: bool = False, compile_error: bool = False,
                   wrong_philox: bool = False, launch_error: bool = False, sync_error: bool = False):
    """A module object that stands in for ``cupy``; ``module.state`` records compiles and launches."""
    state = types.SimpleNamespace(device_stack=[0], stream_stack=[], compiles=[], launches=[], next_ptr=[100],
                                  fail_launches=launch_error, fail_sync=sync_error)
    cp = types.ModuleType("cupy")
    cp.state = state

    def current_device() -> int:
        return state.device_stack[-1]

    class FakeArray:
        def __init__(self, data: np.ndarray, device_id: int) -> None:
            self._data = data
            self._device_id = device_id

        shape = property(lambda self: self._data.shape)
        ndim = property(lambda self: self._data.ndim)
        dtype = property(lambda self: self._data.dtype)
        size = property(lambda self: self._data.size)
        flags = property(lambda self: self._data.flags)
        device = property(lambda self: Device(self._device_id))

        def __len__(self) -> int:
            return len(self._data)

        def __array__(self, *args, **kwargs):
            raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use `.get()`")

        def get(self) -> np.ndarray:
            return self._data.copy()

        def view(self, dtype) -> FakeArray:
            return FakeArray(self._data.view(dtype), self._device_id)

        def __getitem__(self, key) -> FakeArray:
            return FakeArray(self._data[key], self._device_id)

        def __setitem__(self, key, value) -> None:
            if isinstance(value, FakeArray):
                value = value._data
            elif isinstance(value, np.ndarray):
                raise TypeError("a NumPy array cannot be assigned into a device array")
            self._data[key] = value

    class Device:
        def __init__(self, device_id=None) -> None:
            self.id = current_device() if device_id is None else int(device_id)
            if not 0 <= self.id < devices:
                raise FakeCudaError(f"invalid device {self.id}")
            self.attributes = {"MultiProcessorCount": 3}

        def __enter__(self):
            state.device_stack.append(self.id)
            return self

        def __exit__(self, *exc) -> None:
            state.device_stack.pop()

        def synchronize(self) -> None:
            if state.fail_sync:
                raise FakeCudaError("cudaErrorLaunchFailure: unspecified launch failure")

    class Stream:
        def __init__(self, ptr=None) -> None:
            if ptr is None:
                state.next_ptr[0] += 1
                ptr = state.next_ptr[0]
            self.ptr = ptr

        def __enter__(self):
            state.stream_stack.append(self)
            return self

        def __exit__(self, *exc) -> None:
            state.stream_stack.pop()

        def synchronize(self) -> None:
            pass

    Stream.null = Stream(0)

    class ExternalStream(Stream):
        pass

    signatures = kernel_signatures()
    from umlos_cuda.kernel_source import KERNEL_OPTIONS, kernel_source
    from umlos_cuda.reference import divider_params

    class Kernel:
        def __init__(self, name: str, device_id: int) -> None:
            self.name = name
            self.device_id = device_id
            self.signature = signatures[name]

        def __call__(self, grid, block, args) -> None:
            assert current_device() == self.device_id, "launched on a device other than the module's"
            assert len(args) == len(self.signature), f"{self.name}: {len(args)} arguments for {self.signature}"
            for position, (kind, arg) in enumerate(zip(self.signature, args)):
                if kind.startswith("*"):
                    expected = {"*u64": np.uint64, "*i64": np.int64, "*i32": np.int32, "*u32": np.uint32}[kind]
                    assert isinstance(arg, FakeArray), \
                        f"{self.name} argument {position}: a device array, got {type(arg)}"
                    assert arg.dtype == expected, f"{self.name} argument {position}: {kind}, got {arg.dtype}"
                    assert arg._device_id == self.device_id, f"{self.name} argument {position} is on another device"
                else:
                    expected = {"u64": np.uint64, "u32": np.uint32}[kind]
                    assert type(arg) is expected, f"{self.name} argument {position}: {kind}, got {type(arg).__name__}"
            assert isinstance(grid, tuple) and isinstance(block, tuple) and grid[0] >= 1 and block[0] >= 1
            stream = state.stream_stack[-1] if state.stream_stack else Stream.null
            state.launches.append((self.name, grid, block, stream.ptr, self.device_id))
            if state.fail_launches:
                raise FakeCudaError("out of memory allocating 8 bytes")
            getattr(self, "_" + self.name)(*args)

        @staticmethod
        def _map(base, m, a, c, block_size, magic, info, start, count, stride, out) -> None:
            assert (magic, info) == divider_params(int(block_size)), "divider parameters of another block size"
            count = int(count)
            assert out.size >= count
            p = np.arange(count, dtype=np.uint64) * stride + start
            b = p // block_size
            local = p - b * block_size
            mb = m._data[b]
            r = reference.mulmod_add(a._data[b], local, c._data[b], mb, int(mb.max()) if count else 0)
            out._data[:count] = (base._data[b] + r).astype(out.dtype)

        _umlos_map_positions_u64 = _umlos_map_positions_i64 = _umlos_map_positions_i32 = _map

        @staticmethod
        def _feistel(n, key0, key1, key2, key3, start, count, stride, out) -> None:
            p = np.arange(int(count), dtype=np.uint64) * stride + start
            out._data[: int(count)] = feistel_permute(p, int(n), (key0, key1, key2, key3)).astype(out.dtype)

        _umlos_feistel_map_u64 = _umlos_feistel_map_i64 = _umlos_feistel_map_i32 = _feistel

        @staticmethod
        def _block_feistel(base, m, k0, k1, k2, k3, block_size, magic, info, start, count, stride, out) -> None:
            assert (magic, info) == divider_params(int(block_size)), "divider parameters of another block size"
            p = np.arange(int(count), dtype=np.uint64) * stride + start
            b = p // block_size
            local = p - b * block_size
            result = np.empty_like(p)
            for m_value in np.unique(m._data[b]):
                at = m._data[b] == m_value
                keys = tuple(table._data[b[at]] for table in (k0, k1, k2, k3))
                result[at] = base._data[b[at]] + feistel_permute(local[at], int(m_value), keys)
            out._data[: int(count)] = result.astype(out.dtype)

        _umlos_block_feistel_map_u64 = _umlos_block_feistel_map_i64 = _umlos_block_feistel_map_i32 = _block_feistel

        @staticmethod
        def _umlos_sequential_u64(start, count, stride, out) -> None:
            out._data[: int(count)] = np.arange(int(count), dtype=np.uint64) * stride + start

        @staticmethod
        def _umlos_philox4x32_10_batch(words_in, count, words_out) -> None:
            rows = words_in._data.reshape(-1, 6)[: int(count)]
            result = np.array(
                [[int(w) for w in philox4x32_10(*row[:4], int(row[4]), int(row[5]))] for row in rows],
                dtype=np.uint32,
            ).reshape(-1, 4)
            if wrong_philox:
                result ^= np.uint32(1)
            words_out._data[: 4 * int(count)] = result.reshape(-1)

    class RawModule:
        def __init__(self, code: str, options=()) -> None:
            if compile_error:
                raise FakeCudaError("nvrtc: error: failed to open libnvrtc.so.12")
            assert code == kernel_source(), "the module must be built from the assembled source"
            assert tuple(options) == tuple(KERNEL_OPTIONS)
            self.device_id = current_device()
            state.compiles.append(self.device_id)

        def get_function(self, name: str) -> Kernel:
            return Kernel(name, self.device_id)

    def get_device_count() -> int:
        if device_count_error:
            raise FakeCudaError("cudaErrorNoDevice: no CUDA-capable device is detected")
        return devices

    def asarray(obj, dtype=None):
        if isinstance(obj, FakeArray):
            return obj
        if hasattr(obj, "__cuda_array_interface__"):
            return obj.backing
        if not isinstance(obj, (np.ndarray, list, tuple, int)):
            raise TypeError(f"cannot convert {type(obj).__name__}")
        return FakeArray(np.array(obj, dtype=dtype), current_device())

    cp.ndarray = FakeArray
    cp.asarray = asarray
    def empty(n, dtype=np.float64):
        data = np.empty(n, dtype=dtype)
        data.view(np.uint8)[...] = 0xAB  # garbage, as uninitialised device memory would be
        return FakeArray(data, current_device())

    cp.empty = empty
    cp.zeros = lambda n, dtype=np.float64: FakeArray(np.zeros(n, dtype=dtype), current_device())
    cp.arange = lambda start, stop, step=1, dtype=None: FakeArray(np.arange(start, stop, step, dtype=dtype),
                                                                  current_device())
    cp.asnumpy = lambda x: x.get()
    cp.concatenate = lambda arrays: FakeArray(np.concatenate([a._data for a in arrays]), current_device())
    cp.from_dlpack = lambda obj: obj.backing
    cp.RawModule = RawModule
    cp.cuda = types.SimpleNamespace(
        Device=Device,
        Stream=Stream,
        ExternalStream=ExternalStream,
        get_current_stream=lambda: state.stream_stack[-1] if state.stream_stack else Stream.null,
        runtime=types.SimpleNamespace(
            getDeviceCount=get_device_count,
            getDevice=current_device,
            getDeviceProperties=lambda i: {"name": b"Emulated device"},
        ),
    )
    return cp


class CudaArrayLike:
    """A foreign device array (as a torch tensor would be) exposing ``__cuda_array_interface__``."""

    def __init__(self, backing) -> None:
        self.backing = backing
        self.shape = backing.shape
        self.dtype = backing.dtype

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "version": 3}


# --------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------


_real: dict[str, object] = {}


def _real_cupy_backend():
    """The real backend, created once per test session (or the reason it cannot be)."""
    if not _real:
        try:
            _real["backend"] = cupy_backend.create()
        except UmlosError as exc:
            _real["reason"] = exc.message
    if "reason" in _real:
        pytest.skip(f"needs CuPy and a CUDA device: {_real['reason']}")
    return _real["backend"]


@pytest.fixture(params=["emulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def cupy_engine(request):
    """A CuPy backend: the real one (GPU) or one over the stand-in module."""
    if request.param == "gpu":
        return _real_cupy_backend()
    return cupy_backend.create_with(make_fake_cupy())


@pytest.fixture
def fresh_registry(monkeypatch):
    """Backends and plans created inside the test stay inside it."""
    monkeypatch.setattr(backends, "_instances", {})
    monkeypatch.setattr(backends, "_failures", {})
    monkeypatch.setattr(nextbatch, "_plans", PlanCache())


def _seed(i: int) -> bytes:
    return bytes((i * 37 + k * 11) & 0xFF for k in range(16))


def expected(plan_host, start: int, count: int, stride: int = 1) -> np.ndarray:
    return NumpyBackend().map_train(plan_host, start, count, stride=stride)


#: (N, block_size): edge sizes (2^k - 1, 2^k, 2^k + 1, a tail of one sample), block
#: sizes that are and are not powers of two, one block above 2^32 (128-bit products),
#: a power-of-two full block of 2^63 beside a 2^63 - 1 tail at N = 2^64 - 1.
CONFIGS = [
    (1, 1),
    (2, 1),
    (7, 3),
    (1000, 1 << 20),
    (1 << 10, 1 << 5),
    ((1 << 10) + 1, 1 << 5),
    ((1 << 10) - 1, 1 << 5),
    (100_003, 1000),
    ((1 << 20) + 1, 1 << 16),
    (3 * (1 << 20) + 17, 1 << 20),
    ((1 << 33) + 5, (1 << 32) + 3),
    ((1 << 64) - 1, 1 << 63),
]
FULL_EPOCH = 1 << 22  # compare whole epochs up to this many positions, else windows


def windows(n: int, block_size: int) -> list[tuple[int, int]]:
    if n <= FULL_EPOCH:
        return [(0, n), (n // 3, n - n // 3 - n // 5)]
    w = 4099
    mid = min(n - w, block_size - w // 2) if block_size < n else n // 2
    return [(0, w), (max(0, mid), w), (n - w, w)]


# --------------------------------------------------------------------------------------
# Parity with the NumPy reference
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,block_size", CONFIGS)
def test_map_train_matches_numpy_bit_for_bit(cupy_engine, n, block_size):
    for s in range(2):
        plan = cupy_engine.build_plan(_seed(s), n, block_size)
        host = build_plan_reference(_seed(s), n, block_size)
        for table in ("block_order", "base", "m", "a", "c"):
            assert np.array_equal(getattr(plan, table), getattr(host, table)), table
        for start, count in windows(n, block_size):
            got = cupy_engine.map_train(plan, start, count)
            assert isinstance(got, cupy_engine.xp.ndarray)
            assert got.dtype == np.uint64 and got.shape == (count,)
            want = expected(host, start, count)
            assert np.array_equal(to_numpy(got), want), (n, block_size, s, start, count)


@pytest.mark.parametrize("n,block_size", [(100_003, 1000), ((1 << 33) + 5, (1 << 32) + 3), ((1 << 64) - 1, 1 << 63)])
def test_strided_windows_match_numpy(cupy_engine, n, block_size):
    plan = cupy_engine.build_plan(_seed(4), n, block_size)
    host = build_plan_reference(_seed(4), n, block_size)
    every_block = min(50, (n - 8) // (block_size + 1) + 1)  # one position per block
    strided = ((0, 1000, 8), (7, every_block, block_size + 1), (n - 1 - 3 * 999, 1000, 3), (1, 2, n - 2))
    for start, count, stride in strided:
        assert start + (count - 1) * stride < n
        got = to_numpy(cupy_engine.map_train(plan, start, count, stride=stride))
        want = NumpyBackend().map_train(host, start, count, stride=stride)
        assert np.array_equal(got, want), (n, block_size, start, count, stride)
    got = to_numpy(cupy_engine.sequential(5, 100, stride=7, dtype="int32"))
    assert got.dtype == np.int32 and got.tolist() == list(range(5, 5 + 700, 7))


def test_full_epoch_is_a_permutation_on_the_device(cupy_engine):
    n, block_size = 5 * (1 << 16) + 1, 1 << 16
    got = to_numpy(cupy_engine.map_train(cupy_engine.build_plan(_seed(3), n, block_size), 0, n))
    assert np.array_equal(np.sort(got), np.arange(n, dtype=np.uint64))


@pytest.mark.parametrize("dtype", ["uint64", "int64", "int32"])
def test_dtypes_hold_the_same_values(cupy_engine, dtype):
    n, block_size = 100_003, 4096
    plan = cupy_engine.build_plan(_seed(1), n, block_size)
    got = cupy_engine.map_train(plan, 17, n - 17, dtype=dtype)
    assert got.dtype == np.dtype(dtype)
    want = expected(plan.host, 17, n - 17)
    assert np.array_equal(to_numpy(got).astype(np.uint64), want)


@pytest.mark.parametrize("dtype", ["uint64", "int64", "int32"])
def test_out_is_written_in_place_and_returned(cupy_engine, dtype):
    n, block_size = 50_000, 1 << 12
    plan = cupy_engine.build_plan(_seed(2), n, block_size)
    out = cupy_engine.xp.empty(1000, dtype=np.dtype(dtype))
    result = cupy_engine.map_train(plan, 777, 1000, out=out)
    assert result is out
    assert np.array_equal(to_numpy(out).astype(np.uint64), expected(plan.host, 777, 1000))


def test_int32_refused_when_an_index_does_not_fit(cupy_engine):
    plan = cupy_engine.build_plan(_seed(0), (1 << 31) + 1, 1 << 20)
    with pytest.raises(UmlosError) as info:
        cupy_engine.map_train(plan, 0, 16, dtype="int32")
    assert info.value.code == errors.OUTPUT_DTYPE_OVERFLOW and "int32" in info.value.message
    assert "use uint64, int64" in info.value.message  # names the types that would hold it
    # The last index that fits, N = 2^31: allowed.
    ok = cupy_engine.build_plan(_seed(0), 1 << 31, 1 << 20)
    got = cupy_engine.map_train(ok, (1 << 31) - 8, 8, dtype="int32")
    assert np.array_equal(to_numpy(got).astype(np.uint64), expected(ok.host, (1 << 31) - 8, 8))


def test_int64_refused_past_2_63(cupy_engine):
    plan = cupy_engine.build_plan(_seed(0), (1 << 63) + 1, 1 << 62)
    with pytest.raises(UmlosError) as info:
        cupy_engine.map_train(plan, 0, 4, dtype=np.int64)
    assert info.value.code == errors.OUTPUT_DTYPE_OVERFLOW
    assert info.value.message.endswith("use uint64")  # int64 is not offered past 2^63
    got = cupy_engine.map_train(plan, (1 << 63) - 3, 4)  # uint64 holds them all
    assert np.array_equal(to_numpy(got), expected(plan.host, (1 << 63) - 3, 4))


@pytest.mark.parametrize(
    "bad",
    [
        lambda xp: np.empty(10, dtype=np.uint64),  # host memory
        lambda xp: xp.empty(11, dtype=np.uint64),  # wrong length
        lambda xp: xp.empty(10, dtype=np.float64),  # not an index dtype
        lambda xp: xp.empty(20, dtype=np.uint64)[::2],  # strided view
    ],
    ids=["numpy-out", "wrong-length", "float-out", "strided-out"],
)
def test_bad_out_is_refused(cupy_engine, bad):
    plan = cupy_engine.build_plan(_seed(0), 1000, 64)
    with pytest.raises(UmlosError) as info:
        cupy_engine.map_train(plan, 0, 10, out=bad(cupy_engine.xp))
    assert info.value.code == errors.INVALID_ARGUMENT


def test_dtype_must_agree_with_out(cupy_engine):
    plan = cupy_engine.build_plan(_seed(0), 1000, 64)
    with pytest.raises(UmlosError) as info:
        cupy_engine.map_train(plan, 0, 10, out=cupy_engine.xp.empty(10, dtype=np.int64), dtype="int32")
    assert info.value.code == errors.INVALID_ARGUMENT


def test_window_past_the_epoch_is_refused(cupy_engine):
    plan = cupy_engine.build_plan(_seed(0), 1000, 64)
    with pytest.raises(UmlosError) as info:
        cupy_engine.map_train(plan, 990, 11)
    assert info.value.code == errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY


def test_empty_window(cupy_engine):
    plan = cupy_engine.build_plan(_seed(0), 1000, 64)
    got = cupy_engine.map_train(plan, 1000, 0)
    assert got.shape == (0,) and got.dtype == np.uint64


@pytest.mark.parametrize("dtype", ["uint64", "int64", "int32"])
def test_sequential(cupy_engine, dtype):
    got = cupy_engine.sequential(123, 4567, dtype=dtype)
    assert got.dtype == np.dtype(dtype)
    assert np.array_equal(to_numpy(got).astype(np.uint64), np.arange(123, 123 + 4567, dtype=np.uint64))


def test_sequential_at_the_uint64_boundary(cupy_engine):
    start = (1 << 64) - 5
    got = to_numpy(cupy_engine.sequential(start, 5))
    assert [int(v) for v in got] == list(range(start, 1 << 64))
    with pytest.raises(UmlosError) as info:
        cupy_engine.sequential(start, 5, dtype="int64")
    assert info.value.code == errors.OUTPUT_DTYPE_OVERFLOW
    with pytest.raises(UmlosError) as info:
        cupy_engine.sequential((1 << 31) - 2, 3, dtype="int32")
    assert info.value.code == errors.OUTPUT_DTYPE_OVERFLOW
    got = cupy_engine.sequential((1 << 31) - 3, 3, dtype="int32")  # ends at 2^31 - 1: fits
    assert [int(v) for v in to_numpy(got)] == [(1 << 31) - 3, (1 << 31) - 2, (1 << 31) - 1]


def test_stream_is_honoured(cupy_engine):
    xp = cupy_engine.xp
    n, block_size = 300_000, 1 << 14
    plan = cupy_engine.build_plan(_seed(5), n, block_size)
    want = expected(plan.host, 1000, 200_000)
    stream = xp.cuda.Stream()
    got = cupy_engine.map_train(plan, 1000, 200_000, stream=stream)
    stream.synchronize()
    assert np.array_equal(to_numpy(got), want)
    with stream:  # the current stream is the default
        got2 = cupy_engine.map_train(plan, 1000, 200_000)
        seq = cupy_engine.sequential(5, 10)
    stream.synchronize()
    assert np.array_equal(to_numpy(got2), want)
    assert np.array_equal(to_numpy(seq), np.arange(5, 15, dtype=np.uint64))
    raw = cupy_engine.map_train(plan, 1000, 200_000, stream=stream.ptr)  # a raw cudaStream_t
    stream.synchronize()
    assert np.array_equal(to_numpy(raw), want)
    with pytest.raises(UmlosError) as info:
        cupy_engine.map_train(plan, 0, 10, stream="default")
    assert info.value.code == errors.INVALID_ARGUMENT


def test_philox_known_answers_on_the_device(cupy_engine):
    import oracle

    rows = np.array([list(counter) + list(key) for counter, key, _ in oracle.PHILOX_KATS], dtype=np.uint32)
    got = cupy_engine.philox4x32_10(rows)
    assert [tuple(int(w) for w in r) for r in got] == [answer for _, _, answer in oracle.PHILOX_KATS]


def test_results_are_cupy_arrays_that_export_zero_copy(cupy_engine):
    got = cupy_engine.map_train(cupy_engine.build_plan(_seed(0), 1000, 64), 0, 1000)
    assert isinstance(got, cupy_engine.xp.ndarray)
    if hasattr(got, "__cuda_array_interface__"):  # real CuPy
        assert got.__cuda_array_interface__["typestr"] == "<u8"
        assert hasattr(got, "__dlpack__")


# --------------------------------------------------------------------------------------
# Emulated only: what the stand-in records (launch arguments, streams, compiles, devices)
# --------------------------------------------------------------------------------------


@pytest.fixture
def fake():
    cp = make_fake_cupy(devices=2)
    return cp, cupy_backend.create_with(cp)


def test_compiles_once_per_device(fake):
    cp, engine = fake
    assert cp.state.compiles == [0]  # create() compiled for the current device
    plan = engine.build_plan(_seed(0), 10_000, 128)
    for _ in range(3):
        engine.map_train(plan, 0, 5000)
        engine.sequential(0, 10)
    assert cp.state.compiles == [0]
    with cp.cuda.Device(1):
        out = cp.empty(5000, dtype=np.uint64)
    engine.map_train(plan, 0, 5000, out=out)  # out on device 1: launch there
    engine.map_train(plan, 0, 5000, out=out)
    assert cp.state.compiles == [0, 1]
    assert cp.state.launches[-1][4] == 1
    assert np.array_equal(out.get(), expected(plan.host, 0, 5000))


def test_plan_tables_uploaded_once_per_device(fake):
    cp, engine = fake
    plan = engine.build_plan(_seed(0), 10_000, 128)
    engine.map_train(plan, 0, 100)
    first = plan.tables(cp, 0)
    engine.map_train(plan, 100, 100)
    assert plan.tables(cp, 0) is first
    with cp.cuda.Device(1):
        engine.map_train(plan, 0, 100)
    assert set(plan._tables) == {0, 1}


def test_launches_on_the_callers_stream(fake):
    cp, engine = fake
    plan = engine.build_plan(_seed(0), 10_000, 128)
    stream = cp.cuda.Stream()
    engine.map_train(plan, 0, 100, stream=stream)
    assert cp.state.launches[-1][3] == stream.ptr
    engine.map_train(plan, 0, 100)
    assert cp.state.launches[-1][3] == 0  # the current (null) stream
    other = cp.cuda.Stream()
    with other:
        engine.sequential(0, 10)
    assert cp.state.launches[-1][3] == other.ptr
    engine.map_train(plan, 0, 100, stream=types.SimpleNamespace(cuda_stream=4242))  # torch.cuda.Stream-like
    assert cp.state.launches[-1][3] == 4242


@dataclass(frozen=True)
class _HostOnlyPlan:
    mode: ClassVar[str] = "host_only"
    n: int

    def kernel_tables(self):
        return ()

    def kernel_params(self):
        return ()


def test_a_mode_without_cuda_kernels_is_refused_before_any_launch(fake):
    cp, engine = fake
    base = block_affine.MODE
    modes.register_mode(SamplingMode(
        name="host_only", train_sampling_mode="HOST_ONLY_TOY_V1", streaming_sampling_mode="STREAMING_HOST_ONLY_TOY_V1",
        config_tokens=(), build_plan=lambda seed16, n, block_size: _HostOnlyPlan(n),
        reference_map=base.reference_map, plan_blocks=lambda n, block_size: 0,
    ))  # fmt: skip
    try:
        launches = len(cp.state.launches)
        with pytest.raises(UmlosError) as info:
            engine.map_train(engine.build_plan(_seed(0), 100, 10, "host_only"), 0, 10)
    finally:
        modes.unregister_mode("host_only")
    assert info.value.code == errors.INVALID_MANIFEST
    runs = ", ".join(name for name in modes.mode_names() if modes.get_mode(name).cuda_map)
    assert runs.startswith("block_affine")
    assert info.value.message == (
        f"sampling mode 'host_only' has no CUDA kernel for uint64 output; backend 'cupy' runs {runs} "
        "(backend 'numpy' runs every mode)"
    )
    assert len(cp.state.launches) == launches


def test_map_launch_arguments_follow_the_plan(fake):
    """tables, kernel_params(), start, count, stride, out: the order of kernels/README.md."""
    cp, engine = fake
    plan = engine.build_plan(_seed(0), 10_000, 128)
    engine.map_train(plan, 5, 100, stride=3)
    name, *_ = cp.state.launches[-1]
    assert name == "umlos_map_positions_u64"
    assert np.array_equal(engine.map_train(plan, 5, 100, stride=3).get(), expected(plan.host, 5, 100, stride=3))


@pytest.mark.parametrize("mode", ["feistel", "block_feistel"])
@pytest.mark.parametrize("dtype", ["uint64", "int64", "int32"])
def test_feistel_modes_launch_their_kernels_with_the_abi_arguments(cupy_engine, mode, dtype):
    """The plan's tables and typed scalars reach the mode's kernel for each dtype
    (the stand-in checks every argument against the kernel's signature)."""
    n = (1 << 31) - 3 if dtype == "int32" else 10**9 + 7
    plan = cupy_engine.build_plan(_seed(3), n, 4099, mode)
    for start, count, stride in ((0, 5000, 1), (n - 1000, 1000, 1), (11, 700, 1_000_003)):
        got = cupy_engine.map_train(plan, start, count, stride=stride, dtype=dtype)
        assert np.array_equal(backends.to_numpy(got), expected(plan.host, start, count, stride).astype(dtype))


def test_grid_is_capped_and_block_is_fixed(fake):
    cp, engine = fake
    plan = engine.build_plan(_seed(0), 1 << 20, 1 << 10)
    engine.map_train(plan, 0, 1 << 20)
    name, grid, block, _, _ = cp.state.launches[-1]
    assert name == "umlos_map_positions_u64"
    assert block == (cupy_backend.THREADS,)
    assert grid == (cupy_backend.BLOCKS_PER_SM * 3,)  # 3 multiprocessors in the stand-in
    engine.map_train(plan, 0, 10)
    assert cp.state.launches[-1][1] == (1,)


def test_int32_check_happens_before_any_launch(fake):
    cp, engine = fake
    plan = engine.build_plan(_seed(0), (1 << 31) + 1, 1 << 20)
    launches = len(cp.state.launches)
    with pytest.raises(UmlosError):
        engine.map_train(plan, 0, 16, dtype="int32")
    assert len(cp.state.launches) == launches


def test_foreign_device_array_as_out(fake):
    cp, engine = fake
    plan = engine.build_plan(_seed(0), 10_000, 128)
    foreign = CudaArrayLike(cp.empty(300, dtype=np.int64))
    result = engine.map_train(plan, 50, 300, out=foreign)
    assert result is foreign
    assert np.array_equal(foreign.backing.get().astype(np.uint64), expected(plan.host, 50, 300))


def test_cuda_failure_during_a_call_is_a_device_error():
    failing = cupy_backend.CupyBackend(make_fake_cupy(launch_error=True))
    plan = failing.build_plan(_seed(0), 1000, 64)
    for call in (lambda: failing.map_train(plan, 0, 10), lambda: failing.sequential(0, 10)):
        with pytest.raises(UmlosError) as info:
            call()
        assert info.value.code == errors.DEVICE_ERROR
        assert "out of memory" in info.value.message and "on device 0" in info.value.message
        assert isinstance(info.value.__cause__, FakeCudaError)


def test_asynchronous_failure_at_synchronize_is_a_device_error():
    engine = cupy_backend.create_with(make_fake_cupy(sync_error=True))
    with pytest.raises(UmlosError) as info:
        engine.synchronize()
    assert info.value.code == errors.DEVICE_ERROR and "synchronize" in info.value.message


def test_device_error_through_the_public_api(monkeypatch, fresh_registry):
    cp = make_fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cp)
    get_backend("cupy")
    cp.state.fail_launches = True  # usable at creation, failing afterwards
    with pytest.raises(UmlosError) as info:
        uc.epoch_indices(_manifest(), "train", epoch=0, count=100, backend="cupy")
    assert info.value.code == errors.DEVICE_ERROR
    assert info.value.record["failure_code"] == errors.DEVICE_ERROR


def test_a_failing_launch_at_creation_is_backend_unavailable():
    """create() launches the Philox check; a device that cannot run it is not a usable backend."""
    with pytest.raises(UmlosError) as info:
        cupy_backend.create_with(make_fake_cupy(launch_error=True))
    assert info.value.code == errors.BACKEND_UNAVAILABLE
    assert "Philox check on device 0 failed" in info.value.message and "out of memory" in info.value.message


def test_new_codes_are_documented():
    import os

    doc = Path(os.path.join(os.path.dirname(__file__), "..", "docs", "nextbatch.md")).read_text(encoding="utf-8")
    section = doc.split("### Failure codes", 1)[1].split("\n## ", 1)[0]
    for code in (errors.DEVICE_ERROR, errors.OUTPUT_DTYPE_OVERFLOW, errors.BACKEND_UNAVAILABLE):
        assert f"`{code}`" in section, code


# --------------------------------------------------------------------------------------
# Unavailable: every reason is reported, and "auto" falls back
# --------------------------------------------------------------------------------------


def test_cupy_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError, even where it is installed
    with pytest.raises(UmlosError) as info:
        cupy_backend.create()
    assert info.value.code == errors.BACKEND_UNAVAILABLE
    message = info.value.message
    assert "CuPy is not installed" in message
    assert "umlos-cuda[gpu-cu12]" in message and "umlos-cuda[gpu-cu13]" in message and "nvidia-smi" in message


def test_cupy_import_failure_is_reported(monkeypatch):
    import importlib

    def broken_import(name, *args, **kwargs):
        if name == "cupy":
            raise OSError("libcudart.so.12: cannot open shared object file")
        return real_import(name, *args, **kwargs)

    real_import = importlib.import_module
    monkeypatch.setattr(cupy_backend.importlib, "import_module", broken_import)
    with pytest.raises(UmlosError) as info:
        cupy_backend.create()
    assert info.value.code == errors.BACKEND_UNAVAILABLE
    assert "CuPy failed to import" in info.value.message and "libcudart" in info.value.message


@pytest.mark.parametrize(
    "fake_kwargs,reason",
    [
        ({"devices": 0}, "no CUDA device is visible"),
        ({"device_count_error": True}, "no usable CUDA device"),
        ({"compile_error": True}, "compiling the kernels for device 0 failed"),
        ({"wrong_philox": True}, "miscompiled"),
    ],
    ids=["zero-devices", "no-driver", "compile-fails", "wrong-bits"],
)
def test_unusable_device_is_reported(fake_kwargs, reason):
    with pytest.raises(UmlosError) as info:
        cupy_backend.create_with(make_fake_cupy(**fake_kwargs))
    assert info.value.code == errors.BACKEND_UNAVAILABLE
    assert reason in info.value.message


def _manifest(n=10_000, batch=64, block=256):
    return uc.Manifest.from_dict(
        {
            "seed": 11,
            "global_batch_size": batch,
            "data": {"sampler_block_size": block},
            "datasets": {"train": {"id": "t", "version": 1, "hash": "h", "cardinality": n}},
        }
    )


def test_registry_reports_the_reason_and_auto_falls_back(monkeypatch, fresh_registry):
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(UmlosError) as info:
        get_backend("cupy")
    assert info.value.code == errors.BACKEND_UNAVAILABLE and "CuPy is not installed" in info.value.message
    status = backends.available_backends()
    assert status["numpy"] == "ok"
    assert "CuPy is not installed" in status["cupy"]
    manifest = _manifest()
    batch = uc.next_batch(manifest, "train", world_size=2, rank=1, backend="auto")
    picked = batch.metadata["backend"]
    assert picked in ("native", "numpy")
    assert picked == ("native" if status["native"] == "ok" else "numpy")
    assert isinstance(batch.indices, np.ndarray)
    reference_batch = uc.next_batch(manifest, "train", world_size=2, rank=1, backend="numpy")
    assert np.array_equal(batch.indices, reference_batch.indices)
    with pytest.raises(UmlosError) as info:
        uc.next_batch(manifest, "train", backend="cupy")
    assert info.value.code == errors.BACKEND_UNAVAILABLE


# --------------------------------------------------------------------------------------
# Through the public API (emulated here; on the GPU too where there is one)
# --------------------------------------------------------------------------------------


@pytest.fixture(params=["emulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def cupy_registered(request, monkeypatch, fresh_registry):
    """The registry's "cupy" backend: over the stand-in, or the real one."""
    if request.param == "gpu":
        _real_cupy_backend()
    else:
        monkeypatch.setitem(sys.modules, "cupy", make_fake_cupy())
    return get_backend("cupy")


def test_auto_prefers_cupy_when_usable(cupy_registered):
    manifest = _manifest()
    batch = uc.next_batch(manifest, "train", world_size=4, rank=2, backend="auto")
    assert batch.metadata["backend"] == "cupy"
    assert isinstance(batch.indices, cupy_registered.xp.ndarray)
    want = uc.next_batch(manifest, "train", world_size=4, rank=2, backend="numpy")
    assert np.array_equal(to_numpy(batch.indices), want.indices)
    assert batch.cursor == want.cursor
    evaluation = uc.next_batch(manifest, "train", world_size=4, rank=3, stage="eval", backend="cupy")
    assert np.array_equal(to_numpy(evaluation.indices), np.arange(48, 64, dtype=np.uint64))


@pytest.mark.parametrize("dtype", [None, "uint64", "int64", "int32"])
def test_epoch_indices_dtype_and_stream(cupy_registered, dtype):
    manifest = _manifest(n=200_003, block=1 << 12)
    want = uc.epoch_indices(manifest, "train", epoch=3, start=5, count=150_000, backend="numpy")
    stream = cupy_registered.xp.cuda.Stream()
    got = uc.epoch_indices(manifest, "train", epoch=3, start=5, count=150_000, backend="cupy", dtype=dtype,
                           stream=stream)
    stream.synchronize()
    assert got.dtype == np.dtype(dtype or "uint64")
    assert np.array_equal(to_numpy(got).astype(np.uint64), want)
    host = uc.epoch_indices(manifest, "train", epoch=3, start=5, count=150_000, backend="numpy", dtype=dtype)
    assert host.dtype == got.dtype and np.array_equal(host, to_numpy(got))


def test_epoch_indices_out_on_the_device(cupy_registered):
    manifest = _manifest(n=70_001, block=1 << 10)
    out = cupy_registered.xp.empty(70_001, dtype=np.int32)
    result = uc.epoch_indices(manifest, "train", epoch=1, out=out, backend="cupy")
    assert result is out
    want = uc.epoch_indices(manifest, "train", epoch=1, backend="numpy")
    assert np.array_equal(to_numpy(out).astype(np.uint64), want)


def test_streaming_preset_concatenates_on_the_device(cupy_registered):
    manifest = _manifest(n=1000, batch=300, block=64)
    cursor = uc.Cursor(0, 900)
    got = uc.next_batch(manifest, "train", preset="streaming_infinite", cursor=cursor, backend="cupy")
    want = uc.next_batch(manifest, "train", preset="streaming_infinite", cursor=cursor, backend="numpy")
    assert np.array_equal(to_numpy(got.indices), want.indices)
    assert got.cursor == want.cursor
