"""Read the record batches of Parquet and Arrow IPC files through ``pyarrow``, to their last byte.

What goes in: a file opened by files/reader.py (pyarrow is handed that file
object, never a path, so it reads what the bounded reader checked: a
regular file, not a FIFO or a folder) and its path for messages. What comes
out: the file's column names, and its record batches (the columns wanted
only) of at most ``batch_size`` rows; records/columns.py checks their rows.

Only the columns needed are read (Parquet: ``iter_batches(columns=...)``,
one row group's pages at a time; Arrow IPC: one record batch at a time), so
memory is bounded by a batch, not the file. A column missing, or two columns
with the name of one read, is DATASET_RECORD_INVALID naming the file.

Whole or refused: a file that is not Parquet (or Arrow) raises
DATASET_UNREADABLE naming it, and so does one that ends before its end. A
Parquet file or an Arrow IPC file (``ARROW1``) ends with a footer, which
pyarrow reads first. An Arrow IPC stream (what ``datasets`` writes) has no
footer: it ends with an end-of-stream marker (``0xFFFFFFFF`` then a zero
length; 4 zero bytes in streams before Arrow 0.15), and pyarrow's reader
stops quietly where the bytes stop, so a stream cut between two record
batches (what an interrupted copy leaves) would read as a shorter dataset.
Here, the bytes the reader took after its last batch must be that marker,
and the marker must be the file's last bytes (bytes after it, such as a
second stream appended with ``cat``, would be rows never read).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO

from ... import errors
from ...errors import UmlosError
from ...files import reader
from .chunk import missing_field_hint
from .compressed import truncated

#: How an Arrow IPC stream ends: the continuation marker and a message length of 0; before Arrow 0.15, a
#: length of 0 alone.
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"
LEGACY_END_OF_STREAM = b"\x00\x00\x00\x00"


@functools.cache
def pyarrow() -> Any:
    """The ``pyarrow`` module, or DATASET_UNREADABLE saying which extra to install (the module is kept: the
    readers ask for it a few times a batch)."""
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
        check_columns(path, names, columns, parquet.schema_arrow)
        try:
            yield from parquet.iter_batches(batch_size=batch_size, columns=list(columns), use_threads=True)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise _broken(path, "Parquet", exc) from None

    return names, batches


def open_ipc(handle: BinaryIO, path: str) -> tuple[list[str], Any]:
    """``(column names, batches(columns, batch_size))`` of the Arrow IPC file or stream at ``handle``
    (the file format when its magic says so, else the stream format ``datasets`` writes)."""
    pa = pyarrow()
    is_file = handle.read(6) == b"ARROW1"
    try:
        handle.seek(0)
        opened: Any = pa.ipc.open_file(handle) if is_file else pa.ipc.open_stream(handle)
        names = list(opened.schema.names)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _broken(path, "Arrow IPC", exc, None if is_file else handle) from None

    def batches(columns: Sequence[str], batch_size: int) -> Iterator[Any]:
        check_columns(path, names, columns, opened.schema)
        try:
            every: Iterator[Any] = (opened.get_batch(i) for i in range(opened.num_record_batches)) if is_file \
                else _to_the_end(opened, handle, path)
            for batch in every:
                yield from split(iter([batch.select(list(columns))]), batch_size)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise _broken(path, "Arrow IPC", exc, None if is_file else handle) from None

    return names, batches


def _to_the_end(stream: Any, handle: BinaryIO, path: str) -> Iterator[Any]:
    """The record batches of an Arrow IPC stream, then a check that it ended with its end-of-stream marker,
    the file's last bytes (see the module docstring); the reader reads exactly one message at a time, so
    the position of ``handle`` after a batch is where that batch ends."""
    after_last = handle.tell()
    for batch in stream:
        yield batch
        after_last = handle.tell()
    end = handle.tell()
    handle.seek(max(after_last, end - len(END_OF_STREAM)))
    tail = handle.read(end - handle.tell())
    if tail not in (END_OF_STREAM, LEGACY_END_OF_STREAM):
        raise truncated(path, "its Arrow IPC stream stops after a record batch, without the end-of-stream marker a "
                        "whole stream ends with")
    handle.seek(end)
    if handle.read(1):
        raise UmlosError(errors.DATASET_UNREADABLE, f"{path} goes on after the end-of-stream marker of its Arrow IPC "
                         f"stream at byte {end:,} (two streams joined, such as by cat?); its rows after the marker "
                         "would never be read: give each stream as a file of its own",
                         operator=errors.BATCHING_OPERATOR)


def split(batches: Iterator[Any], size: int) -> Iterator[Any]:
    """The batches cut into pieces of at most ``size`` rows (zero-copy slices)."""
    for batch in batches:
        for start in range(0, batch.num_rows, size):
            yield batch.slice(start, size)


def check_columns(path: str, names: Sequence[str], columns: Sequence[str], schema: Any = None) -> None:
    """DATASET_RECORD_INVALID when one of ``columns`` is not among ``names``, or is there twice
    (``schema``, the file's Arrow schema, lets the message name a column of conversations)."""
    missing = [name for name in columns if name not in names]
    if missing:
        raise missing_column(path, names, missing[0], conversations=conversation_columns(schema))
    twice = next((name for name in columns if list(names).count(name) > 1), None)
    if twice is not None:
        at = [i for i, name in enumerate(names) if name == twice]
        raise UmlosError(errors.DATASET_RECORD_INVALID, f"{path} has {len(at)} columns named {twice!r} (columns "
                         f"{', '.join(map(str, at))}); which one holds the field would be a guess: rename or drop "
                         "the others", operator=errors.BATCHING_OPERATOR)


def missing_column(path: str, names: Sequence[str], name: str, *, id_field: str | None = None,
                   conversations: Sequence[str] = ()) -> UmlosError:
    """DATASET_RECORD_INVALID: ``path`` (a file, a folder, the ``datasets.Dataset``) lacks the column ``name``;
    the message lists its columns and what to do (records/chunk.py :func:`missing_field_hint`)."""
    shown = ", ".join(map(repr, list(names)[:8])) or "none"
    return UmlosError(errors.DATASET_RECORD_INVALID, f"{path} lacks the column {name!r} (its columns: {shown}); "
                      + missing_field_hint(name, id_field, conversations), operator=errors.BATCHING_OPERATOR)


def conversation_columns(schema: Any) -> list[str]:
    """The columns of ``schema`` (an Arrow schema; None: none) that hold lists of messages: a list of structs
    with a ``role`` field."""
    if schema is None:
        return []
    pa = pyarrow()
    found = []
    for column in schema:
        kind = column.type
        if (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_struct(kind.value_type) \
                and kind.value_type.get_field_index("role") >= 0:
            found.append(column.name)
    return found


def _broken(path: str, what: str, exc: BaseException, stream: BinaryIO | None = None) -> UmlosError:
    """DATASET_UNREADABLE for what pyarrow could not read; a ``stream`` it failed on at the end of the file
    (a message begun and not finished) was cut short."""
    pa = pyarrow()
    why = " ".join(str(exc).split()) or type(exc).__name__
    if stream is not None and stream.tell() >= reader.file_size(stream):
        return truncated(path, f"its Arrow IPC stream ends inside a message ({why})")
    if isinstance(exc, pa.ArrowMemoryError):
        return UmlosError(errors.DATASET_UNREADABLE, f"{path}: decoding one batch of it needs more memory than this "
                          f"process may take ({why}); a few bytes that decode to gigabytes are a compression bomb, "
                          "not a dataset (a real one: write smaller row groups, or lower --chunk-size)",
                          operator=errors.BATCHING_OPERATOR)
    return UmlosError(errors.DATASET_UNREADABLE, f"{path} is not a readable {what} file ({why}); check that the file "
                      "is whole (a copy cut short, truncated, loses its end) and of the format its name says, or "
                      "pass --format", operator=errors.BATCHING_OPERATOR)
