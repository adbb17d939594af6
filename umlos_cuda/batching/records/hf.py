"""Hugging Face ``datasets``: a ``datasets.Dataset`` in memory, and a folder ``save_to_disk`` wrote.

What goes in: a ``datasets.Dataset`` (any object with ``with_format`` and
``column_names``), or a folder. What comes out: for the object, its Arrow
record batches in row order (``with_format("arrow").iter``, which honours a
``shuffle``/``select`` index mapping) with the wanted columns only; for the
folder, the paths of its Arrow files in the order its ``state.json`` lists
them (``_data_files``), read as one dataset (rows numbered across them) by
records/arrow.py like any Arrow IPC stream.

Why a folder is read through ``pyarrow`` rather than ``datasets.load_from_disk``:
its files then go through files/reader.py like every other input (regular
files, no FIFO, each file named in a message), batch by batch with the
wanted columns only, and the ``hf`` extra is not needed to read them;
``state.json`` is a small JSON file read with the bounded JSON reader. The
layout read is the one ``datasets`` 2 to 5 write (``state.json``,
``dataset_info.json``, ``data-NNNNN-of-NNNNN.arrow``); a folder without
``state.json`` is refused (DATASET_UNREADABLE) saying what was expected,
and a ``DatasetDict`` folder (``dataset_dict.json``) says to name one split.

Nothing lost: every data file must end with its end-of-stream marker
(records/arrow.py), and the files ``state.json`` lists must be all the
``NNNNN-of-NNNNN`` their names count. The rows are not compared with a count
in the metadata, because none there is reliable: ``dataset_info.json``'s
``splits`` keeps the count of the split a dataset was loaded as after
``filter``, ``select``, ``shard`` or ``train_test_split`` (datasets 5.2: 10
rows selected from a split of 200 and saved still say 200), and
``save_to_disk`` writes no count of its own. Nothing from outside: ``state.json`` and the files it
lists are the folder's own; one that is a symbolic link to a file outside the
folder is refused (a link within it is read).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

from ... import checks, errors
from ...errors import UmlosError
from ...files import reader
from .arrow import conversation_columns, missing_column

STATE = "state.json"
DICT = "dataset_dict.json"
MAX_STATE_BYTES = 16 << 20
#: How ``save_to_disk`` names its data files: the file's number and how many there are.
DATA_FILE = re.compile(r"data-([0-9]{5,})-of-([0-9]{5,})\.arrow")  # ASCII digits: \d takes every script's


def is_dataset_object(value: Any) -> bool:
    """Whether ``value`` looks like a ``datasets.Dataset`` (an object, not a path)."""
    return hasattr(value, "with_format") and hasattr(value, "column_names") and hasattr(value, "num_rows")


def object_batches(dataset: Any, columns: Sequence[str], batch_size: int, id_field: str | None = None
                   ) -> Iterator[Any]:
    """The Arrow record batches of a ``datasets.Dataset``, ``columns`` only, in its row order (``id_field``:
    the id column among them, for the message when it is missing)."""
    missing = [name for name in columns if name not in dataset.column_names]
    if missing:
        raise missing_column("the datasets.Dataset", dataset.column_names, missing[0], id_field=id_field,
                             conversations=conversation_columns(getattr(getattr(dataset, "data", None), "schema",
                                                                        None)))
    selected = dataset.select_columns(list(columns)).with_format("arrow")
    for table in selected.iter(batch_size=batch_size):
        yield from table.to_batches()


def object_bytes(dataset: Any) -> int:
    """The dataset's Arrow bytes (for progress)."""
    try:
        return int(dataset.data.nbytes)
    except Exception:  # an object that only looks like a Dataset: progress then counts nothing
        return 0


def folder_files(folder: str) -> list[str]:
    """The Arrow files of a ``save_to_disk`` folder, in ``state.json`` order."""
    state_path = os.path.join(folder, STATE)
    if not os.path.exists(state_path):
        if os.path.exists(os.path.join(folder, DICT)):
            raise _unreadable(f"{folder} is a DatasetDict folder ({DICT}); give the folder of one split, such as "
                              f"{os.path.join(folder, 'train')}")
        raise _unreadable(f"{folder} is a folder but not a datasets save_to_disk folder (it has no {STATE}); give a "
                          "file, a glob such as 'train-*.parquet', or the folder save_to_disk wrote")
    _refuse_link_out(folder, state_path)
    state = reader.read_json(state_path, _unreadable, max_bytes=MAX_STATE_BYTES, what="datasets state.json")
    files = state.get("_data_files") if isinstance(state, dict) else None
    if not isinstance(files, list) or not files:
        raise _unreadable(f"{state_path} lists no _data_files; it is not a save_to_disk folder's state")
    paths = []
    for entry in files:
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name or os.path.basename(name) != name or name in (".", ".."):
            raise _unreadable(f"{state_path} lists {entry!r} in _data_files; each entry names a file of the folder")
        paths.append(os.path.join(folder, name))
        _refuse_link_out(folder, paths[-1])
    _refuse_missing_files(state_path, [os.path.basename(path) for path in paths])
    return paths


def _refuse_link_out(folder: str, path: str) -> None:
    """DATASET_UNREADABLE when ``path`` resolves to a file outside ``folder`` (a symbolic link out of it)."""
    root, real = os.path.realpath(folder), os.path.realpath(path)
    if os.path.commonpath([root, real]) != root:
        raise _unreadable(f"{path} is a link to {real}, outside the folder {folder}; a save_to_disk folder holds its "
                          "own files: copy the file into the folder (or give that file as the dataset)")


def _refuse_missing_files(state_path: str, names: list[str]) -> None:
    """DATASET_UNREADABLE when the data files listed are not every one their names count (``data-00000-of-00003``
    to ``data-00002-of-00003``, in order): a state.json that lost an entry."""
    numbered = [DATA_FILE.fullmatch(name) for name in names]
    if not all(numbered):
        return  # named otherwise (an older datasets, or by hand): nothing counts them
    counts = {checks.integer_text(match.group(2), f"{state_path}: a data file's count", 1, None, fail=_unreadable)
              for match in numbered if match}
    expected = [f"data-{i:05d}-of-{max(counts):05d}.arrow" for i in range(max(counts))]
    if len(counts) != 1 or names != expected:
        missing = next((name for name in expected if name not in names), names[-1])
        raise _unreadable(f"{state_path} lists {len(names)} data file{'s' if len(names) != 1 else ''} but their names "
                          f"count {max(counts)} ({missing} is not listed, or is out of place); the folder is not "
                          "whole: save or copy it again")


def _unreadable(message: str) -> UmlosError:
    return UmlosError(errors.DATASET_UNREADABLE, message, operator=errors.BATCHING_OPERATOR)
