"""The inputs of ``data tokenize`` (and ``data lengths build``) named by object-store URLs: copied into a private
temporary folder, bounded, then read by the records layer as local files.

What goes in: the dataset argument (a path or URL, or a list of them). What comes out, inside
:func:`staged_dataset`: the same argument with each URL replaced by a local copy, which the records layer
(umlos_cuda/batching/records/) reads with all its own bounds (sizes before parsing, line and record caps,
decompression limits, format checks); the folder is removed when the block ends, and a failure's message names
the URL, not the copy.

A URL names either one object (``s3://bucket/data/train.jsonl.zst``, ``.parquet``, ``.arrow``, ...: copied under
its own name, so the format is found from its suffix as on disk) or, when no object has that key, the objects
under it as a folder (``s3://bucket/data/ds``: a ``datasets`` ``save_to_disk`` folder, copied with its relative
paths). Checks before a byte is written: at most :data:`MAX_OBJECTS` objects, each key's path below the prefix
made of plain names (no empty, ``.`` or ``..`` part: a key cannot write outside the copy), and their total size
under the free space of the temporary folder's file system less :data:`FREE_MARGIN`: DATASET_UNREADABLE naming
the URL. Each object is read in ranges of :data:`PIECE` bytes, each checked against the size and ETag it was
listed with (REMOTE_OBJECT_CHANGED when it is rewritten during the copy), and written through the project's
folder writer (files/folder.py: each file created exclusively, never through a link, fsynced).

The trade-off, chosen for this release: the records layer reads local files (pyarrow's Parquet reader seeks its
footer, gzip and zstd streams are read once through), so the copy reuses every check it makes and adds none of
its own, at the cost of the dataset's size on local disk and of reading it before tokenizing starts
(docs/object-stores.md gives the numbers measured). Reading by ranges as the tokens are made, without the copy,
is not built.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from .. import errors
from ..errors import UmlosError
from ..files.folder import Folder
from .client import ObjectInfo, RemoteObject, RetryBudget, list_objects
from .urls import ObjectUrl, is_remote, parse_url

#: The most objects one URL may name (a ``datasets`` folder holds a few files per split).
MAX_OBJECTS = 100_000
#: Bytes read by one ranged GET while copying.
PIECE = 8 << 20
#: Free space left on the temporary folder's file system after the copy (1 GiB).
FREE_MARGIN = 1 << 30


def _unreadable(message: str) -> UmlosError:
    return UmlosError(errors.DATASET_UNREADABLE, message, operator=errors.BATCHING_OPERATOR)


def has_remote(dataset: Any) -> bool:
    """Whether the dataset argument names an object-store URL."""
    items = dataset if isinstance(dataset, (list, tuple)) else [dataset]
    return any(is_remote(item) for item in items)


@contextlib.contextmanager
def staged_dataset(dataset: Any, *, budget: RetryBudget | None = None) -> Iterator[Any]:
    """``dataset`` with every URL replaced by a local copy (module docstring), removed when the block ends."""
    if not has_remote(dataset):
        yield dataset
        return
    budget = budget if budget is not None else RetryBudget()
    items = list(dataset) if isinstance(dataset, (list, tuple)) else [dataset]
    root = tempfile.mkdtemp(prefix="umlos-inputs-")  # mode 0700: this user's alone
    copies: dict[str, str] = {}
    try:
        with Folder.open(root) as folder:
            for number, item in enumerate(items):
                if is_remote(item):
                    copies[item] = _stage(parse_url(item), folder, str(number), budget)
        staged = [copies.get(item, item) for item in items]
        try:
            yield staged if isinstance(dataset, (list, tuple)) else staged[0]
        except UmlosError as exc:  # a reader's message names the copy: name the URL
            message = exc.message
            for url, copy in copies.items():
                message = message.replace(copy, url)
            if message == exc.message:
                raise
            raise UmlosError(exc.code, message, operator=exc.record["failure_operator"]) from None
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _listing(url: ObjectUrl, budget: RetryBudget) -> list[tuple[str, ObjectInfo]]:
    """``(relative path, info)`` of the objects ``url`` names: itself, else those under it as a folder."""
    try:
        single = RemoteObject.open(url, url.prefix, budget)
        return [(os.path.basename(url.prefix) or "object", single.info)]
    except FileNotFoundError:
        pass
    below = url.prefix + "/" if url.prefix else ""

    def bad_key(message: str) -> UmlosError:
        return _unreadable(f"{url} holds an object whose key is not a plain path ({message}); it is not copied: give "
                           "the URLs of the dataset's files")

    try:
        found = [(key[len(below):], info)
                 for key, info in list_objects(url, below, str(url), budget, most=MAX_OBJECTS, bad_key=bad_key)]
    except FileNotFoundError:  # no such bucket
        found = []
    if not found:
        raise _unreadable(f"{url} does not exist: no object has that key and none is under it (give the URL of a "
                          "dataset file, or of a folder of one)")
    if len(found) > MAX_OBJECTS:
        raise _unreadable(f"{url} holds more than {MAX_OBJECTS:,} objects; a dataset URL names one file or a folder "
                          f"of at most {MAX_OBJECTS:,} (give the URLs of its files, or copy it to disk)")
    folder = os.path.basename(url.prefix) or url.bucket
    return [(f"{folder}/{relative}", info) for relative, info in found]


def _stage(url: ObjectUrl, root: Folder, name: str, budget: RetryBudget) -> str:
    """Copy what ``url`` names into ``root/name/`` (module docstring); the local path of the copy."""
    objects = _listing(url, budget)
    for relative, _ in objects:
        parts = relative.split("/")
        if any(part in ("", ".", "..") for part in parts):
            raise _unreadable(f"{url}: the object {relative!r} has a key that is not a plain path below the URL (an "
                              "empty, '.' or '..' part); it is not copied")
    total = sum(info.size for _, info in objects)
    free = shutil.disk_usage(root.path).free
    if total > free - FREE_MARGIN:
        raise _unreadable(f"{url} holds {total:,} bytes; the temporary folder {root.path} has {free:,} free, and "
                          f"{FREE_MARGIN:,} stay free: point TMPDIR at a larger disk, or copy the dataset there")
    with root.mkdir(name) as here:
        for relative, info in objects:
            *folders, leaf = relative.split("/")
            copy_object(RemoteObject(url, _key(url, relative, len(objects) == 1), info, budget), here, folders, leaf)
    return os.path.join(root.path, name, objects[0][0].split("/")[0])


def _key(url: ObjectUrl, relative: str, single: bool) -> str:
    """The object key of ``relative`` (a single object's own name, or ``folder/path`` below the prefix)."""
    if single and "/" not in relative:
        return url.prefix
    below = relative.split("/", 1)[1]
    return f"{url.prefix}/{below}" if url.prefix else below


def copy_object(obj: RemoteObject, root: Folder, folders: list[str], leaf: str,
                error: Callable[[str], UmlosError] = _unreadable) -> None:
    """``obj`` written to ``root/folders.../leaf``, each folder made here (never through a link), in ranges of
    :data:`PIECE` bytes, each checked against its recorded ETag and size; ``error`` names a write that fails (an
    append into an object store copies its store's index and digests so: remote/append.py)."""
    opened: list[Folder] = []
    try:
        current = root
        for part in folders:
            current = current.sub(part) if current.lstat(part) is not None else current.mkdir(part)
            opened.append(current)
        with current.file(leaf) as handle:
            for start in range(0, obj.size, PIECE):
                handle.write(obj.read(start, min(start + PIECE, obj.size)))
    except OSError as exc:
        raise error(f"copying {obj.name} into {root.path}: {exc.strerror or exc}") from None
    finally:
        for folder in opened:
            folder.close()
