"""A kind of plan: where it sits among the options of the one plan model, and what can be done with it.

What goes in: nothing (a :class:`PlanKind` is a description). What comes out: the record the registry
(``umlos_cuda.batching.plans.kinds``) keeps for each kind, which every command, sampler and loader reads
instead of asking a folder which kind it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .... import errors
from ....errors import UmlosError
from ....files.artifacts import ArtifactKind

#: The orders a plan follows: one dataset's engine order, or a weighted mixture of components.
ORDERS = ("dataset", "mixture")
#: The scopes a plan is made over: the whole epoch at once, or windows of W positions.
SCOPES = ("epoch", "windows")
#: What one step of a plan hands out: a microbatch of samples, or one cut sample.
UNITS = ("microbatch", "sample")
#: The keyword options a kind's ``verify`` may take beyond the folder (the flags of ``plan verify``).
VERIFY_OPTIONS = ("expected_fingerprint", "windows", "seed", "lengths", "rebuild")


@dataclass(frozen=True)
class PlanKind:
    """One kind of plan folder.

    ``artifact`` is its folder's marker (its name is the kind's name, what messages call it). ``order``,
    ``scope`` and ``unit`` place it in the plan model (module docstring of the registry); ``rows``: every
    microbatch lists rows of one dataset (a mixture's: its components one after another), so a batch sampler
    and a collator can hand them out. ``open(folder)`` reads it, its sources reopened from what it records; ``save(plan,
    folder, force=, inputs=)`` writes one; ``verify(folder, **options)`` runs its checks and returns
    ``{"fingerprint", "checks"}`` (``options`` among :data:`VERIFY_OPTIONS`, only those in
    ``verify_options``); ``report(folder, world_size=, rank=)`` is ``plan info``'s dict and
    ``lines(report)`` its text. ``whole(plan, lengths)`` (only kinds with ``rows``; None where a whole plan cannot
    hold them): the same microbatches as a whole plan, for ``plan shard`` (``lengths``: a length cache of the
    same rows, whose ids and hashes it records; None: the plan's own).

    What ``batch generate`` and ``BatchReader`` need of a kind with ``rows`` (its plans answer
    :class:`~..rows.RowPlan`): ``plan_type``, the class of its opened plans (how :func:`kind_of_plan` knows one);
    ``save_into(plan, parent, name, force=, sources=)``, its folder written into a folder held open (a batch
    folder's copy of its plan; ``sources``: where its rows were read from, one path or None per part, which a
    copy that does not hold its lengths records as where to reopen them); ``digests(plan, folder)``, the
    re-hash of what ``open`` trusts without hashing (a whole plan's arrays; None: ``open`` hashes all it reads).
    A kind with ``rows`` but no ``save_into`` is refused by ``batch generate``, naming those that have one.

    ``explain(plan, epoch, k, tokens)`` (``plan explain``; None: a kind it cannot explain) is unit ``k`` of
    ``epoch`` (a microbatch, or a sample of a kind whose unit is one) as the dict of
    :func:`~..explain.rows.unit_record`: what that unit trains on, row by row, from the plan and its recorded
    sources (``tokens``: a token source given instead, for loss tokens; a mixture's: one per component).
    ``origin(plan)`` (None: ``{"parent": None, "edits": []}``) is where the plan comes from, which
    ``plan explain`` prints: a plan derived from another names its parent's fingerprint and the edits."""

    artifact: ArtifactKind
    order: str
    scope: str
    unit: str
    rows: bool
    open: Callable[[Any], Any]
    save: Callable[..., str]
    verify: Callable[..., dict]
    report: Callable[..., dict]
    lines: Callable[[dict], list[str]]
    verify_options: frozenset[str] = frozenset({"expected_fingerprint"})
    whole: Callable[[Any, Any], Any] | None = None
    explain: Callable[[Any, int, int, Any], dict] | None = None
    origin: Callable[[Any], dict] | None = None
    plan_type: type | None = None
    save_into: Callable[..., None] | None = None
    digests: Callable[[Any, str], None] | None = None

    def __post_init__(self) -> None:
        for name in ("whole", "save_into", "digests"):
            if getattr(self, name) is not None and not self.rows:
                raise registry_error(f"only a plan kind whose microbatches are rows takes {name}=: "
                                     f"{self.artifact.name!r}")
        for value, allowed, what in ((self.order, ORDERS, "order"), (self.scope, SCOPES, "scope"),
                                     (self.unit, UNITS, "unit")):
            if value not in allowed:
                raise registry_error(f"a plan kind's {what} is one of {', '.join(allowed)}, got {value!r}")
        unknown = set(self.verify_options) - set(VERIFY_OPTIONS)
        if unknown:
            raise registry_error(f"unknown verify options {sorted(unknown)}; a kind takes some of {VERIFY_OPTIONS}")

    @property
    def name(self) -> str:
        return self.artifact.name


def registry_error(message: str) -> UmlosError:
    """A plan kind defined or registered wrongly: a programming error (INVALID_ARGUMENT)."""
    return UmlosError(errors.INVALID_ARGUMENT, message, operator=errors.BATCH_PLAN_OPERATOR)
