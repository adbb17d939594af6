"""An edit of a plan: which of its units (or rows) a derived plan leaves out, named by unit, never by step.

What goes in: a plan of any kind (anything with ``num_epochs`` and ``epoch_microbatches``) and what a user asks to
skip: the steps ``A .. B - 1`` of a run at world size ``W`` (``B`` units a rank a step) from the cursor ``start``,
steps being those of ``plan explain`` (:mod:`..explain.steps`). What comes out: a :class:`SkipUnits`, the canonical
edit: per epoch, the sorted, disjoint ranges ``[first, stop)`` of the parent's units left out. A step names units,
so an edit asked at one world size is the same edit read at any other: the derived plan's order does not depend on
the world size that asked for it, and that world size is kept only as the words of the request (``asked``), which
the fingerprint does not cover.

The units kept keep their order; a unit before the first one left out keeps its index, so a run that trained the
parent up to the edit's step stands at the same cursor in the derived plan (:meth:`SkipUnits.parent_index`).

:class:`SkipRows` (``--skip-samples``) leaves dataset rows out of the parent's microbatches from a cursor on (each
microbatch keeps its other rows, its bucket and ``max_len``); a microbatch left with no row is left out as a unit,
so it is a :class:`SkipUnits` of those units too. Only plans of unpacked microbatches take it: a packed row or a
cut sample is a layout of several documents, which leaving one out would change.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import os
from itertools import pairwise

import numpy as np

from .... import checks, errors
from ....errors import UmlosError
from ..explain.steps import locate_steps, passes
from ..plan import plan_error

#: The operations of an edit, as the canonical record names them.
SKIP_UNITS = "skip_units"
SKIP_ROWS = "skip_rows"
#: Most rows one ``--skip-samples`` edit leaves out.
MAX_ROWS = 1 << 24
#: Most ranges one edit lists (a loss spike is a few steps: each step is at most one range per epoch).
MAX_RANGES = 1 << 16

_format = partial(plan_error, errors.PLAN_FORMAT_INVALID)
_config = partial(plan_error, errors.BATCHING_CONFIG_INVALID)


@dataclass(frozen=True)
class SkipUnits:
    """Units of a parent plan left out: ``ranges`` is ``((epoch, first, stop), ...)``, sorted, disjoint, none
    empty; ``asked`` is the request in words (``{"skip_steps": [A, B], "world_size", "batch_size", "start"}``),
    recorded beside the edit but not part of it."""

    ranges: tuple[tuple[int, int, int], ...]
    asked: dict | None = None

    def canonical(self) -> dict:
        """What the fingerprint covers: the operation and its ranges."""
        return {"op": SKIP_UNITS, "units": [list(r) for r in self.ranges]}

    def kept(self, epoch: int, k: int, rows: Any) -> np.ndarray | None:
        """Which of the rows of the parent's unit ``k`` of ``epoch`` stay (None: all of them)."""
        return None

    def to_dict(self) -> dict:
        """The record meta.json and ``plan explain`` hold: :meth:`canonical` and ``asked``."""
        return {**self.canonical(), "asked": self.asked}

    def skipped(self, epoch: int) -> int:
        """Units of ``epoch`` left out."""
        return sum(stop - first for e, first, stop in self.ranges if e == epoch)

    def skipped_total(self) -> int:
        """Units left out, every epoch."""
        return sum(stop - first for _, first, stop in self.ranges)

    def parent_index(self, epoch: int, k: int) -> int:
        """The parent's unit that the derived plan's unit ``k`` of ``epoch`` is: ``k`` plus the units left out
        before it (O(ranges of the epoch))."""
        for e, first, stop in self.ranges:
            if e == epoch and k >= first:
                k += stop - first
        return k


@dataclass(frozen=True)
class SkipRows(SkipUnits):
    """Dataset ``rows`` (sorted, distinct) left out of every microbatch from the parent's cursor ``start`` on;
    ``ranges`` are the microbatches that leaves empty (left out as units)."""

    rows: tuple[int, ...] = ()
    start: tuple[int, int] = (0, 0)

    def canonical(self) -> dict:
        return {"op": SKIP_ROWS, "from": list(self.start), "rows": list(self.rows),
                "units": [list(r) for r in self.ranges]}

    def kept(self, epoch: int, k: int, rows: Any) -> np.ndarray | None:
        if (epoch, k) < self.start:
            return None
        return ~np.isin(np.asarray(rows, dtype=np.int64), np.asarray(self.rows, dtype=np.int64))


