"""Write a CLI output file so that readers see either nothing or the whole file.

The bytes go to a hidden temp file beside the target (``.tmp-<random>-<name>``),
which is flushed, fsynced and then published under the target's name; the
folder is fsynced after (the steps of :mod:`umlos_cuda.files.durable`, which the
checkpoint store's writes share). Any failure, Ctrl-C or SIGTERM (``umlos_cuda.cli``
turns it into an exception) removes the temp file, so no partial output is
ever left under either name.

Only a regular file or a new name is ever written: ``rename`` replaces
whatever the target is, so a FIFO, a device node or a symlink at the target
would silently become a regular file (as root, a system device). Those are
refused with OUTPUT_PATH_INVALID, an existing file with OUTPUT_EXISTS unless
``force``; without ``force`` the file is published with ``link``, which fails
rather than replace a file that appeared meanwhile. The temp file is created
with mode 0666 so the process umask decides the final mode, as for any file a
shell redirection creates. Every error of the operating system becomes
OUTPUT_PATH_INVALID (the file cannot be created) or OUTPUT_WRITE_FAILED (disk
full, file size limit, I/O error), never a traceback.

Two more checks come from the output layer (:mod:`umlos_cuda.files.writer`):
``inputs`` (the paths the same command reads: the output is never one of
them, OUTPUT_IS_INPUT) and ``kind`` (a :class:`~umlos_cuda.files.artifacts.FileKind`:
``force`` replaces only a file of that kind, such as a length cache).
:class:`PendingFile` splits the write from the publication, for outputs that
come in pairs (a length cache and its sidecar: both are written before either
is published).
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import secrets
import stat
from collections.abc import Iterable, Iterator
from typing import BinaryIO

from . import durable
from .. import errors
from ..errors import UmlosError
from .artifacts import FileKind
from .inputs import refuse_inputs

#: File kinds named in OUTPUT_PATH_INVALID messages.
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
#: errno values of link(2) that mean "this file system has no hard links".
_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK, errno.ENOSYS}


def _error(code: str, message: str) -> UmlosError:
    """An output error; its failure record names this module as the operator."""
    return UmlosError(code, message, operator=errors.OUTPUT_OPERATOR)


def check_output_path(path: str | os.PathLike[str], force: bool = False, *, kind: FileKind | None = None,
                      inputs: Iterable[str | os.PathLike[str] | None] = ()) -> str:
    """Refuse ``path`` unless it is a new name in an existing folder or, with
    ``force``, an existing regular file (of ``kind``, when given) that is none
    of ``inputs``; return it as a string.

    Cheap, so commands call it before any work: a wrong ``--out`` should fail
    in a second, not after an hour of computing."""
    path = os.fspath(path)
    if not path or path.endswith(os.sep):
        raise _error(errors.OUTPUT_PATH_INVALID, f"output path {path!r} names a directory; give a file name")
    directory = _directory(path)
    try:
        if not stat.S_ISDIR(os.stat(directory).st_mode):
            raise _error(errors.OUTPUT_PATH_INVALID, f"cannot write {path}: {directory} is not a directory")
    except FileNotFoundError:
        raise _error(
            errors.OUTPUT_PATH_INVALID, f"cannot write {path}: directory {directory} does not exist (create it first)"
        ) from None
    except OSError as exc:
        raise _error(errors.OUTPUT_PATH_INVALID, f"cannot write {path}: {_reason(exc)}") from exc
    _check_target(path, force=True)  # a directory, a link, a FIFO ... first: what the path is
    refuse_inputs(path, inputs)  # then whose it is: before "pass --force", which would not help
    _check_target(path, force)
    if force and kind is not None and os.path.lexists(path) and not kind.recognise(path):
        raise _error(errors.OUTPUT_PATH_INVALID, f"{path} is not a {kind.name}; --force replaces only a {kind.name}: "
                     "write to another path")
    return path


def check_free_space(path: str, size: int) -> None:
    """Refuse to start writing ``size`` bytes at ``path`` when the file system
    has less room or the file size limit (``ulimit -f``) is lower: failing
    before the work beats failing at the end of it."""
    directory = _directory(path)
    try:
        fs = os.statvfs(directory)
    except OSError as exc:
        raise _error(errors.OUTPUT_WRITE_FAILED, f"cannot write {path}: {_reason(exc)}") from exc
    # Root may use the blocks reserved for it; everyone else only f_bavail.
    free = fs.f_frsize * (fs.f_bfree if os.geteuid() == 0 else fs.f_bavail)
    if size > free:
        raise _error(
            errors.OUTPUT_WRITE_FAILED,
            f"{path} needs {_size(size)} but the file system of {directory} has {_size(free)} free",
        )
    limit, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if limit != resource.RLIM_INFINITY and size > limit:
        raise _error(
            errors.OUTPUT_WRITE_FAILED,
            f"{path} needs {_size(size)} but this process may write files of at most {_size(limit)} (ulimit -f)",
        )


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str], *, force: bool = False, size: int | None = None,
                  kind: FileKind | None = None, inputs: Iterable[str | os.PathLike[str] | None] = ()
                  ) -> Iterator[BinaryIO]:
    """Yield a binary file to write; on success its bytes appear at ``path``.

    ``size`` (bytes, when known) is checked against the free space first. An
    OSError while writing inside the block becomes OUTPUT_WRITE_FAILED.
    """
    pending = PendingFile(path, force=force, size=size, kind=kind, inputs=inputs)
    try:
        try:
            yield pending.handle
        except OSError as exc:
            raise write_failed(pending.path, exc) from exc
        pending.finish()
        pending.publish()
    except BaseException:
        pending.discard()
        raise


class PendingFile:
    """The temp file of one output, created beside ``path`` (the checks of
    :func:`check_output_path` first): write to :attr:`handle`, then
    :meth:`finish` (flush and fsync) and :meth:`publish`, or :meth:`discard`."""

    def __init__(self, path: str | os.PathLike[str], *, force: bool = False, size: int | None = None,
                 kind: FileKind | None = None, inputs: Iterable[str | os.PathLike[str] | None] = ()) -> None:
        self.path = check_output_path(path, force, kind=kind, inputs=inputs)
        self.force = force
        if size is not None:
            check_free_space(self.path, size)
        temp, fd = _create_temp(self.path)
        self.temp: str | None = temp
        self.handle: BinaryIO = os.fdopen(fd, "wb")

    def finish(self) -> None:
        """Flush and fsync the bytes written (OUTPUT_WRITE_FAILED when they cannot be)."""
        try:
            with self.handle:
                self.handle.flush()
                os.fsync(self.handle.fileno())
        except OSError as exc:
            raise write_failed(self.path, exc) from exc

    def publish(self) -> None:
        """Give the finished temp file its name, and sync the folder."""
        assert self.temp is not None, "published twice"
        _publish(self.temp, self.path, self.force)
        self.temp = None
        try:
            durable.fsync_directory(_directory(self.path))
        except OSError as exc:
            raise _error(errors.OUTPUT_WRITE_FAILED, f"{self.path} was written but not synced: {_reason(exc)}") from exc

    def discard(self) -> None:
        """Remove the temp file (nothing is published)."""
        with contextlib.suppress(OSError):
            self.handle.close()
        if self.temp is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.temp)
            self.temp = None


def write_failed(path: str, exc: OSError) -> UmlosError:
    """OUTPUT_WRITE_FAILED for an OSError while writing ``path`` (disk full, file size limit, I/O error)."""
    return _error(errors.OUTPUT_WRITE_FAILED, f"writing {path} failed: {_reason(exc)}")


def _check_target(path: str, force: bool) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise _error(errors.OUTPUT_PATH_INVALID, f"cannot write {path}: {_reason(exc)}") from exc
    if stat.S_ISREG(mode):
        if not force:
            raise _error(errors.OUTPUT_EXISTS, f"{path} exists; pass --force to replace it")
        return
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    raise _error(
        errors.OUTPUT_PATH_INVALID,
        f"{path} is {kind}; umlos-cuda writes only regular files (a new name, or an existing file with --force)",
    )


def _create_temp(path: str) -> tuple[str, int]:
    """Create the temp file with O_EXCL and mode 0666 (the umask applies);
    return its name and a write-only descriptor."""
    directory, name = _directory(path), os.path.basename(path)
    for _ in range(100):
        temp = os.path.join(directory, f".tmp-{secrets.token_hex(4)}-{name}")
        try:
            return temp, durable.create_exclusive(temp, 0o666)
        except FileExistsError:
            continue
        except OSError as exc:
            raise _error(
                errors.OUTPUT_PATH_INVALID, f"cannot create a file in {directory}: {_reason(exc)}"
            ) from exc
    raise _error(errors.OUTPUT_PATH_INVALID, f"cannot create a temp file in {directory}: every name was taken")


def _publish(temp: str, path: str, force: bool) -> None:
    """Give ``temp`` the name ``path``: never over anything but a regular file,
    and, without ``force``, over nothing at all."""
    try:
        if force:
            _check_target(path, force=True)  # the target may have changed while we computed
            os.replace(temp, path)
            return
        try:
            os.link(temp, path)
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINKS:
                raise
            _check_target(path, force=False)
            os.replace(temp, path)
            return
        os.unlink(temp)
    except FileExistsError:
        raise _error(errors.OUTPUT_EXISTS,
                     f"{path} appeared while it was being written; pass --force to replace it") from None
    except OSError as exc:
        raise _error(errors.OUTPUT_WRITE_FAILED, f"cannot publish {path}: {_reason(exc)}") from exc


def _directory(path: str) -> str:
    return durable.parent_directory(path)


def _reason(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0)
    return f"{exc.strerror or exc}" + (f" ({name})" if name else "")


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit} ({n} bytes)"
    return f"{n} bytes"
