"""Stream the records of a JSONL dataset in chunks, checking each line.

What goes in: an open binary stream of JSONL (one JSON object per line,
UTF-8; a plain file, or the decompressed stream of a ``.gz`` or ``.zst``
file, records/compressed.py), its path for messages, and the fields wanted
(records/chunk.py :class:`Field`). What comes out: chunks of sample ids and
field values, in file order, with the number of bytes read so far (for a
progress bar). Memory holds one chunk, whatever the file's size.

A record's id is its ``id`` field (a string, or an integer written as its
decimal text) or, when it has none, ``row_id(line)``: its 0-based line
number as text for a single input (records/ids.py gives sharded inputs
theirs). Any other line raises DATASET_RECORD_INVALID naming the line
(1-based, as editors count): not UTF-8, not JSON, nested deeper than 64
levels, not an object, empty, a wanted field missing or of the wrong kind
(a string field not a string; an integer field not an integer from 0 to
2^32 - 1; a ``messages``-like JSON field not a list of objects), a field
holding a lone surrogate (an escape such as ``\\ud83d`` without its other
half: a character cut in two, which UTF-8 and every tokenizer refuse; looked
for only in lines that hold such an escape), an id that is empty or of
another type; given a :class:`SkippedLines`, such lines are skipped and
counted instead, and the records around them go in chunks of their own, so
that a chunk's records are consecutive lines (``first_line + offset`` is a
record's line, as it is a row's in records/columns.py). A line over 64 MiB
is refused before it is read whole (files/reader.py), skipped lines or
not. What editors and exporters add is not an error: a UTF-8 byte-order mark before the first
line, and blank lines at the end of the file (a blank line before a record
still is). A first line that is not UTF-8 and starts like a Parquet, Arrow,
gzip or zstd file says so, and how to read it.

``unchecked`` names fields whose values the reader hands on as they are,
any JSON type, for the consumer to check (a chat record's messages, which
the workers render: umlos_cuda/batching/chat/chunks.py). Each chunk then
carries where its rows were read (``RecordChunk.read``: each row's line), so
that a row the consumer refuses later is named, skipped or raised in line
order (records/source.py ``Records.accept``); and a bad line that raises
hands on the rows before it first, as a chunk of their own, so that a row
among them the consumer refuses is raised before it, as it comes first.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, BinaryIO

import numpy as np

from ... import checks, errors
from ...errors import UINT32_MAX, UmlosError
from ...files import reader
from .chunk import DEFAULT_ID_FIELD as DEFAULT_ID_FIELD  # the readers' name for it since before chunk.py had it
from .chunk import Field, ReadRows, RecordChunk, SkippedLines, id_required, missing_field_hint, skip_or_raise

#: The UTF-8 byte-order mark some editors put before the first line.
BOM = b"\xef\xbb\xbf"
#: How files of other formats begin, to say what a misnamed file is.
MAGIC = ((b"PAR1", "a Parquet file", "parquet"), (b"ARROW1", "an Arrow IPC file", "arrow"),
         (b"\xff\xff\xff\xff", "an Arrow IPC stream", "arrow"), (b"\x1f\x8b", "gzip data", "jsonl.gz"),
         (b"\x28\xb5\x2f\xfd", "zstd data", "jsonl.zst"))
#: A JSON escape of half of a surrogate pair (U+D800 to U+DFFF): only a line holding one can hold a lone surrogate.
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def require_dataset_file(path: str | os.PathLike[str]) -> str:
    """``path`` as a string when it is an existing regular file; else DATASET_UNREADABLE."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        what = "is not a regular file" if os.path.exists(path) else "does not exist"
        raise unreadable(f"dataset {path} {what}")
    return path


def read_chunks(path: str | os.PathLike[str], fields: tuple[str | Field, ...], *, id_field: str = DEFAULT_ID_FIELD,
                chunk_size: int = 1024, digest: Any = None, skipped: SkippedLines | None = None,
                unchecked: frozenset[str] = frozenset()) -> Iterator[RecordChunk]:
    """Yield the records of the JSONL file ``path`` in chunks of ``chunk_size``; every byte
    read also goes to ``digest.update`` when a digest is given. A bad line
    raises DATASET_RECORD_INVALID, or is counted in ``skipped`` when given."""
    path = require_dataset_file(path)
    try:
        with reader.open_regular(path, unreadable) as handle:
            yield from stream_chunks(handle, path, fields, id_field=id_field, chunk_size=chunk_size, digest=digest,
                                     skipped=skipped, consumed=lambda: handle.tell(), unchecked=unchecked)
    except FileNotFoundError:
        raise unreadable(f"dataset {path} does not exist") from None


