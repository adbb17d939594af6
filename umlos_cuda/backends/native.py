"""The native backend: the kernel headers compiled for the CPU.

``umlos_cuda._native`` is built by ``pip install`` from ``kernels/*.cuh`` and
``umlos_cuda/_native.cpp`` (setup.py), with OpenMP over positions and blocks.
It computes exactly the NumPy reference's bits, plan tables included, a few
times faster per core and on every core. Without a compiler at install time
the extension is absent and :func:`create` says so; ``"auto"`` then uses NumPy.

Each sampling mode names its native entry points (``SamplingMode.native_module``,
``native_map``, ``build_plan_native``); a mode without them, or whose module
lacks them, is refused with INVALID_MANIFEST naming the modes this backend runs.
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from typing import Any

import numpy as np

from .. import errors
from ..errors import UmlosError
from ..modes import DEFAULT_MODE, Plan, SamplingMode, get_mode, mode_names
from ._host import HostBackend, backend_error, check_window, host_output

#: The module of the built-in modes' entry points.
EXTENSION = "umlos_cuda._native"


class NativeBackend(HostBackend):
    name = "native"

    def __init__(self, module) -> None:
        self._native = module
        self._modules: dict[str, Any] = {EXTENSION: module}

    @property
    def threads(self) -> int:
        """Threads a large map uses in this process (1 in a forked child: docs/kernels.md)."""
        return int(self._native.max_threads())

    @property
    def feistel_path(self) -> str:
        """The SIMD path the Feistel modes run on this CPU: ``avx512f``, ``avx2``, ``sse2``
        or ``scalar`` (the same bits on each; the benchmarks print it)."""
        return str(self._native.feistel_isa())

    def build_plan(self, seed16: bytes, n: int, block_size: int, mode: str = DEFAULT_MODE) -> Plan:
        """An epoch's plan, built by the mode's native plan builder when it has one."""
        sampling_mode = get_mode(mode)
        if sampling_mode.build_plan_native is None:
            return sampling_mode.build_plan(seed16, n, block_size)
        module = self._module(sampling_mode)
        with _checked("build_plan"):
            return sampling_mode.build_plan_native(module, seed16, n, block_size)

    def map_train(self, plan: Plan, start: int, count: int, out=None, *, stride: int = 1, dtype=None, stream=None):
        """Indices of positions ``start + i * stride`` (``i < count``) into ``out`` (uint64, int64 or int32).

        ``stream`` is accepted for the protocol and ignored on the host.
        """
        entry = self.entry_point(get_mode(plan.mode))
        target = host_output(out, count, dtype, plan.n - 1)
        check_window(plan.n, start, count, stride)
        params = [int(value) for value in plan.kernel_params()]
        with _checked("map_train"):
            entry(*plan.kernel_tables(), *params, int(start), int(count), int(stride), target)
        return target

    def philox4x32_10(self, inputs) -> np.ndarray:
        """Philox4x32-10 of the compiled headers (R1): ``inputs`` is ``(k, 6)`` uint32 rows
        ``(c0, c1, c2, c3, k0, k1)``; returns the ``(k, 4)`` output words (``umlos-cuda
        selftest`` checks R1's known answers here, as on the device for cupy)."""
        rows = np.ascontiguousarray(inputs, dtype=np.uint32).reshape(-1, 6)
        words = [self._native.philox4x32_10(*(int(v) for v in row)) for row in rows]
        return np.array(words, dtype=np.uint32).reshape(-1, 4)

    def entry_point(self, mode: SamplingMode):
        """The native map function of ``mode``, or INVALID_MANIFEST naming the modes that have one."""
        if mode.native_map is None:
            raise _no_native_code(mode, "has no native entry point")
        function = getattr(self._module(mode), mode.native_map, None)
        if function is None:
            raise _no_native_code(
                mode, f"needs {mode.native_module}.{mode.native_map}, which the installed module lacks "
                "(reinstall umlos-cuda to rebuild it)",
            )
        return function

    def _module(self, mode: SamplingMode):
        module = self._modules.get(mode.native_module)
        if module is None:
            try:
                module = importlib.import_module(mode.native_module)
            except ImportError as exc:
                raise _no_native_code(mode, f"needs the module {mode.native_module}, "
                                            f"which is not importable ({exc})") from exc
            self._modules[mode.native_module] = module
        return module


def _no_native_code(mode: SamplingMode, why: str) -> UmlosError:
    runs = [name for name in mode_names() if get_mode(name).native_map is not None and name != mode.name]
    return backend_error(
        errors.INVALID_MANIFEST,
        f"sampling mode {mode.name!r} {why}; backend 'native' runs {', '.join(runs) or 'no other mode'} "
        "(backend 'numpy' runs every mode)",
    )


@contextmanager
def _checked(what: str):
    """The extension's own argument checks (TypeError, ValueError, OverflowError) as UmlosError."""
    try:
        yield
    except (TypeError, ValueError, OverflowError) as exc:
        raise backend_error(errors.INVALID_ARGUMENT, f"native {what}: {exc}") from exc


def create() -> NativeBackend:
    try:
        from .. import _native  # type: ignore[attr-defined]  # C++, built at install: mypy reads no .so
    except ImportError as exc:
        raise backend_error(
            errors.BACKEND_UNAVAILABLE,
            "the C++ extension umlos_cuda._native is not built (no C++ compiler when umlos-cuda was "
            f"installed, or UMLOS_NO_NATIVE was set: {exc}); install g++ or clang and reinstall "
            "umlos-cuda, or use backend 'numpy' (same results)",
        ) from exc
    return NativeBackend(_native)
