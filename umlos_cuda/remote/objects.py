"""The objects a planned cache reads, numbered, and where each row's bytes lie in them: a store's object table.

What goes in: the parts of a token store read from an object store, each a flat store
(:class:`~.store.RemoteTokenStore`): a flat store is one part, a sharded store's shards are one part each
(:class:`~.sharded.RemoteShardedStore`), and the global row where each part starts. What comes out: an
:class:`ObjectTable`, whose object ``2 p`` is part ``p``'s ``tokens.npy`` and object ``2 p + 1`` its
``loss_mask.npy`` (each a :class:`~.client.RemoteObject`: its URL, ETag and size recorded when its part was
opened), and, for a sequence of global rows, each row's two spans (:class:`RowSpans`): the object number and
byte range of its tokens and of its loss mask. The planned cache (:mod:`.planned`) numbers its blocks by this
table (object number << 40 | block number), so one reader serves every store kind that is a list of
(tokens, loss mask) pairs; a flat store's table is its two objects, numbered 0 and 1 as they always were. An id
has room for 2^23 objects: a sharded store's index (at most 64 MiB, some 300 bytes a shard) lists far fewer.

A row is mapped to ``(part, row within the part)`` by the parts' starts, as
:class:`~umlos_cuda.batching.tokens.concat.ConcatenatedSource` maps it, for all the rows at once (sorted by part
once, then each part's offsets indexed by its rows; a flat store's rows need no sort). Asking for spans opens
the parts the rows fall in (a sharded store's shard is opened and checked on first use), so an object is opened
by the thread that plans, never by a fetch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .client import RemoteObject


class Part(Protocol):
    """What the table reads of a part (a :class:`~.store.RemoteTokenStore`): its objects by name, and the byte
    ranges of its rows in its tokens and its loss mask."""

    objects: dict[str, RemoteObject]

    def byte_ranges(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...


#: The data objects of each part, in the order of their numbers (``2 p + column``).
COLUMNS = ("tokens", "loss_mask")


@dataclass(frozen=True)
class RowSpans:
    """For ``n`` rows, column 0 their tokens and column 1 their loss masks: ``objects[i, c]`` the object number in
    the table, ``[starts[i, c], stops[i, c])`` the bytes there (int64 ``[n, 2]`` each)."""

    objects: np.ndarray
    starts: np.ndarray
    stops: np.ndarray

    @property
    def tokens(self) -> np.ndarray:
        """How many tokens each row holds (its loss mask's length: one byte a token)."""
        return self.stops[:, 1] - self.starts[:, 1]


class ObjectTable:
    """The data objects of a store's parts (module docstring): ``table[number]`` is object ``number``, ``len``
    how many there are, :meth:`spans` where rows lie. ``row_starts`` are the global rows where the parts start
    (and the row count, last); ``open_part(p)`` opens part ``p`` (cached by the store)."""

    def __init__(self, row_starts: Sequence[int], open_part: Callable[[int], Part]) -> None:
        self.row_starts = np.asarray(row_starts, dtype=np.int64)
        self._open_part = open_part

    def __len__(self) -> int:
        return len(COLUMNS) * (self.row_starts.shape[0] - 1)

    def __getitem__(self, number: int) -> RemoteObject:
        return self._open_part(number // len(COLUMNS)).objects[COLUMNS[number % len(COLUMNS)]]

    def spans(self, rows: Sequence[int] | np.ndarray) -> RowSpans:
        """Where the bytes of each of ``rows`` (global rows of the store, checked by the caller) lie: their
        part's tokens and loss mask, the byte ranges there."""
        rows = np.asarray(rows, dtype=np.int64)
        n = rows.shape[0]
        if self.row_starts.shape[0] == 2:  # one part (a flat store): its rows are the store's, nothing to sort
            starts, stops = self._open_part(0).byte_ranges(rows)
            return RowSpans(np.broadcast_to(np.arange(len(COLUMNS), dtype=np.int64), (n, 2)), starts, stops)
        objects, starts, stops = (np.empty((n, 2), dtype=np.int64) for _ in range(3))
        part_of = np.searchsorted(self.row_starts, rows, side="right") - 1
        order = np.argsort(part_of, kind="stable")
        parts, firsts = np.unique(part_of[order], return_index=True)
        for part, low, high in zip(parts.tolist(), firsts.tolist(), [*firsts[1:].tolist(), n]):
            chosen = order[low:high]
            objects[chosen] = (len(COLUMNS) * part, len(COLUMNS) * part + 1)
            starts[chosen], stops[chosen] = self._open_part(part).byte_ranges(rows[chosen] - self.row_starts[part])
        return RowSpans(objects, starts, stops)
