"""Sources: one opener for everything a plan reads lengths or tokens from.

What goes in: a path, a list of paths, or a source already opened. What comes out: a
:class:`~umlos_cuda.batching.lengths.sources.LengthSource` read by rows (``len``, ``take(rows)``,
``binding()``, ``release()``, ``origin``), which for a token source also answers ``arrays(row)`` and
``tokenizer_hash``. The kinds of this release (a length cache, its ``.u32`` sidecar, a token store, a
sharded token store, a Megatron prefix) are in :mod:`.builtin`; a list opens as one source with global rows
(:mod:`.listed`). A plan records where it read from (``origin``) and reopens it with :func:`open_source`,
whatever kind it names, so no caller has to know what a folder was built over.

Modules:
    kind     :class:`SourceKind`: a name, the test that recognises a path, the opener
    builtin  the kinds of this release, in the order a path is tried
    listed   :class:`SourceList`: several sources as one, global rows

Adding a kind (docs/architecture.md, "Adding a source kind"): a module that defines its
:class:`SourceKind` and calls :func:`register_source_kind` when imported; a kind registered at run time is
tried before the built-in ones (the tests register a toy kind this way).
"""

from __future__ import annotations

import os
from threading import Lock
from typing import Any

from ... import errors
from ...errors import UmlosError
from ..lengths.cache import LengthCache
from ..lengths.sources import LengthSource
from .builtin import BUILT_IN
from .kind import SourceKind, registry_error
from .listed import SourceList

__all__ = ["SourceKind", "SourceList", "length_cache", "open_source", "register_source_kind", "source_kind",
           "source_kinds", "unregister_source_kind"]

_added: list[SourceKind] = []
_lock = Lock()


def source_kinds() -> tuple[SourceKind, ...]:
    """Every kind, in the order a path is tried: those registered at run time (newest first), then the built-in."""
    return tuple(_added) + BUILT_IN


def register_source_kind(kind: SourceKind) -> SourceKind:
    """Add ``kind`` (tried before every kind registered earlier and before the built-in ones) and return it;
    INVALID_ARGUMENT when its name is taken."""
    if not isinstance(kind, SourceKind):
        raise registry_error(f"register_source_kind takes a SourceKind, got {type(kind).__name__}")
    with _lock:
        if any(other.name == kind.name for other in source_kinds()):
            raise registry_error(f"source kind {kind.name!r} is already registered")
        _added.insert(0, kind)
    return kind


def unregister_source_kind(name: str) -> None:
    """Remove the kind registered at run time as ``name`` (a built-in kind cannot be removed)."""
    with _lock:
        for kind in _added:
            if kind.name == name:
                _added.remove(kind)
                return
    raise registry_error(f"no source kind {name!r} was registered at run time")


def source_kind(path) -> SourceKind:
    """The kind ``path`` is: the first whose ``recognise`` accepts it (the length cache takes any path)."""
    path = os.fspath(path)
    return next(kind for kind in source_kinds() if kind.recognise(path))


def open_source(path: Any, *, tokens: bool = False, recorded: bool = False) -> LengthSource:
    """The source at ``path``, read by rows, its ``origin`` set to the path it was opened from, as given (a
    length cache's: its sidecar; give an absolute path for a plan that may be read from elsewhere). A list
    or tuple opens as a :class:`SourceList`; a source already opened is returned as is.
    ``tokens=True``: only a token source will do (TOKEN_STORE_NOT_FOUND for a length cache, saying which
    kinds are). ``recorded=True``: the path is one a plan recorded, opened by its kind's ``reopen``."""
    if isinstance(path, LengthSource):
        source = path
    elif isinstance(path, (list, tuple)):
        source = SourceList([open_source(item, tokens=tokens, recorded=recorded) for item in path])
    else:
        path = os.fspath(path)
        kind = source_kind(path)
        if tokens and not kind.tokens:
            names = ", a ".join(k.name for k in source_kinds() if k.tokens)
            raise UmlosError(errors.TOKEN_STORE_NOT_FOUND, f"{path} is a {kind.name}, which holds no tokens: give a "
                             f"{names}{_holder_hint(path)}", operator=errors.BATCHING_OPERATOR)
        source = (kind.reopen if recorded and kind.reopen is not None else kind.open)(path)
        if source.origin is None:
            source.origin = path
    if tokens and not callable(getattr(source, "arrays", None)):
        raise UmlosError(errors.TOKEN_STORE_NOT_FOUND, f"{type(source).__name__} holds no tokens",
                         operator=errors.BATCHING_OPERATOR)
    return source


def _holder_hint(path: str) -> str:
    """``; it is the length cache of the token store DIR: give DIR`` when ``path`` is a file inside a token
    source's folder (``st/lengths.jsonl``, its sidecar), else nothing."""
    from ...files.artifacts import identify
    from ...files.folder import Folder
    from ..tokens.adopt import SHARDED_STORE
    from ..tokens.writer import STORE

    folder = os.path.dirname(path) or "."
    try:
        with Folder.open(folder, follow=True) as opened:
            holder = next((kind for kind in (STORE, SHARDED_STORE) if identify(opened, kind)[0]), None)
    except OSError:
        return ""
    return "" if holder is None else f"; it is a file of the {holder.name} {folder}: give the folder, {folder}"


def length_cache(path, *, read_ids: bool = True) -> LengthCache:
    """The whole length cache of the source at ``path``, ids and all, for what needs every row at once (a whole
    plan stores the ids): its kind's ``whole`` (a length cache's JSONL read once, a sidecar's JSONL, a token
    source's own cache); LENGTHS_INVALID for a kind with none, naming windowed plans, which read by rows."""
    path = os.fspath(path)
    kind = source_kind(path)
    if kind.whole is None:
        raise UmlosError(errors.LENGTHS_INVALID, f"{path} is a {kind.name}, which gives no whole length cache (ids "
                         "and tokenizer) for a whole plan: plan windows of it (--window), which read it by rows",
                         operator=errors.BATCH_PLAN_OPERATOR)
    return kind.whole(path, read_ids)
