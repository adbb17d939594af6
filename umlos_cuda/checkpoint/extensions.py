"""Extension points: a subsystem's own cursors in checkpoints, its own records on the tape.

A subsystem that has a position of its own to resume (a batch plan's
``(epoch, microbatch_index)``, the RNG sub-streams' offsets) registers a
*cursor kind*; one that traces its own events registers a *record type*
(:func:`umlos_cuda.checkpoint.tape.register_record_type`). Both happen in the
subsystem's own module, with no edit to the checkpoint modules::

    from umlos_cuda.checkpoint import CursorKind, register_cursor_kind, register_record_type, tape

    register_cursor_kind(CursorKind("plan", encode=lambda c: c.state_dict(), decode=PlanCursor.from_state))
    register_record_type("plan.microbatch", {"t": tape.is_uint, "index": tape.is_uint})

    store.commit(CheckpointState(t, {"train": cursor}, extra_cursors={"plan": plan_cursor}))
    store.restore_latest().extra_cursors["plan"]        # what decode returned

Each kind's state is one file of the container, ``data/cursors=<kind>.cbor``
holding ``{kind, state}`` (docs/checkpoint-format.md §5.2): listed, hashed
and bound by the Merkle root like every file, checked by ``verify`` with the
kind's ``decode``, and restored by the ``train_full``, ``data_cursors`` and
``shard_subset`` profiles. The writer runs ``decode`` on what ``encode``
produced before it commits, so a state its own reader would refuse is never
committed. A reader meeting a kind no one registered in its process looks
among the installed subsystems once (:mod:`.plugins`), then refuses.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from dataclasses import dataclass
from typing import Any

from .. import checks, errors
from ..manifest.core import Manifest
from . import paths, plugins
from .codes import SERIALIZE, error
from .tape import register_record_type

__all__ = ["CursorKind", "KIND_PATTERN", "cursor_kind", "cursor_kinds", "register_cursor_kind",
           "register_record_type"]

#: A cursor kind's name: it becomes part of a file name (``data/cursors=<kind>.cbor``).
KIND_PATTERN = paths.KIND_PATTERN
_KIND_RE = re.compile(KIND_PATTERN + r"\Z")
#: What a kind's functions may raise on input they refuse (besides UmlosError):
#: the reader reports them with its own code instead of a traceback.
REFUSALS = (errors.UmlosError, ValueError, TypeError, KeyError, IndexError, AttributeError)


@dataclass(frozen=True, slots=True)
class CursorKind:
    """A kind of cursor a checkpoint can hold besides NextBatch's.

    Args:
        name: the kind's name (:data:`KIND_PATTERN`), the key in
            ``CheckpointState.extra_cursors`` and ``RestoredCheckpoint.extra_cursors``.
        encode: the subsystem's object -> plain data (maps with text keys,
            lists, text, bytes, integers, finite floats, booleans, None;
            nested at most ``limits.MAX_STATE_DEPTH`` levels).
        decode: ``(plain data as read, the run's Manifest)`` -> the object a
            restore returns. It must refuse what is not a valid state of
            this kind (raise ``UmlosError`` or ``ValueError``), since it is
            the check ``verify`` runs on untrusted files.
        description: one line for people (``checkpoint inspect``, errors).
    """

    name: str
    encode: Callable[[Any], Any]
    decode: Callable[[Any, Manifest], Any]
    description: str = ""

    def __post_init__(self) -> None:
        checks.text(self.name, "cursor kind name", pattern=_KIND_RE,
                    fail=partial(error, errors.CHECKPOINT_STATE_INVALID, operator=SERIALIZE),
                    message="{name} {value!r} must match " + checks.literal(KIND_PATTERN))
        if not callable(self.encode) or not callable(self.decode):
            raise error(errors.CHECKPOINT_STATE_INVALID, f"cursor kind {self.name!r} needs callable encode and decode",
                        operator=SERIALIZE)


_KINDS: dict[str, CursorKind] = {}


def register_cursor_kind(kind: CursorKind) -> CursorKind:
    """Make ``kind`` known to this process's writers and readers; return it.

    Registering the same kind again does nothing; another kind under a taken
    name is refused (``CHECKPOINT_STATE_INVALID``)."""
    if not isinstance(kind, CursorKind):
        raise error(errors.CHECKPOINT_STATE_INVALID, f"expected a CursorKind, got {type(kind).__name__}",
                    operator=SERIALIZE)
    known = _KINDS.get(kind.name)
    if known is not None and known != kind:
        raise error(errors.CHECKPOINT_STATE_INVALID, f"cursor kind {kind.name!r} is already registered "
                                                     f"({known.description or known.decode})", operator=SERIALIZE)
    _KINDS[kind.name] = kind
    return kind


def cursor_kinds() -> tuple[str, ...]:
    """The names of the registered kinds, sorted."""
    return tuple(sorted(_KINDS))


def cursor_kind(name: str, code: str, operator: str) -> CursorKind:
    """The kind called ``name``; one no one registered is looked for among the
    installed subsystems once, then refused with ``code``."""
    kind = _KINDS.get(name)
    if kind is None:
        plugins.load()
        kind = _KINDS.get(name)
    if kind is None:
        known = ", ".join(sorted(_KINDS)) or "none"
        raise error(code, f"cursor kind {name!r} is not registered in this process (registered: {known}); "
                          f"{plugins.hint()}", operator=operator)
    return kind
