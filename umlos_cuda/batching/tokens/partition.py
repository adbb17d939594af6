"""Tokenize a multi-file dataset one input file at a time: the shards of a sharded token store.

What goes in: a dataset (a glob or a list of files, any format
umlos_cuda/batching/records/ reads), a tokenizer and the options of
:func:`~umlos_cuda.batching.tokens.writer.tokenize_dataset`. What comes out:
:func:`tokenize_shard`, the classic token store of input file ``index``
alone; :func:`tokenize_sharded`, a sharded token store of one shard per
input file (tokens/adopt.py).

A file tokenized alone gets exactly the sample ids it has in the whole
dataset: in a dataset of two or more files, rows without an id are named by
their file's content hash and their row (records/ids.py), which depend on
that file only; so does everything else a shard holds (a chunk never spans
two files). That is why a shard written by one process, by a Ray worker or
by this module holds the same bytes, and why a store of shards equals, row
for row, the store ``tokenize_dataset`` writes from the whole dataset. The
one thing a file alone cannot check is an id repeated in another file:
adoption checks that across shards (SHARDED_STORE_MISMATCH).

A file holding no record (an empty shard of an export) has no shard:
:func:`tokenize_shard` raises DATASET_EMPTY for it and
:func:`tokenize_sharded` skips it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

from ... import checks, errors
from ...errors import UmlosError
from ...files.folder import Folder
from ..records.shards import resolve
from .adopt import SHARDED_STORE, adopting
from .index import shard_name
from .logical import ShardedTokenStore
from .store import TokenStore
from .writer import STORE, tokenize_dataset
from ...files.artifacts import identify
from ...files.writer import check_output_folder, remove_stale_temps, temp_folder
from ..lengths.builder import input_paths
from ..records.source import dataset_paths


def tokenize_shard(dataset: Any, index: int, tokenizer: Any, output: str | os.PathLike[str], *,
                   format: str | None = None, sharded: bool | None = None, **options: Any) -> TokenStore:
    """Write the token store of input file ``index`` (0-based, in the order the dataset is read: a
    glob's matches sorted, a list as given) of ``dataset`` to ``output``, its rows named as in the
    whole dataset. ``options`` are those of ``tokenize_dataset`` (``force``, fields, ``chunk_size``,
    ``progress``...). ``sharded`` (default: the dataset has two or more inputs) says whether rows
    without ids get content ids; an append of new files to a store with content ids passes True."""
    inputs = resolve(dataset, format)
    index = checks.integer(index, "index", 0, len(inputs) - 1, fail=_argument,
                           message="input file {value!r} is not in the dataset; its files are 0 to {high}")
    item = inputs[index]
    part = item.dataset if item.format == "object" else item.path
    return tokenize_dataset(part, tokenizer, output, format=format,
                            sharded=len(inputs) > 1 if sharded is None else sharded, **options)


def tokenize_sharded(dataset: Any, tokenizer: Any, output: str | os.PathLike[str], *, append: bool = False,
                     force: bool = False, format: str | None = None,
                     progress: Callable[[int, int], None] | None = None,
                     opener: Callable[[str], ShardedTokenStore] = ShardedTokenStore.open,
                     **options: Any) -> ShardedTokenStore:
    """Tokenize every input file of ``dataset`` as one shard and write the sharded store ``output``
    (``force`` replaces a sharded store); with ``append``, add them as new shards of the existing
    store ``output`` (their rows get content ids, as files of a growing multi-file dataset).
    The shards are written in a hidden staging folder beside ``output``, then adopted
    (:func:`~umlos_cuda.batching.tokens.adopt.adopting`: an append holds the store's lock from before the
    first file is tokenized); the staging folder is removed. ``opener`` is :func:`~.adopt.append_shards`'s."""
    inputs = resolve(dataset, format)
    root = check_sharded_output(output, dataset, format, tokenizer, options.get("chat_template"), append=append,
                                force=force)
    sizes = [input_bytes(item.files) for item in inputs]
    total = max(sum(sizes), 1)
    with adopting(root, create=not append, force=force, opener=opener) as adopt, \
            staging_folder(root, "stage") as stage_path:
        staged: list[str] = []
        before = 0
        for index, size in enumerate(sizes):
            target = os.path.join(stage_path, shard_name(len(staged)))
            report = None if progress is None else _offset(progress, before, total)
            try:
                tokenize_shard(dataset, index, tokenizer, target, format=format,
                               sharded=True if append else None, progress=report, **options)
            except UmlosError as exc:
                if exc.code != errors.DATASET_EMPTY or len(inputs) == 1:
                    raise
            else:
                staged.append(target)
            before += size
        if not staged:
            raise UmlosError(errors.DATASET_EMPTY, f"no file of {inputs[0].path} and the other inputs holds a "
                             "record", operator=errors.BATCHING_OPERATOR)
        return adopt(staged)


def check_sharded_output(output, dataset: Any, format: str | None, tokenizer: Any, chat_template: Any, *,
                         append: bool, force: bool) -> str:
    """The absolute path of the sharded store ``output`` that new shards go to, refused before any work:
    with ``append`` it must be a sharded store; else OUTPUT_EXISTS unless ``force`` replaces one, and it may
    not be one of the inputs (the dataset's files, the tokenizer, the chat template). Every path that writes
    shards (``tokenize_sharded``, the Ray job) checks this one way."""

    root = os.path.abspath(os.fspath(output))
    if append:
        open_for_append(root)  # refused at once when it is not a sharded store
    else:
        check_output_folder(root, SHARDED_STORE, force=force,
                            inputs=input_paths(*dataset_paths(dataset, format), tokenizer, chat_template),
                            operator=errors.BATCHING_OPERATOR)
    return root


def open_for_append(output: str | os.PathLike[str]) -> ShardedTokenStore:
    """The sharded store ``output`` that ``--append`` adds shards to; a classic (one-file) token store there is
    SHARDED_STORE_INVALID saying what to do instead (the sharded store's reader would only say that its
    format is another one)."""
    root = os.path.abspath(os.fspath(output))
    _refuse_a_classic_store(root)
    return ShardedTokenStore.open(root)


def _refuse_a_classic_store(root: str) -> None:
    try:
        with Folder.open(root, follow=True) as folder:
            classic = identify(folder, STORE)[0]
    except OSError:
        return  # not a folder here: the sharded store's reader says what it is
    if not classic:
        return
    numbered = TokenStore.open(root).ids_are_line_numbers
    instead = ("its rows are named by row number, which every shard would repeat, so it takes no second shard: "
               "tokenize all the files again as one sharded store in a new folder (--sharded, the files as a list "
               "or a glob)" if numbered else
               f"make it the first shard of a sharded store, umlos-cuda data append --create NEW {root} (which "
               "moves it there), then --append the new files to NEW; or tokenize all the files again with --sharded "
               "into a new folder")
    raise UmlosError(errors.SHARDED_STORE_INVALID, f"{root} is a token store, not a sharded one: --append adds files "
                     f"only to a sharded token store (written by data tokenize --sharded). To grow it, {instead}",
                     operator=errors.BATCHING_OPERATOR)


@contextlib.contextmanager
def staging_folder(root: str, label: str) -> Iterator[str]:
    """A new hidden folder beside the store ``root`` (``.tmp-NAME-LABEL-...``, on its file system, so adopting
    a shard is a rename), marked and locked as a temp of a sharded store's write (the temps of a killed run
    beside the store are removed first, :func:`~umlos_cuda.files.writer.remove_stale_temps`), removed with
    whatever is left in it when the block ends, however it ends."""
    remove_stale_temps(root, SHARDED_STORE, errors.BATCHING_OPERATOR)  # what a killed run staged beside it
    with temp_folder(root, label, SHARDED_STORE, errors.BATCHING_OPERATOR) as path:
        yield path


def _offset(progress: Callable[[int, int], None], before: int, total: int) -> Callable[[int, int], None]:
    return lambda done, _total: progress(before + done, total)


def input_bytes(files: tuple[str, ...]) -> int:
    """The bytes of an input's files (what progress counts); a file gone since it was listed counts 0."""
    size = 0
    for path in files:
        with contextlib.suppress(OSError):
            size += os.path.getsize(path)
    return size


def _argument(message: str) -> UmlosError:
    return UmlosError(errors.INVALID_ARGUMENT, message, operator=errors.BATCHING_OPERATOR)
