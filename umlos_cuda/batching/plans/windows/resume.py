"""Resuming a windowed plan at any step and any world size, from the checkpoint store's plan cursor.

What goes in: a plan answering :class:`ResumablePlan` (a :class:`~.plan.WindowedPlan`, a windowed
packed plan, a :class:`~.mixed.MixedPlan`), a rank and a world size ``R``, and a cursor
``(epoch, microbatch_index)``. What comes out: :class:`WindowedRankReader`, this rank's
microbatches from the cursor on, and its cursor as a
:class:`~..checkpoint_kinds.PlanCursor` (the ``plan`` cursor kind the checkpoint store
already saves: ``{plan_fingerprint, epoch, microbatch_index}``, no new kind).

The cursor is global, as for whole plans (:mod:`..sharding`, ``PlanBatchSampler``): the next
global microbatch ``c`` of the epoch's one sequence, the same number at every world size. From
``c``, rank ``r`` of ``R`` takes the global microbatches ``k >= c`` with ``k mod R == r``, so
each lockstep step consumes the ``R`` consecutive microbatches ``[c, c + R)`` (each rank one)
and the cursor after ``s`` steps is ``c + s R``; at the epoch's end it moves to the next epoch's
0 (or stays at ``M``, "done", after the last epoch). When ``M - c`` is not a multiple of ``R``
the last step is short: ranks without a microbatch in it yield nothing more
(:attr:`WindowedRankReader.steps_remaining` is the same on every rank). So a job stopped at
``R`` ranks resumes at any ``R'`` and continues the same global sequence.

Cost: a reader opens with no window planned; its first microbatch is one :func:`~.index.locate`
and one window planned (two when the rank's first microbatch is the first of the next window),
and each later window is planned once (:meth:`~.plan.WindowedPlan.window` keeps the last).
World size and rank are not in the cursor: they are the resumed job's, whatever they are.

The reader needs only :class:`ResumablePlan`: the fingerprint, the number of epochs, each epoch's
length in cursor units and unit ``k`` of an epoch by random access (:meth:`ResumablePlan.microbatch_at`),
so every windowed plan kind resumes by this one rule (a mixture is one epoch).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from ..checkpoint_kinds import PlanCursor
from ..sharding import check_rank


class ResumablePlan(Protocol):
    """What :class:`WindowedRankReader` reads: a plan's identity, its epochs' lengths in cursor units, and
    unit ``k`` of an epoch (one window planned; the plan keeps the last window, so reading in order plans
    each window once)."""

    @property
    def fingerprint(self) -> str: ...

    @property
    def num_epochs(self) -> int: ...

    def epoch_microbatches(self, epoch: int) -> int: ...

    def microbatch_at(self, epoch: int, k: int) -> Any: ...


def check_windowed_cursor(plan: ResumablePlan, cursor: PlanCursor) -> PlanCursor:
    """``cursor`` when it belongs to ``plan`` (PLAN_FINGERPRINT_MISMATCH otherwise) and names an epoch of it
    and an index in ``[0, M]`` (PLAN_CURSOR_INVALID; ``M`` itself: the epoch is done)."""
    if not isinstance(cursor, PlanCursor):
        cursor = PlanCursor.from_state(cursor)
    cursor.check(plan)
    return cursor


def rank_indices(start: int, stop: int, rank: int, world_size: int) -> range:
    """Global indices ``k`` in ``[start, stop)`` with ``k mod world_size == rank``."""
    return range(start + (rank - start) % world_size, stop, world_size)


class WindowedRankReader:
    """Rank ``rank`` of ``world_size`` reading a windowed plan from a cursor (see the module docstring).

    Each ``iter()`` is one pass: this rank's microbatches from the cursor to the end of the cursor's
    epoch, as ``(epoch, global index, unit)`` (a :class:`~..plan.MicrobatchSpec` of a microbatch plan);
    the cursor moves one lockstep step before each is handed out, so :meth:`cursor` saved after training
    on a microbatch resumes after it."""

    def __init__(self, plan: ResumablePlan, rank: int = 0, world_size: int = 1, *, epoch: int = 0,
                 microbatch_index: int = 0) -> None:
        self.plan = plan
        self.rank, self.world_size = check_rank(rank, world_size)
        cursor = check_windowed_cursor(plan, PlanCursor(plan.fingerprint, epoch, microbatch_index))
        self.epoch, self.microbatch_index = cursor.epoch, cursor.microbatch_index

    @classmethod
    def resume(cls, plan: ResumablePlan, cursor, rank: int = 0, world_size: int = 1) -> WindowedRankReader:
        """A reader at a checkpoint's plan cursor (a :class:`PlanCursor` or its state), at any world size."""
        cursor = check_windowed_cursor(plan, cursor)
        return cls(plan, rank, world_size, epoch=cursor.epoch, microbatch_index=cursor.microbatch_index)

    def cursor(self) -> PlanCursor:
        """The plan cursor to save (``extra_cursors={"plan": reader.cursor()}``)."""
        return PlanCursor(self.plan.fingerprint, self.epoch, self.microbatch_index)

    @property
    def steps_remaining(self) -> int:
        """Lockstep steps from the cursor to the end of its epoch, ``ceil((M - c) / R)``, on every rank."""
        return -(-(self.plan.epoch_microbatches(self.epoch) - self.microbatch_index) // self.world_size)

    def __iter__(self) -> Iterator[tuple[int, int, Any]]:
        epoch, start = self.epoch, self.microbatch_index
        steps = self.steps_remaining
        for step, k in enumerate(rank_indices(start, self.plan.epoch_microbatches(epoch), self.rank,
                                              self.world_size)):
            spec = self.plan.microbatch_at(epoch, k)
            self.epoch, self.microbatch_index = self._after(epoch, start, step + 1)
            yield epoch, k, spec
        self.epoch, self.microbatch_index = self._after(epoch, start, steps)

    def _after(self, epoch: int, start: int, steps: int) -> tuple[int, int]:
        """The cursor once ``steps`` lockstep steps from ``(epoch, start)`` are done."""
        position = start + steps * self.world_size
        length = self.plan.epoch_microbatches(epoch)
        if position < length:
            return epoch, position
        if epoch + 1 < self.plan.num_epochs:
            return epoch + 1, 0
        return epoch, length
