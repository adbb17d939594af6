"""The native backend's own contract: its extension, argument checks, fork safety.

Bit identity with NumPy is tested in test_backend_parity.py (public API) and
for the kernel bodies in test_kernels_host.py; here: the Philox known answers
through the extension, the tables of ``build_plan``, what happens when the
extension is missing, refusal of bad buffers and windows (never a write out of
bounds), and that a forked child (a data-loader worker) still computes after
the parent ran parallel loops: GCC's OpenMP would hang there without the
extension's fork guard.
"""

from __future__ import annotations

import multiprocessing
import pathlib
import re
import sys

import numpy as np
import oracle
import pytest

import umlos_cuda
from umlos_cuda import errors
from umlos_cuda.backends import native as native_module
from umlos_cuda.epoch import build_plan_reference, epoch_seed
from umlos_cuda.errors import UmlosError

KAT = oracle.PHILOX_KATS  # R1, from the independent oracle
SEED = epoch_seed(b"\x05" * 32, b"\x06" * 32, "train", 9)


@pytest.fixture(scope="module")
def native():
    try:
        return native_module.create()
    except UmlosError as exc:
        pytest.skip(f"backend 'native' unavailable: {exc.message}")


def test_philox_known_answers(native):
    for ctr, key, expected in KAT:
        assert native._native.philox4x32_10(*ctr, *key) == expected
    rows = np.array([ctr + key for ctr, key, _ in KAT], dtype=np.uint32)
    got = native.philox4x32_10(rows)  # the entry point `umlos-cuda selftest` checks
    assert got.dtype == np.uint32 and got.shape == (len(KAT), 4)
    assert [tuple(int(w) for w in row) for row in got] == [expected for _, _, expected in KAT]


def test_extension_holds_only_entry_points_the_package_calls(native):
    """Test-only functions live in tests/kernel_harness, not in the extension: every
    function of ``umlos_cuda._native`` is named somewhere in the package's Python code
    (a backend, a sampling mode's registry entry), and the plan draws of R5 and R6
    (computed inside build_plan) are not exported on their own."""
    package = pathlib.Path(umlos_cuda.__file__).parent
    code = "\n".join(path.read_text(encoding="utf-8") for path in package.rglob("*.py"))
    functions = {name for name in dir(native._native)
                 if callable(getattr(native._native, name)) and not name.startswith("_")}
    assert {"build_plan", "map_positions", "philox4x32_10", "max_threads"} <= functions
    assert not functions & {"block_permute_j", "block_affine_params", "divider"}
    for name in functions:
        assert re.search(rf"\b{name}\b", code), f"_native.{name} is called by nothing in umlos_cuda/"


@pytest.mark.parametrize(
    "n,block_size", [(1, 1), (2, 1), (10**6 + 1, 1000), (12_345, 10**9), (2**20 + 1, 2**10), (10**11, 1 << 20)]
)
def test_build_plan_tables_match_numpy(native, n, block_size):
    want = build_plan_reference(SEED, n, block_size)
    got = native.build_plan(SEED, n, block_size)
    for name in ("block_order", "base", "m", "a", "c"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
        assert getattr(got, name).dtype == np.uint64
    assert (got.key, got.w2, got.w3, got.n, got.block_size) == (want.key, want.w2, want.w3, n, block_size)


def test_missing_extension_is_reported(monkeypatch):
    monkeypatch.setitem(sys.modules, "umlos_cuda._native", None)
    monkeypatch.delattr(umlos_cuda, "_native", raising=False)
    with pytest.raises(UmlosError) as info:
        native_module.create()
    assert info.value.code == errors.BACKEND_UNAVAILABLE
    assert "umlos_cuda._native is not built" in info.value.message
    assert "'numpy'" in info.value.message


def test_extension_refuses_bad_buffers(native):
    plan = native.build_plan(SEED, 10_000, 1000)
    ext = native._native
    tables = (plan.base, plan.m, plan.a, plan.c)
    params = tuple(int(v) for v in plan.kernel_params())  # block_size, block_magic, block_info
    out = np.empty(100, dtype=np.uint64)

    def call(*, tables=tables, params=params, start=0, count=100, stride=1, out=out):
        ext.map_positions(*tables, *params, start, count, stride, out)

    call()  # the arguments below differ from this valid call in one place each
    with pytest.raises(TypeError):
        call(tables=(plan.base.astype(np.int64),) + tables[1:])
    with pytest.raises(TypeError):
        call(out=np.empty(100, dtype=np.float64))
    with pytest.raises(TypeError):
        call(out=out[::2])
    with pytest.raises(ValueError):
        call(count=101)  # out too short
    with pytest.raises(ValueError):
        call(start=9_950)  # past the last block
    with pytest.raises(ValueError):
        call(start=50, stride=101)  # the last position, 10_049, is past the last block
    with pytest.raises(ValueError):
        call(stride=0)
    with pytest.raises(OverflowError):
        call(start=2, count=3, stride=1 << 63)  # start + 2 * stride passes 2^64 - 1
    with pytest.raises(ValueError):
        call(tables=(plan.base[:5],) + tables[1:], start=5_000)  # tables too short
    with pytest.raises(OverflowError):
        call(start=-1)
    with pytest.raises(OverflowError):
        call(start=1 << 64)
    with pytest.raises(TypeError):
        call(start=0.0)
    with pytest.raises(ValueError):
        call(params=(0, 0, 0))
    with pytest.raises(ValueError):
        call(params=(1000, params[1] + 1, params[2]))  # a divider of another block size
    with pytest.raises(TypeError):
        ext.map_positions(*tables, 1000, 0, 100, out)  # the argument list of an earlier release
    with pytest.raises(OverflowError):
        ext.build_plan(10, 1, 1 << 32, 0, 0, 0, *(np.empty(10, np.uint64),) * 5)
    assert np.array_equal(plan.base, build_plan_reference(SEED, 10_000, 1000).base)  # nothing was scribbled on


def test_backend_checks_windows_and_outputs(native):
    plan = native.build_plan(SEED, 2**31 + 5, 2**20)
    with pytest.raises(UmlosError) as info:
        native.map_train(plan, 2**31, 6)
    assert info.value.code == errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY
    with pytest.raises(UmlosError) as info:
        native.map_train(plan, 0, 10, dtype=np.int32)  # N - 1 does not fit in int32
    assert info.value.code == errors.OUTPUT_DTYPE_OVERFLOW and "int32" in info.value.message
    with pytest.raises(UmlosError) as info:
        native.map_train(plan, 0, 10, out=np.empty(10, dtype=np.int32))  # the same through out's dtype
    assert info.value.code == errors.OUTPUT_DTYPE_OVERFLOW
    with pytest.raises(UmlosError) as info:
        native.map_train(plan, 0, 10, out=np.empty(11, dtype=np.uint64))
    assert info.value.code == errors.INVALID_ARGUMENT
    with pytest.raises(UmlosError) as info:
        native.map_train(plan, 0, 10, out=np.empty(10, dtype=np.float32))
    assert info.value.code == errors.INVALID_ARGUMENT
    read_only = np.empty(10, dtype=np.uint64)
    read_only.flags.writeable = False
    with pytest.raises(UmlosError) as info:
        native.map_train(plan, 0, 10, out=read_only)
    assert info.value.code == errors.INVALID_ARGUMENT and "writable" in info.value.message
    got = native.map_train(plan, 2**31 - 5, 10, dtype=np.int64)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got.astype(np.uint64), native.map_train(plan, 2**31 - 5, 10))


