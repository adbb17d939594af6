"""A kind of source: a name, how a path is recognised as one, and how it opens by rows.

What goes in: nothing (a :class:`SourceKind` is a description). What comes out: the record the registry
(``umlos_cuda.batching.sources``) keeps for each kind, which :func:`~umlos_cuda.batching.sources.open_source`
tries against a path, newest registration first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ... import errors
from ...errors import UmlosError
from ..lengths.cache import LengthCache
from ..lengths.sources import LengthSource


@dataclass(frozen=True)
class SourceKind:
    """What a plan can read lengths (and, with ``tokens``, tokens) from.

    ``recognise(path)`` answers from the path's name, its type on disk or a marker: cheap, never blocking on
    a FIFO, never raising. ``open(path)`` returns the source read by rows (nothing proportional to the
    dataset in memory where the format allows), checked as far as a new plan needs before it is built on
    it, and raises the documented error of whatever is wrong with it. ``reopen(path)`` (default: ``open``)
    opens a path a plan recorded, whose binding the plan then compares with the one it holds: it may skip
    what that comparison makes redundant (a sidecar's bytes are hashed by ``plan verify``, not on every
    load). ``tokens``: its sources also answer ``arrays(row) -> (input_ids, loss_mask)`` and
    ``tokenizer_hash``, which ``plan cut`` and collation read. ``whole(path, read_ids)`` (None: the kind has
    none) reads the whole :class:`~umlos_cuda.batching.lengths.cache.LengthCache`, ids and tokenizer hash,
    which a whole plan stores; ``read_ids=False`` may skip the ids where reading them costs a pass."""

    name: str
    recognise: Callable[[str], bool]
    open: Callable[[str], LengthSource]
    tokens: bool = False
    reopen: Callable[[str], LengthSource] | None = None
    whole: Callable[[str, bool], LengthCache] | None = None


def registry_error(message: str) -> UmlosError:
    """A misuse of the registry (a kind registered twice, an unknown name): INVALID_ARGUMENT."""
    return UmlosError(errors.INVALID_ARGUMENT, message, operator=errors.BATCHING_OPERATOR)
