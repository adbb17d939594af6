"""Packed plans: each microbatch is rows of ``max_length`` tokens, each row several samples.

With a :class:`~umlos_cuda.batching.packing.config.PackingConfig` in
``BatchingConfig.pack`` (``plan build --pack``), step 3 of the planner
(cutting) packs instead of padding; the order, the buckets and the
interleaving are unchanged:

1. each bucket's samples, in the epoch's order, are packed by
   :func:`pack_lengths` (the pack mode, ``max_length``, ``separator_len``)
   into rows numbered in the order they are opened; a row lists its samples
   in epoch order;
2. consecutive rows form a microbatch, ``rows_per_microbatch =
   token_budget // max_length`` of them (the bucket's last microbatch may
   hold fewer), so every microbatch is at most ``rows x max_length <=
   token_budget`` tokens; its ``max_len`` is ``max_length`` and its
   ``samples`` are its rows' samples, row after row.

With no bucket edges (one bucket) every length shares rows; with edges,
each bucket packs its own samples. Greedy sorts a bucket's samples of the
epoch longest first, so its first microbatches hold the long samples; first-
and best-fit keep rows near the epoch's order.

Two arrays per epoch hold the rows: ``row_offsets`` (int64, rows + 1: row
``r`` is ``samples[row_offsets[r]:row_offsets[r + 1]]``) and ``pack_rows``
(int64, M + 1: microbatch ``j`` is rows ``pack_rows[j]`` to
``pack_rows[j + 1]``). :func:`check_packs` checks them (``plan verify``).
"""

from __future__ import annotations

import numpy as np

from ... import errors
from ...errors import UmlosError
from ..packing.pack import pack_lengths
from ..packing.config import PackingConfig
from ..packing.metrics import PackingMetrics


def pack_bucket(bucket_lengths: np.ndarray, pack: PackingConfig, rows_per_microbatch: int):
    """One bucket's rows and microbatches (relative to the bucket).

    Returns ``(permutation, starts, microbatch_rows, row_sizes)``: the
    bucket's samples laid out row by row are ``section[permutation]``;
    microbatch ``j`` starts at sample ``starts[j]`` and holds
    ``microbatch_rows[j]`` rows; ``row_sizes`` is each row's sample count.
    """
    row_of = pack_lengths(bucket_lengths, pack.max_length, pack.mode, pack.separator_len)
    permutation = np.argsort(row_of, kind="stable")
    row_sizes = np.bincount(row_of).astype(np.int64)
    rows = row_sizes.shape[0]
    first_rows = np.arange(0, rows, rows_per_microbatch, dtype=np.int64)
    microbatch_rows = np.diff(np.append(first_rows, rows))
    row_starts = np.concatenate(([0], np.cumsum(row_sizes)[:-1]))
    return permutation, row_starts[first_rows], microbatch_rows, row_sizes


def arrange_rows(row_sizes: list[np.ndarray], microbatch_rows: list[np.ndarray], order: np.ndarray,
                 gather) -> tuple[np.ndarray, np.ndarray]:
    """``(row_offsets, pack_rows)`` of the epoch once its microbatches (given
    bucket by bucket) are put in the interleaved ``order``."""
    sizes = np.concatenate(row_sizes)
    per_batch = np.concatenate(microbatch_rows)
    first_row = np.concatenate(([0], np.cumsum(per_batch)[:-1]))
    pack_rows = np.zeros(order.shape[0] + 1, dtype=np.int64)
    np.cumsum(per_batch[order], out=pack_rows[1:])
    arranged = gather(sizes, first_row[order], per_batch[order], pack_rows)
    row_offsets = np.zeros(arranged.shape[0] + 1, dtype=np.int64)
    np.cumsum(arranged, out=row_offsets[1:])
    return row_offsets, pack_rows


def select_rows(row_offsets: np.ndarray, pack_rows: np.ndarray, chosen: np.ndarray, gather):
    """``(row_offsets, pack_rows)`` of the microbatches ``chosen`` (a shard)."""
    row_offsets, pack_rows = np.asarray(row_offsets, dtype=np.int64), np.asarray(pack_rows, dtype=np.int64)
    per_batch = (pack_rows[1:] - pack_rows[:-1])[chosen]
    new_pack_rows = np.zeros(chosen.shape[0] + 1, dtype=np.int64)
    np.cumsum(per_batch, out=new_pack_rows[1:])
    sizes = gather(np.diff(row_offsets), pack_rows[chosen], per_batch, new_pack_rows)
    new_row_offsets = np.zeros(sizes.shape[0] + 1, dtype=np.int64)
    np.cumsum(sizes, out=new_row_offsets[1:])
    return new_row_offsets, new_pack_rows


