"""A folder held open by its descriptor: what a command writes inside a folder it creates.

Why a descriptor: a path is looked up again at every call, so a folder
renamed or replaced by a symbolic link between two calls would send the next
write elsewhere. :class:`Folder` opens the folder once (``O_NOFOLLOW``: a link
there is refused, except for a parent the user named) and creates, opens,
renames and removes every name below it relative to that descriptor
(``dir_fd``), files with ``O_EXCL | O_NOFOLLOW``, subfolders with ``mkdir``
and then ``O_NOFOLLOW``. No level a command creates is ever written through
a link, whoever can write to it meanwhile.

Modes come from the umask: files are created ``0666`` and folders ``0777``,
filtered by it, as a shell's redirections and ``mkdir`` do, so a shared
cluster's group can read a plan when the user's umask says so.

Every function raises ``OSError``; the writer (:mod:`umlos_cuda.files.writer`)
turns it into a failure code naming the path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from typing import BinaryIO

from .durable import NEW_FILE, write_all

#: Flags that open a folder without following a link at its name.
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Flags that open a file for reading without following a link or blocking on a FIFO.
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Folder:
    """An open folder; ``path`` is for messages only, every call uses the descriptor.

    Use as a context manager (or call :meth:`close`)."""

    __slots__ = ("fd", "path")

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path

    @classmethod
    def open(cls, path: str, *, follow: bool = False) -> Folder:
        """Open the folder ``path``; ``follow=True`` accepts a link at its name
        (for a parent the user named, never for one a command creates)."""
        flags = _FOLDER & ~os.O_NOFOLLOW if follow else _FOLDER
        try:
            return cls(os.open(path, flags), os.path.abspath(path))
        except ValueError:  # a NUL byte or a lone surrogate: every caller handles OSError, which this is
            raise OSError(errno.EINVAL, "a path holds no NUL byte and no lone surrogate", path) from None

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def join(self, name: str) -> str:
        """The path of ``name`` in this folder (for messages)."""
        return os.path.join(self.path, name)

    # -------------------------------------------------------------- looking
    def lstat(self, name: str) -> os.stat_result | None:
        """What is at ``name`` (a link is described, not followed), or None."""
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def names(self) -> list[str]:
        return os.listdir(self.fd)

    def sub(self, name: str) -> Folder:
        """The existing subfolder ``name`` (never a link to one)."""
        return Folder(os.open(name, _FOLDER, dir_fd=self.fd), self.join(name))

    def read(self, name: str, limit: int) -> bytes | None:
        """The bytes of the regular file ``name`` if it holds at most ``limit``
        of them; None if it is missing, a link, not a regular file, or larger."""
        try:
            fd = os.open(name, _READ, dir_fd=self.fd)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError:
            return None  # ELOOP (a link), EACCES, ENXIO: not a file this project wrote
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
                return None
            data = os.read(fd, limit + 1)
            return data if len(data) <= limit else None
        finally:
            os.close(fd)

    def open_regular(self, name: str) -> BinaryIO | None:
        """The regular file ``name`` opened for reading, or None when it is
        missing or anything else (a link is never followed)."""
        try:
            fd = os.open(name, _READ, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except OSError:
            return None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")

    # -------------------------------------------------------------- creating
    def mkdir(self, name: str) -> Folder:
        """Create the subfolder ``name`` (mode 0777 less the umask) and open it."""
        os.mkdir(name, 0o777, dir_fd=self.fd)
        return self.sub(name)

    def mkdir_temp(self, prefix: str) -> tuple[str, Folder]:
        """A new subfolder with an unguessable name ``prefix<random>``."""
        for _ in range(100):
            name = f"{prefix}{secrets.token_hex(4)}"
            try:
                return name, self.mkdir(name)
            except FileExistsError:
                continue
        raise FileExistsError(f"every temp name {prefix}* in {self.path} was taken")

    def create(self, name: str) -> BinaryIO:
        """A new file ``name`` (mode 0666 less the umask) opened for writing;
        ``FileExistsError`` if anything, a link included, is there."""
        return os.fdopen(os.open(name, NEW_FILE, 0o666, dir_fd=self.fd), "wb")

    @contextlib.contextmanager
    def file(self, name: str) -> Iterator[BinaryIO]:
        """A new file whose bytes are fsynced when the block ends (removed if it fails)."""
        handle = self.create(name)
        try:
            with handle:
                yield handle
                handle.flush()
                os.fsync(handle.fileno())
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=self.fd)
            raise

    def write_bytes(self, name: str, data: bytes) -> None:
        """A new file ``name`` holding ``data``, fsynced."""
        with self.file(name) as handle:
            write_all(handle.fileno(), data)

    def replace_file(self, name: str, data: bytes) -> None:
        """Give ``name`` the bytes ``data`` in one rename: a temp file
        ``.tmp-<random>-<name>`` created here, fsynced, renamed over ``name``
        (which a rename replaces, never follows)."""
        for _ in range(100):
            temp = f".tmp-{secrets.token_hex(4)}-{name}"
            try:
                handle = self.create(temp)
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"every temp name for {name} in {self.path} was taken")
        try:
            with handle:
                write_all(handle.fileno(), data)
                os.fsync(handle.fileno())
            self.rename(temp, name)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=self.fd)
            raise

    def rename(self, source: str, target: str, into: Folder | None = None) -> None:
        """Rename ``source`` here to ``target`` here (or in ``into``)."""
        os.rename(source, target, src_dir_fd=self.fd, dst_dir_fd=(into or self).fd)

    def sync(self) -> None:
        """fsync the folder: the names created, renamed or removed in it are durable."""
        os.fsync(self.fd)

    # -------------------------------------------------------------- removing
    def remove(self, name: str) -> None:
        """Remove ``name``: a file or a link by unlinking it (a link's target is
        untouched), a folder with everything under it, never following a link."""
        info = self.lstat(name)
        if info is None:
            return
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(name, dir_fd=self.fd)
        else:
            os.unlink(name, dir_fd=self.fd)
