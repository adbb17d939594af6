"""Stream the records of a JSONL dataset in chunks, checking each line.

What goes in: a JSONL file (one JSON object per line, UTF-8) and the names
of the string fields wanted (or of fields a converter turns into
something else, such as a chat record's messages). What comes out: chunks of sample ids and field
values, in file order, with the number of bytes read so far (for a progress
bar). Memory holds one chunk, whatever the file's size.

A record's id is its ``id`` field (a string, or an integer written as its
decimal text) or, when it has none, its 0-based line number as text. Any
other line raises DATASET_RECORD_INVALID naming the line (1-based, as editors
count): not UTF-8, not JSON, nested deeper than 64 levels, not an object,
empty, a wanted field missing or not a string, an id that is empty or of
another type; given a :class:`SkippedLines`, such lines are skipped and
counted instead. A line over 64 MiB is refused before it is read whole
(files/reader.py), skipped lines or not. What
editors and exporters add is not an error: a UTF-8 byte-order mark before
the first line, and blank lines at the end of the file (a blank line
before a record still is).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ... import checks, errors
from ...errors import UmlosError
from ...files import reader

DEFAULT_ID_FIELD = "id"


@dataclass
class RecordChunk:
    """Consecutive records: ``values[f][i]`` is field ``fields[f]`` of record ``i``."""

    sample_ids: list[str]
    values: list[list[str]]
    first_line: int  # 0-based line number of the chunk's first record
    bytes_read: int  # bytes of the file consumed so far


@dataclass
class SkippedLines:
    """The bad lines a read skipped (``--skip-bad-lines``): how many, and the first few with the reason."""

    count: int = 0
    first: list[str] = field(default_factory=list)

    def add(self, error: UmlosError) -> None:
        self.count += 1
        if len(self.first) < 5:
            self.first.append(error.message)


#: The UTF-8 byte-order mark some editors put before the first line.
BOM = b"\xef\xbb\xbf"


def require_dataset_file(path: str | os.PathLike[str]) -> str:
    """``path`` as a string when it is an existing regular file; else DATASET_UNREADABLE."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        what = "is not a regular file" if os.path.exists(path) else "does not exist"
        raise unreadable(f"dataset {path} {what}")
    return path


class RecordProblem(ValueError):
    """Raised by a field converter: the record's field is not what the converter takes (the message says why)."""


def read_chunks(path: str | os.PathLike[str], fields: tuple[str, ...], *, id_field: str = DEFAULT_ID_FIELD,
                chunk_size: int = 1024, digest: Any = None, skipped: SkippedLines | None = None,
                convert: Mapping[str, Callable[[Any], Any]] | None = None) -> Iterator[RecordChunk]:
    """Yield the records of ``path`` in chunks of ``chunk_size``; every byte
    read also goes to ``digest.update`` when a digest is given. A bad line
    raises DATASET_RECORD_INVALID, or is counted in ``skipped`` when given.

    ``convert`` maps a field to a function of its JSON value, any type: the
    chunk holds what it returns, and a :class:`RecordProblem` it raises makes
    the line a bad line (a chat record's messages, umlos_cuda/batching/chat/records.py)."""
    path = require_dataset_file(path)
    ids: list[str] = []
    values: list[list[str]] = [[] for _ in fields]
    first = 0
    consumed = 0
    number = -1
    records = 0
    blank = range(0)  # blank lines not yet followed by a record, an error only if one follows (a range: flat memory)
    try:
        for number, raw in reader.iter_lines(path, unreadable, line_error=_line_error):
            consumed += len(raw)
            if digest is not None:
                digest.update(raw)
            if number == 0 and raw.startswith(BOM):
                raw = raw[len(BOM):]
            if not raw.strip():
                blank = range(blank.start if blank else number, number + 1)
                continue
            try:
                for line in blank:
                    _bad(invalid_record(path, line, "is empty; every line holds one JSON object"), skipped)
                blank = range(0)
                record = _record(path, number, raw)
                sample_id = _sample_id(path, number, record, id_field)
                row = [_field(path, number, record, name, convert) for name in fields]
            except UmlosError as exc:
                _bad(exc, skipped)
                continue
            if not ids:
                first = number
            ids.append(sample_id)
            for column, value in zip(values, row):
                column.append(value)
            records += 1
            if len(ids) == chunk_size:
                yield RecordChunk(ids, values, first, consumed)
                ids, values = [], [[] for _ in fields]
    except FileNotFoundError:
        raise unreadable(f"dataset {path} does not exist") from None
    if ids:
        yield RecordChunk(ids, values, first, consumed)
    if records == 0:
        why = "the file is empty" if number < 0 else "every line is blank or was skipped"
        raise UmlosError(errors.DATASET_EMPTY, f"dataset {path} holds no record ({why})",
                         operator=errors.BATCHING_OPERATOR)


def _bad(error: UmlosError, skipped: SkippedLines | None) -> None:
    """Count a bad line in ``skipped``, or raise it saying how to skip such lines."""
    if skipped is None:
        raise UmlosError(error.code, f"{error.message} (--skip-bad-lines skips such lines and counts them)",
                         operator=errors.BATCHING_OPERATOR) from None
    skipped.add(error)


def _record(path: str, number: int, raw: bytes) -> dict:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid_record(path, number, f"is not UTF-8 (byte {exc.start} of the line)") from None
    record = reader.loads_json(text, _line_error, f"{path} line {number + 1}", not_json="is not JSON")
    return checks.instance(record, "line", dict, fail=partial(invalid_record, path, number),
                           message="holds a JSON {type}; every line holds one object")


def _sample_id(path: str, number: int, record: dict, id_field: str) -> str:
    if id_field not in record:
        return str(number)
    value = record[id_field]
    if checks.is_integer(value, strict=True):
        return str(value)
    return checks.text(value, id_field, empty=False, fail=partial(invalid_record, path, number),
                       message="has {name!r} = {value!r}; an id is a non-empty string or an integer")


def _field(path: str, number: int, record: dict, name: str, convert: Mapping[str, Callable] | None = None) -> Any:
    try:
        value = record[name]
    except KeyError:
        keys = ", ".join(sorted(map(str, record))[:8]) or "none"
        raise invalid_record(path, number, f"lacks the field {name!r} (its fields: {keys})") from None
    if convert is not None and name in convert:
        try:
            return convert[name](value)
        except RecordProblem as exc:
            raise invalid_record(path, number, f"has {name!r} that {exc}") from None
    return checks.text(value, name, fail=partial(invalid_record, path, number),
                       message="has {name!r} of type {type}; it must be a string")


def _line_error(message: str) -> UmlosError:
    return UmlosError(errors.DATASET_RECORD_INVALID, message, operator=errors.BATCHING_OPERATOR)


def invalid_record(path: str, number: int, problem: str) -> UmlosError:
    return UmlosError(errors.DATASET_RECORD_INVALID, f"{path} line {number + 1} {problem}",
                      operator=errors.BATCHING_OPERATOR)


def unreadable(message: str) -> UmlosError:
    return UmlosError(errors.DATASET_UNREADABLE, message, operator=errors.BATCHING_OPERATOR)
