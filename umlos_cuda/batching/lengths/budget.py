"""The limits on each item a worker process runs for untrusted work: CPU seconds, memory, wall-clock time.

What goes in: a :class:`Budget`, given to the worker pool of
umlos_cuda/batching/lengths/workers.py, and, inside a worker, each item of a
task entered with :func:`item` (the chat renderer enters each record:
umlos_cuda/batching/chat/chunks.py). What comes out: an item past its CPU
seconds ends its worker, an item that makes no progress for the wall-clock
seconds gets its worker killed by the parent, and an allocation past the
memory budget fails with ``MemoryError`` inside the item; in the first two
cases the pool reads from :class:`Progress` which item it was, gives that
item up with :meth:`Budget.reason` and sends the task again to a new worker.

Why a process and the kernel: the render of an untrusted chat template can
spend hours inside one C call (``==`` between two shared lists of 2^40
leaves, ``tojson`` of one), where no Python code runs that could count or
stop it. Only a limit the kernel enforces, or a kill from outside, ends it:

* CPU: :func:`item` arms ``ITIMER_PROF`` with the budget's seconds before
  the item and disarms it after; SIGPROF, whose default action ends the
  process, arrives once the item has used them, in C code or not. The timer
  counts the process's CPU time, which is the item's: a worker does nothing
  else while an item runs.
* memory: :func:`enter_worker` caps the worker's data segment
  (``RLIMIT_DATA``: its heap and private writable mappings) at what it holds
  once started plus the budget. A larger allocation fails, which Python
  raises as ``MemoryError`` where it happened, so the item fails and the
  worker goes on.
* wall clock: the parent, while it waits for a worker's result, reads the
  worker's :class:`Progress` (the task and the item in progress, two
  integers in shared memory); an item in progress for longer than the
  budget's seconds gets its worker killed (:class:`Watch`).

A limit of 0 is no limit. Outside a budgeted worker :func:`item` does
nothing, so the same code runs in a plain process too. Linux applies all
three; elsewhere the memory limit is not applied.
"""

from __future__ import annotations

import resource
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ... import checks, errors
from ...errors import UmlosError
from ...files import reader

#: Bytes in a MiB, the unit of the memory budget.
MIB = 1 << 20


@dataclass(frozen=True)
class Budget:
    """The limits of one item: ``cpu_s`` CPU seconds, ``memory_mib`` MiB a worker may grow by, ``wall_s``
    seconds by the clock (0: no limit), and the settings that set each, which messages name."""

    cpu_s: int
    memory_mib: int
    wall_s: int
    cpu_setting: str = "cpu_s"
    memory_setting: str = "memory_mib"
    wall_setting: str = "wall_s"

    def reason(self, exitcode: int | None, *, stalled: bool) -> str:
        """Why an item whose worker ended (``exitcode``, or killed by the parent when ``stalled``) was given up."""
        if stalled:
            return f"it ran for more than {self.wall_s} seconds by the clock ({self.wall_setting}={self.wall_s})"
        if exitcode == -signal.SIGPROF:
            return f"it used more than {self.cpu_s} CPU seconds ({self.cpu_setting}={self.cpu_s})"
        return (f"the worker running it ended ({exit_status(exitcode)}): it crashed or ran out of memory "
                f"({self.memory_setting}={self.memory_mib})")


class Progress:
    """Where a worker is: the number of the task it runs and the item in it (-1 between items), in memory
    the parent reads without asking the worker."""

    def __init__(self, context: Any) -> None:
        self.shared = context.RawArray("q", 2)
        self.shared[0] = self.shared[1] = -1

    def now(self) -> tuple[int, int]:
        return int(self.shared[0]), int(self.shared[1])


class Watch:
    """The parent's view of one worker: how long its item in progress has been the same."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.seen = progress.now()
        self.since = time.monotonic()

    def stalled(self, wall_s: int) -> bool:
        """True when an item has been in progress for more than ``wall_s`` seconds (0: never)."""
        now = self.progress.now()
        if now != self.seen or now[1] < 0:
            self.seen, self.since = now, time.monotonic()
            return False
        return wall_s > 0 and time.monotonic() - self.since > wall_s


@dataclass
class _Worker:
    budget: Budget
    shared: Any  # the Progress array, as the worker received it


_ACTIVE: _Worker | None = None


def enter_worker(budget: Budget, shared: Any) -> None:
    """In a new worker: the memory cap, SIGPROF's default action (end the process), and the progress
    array that :func:`begin_task` and :func:`item` write."""
    global _ACTIVE
    signal.signal(signal.SIGPROF, signal.SIG_DFL)
    if budget.memory_mib > 0:
        held = _data_bytes()
        if held is not None:
            soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
            limit = held + budget.memory_mib * MIB
            if hard != resource.RLIM_INFINITY:
                limit = min(limit, hard)
            if soft == resource.RLIM_INFINITY or limit < soft:
                resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    _ACTIVE = _Worker(budget, shared)


def begin_task(number: int) -> None:
    """A worker starts task ``number`` (no item in progress yet)."""
    if _ACTIVE is not None:
        _ACTIVE.shared[1] = -1
        _ACTIVE.shared[0] = number


@contextmanager
def item(offset: int) -> Iterator[None]:
    """Run one item of the task under the budget: its offset in the progress array, the CPU timer armed."""
    active = _ACTIVE
    if active is None:
        yield
        return
    active.shared[1] = offset
    if active.budget.cpu_s > 0:
        signal.setitimer(signal.ITIMER_PROF, active.budget.cpu_s)
    try:
        yield
    finally:
        if active.budget.cpu_s > 0:
            signal.setitimer(signal.ITIMER_PROF, 0)
        active.shared[1] = -1


def _data_bytes() -> int | None:
    """The data segment this process holds now (``VmData`` of /proc/self/status), or None where there is none."""
    try:
        status = reader.read_text("/proc/self/status", _unreadable, max_bytes=1 << 16, what="process status")
    except (FileNotFoundError, UmlosError):  # not Linux: no memory cap
        return None
    for line in status.splitlines():
        if line.startswith("VmData:"):
            kib = checks.integer_or_none(line.split()[1])
            return None if kib is None else kib * 1024
    return None


def _unreadable(message: str) -> UmlosError:
    return UmlosError(errors.INVALID_ARGUMENT, message, operator=errors.BATCHING_OPERATOR)


def exit_status(code: int | None) -> str:
    """A process's exit code in words (``killed by SIGKILL``, ``exit code 1``)."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"

