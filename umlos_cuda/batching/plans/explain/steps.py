"""Which units of a plan each rank trains on at a step: the samplers' lockstep rule, as arithmetic.

What goes in: a plan's epochs and their lengths in cursor units (a :class:`~..windows.resume.ResumablePlan`'s
``num_epochs`` and ``epoch_microbatches``: microbatches, or samples of pretraining sequences), the plan cursor
the run starts (or resumes) from, a world size ``W`` and ``B``, the units one rank takes a step (1 for a plan of
microbatches; ``SequenceBatchSampler``'s ``batch_size`` for a plan of samples). What comes out: for step ``K``
counted from that cursor, its :class:`Step`: the epoch, the cursor before it, and each rank's units.

The rule is the one ``PlanBatchSampler``, ``SequenceBatchSampler`` and ``PlanTrainerData`` follow
(umlos_cuda/torch/, docs/batching.md "Training loop" and "Resuming a windowed plan"): one pass runs from the
cursor ``c`` to the end of its epoch, rank ``r`` taking the units ``k >= c`` with ``k mod W == r``, ``B`` of them
a step, so step ``s`` of the pass takes the ``W B`` consecutive units ``[c + s W B, c + (s + 1) W B)`` (each
rank those of its residue) and the pass has ``ceil((M - c) / (W B))`` steps; the last may be short, a rank
without a unit in it taking none. The next pass is the next epoch's, from 0. Nothing here depends on what a
unit holds, so every plan kind is stepped by it, and locating step ``K`` costs O(epochs).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from .... import checks, errors
from ..plan import check_cursor, plan_error
from ..sharding import check_rank

#: Most steps one explanation covers (each lists every rank's units): a range is for a loss spike, not a run.
MAX_STEPS = 1 << 12

_cursor = partial(plan_error, errors.PLAN_CURSOR_INVALID)


@dataclass(frozen=True)
class Step:
    """Step ``step``: in ``epoch``, from the plan cursor ``cursor`` (the first unit it takes), ``units`` units in
    all (``W B``, fewer at an epoch's end)."""

    step: int
    epoch: int
    cursor: int
    units: int
    world_size: int
    batch_size: int

    def rank_units(self, rank: int) -> range:
        """The units rank ``rank`` takes in this step (global indices in the epoch, in the order it takes them)."""
        first = self.cursor + (rank - self.cursor) % self.world_size
        return range(first, self.cursor + self.units, self.world_size)


def passes(plan: Any, start: tuple[int, int]):
    """``(epoch, first cursor, units in the epoch)`` of each pass from ``start`` to the plan's end."""
    epoch, index = start
    for e in range(epoch, plan.num_epochs):
        yield e, index if e == epoch else 0, plan.epoch_microbatches(e)


def total_steps(plan: Any, world_size: int, batch_size: int = 1, start: tuple[int, int] = (0, 0)) -> int:
    """Steps of a run over ``plan`` from ``start`` at ``world_size`` ranks, ``batch_size`` units a rank a step."""
    width = world_size * batch_size
    return sum(-(-(length - first) // width) for _, first, length in passes(plan, start))


def locate_steps(plan: Any, step: int, count: int, world_size: int, batch_size: int = 1,
                 start: tuple[int, int] = (0, 0)) -> list[Step]:
    """Steps ``step .. step + count - 1`` of the run (module docstring). PLAN_CURSOR_INVALID for a start cursor
    outside the plan or a step past its end (naming how many steps it has); INVALID_RANK for a world size out of
    range; BATCHING_CONFIG_INVALID for a count or batch size out of range."""
    _, world_size = check_rank(0, world_size)
    config = partial(plan_error, errors.BATCHING_CONFIG_INVALID)
    batch_size = checks.integer(batch_size, "batch_size", 1, 1 << 32, fail=config)
    count = checks.integer(count, "steps", 1, MAX_STEPS, fail=config)
    step = checks.integer(step, "step", 0, None, fail=_cursor, message=checks.NON_NEGATIVE)
    check_cursor(plan, *start)
    width = world_size * batch_size
    out: list[Step] = []
    passed = 0  # steps of the passes before the current one
    for epoch, first, length in passes(plan, start):
        steps = -(-(length - first) // width)
        while len(out) < count and step + len(out) < passed + steps:
            s = step + len(out) - passed
            cursor = first + s * width
            out.append(Step(step + len(out), epoch, cursor, min(width, length - cursor), world_size, batch_size))
        passed += steps
        if len(out) == count:
            return out
    has = f"{passed} step(s), 0 to {passed - 1}" if passed else "no step (the cursor is at the plan's end)"
    raise _cursor(f"step {step + len(out)} is past the plan's end: from cursor {start[0]}:{start[1]} at world size "
                  f"{world_size}" + (f" and batch size {batch_size}" if batch_size > 1 else "") + f" the run has {has}")
