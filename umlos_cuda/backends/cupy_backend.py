"""The CuPy backend: the kernels of ``kernels/`` compiled by NVRTC and run on the GPU.

What runs where:

* **Compile** once per process and device: ``kernel_source()`` (every header
  inlined, so CuPy's on-disk cache, keyed on the string, recompiles when a
  header changes) goes into one ``cupy.RawModule`` per device.
* **Plan** on the host: an epoch's plan (for the default mode, the block
  order of R5 and the affine tables of R6) is O(num_blocks) work, built by the
  native backend when it is available and by the NumPy reference otherwise;
  its ``kernel_tables()`` are copied to the device once and kept there as
  long as the plan is cached (``nextbatch``'s plan cache, a few epochs). At
  the default block size an epoch of 10^11 samples is ~3 MiB of tables.
* **Map** on the device: the plan's sampling mode names its kernels
  (``SamplingMode.cuda_map``; ``umlos_map_positions_{u64,i64,i32}`` for the
  default mode), one thread per position, grid-stride, launched on the
  caller's stream (the current stream by default) into a new array or the
  caller's ``out``.

Results are CuPy arrays; they reach PyTorch, JAX or DALI without a copy
through DLPack (``torch.from_dlpack(x)``) or ``__cuda_array_interface__``.

The trade-off: every launch is asynchronous, as CuPy's own operations are;
the indices are ready when the stream reaches them. ``synchronize()`` waits for
the device (the benchmarks use it).
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager, nullcontext
from threading import Lock
from typing import Any

import numpy as np

from .. import checks, errors
from ..dtypes import check_fits, output_dtype
from ..errors import UmlosError
from ..modes import DEFAULT_MODE, Plan, SamplingMode, get_mode, mode_names
from ..philox import PHILOX_KATS
from ._host import backend_error, check_window, last_position
from .native import create as create_native
#: Threads per block; grids are capped at BLOCKS_PER_SM blocks per multiprocessor
#: (every kernel is a grid-stride loop, so the cap only bounds launch overhead).
THREADS = 256
BLOCKS_PER_SM = 32

#: One extra per CUDA major; `nvidia-smi` prints the newest the driver runs (docs/install.md).
_INSTALL_HINT = (
    "install the GPU extra for the CUDA major of your driver (nvidia-smi, 'CUDA Version'): "
    "pip install 'umlos-cuda[gpu-cu12]' for 12.x, 'umlos-cuda[gpu-cu13]' for 13.x"
)


def _unavailable(reason: str) -> UmlosError:
    return backend_error(errors.BACKEND_UNAVAILABLE, reason)


@contextmanager
def _device_errors(what: str, device_id: int):
    """CuPy's CUDA errors inside the block (out of memory, a failed launch, a lost
    device) as DEVICE_ERROR naming the step and the device; other errors pass.

    The backend was usable when it was created, so a failure here is the
    device's, not a missing installation's: BACKEND_UNAVAILABLE would send the
    caller looking for a package that is there.
    """
    try:
        yield
    except UmlosError:
        raise
    except Exception as exc:
        if type(exc).__module__.split(".")[0] not in ("cupy", "cupy_backends"):
            raise
        raise backend_error(
            errors.DEVICE_ERROR, f"CUDA failed during {what} on device {device_id}: {type(exc).__name__}: {exc}"
        ) from exc


def import_cupy():
    """Import CuPy, or raise BACKEND_UNAVAILABLE saying why it cannot be imported."""
    try:
        return importlib.import_module("cupy")
    except ImportError as exc:
        raise _unavailable(f"CuPy is not installed ({exc}); {_INSTALL_HINT}") from exc
    except Exception as exc:  # CuPy present, but its CUDA libraries are not loadable
        raise _unavailable(f"CuPy failed to import: {type(exc).__name__}: {exc}") from exc


def require_device(cp) -> int:
    """The number of visible CUDA devices (at least 1), or BACKEND_UNAVAILABLE."""
    try:
        count = int(cp.cuda.runtime.getDeviceCount())
    except Exception as exc:  # CUDARuntimeError: no driver, no device, driver too old
        raise _unavailable(f"no usable CUDA device: {type(exc).__name__}: {exc}") from exc
    if count < 1:
        raise _unavailable("no CUDA device is visible (check CUDA_VISIBLE_DEVICES and the NVIDIA driver)")
    return count


def host_plan(seed16: bytes, n: int, block_size: int, mode: str = DEFAULT_MODE) -> tuple[Plan, str]:
    """Build an epoch plan on the host: the native backend's builder if it is usable, else NumPy's.

    The native backend comes from its own module, not from the registry in
    ``backends/__init__.py``, which imports this module by name: the two would
    import each other."""
    try:
        native = create_native()
    except UmlosError:
        return get_mode(mode).build_plan(seed16, n, block_size), "numpy"
    return native.build_plan(seed16, n, block_size, mode), "native"


class DevicePlan:
    """An epoch plan whose tables are also kept on the devices that used them.

    Reads like the host plan it wraps (``mode``, ``n``, ``kernel_params()``,
    and for the default mode ``block_size``, ``base``, ... are the host's);
    ``tables(cp, device_id)`` gives the device copies of the host's
    ``kernel_tables()``, uploaded on first use. ``builder`` says which backend
    built the host tables.
    """

    def __init__(self, host: Plan, builder: str = "numpy") -> None:
        self.host = host
        self.builder = builder
        self._tables: dict[int, tuple] = {}
        self._lock = Lock()

    def __getattr__(self, name: str) -> Any:
        if name == "host":  # not yet set (during construction or unpickling)
            raise AttributeError(name)
        return getattr(self.host, name)

    def tables(self, cp, device_id: int) -> tuple:
        with self._lock:
            tables = self._tables.get(device_id)
            if tables is None:
                host = self.host
                with cp.cuda.Device(device_id), cp.cuda.Stream.null:
                    tables = tuple(
                        cp.asarray(np.ascontiguousarray(table, dtype=np.uint64)) for table in host.kernel_tables()
                    )
                    # Uploaded on the null stream, used from any stream: finish it first.
                    cp.cuda.Stream.null.synchronize()
                self._tables[device_id] = tables
            return tables


class CupyBackend:
    """Index arithmetic on CUDA devices through CuPy (``backend="cupy"``)."""

    name = "cupy"

    def __init__(self, cp) -> None:
        self.xp = cp
        self._cp = cp
        self._kernels: dict[int, dict[str, Any]] = {}
        self._sm_count: dict[int, int] = {}
        self._lock = Lock()

    # -- compilation -----------------------------------------------------------------

    def kernels(self, device_id: int) -> dict[str, Any]:
        """The compiled kernels on ``device_id`` (compiled on first use, once per process)."""
        kernels = self._kernels.get(device_id)
        if kernels is not None:
            return kernels
        with self._lock:
            kernels = self._kernels.get(device_id)
            if kernels is None:
                kernels = self._compile(device_id)
                self._kernels[device_id] = kernels
        return kernels

    def _compile(self, device_id: int) -> dict[str, Any]:
        from ..kernel_source import KERNEL_OPTIONS, kernel_names, kernel_source

        cp = self._cp
        source = kernel_source()
        try:
            with cp.cuda.Device(device_id):
                module = cp.RawModule(code=source, options=tuple(KERNEL_OPTIONS))
                kernels = {name: module.get_function(name) for name in kernel_names()}
                self._sm_count[device_id] = int(cp.cuda.Device(device_id).attributes["MultiProcessorCount"])
        except UmlosError:
            raise
        except Exception as exc:  # NVRTC missing or failing, driver too old for the PTX, ...
            text = str(exc).strip().splitlines()
            detail = " / ".join(text[:6]) if text else type(exc).__name__
            raise _unavailable(f"compiling the kernels for device {device_id} failed: "
                               f"{type(exc).__name__}: {detail}") from exc
        return kernels

    def _grid(self, device_id: int, count: int) -> tuple[int]:
        sms = self._sm_count.get(device_id, 1)
        return (max(1, min(-(-count // THREADS), BLOCKS_PER_SM * sms)),)

    # -- launch context --------------------------------------------------------------

    def _stream(self, stream):
        """A CuPy stream object for ``stream``: None (the current stream), a CuPy
        stream, a raw ``cudaStream_t`` as an int, or an object with a
        ``cuda_stream`` handle (``torch.cuda.Stream``) or ``__cuda_stream__``."""
        cp = self._cp
        if stream is None:
            return None
        if hasattr(stream, "ptr") and hasattr(stream, "__enter__"):
            return stream
        handle = None
        if checks.is_integer(stream):
            handle = int(stream)
        elif isinstance(getattr(stream, "cuda_stream", None), int):
            handle = stream.cuda_stream
        elif hasattr(stream, "__cuda_stream__"):
            handle = int(stream.__cuda_stream__()[1])
        if handle is None:
            raise backend_error(
                errors.INVALID_ARGUMENT,
                "stream must be None, a cupy.cuda.Stream, an object with cuda_stream or __cuda_stream__ "
                f"(torch.cuda.Stream), or a raw stream handle (int); got {type(stream).__name__}",
            )
        return cp.cuda.ExternalStream(handle)

    def _resolve_out(self, out, count: int, dtype):
        """``(device array, object to return, dtype, device id)`` for a launch.

        ``out=None`` allocates later (on the launch stream); a caller's array
        must be a C-contiguous 1-D device array of ``count`` elements of an
        output dtype (a CuPy array, or any object with ``__cuda_array_interface__``
        or ``__dlpack__``, viewed without a copy).
        """
        cp = self._cp
        if out is None:
            return None, None, output_dtype(dtype), int(cp.cuda.runtime.getDevice())
        if isinstance(out, cp.ndarray):
            array = out
        elif hasattr(out, "__cuda_array_interface__"):
            array = cp.asarray(out)
        elif hasattr(out, "__dlpack__") and not isinstance(out, np.ndarray):
            array = cp.from_dlpack(out)
        else:
            raise backend_error(
                errors.INVALID_ARGUMENT,
                "out must be a CUDA device array (CuPy, or one with __cuda_array_interface__), "
                f"got {type(out).__name__}",
            )
        if array.ndim != 1 or array.shape[0] != count:
            raise backend_error(errors.INVALID_ARGUMENT, f"out must have shape ({count},), got {tuple(array.shape)}")
        if not array.flags.c_contiguous:
            raise backend_error(errors.INVALID_ARGUMENT,
                                "out must be contiguous (a strided view cannot be written in place)")
        resolved = output_dtype(array.dtype)
        if dtype is not None and output_dtype(dtype) != resolved:
            raise backend_error(errors.INVALID_ARGUMENT,
                                f"dtype {np.dtype(dtype).name} differs from out's {resolved.name}")
        return array, out, resolved, int(array.device.id)

    @contextmanager
    def _launching(self, device_id: int, stream, what: str):
        """Make ``device_id`` and ``stream`` current; CUDA failures become DEVICE_ERROR."""
        cp = self._cp
        resolved = self._stream(stream)
        with _device_errors(what, device_id), cp.cuda.Device(device_id), (
            resolved if resolved is not None else nullcontext()
        ):
            yield

    # -- the backend protocol --------------------------------------------------------

    def build_plan(self, seed16: bytes, n: int, block_size: int, mode: str = DEFAULT_MODE) -> DevicePlan:
        plan, builder = host_plan(seed16, n, block_size, mode)
        return DevicePlan(plan, builder)

    def map_train(self, plan, start: int, count: int, out=None, *, stride: int = 1, dtype=None, stream=None):
        """Indices of train positions ``start + i * stride`` (``i < count``) of ``plan``'s epoch.

        Args:
            plan: a :class:`DevicePlan` from ``build_plan`` (a host plan is
                accepted and uploaded for this call).
            out: a device array of ``count`` elements to write (its dtype wins).
            stride: the step between positions (1: a contiguous window).
            dtype: ``uint64`` (default), ``int64`` or ``int32``; a signed type
                only when every index of the epoch fits in it.
            stream: where to launch (default: the current stream).

        Returns ``out`` if given, else a new CuPy array, both written
        asynchronously on the stream.
        """
        if not isinstance(plan, DevicePlan):
            plan = DevicePlan(plan, "caller")
        check_window(plan.n, start, count, stride)
        start, count, stride = int(start), int(count), int(stride)
        target, result, resolved, device_id = self._resolve_out(out, count, dtype)
        check_fits(resolved, plan.n - 1, f"an epoch of N = {plan.n}")
        kernel_name = _map_kernel(get_mode(plan.mode), resolved)
        with self._launching(device_id, stream, "map_train"):
            if target is None:
                target = result = self._cp.empty(count, dtype=resolved)
            if count:
                kernel = self._kernel(device_id, kernel_name, plan.mode)
                tables = plan.tables(self._cp, device_id)
                kernel(
                    self._grid(device_id, count),
                    (THREADS,),
                    (*tables, *plan.kernel_params(), np.uint64(start), np.uint64(count), np.uint64(stride), target),
                )
        return result

    def _kernel(self, device_id: int, name: str, mode: str):
        kernel = self.kernels(device_id).get(name)
        if kernel is None:  # a mode registered after this device's compile
            raise backend_error(
                errors.INVALID_MANIFEST,
                f"kernel {name} of sampling mode {mode!r} is not in the module compiled on device {device_id}; "
                "register modes before the first CuPy call",
            )
        return kernel

    def sequential(self, start: int, count: int, out=None, *, stride: int = 1, dtype=None, stream=None):
        """``start, start + stride, ..., start + (count - 1) * stride`` (eval / infer positions are indices)."""
        last = last_position(start, count, stride)
        start, count, stride = int(start), int(count), int(stride)
        if last > errors.UINT64_MAX:
            raise backend_error(errors.UINT64_OVERFLOW, f"positions up to {last} pass 2^64 - 1")
        target, result, resolved, device_id = self._resolve_out(out, count, dtype)
        if count:
            check_fits(resolved, last, f"positions {start} to {last}")
        cp = self._cp
        with self._launching(device_id, stream, "sequential"):
            if target is None:
                target = result = cp.empty(count, dtype=resolved)
            if count:
                if resolved == np.uint64 or resolved == np.int64:
                    # Every value fits in int64 here, so the bits are the same.
                    kernel = self.kernels(device_id)["umlos_sequential_u64"]
                    view = target if resolved == np.uint64 else target.view(np.uint64)
                    kernel(
                        self._grid(device_id, count),
                        (THREADS,),
                        (np.uint64(start), np.uint64(count), np.uint64(stride), view),
                    )
                else:
                    target[...] = cp.arange(start, last + 1, stride, dtype=resolved)
        return result

    def philox4x32_10(self, inputs) -> np.ndarray:
        """Philox4x32-10 on the device (R1): ``inputs`` is ``(k, 6)`` uint32 rows
        ``(c0, c1, c2, c3, k0, k1)``; returns the ``(k, 4)`` output words on the host."""
        cp = self._cp
        rows = np.ascontiguousarray(inputs, dtype=np.uint32).reshape(-1, 6)
        count = rows.shape[0]
        device_id = int(cp.cuda.runtime.getDevice())
        with self._launching(device_id, None, "philox4x32_10"):
            words_in = cp.asarray(rows.reshape(-1))
            words_out = cp.zeros(4 * count, dtype=np.uint32)
            if count:
                kernel = self.kernels(device_id)["umlos_philox4x32_10_batch"]
                kernel(self._grid(device_id, count), (THREADS,), (words_in, np.uint64(count), words_out))
            return cp.asnumpy(words_out).reshape(count, 4)

    def synchronize(self) -> None:
        """Wait until the current device has finished every launch.

        An asynchronous failure of an earlier launch surfaces here, as DEVICE_ERROR.
        """
        device = self._cp.cuda.Device()
        with _device_errors("synchronize", device.id):
            device.synchronize()

    def device_name(self, device_id: int | None = None) -> str:
        cp = self._cp
        device_id = int(cp.cuda.runtime.getDevice()) if device_id is None else device_id
        try:
            name = cp.cuda.runtime.getDeviceProperties(device_id)["name"]
        except Exception:  # name is informational only
            return f"CUDA device {device_id}"
        return name.decode() if isinstance(name, bytes) else str(name)


def _map_kernel(mode: SamplingMode, dtype: np.dtype) -> str:
    """The name of ``mode``'s map kernel for ``dtype``, or INVALID_MANIFEST naming the modes that have one."""
    name = mode.cuda_map.get(np.dtype(dtype).name)
    if name is None:
        runs = [other for other in mode_names() if get_mode(other).cuda_map and other != mode.name]
        raise backend_error(
            errors.INVALID_MANIFEST,
            f"sampling mode {mode.name!r} has no CUDA kernel for {np.dtype(dtype).name} output; backend 'cupy' "
            f"runs {', '.join(runs) or 'no other mode'} (backend 'numpy' runs every mode)",
        )
    return name


#: R1's first known answer: counter 0, key 0 (checked on the device by ``create``).
_KAT_ZERO = PHILOX_KATS[0][2]


def create_with(cp) -> CupyBackend:
    """A backend over the module ``cp`` (CuPy, or a stand-in in tests).

    Fails with BACKEND_UNAVAILABLE unless a device is visible, the kernels
    compile for the current device, and Philox gives R1's first known answer
    there: a backend that ``"auto"`` picks is a backend that works.
    """
    require_device(cp)
    backend = CupyBackend(cp)
    device_id = int(cp.cuda.runtime.getDevice())
    backend.kernels(device_id)
    try:
        words = tuple(int(w) for w in backend.philox4x32_10(np.zeros((1, 6), dtype=np.uint32))[0])
    except UmlosError as exc:
        if exc.code != errors.DEVICE_ERROR:
            raise
        raise _unavailable(f"the Philox check on device {device_id} failed: {exc.message}") from exc
    if words != _KAT_ZERO:
        raise _unavailable(
            f"Philox4x32-10 on device {device_id} gave {' '.join(f'{w:08x}' for w in words)} for R1's first "
            "known answer; the kernels were miscompiled"
        )
    return backend


def create() -> CupyBackend:
    return create_with(import_cupy())
