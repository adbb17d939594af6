"""Durable writes: the steps every writer of umlos-cuda takes, in one place.

A file is created exclusively (``O_EXCL | O_NOFOLLOW``: never an existing
file, never through a link at its name), written in full and fsynced; it is then
published under its final name by a rename, and its folder is fsynced so
that the rename survives a crash or a power loss (docs/checkpoint-format.md §9.2 prescribes
temp object, ``fsync(file)``, ``rename``, ``fsync(directory)``).

Two front ends build on these steps with their own policies:

- :mod:`umlos_cuda.files.atomic` writes CLI outputs: hidden random temp
  names, only regular files or new names as targets, ``--force``, the
  ``OUTPUT_*`` codes;
- :mod:`umlos_cuda.checkpoint.atomic` writes the checkpoint store (and the
  tape's segments): fixed temp names ``<name>.tmp`` that recovery recognises,
  ``CHECKPOINT_IO_ERROR``, the crash points of the commit protocol.

Every function here raises ``OSError``; each front end turns it into its
own failure code and message, so neither loses its guarantees or codes.
"""

from __future__ import annotations

import os

#: Flags of a new file: write-only, created here and nowhere else (``O_EXCL`` already
#: refuses a link at the name; ``O_NOFOLLOW`` says so to every reader), not inherited by children.
NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def create_exclusive(path: str, mode: int) -> int:
    """Create ``path``, which must not exist (not even as a dangling link),
    and return a write-only descriptor. ``mode`` is filtered by the umask."""
    return os.open(path, NEW_FILE, mode)


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write every byte of ``data`` (``os.write`` may write fewer than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_and_sync(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write all of ``data`` and fsync the file: its bytes are on disk when this returns."""
    write_all(fd, data)
    os.fsync(fd)


def fsync_directory(path: str) -> None:
    """fsync the folder ``path``: the names created, renamed or removed in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def parent_directory(path: str) -> str:
    """The folder that holds ``path`` (absolute): the one to fsync after a rename there."""
    return os.path.dirname(os.path.abspath(path))
