"""The planned cache: a rank's rows read from an object store in plan order, each block fetched ahead of its use
and evicted by Belady's rule.

What goes in: a flat or sharded token store in an object store (:class:`~.store.RemoteTokenStore`,
:class:`~.sharded.RemoteShardedStore`, or its URL), and the
:class:`~umlos_cuda.torch.PlanBatchSampler` that will index it (its plan, rank, world size and cursor: the
rank's share of the plan from the cursor on), a cache size ``cache_bytes``, a block size, how many steps
ahead to fetch (``lookahead``), how many requests may be in flight (``concurrency``), the largest gap
between two ranges merged into one request (``gap_bytes``) and the most bytes one merged request fetches
(``request_bytes``). What comes out: a token source whose
``arrays(row)`` answers the rows in the order the sampler hands them out, from memory, with every byte
fetched before it is asked for (as far as ``lookahead`` and the store's speed allow), and whose
``arrays_many(rows)`` answers a microbatch's rows in one call (what ``TokenDataset.__getitems__`` asks for),
assembled together with the fetches issued where one row at a time issues them.

How: the store's data objects are cut into blocks of ``block_bytes``: its object table (:mod:`.objects`: a flat
store's tokens and loss mask, a sharded store's of each shard) numbers them, and a block's id is its object's
number << 40 | its own number. From the sampler's pass (the rows of each of this
rank's steps, from the cursor to the end of its epoch) comes the sequence of blocks the rows reference, in
order; :func:`~.belady.belady` gives, for that sequence and ``cache_bytes // block_bytes`` blocks, which
references miss and what each evicts. The reader carries that schedule out: a miss is fetched as soon as
its step is within ``lookahead`` steps and its victim's last use before it has been read (so memory never
holds more than the cache's blocks), misses issued together are merged into one ranged GET per run of
adjacent blocks (closer than ``gap_bytes``: the bytes between are fetched and dropped; a run is cut before
the block that would take it past ``request_bytes``), sent in the order of their first use, at most
``concurrency`` at once, the blocks of the step the reader is on merged apart and sent first. The first
step's blocks are requested before the pass is listed and its schedule built (from an empty cache Belady's
rule misses on exactly those first, evicting nothing, when the cache holds them), so the first step's
requests run while the reader builds the schedule. So the blocks fetched are exactly Belady's (the fewest
the order allows for that cache), each at most once per epoch when the cache holds the blocks between two
uses of each, and a resumed rank (a sampler at another cursor) fetches only what its steps from there
reference.

Rows mode (``block_bytes=0``): the units are not blocks but each row's own extents, its tokens' bytes and its
loss mask's, merged into one request only with the extents of rows adjacent in the store (no gap bytes); the
schedule is the same Belady schedule over those units, with room for ``cache_bytes`` over the longest row's
token bytes. A pass that reads each row once fetches each row's bytes exactly once whatever the cache (at
most the stored bytes, under any order), at the price of about two requests a row; the cache bounds only how
far ahead the reader can fetch. It has no disk tier.

Each epoch starts with an empty cache (the next epoch's schedule is built when the reader reaches it). A row
asked for out of the planned order (another sampler, a retry of a step) is read directly, two GETs, and
counted in ``unplanned_rows``. A Megatron pair (its loss mask no object of its own) is refused with
REMOTE_UNAVAILABLE. Every range is checked against the ETag and size recorded at opening
(:mod:`.client`): a changed object fails the read with REMOTE_OBJECT_CHANGED and its bytes are not kept.

A disk tier (``cache_dir``, ``disk_bytes``): each memory miss looks for its block in a folder of block files
first (:mod:`.blockfiles`: files named by object, ETag and block, each verified when read, written by one
process of those sharing the folder, the others waiting for it), and only a block not there is fetched. The
folder runs a second Belady schedule over the same references with ``disk_bytes // block_bytes`` blocks: a
reference that misses there evicts that schedule's victim's file (once the reader is past the victim's last
use before it), so what this process keeps on disk is at most ``disk_bytes``. Belady's rule with one order of
ties is a stack algorithm (Mattson et al., 1970): a block resident in memory is resident on disk too, so the
disk tier's misses are among the memory tier's, and a block that falls out of memory is read back from disk
rather than fetched again. A block found on disk is not fetched; with a folder of this process alone, the
blocks fetched are exactly the disk schedule's misses.

The fetches run in threads of the process that reads, started when it first reads (never in the process that
built the source, when a ``DataLoader`` worker reads it). In a worker (``num_workers > 0``) the source plans the
worker's own share: the ``DataLoader`` hands step ``i`` of a pass to worker ``i % num_workers`` (``in_order``,
its default), so each worker's schedule is those steps of the sampler's pass, and it prefetches only its own
batches. A worker must be started by ``spawn`` or ``forkserver`` (``multiprocessing_context``): the client
library's runtime does not survive a ``fork`` of a process that has used it (a request would hang), so a source
forked into a worker is refused with REMOTE_UNAVAILABLE when it first reads.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from .. import checks, errors
from ..errors import UmlosError
from .belady import Schedule, belady
from .blockfiles import BlockFolder
from .client import RemoteObject, remote_error
from .kinds import open_remote_store
from .megatron import RemoteMegatron
from .objects import RowSpans
from .sharded import RemoteShardedStore
from .store import RemoteTokenStore

#: The bit where a block id's object number (its number in the store's object table, :mod:`.objects`) starts.
_SHIFT = 40
#: A store the planned cache reads: one with an object table of (tokens, loss mask) pairs.
PlannedStore = RemoteTokenStore | RemoteShardedStore
#: The default of ``request_bytes``: the most bytes one merged request fetches (docs/object-stores.md, "The
#: planned cache": a whole-dataset shuffle's first pump merges nearly the whole store, and the first step's
#: blocks waited behind runs of tens of MB).
REQUEST_BYTES = 4 << 20
#: The default of ``lookahead``: steps ahead of the reader whose misses may be in flight (docs/performance.md,
#: "Reading from object stores beside Streaming and LitData": at 100 ms a request, 32 steps left the reader
#: waiting on requests; memory does not grow with it, the schedule's victims bound it).
LOOKAHEAD = 256


def _argument_error(message: str) -> UmlosError:
    return UmlosError(errors.INVALID_ARGUMENT, message, operator=errors.REMOTE_OPERATOR)


def pass_rows(sampler: Any, epoch: int, start: int, steps: int | None = None) -> list[list[int]]:
    """The dataset rows of each step ``sampler``'s rank takes from ``(epoch, start)`` to the end of that epoch (or
    of its first ``steps``): a fresh sampler of the same plan and layout iterated (the sampler given is not
    moved)."""
    fresh = type(sampler)(sampler.plan, sampler.rank, sampler.world_size, epoch=epoch, microbatch_index=start)
    return [[int(getattr(key, "row", key)) for key in keys] for keys in itertools.islice(fresh, steps)]


def worker_share() -> tuple[int, int]:
    """``(worker id, number of workers)`` of the ``DataLoader`` worker this code runs in; ``(0, 1)`` outside one."""
    torch = sys.modules.get("torch")
    info = torch.utils.data.get_worker_info() if torch is not None else None
    return (0, 1) if info is None else (int(info.id), int(info.num_workers))


def planned_store(store: Any) -> PlannedStore:
    """``store`` (a flat or sharded store opened from an object store), or the store at its URL;
    REMOTE_UNAVAILABLE for a Megatron pair, whose loss mask is no object of its own."""
    opened = store if isinstance(store, (RemoteTokenStore, RemoteShardedStore, RemoteMegatron)) else \
        open_remote_store(os.fspath(store))
    if isinstance(opened, RemoteMegatron):
        raise remote_error(errors.REMOTE_UNAVAILABLE, f"{opened.prefix} is a Megatron-LM pair, and the planned cache "
                           "reads token stores (flat or sharded) only: read the pair by rows (TokenDataset(URL), one "
                           "ranged GET a row), or from disk")
    return opened


def block_refs(store: PlannedStore, rows: Sequence[int], block_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """The blocks ``rows`` of ``store`` reference, in order (each row its tokens' blocks, then its loss mask's), as
    block ids (the object's number in ``store.object_table()`` << 40 | block number), and where each row's
    references start (``len(rows) + 1`` values)."""
    return span_refs(store.object_table().spans(rows), block_bytes)


def span_refs(spans: RowSpans, block_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`block_refs` of rows whose spans (:meth:`.objects.ObjectTable.spans`) are ``spans``."""
    counts, firsts = [], []
    for column in (0, 1):
        start, stop = spans.starts[:, column], spans.stops[:, column]
        low, high = start // block_bytes, np.where(stop > start, (stop - 1) // block_bytes + 1, start // block_bytes)
        counts.append(high - low)
        firsts.append(low)
    n = spans.objects.shape[0]
    row_start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts[0] + counts[1], out=row_start[1:])
    refs = np.empty(int(row_start[-1]), dtype=np.int64)
    for column, (count, low) in enumerate(zip(counts, firsts)):
        base = row_start[:-1] + (counts[0] if column else 0)  # where this column's blocks of each row begin
        owner = np.repeat(np.arange(n), count)
        within = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
        refs[base[owner] + within] = (spans.objects[owner, column] << _SHIFT) | (low[owner] + within)
    return refs, row_start


