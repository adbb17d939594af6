"""The units a plan orders: (dataset row, piece, token range), after the split and the over-long policy.

What goes in: the lengths and ids of every dataset row and a
:class:`~.config.BatchingConfig`. What comes out: :class:`Units`, arrays
over the ``U`` units, or None when the config has neither a split nor an
over-long policy (then the units are the rows, whole, and nothing here runs:
plans keep the bytes they always had).

1. the split (:mod:`.splits`) keeps the rows on one side, in row order;
2. the over-long policy (:mod:`.overlong`) makes each kept row zero, one
   or several pieces, in row order then piece order;
3. the planner orders the units: the engine's order over ``U`` positions
   (``plan_manifest(config, U)``), each position a unit, whose length is
   its token range's.

A plan's ``samples`` hold each unit's dataset row (what a token source
reads), and a split plan's ``pieces`` its piece number; the rest (start,
stop, length) follows from the lengths and the config, so it is never
stored: a loaded plan recomputes it, and ``plan verify`` checks that the
plan's entries are units of its configuration.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .overlong import OverlongPolicy, overlong_counts, pieces
from .splits import selected_rows


@dataclass(frozen=True)
class Units:
    """``U`` units: ``rows`` (dataset row), ``pieces`` (piece number), token
    range ``[starts, stops)`` and ``lengths`` (uint32); per dataset row,
    ``first`` (its piece 0's unit, -1 for a row with none) and ``counts``
    (its pieces); ``selected``: the rows on the split's side; ``overlong``:
    what the over-long policy did to them (:func:`.overlong_counts`, stats.json
    ``overlong``), None without a policy."""

    rows: np.ndarray
    pieces: np.ndarray
    starts: np.ndarray
    stops: np.ndarray
    lengths: np.ndarray
    first: np.ndarray
    counts: np.ndarray
    selected: int
    split_pieces: bool
    overlong: dict | None = None

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def index(self, rows, pieces=None) -> np.ndarray:
        """The unit of each ``(row, piece)`` (int64), -1 where there is none."""
        rows = np.asarray(rows, dtype=np.int64)
        piece = np.zeros(rows.shape[0], dtype=np.int64) if pieces is None else np.asarray(pieces, dtype=np.int64)
        inside = (rows >= 0) & (rows < self.first.shape[0])
        safe = np.where(inside, rows, 0)
        ok = inside & (self.first[safe] >= 0) & (piece >= 0) & (piece < self.counts[safe])
        return np.where(ok, self.first[safe] + piece, -1)

    def label(self, unit: int, sample_id) -> str:
        """How stats name a unit: its sample's id, ``"<id>#<piece>"`` for a piece of a split sample."""
        row = int(self.rows[unit])
        name = sample_id(row)
        return f"{name}#{int(self.pieces[unit])}" if self.split_pieces and int(self.counts[row]) > 1 else name

    def record(self) -> dict:
        """meta.json ``units``: the rows on the side and the units they became."""
        return {"samples": self.selected, "units": len(self)}


def plan_units(lengths: np.ndarray, sample_ids: Sequence[str] | None, config) -> Units | None:
    """The :class:`Units` of ``config`` over these rows (None when it has neither split nor over-long policy)."""
    if config.split is None and config.overlong is None:
        return None
    lengths = np.asarray(lengths)
    n = int(lengths.shape[0])
    chosen = selected_rows(sample_ids, n, config.split)
    of, piece, start, stop = pieces(lengths[chosen], config.overlong)
    rows = chosen[of]
    counts = np.bincount(rows, minlength=n).astype(np.int64)
    first = np.full(n, -1, dtype=np.int64)
    units = np.arange(rows.shape[0], dtype=np.int64)
    first[rows[piece == 0]] = units[piece == 0]
    split = config.overlong is not None and config.overlong.policy is OverlongPolicy.SPLIT
    counted = None if config.overlong is None else overlong_counts(lengths[chosen], config.overlong)
    return Units(rows, piece, start, stop, (stop - start).astype(np.uint32), first, counts, int(chosen.shape[0]),
                 split, counted)