def skip_rows(plan: Any, rows: Any, chunks: Any, *, start: tuple[int, int] = (0, 0),
              asked: dict | None = None) -> SkipRows:
    """The edit that leaves the dataset ``rows`` out of ``plan``'s microbatches from the cursor ``start`` on;
    ``chunks(epoch, first)`` gives the rows of the parent's microbatches ``first ..`` of ``epoch`` as
    ``(k0, offsets, samples)`` chunks (:func:`~.plan.unit_row_chunks` of the plan: a windowed plan's windows, a
    whole plan's epochs), each chunk scanned as arrays: every microbatch from ``start`` is read once, O(plan) in
    NumPy.
    BATCHING_CONFIG_INVALID when a row is in no microbatch from ``start`` on (a row of another dataset, one the plan
    took before the edit, or one it skips)."""
    from ..plan import check_cursor

    check_cursor(plan, *start)
    wanted = np.unique(np.asarray(rows, dtype=np.int64))
    if wanted.size == 0 or wanted.size > MAX_ROWS:
        raise _config(f"--skip-samples lists {wanted.size} rows; an edit leaves out 1 to {MAX_ROWS}")
    found = np.zeros(wanted.size, dtype=bool)
    empty: list[tuple[int, int, int]] = []
    for epoch in range(start[0], plan.num_epochs):
        for k0, offsets, samples in chunks(epoch, start[1] if epoch == start[0] else 0):
            bounds = np.asarray(offsets, dtype=np.int64)
            held = np.asarray(samples[int(bounds[0]):int(bounds[-1])], dtype=np.int64)
            at = np.minimum(np.searchsorted(wanted, held), wanted.size - 1)
            hit = wanted[at] == held
            if not hit.any():
                continue
            found[at[hit]] = True
            ones = np.concatenate(([0], np.cumsum(hit)))  # hits before each position
            bounds = bounds - bounds[0]
            full = np.flatnonzero(ones[bounds[1:]] - ones[bounds[:-1]] == np.diff(bounds))  # every row left out
            empty += [(epoch, k0 + i, k0 + i + 1) for i in full.tolist()]
    if not found.all():
        missing = wanted[~found][:8].tolist()
        raise _config(f"rows {missing}{' ...' if (~found).sum() > 8 else ''} are in no microbatch of the plan from "
                      f"cursor {start[0]}:{start[1]} on: list rows the plan trains from there (not rows of another "
                      "dataset, trained before the edit's step, or skipped by the plan)")
    return SkipRows(merged(empty), asked, tuple(wanted.tolist()), (int(start[0]), int(start[1])))


def read_rows(path: Any) -> list[int]:
    """The dataset rows listed in the text file ``path``, one a line (blank lines skipped), read through the
    bounded reader: at most :data:`MAX_ROWS` lines of at most 40 bytes, each a non-negative integer
    (BATCHING_CONFIG_INVALID naming the file and the line otherwise)."""
    from ....files import reader

    where = os.fspath(path)
    rows: list[int] = []
    try:
        for number, raw in reader.iter_lines(where, _config, max_line_bytes=40, max_lines=MAX_ROWS):
            text = raw.decode("ascii", "replace").strip()
            if text:
                rows.append(checks.integer_text(text, f"{where} line {number + 1}", 0, (1 << 63) - 1, fail=_config))
    except FileNotFoundError:
        raise _config(f"{where} does not exist: --skip-samples reads a file of dataset rows, one a line") from None
    return rows


