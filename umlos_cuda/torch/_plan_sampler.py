"""A ``batch_sampler`` that yields this rank's microbatches of a batch plan.

The sampler owns a plan cursor ``(epoch, microbatch_index)``: the global
microbatch the job reaches next, the same number at every world size. From
cursor ``c``, rank ``r`` of ``W`` takes the global microbatches ``i >= c``
with ``i % W == r`` (the plan's sharding), so each lockstep step consumes
the ``W`` consecutive microbatches ``[c, c + W)`` and the cursor after ``k``
steps is ``c + k * W``: a job stopped at 4 ranks resumes at 2 (or 8) and
continues the same global sequence. When an epoch's microbatch count is not
a multiple of ``W``, the last step is short: ranks without a microbatch in
it yield one fewer (:attr:`steps_remaining` tells every rank how many
lockstep steps the pass has, so it can join the last collective with an
empty contribution).

One pass of ``iter()`` runs to the end of the cursor's epoch; the next pass
is the next epoch. A pass that starts after the plan's last epoch yields
nothing and warns (the plan was built for fewer epochs than the loop runs).
``state_dict()`` / ``load_state_dict()`` carry the cursor and the plan's
fingerprint (a restore into another plan is refused), the interface
torchdata's ``StatefulDataLoader`` calls. While a ``DataLoader`` with
workers pulls a pass, ``state_dict()`` counts the microbatches that loader
has handed the training loop, not the ones its workers prefetched
(``_prefetch.py``; see :meth:`PlanBatchSampler.state_dict`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping
from functools import partial
from typing import Any

from .. import checks, errors
from ..errors import UmlosError
from ._dist import argument_error, as_argument_error, require_uint64, resolve_world, state_of
from ._plan_keys import plan_keys, takes_ranges
from ._prefetch import LoaderLink, link_for, loop_count
from ._sampler_base import SamplerBase as _SamplerBase

#: ``state_dict()["format"]``.
STATE_FORMAT = "umlos_cuda.torch.PlanBatchSampler/1"


class PlanBatchSampler(_SamplerBase):
    """Batch sampler over a plan: ``DataLoader(ds, batch_sampler=PlanBatchSampler(plan))``.

    Args:
        plan: a :class:`~umlos_cuda.batching.plans.plan.BatchPlan`, a
            :class:`~umlos_cuda.batching.plans.windows.WindowedPlan` (token-budget
            or packed; each microbatch is one window planned, the last window
            kept, so a pass plans each window once and a resume one window), a
            :class:`~umlos_cuda.batching.plans.windows.MixedPlan` (its rows are
            its components' one after another: index
            ``TokenDataset(plan.dataset())``) or any one's folder. A pre-sharded plan (``umlos-cuda plan shard``) works
            at its own rank and world size only.
        rank, world_size: default: ``torch.distributed`` when initialised,
            else ``$RANK`` / ``$WORLD_SIZE``, else 0 / 1.
        epoch, microbatch_index: the starting cursor (default 0, 0).

    Items are lists of Python ints, the dataset rows of one microbatch; for a
    plan whose over-long policy cuts samples (truncation or ``split``), lists
    of :class:`~umlos_cuda.torch.PlanKey` ``(row, start, stop)``, the token
    range of each sample the plan takes (``_plan_keys.py``), which
    :class:`~umlos_cuda.torch.TokenDataset` and
    :class:`~umlos_cuda.torch.PlanCollator` cut as ``collate_microbatch`` does.
    :attr:`last_microbatch` describes the last one yielded (epoch, global
    index, bucket id, ``max_len``) for a collate step in the same process.

    Raises:
        SamplerArgumentError: (a :class:`~umlos_cuda.UmlosError` and a
            ``ValueError``) with the failure code on any invalid argument.
    """

    #: What one item is, in the warnings of :meth:`state_dict`.
    _items = "microbatches"

    def __init__(self, plan, rank: int | None = None, world_size: int | None = None, *,
                 epoch: int = 0, microbatch_index: int = 0) -> None:
        from ..batching.plans.plan import BatchPlan, check_cursor

        try:
            self.plan = plan = self._open_plan(plan)
            #: A windowed plan (batching/plans/windows/; any ``ResumablePlan`` of resume.py): unit ``k`` is one
            #: window planned, the last kept.
            self.windowed = not isinstance(plan, BatchPlan)
            self.world_size, self.rank = resolve_world(world_size, rank)
            shard = None if self.windowed else plan.meta.shard
            if shard is not None and (shard["rank"], shard["world_size"]) != (self.rank, self.world_size):
                raise argument_error(
                    errors.INVALID_RANK,
                    f"this plan is shard {shard['rank']} of {shard['world_size']} but the sampler is rank "
                    f"{self.rank} of {self.world_size}; give the full plan to run at another layout")
            check_cursor(plan, epoch, microbatch_index)
        except UmlosError as exc:
            raise as_argument_error(exc) from None
        self.epoch, self.microbatch_index = int(epoch), int(microbatch_index)
        #: ``{"epoch", "index", "bucket_id", "max_len"}`` of the last microbatch yielded.
        self.last_microbatch: dict[str, int] | None = None
        self._iter_start = (self.epoch, self.microbatch_index)
        self._owner: object | None = None
        self._handed = 0  # microbatches the owned pass has handed out
        self._link: LoaderLink | None = None  # the loader with workers pulling the owned pass

    @staticmethod
    def _open_plan(plan):
        """The plan read: a plan of dataset rows (whole, windowed, or mixed: its components' rows one after
        another), or its folder (PLAN_NOT_FOUND for a kind whose microbatches are not rows)."""
        from ..batching.plans.plan import BatchPlan
        from ..batching.plans.windows import MixedPlan, WindowedPlan
        from ..batching.plans.kinds import open_row_plan

        if isinstance(plan, (BatchPlan, WindowedPlan, MixedPlan)):
            return plan
        checks.instance(plan, "plan", (str, os.PathLike), fail=partial(argument_error, errors.PLAN_NOT_FOUND),
                        message="{name} must be a BatchPlan, a WindowedPlan, a MixedPlan or a plan folder, "
                                "got {type}")
        return open_row_plan(plan, "PlanBatchSampler")

    # -- sizes -------------------------------------------------------------
    @property
    def fingerprint(self) -> str:
        """The full plan's fingerprint (a shard names its source's)."""
        return self.plan.fingerprint if self.windowed else self.plan.meta.source_fingerprint

    def _epoch_length(self, epoch: int) -> int:
        return self.plan.epoch_microbatches(epoch)

    @property
    def steps_remaining(self) -> int:
        """Lockstep steps from the cursor to the end of its epoch: ``ceil((M - c) / W)``."""
        return self.steps_from(self.epoch, self.microbatch_index)

    def steps_from(self, epoch: int, start: int) -> int:
        """Lockstep steps from ``(epoch, start)`` to the end of that epoch."""
        return -(-(self._epoch_length(epoch) - start) // self.world_size)

    def __len__(self) -> int:
        """Microbatches this rank yields from the cursor to the end of its epoch."""
        return len(self._mine(self.epoch, self.microbatch_index))

    def _mine(self, epoch: int, start: int) -> range:
        """Global indices ``i >= start`` of ``epoch`` with ``i % W == rank``."""
        first = start + (self.rank - start) % self.world_size
        return range(first, self._epoch_length(epoch), self.world_size)

    # -- iteration -----------------------------------------------------------
    def __iter__(self) -> Iterator[list]:
        self._iter_start = (self.epoch, self.microbatch_index)
        self._owner = owner = object()
        self._handed, self._link = 0, None
        last = self.plan.num_epochs - 1
        if self.epoch == last and self.microbatch_index >= self._epoch_length(last):
            warnings.warn(f"PlanBatchSampler: the plan's last epoch ({last}) is done, so this pass yields no "
                          f"microbatch; the plan has {self.plan.num_epochs} epoch(s): build it with more "
                          "(`umlos-cuda plan build --epochs`), or call set_epoch() to go back", stacklevel=2)
        return self._generate(self.epoch, self.microbatch_index, owner)

    def microbatch(self, epoch: int, index: int):
        """Global microbatch ``index`` of ``epoch`` as a :class:`~umlos_cuda.batching.plans.plan.MicrobatchSpec`
        (rows, bucket, ``max_len``, packed rows), whole plan, windowed or mixed."""
        return self.plan.microbatch_at(epoch, index)

    def _generate(self, epoch: int, start: int, owner: object) -> Iterator[list]:
        plan_epoch = None if self.windowed else self.plan.get_epoch(epoch)
        ranges = takes_ranges(self.plan.config)  # keys carry each sample's token range (_plan_keys.py)
        for step, index in enumerate(self._mine(epoch, start)):
            if plan_epoch is None:  # one window planned per window of microbatches (the plan keeps the last)
                spec = self.plan.microbatch_at(epoch, index)
                rows, bucket_id, max_len = spec.rows, spec.bucket_id, spec.max_len
                spans = spec.spans if ranges else None
            else:  # the arrays themselves: no MicrobatchSpec (its sample ids) per microbatch
                local = plan_epoch.local_index(index)
                rows = plan_epoch.rows(local)
                bucket_id, max_len = int(plan_epoch.bucket_ids[local]), int(plan_epoch.max_len[local])
                spans = self.plan.entry_spans(plan_epoch, local) if ranges else None
            if self._owner is owner:
                self.epoch, self.microbatch_index = self._after(epoch, start, step + 1)
                self._handed = step + 1
                if step == 0:
                    self._link = self._loader_link()
            self.last_microbatch = {"epoch": epoch, "index": index, "bucket_id": bucket_id, "max_len": max_len}
            yield plan_keys(rows, spans)
        if self._owner is owner:  # a rank without a microbatch in the last step ends the epoch too
            self.epoch, self.microbatch_index = self._after(epoch, start, self.steps_from(epoch, start))

    def _loader_link(self) -> LoaderLink | None:
        """The ``DataLoader`` with workers pulling this pass, found on the call stack (``_prefetch.py``)."""
        return link_for(self, batches=True)

    def _steps(self, batches: int) -> int:
        """Lockstep steps of ``batches`` batches of this rank (one unit a batch here; a subclass may batch more)."""
        return batches

    def _after(self, epoch: int, start: int, steps: int) -> tuple[int, int]:
        """The cursor once ``steps`` lockstep steps from ``(epoch, start)`` are done."""
        position = start + steps * self.world_size
        length = self._epoch_length(epoch)
        if position < length:
            return epoch, position
        if epoch + 1 < self.plan.num_epochs:
            return epoch + 1, 0
        return epoch, length

    def set_epoch(self, epoch: int) -> None:
        """Move the cursor to the start of ``epoch`` unless it is already inside it
        (a restored mid-epoch cursor is kept), so the usual loop works with resumption."""
        from ..batching.plans.plan import check_cursor

        epoch = require_uint64(epoch, "epoch")
        if epoch != self.epoch:
            try:
                check_cursor(self.plan, epoch, 0)
            except UmlosError as exc:
                raise as_argument_error(exc) from None
            self.epoch, self.microbatch_index = epoch, 0
            self._iter_start = (epoch, 0)
            self._owner, self._link = None, None

    # -- checkpointing ---------------------------------------------------------
    def state_dict(self, batches_consumed: int | None = None) -> dict[str, Any]:
        """The plan cursor and the plan's fingerprint, as plain data.

        The cursor is after the microbatches the training loop has
        received: when a ``DataLoader`` with workers pulls this pass, the
        ones its workers fetched ahead and the loop has not seen yet are
        not counted (the loader is found on the call stack; see
        ``_prefetch.py``), so a resume from a ``state_dict()`` saved in the
        loop, or after leaving it, continues with the next microbatch.
        Without workers the sampler hands out only what the loop takes.

        ``batches_consumed``: the microbatches this rank's loop used in the
        current pass, overriding that count (for a loop that draws batches
        it does not train on, or one that trains on a batch only after the
        save). When the count cannot be known (a loader with
        ``in_order=False``, or an unknown batch sampler wrapping this one),
        a plain call warns: the state would count the prefetched
        microbatches as used. torchdata's ``StatefulDataLoader`` calls this
        itself when it sends a microbatch to a worker and gets the cursor
        of what was handed out then, which its snapshots expect.
        """
        epoch, index = self.epoch, self.microbatch_index
        if batches_consumed is None:
            batches_consumed = loop_count(self._link, self._handed, type(self).__name__, self._items,
                                          "batches_consumed")
        if batches_consumed is not None:
            epoch, index = self._after(*self._iter_start,
                                       self._steps(require_uint64(batches_consumed, "batches_consumed")))
        return {"format": STATE_FORMAT, "plan_fingerprint": self.fingerprint, "epoch": epoch,
                "microbatch_index": index, "world_size": self.world_size}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a cursor written at any world size; the plan must be the same
        (same fingerprint), else PLAN_FINGERPRINT_MISMATCH."""
        from ..batching.plans.plan import check_cursor

        state_of(state, "PlanBatchSampler", STATE_FORMAT, errors.PLAN_CURSOR_INVALID)
        if state.get("plan_fingerprint") != self.fingerprint:
            raise argument_error(errors.PLAN_FINGERPRINT_MISMATCH,
                                 f"the state belongs to plan {state.get('plan_fingerprint')!r}; this sampler's plan is "
                                 f"{self.fingerprint}")
        try:
            check_cursor(self.plan, state.get("epoch"), state.get("microbatch_index"))
        except UmlosError as exc:
            raise as_argument_error(exc) from None
        self.epoch, self.microbatch_index = int(state["epoch"]), int(state["microbatch_index"])
        self._iter_start = (self.epoch, self.microbatch_index)
        self._owner, self._link = None, None
