"""``plan explain``: what every rank trained on at a step of a run, from the plan alone.

What goes in: a plan folder of any kind whose :class:`~..kinds.kind.PlanKind` gives ``explain`` (or a plan and
its kind), a global step ``K`` (or ``count`` steps from it), a world size and optionally one rank, the units a rank
takes a step (a plan of samples: the ``SequenceBatchSampler``'s ``batch_size``), the plan cursor the run started
or resumed from, and optionally a token source for the loss tokens of a plan that records none. What comes out: a
plain dict, the same as ``plan explain --json`` prints (docs/batching.md, "Explaining a step", is the schema):
the plan's kind, fingerprint and ``origin`` (its parent and edits: none for a plan built from its sources), and
per step its epoch, its cursor and each rank's units (:mod:`.rows`), which :func:`lines` prints as text.

Steps follow the samplers' lockstep rule (:mod:`.steps`); each unit is the kind's ``explain`` (one window planned,
or one sample's pieces), so a step costs O(window) whatever the plan's size.
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any

from .... import checks, errors
from ..plan import plan_error
from ..sharding import share_ranks
from .rows import NO_ORIGIN
from .steps import locate_steps, total_steps

#: ``format`` of an explanation (the JSON ``plan explain --json`` prints).
EXPLAIN_FORMAT = "umlos_cuda.plan_explain/1"

_config = partial(plan_error, errors.BATCHING_CONFIG_INVALID)


class StepExplainer:
    """A plan opened once and explained at any step (:meth:`explain`); :meth:`open` reads a folder of any kind.

    ``tokens``: a token source (a path or an opened source) to count loss tokens from, for a plan of one dataset's
    rows that records none (a whole plan, a windowed plan over lengths), checked to hold the plan's rows
    (BATCH_STORE_MISMATCH); for a mixed plan, a list with one per component. A kind whose samples are cut
    (pretraining sequences) reads the tokens it was cut from and takes none."""

    def __init__(self, plan: Any, kind: Any, *, folder: str | None = None, tokens: Any = None) -> None:
        from ..kinds.registry import plan_kinds

        if kind.explain is None:
            takes = ", a ".join(k.name for k in plan_kinds() if k.explain is not None)
            raise plan_error(errors.PLAN_NOT_FOUND, f"{folder or 'the plan'} is a {kind.name}, which its kind gives "
                                                    f"no explanation of; plan explain takes a {takes}")
        self.plan, self.kind, self.folder = plan, kind, folder
        self.tokens = None if tokens is None else _given_tokens(plan, kind, tokens)

    @classmethod
    def open(cls, folder: Any, *, tokens: Any = None) -> StepExplainer:
        """The plan in ``folder``, whatever its kind, its sources reopened from what it records."""
        from ..kinds.registry import plan_kind_of

        kind = plan_kind_of(folder)
        return cls(kind.open(folder), kind, folder=os.fspath(folder), tokens=tokens)

    def origin(self) -> dict:
        """Where the plan comes from: its kind's ``origin``, else :data:`NO_ORIGIN`."""
        return dict(NO_ORIGIN) if self.kind.origin is None else self.kind.origin(self.plan)

    def unit(self, epoch: int, k: int) -> dict:
        """Unit ``k`` of ``epoch`` (a microbatch, or a sample), row by row: the kind's ``explain``."""
        return self.kind.explain(self.plan, epoch, k, self.tokens)

    def explain(self, step: int, *, count: int = 1, rank: int | None = None, world_size: int = 1,
                batch_size: int = 1, start: tuple[int, int] = (0, 0)) -> dict:
        """Steps ``step .. step + count - 1`` of a run at ``world_size`` ranks from the cursor ``start`` (module
        docstring); ``rank``: that rank only (default: every rank). PLAN_CURSOR_INVALID for a step past the run's
        end; INVALID_RANK for a rank outside the world; BATCHING_CONFIG_INVALID for a batch size other than 1 on a
        plan of microbatches (one microbatch is one rank's step)."""
        ranks = share_ranks(world_size, rank)
        if self.kind.unit != "sample":
            checks.integer(batch_size, "batch_size", 1, 1, fail=_config,
                           message=f"{{name}} is {{value!r}}: a step of a {self.kind.name} is one microbatch per "
                                   "rank; a batch size of several units is for a plan of samples")
        start = _cursor_pair(start)
        located = locate_steps(self.plan, step, count, world_size, batch_size, start)
        return {"format": EXPLAIN_FORMAT, "plan": self.folder, "kind": self.kind.name,
                "fingerprint": self.plan.fingerprint, "origin": self.origin(), "unit": self.kind.unit,
                "world_size": world_size, "batch_size": batch_size,
                "start": {"epoch": start[0], "index": start[1]},
                "run_steps": total_steps(self.plan, world_size, batch_size, start),
                "steps": [{"step": s.step, "epoch": s.epoch, "cursor": s.cursor,
                           "ranks": [{"rank": r, "units": [self.unit(s.epoch, k) for k in s.rank_units(r)]}
                                     for r in ranks]} for s in located]}


def explain(plan: Any, step: int, *, count: int = 1, rank: int | None = None, world_size: int = 1,
            batch_size: int = 1, start: tuple[int, int] = (0, 0), tokens: Any = None) -> dict:
    """:meth:`StepExplainer.explain` of ``plan``: a folder of any plan kind, or a :class:`StepExplainer`
    (opened once, for many steps, with its ``tokens``: BATCHING_CONFIG_INVALID when given here too)."""
    if isinstance(plan, StepExplainer) and tokens is not None:
        raise _config("an opened StepExplainer has its token source: give tokens to StepExplainer.open")
    explainer = plan if isinstance(plan, StepExplainer) else StepExplainer.open(plan, tokens=tokens)
    return explainer.explain(step, count=count, rank=rank, world_size=world_size, batch_size=batch_size,
                             start=start)


def _cursor_pair(start: Any) -> tuple[int, int]:
    """``start`` as ``(epoch, index)``: a pair of integers (PLAN_CURSOR_INVALID otherwise; the plan checks the
    range)."""
    fail = partial(plan_error, errors.PLAN_CURSOR_INVALID)
    pair = checks.sequence(start, "start", fail=fail, empty=False)
    if len(pair) != 2:
        raise fail(f"start is a plan cursor (epoch, index), got {len(pair)} values")
    return tuple(checks.integer(v, what, 0, None, fail=fail, message=checks.NON_NEGATIVE)  # type: ignore[return-value]
                 for v, what in zip(pair, ("start epoch", "start index")))


def _given_tokens(plan: Any, kind: Any, tokens: Any) -> Any:
    """The token source(s) given for the loss tokens (see :class:`StepExplainer`), opened and checked."""
    from ...tokens.sources import open_token_source
    from ..integrity import check_rows_match_plan

    if not kind.rows:
        raise _config(f"a {kind.name} reads the token source it was cut from (reopened from its folder); it takes no "
                      "other")
    if kind.order == "mixture":
        listed = checks.sequence(tokens, "tokens", fail=_config, empty=False,
                                 message="a mixture's tokens are a list, one token source per component, got {type}")
        return [open_token_source(item) for item in listed]
    meta = getattr(plan, "meta", None)
    source = open_token_source(tokens, tokenizer_hash=None if meta is None else meta.tokenizer_hash)
    check_rows_match_plan(source, plan)
    return source
