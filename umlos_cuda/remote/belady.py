"""Belady's rule over a known sequence of block references: which references miss, and what each evicts.

What goes in: the blocks a reader will reference, in order (integers), and how many blocks the cache holds.
What comes out: a :class:`Schedule`: for each reference whether it misses (the block is not resident and
is fetched) and which block it evicts to make room (-1: none). The victim is the resident block whose next
reference is furthest in the future (never referenced again counts as furthest; among blocks never referenced
again, the one whose last reference is earliest, so that a reader fetching ahead waits least for its victim's
last use: which of those goes changes no miss). Belady (1966) proved this
rule fetches the fewest blocks of any rule for blocks of one size; here the future is not guessed: the plan
gives it (a pure function of seed, epoch and position), which no LRU cache of a loader that shuffles within
shard windows can know.

The planned cache (:mod:`.planned`) runs this schedule, fetching each miss ahead of its reference; since it
evicts exactly these victims, the blocks it fetches are the ones counted here, and tests compare the bytes it
fetched with this function's count and this function with a brute-force optimum on small sequences.
O(n log n) for n references, NumPy for the next-use table and a heap for the victims.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Schedule:
    """``misses[i]``: reference ``i`` fetches its block; ``victims[i]``: the block it evicts first (-1: none);
    ``next_use[i]``: the index of the next reference to the same block (``len(refs)``: none)."""

    misses: np.ndarray
    victims: np.ndarray
    next_use: np.ndarray

    @property
    def fetches(self) -> int:
        return int(self.misses.sum())


def next_uses(refs: np.ndarray) -> np.ndarray:
    """For each reference, the index of the next reference to the same block (``len(refs)`` when none)."""
    refs = np.asarray(refs, dtype=np.int64)
    n = refs.shape[0]
    out = np.full(n, n, dtype=np.int64)
    if n:
        order = np.lexsort((np.arange(n), refs))  # by block, then by position
        same = refs[order[1:]] == refs[order[:-1]]
        out[order[:-1][same]] = order[1:][same]
    return out


def belady(refs: np.ndarray, capacity: int) -> Schedule:
    """The schedule of Belady's rule for ``refs`` with room for ``capacity`` blocks (at least 1).

    Until the cache is full no block is evicted, so each block's first reference misses and nothing else
    does: that prefix is computed with NumPy, and the heap runs from the first reference that evicts (a cache
    of every block the sequence references never does), from the state the prefix leaves."""
    if capacity < 1:
        raise ValueError(f"a cache holds at least one block, not {capacity}")
    refs = np.asarray(refs, dtype=np.int64)
    n = refs.shape[0]
    following = next_uses(refs)
    misses = np.zeros(n, dtype=bool)
    victims = np.full(n, -1, dtype=np.int64)
    blocks, first = np.unique(refs, return_index=True)
    first.sort()
    full = int(first[capacity]) if blocks.shape[0] > capacity else n  # the first reference that evicts
    misses[first[first < full]] = True
    # The prefix's state: each block it references, resident, with the next use of its last reference there.
    last = np.flatnonzero(following[:full] >= full)
    resident: dict[int, int] = dict(zip(refs[last].tolist(), following[last].tolist()))
    # (-next reference, this reference, block); stale entries skipped
    heap: list[tuple[int, int, int]] = [(-int(following[i]), int(i), int(refs[i])) for i in last.tolist()]
    heapq.heapify(heap)
    for i in range(full, n):
        block = int(refs[i])
        if block not in resident:
            misses[i] = True
            if len(resident) >= capacity:
                while True:
                    negative, _, victim = heapq.heappop(heap)
                    if resident.get(victim) == -negative:
                        break
                del resident[victim]
                victims[i] = victim
        nxt = int(following[i])
        resident[block] = nxt
        heapq.heappush(heap, (-nxt, i, block))
    return Schedule(misses, victims, following)
