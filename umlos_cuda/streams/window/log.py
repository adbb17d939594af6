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

A log is never written through a symbolic link: a new log is created with
``O_EXCL | O_NOFOLLOW`` (a link at its name, dangling or not, is refused,
never followed), and every append reopens it with ``O_NOFOLLOW`` and checks
that it is still the regular file this writer created or opened
(``WINDOW_LOG_INVALID`` otherwise). Its mode comes from the umask.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ... import checks, errors
from ...errors import UmlosError
from ...files import durable, reader
from ...files.artifacts import ArtifactKind, first_line_field
from ..failures import failure
from ..types import canonical_json

FORMAT = "umlos-cuda/window-log-v1"
LOG_NAME = "windows.jsonl"
#: A ``gym run`` folder (windows.jsonl and run.json); one written before markers is known by its log's header.
GYM_RUN = ArtifactKind("gym run", lambda folder: first_line_field(folder, LOG_NAME, "format") == FORMAT)
#: How a log is reopened to append: never through a link, never blocking on a FIFO.
_APPEND = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def log_path(path: str | os.PathLike[str]) -> str:
    """``path`` itself, or ``path/windows.jsonl`` for a folder."""
    path = os.fspath(path)
    return os.path.join(path, LOG_NAME) if os.path.isdir(path) else path


class WindowLog:
    """Appends to a window log; creating one writes its header."""

    def __init__(self, path: str | os.PathLike[str], header: dict[str, Any] | None = None) -> None:
        self.path = os.fspath(path)
        if header is not None:
            directory = os.path.dirname(os.path.abspath(self.path))
            try:
                os.makedirs(directory, exist_ok=True)
                fd = durable.create_exclusive(self.path, 0o666)
            except FileExistsError:
                what = "is a symbolic link" if os.path.islink(self.path) else "exists"
                raise failure(errors.WINDOW_LOG_INVALID, f"{self.path} {what}; a new run writes a new log (never "
                                                         "through a link): give a new path") from None
            except OSError as exc:
                raise failure(errors.WINDOW_LOG_INVALID, f"cannot create the window log {self.path}: "
                                                         f"{exc.strerror or exc}") from None
            try:
                self._identity = _identity(os.fstat(fd))
                self._write(fd, {"kind": "header", "format": FORMAT, **header})
                durable.fsync_directory(directory)
            except OSError as exc:
                raise failure(errors.WINDOW_LOG_INVALID, f"cannot write the window log {self.path}: "
                                                         f"{exc.strerror or exc}") from None
            finally:
                os.close(fd)
        else:
            try:
                info = os.lstat(self.path)
            except OSError:
                info = None
            if info is None or not stat.S_ISREG(info.st_mode):
                what = "is not a regular file" if info is not None else "does not exist"
                raise failure(errors.WINDOW_LOG_INVALID, f"no window log at {self.path}: it {what}")
            self._identity = _identity(info)

    def append(self, record: dict[str, Any]) -> None:
        try:
            fd = os.open(self.path, _APPEND)
        except OSError as exc:
            reason = "it became a symbolic link" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
            raise failure(errors.WINDOW_LOG_INVALID, f"cannot append to the window log {self.path}: {reason}; "
                                                     "nothing was written through it") from None
        try:
            if _identity(os.fstat(fd)) != self._identity:
                raise failure(errors.WINDOW_LOG_INVALID, f"{self.path} is no longer the window log this run writes "
                                                         "(it was replaced); nothing was appended")
            self._write(fd, {"kind": "window", **record})
        except OSError as exc:
            raise failure(errors.WINDOW_LOG_INVALID, f"cannot append to the window log {self.path}: "
                                                     f"{exc.strerror or exc}") from None
        finally:
            os.close(fd)

    @staticmethod
    def _write(fd: int, value: dict[str, Any]) -> None:
        durable.write_and_sync(fd, canonical_json(value) + b"\n")


def _identity(info: os.stat_result) -> tuple[int, int, bool]:
    return info.st_dev, info.st_ino, stat.S_ISREG(info.st_mode)


@dataclass
class LogContents:
    header: dict[str, Any]
    windows: list[dict[str, Any]]
    torn_tail: bool  # the file ended inside a line (dropped)


def iter_lines(path: str, drop_torn_tail: bool) -> Iterator[tuple[int, dict[str, Any] | None]]:
    """``(number, record)`` for each line (numbers from 1), read by files/reader.py: a regular file,
    each line at most :data:`~umlos_cuda.files.reader.MAX_LINE_BYTES` and 64 levels deep."""
    try:
        for index, raw in reader.iter_lines(path, _invalid):
            number = index + 1
            if not raw.endswith(b"\n"):
                if drop_torn_tail:
                    yield number, None
                    return
                raise _invalid(f"{path}:{number} is torn (the file ends inside a line); "
                               "a crash cut it: resume from a checkpoint, which drops it")
            where = f"{path}:{number}"
            value = checks.instance(reader.loads_json(raw, _invalid, where, not_json="is not JSON"), where, dict,
                                    fail=_invalid, message=_NOT_A_RECORD)
            checks.choice(value.get("kind"), where, ("header", "window"), fail=_invalid, message=_NOT_A_RECORD)
            if value["kind"] == "window":
                _check_window_record(value, where)
            yield number, value
    except FileNotFoundError:
        raise _invalid(f"cannot read the window log {path}: it does not exist") from None


def _check_window_record(value: dict[str, Any], where: str) -> None:
    """The layout every reader of window records relies on: ``added`` is a list of
    ``{"key": int >= 0, "priority": number, "sample": object}``. The sample's fields and the
    fingerprints are checked by whoever rebuilds the window (replay, resume)."""
    def fail(message: str) -> UmlosError:
        return _invalid(f"{where}: {message}")

    added = checks.instance(value.get("added"), "'added'", list, fail=fail,
                            message="{name} must be a list of samples, got {type}")
    for position, entry in enumerate(added):  # a missing field reads as None, which no check passes
        name = f"added[{position}]"
        checks.instance(entry, name, dict, fail=fail, message=_ENTRY)
        checks.integer(entry.get("key"), name, 0, None, strict=True, fail=fail, message=_ENTRY)
        checks.instance(entry.get("priority"), name, (int, float), fail=fail, message=_ENTRY)
        checks.instance(entry.get("sample"), name, dict, fail=fail, message=_ENTRY)


_NOT_A_RECORD = "{name} is not a header or window record"
_ENTRY = "{name} must be {{key: integer >= 0, priority: number, sample: object}}"


def _invalid(message: str):
    return failure(errors.WINDOW_LOG_INVALID, message)


def read_log(path: str | os.PathLike[str], *, drop_torn_tail: bool = False,
             max_windows: int | None = None) -> LogContents:
    """The header and window records (at most ``max_windows``), checked for order."""
    path = log_path(path)
    header: dict[str, Any] | None = None
    windows: list[dict[str, Any]] = []
    torn = False
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
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise failure(errors.WINDOW_LOG_INVALID, f"cannot open the window log {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "r+b") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise failure(errors.WINDOW_LOG_INVALID, f"the window log {path} is not a regular file")
        os.set_blocking(fd, True)
        keep, seen = 0, -1
        for _, raw in reader.lines_of(handle, path, _invalid):
            if not raw.endswith(b"\n") or seen == windows:
                break
            seen += 1
            keep += len(raw)
        if seen < windows:
            raise failure(errors.WINDOW_LOG_INVALID, f"{path} holds {max(seen, 0)} windows; the checkpoint needs "
                                                     f"{windows}")
        handle.truncate(keep)
        handle.flush()
        os.fsync(handle.fileno())