def test_sequential_near_the_top(native):
    top = (1 << 64) - 1
    got = native.sequential(top - 5, 5)
    assert [int(v) for v in got] == list(range(top - 5, top))
    assert native.sequential(0, 0).shape == (0,)
    with pytest.raises(UmlosError) as info:
        native.sequential(2**31 - 2, 5, dtype=np.int32)
    assert info.value.code == errors.OUTPUT_DTYPE_OVERFLOW
    with pytest.raises(UmlosError) as info:
        native.sequential(top - 5, 5, dtype=np.int64)
    assert info.value.code == errors.OUTPUT_DTYPE_OVERFLOW and info.value.message.endswith("use uint64")
    assert [int(v) for v in native.sequential(2**31 - 3, 3, dtype=np.int32)] == [2**31 - 3, 2**31 - 2, 2**31 - 1]


def test_typed_output_needs_no_gpu_module():
    """The dtype rules live in umlos_cuda.dtypes: a host-only call with a signed
    dtype imports nothing of the CuPy backend."""
    code = (
        "import sys, umlos_cuda as uc\n"
        "from umlos_cuda import errors\n"
        "m = {'seed': 1, 'global_batch_size': 4, 'datasets': {'train': {'id': 'a', 'version': 1, 'hash': 'h', "
        "'cardinality': 2**31 + 1}}}\n"
        "for backend in ('native', 'numpy'):\n"
        "    try:\n"
        "        uc.epoch_indices(m, 'train', count=4, backend=backend, dtype='int32')\n"
        "    except uc.UmlosError as exc:\n"
        "        assert exc.code == errors.OUTPUT_DTYPE_OVERFLOW, exc\n"
        "    else:\n"
        "        raise AssertionError('int32 accepted for N = 2^31 + 1')\n"
        "    assert uc.epoch_indices(m, 'train', count=4, backend=backend, dtype='int64').dtype == 'int64'\n"
        "loaded = sorted(name for name in sys.modules if name.startswith('umlos_cuda.backends.cupy'))\n"
        "assert not loaded, loaded\n"
    )
    import subprocess

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def _child_checksum(plan_args, queue) -> None:
    backend = native_module.create()
    plan = backend.build_plan(*plan_args)
    out = backend.map_train(plan, 0, plan.n)
    queue.put((int(out.sum(dtype=np.uint64)), backend.threads))


def test_forked_child_computes_after_parent_ran_parallel_loops(native):
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("this platform has no fork()")
    plan_args = (SEED, 4 * 10**6 + 7, 1 << 20)
    plan = native.build_plan(*plan_args)
    expected = int(native.map_train(plan, 0, plan.n).sum(dtype=np.uint64))  # parallel in the parent
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_checksum, args=(plan_args, queue))
    child.start()
    child.join(120)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail("the forked child hung in the native map (OpenMP after fork)")
    assert child.exitcode == 0
    checksum, threads = queue.get(timeout=10)
    assert checksum == expected
    assert threads == 1
