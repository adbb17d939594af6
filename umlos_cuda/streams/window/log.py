"""The window log: one JSON line per window, appended durably, read back strictly.

Layout (JSONL, UTF-8): the first line is the header ``{"kind": "header",
"format": "umlos-cuda/window-log-v1", ...}`` (the buffer's configuration and
RNG key, the window configuration, the policies); then one line per window
``{"kind": "window", "window": i, "added": [...], "snapshot_fingerprint",
"plan_fingerprint", "window_fingerprint", "microbatches", "rng_offsets",
"metrics"}``, where ``added`` holds every sample added to the buffer since
the window before (``{"key", "priority", "sample"}``), so the log alone
rebuilds every window (``umlos-cuda gym replay``).

Each line is written with one ``write`` and followed by ``fsync``: after a
crash the file ends with whole lines and at most one torn line, which
:func:`read_log` refuses (``WINDOW_LOG_INVALID``) unless asked to drop it,
as a resume does; :func:`truncate_log` cuts a log back to its first windows
(the windows a checkpoint covers).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Iterator

from ... import errors
from ..failures import failure
from ..types import canonical_json

FORMAT = "umlos-cuda/window-log-v1"
LOG_NAME = "windows.jsonl"


def log_path(path: str | os.PathLike[str]) -> str:
    """``path`` itself, or ``path/windows.jsonl`` for a folder."""
    path = os.fspath(path)
    return os.path.join(path, LOG_NAME) if os.path.isdir(path) else path


class WindowLog:
    """Appends to a window log; creating one writes its header."""

    def __init__(self, path: str | os.PathLike[str], header: dict[str, Any] | None = None) -> None:
        self.path = os.fspath(path)
        if header is not None:
            if os.path.exists(self.path):
                raise failure(errors.WINDOW_LOG_INVALID, f"{self.path} exists; a new run writes a new log")
            directory = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(directory, exist_ok=True)
            self._write_line({"kind": "header", "format": FORMAT, **header})
            fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        elif not os.path.isfile(self.path):
            raise failure(errors.WINDOW_LOG_INVALID, f"no window log at {self.path}")

    def append(self, record: dict[str, Any]) -> None:
        self._write_line({"kind": "window", **record})

    def _write_line(self, value: dict[str, Any]) -> None:
        line = canonical_json(value) + b"\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)


@dataclass
class LogContents:
    header: dict[str, Any]
    windows: list[dict[str, Any]]
    torn_tail: bool  # the file ended inside a line (dropped)


def iter_lines(path: str, drop_torn_tail: bool) -> Iterator[tuple[int, dict[str, Any] | None]]:
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise failure(errors.WINDOW_LOG_INVALID, f"cannot read the window log {path}: {exc}") from None
    with handle:
        for number, raw in enumerate(handle, 1):
            if not raw.endswith(b"\n"):
                if drop_torn_tail:
                    yield number, None
                    return
                raise failure(errors.WINDOW_LOG_INVALID, f"{path}:{number} is torn (the file ends inside a line); "
                                                         "a crash cut it: resume from a checkpoint, which drops it")
            try:
                value = json.loads(raw)
            except ValueError as exc:
                raise failure(errors.WINDOW_LOG_INVALID, f"{path}:{number} is not JSON: {exc}") from None
            if not isinstance(value, dict) or value.get("kind") not in ("header", "window"):
                raise failure(errors.WINDOW_LOG_INVALID, f"{path}:{number} is not a header or window record")
            yield number, value


def read_log(path: str | os.PathLike[str], *, drop_torn_tail: bool = False, max_windows: int | None = None) -> LogContents:
    """The header and window records (at most ``max_windows``), checked for order."""
    path = log_path(path)
    header, windows, torn = None, [], False
    for number, value in iter_lines(path, drop_torn_tail):
        if value is None:
            torn = True
            break
        if header is None:
            if value["kind"] != "header" or value.get("format") != FORMAT:
                raise failure(errors.WINDOW_LOG_INVALID, f"{path}:1 is not a {FORMAT} header")
            header = value
            continue
        if value["kind"] != "window" or value.get("window") != len(windows):
            raise failure(errors.WINDOW_LOG_INVALID, f"{path}:{number} should be window {len(windows)}, "
                                                     f"got {value.get('kind')} {value.get('window')!r}")
        if max_windows is not None and len(windows) == max_windows:
            break
        windows.append(value)
    if header is None:
        raise failure(errors.WINDOW_LOG_INVALID, f"{path} holds no header")
    return LogContents(header, windows, torn)


def truncate_log(path: str | os.PathLike[str], windows: int) -> None:
    """Cut the log after its first ``windows`` window records (and any torn tail)."""
    path = log_path(path)
    keep, seen = 0, -1
    with open(path, "rb") as handle:
        for raw in handle:
            if not raw.endswith(b"\n") or seen == windows:
                break
            seen += 1
            keep += len(raw)
    if seen < windows:
        raise failure(errors.WINDOW_LOG_INVALID, f"{path} holds {max(seen, 0)} windows; the checkpoint needs {windows}")
    with open(path, "r+b") as handle:
        handle.truncate(keep)
        handle.flush()
        os.fsync(handle.fileno())
