"""One writer at a time in a folder: an exclusive ``flock`` on a lock file inside it, removed on release.

Why ``flock``: the kernel drops it when its holder dies (SIGKILL included), so
a killed writer never leaves the folder locked, unlike a lock file whose mere
existence is the lock (git's ``index.lock``, which a crash leaves for a person
to remove). The file a killed writer leaves is taken over by the next one.

Why the file is removed on release: the folder then holds exactly what it
held before (an artifact's files are pinned byte for byte, and nothing lists a
lock among them). Removing a lock file races with a writer that opened it a
moment before: the kernel would give that writer the lock of a file no longer
in the folder, while a third creates and locks a new one. So a writer that
gets the lock checks that the name still names the file it locked (device and
inode) and starts again if not; the holder removes the name *before* it
unlocks.

Non-blocking: a folder held by another writer is refused at once
(:class:`FolderLocked`, with the pid the holder wrote into the file when it is
known); the caller says what its own code means. The name is opened relative
to the folder's descriptor, never through a link (``O_NOFOLLOW``), never
blocking on a FIFO, and only a regular file with one link is used: a planted
link, FIFO or hard link to someone's file is refused (``OSError``), never
truncated.

``flock`` is advisory and local: it excludes the writers of one machine (and
of an NFS client that maps it to byte-range locks); writers on several hosts
of a network file system need one writer host per folder.

A temp folder a writer fills (``.tmp-NAME-...``, files/writer.py) is locked
itself, on its own descriptor (:func:`hold_folder`), from before its marker is
written until it is published or removed: no file is added to it, and the
lock says whether a live process still owns it (:func:`try_hold_folder`), so
one left by a killed writer can be told from one being written.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from .. import checks
from .durable import write_all
from .folder import Folder

try:
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX
    fcntl = None  # type: ignore[assignment]

#: Open (or create) the lock file: read-write, never through a link, never blocking on a FIFO.
_LOCK_FILE = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: errno values of a lock another descriptor holds.
_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
#: A pid written as decimal text and a newline; a longer file holds none.
PID_BYTES = 32
#: Tries when the holder keeps removing the file between our open and our lock (each try is a few system calls).
_ATTEMPTS = 100


class FolderLocked(Exception):
    """Another writer holds the lock ``path``; ``holder`` is the pid it wrote there, when known."""

    def __init__(self, path: str, holder: int | None) -> None:
        super().__init__(path, holder)
        self.path = path
        self.holder = holder


class FolderLock:
    """The exclusive lock on the file ``name`` of a folder (module docstring): :meth:`take` it,
    :meth:`release` it (or use it as a context manager)."""

    __slots__ = ("_fd", "folder", "name")

    def __init__(self, folder: Folder, name: str, fd: int) -> None:
        self.folder = folder
        self.name = name
        self._fd = fd

    @property
    def path(self) -> str:
        return self.folder.join(self.name)

    @classmethod
    def take(cls, folder: Folder, name: str) -> FolderLock:
        """Lock ``name`` in ``folder`` now, creating it if needed, and write this process's pid into it;
        :class:`FolderLocked` when another writer holds it, ``OSError`` when the name cannot be a lock
        file (a link, not a regular file, a file with other names, a folder that refuses writes)."""
        if fcntl is None:  # pragma: no cover
            raise OSError(errno.ENOSYS, "locking a folder needs a POSIX system (fcntl.flock)")
        own = Folder(os.dup(folder.fd), folder.path)  # the caller may close its folder first
        try:
            for _ in range(_ATTEMPTS):
                fd = os.open(name, _LOCK_FILE, 0o666, dir_fd=own.fd)
                try:
                    if _lock(own, name, fd):
                        os.ftruncate(fd, 0)
                        write_all(fd, f"{os.getpid()}\n".encode("ascii"))
                        return cls(own, name, fd)
                except BaseException:
                    os.close(fd)
                    raise
                os.close(fd)  # the holder removed the file meanwhile: lock the one there now
            raise FolderLocked(own.join(name), None)
        except BaseException:
            own.close()
            raise

    def release(self) -> None:
        """Remove the lock file (while still holding it), then unlock."""
        if self._fd < 0:
            return
        fd, self._fd = self._fd, -1
        try:
            with contextlib.suppress(OSError):  # the folder itself may be gone (a store replaced or removed)
                if _same_file(self.folder, self.name, fd):
                    os.unlink(self.name, dir_fd=self.folder.fd)
        finally:
            os.close(fd)  # closing the last descriptor of the file unlocks it
            self.folder.close()

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _lock(folder: Folder, name: str, fd: int) -> bool:
    """Whether ``fd`` (opened at ``name``) is now locked by us and still is the file at ``name``."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise OSError(errno.EINVAL, "not a regular file", folder.join(name))
    if info.st_nlink == 0:  # its holder removed it after we opened it
        return False
    if info.st_nlink > 1:  # a hard link to a file elsewhere: never truncated
        raise OSError(errno.EMLINK, "a file with other names (a hard link)", folder.join(name))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in _BUSY:
            raise
        raise FolderLocked(folder.join(name), _holder(folder, name)) from None
    return _same_file(folder, name, fd)


def _same_file(folder: Folder, name: str, fd: int) -> bool:
    here, mine = folder.lstat(name), os.fstat(fd)
    return here is not None and (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino)


def _holder(folder: Folder, name: str) -> int | None:
    """The pid the holder wrote into the lock file (None before it has written it, or for other content)."""
    data = folder.read(name, PID_BYTES)
    text = data.decode("ascii", "replace").strip() if data else ""
    return checks.integer_or_none(text, 1, None)


def _own_descriptor(folder: Folder) -> int:
    """A new open of ``folder`` itself. Not ``dup``: a ``flock`` belongs to the open file description, which a
    duplicate shares with ``folder``'s descriptor, so closing the duplicate would not release the lock while
    ``folder`` stays open (a process that opened a folder in turn would keep the others waiting)."""
    return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=folder.fd)


def hold_folder(folder: Folder) -> int:
    """An exclusive ``flock`` on ``folder`` itself, held by a new descriptor of it (returned; the lock lasts until
    that descriptor is closed, whatever becomes of ``folder``'s, and dies with the process). It waits while
    another holds it: only :func:`try_hold_folder`'s brief look can. -1 where there is no ``flock``."""
    if fcntl is None:  # pragma: no cover
        return -1
    fd = _own_descriptor(folder)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


def try_hold_folder(folder: Folder) -> int | None:
    """:func:`hold_folder` if no one holds ``folder`` now, else None (a live writer owns it; None too where
    there is no ``flock``: ownership cannot be told)."""
    if fcntl is None:  # pragma: no cover
        return None
    fd = _own_descriptor(folder)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in _BUSY:
            return None
        raise
    except BaseException:
        os.close(fd)
        raise
    return fd
