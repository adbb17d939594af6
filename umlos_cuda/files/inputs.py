"""An output is never an input of the same command, under any name.

What goes in: the output path a command is about to write or replace, and
every path the same command reads. What comes out: OUTPUT_IS_INPUT when the
output *is* one of them (``--output ds.jsonl`` for ``--dataset ds.jsonl``,
a hard link to it, a symlink, ``./x`` for ``x``), *holds* one (``--force``
would delete a folder the command reads from), or *sits inside* one (the
command would write into a folder it reads, such as a model folder).

Paths are compared by identity, ``(st_dev, st_ino)``, along each path's
chain of parent folders, never by spelling: a hard link, a symlinked parent
or a bind mount of the same folder is caught like the same name. An input
that does not exist is skipped (its reader reports it).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from .. import errors
from ..errors import UmlosError

PathLike = str | os.PathLike[str]


def refuse_inputs(output: PathLike, inputs: Iterable[PathLike | None], *, operator: str = errors.OUTPUT_OPERATOR,
                  what: str = "the output") -> None:
    """Raise OUTPUT_IS_INPUT when ``output`` is, holds or sits inside one of ``inputs``."""
    output = os.path.abspath(os.fspath(output))
    own = _identity(output)
    above = {identity for identity, _ in _chain(os.path.dirname(output))}
    for given in inputs:
        if given is None:
            continue
        path = os.fspath(given)
        identity = _identity(path)
        if identity is None:
            continue
        if identity == own:
            raise _error(f"{what} {output} is {path}, which this command reads; write to another path", operator)
        if identity in above:
            raise _error(f"{what} {output} would be inside {path}, which this command reads; write it elsewhere",
                         operator)
        if own is not None and own in {i for i, _ in _chain(os.path.dirname(os.path.realpath(path)))}:
            raise _error(f"{what} {output} holds {path}, which this command reads: replacing it would remove the "
                         "command's own input; write elsewhere, or move the input out first", operator)


def _identity(path: str) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return None
    return info.st_dev, info.st_ino


def _chain(folder: str) -> list[tuple[tuple[int, int], str]]:
    """The identities of ``folder`` (resolved) and of every folder above it."""
    chain = []
    current = os.path.realpath(folder)
    while True:
        identity = _identity(current)
        if identity is not None:
            chain.append((identity, current))
        parent = os.path.dirname(current)
        if parent == current:
            return chain
        current = parent


def _error(message: str, operator: str) -> UmlosError:
    return UmlosError(errors.OUTPUT_IS_INPUT, message, operator=operator)