def row_tokens(row_offsets: np.ndarray, samples: np.ndarray, lengths: np.ndarray, separator_len: int) -> np.ndarray:
    """Tokens each row holds: its samples' lengths plus the separators between them."""
    row_offsets = np.asarray(row_offsets, dtype=np.int64)
    if row_offsets.shape[0] < 2:
        return np.zeros(0, dtype=np.int64)
    cumulative = np.concatenate(([0], np.cumsum(np.asarray(lengths)[np.asarray(samples)], dtype=np.int64)))
    counts = np.diff(row_offsets)
    return np.diff(cumulative[row_offsets]) + separator_len * np.maximum(counts - 1, 0)


def plan_packing_metrics(row_offsets, samples, lengths, pack: PackingConfig) -> PackingMetrics:
    """:class:`PackingMetrics` of an epoch's rows (loss tokens are unknown in a plan)."""
    rows = int(np.asarray(row_offsets).shape[0]) - 1
    segments = int(np.asarray(samples).shape[0])
    tokens = int(np.asarray(lengths, dtype=np.int64)[np.asarray(samples)].sum()) if segments else 0
    return PackingMetrics(pack.max_length, segments, segments, rows, tokens, pack.separator_len * (segments - rows))


def check_packs(epoch, pack: PackingConfig, token_budget: int, lengths: np.ndarray) -> None:
    """The row invariants of a packed epoch (PLAN_PACKS_INVALID, PLAN_BUDGET_EXCEEDED)."""
    e = epoch.epoch
    offsets = np.asarray(epoch.offsets, dtype=np.int64)
    if epoch.row_offsets is None or epoch.pack_rows is None:
        raise _packs(f"epoch {e}: the plan packs but the epoch has no rows (row_offsets.npy, pack_rows.npy)")
    row_offsets = np.asarray(epoch.row_offsets, dtype=np.int64)
    pack_rows = np.asarray(epoch.pack_rows, dtype=np.int64)
    m, s = offsets.shape[0] - 1, int(offsets[-1])
    if pack_rows.shape != (m + 1,) or int(pack_rows[0]) != 0 or int(pack_rows[-1]) != row_offsets.shape[0] - 1:
        raise _packs(f"epoch {e}: pack_rows must hold {m + 1} row bounds from 0 to the number of rows")
    if row_offsets.shape[0] < 1 or int(row_offsets[0]) != 0 or int(row_offsets[-1]) != s:
        raise _packs(f"epoch {e}: row_offsets must run from 0 to the {s} samples")
    if m and int(np.diff(pack_rows).min()) < 1:
        raise _packs(f"epoch {e}: microbatch {int(np.argmin(np.diff(pack_rows)))} has no row")
    if row_offsets.shape[0] > 1 and int(np.diff(row_offsets).min()) < 1:
        raise _packs(f"epoch {e}: row {int(np.argmin(np.diff(row_offsets)))} is empty")
    if not np.array_equal(row_offsets[pack_rows], offsets):
        j = int(np.flatnonzero(row_offsets[pack_rows] != offsets)[0])
        raise _packs(f"epoch {e}: the rows of microbatch {j} do not hold exactly its samples")
    bad = np.flatnonzero(np.asarray(epoch.max_len, dtype=np.int64) != pack.max_length)
    if bad.size:
        raise _packs(f"epoch {e}: microbatch {int(bad[0])} has max_len {int(epoch.max_len[bad[0]])}; "
                     f"a packed plan pads every row to {pack.max_length}")
    used = row_tokens(row_offsets, epoch.samples, lengths, pack.separator_len)
    over = np.flatnonzero(used > pack.max_length)
    if over.size:
        r = int(over[0])
        raise _packs(f"epoch {e}: row {r} holds {int(used[r])} tokens (separators included); "
                     f"pack max_length is {pack.max_length}")
    rows = np.diff(pack_rows)
    heavy = np.flatnonzero(rows * pack.max_length > token_budget)
    if heavy.size:
        j = int(heavy[0])
        raise UmlosError(errors.PLAN_BUDGET_EXCEEDED,
                         f"epoch {e}: microbatch {j} holds {int(rows[j])} rows x {pack.max_length} = "
                         f"{int(rows[j]) * pack.max_length} tokens; the budget is {token_budget}",
                         operator=errors.BATCH_PLAN_OPERATOR)


def _packs(message: str) -> UmlosError:
    return UmlosError(errors.PLAN_PACKS_INVALID, message, operator=errors.BATCH_PLAN_OPERATOR)
