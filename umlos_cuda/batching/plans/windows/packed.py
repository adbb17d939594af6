"""Windowed packed plans: what a window of a packed plan counts, and the rows a check replans.

A packed windowed plan (``BatchingConfig.pack`` set) is the packed plan of :mod:`..packing`
applied to each window of the engine's order under the windows' edge rule ``flush``:
window ``w``'s samples, bucket by bucket in position order, are packed by the pack mode
into rows of ``pack.max_length`` tokens, and every ``token_budget // max_length``
consecutive rows of a bucket form a microbatch. A window's last row and last microbatch of
each bucket close with the window; no row carries a sample of the next window. So the window
with ``W >= N`` is the whole-epoch packed plan, array for array (``row_offsets`` and
``pack_rows`` included), and each window of a smaller ``W`` is the whole-epoch packer run on
that window's samples alone (docs/batching.md, "Windowed packed plans").

The index keeps its five columns (:data:`~.window.COUNT_FIELDS`): a packed microbatch's
padded tokens are its rows times ``max_length`` (as in a whole-epoch packed plan's
statistics), so a window's rows are its ``padded_tokens // max_length`` and no column is
added: unpacked windowed plans and their fingerprints stay as they were.
"""

from __future__ import annotations

import numpy as np

from .... import errors
from ..config import BatchingConfig
from ..packing import pack_bucket, row_tokens
from ..plan import plan_error
from ..planner import EpochArrays


def count_packed(lengths: np.ndarray, config: BatchingConfig) -> tuple[int, int, int, int, int]:
    """The counts (:data:`~.window.COUNT_FIELDS`, in order) of the packed microbatches cut from ``lengths``
    in this order; :func:`~.window.count_lengths` makes them a ``WindowCounts``."""
    pack, per = config.pack, config.rows_per_microbatch
    assert pack is not None and per is not None  # only packed configs come here
    skipped, groups = config.bucket_spec.groups(lengths)
    microbatches = rows = tokens = 0
    for _, bucket_lengths in groups:
        tokens += int(bucket_lengths.sum(dtype=np.uint64))
        _, starts, _, row_sizes = pack_bucket(bucket_lengths, pack, per)
        microbatches += int(starts.shape[0])
        rows += int(row_sizes.shape[0])
    return microbatches, int(lengths.shape[0]) - skipped, skipped, tokens, rows * pack.max_length


def padded_rows(arrays: EpochArrays) -> np.ndarray:
    """Rows each microbatch pads: its packed rows in a packed plan, else its samples."""
    if arrays.pack_rows is not None:
        return np.diff(np.asarray(arrays.pack_rows, dtype=np.int64))
    return np.diff(np.asarray(arrays.offsets, dtype=np.int64))


def microbatch_packs(arrays: EpochArrays, local: int, ids: tuple[str, ...]):
    """Microbatch ``local``'s packed rows: ``(packs, pack_sizes)`` (the ids of each row, the samples each row
    holds), or ``(None, None)`` in an unpacked plan; windowed and mixed plans' microbatches both read them here."""
    if arrays.pack_rows is None or arrays.row_offsets is None:
        return None, None
    bounds = arrays.row_offsets[int(arrays.pack_rows[local]):int(arrays.pack_rows[local + 1]) + 1]
    pack_sizes = tuple(int(v) for v in np.diff(bounds))
    cuts = np.asarray(bounds, dtype=np.int64) - int(bounds[0])
    return tuple(ids[a:b] for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist())), pack_sizes


def check_window_rows(arrays: EpochArrays, lengths: np.ndarray, config: BatchingConfig, where: str) -> None:
    """A replanned packed window's rows: bounds that agree with its microbatches, no empty row, no row
    over ``max_length`` tokens (separators included) (PLAN_PACKS_INVALID). ``lengths``: the lengths of
    ``arrays.samples``, in order (dataset rows of a windowed plan, mixture positions of a mixed one)."""
    pack = config.pack
    if pack is None:
        return
    if arrays.row_offsets is None or arrays.pack_rows is None:
        raise _packs(f"{where}: the plan packs but the window has no rows")
    row_offsets = np.asarray(arrays.row_offsets, dtype=np.int64)
    pack_rows = np.asarray(arrays.pack_rows, dtype=np.int64)
    if not np.array_equal(row_offsets[pack_rows], np.asarray(arrays.offsets, dtype=np.int64)):
        raise _packs(f"{where}: the rows of a microbatch do not hold exactly its samples")
    if row_offsets.shape[0] > 1 and int(np.diff(row_offsets).min()) < 1:
        raise _packs(f"{where}: a row is empty")
    local = np.arange(arrays.samples.shape[0], dtype=np.int64)
    used = row_tokens(row_offsets, local, np.asarray(lengths), pack.separator_len)
    over = np.flatnonzero(used > pack.max_length)
    if over.size:
        raise _packs(f"{where}: row {int(over[0])} holds {int(used[over[0]])} tokens (separators included); "
                     f"pack max_length is {pack.max_length}")


def _packs(message: str):
    return plan_error(errors.PLAN_PACKS_INVALID, message)
