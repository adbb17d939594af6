"""Run each chunk's encoding on one of N workers and hand the results on in dataset order.

What goes in: ``work``, a picklable function of one chunk (a
:class:`~umlos_cuda.batching.lengths.encoder.ChunkEncoder`'s ``lengths``, or
the token store's ``encode_chunk`` bound to one), the chunks in dataset order
(an iterator read in this thread, which also keeps the dataset fingerprint
and the ids), and the number of workers. What comes out: ``(chunk,
work(chunk))`` in the order of the chunks. ``work`` is a function of the
chunk alone, so every byte written is the same for every number of workers
and every chunk size (tests/test_batching_workers.py compares the files).

One worker: a thread encodes one chunk (``encode_batch_fast`` runs in Rust,
outside the GIL) while this thread reads the next, as the builder always
did. N workers: N processes, started with ``spawn`` (never ``fork``: this
process has threads, the tokenizer's among them), each receiving ``work``,
and so the tokenizer, once; chunk ``i`` goes to worker ``i mod N`` and its
result is read back from that worker, so the order needs no bookkeeping.
At most :data:`AHEAD` chunks a worker are in flight, so memory holds O(N)
chunks. Each worker encodes on one core (``TOKENIZERS_PARALLELISM=false``: N
workers for N cores). Workers start as chunks come: a dataset of one chunk
starts none and is encoded in this process.

Failures are those of one worker, in dataset order. A chunk that cannot be
read raises only once every chunk before it was handed on, so an earlier
chunk's encoding error wins whatever N is. An error raised in a worker is
raised here as it was raised there (a ``UmlosError`` with its code and
message). A worker that dies (killed, out of memory) raises
TOKENIZER_INVALID naming the lines it was encoding. Ctrl-C (the workers
ignore SIGINT, which a terminal sends to the whole process group), SIGTERM
(the CLI turns it into an exception: umlos_cuda/cli.py) and any failure
terminate and reap every worker before the exception goes on, so the output
layer removes its hidden folder and no process stays behind. A worker whose
parent dies without that (SIGKILL) exits when its pipe closes.

Untrusted work (the render of a chat template) runs with a
:class:`~umlos_cuda.batching.lengths.budget.Budget`: always in processes,
one worker included (one process then, which may encode on every core), and
never in this process; ``work`` then takes the chunk and the items given up
(``work(chunk, given_up)``, offset to reason) and enters each item with
``budget.item`` (umlos_cuda/batching/lengths/budget.py). A worker that ends
inside an item (past its CPU seconds, killed here past its wall-clock
seconds, crashed) is replaced: the item is given up with the reason, and its
task and the others it held are sent again, in order, to the new worker,
which skips that item; the first items are run again, and the result is the
one a worker that never failed would give. A worker that ends outside an
item fails as above.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import queue
import signal
import threading
import traceback
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from itertools import chain
from typing import Any, TypeVar

from ... import checks, errors
from ...errors import UmlosError
from ..records.chunk import RecordChunk, RowIds
from .budget import Budget, Progress, Watch, begin_task, enter_worker, exit_status

T = TypeVar("T")

#: Chunks in flight per worker: one encoding, one waiting, so a worker never waits for this thread.
AHEAD = 2
#: How long a worker that is stopped is given to exit before it is killed.
STOP_S = 5.0
#: The most workers taken (more processes than this are not cores of one machine).
MAX_WORKERS = 1024


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity; ``os.cpu_count()`` where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def check_workers(workers: Any) -> int:
    """``workers`` as an int from 1 to :data:`MAX_WORKERS`, else INVALID_ARGUMENT."""
    return checks.integer(workers, "workers", 1, MAX_WORKERS, fail=_invalid_argument,
                          message="workers must be an integer from {low} to {high} (the processes that encode), "
                                  "got {value!r}")


def in_order(work: Callable[..., T], chunks: Iterable[RecordChunk], workers: int = 1,
             lines: Callable[[RecordChunk], str] | None = None, budget: Budget | None = None
             ) -> Generator[tuple[RecordChunk, T], None, None]:
    """``(chunk, work(chunk))`` for each chunk, in order, with ``workers`` encoding (see the module
    docstring); ``lines(chunk)`` names a chunk's records in the message of a worker that died. With a
    ``budget``, ``work(chunk, given_up)`` runs in worker processes only, under that budget."""
    workers = check_workers(workers)
    items = _read_failure_last(chunks)
    if workers == 1 and budget is None:
        yield from _threaded(work, items)
    else:
        yield from _processes(work, items, workers, lines or (lambda chunk: "a chunk"), budget)


class _ReadFailed:
    """The exception reading the next chunk raised, handed on as the last item instead of raised."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _read_failure_last(chunks: Iterable[RecordChunk]) -> Iterator[RecordChunk | _ReadFailed]:
    try:
        yield from chunks
    except Exception as exc:  # a bad record, an unreadable file: raised after the chunks before it
        yield _ReadFailed(exc)


