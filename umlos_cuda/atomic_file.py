"""Write a file so that readers see either nothing or the whole file.

Temp file in the same directory, fsync, rename over the target, fsync the
directory (the sequence seed 001 §II.G prescribes for checkpoints, used here
for every file the CLI writes). A failure removes the temp file, so no partial
output is ever left under the final name.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Iterator


@contextlib.contextmanager
def atomic_path(final_path: str | os.PathLike[str]) -> Iterator[str]:
    """Yield a temporary path beside ``final_path``; on success it becomes ``final_path``."""
    final_path = os.fspath(final_path)
    directory = os.path.dirname(os.path.abspath(final_path))
    fd, temp_path = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.basename(final_path), dir=directory)
    os.close(fd)
    try:
        yield temp_path
        with open(temp_path, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(temp_path, final_path)
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_path)
        raise
