"""Plan kinds: every kind of plan folder, by name, with what can be done with it.

A plan is an order planned by a maker over a scope. The order is one dataset's engine order or a weighted
mixture of components; the maker puts samples into token-budget microbatches (packed into rows when the
configuration says so) or cuts documents into sequences; the scope is the whole epoch at once or windows of
W positions. Each combination this release writes is a kind of folder:

======================  ========  =======  ==========  =====  ==================
kind (folder marker)    order     scope    unit        rows   module
======================  ========  =======  ==========  =====  ==================
plan                    dataset   epoch    microbatch  yes    :mod:`.whole`
windowed plan           dataset   windows  microbatch  yes    :mod:`.windowed`
mixed plan              mixture   windows  microbatch  yes    :mod:`.mixed`
pretraining sequences   dataset   windows  sample      no     :mod:`.sequences`
mixed pretraining seq.  mixture   windows  sample      no     :mod:`.mixed_sequences`
edited <kind>           <kind>'s  <kind>'s <kind>'s    <kind> :mod:`.edited`
======================  ========  =======  ==========  =====  ==================

("rows": every microbatch lists rows of one dataset -- a mixture's dataset is its components one after another --
so a batch sampler, a collator and ``batch generate`` can hand them out, the last through the kind's
``save_into``; ``plan shard`` takes the kinds whose microbatches a whole plan can hold: whole and windowed
plans.) Every command, sampler and loader reaches a kind through this registry (:func:`plan_kind_of`,
:func:`open_plan`) and never asks a folder which kind it is one ``is_*`` at a time.

Modules:
    kind             :class:`PlanKind`: where a kind sits in the model, and its open/save/verify/report/explain
    registry         the lookups (:func:`plan_kinds`, :func:`get_plan_kind`, :func:`plan_kind_of`), which what
                     opens a plan of another kind (an edited plan's parent) imports without the kinds
    whole            the whole plan, and the words about over-long samples, splits and packing
    windowed         the windowed plan
    mixed            the mixed plan
    sequences        pretraining sequences
    mixed_sequences  mixed pretraining sequences
    edited           a plan of any kind with units left out (``plan edit``): one edited kind per kind, registered
                     with it
    shard_set        a plan shard set (``plan shard``): an artifact of plans, not a plan kind

Importing this package registers every kind, and the shard set, as an artifact (``umlos_cuda.artifacts``:
``umlos-cuda info`` and ``verify``); a kind registered at run time becomes one too.

Adding a kind (docs/architecture.md, "Adding a plan kind"): a module that defines its :class:`PlanKind` and calls
:func:`register_plan_kind`; the tests register a toy kind this way.
"""

from __future__ import annotations

import os
from typing import Any

from .... import errors
from ....artifacts import Artifact, register_artifact, unregister_artifact
from ..plan import plan_error
from ..edits.io import PREFIX as EDITED_PREFIX
from . import edited, mixed, mixed_sequences, sequences, shard_set, whole, windowed
from .kind import ORDERS, SCOPES, UNITS, VERIFY_OPTIONS, PlanKind, registry_error
from .registry import _kinds, _lock, get_plan_kind, plan_kind_of, plan_kinds

__all__ = ["ORDERS", "SCOPES", "UNITS", "VERIFY_OPTIONS", "PlanKind", "get_plan_kind", "kind_of_plan", "open_plan",
           "open_row_plan", "plan_kind_of", "plan_kinds", "register_plan_kind", "unregister_plan_kind"]

#: The kinds a plan is built as, in the order they are listed to users.
BUILT = (whole.KIND, windowed.KIND, mixed.KIND, sequences.KIND, mixed_sequences.KIND)
#: The kinds of this release: those, and each one's edited plans (``plan edit``).
BUILT_IN = BUILT + tuple(edited.edited_kind(kind) for kind in BUILT)

_kinds.update((kind.name, kind) for kind in BUILT_IN)


