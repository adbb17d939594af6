"""``pack_lengths``: the row of every sequence, from lengths alone.

This is the core that ``pack_sequences`` and packed plans are built on. It
returns one int64 row number per length, rows numbered in the order they
are opened, under the exact definitions of :mod:`.config` (first-fit,
best-fit, greedy; a separator between the sequences of a row).

Implementations, all O(n log n) and bit-for-bit the same:

* ``native``: ``umlos_cuda._packing`` (C++, built by ``pip install`` from
  ``umlos_cuda/_packing.cpp``): a segment tree over the rows' remaining room
  for first-fit, an ordered set keyed by (remaining room, row) for
  best-fit, a counting sort for greedy's order;
* ``python``: :mod:`.trees` (the same trees in Python; slow, but what
  runs without a compiler);
* ``auto`` (default): native when the extension is built, else python.

A length above ``max_length`` is refused (PACKING_SEQUENCE_TOO_LONG):
cutting or skipping is the caller's decision (``OversizePolicy``).
"""

from __future__ import annotations

import numpy as np

from ... import checks, errors
from . import trees as packing_trees
from .config import MAX_PACK_LENGTH, PackingMode, config_error, packing_error

BACKENDS = ("auto", "native", "python")
#: Mode numbers of the native entry point.
_NATIVE_MODES = {PackingMode.FIRST_FIT: 0, PackingMode.BEST_FIT: 1, PackingMode.GREEDY: 2}


def native_module():
    """``umlos_cuda._packing``, or None when the extension was not built."""
    try:
        from ... import _packing  # type: ignore[attr-defined]  # C++, built at install: mypy reads no .so
    except ImportError:
        return None
    return _packing


def pack_lengths(lengths, max_length: int, mode: PackingMode | str = PackingMode.FIRST_FIT,
                 separator_len: int = 0, *, backend: str = "auto") -> np.ndarray:
    """Row number (int64) of each sequence of ``lengths`` (see the module docstring).

    Args:
        lengths: one-dimensional non-negative integers, each at most ``max_length``.
        max_length: tokens per row, in [1, 2^31 - 1].
        mode: ``first_fit``, ``best_fit`` or ``greedy`` (:class:`PackingMode`).
        separator_len: tokens between consecutive sequences of a row.
        backend: ``auto``, ``native`` or ``python``.
    """
    mode = PackingMode.parse(mode)
    max_length = checks.integer(max_length, "max_length", 1, MAX_PACK_LENGTH, fail=config_error)
    separator_len = checks.integer(separator_len, "separator_len", 0, MAX_PACK_LENGTH, fail=config_error)
    if backend not in BACKENDS:
        raise config_error(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    needs = _needs(lengths, max_length, separator_len)
    capacity = max_length + separator_len
    module = native_module() if backend != "python" else None
    if backend == "native" and module is None:
        raise config_error("backend 'native' is unavailable: the extension umlos_cuda._packing is not built "
                           "(reinstall with a C++ compiler), use backend 'auto' or 'python'")
    if needs.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    if module is not None:
        rows = np.empty(needs.shape[0], dtype=np.int64)
        module.pack(needs, capacity, _NATIVE_MODES[mode], rows)
        return rows
    return pack_needs_python(needs, capacity, mode)


def pack_needs_python(needs: np.ndarray, capacity: int, mode: PackingMode) -> np.ndarray:
    """The Python trees on needs (``length + separator_len``) and the capacity."""
    if mode is PackingMode.BEST_FIT:
        return packing_trees.best_fit(needs, capacity)
    if mode is PackingMode.FIRST_FIT:
        return packing_trees.first_fit(needs, capacity)
    order = greedy_order(needs)
    rows = np.empty(needs.shape[0], dtype=np.int64)
    rows[order] = packing_trees.first_fit(needs[order], capacity)
    return rows


def greedy_order(lengths: np.ndarray) -> np.ndarray:
    """Greedy's processing order: a stable sort by length, longest first."""
    return np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")


def _needs(lengths, max_length: int, separator_len: int) -> np.ndarray:
    """Validated lengths plus the separator, as a contiguous int64 array."""
    try:
        array = np.asarray(lengths)
    except (TypeError, ValueError):
        raise config_error("lengths must be a one-dimensional array of non-negative integers") from None
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise config_error(f"lengths must be a one-dimensional array of non-negative integers, got "
                           f"{array.dtype} of shape {array.shape}")
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if array.dtype.kind == "i" and int(array.min()) < 0:
        raise config_error(f"lengths must be non-negative; position {int(np.argmin(array))} is {int(array.min())}")
    longest = int(array.max())
    if longest > max_length:
        over = np.flatnonzero(array > max_length)
        first = ", ".join(f"position {int(i)} ({int(array[i])} tokens)" for i in over[:5])
        raise packing_error(errors.PACKING_SEQUENCE_TOO_LONG,
                            f"{over.size} sequence(s) longer than max_length {max_length}: {first}"
                            f"{', ...' if over.size > 5 else ''}; truncate, split or skip them first "
                            "(PackingConfig oversize)")
    return np.ascontiguousarray(array, dtype=np.int64) + separator_len
