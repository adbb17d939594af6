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


def in_order(work: Callable[[RecordChunk], T], chunks: Iterable[RecordChunk], workers: int = 1,
             lines: Callable[[RecordChunk], str] | None = None) -> Generator[tuple[RecordChunk, T], None, None]:
    """``(chunk, work(chunk))`` for each chunk, in order, with ``workers`` encoding (see the module
    docstring); ``lines(chunk)`` names a chunk's records in the message of a worker that died."""
    workers = check_workers(workers)
    items = _read_failure_last(chunks)
    if workers == 1:
        yield from _threaded(work, items)
    else:
        yield from _processes(work, items, workers, lines or (lambda chunk: "a chunk"))


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


def _processes(work, items: Iterator[RecordChunk | _ReadFailed], workers: int, lines):
    first = next(items, None)
    second = None if first is None or isinstance(first, _ReadFailed) else next(items, None)
    if first is None or isinstance(first, _ReadFailed) or second is None or isinstance(second, _ReadFailed):
        for item in (first, second):  # at most one chunk: encoded here, no process started
            if isinstance(item, _ReadFailed):
                raise item.error
            if item is not None:
                yield item, work(item)
        return
    with _Pool(work, workers, lines) as pool:
        pending: deque[RecordChunk] = deque()
        for item in chain((first, second), items):
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


class _Pool:
    """N spawned worker processes, each with its own pipe; chunk ``i`` to worker ``i mod N``."""

    def __init__(self, work, workers: int, lines) -> None:
        self._context = multiprocessing.get_context("spawn")
        self._work = work
        self._size = workers
        self._lines = lines
        self._processes: list[Any] = []
        self._pipes: list[Any] = []
        self._sent = 0
        self._received = 0

    def __enter__(self) -> _Pool:
        return self

    def submit(self, chunk: RecordChunk) -> None:
        index = self._sent % self._size
        if index == len(self._processes):
            self._start()
        # The worker needs the values, where the lines are and how many rows: not the ids.
        task = replace(chunk, sample_ids=RowIds(0, len(chunk.sample_ids)), raw=None)
        with contextlib.suppress(OSError):  # the worker is gone; result() says how
            self._pipes[index].send(task)
        self._sent += 1

    def result(self, chunk: RecordChunk):
        """The result of the oldest chunk not yet returned (``chunk``)."""
        index = self._received % self._size
        self._received += 1
        try:
            ok, payload = self._pipes[index].recv()
        except (EOFError, OSError):
            process = self._processes[index]
            process.join(STOP_S)
            raise UmlosError(errors.TOKENIZER_INVALID, f"the worker process encoding {self._lines(chunk)} ended "
                             f"without a result ({_exit_status(process.exitcode)}); the tokenizer crashed or the "
                             "machine ran out of memory (fewer --workers or a smaller --chunk-size use less)",
                             operator=errors.BATCHING_OPERATOR) from None
        if ok:
            return payload
        raise _rebuilt(payload)

    def _start(self) -> None:
        ours, theirs = self._context.Pipe()
        process = self._context.Process(target=serve, args=(theirs, self._work), daemon=True,
                                        name=f"umlos-encode-{len(self._processes)}")
        with _sigint_ignored_by_children():
            try:
                process.start()
            finally:
                theirs.close()
        self._processes.append(process)
        self._pipes.append(ours)

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


def serve(pipe, work) -> None:
    """A worker's life: ``work`` each chunk received, send ``(True, result)`` or ``(False, error)``, until
    None or the pipe's end. A thread receives while the main thread encodes and sends, so neither side
    ever waits on a pipe the other is not reading."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle (ignored from the start)
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
    while (task := tasks.get()) is not None:
        try:
            message = (True, work(task))
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


def _exit_status(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _invalid_argument(message: str) -> UmlosError:
    return UmlosError(errors.INVALID_ARGUMENT, message, operator=errors.BATCHING_OPERATOR)
