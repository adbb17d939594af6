"""The ``plan`` cursor kind: a batch plan's cursor inside checkpoints; the ``plan.step`` tape record.

Importing this module registers it (:mod:`umlos_cuda.checkpoint.extensions`),
so a checkpoint saves the plan cursor beside the NextBatch cursors::

    store.commit(CheckpointState(t, {"train": cursor}, extra_cursors={"plan": PlanCursor.of(sampler)}))
    restored = store.restore_latest().extra_cursors["plan"]      # a PlanCursor
    restored.restore_into(sampler)      # PLAN_FINGERPRINT_MISMATCH for another plan

What is stored is ``{plan_fingerprint, epoch, microbatch_index}``: the cursor
is global (the same at every world size) and bound to the plan's
fingerprint, so a restore into a sampler over another plan is refused.

It also registers the tape record type ``plan.step`` (:mod:`.explain.tape`): what
a run trained on at each step, which ``plan explain --check-tape`` checks against
the plan.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial
from typing import Any

from ... import checks, errors
from ...checkpoint.extensions import CursorKind, register_cursor_kind, register_record_type
from .explain.tape import STEP_FIELDS, STEP_RECORD
from .plan import check_cursor, plan_error

KIND = "plan"
_FINGERPRINT = re.compile(r"[0-9a-f]{64}")
_invalid = partial(plan_error, errors.PLAN_CURSOR_INVALID)
#: A cursor's state: its keys (the constructor checks the values).
_STATE = dict.fromkeys(("plan_fingerprint", "epoch", "microbatch_index"), checks.field(checks.anything))
_NOT_A_CURSOR = "a plan cursor is a map with exactly plan_fingerprint, epoch and microbatch_index"


@dataclass(frozen=True, slots=True)
class PlanCursor:
    """``(epoch, microbatch_index)`` of the global microbatch sequence of the plan ``plan_fingerprint``."""

    plan_fingerprint: str
    epoch: int
    microbatch_index: int

    def __post_init__(self) -> None:
        checks.text(self.plan_fingerprint, "plan_fingerprint", pattern=_FINGERPRINT, fail=_invalid,
                    message="{name} must be 64 lowercase hex digits, got {value!r}")
        for name in ("epoch", "microbatch_index"):
            value = checks.integer(getattr(self, name), name, fail=_invalid,
                                   message="{name} must be an integer in [0, 2^64 - 1], got {value!r}")
            object.__setattr__(self, name, value)

    @classmethod
    def of(cls, sampler) -> PlanCursor:
        """The cursor of a :class:`~umlos_cuda.torch.PlanBatchSampler` (or anything with its ``state_dict``)."""
        state = sampler.state_dict()
        return cls(state["plan_fingerprint"], state["epoch"], state["microbatch_index"])

    def to_state(self) -> dict[str, Any]:
        return {"plan_fingerprint": self.plan_fingerprint, "epoch": self.epoch,
                "microbatch_index": self.microbatch_index}

    @classmethod
    def from_state(cls, state: Any, manifest: Any = None) -> PlanCursor:
        state = checks.record(state, _STATE, fail=_invalid, not_a_map=_NOT_A_CURSOR, unknown=_NOT_A_CURSOR,
                              missing=_NOT_A_CURSOR)
        return cls(state["plan_fingerprint"], state["epoch"], state["microbatch_index"])

    def check(self, plan) -> None:
        """Refuse a plan with another fingerprint (PLAN_FINGERPRINT_MISMATCH) or a cursor outside it: a whole
        plan (a shard names its source's fingerprint) or a windowed one (windows/resume.py)."""
        meta = getattr(plan, "meta", None)
        fingerprint = plan.fingerprint if meta is None else meta.source_fingerprint
        if fingerprint != self.plan_fingerprint:
            raise plan_error(errors.PLAN_FINGERPRINT_MISMATCH,
                             f"the checkpoint's plan cursor belongs to plan {self.plan_fingerprint}; "
                             f"this plan is {fingerprint}")
        check_cursor(plan, self.epoch, self.microbatch_index)

    def restore_into(self, sampler) -> None:
        """Move a PlanBatchSampler to this cursor (its plan must be this cursor's).

        The state handed to ``load_state_dict`` is the sampler's own
        ``state_dict`` (its format) with this cursor's fields, so this layer
        never imports the torch integration above it."""
        self.check(sampler.plan)
        sampler.load_state_dict({**sampler.state_dict(), **self.to_state()})


register_cursor_kind(CursorKind(KIND, encode=lambda cursor: _as_cursor(cursor).to_state(), decode=PlanCursor.from_state,
                                description="batch plan cursor (plan fingerprint, epoch, microbatch index)"))
#: What a training loop records of each step on the tape (``plan explain --check-tape``; plans/explain/tape.py).
register_record_type(STEP_RECORD, STEP_FIELDS)


def _as_cursor(value) -> PlanCursor:
    if isinstance(value, PlanCursor):
        return value
    if hasattr(value, "state_dict"):
        return PlanCursor.of(value)
    return PlanCursor.from_state(value)
