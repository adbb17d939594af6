"""The planned cache: a rank's rows read from an object store in plan order, each block fetched ahead of its use
and evicted by Belady's rule.

What goes in: a :class:`~.store.RemoteTokenStore` (or its URL), and the
:class:`~umlos_cuda.torch.PlanBatchSampler` that will index it (its plan, rank, world size and cursor: the
rank's share of the plan from the cursor on), a cache size ``cache_bytes``, a block size, how many steps
ahead to fetch (``lookahead``), how many requests may be in flight (``concurrency``) and the largest gap
between two ranges merged into one request (``gap_bytes``). What comes out: a token source whose
``arrays(row)`` answers the rows in the order the sampler hands them out, from memory, with every byte
fetched before it is asked for (as far as ``lookahead`` and the store's speed allow).

How: the objects are cut into blocks of ``block_bytes``. From the sampler's pass (the rows of each of this
rank's steps, from the cursor to the end of its epoch) comes the sequence of blocks the rows reference, in
order; :func:`~.belady.belady` gives, for that sequence and ``cache_bytes // block_bytes`` blocks, which
references miss and what each evicts. The reader carries that schedule out: a miss is fetched as soon as
its step is within ``lookahead`` steps and its victim's last use before it has been read (so memory never
holds more than the cache's blocks), misses issued together are merged into one ranged GET per run of
adjacent blocks (closer than ``gap_bytes``: the bytes between are fetched and dropped), sent in the order
of their first use, at most ``concurrency`` at once. So the blocks fetched are exactly Belady's (the fewest
the order allows for that cache), each at most once per epoch when the cache holds the blocks between two
uses of each, and a resumed rank (a sampler at another cursor) fetches only what its steps from there
reference.

Each epoch starts with an empty cache (the next epoch's schedule is built when the reader reaches it). A row
asked for out of the planned order (another sampler, a retry of a step) is read directly, two GETs, and
counted in ``unplanned_rows``. Every range is checked against the ETag and size recorded at opening
(:mod:`.client`): a changed object fails the read with REMOTE_OBJECT_CHANGED and its bytes are not kept.

The fetches run in threads of the process that reads: index it from a ``DataLoader`` with ``num_workers=0``
(its steps are the sampler's; a worker would see every ``num_workers``-th step only).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from .. import checks, errors
from ..batching.tokens.store import StoreFacts
from ..errors import UmlosError
from .belady import Schedule, belady
from .store import RemoteTokenStore

#: Objects a block id can name (tokens, loss mask) and the bit where the object's number starts.
_OBJECTS = ("tokens", "loss_mask")
_SHIFT = 40


def _argument_error(message: str) -> UmlosError:
    return UmlosError(errors.INVALID_ARGUMENT, message, operator=errors.REMOTE_OPERATOR)


def pass_rows(sampler: Any, epoch: int, start: int) -> list[list[int]]:
    """The dataset rows of each step ``sampler``'s rank takes from ``(epoch, start)`` to the end of that epoch: a
    fresh sampler of the same plan and layout iterated once (the sampler given is not moved)."""
    fresh = type(sampler)(sampler.plan, sampler.rank, sampler.world_size, epoch=epoch, microbatch_index=start)
    return [[int(getattr(key, "row", key)) for key in keys] for keys in fresh]


def block_refs(store: RemoteTokenStore, rows: Sequence[int], block_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """The blocks ``rows`` reference, in order (each row its tokens' blocks, then its loss mask's), as block ids
    (object number << 40 | block number), and where each row's references start (``len(rows) + 1`` values)."""
    rows_array = np.asarray(rows, dtype=np.int64)
    first, last = store.offsets[rows_array], store.offsets[rows_array + 1]
    size = store.token_dtype.itemsize
    spans = [(store.starts["tokens"] + first * size, store.starts["tokens"] + last * size),
             (store.starts["loss_mask"] + first, store.starts["loss_mask"] + last)]
    counts, firsts = [], []
    for start, stop in spans:
        low, high = start // block_bytes, np.where(stop > start, (stop - 1) // block_bytes + 1, start // block_bytes)
        counts.append(high - low)
        firsts.append(low)
    per_row = counts[0] + counts[1]
    row_start = np.zeros(len(rows_array) + 1, dtype=np.int64)
    np.cumsum(per_row, out=row_start[1:])
    refs = np.empty(int(row_start[-1]), dtype=np.int64)
    for number, (count, low) in enumerate(zip(counts, firsts)):
        base = row_start[:-1] + (counts[0] if number else 0)  # where this object's blocks of each row begin
        owner = np.repeat(np.arange(len(rows_array)), count)
        within = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
        refs[base[owner] + within] = (number << _SHIFT) | (low[owner] + within)
    return refs, row_start


