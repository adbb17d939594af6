"""Durable writes: temp object, ``fsync(file)``, ``rename``, ``fsync(directory)``.

docs/checkpoint-format.md §9.2 prescribes this sequence; every write of the checkpoint package
goes through these helpers, which take the steps of :mod:`umlos_cuda.files.durable`
(shared with the CLI's outputs) and add the store's policy: temp objects have
fixed names (``<name>.tmp``) that recovery recognises, and every failure is
``CHECKPOINT_IO_ERROR`` naming the step. A rename is atomic on POSIX file
systems, and the directory fsync makes it durable, so a reader (or a crash)
sees either the old name or the complete new object.

:func:`crash_point` marks each step of a commit. It does nothing unless a test
installs a hook, which lets the crash tests stop a writer exactly between two
steps (with SIGKILL) as well as at random instants.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable

from ..files import durable
from .. import errors
from ..errors import UmlosError

#: Installed by crash tests only: called with the label of each commit step.
crash_hook: Callable[[str], None] | None = None


def crash_point(label: str) -> None:
    hook = crash_hook
    if hook is not None:
        hook(label)


def _io_error(exc: OSError, what: str) -> UmlosError:
    return UmlosError(
        errors.CHECKPOINT_IO_ERROR, f"cannot {what}: {exc.strerror or exc}",
        operator=errors.CHECKPOINT_SERIALIZE_OPERATOR
    )


def write_file(path: str, data: bytes) -> None:
    """Create ``path`` (it must not exist), write ``data``, fsync, close."""
    try:
        fd = durable.create_exclusive(path, 0o644)
    except OSError as exc:
        raise _io_error(exc, f"create {path}") from None
    try:
        durable.write_and_sync(fd, data)
    except OSError as exc:
        raise _io_error(exc, f"write {path}") from None
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    try:
        durable.fsync_directory(path)
    except OSError as exc:
        raise _io_error(exc, f"fsync directory {path}") from None


def make_dir(path: str) -> None:
    """Create one directory (its parent must exist) and fsync the parent."""
    try:
        os.mkdir(path, 0o755)
    except OSError as exc:
        raise _io_error(exc, f"create directory {path}") from None
    fsync_dir(durable.parent_directory(path))


def ensure_dir(path: str) -> None:
    """Create ``path`` unless something is there (a link is not followed: the caller checks what it is)."""
    if not os.path.lexists(path):
        make_dir(path)


def rename(src: str, dst: str) -> None:
    """Atomically rename ``src`` to ``dst`` (which must not be a directory in
    use) and fsync the destination's directory."""
    try:
        os.rename(src, dst)
    except OSError as exc:
        raise _io_error(exc, f"rename {src} to {dst}") from None
    fsync_dir(durable.parent_directory(dst))


def write_file_atomic(path: str, data: bytes) -> None:
    """Write ``path`` so that it holds either its old content or all of ``data``."""
    temp = path + ".tmp"
    remove(temp)
    write_file(temp, data)
    rename(temp, path)


def remove_in(dir_fd: int, name: str, shown: str) -> bool:
    """Remove ``name`` (a file, a link, or a whole tree) inside the directory
    ``dir_fd``, never following a link; ``shown`` names it in errors.
    Returns whether anything was there."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        if stat.S_ISDIR(mode):
            shutil.rmtree(name, dir_fd=dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise _io_error(exc, f"remove {shown}") from None
    return True


def remove(path: str) -> bool:
    """Remove a file or a whole directory tree (links are removed, never followed).
    Returns whether anything was there."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise _io_error(exc, f"remove {path}") from None
    return True
