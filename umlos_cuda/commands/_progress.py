"""A dependency-free progress line for long CLI work (demo, indices, golden).

On a terminal it redraws one line; in logs (CI, pipes) it prints a line at each
quarter so that output stays short and greppable.
"""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, label: str, stream=None, enabled: bool = True) -> None:
        self.total = max(int(total), 1)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = enabled and getattr(self.stream, "isatty", lambda: False)()
        self.start = time.perf_counter()
        self.done = 0
        self._next_quarter = 1

    def update(self, done: int) -> None:
        self.done = done
        if not self.enabled:
            return
        fraction = min(done / self.total, 1.0)
        if self.tty:
            width = 30
            filled = int(width * fraction)
            elapsed = time.perf_counter() - self.start
            self.stream.write(
                f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {fraction:6.1%} {elapsed:6.1f}s"
            )
            self.stream.flush()
        elif fraction * 4 >= self._next_quarter:
            while fraction * 4 >= self._next_quarter:
                self._next_quarter += 1
            self.stream.write(f"{self.label}: {fraction:.0%}\n")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()
