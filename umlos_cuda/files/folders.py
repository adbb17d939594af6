"""Reads of the files inside this project's folders: small JSON files and ``.npy`` arrays.

(Writing those folders is :mod:`umlos_cuda.files.writer`'s job.)
:func:`read_json` reads the small JSON files these folders hold;
:func:`read_npy` their one-dimensional arrays.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import UmlosError


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
