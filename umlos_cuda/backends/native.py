"""The native backend: the kernel headers compiled for the CPU.

``umlos_cuda._native`` is built by ``pip install`` from ``kernels/*.cuh`` and
``umlos_cuda/_native.cpp`` (setup.py), with OpenMP over positions and blocks.
It computes exactly the NumPy reference's bits, plan tables included, a few
times faster per core and on every core. Without a compiler at install time
the extension is absent and :func:`create` says so; ``"auto"`` then uses NumPy.
"""

from __future__ import annotations

import numpy as np

from .. import errors
from ..epoch import EpochPlan, philox_key_words
from ..errors import UmlosError

#: The output dtypes the map accepts (indices must fit: N - 1 <= the dtype's max).
MAP_DTYPES = (np.dtype(np.uint64), np.dtype(np.int64), np.dtype(np.int32))


class NativeBackend:
    name = "native"
    xp = np

    def __init__(self, module) -> None:
        self._native = module

    @property
    def threads(self) -> int:
        """Threads a large map uses in this process (1 in a forked child: docs/kernels.md)."""
        return int(self._native.max_threads())

    def build_plan(self, seed16: bytes, n: int, block_size: int) -> EpochPlan:
        key, w2, w3 = philox_key_words(seed16)
        full = n // block_size
        blocks = full + (1 if n % block_size else 0)
        order = np.empty(full, dtype=np.uint64)
        base, m, a, c = (np.empty(blocks, dtype=np.uint64) for _ in range(4))
        self._native.build_plan(n, block_size, key[0], key[1], w2, w3, order, base, m, a, c)
        return EpochPlan(n, block_size, seed16, key, w2, w3, order, base, m, a, c)

    def map_train(self, plan: EpochPlan, start: int, count: int, out=None):
        if out is None:
            out = np.empty(count, dtype=np.uint64)
        elif not isinstance(out, np.ndarray) or out.dtype not in MAP_DTYPES or out.shape != (count,):
            raise UmlosError(
                errors.INVALID_MANIFEST,
                f"out must be a NumPy array of shape ({count},) and dtype uint64, int64 or int32",
            )
        limit = np.iinfo(out.dtype).max
        if plan.n - 1 > limit:
            raise UmlosError(
                errors.UINT64_OVERFLOW if out.dtype == np.uint64 else errors.INVALID_MANIFEST,
                f"indices of N = {plan.n} do not fit in {out.dtype} (largest {limit})",
            )
        self._native.map_positions(plan.base, plan.m, plan.a, plan.c, plan.block_size, start, count, out)
        return out

    def sequential(self, start: int, count: int, out=None):
        out = np.empty(count, dtype=np.uint64) if out is None else out
        out[:] = np.arange(count, dtype=np.uint64)
        out += np.uint64(start)
        return out


def create() -> NativeBackend:
    try:
        from .. import _native
    except ImportError as exc:
        raise UmlosError(
            errors.BACKEND_UNAVAILABLE,
            "the C++ extension umlos_cuda._native is not built (no C++ compiler when umlos-cuda was "
            f"installed, or UMLOS_NO_NATIVE was set: {exc}); install g++ or clang and reinstall "
            "umlos-cuda, or use backend 'numpy' (same results)",
        ) from exc
    return NativeBackend(_native)