def stream_chunks(handle: BinaryIO, path: str, fields: tuple[str | Field, ...], *, id_field: str = DEFAULT_ID_FIELD,
                  chunk_size: int = 1024, digest: Any = None, skipped: SkippedLines | None = None,
                  row_id: Callable[[int], str] = str, consumed: Callable[[], int] | None = None,
                  shard: str | None = None, bytes_before: int = 0, empty_ok: bool = False,
                  unchecked: frozenset[str] = frozenset(), input_index: int = 0) -> Iterator[RecordChunk]:
    """:func:`read_chunks` of an open stream (a plain or decompressed file): ``consumed()``
    says how many bytes of the file itself were read (for progress; default: the lines' bytes);
    a record without an id gets ``row_id(line)``. With ``empty_ok``, a stream with no record
    yields nothing instead of raising DATASET_EMPTY (a shard may be empty; the dataset may not).
    ``unchecked`` fields are handed on as read, with each chunk's :class:`ReadRows` (``input_index``:
    this file's place among the dataset's inputs), for the consumer to check."""
    wanted = tuple(f if isinstance(f, Field) else Field(f) for f in fields)
    later = [field.name in unchecked for field in wanted]
    ids: list[str] = []
    values: list[list] = [[] for _ in wanted]
    lines: list[int] = []
    first = 0
    lines_bytes = 0
    number = previous = -1
    records = 0
    blank = range(0)  # blank lines not yet followed by a record, an error only if one follows (a range: flat memory)

    def chunk() -> RecordChunk:
        done = consumed() if consumed is not None else lines_bytes
        out = [np.asarray(column, dtype=np.int64) if field.kind == "integer" else column
               for field, column in zip(wanted, values)]
        read = ReadRows(path, input_index, False, lines, ids, out) if unchecked else None
        return RecordChunk(ids, out, first, bytes_before + done, shard, read)

    try:
        for number, raw in reader.lines_of(handle, path, unreadable, line_error=_line_error):
            lines_bytes += len(raw)
            if digest is not None:
                digest.update(raw)
            if number == 0 and raw.startswith(BOM):
                raw = raw[len(BOM):]
            if not raw.strip():
                blank = range(blank.start if blank else number, number + 1)
                continue
            for line in blank:  # outside the try below: its message says how to skip once
                skip_or_raise(invalid_record(path, line, "is empty; every line holds one JSON object"), skipped,
                         (input_index, line))
            blank = range(0)
            try:
                record = _record(path, number, raw)
                sample_id = _sample_id(path, number, record, id_field, row_id)
                row = [_field(path, number, record, field, checked_later)
                       for field, checked_later in zip(wanted, later)]
                if SURROGATE_ESCAPE.search(raw) is not None:
                    _refuse_lone_surrogates(path, number, wanted, row)
            except UmlosError as exc:
                skip_or_raise(exc, skipped, (input_index, number))
                continue
            if ids and number != previous + 1:  # lines skipped since the last record: a chunk's lines are consecutive
                yield chunk()
                ids, values, lines = [], [[] for _ in wanted], []
            if not ids:
                first = number
            previous = number
            ids.append(sample_id)
            for column, value in zip(values, row):
                column.append(value)
            if unchecked:
                lines.append(number)
            records += 1
            if len(ids) == chunk_size:
                yield chunk()
                ids, values, lines = [], [[] for _ in wanted], []
    except UmlosError:
        if unchecked and ids:  # the rows before the bad line first: one the consumer refuses comes before it
            yield chunk()
        raise
    if ids:
        yield chunk()
    if records == 0 and not empty_ok:
        why = "the file is empty" if number < 0 else "every line is blank or was skipped"
        raise UmlosError(errors.DATASET_EMPTY, f"dataset {path} holds no record ({why})",
                         operator=errors.BATCHING_OPERATOR)


