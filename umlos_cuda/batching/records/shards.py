"""Which files a dataset argument names, in which order, and in which format.

What goes in: what the user gave (a path, a glob such as
``train-*.parquet``, a list of paths and globs, a ``save_to_disk`` folder,
or a ``datasets.Dataset``) and an optional format. What comes out: a list
of :class:`Input`, each one file, one folder or the object, in the order the
rows are read.

Order: a glob's matches are sorted by path (Python's string order, the same
on every machine and file system; shard writers number their files, so this
is their numbering, ``train-00000-of-00008`` first), because the order a
file system lists a folder in is arbitrary. A list is read in the order
given, each glob in it expanded and sorted in place: a list is an explicit
statement of order. A path that exists is never read as a glob, even when its
name holds ``*`` or ``[``.

Format: ``format`` when given (one of :data:`FORMATS`), else the file's
suffix (:data:`SUFFIXES`; anything else is JSONL, as it always was), and a
folder is a ``save_to_disk`` folder. Refused with DATASET_UNREADABLE, naming
the path: a glob that matches nothing, a path that does not exist, and one
file named twice (by two globs, or by a link to a shard of the same set:
checked by device and inode, so no row is read twice without notice).
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Any

from ... import errors
from ...errors import UmlosError
from .hf import folder_files, is_dataset_object

#: The formats ``--format`` names: JSONL (plain, gzip, zstd), Parquet, Arrow IPC, a save_to_disk folder.
FORMATS = ("jsonl", "jsonl.gz", "jsonl.zst", "parquet", "arrow", "hf")
#: Suffixes (case-insensitive, longest first) and the format each means.
SUFFIXES = ((".jsonl.gz", "jsonl.gz"), (".json.gz", "jsonl.gz"), (".gz", "jsonl.gz"),
            (".jsonl.zst", "jsonl.zst"), (".json.zst", "jsonl.zst"), (".zst", "jsonl.zst"), (".zstd", "jsonl.zst"),
            (".parquet", "parquet"), (".pq", "parquet"), (".arrow", "arrow"), (".feather", "arrow"),
            (".ipc", "arrow"))
GLOB_CHARS = "*?["


@dataclass(frozen=True)
class Input:
    """One input: ``format`` (of :data:`FORMATS`, or ``"object"``), the path shown in messages, the
    files read (a folder's Arrow files, in order) and, for ``"object"``, the ``datasets.Dataset``."""

    format: str
    path: str
    files: tuple[str, ...]
    dataset: Any = None

    @property
    def columnar(self) -> bool:
        """Rows are numbered from 0 (``row N``) rather than as lines (``line N + 1``)."""
        return self.format in ("parquet", "arrow", "hf", "object")


def resolve(dataset: Any, format: str | None = None) -> list[Input]:
    """The inputs ``dataset`` names (see the module docstring)."""
    if format is not None and format not in FORMATS:
        raise _unreadable(f"format {format!r} is not one of {', '.join(FORMATS)}")
    if is_dataset_object(dataset):
        return [Input("object", "the datasets.Dataset", (), dataset)]
    given = list(dataset) if isinstance(dataset, (list, tuple)) else [dataset]
    if not given:
        raise _unreadable("no dataset given (an empty list)")
    paths: list[str] = []
    for item in given:
        if not isinstance(item, (str, os.PathLike)):
            raise _unreadable(f"a dataset is a path, a glob, a list of them or a datasets.Dataset; got "
                              f"{type(item).__name__}")
        item = os.fspath(item)
        if os.path.lexists(item) or not any(c in item for c in GLOB_CHARS):
            paths.append(item)
            continue
        matches = sorted(glob.glob(item))
        if not matches:
            raise _unreadable(f"the glob {item} matches no file; check the pattern (quote it, so that the shell "
                              "does not expand it first)")
        paths += matches
    inputs = [_input(path, format) for path in paths]
    _refuse_repeats(inputs)
    return inputs


def format_of(path: str) -> str:
    """The format a file's suffix names (JSONL when none does)."""
    lower = path.lower()
    return next((kind for suffix, kind in SUFFIXES if lower.endswith(suffix)), "jsonl")


def _input(path: str, format: str | None) -> Input:
    if os.path.isdir(path):
        if format not in (None, "hf"):
            raise _unreadable(f"{path} is a folder, not a {format} file; give the file, or a glob of the files")
        return Input("hf", path, tuple(folder_files(path)))
    if not os.path.isfile(path):
        what = "is not a regular file" if os.path.exists(path) else "does not exist"
        raise _unreadable(f"dataset {path} {what}")
    if format == "hf":
        raise _unreadable(f"{path} is a file; --format hf reads a folder save_to_disk wrote")
    return Input(format or format_of(path), path, (path,))


def _refuse_repeats(inputs: list[Input]) -> None:
    seen: dict[tuple[int, int], str] = {}
    for item in inputs:
        for path in item.files:
            try:
                info = os.stat(path)
            except OSError:
                continue  # the reader says what is wrong with it
            key = (info.st_dev, info.st_ino)
            if key in seen:
                raise _unreadable(f"{path} and {seen[key]} are the same file (a link, or a path given twice); "
                                  "each shard is read once")
            seen[key] = path


def _unreadable(message: str) -> UmlosError:
    return UmlosError(errors.DATASET_UNREADABLE, message, operator=errors.BATCHING_OPERATOR)
