"""One writer per store: an exclusive ``flock`` on ``STORE/.lock``.

The lock is held for the writer's whole session, so two writers can never
interleave their temp objects or renames. The kernel drops it when the holding
process dies (SIGKILL included), so a crashed writer never leaves a store
locked; the next writer takes the lock and runs recovery. Readers (verify,
restore) take no lock: they follow signed commit certificates, and committed
objects are never modified.

Readers that must tell a writer's in-flight temp objects from the leftovers
of a crashed one (``verify_store``) look at the store under a *shared* lock
for a moment (:func:`while_no_writer`): if they get it, no writer is in the
store and none can enter until they are done; if not, a writer holds it. A
writer that finds only such readers waits for them (at most
:data:`READER_WAIT` seconds) instead of failing with ``CHECKPOINT_LOCKED``.

``flock`` is advisory and local: it excludes writers on one machine; on a
network file system, use one writer host per store.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from typing import Any

from .. import errors
from ..errors import UmlosError

try:
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".lock"
#: How long a writer waits for readers that hold the shared lock for a moment.
READER_WAIT = 10.0
_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)


def _only_readers(fd: int) -> bool:
    """Whether the holders of the lock that refused ``LOCK_EX`` are readers
    (shared holders), not a writer: a shared lock is then granted at once."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return False
    fcntl.flock(fd, fcntl.LOCK_UN)
    return True


class StoreLock:
    """An exclusive lock on a store directory; use as a context manager or
    :meth:`acquire` / :meth:`release`."""

    def __init__(self, store_dir: str) -> None:
        self.path = os.path.join(store_dir, LOCK_NAME)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, timeout: float = 0.0) -> StoreLock:
        """Take the lock, waiting up to ``timeout`` seconds; ``CHECKPOINT_LOCKED`` otherwise."""
        if fcntl is None:  # pragma: no cover
            raise UmlosError(errors.CHECKPOINT_IO_ERROR, "store locking needs a POSIX system (fcntl.flock)",
                             operator=errors.CHECKPOINT_COMMIT_OPERATOR)
        if self._fd is not None:
            return self
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            raise UmlosError(
                errors.CHECKPOINT_IO_ERROR, f"cannot open the lock file {self.path}: {exc.strerror}",
                operator=errors.CHECKPOINT_COMMIT_OPERATOR,
            ) from None
        started = time.monotonic()
        deadline = started + max(0.0, timeout)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                now = time.monotonic()
                busy = exc.errno in _BUSY
                if busy and now < started + READER_WAIT and _only_readers(fd):
                    time.sleep(0.002)  # a reader looks for a moment (while_no_writer)
                    continue
                if not busy or now >= deadline:
                    os.close(fd)
                    raise UmlosError(
                        errors.CHECKPOINT_LOCKED,
                        f"another writer holds {self.path}; one writer per store",
                        operator=errors.CHECKPOINT_COMMIT_OPERATOR,
                    ) from None
                time.sleep(0.01)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def __enter__(self) -> StoreLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def while_no_writer(store_dir: str, action: Callable[[], Any]) -> tuple[bool, Any]:
    """Run ``action()`` while no writer holds the store: ``(True, result)``;
    ``(False, None)`` without running it if a writer holds the store.

    Readers never create or write anything: without a lock file no writer has
    opened the store, and if one appears while ``action`` runs, the look is
    repeated under the lock.
    """
    if fcntl is None:  # pragma: no cover
        raise UmlosError(errors.CHECKPOINT_IO_ERROR, "store locking needs a POSIX system (fcntl.flock)",
                         operator=errors.CHECKPOINT_VALIDATE_OPERATOR)
    path = os.path.join(store_dir, LOCK_NAME)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            result = action()
            if not os.path.lexists(path):
                return True, result
            continue  # a writer opened the store meanwhile: look again under the lock
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UmlosError(errors.CHECKPOINT_UNEXPECTED_FILE, f"{path} is a symbolic link",
                                 operator=errors.CHECKPOINT_VALIDATE_OPERATOR) from None
            raise UmlosError(errors.CHECKPOINT_IO_ERROR, f"cannot open the lock file {path}: {exc.strerror}",
                             operator=errors.CHECKPOINT_VALIDATE_OPERATOR) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in _BUSY:
                    return False, None
                raise UmlosError(errors.CHECKPOINT_IO_ERROR, f"cannot lock {path}: {exc.strerror}",
                                 operator=errors.CHECKPOINT_VALIDATE_OPERATOR) from None
            try:
                return True, action()
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    return False, None  # pragma: no cover - the second look holds the lock file
