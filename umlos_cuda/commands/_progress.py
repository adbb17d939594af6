"""A dependency-free progress line for long CLI work: how far, how fast, how long still.

Every line says the share done, the count, the rate and the time left at
that rate (``plan p: 40% (4/10), 1.3/s, 0:05 left``; byte counts are shown
in MB). On a terminal one line is redrawn at each update. In a log (CI, a
pipe) a line is written once a second has passed, so a slow start shows
within a second rather than at the first quarter, then every
:data:`LOG_EVERY_S` seconds, and always at the end, where it gives the
total time and the mean rate instead of the time left.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

#: In a log: the first line once this many seconds have passed, then one every LOG_EVERY_S.
FIRST_LINE_S = 1.0
LOG_EVERY_S = 10.0


class Progress:
    """``Progress(total, label)``; call ``update(done)`` as work finishes and ``close()`` at the end.

    ``unit="B"`` shows counts and rates in MB; ``clock`` (seconds, default
    ``time.monotonic``) is for tests."""

    def __init__(self, total: int, label: str, stream=None, enabled: bool = True, *, unit: str = "",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total = max(int(total), 1)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.unit = unit
        self.tty = enabled and getattr(self.stream, "isatty", lambda: False)()
        self.clock = clock
        self.start = clock()
        self.done = 0
        self._next_line = self.start + FIRST_LINE_S
        self._finished = False

    def update(self, done: int) -> None:
        self.done = done
        if not self.enabled or self._finished:
            return
        now = self.clock()
        finished = done >= self.total
        if self.tty:
            self.stream.write("\r" + self.line(now) + "\033[K")
            self.stream.flush()
        elif finished or now >= self._next_line:
            self._next_line = now + LOG_EVERY_S
            self.stream.write(self.line(now) + "\n")
            self.stream.flush()
        self._finished = finished

    def line(self, now: float) -> str:
        """The text of one progress line at time ``now``."""
        elapsed = max(now - self.start, 1e-9)
        done = min(self.done, self.total)
        rate = done / elapsed
        head = f"{self.label}: {done / self.total:.0%} ({self._amount(done)}/{self._amount(self.total)})"
        if done >= self.total:
            return f"{head} in {elapsed:.1f} s, {self._amount(rate)}/s"
        left = f"{_clock((self.total - done) / rate)} left" if rate > 0 else "time left unknown"
        return f"{head}, {self._amount(rate)}/s, {left}"

    def _amount(self, value: float) -> str:
        if self.unit == "B":
            return f"{value / 1e6:,.1f} MB"
        return f"{value:,.0f}" if value >= 10 or float(value).is_integer() else f"{value:.2g}"

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _clock(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"
