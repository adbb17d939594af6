"""Output folders written in one step: a hidden sibling folder, renamed at the end.

What goes in: the folder to write and what it is (for messages), and the
name of the file that marks a finished one (``meta.json``). Plan folders,
token stores and the plan copy of a batch folder are written this way. What comes out:
:func:`check_output_folder` refuses a target before any work (no parent
folder, a file in the way, an existing folder without ``force``, or a
non-empty folder that is not of this kind, which ``force`` must never
delete), and :func:`atomic_folder` yields a temp folder that becomes the
target only when the block succeeds; a crash leaves at most the hidden
``.tmp-<name>-<random>`` folder, never a half-written target.
:func:`read_json` reads the small JSON files these folders hold.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
from typing import Any, Callable, Iterator

import numpy as np

from . import durable
from .. import errors
from ..errors import UmlosError


def check_output_folder(directory: str | os.PathLike[str], force: bool, what: str, marker: str, *,
                        operator: str = errors.BATCHING_OPERATOR) -> str:
    """The absolute path of a ``what`` folder to write (OUTPUT_PATH_INVALID,
    OUTPUT_EXISTS, naming ``operator``); ``force`` replaces only a folder
    holding ``marker``."""
    path = os.path.abspath(os.fspath(directory))
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise _error(errors.OUTPUT_PATH_INVALID, f"cannot write the {what} {path}: folder {parent} does not exist",
                     operator)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    if not stat.S_ISDIR(mode):
        raise _error(errors.OUTPUT_PATH_INVALID, f"{path} exists and is not a folder; a {what} is a folder", operator)
    if not force:
        raise _error(errors.OUTPUT_EXISTS, f"{path} exists; pass --force to replace it", operator)
    if os.listdir(path) and not os.path.isfile(os.path.join(path, marker)):
        raise _error(errors.OUTPUT_PATH_INVALID,
                     f"{path} is a non-empty folder without {marker}; --force replaces only a {what} folder", operator)
    return path


@contextlib.contextmanager
def atomic_folder(directory: str, what: str, *, operator: str = errors.BATCHING_OPERATOR) -> Iterator[str]:
    """Yield a hidden sibling folder to fill; on success it is fsynced and
    renamed to ``directory`` (replacing an existing one), on any failure it
    is removed. OSError becomes OUTPUT_WRITE_FAILED."""
    parent, name = os.path.split(directory)
    try:
        temp = tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=parent)
    except OSError as exc:
        raise _error(errors.OUTPUT_PATH_INVALID, f"cannot create a folder in {parent}: {exc.strerror or exc}",
                     operator) from exc
    try:
        try:
            yield temp
            durable.fsync_directory(temp)
            _publish(temp, directory)
        except OSError as exc:
            raise _error(errors.OUTPUT_WRITE_FAILED, f"writing the {what} {directory} failed: {exc.strerror or exc}",
                         operator) from exc
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise


def _publish(temp: str, directory: str) -> None:
    parent = os.path.dirname(directory)
    if os.path.lexists(directory):
        old = tempfile.mkdtemp(prefix=f".old-{os.path.basename(directory)}-", dir=parent)
        os.rename(directory, os.path.join(old, "previous"))
        os.rename(temp, directory)
        durable.fsync_directory(parent)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(temp, directory)
        durable.fsync_directory(parent)


@contextlib.contextmanager
def fsynced_file(path: str) -> Iterator:
    """A new file (exclusive create) whose bytes are fsynced when the block ends."""
    with open(path, "xb") as handle:
        yield handle
        handle.flush()
        os.fsync(handle.fileno())


def read_json(path: str | os.PathLike[str], error: Callable[[str], UmlosError]) -> Any:
    """The JSON value in the file at ``path``; ``error(message)`` is raised
    when it cannot be read or is not UTF-8 JSON (FileNotFoundError passes
    through, for callers that say what a missing file means)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as handle:
            return json.loads(handle.read().decode("utf-8"))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise error(f"{path} is not valid JSON ({exc})") from None


def _error(code: str, message: str, operator: str) -> UmlosError:
    return UmlosError(code, message, operator=operator)


def read_npy(path: str, dtype: str, shape: tuple[int, ...] | None, mmap: bool,
             error: Callable[[str], UmlosError], expected: str = "expected") -> np.ndarray:
    """The one-dimensional array of ``dtype`` (and ``shape`` when given) in the
    .npy file at ``path``, memory-mapped read-only when ``mmap``; ``error(message)``
    is raised when it is missing, unreadable or of another type or shape
    (the message says ``{expected} {dtype} of shape ...``). Never unpickles."""
    try:
        array = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except FileNotFoundError:
        raise error(f"{path} is missing") from None
    except (OSError, ValueError) as exc:
        raise error(f"{path} is not a readable .npy file ({exc})") from None
    if array.dtype.str != dtype or array.ndim != 1 or (shape is not None and array.shape != shape):
        want = f"{dtype} of shape {shape}" if shape is not None else f"one-dimensional {dtype}"
        raise error(f"{path} holds {array.dtype.str} of shape {array.shape}; {expected} {want}")
    return array