def _threaded(work, items: Iterator[RecordChunk | _ReadFailed]):
    """One worker thread: chunk ``i`` is encoded while chunk ``i + 1`` is read."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="umlos-encode") as pool:
        pending = None
        for item in items:
            if isinstance(item, _ReadFailed):
                if pending is not None:
                    yield pending[0], pending[1].result()
                raise item.error
            future = pool.submit(work, item)
            if pending is not None:
                yield pending[0], pending[1].result()
            pending = (item, future)
        if pending is not None:
            yield pending[0], pending[1].result()


def _processes(work, items: Iterator[RecordChunk | _ReadFailed], workers: int, lines, budget: Budget | None):
    head: list[RecordChunk | _ReadFailed] = []
    if budget is None:  # at most one chunk: encoded here, no process started (never untrusted work)
        while len(head) < 2 and not (head and isinstance(head[-1], _ReadFailed)):
            item = next(items, None)
            if item is None:
                break
            head.append(item)
        if len(head) < 2 or isinstance(head[-1], _ReadFailed):
            for item in head:
                if isinstance(item, _ReadFailed):
                    raise item.error
                yield item, work(item)
            return
    with _Pool(work, workers, lines, budget) as pool:
        pending: deque[RecordChunk] = deque()
        for item in chain(head, items):
            if isinstance(item, _ReadFailed):
                while pending:
                    chunk = pending.popleft()
                    yield chunk, pool.result(chunk)
                raise item.error
            if len(pending) == AHEAD * workers:
                chunk = pending.popleft()
                yield chunk, pool.result(chunk)
            pool.submit(item)
            pending.append(item)
        while pending:
            chunk = pending.popleft()
            yield chunk, pool.result(chunk)


class _Ended(Exception):
    """The worker awaited ended (or was killed as stalled) before sending a result."""

    def __init__(self, stalled: bool = False) -> None:
        super().__init__()
        self.stalled = stalled


class _Pool:
    """N spawned worker processes, each with its own pipe; chunk ``i`` to worker ``i mod N``. Each worker's
    tasks not yet answered are kept (number, task, items given up) to send again to its replacement."""

    def __init__(self, work, workers: int, lines, budget: Budget | None = None) -> None:
        self._context = multiprocessing.get_context("spawn")
        self._work = work
        self._size = workers
        self._lines = lines
        self._budget = budget
        self._processes: list[Any] = []
        self._pipes: list[Any] = []
        self._progress: list[Progress | None] = []
        self._in_flight: list[deque[tuple[int, RecordChunk, dict[int, str]]]] = []
        self._sent = 0
        self._received = 0

    def __enter__(self) -> _Pool:
        return self

    def submit(self, chunk: RecordChunk) -> None:
        index = self._sent % self._size
        if index == len(self._processes):
            self._start(index)
        # The worker needs the values, where the lines are and how many rows: not the ids nor the places.
        task: tuple[int, RecordChunk, dict[int, str]] = \
            (self._sent, replace(chunk, sample_ids=RowIds(0, len(chunk.sample_ids)), read=None), {})
        self._in_flight[index].append(task)
        with contextlib.suppress(OSError):  # the worker is gone; result() says how
            self._pipes[index].send(task)
        self._sent += 1

    def result(self, chunk: RecordChunk):
        """The result of the oldest chunk not yet returned (``chunk``)."""
        index = self._received % self._size
        while True:
            try:
                ok, payload = self._receive(index)
                break
            except _Ended as ended:
                self._replace_or_raise(index, chunk, ended)
        self._in_flight[index].popleft()
        self._received += 1
        if ok:
            return payload
        raise _rebuilt(payload)

    def _receive(self, index: int):
        """The next message of worker ``index``; with a wall-clock budget, its item in progress watched."""
        pipe = self._pipes[index]
        try:
            progress = self._progress[index]
            if self._budget is not None and self._budget.wall_s > 0 and progress is not None:
                watch = Watch(progress)
                while not pipe.poll(min(1.0, self._budget.wall_s / 4)):
                    if watch.stalled(self._budget.wall_s):
                        self._processes[index].kill()
                        self._processes[index].join()
                        raise _Ended(stalled=True)
            return pipe.recv()
        except (EOFError, OSError):
            self._processes[index].join(STOP_S)
            raise _Ended() from None

    def _replace_or_raise(self, index: int, chunk: RecordChunk, ended: _Ended) -> None:
        """Worker ``index`` ended awaiting ``chunk``: inside an item of a budgeted task, give the item up and
        start a new worker with the same tasks; else TOKENIZER_INVALID naming the chunk's lines."""
        process = self._processes[index]
        number, _task, given_up = self._in_flight[index][0]
        progress = self._progress[index]
        task_now, item_now = progress.now() if progress is not None else (-1, -1)
        if self._budget is None or task_now != number or item_now < 0:
            more = "" if self._budget is None else \
                f", or its memory budget ({self._budget.memory_setting}={self._budget.memory_mib}) was too small"
            raise UmlosError(errors.TOKENIZER_INVALID, f"the worker process encoding {self._lines(chunk)} ended "
                             f"without a result ({exit_status(process.exitcode)}); the tokenizer crashed or the "
                             f"machine ran out of memory (fewer --workers or a smaller --chunk-size use less{more})",
                             operator=errors.BATCHING_OPERATOR) from None
        given_up[item_now] = self._budget.reason(process.exitcode, stalled=ended.stalled)
        self._pipes[index].close()
        self._start(index)
        for task in self._in_flight[index]:
            with contextlib.suppress(OSError):  # gone again: the next result() says how
                self._pipes[index].send(task)

    def _start(self, index: int) -> None:
        ours, theirs = self._context.Pipe()
        progress = Progress(self._context) if self._budget is not None else None
        process = self._context.Process(target=serve, daemon=True, name=f"umlos-encode-{index}",
                                        args=(theirs, self._work, self._budget,
                                              None if progress is None else progress.shared, self._size > 1))
        with _sigint_ignored_by_children():
            try:
                process.start()
            finally:
                theirs.close()
        if index == len(self._processes):
            self._processes.append(process)
            self._pipes.append(ours)
            self._progress.append(progress)
            self._in_flight.append(deque())
        else:
            self._processes[index], self._pipes[index], self._progress[index] = process, ours, progress

    def __exit__(self, kind, value, trace) -> None:
        try:
            if kind is None:
                for pipe in self._pipes:
                    with contextlib.suppress(OSError):
                        pipe.send(None)  # no more chunks
                for process in self._processes:
                    process.join(STOP_S)
            for process in self._processes:  # a failure, Ctrl-C, SIGTERM: stop them now
                if process.is_alive():
                    process.terminate()
            for process in self._processes:
                process.join(STOP_S)
                if process.is_alive():
                    process.kill()
                    process.join()
        finally:
            for pipe in self._pipes:
                pipe.close()


