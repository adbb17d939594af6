"""One writer per store: an exclusive ``flock`` on ``STORE/.lock``.

The lock is held for the writer's whole session, so two writers can never
interleave their temp objects or renames. The kernel drops it when the holding
process dies (SIGKILL included), so a crashed writer never leaves a store
locked; the next writer takes the lock and runs recovery. Readers (verify,
restore) take no lock: they follow signed commit certificates, and committed
objects are never modified.

``flock`` is advisory and local: it excludes writers on one machine; on a
network file system, use one writer host per store.
"""

from __future__ import annotations

import errno
import os
import time

from .. import errors
from ..errors import UmlosError

try:
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".lock"


class StoreLock:
    """An exclusive lock on a store directory; use as a context manager or
    :meth:`acquire` / :meth:`release`."""

    def __init__(self, store_dir: str) -> None:
        self.path = os.path.join(store_dir, LOCK_NAME)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, timeout: float = 0.0) -> "StoreLock":
        """Take the lock, waiting up to ``timeout`` seconds; ``CHECKPOINT_LOCKED`` otherwise."""
        if fcntl is None:  # pragma: no cover
            raise UmlosError(errors.CHECKPOINT_IO_ERROR, "store locking needs a POSIX system (fcntl.flock)")
        if self._fd is not None:
            return self
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            raise UmlosError(
                errors.CHECKPOINT_IO_ERROR, f"cannot open the lock file {self.path}: {exc.strerror}",
                operator=errors.CHECKPOINT_COMMIT_OPERATOR,
            ) from None
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES) or time.monotonic() >= deadline:
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

    def __enter__(self) -> "StoreLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
