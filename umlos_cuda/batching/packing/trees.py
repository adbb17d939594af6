"""First-fit and best-fit in O(n log n), in Python: the fallback of ``pack_lengths``.

Both take ``needs`` (int64, every one at most ``capacity``) and return the
row of each item, rows numbered in the order they are opened. The caller
(``packing.pack_lengths``) has already turned lengths and separators into
needs and a capacity (``length + separator_len`` and ``max_length +
separator_len``: a row then holds the separator between its sequences and
none after the last).

* First-fit keeps a max segment tree over the remaining room of the rows,
  one leaf per row. Rows not yet opened are leaves with the full capacity;
  they all lie after the open ones, so the leftmost leaf with room >= need
  is the lowest-numbered open row that fits, or else the next new row. The
  tree doubles when every leaf is open.
* Best-fit keeps, per remaining room ``r``, a min-heap of the rows with room
  ``r``, and a count tree over the rooms ``0 .. capacity`` to find the
  least room >= need that some row has, in O(log capacity). The chosen row
  is always the smallest of its heap, so a heap only ever gives up its
  minimum. The tree is a flat array up to 2^22 rooms, else a dict holding
  only the nodes in use (the same walk).

The native extension (``umlos_cuda/_packing.cpp``) does the same in C++;
this module is what runs without a compiler, and both are compared with the
plain O(n x rows) definitions in the tests.
"""

from __future__ import annotations

import heapq
from array import array
from collections import defaultdict

import numpy as np

#: Best-fit's room tree is a flat array up to this many leaves.
DENSE_ROOMS = 1 << 22


def _max_tree(leaves: np.ndarray) -> array:
    """A max segment tree (1-based, ``tree[P + i]`` = leaf ``i``) over a power-of-two array."""
    size = leaves.shape[0]
    tree = np.empty(2 * size, dtype=np.int64)
    tree[size:] = leaves
    level = size
    while level > 1:
        tree[level // 2:level] = np.maximum(tree[level:2 * level:2], tree[level + 1:2 * level:2])
        level //= 2
    return array("q", tree.tobytes())


def first_fit(needs: np.ndarray, capacity: int) -> np.ndarray:
    """Row of each item under first-fit (see the module docstring)."""
    n = int(needs.shape[0])
    size = 1
    while size < min(max(n, 1), 1024):
        size *= 2
    tree = _max_tree(np.full(size, capacity, dtype=np.int64))
    opened = 0
    rows: list[int] = []
    append = rows.append
    for need in needs.tolist():
        if opened == size:  # every leaf is an open row: double
            leaves = np.full(2 * size, capacity, dtype=np.int64)
            leaves[:size] = np.frombuffer(tree, dtype=np.int64)[size:]
            size *= 2
            tree = _max_tree(leaves)
        node = 1
        while node < size:
            node <<= 1
            if tree[node] < need:
                node += 1
        row = node - size
        append(row)
        if row == opened:
            opened += 1
        tree[node] -= need
        node >>= 1
        while node:
            left, right = tree[2 * node], tree[2 * node + 1]
            best = left if left > right else right
            if tree[node] == best:
                break
            tree[node] = best
            node >>= 1
    return np.asarray(rows, dtype=np.int64)


def best_fit(needs: np.ndarray, capacity: int) -> np.ndarray:
    """Row of each item under best-fit (see the module docstring)."""
    size = 1
    while size < capacity + 1:
        size *= 2
    counts = array("q", bytes(16 * size)) if size <= DENSE_ROOMS else defaultdict(int)
    heaps: dict[int, list[int]] = {}
    opened = 0
    rows: list[int] = []
    append = rows.append
    for need in needs.tolist():
        room = _least_at_least(counts, size, need)
        if room < 0:
            row, left = opened, capacity - need
            opened += 1
        else:
            heap = heaps[room]
            row = heapq.heappop(heap)
            if not heap:
                del heaps[room]
            _add(counts, size, room, -1)
            left = room - need
        append(row)
        same_room = heaps.get(left)
        if same_room is None:
            heaps[left] = [row]
        else:
            heapq.heappush(same_room, row)
        _add(counts, size, left, 1)
    return np.asarray(rows, dtype=np.int64)


def _add(counts, size: int, room: int, delta: int) -> None:
    node = size + room
    while node:
        counts[node] += delta
        node >>= 1


def _least_at_least(counts, size: int, need: int) -> int:
    """The least room ``>= need`` with a count, or -1."""
    node = size + need
    if counts[node] > 0:
        return need
    while node > 1:  # climb until a right sibling holds something
        if not node & 1 and counts[node + 1] > 0:
            node += 1
            break
        node >>= 1
    else:
        return -1
    while node < size:  # then the leftmost non-empty leaf below it
        node <<= 1
        if counts[node] == 0:
            node += 1
    return node - size