def skip_steps(plan: Any, first: int, stop: int, *, world_size: int = 1, batch_size: int = 1,
               start: tuple[int, int] = (0, 0)) -> SkipUnits:
    """The edit that leaves out the units of steps ``first .. stop - 1`` of a run over ``plan`` at ``world_size``
    ranks, ``batch_size`` units a rank a step, from the cursor ``start`` (steps as ``plan explain`` counts them:
    PLAN_CURSOR_INVALID for a step past the run's end; BATCHING_CONFIG_INVALID for an empty range). The steps of
    one pass are consecutive units, so the edit is one range per epoch the steps touch: O(epochs), whatever the
    number of steps."""
    first = checks.integer(first, "first step", 0, None, fail=_config, message=checks.NON_NEGATIVE)
    stop = checks.integer(stop, "stop step", first + 1, None, fail=_config,
                          message="{name} is {value!r}: A:B skips the steps A to B - 1, so B must be at least {low}")
    locate_steps(plan, stop - 1, 1, world_size, batch_size, start)  # every argument checked, the last step located
    width = int(world_size) * int(batch_size)
    ranges: list[tuple[int, int, int]] = []
    passed = 0  # steps of the passes before this one
    for epoch, cursor, length in passes(plan, start):
        steps = -(-(length - cursor) // width)
        low, high = max(first, passed) - passed, min(stop, passed + steps) - passed
        if low < high:
            ranges.append((epoch, cursor + low * width, min(length, cursor + high * width)))
        passed += steps
        if passed >= stop:
            break
    asked = {"skip_steps": [first, stop], "world_size": int(world_size), "batch_size": int(batch_size),
             "start": [int(start[0]), int(start[1])]}
    return SkipUnits(merged(ranges), asked)


def merged(ranges: list[tuple[int, int, int]]) -> tuple[tuple[int, int, int], ...]:
    """``ranges`` sorted, touching or overlapping ones joined."""
    out: list[list[int]] = []
    for epoch, first, stop in sorted(ranges):
        if out and out[-1][0] == epoch and first <= out[-1][2]:
            out[-1][2] = max(out[-1][2], stop)
        else:
            out.append([epoch, first, stop])
    return tuple((e, f, s) for e, f, s in out)


def read_edit(record: Any, plan: Any, where: str) -> SkipUnits:
    """The edit recorded in ``where`` (meta.json's ``edit``), checked against the parent ``plan``: the operation
    known, its ranges sorted, disjoint and inside the parent's epochs (not empty: a ``skip_units`` edit), its rows
    sorted, distinct and non-negative and its cursor inside the parent (a ``skip_rows`` edit) (PLAN_FORMAT_INVALID)."""
    op = record.get("op") if isinstance(record, dict) else None
    names = ("op", "units", "asked") + (("from", "rows") if op == SKIP_ROWS else ())
    record = checks.record(record, dict.fromkeys(names, checks.field(checks.anything)), fail=_format,
                           what=f"{where} edit")
    checks.choice(record["op"], f"{where} edit op", (SKIP_UNITS, SKIP_ROWS), fail=_format)
    listed = checks.sequence(record["units"], f"{where} edit units", fail=_format, empty=op == SKIP_ROWS)
    if len(listed) > MAX_RANGES:
        raise _format(f"{where}: the edit lists {len(listed)} ranges; at most {MAX_RANGES}")
    ranges: list[tuple[int, int, int]] = []
    for i, item in enumerate(listed):
        what = f"{where} edit units[{i}]"
        if not isinstance(item, list) or len(item) != 3:
            raise _format(f"{what}: a range is [epoch, first, stop]")
        epoch = checks.integer(item[0], f"{what} epoch", 0, plan.num_epochs - 1, fail=_format, strict=True)
        limit = plan.epoch_microbatches(epoch)
        first = checks.integer(item[1], f"{what} first", 0, limit - 1, fail=_format, strict=True)
        stop = checks.integer(item[2], f"{what} stop", first + 1, limit, fail=_format, strict=True)
        ranges.append((epoch, first, stop))
    if tuple(ranges) != merged(ranges):
        raise _format(f"{where}: the edit's ranges must be sorted and disjoint, none touching the next")
    if record["asked"] is not None and not isinstance(record["asked"], dict):
        raise _format(f"{where}: edit asked must be an object or null")
    if op != SKIP_ROWS:
        return SkipUnits(tuple(ranges), record["asked"])
    start = checks.sequence(record["from"], f"{where} edit from", fail=_format, empty=False)
    if len(start) != 2 or not all(checks.is_integer(v, strict=True) for v in start):
        raise _format(f"{where}: edit from is a plan cursor [epoch, index]")
    from ..plan import check_cursor

    try:
        check_cursor(plan, start[0], start[1])
    except UmlosError as exc:
        raise _format(f"{where}: edit from: {exc.message}") from None
    rows = checks.sequence(record["rows"], f"{where} edit rows", fail=_format, empty=False)
    if len(rows) > MAX_ROWS or not all(checks.is_integer(v, strict=True) and v >= 0 for v in rows) \
            or any(b <= a for a, b in pairwise(rows)):
        raise _format(f"{where}: edit rows must be 1 to {MAX_ROWS} sorted, distinct, non-negative integers")
    return SkipRows(tuple(ranges), record["asked"], tuple(rows), (start[0], start[1]))