class PlannedTokenSource(StoreFacts):
    """A token source reading ``store`` in the order of ``sampler``'s pass through a planned cache (module
    docstring). ``fetched_bytes`` and ``requests`` count what it fetched, ``unplanned_rows`` the rows read out of
    order; ``schedule`` is the current pass's :class:`~.belady.Schedule`. What it answers from meta.json and the
    offsets (``len``, ``lengths``, ``tokenizer_hash``, ``identity()``) is its store's."""

    def __init__(self, store: RemoteTokenStore | str, sampler: Any, *, cache_bytes: int,
                 block_bytes: int = 1 << 20, lookahead: int = 32, concurrency: int = 32, gap_bytes: int = 0) -> None:
        self.store = store if isinstance(store, RemoteTokenStore) else RemoteTokenStore.open(store)
        for name in ("plan", "rank", "world_size", "epoch", "microbatch_index"):
            if not hasattr(sampler, name):
                raise _argument_error(f"PlannedTokenSource takes the PlanBatchSampler that will index it; "
                                      f"{type(sampler).__name__} has no {name}")
        self.block_bytes = checks.integer(block_bytes, "block_bytes", 1 << 10, 1 << 30, fail=_argument_error)
        self.cache_bytes = checks.integer(cache_bytes, "cache_bytes", self.block_bytes, None, fail=_argument_error,
                                          message="{name} must hold at least one block (block_bytes, {low}), "
                                                  "got {value!r}")
        self.lookahead = checks.integer(lookahead, "lookahead", 0, 1 << 20, fail=_argument_error)
        self.gap_bytes = checks.integer(gap_bytes, "gap_bytes", 0, 1 << 30, fail=_argument_error)
        concurrency = checks.integer(concurrency, "concurrency", 1, 256, fail=_argument_error)
        self.sampler = sampler
        self.meta, self.offsets, self._lengths = self.store.meta, self.store.offsets, None
        self.capacity = self.cache_bytes // self.block_bytes
        self.fetched_bytes = self.requests = self.unplanned_rows = 0
        self._objects = [self.store.objects[name] for name in _OBJECTS]
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="planned-cache")
        self._count_lock = threading.Lock()
        self._resident: dict[int, Future] = {}
        self._start_pass(int(sampler.epoch), int(sampler.microbatch_index))

    # ------------------------------------------------------------------ what a token source answers
    @property
    def root(self) -> str:
        return self.store.root

    def length_cache(self):
        return self.store.length_cache()

    def __reduce__(self):
        raise _argument_error("a PlannedTokenSource fetches in threads of the process that reads it and cannot be "
                              "sent to a DataLoader worker: use num_workers=0 (its fetches already overlap the "
                              "training step)")

    def close(self) -> None:
        """Stop the fetch threads (fetches in flight finish) and drop the cache."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._resident.clear()

    # ------------------------------------------------------------------ the schedule
    def _start_pass(self, epoch: int, start: int) -> None:
        """The schedule of the sampler's pass from ``(epoch, start)``, and an empty cache."""
        self.epoch = epoch
        steps = pass_rows(self.sampler, epoch, start)
        self._rows = [row for step in steps for row in step]
        step_rows = np.cumsum([0] + [len(step) for step in steps], dtype=np.int64)
        self._refs, self._row_start = block_refs(self.store, self._rows, self.block_bytes)
        self._step_of_row = np.repeat(np.arange(len(steps)), np.diff(step_rows))
        self._step_ref = self._row_start[step_rows]  # the first reference of each step (and the end)
        self.schedule: Schedule = belady(self._refs, self.capacity)
        self._misses = np.flatnonzero(self.schedule.misses)
        self._issue_after = self._victims_last_use()
        self._resident.clear()
        self._row_pos = self._ref_pos = self._next_miss = 0

    def _victims_last_use(self) -> np.ndarray:
        """For each miss, the last reference to its victim before it (-1 without a victim): the miss may be
        fetched once the reader is past that reference."""
        refs, n = self._refs, self._refs.shape[0]
        out = np.full(self._misses.shape[0], -1, dtype=np.int64)
        victims = self.schedule.victims[self._misses]
        has = victims >= 0
        if n and has.any():
            keys = np.sort(refs * (n + 1) + np.arange(n))
            found = np.searchsorted(keys, victims[has] * (n + 1) + self._misses[has]) - 1
            out[has] = keys[found] % (n + 1)
        return out

    def _pump(self) -> None:
        """Issue every miss whose turn has come (module docstring), merged into ranged requests."""
        step = int(self._step_of_row[self._row_pos]) if self._row_pos < len(self._rows) else len(self._step_ref) - 1
        limit = int(self._step_ref[min(step + 1 + self.lookahead, len(self._step_ref) - 1)])
        issued: list[int] = []
        while self._next_miss < self._misses.shape[0]:
            miss = int(self._misses[self._next_miss])
            if miss >= limit or int(self._issue_after[self._next_miss]) >= self._ref_pos:
                break
            victim = int(self.schedule.victims[miss])
            if victim >= 0:
                self._resident.pop(victim, None)
            issued.append(int(self._refs[miss]))
            self._next_miss += 1
        if issued:
            self._request(issued)

    def _request(self, blocks: list[int]) -> None:
        """One ranged GET for each run of ``blocks`` (given in the order they are first used) of one object no
        more than ``gap_bytes`` apart, the runs sent in the order of their first use, so that the step the reader
        waits for is not queued behind the steps after it."""
        first_use = {block: order for order, block in enumerate(blocks)}
        gap_blocks = self.gap_bytes // self.block_bytes
        ordered = sorted(blocks)
        runs, run = [], [ordered[0]]
        for block in ordered[1:]:
            if block >> _SHIFT == run[-1] >> _SHIFT and block - run[-1] <= gap_blocks + 1:
                run.append(block)
            else:
                runs.append(run)
                run = [block]
        runs.append(run)
        for run in sorted(runs, key=lambda run: min(first_use[block] for block in run)):
            self._submit(run)

    def _submit(self, run: list[int]) -> None:
        future = self._pool.submit(self._fetch, run)
        for block in run:
            self._resident[block] = future

    def _fetch(self, run: list[int]) -> dict[int, bytes]:
        """The blocks of ``run`` (one object, sorted), fetched in one ranged GET, each its own bytes."""
        obj = self._objects[run[0] >> _SHIFT]
        mask = (1 << _SHIFT) - 1
        first, last = run[0] & mask, run[-1] & mask
        start, stop = first * self.block_bytes, min((last + 1) * self.block_bytes, obj.size)
        data = memoryview(obj.read(start, stop))
        with self._count_lock:
            self.fetched_bytes += stop - start
            self.requests += 1
        out = {}
        for block in run:
            offset = (block & mask) * self.block_bytes - start
            out[block] = bytes(data[offset:offset + self.block_bytes])
        return out

    def _block(self, block: int) -> bytes:
        future = self._resident[block]
        try:
            return future.result()[block]
        except BaseException:
            for key in [key for key, value in self._resident.items() if value is future]:
                del self._resident[key]  # nothing of a failed fetch stays
            raise

    # ------------------------------------------------------------------ reading
    def arrays(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """Row ``row``'s tokens and loss mask: from the cache when it is the row the plan reads next, else read
        directly (counted in ``unplanned_rows``)."""
        row = int(row)
        if self._row_pos >= len(self._rows) and self.epoch + 1 < int(self.sampler.plan.num_epochs):
            self._start_pass(self.epoch + 1, 0)
        if self._row_pos >= len(self._rows) or self._rows[self._row_pos] != row:
            self.unplanned_rows += 1
            return self.store.arrays(row)
        spans = self.store.spans(row)
        parts: list[list[bytes]] = [[], []]
        stop = int(self._row_start[self._row_pos + 1])
        while self._ref_pos < stop:
            self._pump()
            block = int(self._refs[self._ref_pos])
            number, index = block >> _SHIFT, block & ((1 << _SHIFT) - 1)
            start, end = spans[number]
            low = max(start, index * self.block_bytes) - index * self.block_bytes
            high = min(end, (index + 1) * self.block_bytes) - index * self.block_bytes
            parts[number].append(self._block(block)[low:high])
            self._ref_pos += 1
        self._row_pos += 1
        self._pump()  # what the next steps need goes out while the caller works on this row
        return self.store.decode(b"".join(parts[0]), b"".join(parts[1]))

    def __getitem__(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        return self.arrays(row)