def _record(path: str, number: int, raw: bytes) -> dict:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        hint = next((f"; it looks like {what}: name it .{suffix} or pass --format {suffix}"
                     for magic, what, suffix in MAGIC if number == 0 and raw.startswith(magic)), "")
        raise invalid_record(path, number, f"is not UTF-8 (byte {exc.start} of the line){hint}") from None
    record = reader.loads_json(text, _line_error, f"{path} line {number + 1}", not_json="is not JSON")
    return checks.instance(record, "line", dict, fail=partial(invalid_record, path, number),
                           message="holds a JSON {type}; every line holds one object")


def _sample_id(path: str, number: int, record: dict, id_field: str, row_id: Callable[[int], str]) -> str:
    if id_field not in record:
        if id_required(id_field):
            raise invalid_record(path, number, f"lacks the id field {id_field!r} (its fields: {_keys(record)}); "
                                 + missing_field_hint(id_field, id_field))
        return row_id(number)
    value = record[id_field]
    if checks.is_integer(value, strict=True):
        return str(value)
    return checks.text(value, id_field, empty=False, fail=partial(invalid_record, path, number),
                       message="has {name!r} = {value!r}; an id is a non-empty string or an integer")


def _keys(record: dict) -> str:
    return ", ".join(sorted(map(str, record))[:8]) or "none"


def _is_conversation(value: Any) -> bool:
    """Whether ``value`` looks like a list of chat messages (its first item an object with a ``role``)."""
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict) and "role" in value[0]


def _field(path: str, number: int, record: dict, field: Field, unchecked: bool = False) -> Any:
    """The field's value, checked for its kind (a field checked later is the consumer's to check)."""
    name = field.name
    try:
        value = record[name]
    except KeyError:
        conversations = [key for key, value in record.items() if _is_conversation(value)]
        raise invalid_record(path, number, f"lacks the field {name!r} (its fields: {_keys(record)}); "
                             + missing_field_hint(name, conversations=conversations)) from None
    if unchecked:
        return value
    fail = partial(invalid_record, path, number)
    if field.kind == "string":
        return checks.text(value, name, fail=fail, message="has {name!r} of type {type}; it must be a string")
    if field.kind == "integer":
        return checks.integer(value, name, 0, UINT32_MAX, fail=fail,
                              message="has {name!r} = {value!r}; a token count is an integer from 0 to 4294967295")
    if field.kind == "boolean":
        return checks.instance(value, name, bool, fail=fail, message="has {name!r} = {value!r}; it must be true or "
                               "false")
    return check_messages(value, name, fail)


def _refuse_lone_surrogates(path: str, number: int, fields: tuple[Field, ...], values: list[Any]) -> None:
    for field, value in zip(fields, values):
        text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value
        if checks.utf8_length(text) is None:
            half = next(c for c in text if "\ud800" <= c <= "\udfff")
            raise invalid_record(path, number, f"has {field.name!r} holding a lone surrogate (\\u{ord(half):04x} "
                                 "without its other half: a character cut in two), which no tokenizer encodes")


def check_messages(value: Any, name: str, fail: Callable[[str], UmlosError]) -> list:
    """A JSON field such as ``messages``: a list of objects (what each object holds is its reader's to check)."""
    checks.instance(value, name, list, fail=fail, message="has {name!r} of type {type}; it must be a list of objects")
    for position, item in enumerate(value):
        if not isinstance(item, dict):
            raise fail(f"has {name}[{position}] of type {type(item).__name__}; {name!r} must be a list of objects")
    return value


def _line_error(message: str) -> UmlosError:
    return UmlosError(errors.DATASET_RECORD_INVALID, message, operator=errors.BATCHING_OPERATOR)


def invalid_record(path: str, number: int, problem: str) -> UmlosError:
    return UmlosError(errors.DATASET_RECORD_INVALID, f"{path} line {number + 1} {problem}",
                      operator=errors.BATCHING_OPERATOR)


def unreadable(message: str) -> UmlosError:
    return UmlosError(errors.DATASET_UNREADABLE, message, operator=errors.BATCHING_OPERATOR)
