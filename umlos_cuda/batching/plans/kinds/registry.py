"""The registry's lookups: which kinds there are, and which kind a plan folder is.

What goes in: a kind's name or a plan folder. What comes out: its :class:`~.kind.PlanKind`. The package
(``umlos_cuda.batching.plans.kinds``) fills the registry with the kinds of this release and adds and removes
those registered at run time; this module only reads it, so that what opens a plan of *another* kind (an
edited plan opens its parent, ``plan explain`` any plan) can find the kind without importing the kinds
themselves, which would import it back.
"""

from __future__ import annotations

import os
from threading import Lock

from .... import errors
from ....files.artifacts import marked_kind
from ....files.folder import Folder
from ..plan import plan_error
from . import whole
from .kind import PlanKind, registry_error

#: Every registered kind by name, built-in first (filled by the package).
_kinds: dict[str, PlanKind] = {}
_lock = Lock()


def plan_kinds() -> tuple[PlanKind, ...]:
    """The registered kinds, built-in first."""
    return tuple(_kinds.values())


def get_plan_kind(name: str) -> PlanKind:
    """The kind called ``name`` (its folders' marker), or INVALID_ARGUMENT naming the registered ones."""
    kind = _kinds.get(name) if isinstance(name, str) else None
    if kind is None:
        raise registry_error(f"unknown plan kind {name!r}; the kinds are {', '.join(_kinds)}")
    return kind


def plan_kind_of(folder) -> PlanKind:
    """The kind of the plan folder ``folder``, by its marker (a few bytes read, never through a link, never
    blocking on a FIFO), else by a kind's signature of folders written before markers. A folder marked as
    another artifact is PLAN_NOT_FOUND, saying what it is; anything else is taken for a whole plan, whose
    reader then says what the folder lacks (PLAN_NOT_FOUND, PLAN_FORMAT_INVALID)."""
    marked = None
    try:
        with Folder.open(os.fspath(folder)) as opened:
            marked = marked_kind(opened)
            if marked is None:
                for kind in plan_kinds():
                    if kind.artifact.signature is not None and kind.artifact.signature(opened):
                        return kind
    except (OSError, ValueError):
        pass
    if marked is None:
        return whole.KIND
    if marked not in _kinds:
        raise plan_error(errors.PLAN_NOT_FOUND, f"{os.fspath(folder)} is a {marked}, not a plan (umlos-cuda info "
                                                "says what it holds)")
    return _kinds[marked]
