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

    def __call__(self, chunk) -> int:
        if chunk.first_line == self.line:
            os.kill(os.getpid(), signal.SIGKILL)
        return len(chunk.sample_ids)


def fail_with_value_error(chunk) -> int:
    raise ValueError(f"no work on line {chunk.first_line}")
