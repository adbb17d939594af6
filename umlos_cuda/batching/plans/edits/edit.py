"""An edit of a plan: which of its units a derived plan leaves out, named by unit, never by step.

What goes in: a plan of any kind (anything with ``num_epochs`` and ``epoch_microbatches``) and what a user asks to
skip: the steps ``A .. B - 1`` of a run at world size ``W`` (``B`` units a rank a step) from the cursor ``start``,
steps being those of ``plan explain`` (:mod:`..explain.steps`). What comes out: a :class:`SkipUnits`, the canonical
edit: per epoch, the sorted, disjoint ranges ``[first, stop)`` of the parent's units left out. A step names units,
so an edit asked at one world size is the same edit read at any other: the derived plan's order does not depend on
the world size that asked for it, and that world size is kept only as the words of the request (``asked``), which
the fingerprint does not cover.

The units kept keep their order; a unit before the first one left out keeps its index, so a run that trained the
parent up to the edit's step stands at the same cursor in the derived plan (:meth:`SkipUnits.parent_index`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from .... import checks, errors
from ..explain.steps import locate_steps, passes
from ..plan import plan_error

#: The one operation an edit has today, as the canonical record names it.
SKIP_UNITS = "skip_units"
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
    known, its ranges sorted, disjoint, not empty and inside the parent's epochs (PLAN_FORMAT_INVALID)."""
    fields = dict.fromkeys(("op", "units", "asked"), checks.field(checks.anything))
    record = checks.record(record, fields, fail=_format, what=f"{where} edit")
    checks.equal(record["op"], f"{where} edit op", SKIP_UNITS, fail=_format)
    listed = checks.sequence(record["units"], f"{where} edit units", fail=_format, empty=False)
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
    return SkipUnits(tuple(ranges), record["asked"])