def as_artifact(kind: PlanKind) -> Artifact:
    """``kind`` as an artifact of ``umlos-cuda info`` and ``verify``: the same functions, its folder's marker."""
    return Artifact(kind.name, open=kind.open, verify=kind.verify, report=kind.report, lines=kind.lines,
                    folder=kind.artifact, info_options=frozenset({"world_size", "rank"}),
                    verify_options=kind.verify_options)


for _kind in BUILT_IN:
    register_artifact(as_artifact(_kind), replace=True)
register_artifact(shard_set.ARTIFACT, replace=True)


def register_plan_kind(kind: PlanKind) -> PlanKind:
    """Add ``kind``, and the kind of its edited plans (``plan edit``), to the registry and return it;
    INVALID_ARGUMENT when its name is taken."""
    if not isinstance(kind, PlanKind):
        raise registry_error(f"register_plan_kind takes a PlanKind, got {type(kind).__name__}")
    edits = edited.edited_kind(kind)
    with _lock:
        for added in (kind, edits):
            if added.name in _kinds:
                raise registry_error(f"plan kind {added.name!r} is already registered")
        _kinds[kind.name], _kinds[edits.name] = kind, edits
    for added in (kind, edits):
        register_artifact(as_artifact(added), replace=True)
    return kind


def unregister_plan_kind(name: str) -> None:
    """Remove the kind registered at run time as ``name``, and its edited plans' (a built-in kind cannot be
    removed)."""
    with _lock:
        if name in _kinds and _kinds[name] not in BUILT_IN and not name.startswith(EDITED_PREFIX):
            for removed in (name, EDITED_PREFIX + name):
                del _kinds[removed]
                unregister_artifact(removed)
            return
    raise registry_error(f"no plan kind {name!r} was registered at run time")


def open_plan(folder) -> Any:
    """The plan in ``folder``, whatever its kind, its sources reopened from what it records (no other argument)."""
    return plan_kind_of(folder).open(folder)


def kind_of_plan(plan) -> PlanKind:
    """The kind of the opened plan ``plan`` (the registered kind whose ``plan_type`` it is an instance of);
    PLAN_NOT_FOUND naming the kinds that say which plans are theirs."""
    for kind in plan_kinds():
        if kind.plan_type is not None and isinstance(plan, kind.plan_type):
            return kind
    known = ", ".join(f"{k.plan_type.__name__} ({k.name})" for k in plan_kinds() if k.plan_type is not None)
    raise plan_error(errors.PLAN_NOT_FOUND, f"{type(plan).__name__} is no plan of a registered kind: give one of "
                                            f"{known}, or a plan folder")


def open_row_plan(folder, user: str, *, whole: bool = False, lengths=None, verify: bool = False) -> Any:
    """The plan in ``folder`` when its microbatches list rows of one dataset (a kind with ``rows``), for ``user``
    (what hands them out: a sampler, a collator, ``plan shard``, ``batch generate``); PLAN_NOT_FOUND naming the kinds
    that do otherwise. ``whole``: as a whole plan (the kind's ``whole``; ``lengths``: a length cache of the same
    rows), for what needs one; PLAN_NOT_FOUND for a kind a whole plan cannot hold (a mixture: its rows are several
    datasets'). ``verify``: also re-hash what the kind's ``open`` trusts (its ``digests``: a whole plan's arrays
    against meta.json), as the commands that derive new artifacts from a plan do."""
    kind = plan_kind_of(folder)
    if not kind.rows or (whole and kind.whole is None):
        takes = " or a ".join(k.name for k in plan_kinds() if k.rows and (k.whole is not None or not whole))
        what = f"whose {kind.unit}s are not rows of one dataset" if not kind.rows else \
            "whose microbatches no whole plan holds (a mixture's rows are several datasets'; an edited plan's " \
            "units are its parent's less those left out: give its parent)"
        raise plan_error(errors.PLAN_NOT_FOUND, f"{os.fspath(folder)} is a {kind.name}, {what}; {user} takes a "
                                                f"{takes}")
    plan = kind.open(folder)
    if verify and kind.digests is not None:
        kind.digests(plan, os.fspath(folder))
    return kind.whole(plan, lengths) if whole and kind.whole is not None else plan
