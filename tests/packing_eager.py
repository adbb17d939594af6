"""``pack_sequences`` as it was before its result became lazy: every row laid
out at once, in one :func:`layout_rows` call over all pieces.

Kept (from commit 7cfa97d, unchanged but for returning a plain list) as the
oracle of the lazy :class:`PackedRows`: whatever row range the view lays
out must equal these rows array for array (tests/test_batching_packing.py).
"""

from __future__ import annotations

import operator
from typing import cast

import numpy as np

from umlos_cuda.batching.packing.config import OversizePolicy, PackingConfig, PackingMode
from umlos_cuda.batching.packing.metrics import PackingMetrics
from umlos_cuda.batching.packing.pack import pack_lengths
from umlos_cuda.batching.packing.rows import layout_rows
from umlos_cuda.batching.packing.sequences import as_sequences, oversize_pieces

_INPUT_IDS = operator.attrgetter("input_ids")


def eager_pack_sequences(sequences, max_length: int = 2048, mode="first_fit", *, separator_ids=(),
                         oversize="refuse", config: PackingConfig | None = None, backend: str = "auto"):
    """``(rows, metrics)``: the list of every :class:`PackedRow` and the metrics."""
    if config is None:
        config = PackingConfig(max_length, cast(PackingMode, mode), tuple(separator_ids),
                               cast(OversizePolicy, oversize))
    separator = config.layout_separator()
    items = as_sequences(sequences)
    lengths = np.fromiter(map(len, map(_INPUT_IDS, items)), dtype=np.int64, count=len(items))
    refused = config.oversize is OversizePolicy.REFUSE and bool((lengths > config.max_length).any())
    source, start, piece = oversize_pieces(lengths, config.max_length, config.oversize,
                                           [s.sample_id for s in items] if refused else None)
    rows_of = pack_lengths(piece, config.max_length, config.mode, config.separator_len, backend=backend)
    num_rows = int(rows_of.max()) + 1 if rows_of.size else 0
    order = np.argsort(rows_of, kind="stable")  # pieces grouped by row, input order inside a row
    counts = np.bincount(rows_of, minlength=num_rows)
    sources = source[order]
    cut = np.flatnonzero((start[order] != 0) | (piece[order] != lengths[sources]))  # pieces, not whole items
    pieces = list(map(items.__getitem__, sources.tolist()))
    for p, s, stop in zip(cut.tolist(), start[order][cut].tolist(), (start + piece)[order][cut].tolist()):
        pieces[p] = pieces[p].piece(s, stop)
    rows, loss_tokens = layout_rows(pieces, counts, separator, piece[order], backend=backend)
    over = lengths > config.max_length
    skipped = over & (config.oversize is OversizePolicy.SKIP)
    truncated = over & (config.oversize is OversizePolicy.TRUNCATE)
    metrics = PackingMetrics(
        config.max_length, len(items), int(piece.shape[0]), num_rows, int(piece.sum()),
        config.separator_len * (int(piece.shape[0]) - num_rows), loss_tokens,
        skipped=int(skipped.sum()), truncated=int(truncated.sum()),
        truncated_tokens=int((lengths[truncated] - config.max_length).sum()),
        split=int((over & (config.oversize is OversizePolicy.SPLIT)).sum()),
        skipped_ids=tuple(items[i].sample_id for i in np.flatnonzero(skipped).tolist()),
    )
    return rows, metrics
