"""What every reader of training records hands on: chunks of rows, the fields wanted, the lines skipped.

What goes in: nothing; this module only defines the shapes. What comes out:

* :class:`Field`: one column to read, by its name in the data, its kind
  (``"string"``: text, prompt, response; ``"integer"``: a token count;
  ``"json"``: any JSON value, such as a ``messages`` list; ``"boolean"``:
  true or false, such as a KTO ``label``) and its role (what
  the column is used as; the dataset fingerprint names columns by role, so a
  renamed column holding the same values fingerprints the same);
* :class:`RecordChunk`: consecutive rows of one input file (sample ids,
  values per field, the first row's number, bytes read so far), whatever
  the format, so the length builder and the token store writer read every
  format through it;
* :class:`RowIds`: the ids of rows that are their own row numbers, as text,
  without making a string per row until one is asked for;
* :class:`SkippedLines`: the bad lines (and rows) a read skipped (``--skip-bad-lines``), and
  :func:`skip_or_raise`, what every reader does with one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ... import errors
from ...errors import UmlosError

#: The kinds of a field: a string, an integer (0 to 2^32 - 1, a token count), any JSON value, or true or false.
KINDS = ("string", "integer", "json", "boolean")


@dataclass(frozen=True)
class Field:
    """A column to read: ``name`` in the data, ``kind`` (one of :data:`KINDS`), ``role`` (default: the name)."""

    name: str
    kind: str = "string"
    role: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"field kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if not self.role:
            object.__setattr__(self, "role", self.name)


@dataclass
class RecordChunk:
    """Consecutive records: ``values[f][i]`` is field ``fields[f]`` of record ``i``.

    A string or JSON field is a list; an integer field is an int64 NumPy array.
    ``first_line`` counts from 0 within ``shard`` (the file the rows come
    from; None for a single input or a ``datasets.Dataset``): a JSONL line
    number, or a row number for columnar files."""

    sample_ids: Sequence[str]
    values: list[Any]
    first_line: int  # 0-based line (JSONL) or row number of the chunk's first record, within its file
    bytes_read: int  # bytes of the input consumed so far (all files before this one included)
    shard: str | None = None
    raw: list[Any] | None = None  # the values as read, where a converter changed them (records/jsonl.py)


class RowIds(Sequence[str]):
    """``str(row)`` for the rows ``start`` to ``stop - 1``: the ids of rows that have none, in a
    single input. A sequence of strings like a list, without the list."""

    __slots__ = ("start", "stop")

    def __init__(self, start: int, stop: int) -> None:
        self.start, self.stop = start, stop

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [str(row) for row in range(self.start, self.stop)[index]]
        return str(range(self.start, self.stop)[index])

    def __iter__(self) -> Iterator[str]:
        return map(str, range(self.start, self.stop))

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented


@dataclass
class SkippedLines:
    """The bad lines (a JSONL line, a row of a columnar file) a read skipped (``--skip-bad-lines``): how
    many, and the first few with the reason."""

    count: int = 0
    first: list[str] = field(default_factory=list)

    def add(self, error: UmlosError) -> None:
        self.count += 1
        if len(self.first) < 5:
            self.first.append(error.message)


def skip_or_raise(error: UmlosError, skipped: SkippedLines | None) -> None:
    """Count a bad record in ``skipped``, or raise it saying how to skip such records."""
    if skipped is None:
        raise UmlosError(error.code, f"{error.message} (--skip-bad-lines skips such records and counts them)",
                         operator=errors.BATCHING_OPERATOR) from None
    skipped.add(error)