def row_refs(spans: RowSpans, rows: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """What :func:`span_refs` gives in rows mode (``block_bytes=0``): each row's own extents, its tokens' and then
    its loss mask's (none for an empty row), as ids (the object's number << 40 | the store's row), and where each
    row's start."""
    rows_array = np.asarray(rows, dtype=np.int64)
    present = spans.tokens > 0
    row_start = np.zeros(len(rows_array) + 1, dtype=np.int64)
    np.cumsum(2 * present.astype(np.int64), out=row_start[1:])
    kept = rows_array[present]
    refs = np.empty(2 * kept.shape[0], dtype=np.int64)
    refs[0::2] = (spans.objects[present, 0] << _SHIFT) | kept
    refs[1::2] = (spans.objects[present, 1] << _SHIFT) | kept
    return refs, row_start


def is_mask(refs: np.ndarray) -> np.ndarray:
    """Which of the block ids ``refs`` are blocks of a loss mask (an odd object number: :mod:`.objects`)."""
    return ((refs >> _SHIFT) & 1).astype(bool)


class PlannedTokenSource:
    """A token source reading ``store`` in the order of ``sampler``'s pass through a planned cache (module
    docstring). ``fetched_bytes`` and ``requests`` count what it fetched, ``unplanned_rows`` the rows read out of
    order; once it has read, ``schedule`` (and ``disk_schedule`` with a disk tier) is the current pass's
    :class:`~.belady.Schedule`, ``blocks`` its :class:`~.blockfiles.BlockFolder` (None without one: it counts the
    blocks fetched and found there) and ``share`` the ``(worker, workers)`` whose steps it plans. What it
    answers from meta.json (or a sharded store's index) and the offsets (``len``, ``lengths``, ``tokenizer_hash``,
    ``identity()``, ...) is its store's."""

    def __init__(self, store: PlannedStore | str, sampler: Any, *, cache_bytes: int,
                 block_bytes: int = 1 << 20, lookahead: int = LOOKAHEAD, concurrency: int = 32, gap_bytes: int = 0,
                 request_bytes: int = REQUEST_BYTES, cache_dir: str | os.PathLike[str] | None = None,
                 disk_bytes: int | None = None) -> None:
        self.store = planned_store(store)
        for name in ("plan", "rank", "world_size", "epoch", "microbatch_index"):
            if not hasattr(sampler, name):
                raise _argument_error(f"PlannedTokenSource takes the PlanBatchSampler that will index it; "
                                      f"{type(sampler).__name__} has no {name}")
        self.block_bytes = 0 if block_bytes == 0 and checks.is_integer(block_bytes) else checks.integer(
            block_bytes, "block_bytes", 1 << 10, 1 << 30, fail=_argument_error,
            message="{name} must be an int, 0 (each row its own extent) or from {low} to {high}, got {value!r}")
        self.rows_mode = self.block_bytes == 0
        # The most bytes one unit (a block, or in rows mode a row's tokens) holds: the cache holds at least one.
        self.unit_bytes = self.block_bytes or max(1, int(np.asarray(self.store.lengths).max(initial=0))
                                                  * np.dtype(self.store.token_dtype).itemsize)
        self.cache_bytes = checks.integer(cache_bytes, "cache_bytes", self.unit_bytes, None, fail=_argument_error,
                                          message="{name} must hold at least one block (block_bytes), or in rows "
                                                  "mode the longest row's tokens: {low}; got {value!r}")
        self.lookahead = checks.integer(lookahead, "lookahead", 0, 1 << 20, fail=_argument_error)
        self.gap_bytes = checks.integer(gap_bytes, "gap_bytes", 0, 0 if self.rows_mode else 1 << 30,
                                        fail=_argument_error, message="{name} must be an int from {low} to {high} "
                                        "(0 in rows mode, block_bytes=0: only adjacent rows merge), got {value!r}")
        self.request_bytes = checks.integer(request_bytes, "request_bytes", 1, 1 << 40, fail=_argument_error)
        self.concurrency = checks.integer(concurrency, "concurrency", 1, 256, fail=_argument_error)
        if (cache_dir is None) != (disk_bytes is None):
            raise _argument_error("cache_dir and disk_bytes come together: the folder of the disk tier and the "
                                  "most bytes this process keeps there")
        if self.rows_mode and cache_dir is not None:
            raise _argument_error("the disk tier keeps blocks: rows mode (block_bytes=0) has none; give block_bytes "
                                  "to keep a cache_dir, or leave cache_dir out")
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        self.disk_bytes = None if disk_bytes is None else checks.integer(
            disk_bytes, "disk_bytes", self.cache_bytes, None, fail=_argument_error,
            message="{name} must be at least cache_bytes ({low}): the disk holds what memory holds, got {value!r}")
        self.sampler = sampler
        self.capacity = self.cache_bytes // self.unit_bytes
        self.fetched_bytes = self.requests = self.unplanned_rows = 0
        self._objects = self.store.object_table()  # block ids index it: object number << 40 | block
        self._count_lock = threading.Lock()
        self._resident: dict[int, Future | bytes] = {}
        # The cursor the first pass starts at: the sampler's now (it moves once a loader iterates it).
        self._cursor = (int(sampler.epoch), int(sampler.microbatch_index))
        self.epoch = self._cursor[0]
        self._owner = os.getpid()
        self._pool: ThreadPoolExecutor | None = None
        self.blocks: BlockFolder | None = None
        self.share = (0, 1)

    def _started(self) -> None:
        """Start the fetch threads, the disk tier and the first pass in the process that reads (module
        docstring): the share of a ``DataLoader`` worker, REMOTE_UNAVAILABLE in a forked copy."""
        if self._pool is not None:
            return
        if os.getpid() != self._owner:
            raise remote_error(errors.REMOTE_UNAVAILABLE, f"a PlannedTokenSource of {self.store.root} was copied "
                               "into this process by fork (a DataLoader worker of the default start method), and the "
                               "object-store client does not survive a fork of a process that has used it: give the "
                               "DataLoader multiprocessing_context='spawn' or 'forkserver'")
        self.share = worker_share()
        if self.cache_dir is not None:
            self.blocks = BlockFolder(self.cache_dir, self.block_bytes)
        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="planned-cache")
        self._start_pass(*self._cursor)

    # ------------------------------------------------------------------ what a token source answers
    @property
    def root(self) -> str:
        return self.store.root

    def length_cache(self):
        return self.store.length_cache()

    @property
    def meta(self) -> dict:
        return self.store.meta

    def __len__(self) -> int:
        return len(self.store)

    @property
    def num_samples(self) -> int:
        return len(self.store)

    @property
    def num_tokens(self) -> int:
        return self.store.num_tokens

    @property
    def lengths(self) -> np.ndarray:
        return self.store.lengths

    @property
    def tokenizer_hash(self) -> str:
        return self.store.tokenizer_hash

    @property
    def tokenizer_parts(self) -> dict[str, str] | None:
        return self.store.tokenizer_parts

    @property
    def dataset_hash(self) -> str | None:
        return self.store.dataset_hash

    @property
    def vocab_size(self) -> int | None:
        return self.store.vocab_size

    @property
    def ids_are_line_numbers(self) -> bool:
        return self.store.ids_are_line_numbers

    def identity(self) -> dict:
        return self.store.identity()

    def __reduce__(self):
        """What a ``DataLoader`` worker started by ``spawn`` or ``forkserver`` receives: the store's URL, the
        sampler (its cursor) and the options; the worker opens the store again and plans its own share."""
        options = {"cache_bytes": self.cache_bytes, "block_bytes": self.block_bytes, "lookahead": self.lookahead,
                   "concurrency": self.concurrency, "gap_bytes": self.gap_bytes,
                   "request_bytes": self.request_bytes, "cache_dir": self.cache_dir, "disk_bytes": self.disk_bytes}
        return (_rebuild, (self.store, self.sampler, options))

    def close(self) -> None:
        """Stop the fetch threads (fetches in flight finish) and drop the cache in memory (the disk tier's files
        stay, for the next reader)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._resident.clear()
        if self.blocks is not None:
            self.blocks.close()

    # ------------------------------------------------------------------ the schedule
    def _start_pass(self, epoch: int, start: int) -> None:
        """The schedule of the sampler's pass from ``(epoch, start)``, and an empty cache."""
        left = self._disk_resident()  # what the pass before keeps on disk
        self.epoch = epoch
        worker, workers = self.share
        self._resident.clear()
        self._row_pos = self._ref_pos = self._next_miss = self._pump_at = 0
        # The first step's blocks go out before the pass is listed and its schedule built (most of the time
        # before the first step can be read, at 200,000 rows: docs/object-stores.md, "The planned cache").
        early = self._first_step_blocks(pass_rows(self.sampler, epoch, start, worker + 1)[worker:])
        if early:
            self._request(early, urgent=len(early))
        steps = pass_rows(self.sampler, epoch, start)[worker::workers]
        self._rows = [row for step in steps for row in step]
        step_rows = np.cumsum([0] + [len(step) for step in steps], dtype=np.int64)
        spans = self._objects.spans(self._rows)  # opens the parts (shards) the pass reads, here, not in a fetch
        self._refs, self._row_start = self._references(self._rows, spans)
        self._row_tokens = spans.tokens
        self._step_of_row = np.repeat(np.arange(len(steps)), np.diff(step_rows))
        self._step_ref = self._row_start[step_rows]  # the first reference of each step (and the end)
        self._ref_row = np.repeat(np.arange(len(self._rows)), np.diff(self._row_start))
        self._ref_low, self._ref_high = self._pieces(spans)
        self.schedule: Schedule = belady(self._refs, self.capacity)
        self._misses = np.flatnonzero(self.schedule.misses)
        self._issue_after = self._last_use_before(self._misses, self.schedule.victims[self._misses])
        self.disk_schedule: Schedule | None = None
        if self.disk_bytes is not None:
            # The disk tier's victims: at each memory miss that misses on disk too (module docstring).
            self.disk_schedule = belady(self._refs, self.disk_bytes // self.block_bytes)
            victims = np.where(self.disk_schedule.misses[self._misses], self.disk_schedule.victims[self._misses], -1)
            self._disk_victims = victims
            self._issue_after = np.maximum(self._issue_after, self._last_use_before(self._misses, victims))
            # Of what the pass before left, this pass keeps the blocks it loads before its first eviction (its
            # schedule holds them from then on); the rest are removed, so this process keeps disk_bytes at most.
            first = self._refs[:int(np.argmax(self.disk_schedule.victims >= 0))] if (
                self.disk_schedule.victims >= 0).any() else self._refs
            assert self.blocks is not None
            for block in sorted(left - set(first.tolist()) - set(early)):
                self.blocks.remove(self._objects[block >> _SHIFT], block & ((1 << _SHIFT) - 1))
        self._next_miss = len(early)  # the schedule's first misses are these blocks (_first_step_blocks)

    def _references(self, rows: Sequence[int], spans: RowSpans | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The units ``rows`` (whose spans are ``spans``, when known) reference and where each row's start:
        blocks, or in rows mode the rows' extents."""
        spans = self._objects.spans(rows) if spans is None else spans
        return row_refs(spans, rows) if self.rows_mode else span_refs(spans, self.block_bytes)

    def _first_step_blocks(self, first_step: list[list[int]]) -> list[int]:
        """The blocks of the pass's first step (``first_step``: its rows, or nothing) in the order of first use,
        when the cache holds them all: from an empty cache Belady's rule misses on exactly these first,
        evicting nothing, so they can be requested before the schedule is built (none when they do not fit:
        then the schedule says what is evicted)."""
        if not first_step:
            return []
        refs = self._references(first_step[0])[0]
        blocks, first = np.unique(refs, return_index=True)
        return [] if blocks.shape[0] > self.capacity else refs[np.sort(first)].tolist()

    def _pieces(self, spans: RowSpans) -> tuple[np.ndarray, np.ndarray]:
        """Where each reference's bytes lie in its block, ``[low, high)``: the part of the block that its row's
        range in that object covers (computed once a pass, so that reading a row only slices); in rows mode the
        whole extent."""
        column = is_mask(self._refs).astype(np.int64)
        begin, end = spans.starts[self._ref_row, column], spans.stops[self._ref_row, column]
        if self.rows_mode:
            return np.zeros(self._refs.shape[0], dtype=np.int64), end - begin
        base = (self._refs & ((1 << _SHIFT) - 1)) * self.block_bytes
        return ((np.maximum(begin, base) - base).astype(np.int32),
                (np.minimum(end, base + self.block_bytes) - base).astype(np.int32))

    def _extents(self, units: list[int]) -> list[tuple[int, int]]:
        """The byte range ``[start, stop)`` of each unit (a block, or in rows mode a row's extent) in its
        object."""
        ids = np.asarray(units, dtype=np.int64)
        numbers, indices = ids >> _SHIFT, ids & ((1 << _SHIFT) - 1)
        if self.rows_mode:
            spans = self._objects.spans(indices)
            column, each = numbers & 1, np.arange(ids.shape[0])
            begin, end = spans.starts[each, column], spans.stops[each, column]
        else:
            used, where = np.unique(numbers, return_inverse=True)
            sizes = np.asarray([self._objects[int(number)].size for number in used.tolist()], dtype=np.int64)
            begin = indices * self.block_bytes
            end = np.minimum(begin + self.block_bytes, sizes[where])
        return list(zip(begin.tolist(), end.tolist()))

    def _disk_resident(self) -> set[int]:
        """The blocks the current disk schedule holds at its end (none before the first pass)."""
        schedule = getattr(self, "disk_schedule", None)
        if schedule is None:
            return set()
        resident: set[int] = set()
        for i in np.flatnonzero(schedule.misses).tolist():
            resident.discard(int(schedule.victims[i]))
            resident.add(int(self._refs[i]))
        return resident

    def _last_use_before(self, misses: np.ndarray, victims: np.ndarray) -> np.ndarray:
        """For each miss, the last reference to its victim before it (-1 without a victim): the miss may be
        fetched once the reader is past that reference."""
        refs, n = self._refs, self._refs.shape[0]
        out = np.full(misses.shape[0], -1, dtype=np.int64)
        has = victims >= 0
        if n and has.any():
            keys = np.sort(refs * (n + 1) + np.arange(n))
            found = np.searchsorted(keys, victims[has] * (n + 1) + misses[has]) - 1
            out[has] = keys[found] % (n + 1)
        return out

    def _pump(self) -> None:
        """Issue every miss whose turn has come (module docstring), merged into ranged requests."""
        step = int(self._step_of_row[self._row_pos]) if self._row_pos < len(self._rows) else len(self._step_ref) - 1
        limit = int(self._step_ref[min(step + 1 + self.lookahead, len(self._step_ref) - 1)])
        issued: list[int] = []
        urgent_before, urgent = int(self._step_ref[min(step + 1, len(self._step_ref) - 1)]), 0
        while self._next_miss < self._misses.shape[0]:
            miss = int(self._misses[self._next_miss])
            if miss >= limit or int(self._issue_after[self._next_miss]) >= self._ref_pos:
                break
            victim = int(self.schedule.victims[miss])
            if victim >= 0:
                self._resident.pop(victim, None)
            if self.blocks is not None and self._disk_victims[self._next_miss] >= 0:
                gone = int(self._disk_victims[self._next_miss])
                self.blocks.remove(self._objects[gone >> _SHIFT], gone & ((1 << _SHIFT) - 1))
            issued.append(int(self._refs[miss]))
            urgent += miss < urgent_before
            self._next_miss += 1
        # The next reference at which this loop can issue more without a new step: once past the next miss's
        # victim's last use (never, when that miss is beyond the lookahead: a new step calls the pump).
        following = self._next_miss < self._misses.shape[0]
        self._pump_at = (int(self._issue_after[self._next_miss]) + 1
                         if following and int(self._misses[self._next_miss]) < limit else 1 << 62)
        if issued:
            self._request(issued, urgent)

    def _request(self, blocks: list[int], urgent: int = 0) -> None:
        """Ranged GETs for ``blocks`` (given in the order they are first used): the first ``urgent`` (the step
        the reader is on) merged among themselves and sent first, then the rest. Each GET is a run of blocks of
        one object no more than ``gap_bytes`` apart (in rows mode: rows adjacent in the store), cut before the
        block that would take it past ``request_bytes``; the runs are sent in the order of their first use, so
        that the step the reader waits for is not queued behind the steps after it."""
        for part in (blocks[:urgent], blocks[urgent:]):
            if part:
                for run in self._runs(part):
                    self._submit(run)

    def _runs(self, blocks: list[int]) -> list[list[int]]:
        """``blocks`` merged into the runs of :meth:`_request`, in the order of their first use."""
        first_use = {block: order for order, block in enumerate(blocks)}
        gap = 1 + (self.gap_bytes // self.block_bytes if self.block_bytes else 0)
        ordered = sorted(blocks)
        extents = self._extents(ordered)
        runs, run, run_start = [], [ordered[0]], extents[0][0]
        for block, (start, stop) in zip(ordered[1:], extents[1:]):
            if block >> _SHIFT == run[-1] >> _SHIFT and block - run[-1] <= gap and stop - run_start <= \
                    self.request_bytes:
                run.append(block)
            else:
                runs.append(run)
                run, run_start = [block], start
        runs.append(run)
        return sorted(runs, key=lambda run: min(first_use[block] for block in run))

    def _submit(self, run: list[int]) -> None:
        assert self._pool is not None
        future = self._pool.submit(self._fetch, run)
        for block in run:
            self._resident[block] = future

    def _fetch(self, run: list[int]) -> dict[int, bytes]:
        """The blocks of ``run`` (one object, sorted): from the disk tier where it has them, the others fetched in
        one ranged GET per run of adjacent blocks, each its own bytes."""
        number, mask = run[0] >> _SHIFT, (1 << _SHIFT) - 1
        obj = self._objects[number]
        indices = [block & mask for block in run]
        if self.blocks is not None:
            found = self.blocks.blocks(obj, indices, lambda start, stop: self._get(obj, start, stop))
            return {(number << _SHIFT) | index: payload for index, payload in found.items()}
        extents = self._extents(run)
        start = extents[0][0]
        data = memoryview(self._get(obj, start, extents[-1][1]))
        return {block: bytes(data[low - start:high - start]) for block, (low, high) in zip(run, extents)}

    def _get(self, obj: RemoteObject, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of ``obj`` from the store, counted."""
        data = obj.read(start, stop)
        with self._count_lock:
            self.fetched_bytes += stop - start
            self.requests += 1
        return data

    def _block(self, block: int) -> bytes:
        """Block ``block``'s bytes, waiting for its fetch; once a fetch is in, its blocks are held as bytes (the
        next use of each looks no further), and nothing of a failed fetch stays."""
        held = self._resident[block]
        if not isinstance(held, Future):
            return held
        try:
            payloads = held.result()
        except BaseException:
            for key in [key for key, value in self._resident.items() if value is held]:
                del self._resident[key]
            raise
        for key, payload in payloads.items():
            if self._resident.get(key) is held:  # a block evicted while its fetch ran is not brought back
                self._resident[key] = payload
        return payloads[block]

    # ------------------------------------------------------------------ reading
    def arrays(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """Row ``row``'s tokens and loss mask: from the cache when it is the row the plan reads next, else read
        directly (counted in ``unplanned_rows``)."""
        return self.arrays_many([row])[0]

    def arrays_many(self, rows: Sequence[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        """``[arrays(row) for row in rows]``, the same bytes, fetches, checks and counts, with the rows that come
        in plan order (a microbatch's) assembled together: their pieces of blocks joined into one buffer per
        object and cut into rows, the fetches issued at the references where one row at a time issues them."""
        self._started()
        rows = [int(row) for row in rows]
        out: list[tuple[np.ndarray, np.ndarray]] = []
        done = 0
        while done < len(rows):
            if self._row_pos >= len(self._rows) and self.epoch + 1 < int(self.sampler.plan.num_epochs):
                self._start_pass(self.epoch + 1, 0)
            planned = self._rows[self._row_pos:self._row_pos + len(rows) - done]
            count = next((i for i, (want, got) in enumerate(zip(planned, rows[done:])) if want != got),
                         len(planned))
            if count == 0:
                self.unplanned_rows += 1
                out.append(self.store.arrays(rows[done]))
                done += 1
                continue
            out.extend(self._planned(count))
            done += count
        return out

    def _planned(self, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """The next ``count`` rows of the plan, from the cache: every reference read in order, the pump run at
        each reference where it has something to issue (a step begins, or the next miss's victim is done with)."""
        first, last = self._row_pos, self._row_pos + count
        ref_low, ref_high = int(self._row_start[first]), int(self._row_start[last])
        refs = self._refs[ref_low:ref_high]
        masks = is_mask(refs)
        lows, highs = self._ref_low[ref_low:ref_high].tolist(), self._ref_high[ref_low:ref_high].tolist()
        owners = self._ref_row[ref_low:ref_high]
        steps = self._step_of_row[owners].tolist()
        parts: list[list[bytes]] = [[], []]
        step, resident = -1, self._resident
        for i, (block, mask, low, high) in enumerate(zip(refs.tolist(), masks.tolist(), lows, highs)):
            if steps[i] != step or self._ref_pos >= self._pump_at:
                step = steps[i]
                self._row_pos = int(owners[i])
                self._pump()
            held = resident.get(block)
            parts[mask].append((held if held.__class__ is bytes else self._block(block))[low:high])
            self._ref_pos += 1
        self._row_pos = last
        self._pump()  # what the next steps need goes out while the caller works on these rows
        ids = np.frombuffer(b"".join(parts[0]), dtype=self.store.token_dtype)
        mask_bytes = np.frombuffer(b"".join(parts[1]), dtype=np.uint8)
        cuts = np.zeros(count + 1, dtype=np.int64)
        np.cumsum(self._row_tokens[first:last], out=cuts[1:])
        bounds = cuts.tolist()
        return [(ids[a:b], mask_bytes[a:b]) for a, b in itertools.pairwise(bounds)]

    def __getitem__(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        return self.arrays(row)


def _rebuild(store: PlannedStore, sampler: Any, options: dict[str, Any]) -> PlannedTokenSource:
    return PlannedTokenSource(store, sampler, **options)
