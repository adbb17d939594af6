"""Work functions the worker tests hand to spawned processes (a small module, cheap for a worker to import)."""

from __future__ import annotations

import os
import signal


def count_rows(chunk) -> int:
    return len(chunk.sample_ids)


def die_on_line(line: int):
    """A work function that kills its own process on the chunk starting at 0-based ``line``."""
    return _DieOn(line)


class _DieOn:
    def __init__(self, line: int) -> None:
        self.line = line

    def __call__(self, chunk, given_up=None) -> int:  # given_up: run as budgeted work too
        if chunk.first_line == self.line:
            os.kill(os.getpid(), signal.SIGKILL)
        return len(chunk.sample_ids)


def fail_with_value_error(chunk) -> int:
    raise ValueError(f"no work on line {chunk.first_line}")


def budgeted(burn=(), sleep=(), allocate=()):
    """A budgeted work function (``work(chunk, given_up)``): each row an item of the budget; a row whose value is
    in ``burn`` spins in one C call (``sum`` over a range: no Python code runs that a signal handler could use),
    one in ``sleep`` sleeps, one in ``allocate`` asks for 64 GiB; returns ``(row value, outcome)`` for every
    row, the outcome the reason a given-up row was given up."""
    return _Budgeted(frozenset(burn), frozenset(sleep), frozenset(allocate))


class _Budgeted:
    def __init__(self, burn, sleep, allocate) -> None:
        self.burn, self.sleep, self.allocate = burn, sleep, allocate

    def __call__(self, chunk, given_up):
        import time

        from umlos_cuda.batching.lengths import budget

        out = []
        for offset, value in enumerate(chunk.values[0]):
            if offset in given_up:
                out.append((value, given_up[offset]))
                continue
            with budget.item(offset):
                try:
                    if value in self.burn:
                        sum(range(1 << 62))
                    if value in self.sleep:
                        time.sleep(3600)
                    if value in self.allocate:
                        bytearray(64 << 30)
                    out.append((value, "ok"))
                except MemoryError:
                    out.append((value, "MemoryError"))
        return out