@contextlib.contextmanager
def _sigint_ignored_by_children() -> Iterator[None]:
    """Start a worker with SIGINT ignored, which it keeps from its first instruction on (an ignored signal
    stays ignored across ``exec``, and Python then installs no handler of its own): a Ctrl-C that
    the terminal sends the whole group while it starts is this process's to handle. SIGINT is blocked
    meanwhile, so one arriving in that moment waits for this process's own handler instead of being
    lost. Only the main thread can change a handler; elsewhere workers start as they are."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, handler)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def serve(pipe, work, budget: Budget | None = None, progress: Any = None, one_core: bool = True) -> None:
    """A worker's life: ``work`` each task received (``work(chunk, given_up)`` under a ``budget``, whose
    ``progress`` array it keeps), send ``(True, result)`` or ``(False, error)``, until None or the pipe's
    end. A thread receives while the main thread encodes and sends, so neither side ever waits on a pipe
    the other is not reading."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle (ignored from the start)
    if one_core:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core a worker: N workers for N cores
    tasks: queue.SimpleQueue = queue.SimpleQueue()

    def receive() -> None:
        try:
            while True:
                task = pipe.recv()
                tasks.put(task)
                if task is None:
                    return
        except (EOFError, OSError):  # the parent is gone
            tasks.put(None)

    threading.Thread(target=receive, name="umlos-receive", daemon=True).start()
    if budget is not None:  # after the thread started: its stack is part of what the worker holds at start
        enter_worker(budget, progress)
    while (task := tasks.get()) is not None:
        number, chunk, given_up = task
        begin_task(number)
        try:
            message = (True, work(chunk, given_up) if budget is not None else work(chunk))
        except BaseException as exc:  # every failure goes back to the parent, which raises it
            message = (False, _portable(exc))
        try:
            pipe.send(message)
        except OSError:  # the parent is gone
            return


def _portable(exc: BaseException) -> tuple[str, Any]:
    """An exception as it crosses the pipe: a UmlosError as its code, message and record (its
    constructor takes those, not its ``args``); another as itself when it pickles, else its traceback."""
    if isinstance(exc, UmlosError):
        return "umlos", (exc.code, exc.message, dict(exc.record))
    try:
        pickle.loads(pickle.dumps(exc))
        return "pickled", exc
    except Exception:  # what does not pickle comes back as text
        return "text", "".join(traceback.format_exception(exc))


def _rebuilt(payload: tuple[str, Any]) -> BaseException:
    kind, value = payload
    if kind == "umlos":
        code, message, record = value
        error = UmlosError(code, message, operator=record["failure_operator"])
        error.record = record
        return error
    if kind == "pickled":
        return value
    return RuntimeError(f"an encoding worker failed:\n{value}")


def _invalid_argument(message: str) -> UmlosError:
    return UmlosError(errors.INVALID_ARGUMENT, message, operator=errors.BATCHING_OPERATOR)
