"""What the host backends (``numpy``, ``native``) share: windows, output arrays, sequential indices.

A window of an epoch is the positions ``start + i * stride`` for
``i < count``: ``stride = 1`` is a contiguous window, ``stride = W`` one rank's
share of a rank-strided order (``DistributedSampler``). Every backend checks
it with :func:`check_window` before computing anything.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from .. import checks, errors
from ..dtypes import check_fits, output_dtype
from ..errors import UINT64_MAX, UmlosError


def backend_error(code: str, message: str) -> UmlosError:
    """An error of a backend, its record naming ``umlos_cuda.backends`` (a
    NextBatch call names itself instead, docs/errors.md)."""
    return UmlosError(code, message, operator=errors.BACKEND_OPERATOR)


def last_position(start: int, count: int, stride: int) -> int:
    """The last position of a window (``start`` when it is empty), after checking its arguments."""
    start, count, stride = (checks.integer(value, what, 0, None, fail=partial(backend_error, errors.INVALID_ARGUMENT),
                                           message=checks.NON_NEGATIVE)
                            for value, what in ((start, "start"), (count, "count"), (stride, "stride")))
    if stride < 1:
        raise backend_error(errors.INVALID_ARGUMENT, f"stride must be at least 1, got {stride}")
    return int(start) + max(int(count) - 1, 0) * int(stride)


def check_window(n: int, start: int, count: int, stride: int = 1) -> None:
    """Refuse with GLOBAL_POSITION_EXCEEDS_CARDINALITY a window that leaves the epoch's ``n`` positions."""
    last = last_position(start, count, stride)
    if (count and last >= n) or start > n:
        shown = f"[{start}, {start + count})" if stride == 1 else f"{start}, {start + stride}, ..., {last}"
        raise backend_error(
            errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY, f"positions {shown} are outside the epoch's {n} positions"
        )


def host_output(out, count: int, dtype, largest: int) -> np.ndarray:
    """The array to write: ``out`` checked, or a new one of ``dtype`` (default uint64).

    ``largest`` is the largest index the call can write; a dtype that cannot
    hold it is OUTPUT_DTYPE_OVERFLOW, before anything is written.
    """
    if out is None:
        resolved = output_dtype(dtype)
    else:
        if (
            not isinstance(out, np.ndarray)
            or out.shape != (count,)
            or not out.flags.c_contiguous
            or not out.flags.writeable
        ):
            raise backend_error(
                errors.INVALID_ARGUMENT,
                f"out must be a writable, contiguous NumPy array of shape ({count},), got {type(out).__name__} "
                f"{getattr(out, 'shape', '')}",
            )
        resolved = output_dtype(out.dtype)
        if dtype is not None and output_dtype(dtype) != resolved:
            raise backend_error(errors.INVALID_ARGUMENT,
                                f"dtype {np.dtype(dtype).name} differs from out's {resolved.name}")
    check_fits(resolved, largest, f"index {largest}")
    return np.empty(count, dtype=resolved) if out is None else out


class HostBackend:
    """The part of the backend protocol that is the same on every host backend."""

    name = "host"
    xp = np

    def sequential(self, start: int, count: int, out=None, *, stride: int = 1, dtype=None, stream=None):
        """``start, start + stride, ..., start + (count - 1) * stride`` (eval / infer positions
        are the indices). ``stream`` is accepted for the protocol and ignored on the host."""
        last = last_position(start, count, stride)
        if last > UINT64_MAX:
            raise backend_error(errors.UINT64_OVERFLOW, f"positions up to {last} pass 2^64 - 1")
        out = host_output(out, count, dtype, last if count else 0)
        out[:] = np.arange(count, dtype=out.dtype)
        if stride != 1:
            out *= out.dtype.type(stride)
        out += out.dtype.type(start)
        return out
