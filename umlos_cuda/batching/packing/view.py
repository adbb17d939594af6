"""``PackedRows``: what :func:`pack_sequences` returns, rows laid out on demand.

What goes in: the packing's decision as flat int64 arrays (which piece of
which sequence goes in which row), the sequences themselves and the
separator. What comes out: :class:`~.rows.PackedRow` objects, laid out only
for the rows asked for: one row (``rows[i]``), a range (``rows[a:b]``,
:meth:`PackedRows.rows`), a microbatch at a time
(:meth:`PackedRows.microbatches`), blocks while iterating, or all of them
(:meth:`PackedRows.materialize`).

Laying out every row at once writes four int32 arrays as long as all the
tokens (6 GB for 385 M tokens) before the first row is used; the decision
itself is a few arrays of one number per sequence. So the view keeps the
decision and lays out rows with :func:`~.rows.layout_rows`, the function
that laid out every row before, on just the pieces of the rows asked for:
each row it gives equals that row of an all-at-once layout, array for
array (tests/test_batching_packing.py compares them for every mode and
oversize policy).

The arrays of the decision, in row order (rows numbered as they were
opened, a row's pieces in input order):

* ``row_offsets`` (rows + 1): row ``r`` holds pieces
  ``row_offsets[r]:row_offsets[r + 1]``, the convention of a packed plan's
  ``row_offsets.npy``;
* ``sources``: the sequence (its position in the input) of each piece;
* ``starts``, ``lengths``: where the piece starts in its sequence and its
  tokens (a whole sequence unless it was truncated or split).

The view reads the sequences' arrays when it lays out a row, through one
of the readers of :mod:`.pieces` (``SequenceToPack`` objects, flat token
arrays, a token source): the arrays must not be changed in place in
between (``SequenceToPack`` is frozen; it holds its own copies of what it
was given; flat arrays are the caller's, a token store's are read-only).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence

import numpy as np

from ... import checks
from .config import PackingConfig, config_error
from .metrics import PackingMetrics
from .pieces import ObjectPieces, Pieces
from .rows import PackedRow, SequenceToPack, layout_segments

#: Rows laid out together while iterating (one layout call each block).
ITERATION_BLOCK = 64


class PackedRows(Sequence):
    """The rows of :func:`pack_sequences`, laid out when asked for (see the module docstring).

    ``len``, iteration and indexing behave as on a list of
    :class:`PackedRow`; a slice is a list of the rows it names. ``metrics``
    (:class:`PackingMetrics`) and ``config`` are known without laying out
    any row.
    """

    def __init__(self, sequences: list[SequenceToPack] | Pieces, row_offsets: np.ndarray, sources: np.ndarray,
                 starts: np.ndarray, lengths: np.ndarray, metrics: PackingMetrics, config: PackingConfig,
                 backend: str = "auto") -> None:
        # Where the pieces' arrays come from (.pieces): a list of SequenceToPack, or a reader already.
        self._pieces: Pieces = ObjectPieces(list(sequences)) if isinstance(sequences, list) else sequences
        self.row_offsets = row_offsets
        self.sources = sources
        self.starts = starts
        self.lengths = lengths
        self.metrics = metrics
        self.config = config
        self.backend = backend
        self._separator = config.layout_separator()
        for array in (row_offsets, sources, starts, lengths):
            array.flags.writeable = False  # the decision is shared by every row laid out later

    def __len__(self) -> int:
        return int(self.row_offsets.shape[0]) - 1

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step == 1:
                return self.rows(start, max(start, stop))
            return [self[i] for i in range(start, stop, step)]
        count = len(self)
        row = operator.index(index)
        if not -count <= row < count:
            raise IndexError(f"row {row} out of range for {count} packed rows")
        row %= count  # a negative index counts from the end, as in a list
        return self.rows(row, row + 1)[0]

    def __iter__(self) -> Iterator[PackedRow]:
        for start in range(0, len(self), ITERATION_BLOCK):
            yield from self.rows(start, min(start + ITERATION_BLOCK, len(self)))

    def __repr__(self) -> str:
        return f"PackedRows({len(self)} rows of at most {self.config.max_length} tokens, laid out on demand)"

    @property
    def row_lengths(self) -> np.ndarray:
        """Tokens of each row, separators included (int64; no row laid out)."""
        if len(self) == 0:
            return np.zeros(0, dtype=np.int64)
        tokens = np.add.reduceat(self.lengths, self.row_offsets[:-1])
        return tokens + self.config.separator_len * (np.diff(self.row_offsets) - 1)

    def rows(self, start: int = 0, stop: int | None = None) -> list[PackedRow]:
        """Rows ``start`` to ``stop`` (exclusive), laid out in one pass."""
        count = len(self)
        stop = count if stop is None else stop
        start = checks.integer(start, "start", 0, count, fail=config_error)
        stop = checks.integer(stop, "stop", start, count, fail=config_error)
        if start == stop:
            return []
        first, last = int(self.row_offsets[start]), int(self.row_offsets[stop])
        sources = self.sources[first:last]
        starts, lengths = self.starts[first:last], self.lengths[first:last]
        ids, masks, sample_ids, offsets = self._pieces.segments(sources, starts, lengths)
        counts = np.diff(self.row_offsets[start:stop + 1])
        return layout_segments(ids, masks, sample_ids, offsets, counts, self._separator, lengths.copy(),
                               backend=self.backend)[0]

    def microbatches(self, rows_per_microbatch: int) -> Iterator[list[PackedRow]]:
        """Consecutive rows, ``rows_per_microbatch`` at a time (the last
        microbatch may hold fewer), each laid out when it is reached: a
        packed plan's microbatches are ``token_budget // max_length`` rows."""
        size = checks.integer(rows_per_microbatch, "rows_per_microbatch", 1, None, fail=config_error)
        for start in range(0, len(self), size):
            yield self.rows(start, min(start + size, len(self)))

    def materialize(self) -> list[PackedRow]:
        """Every row, laid out in one pass (all four token arrays at once,
        as ``pack_sequences`` returned them before it was lazy)."""
        return self.rows(0, len(self))
