"""Read training records from Parquet and Arrow IPC files, and from Arrow tables, through ``pyarrow``.

What goes in: a file opened by files/reader.py (pyarrow is handed that file
object, never a path, so it reads what the bounded reader checked: a
regular file, not a FIFO or a folder), or the record batches of an Arrow
table (``datasets``, records/hf.py); the fields wanted and the id field.
What comes out: :class:`~.chunk.RecordChunk` s of at most ``chunk_size``
rows, and each chunk's Arrow columns for the fingerprint (records/fingerprint.py).

Only the columns needed are read (Parquet: ``iter_batches(columns=...)``,
one row group's pages at a time; Arrow IPC: one record batch at a time), so
memory is bounded by a batch, not the file. The id column is read when the
file has it; a file without it gives ``None`` ids (the caller numbers the
rows). A value of the wrong type, a null, an empty id or a token count out
of range raises DATASET_RECORD_INVALID naming the file, the row (0-based)
and the column; a file that is not Parquet (or Arrow), or is truncated,
raises DATASET_UNREADABLE naming it and saying what to check.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any, BinaryIO

import numpy as np

from ... import errors
from ...errors import UINT32_MAX, UmlosError
from .chunk import Field
from .jsonl import check_messages


def pyarrow() -> Any:
    """The ``pyarrow`` module, or DATASET_UNREADABLE saying which extra to install."""
    try:
        import pyarrow as pa
        import pyarrow.compute
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError:
        raise UmlosError(errors.DATASET_UNREADABLE, "reading Parquet, Arrow and datasets files needs pyarrow: "
                         "pip install 'umlos-cuda[data]'", operator=errors.BATCHING_OPERATOR) from None
    return pa


def open_parquet(handle: BinaryIO, path: str) -> tuple[list[str], Any]:
    """``(column names, batches(columns, batch_size))`` of the Parquet file at ``handle``: the footer is
    read now, the batches (``columns`` only) when iterated."""
    pa = pyarrow()
    try:
        parquet = pa.parquet.ParquetFile(handle)
        names = list(parquet.schema_arrow.names)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _broken(path, "Parquet", exc) from None

    def batches(columns: Sequence[str], batch_size: int) -> Iterator[Any]:
        _check_columns(path, names, columns)
        try:
            yield from parquet.iter_batches(batch_size=batch_size, columns=list(columns), use_threads=True)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise _broken(path, "Parquet", exc) from None

    return names, batches


def open_ipc(handle: BinaryIO, path: str) -> tuple[list[str], Any]:
    """``(column names, batches(columns, batch_size))`` of the Arrow IPC file or stream at ``handle``
    (the file format when its magic says so, else the stream format ``datasets`` writes)."""
    pa = pyarrow()
    try:
        is_file = handle.read(6) == b"ARROW1"
        handle.seek(0)
        opened: Any = pa.ipc.open_file(handle) if is_file else pa.ipc.open_stream(handle)
        names = list(opened.schema.names)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _broken(path, "Arrow IPC", exc) from None

    def batches(columns: Sequence[str], batch_size: int) -> Iterator[Any]:
        _check_columns(path, names, columns)
        try:
            every = (opened.get_batch(i) for i in range(opened.num_record_batches)) if is_file else iter(opened)
            for batch in every:
                yield from split(iter([batch.select(list(columns))]), batch_size)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise _broken(path, "Arrow IPC", exc) from None

    return names, batches


def split(batches: Iterator[Any], size: int) -> Iterator[Any]:
    """The batches cut into pieces of at most ``size`` rows (zero-copy slices)."""
    for batch in batches:
        for start in range(0, batch.num_rows, size):
            yield batch.slice(start, size)


def batch_columns(batch: Any, path: str, first_row: int, fields: Sequence[Field], id_field: str | None
                  ) -> tuple[list[str] | None, Any, list[Any], list[Any]]:
    """``(sample ids or None, the id array or None, values per field, Arrow array per field)`` of one batch,
    every value checked (see the module docstring)."""
    pa = pyarrow()
    ids = id_array = None
    if id_field is not None:
        id_array = _plain(batch.column(batch.schema.get_field_index(id_field)))
        kind = id_array.type
        _no_nulls(id_array, path, first_row, id_field)
        if pa.types.is_integer(kind):
            id_array = id_array.cast(pa.large_string())
        elif not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
            raise _invalid(path, first_row, f"column {id_field!r} is {kind}; an id is a string or an integer")
        ids = id_array.to_pylist()
        empty = np.flatnonzero(np.asarray(pa.compute.binary_length(id_array)) == 0)
        if empty.size:
            raise _invalid(path, first_row + int(empty[0]), f"has {id_field!r} = ''; an id is a non-empty string "
                           "or an integer")
    values, arrays = [], []
    for field in fields:
        array = _plain(batch.column(batch.schema.get_field_index(field.name)))
        _no_nulls(array, path, first_row, field.name)
        values.append(_values(array, field, path, first_row))
        arrays.append(array)
    return ids, id_array, values, arrays


def _values(array: Any, field: Field, path: str, first_row: int) -> Any:
    pa = pyarrow()
    kind = array.type
    if field.kind == "string":
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
            raise _invalid(path, first_row, f"column {field.name!r} is {kind}; it must be a string column")
        return array.to_pylist()
    if field.kind == "integer":
        if not pa.types.is_integer(kind):
            raise _invalid(path, first_row, f"column {field.name!r} is {kind}; a token count is an integer column")
        numbers = array.to_numpy(zero_copy_only=False)
        bad = np.flatnonzero((numbers < 0) | (numbers > UINT32_MAX))
        if bad.size:
            raise _invalid(path, first_row + int(bad[0]), f"has {field.name!r} = {int(numbers[bad[0]])}; a token "
                           "count is an integer from 0 to 4294967295")
        return numbers.astype(np.int64, copy=False)
    items = array.to_pylist()
    for row, item in enumerate(items):
        check_messages(item, field.name, partial(_invalid, path, first_row + row))
    return items


def _plain(array: Any) -> Any:
    """One contiguous array (a table's column may come in chunks)."""
    return array.combine_chunks() if hasattr(array, "combine_chunks") else array


def _no_nulls(array: Any, path: str, first_row: int, name: str) -> None:
    if array.null_count:
        row = int(np.flatnonzero(np.asarray(array.is_null()))[0])
        raise _invalid(path, first_row + row, f"has {name!r} null; every row holds a value")


def _check_columns(path: str, names: Sequence[str], columns: Sequence[str]) -> None:
    missing = [name for name in columns if name not in names]
    if missing:
        shown = ", ".join(map(repr, list(names)[:8])) or "none"
        raise UmlosError(errors.DATASET_RECORD_INVALID, f"{path} lacks the column {missing[0]!r} (its columns: "
                         f"{shown}); name the field with --text-field, --prompt-field/--response-field or "
                         "--length-field", operator=errors.BATCHING_OPERATOR)


def _broken(path: str, what: str, exc: BaseException) -> UmlosError:
    why = " ".join(str(exc).split()) or type(exc).__name__
    return UmlosError(errors.DATASET_UNREADABLE, f"{path} is not a readable {what} file ({why}); check that the file "
                      "is whole (a copy cut short loses the footer) and of the format its name says, or pass "
                      "--format", operator=errors.BATCHING_OPERATOR)


def _invalid(path: str, row: int, problem: str) -> UmlosError:
    return UmlosError(errors.DATASET_RECORD_INVALID, f"{path} row {row} {problem}",
                      operator=errors.BATCHING_OPERATOR)
