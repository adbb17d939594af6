"""Output index types: which element types an index array may have, and whether an index fits.

Indices are uint64 by default (docs/spec/nextbatch-v2.md §1: positions and indices
are uint64). ``int64`` and ``int32`` are offered because PyTorch indexes with int64
and many gather kernels take int32, but only when every index the call can
produce fits: an index is never wrapped or truncated. The check runs on the
host before anything is computed or launched, so a refused call has written
nothing.

This module belongs to no backend: the front end (``nextbatch.epoch_indices``)
and every backend that writes typed output (native, CuPy) use the same rules
and raise the same codes.
"""

from __future__ import annotations

import numpy as np

from . import errors
from .errors import UmlosError

#: Output element types, in order of preference (uint64 is the default).
OUTPUT_DTYPES = (np.dtype(np.uint64), np.dtype(np.int64), np.dtype(np.int32))
#: The largest index each output type holds.
DTYPE_MAX = {
    np.dtype(np.uint64): (1 << 64) - 1,
    np.dtype(np.int64): (1 << 63) - 1,
    np.dtype(np.int32): (1 << 31) - 1,
}
_ALLOWED = ", ".join(dtype.name for dtype in OUTPUT_DTYPES)


def output_dtype(dtype) -> np.dtype:
    """``dtype`` as one of OUTPUT_DTYPES (``None`` means uint64); anything else is INVALID_ARGUMENT."""
    if dtype is None:
        return OUTPUT_DTYPES[0]
    try:
        resolved = np.dtype(dtype)
    except TypeError as exc:
        raise UmlosError(errors.INVALID_ARGUMENT, f"dtype must be one of {_ALLOWED}, got {dtype!r}",
                         operator=errors.DTYPES_OPERATOR) from exc
    if resolved not in OUTPUT_DTYPES:
        raise UmlosError(errors.INVALID_ARGUMENT, f"dtype must be one of {_ALLOWED}, got {resolved.name}",
                         operator=errors.DTYPES_OPERATOR)
    return resolved


def check_fits(dtype: np.dtype, largest_index: int, what: str) -> None:
    """Refuse with OUTPUT_DTYPE_OVERFLOW an output type that cannot hold ``largest_index``.

    ``what`` names where the index comes from (``"an epoch of N = ..."``), so the
    message says which input made the type too small.
    """
    if largest_index > DTYPE_MAX[dtype]:
        wider = ", ".join(other.name for other in OUTPUT_DTYPES if DTYPE_MAX[other] >= largest_index)
        raise UmlosError(
            errors.OUTPUT_DTYPE_OVERFLOW,
            f"{what} reaches index {largest_index}, which does not fit in {dtype.name} "
            f"(largest {DTYPE_MAX[dtype]}); use {wider}",
            operator=errors.DTYPES_OPERATOR,
        )
