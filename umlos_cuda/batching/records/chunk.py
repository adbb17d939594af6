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
  :func:`skip_or_raise`, what every reader does with one;
* :class:`ReadRows` and :class:`RowFailure`: where a chunk's rows were read, and a row its
  consumer refused after the read (a chat or preference record the workers could not render:
  records/source.py ``Records.accept``).
* :func:`id_required` and :func:`missing_field_hint`: when a record must hold its id field, and what
  every reader says when a record or a file lacks a field.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ... import errors
from ...errors import UmlosError

#: The kinds of a field: a string, an integer (0 to 2^32 - 1, a token count), any JSON value, or true or false.
KINDS = ("string", "integer", "json", "boolean")
#: The id field read unless another is named; a record without it is named by its row (records/ids.py).
DEFAULT_ID_FIELD = "id"


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
    read: ReadRows | None = None  # where the rows were read, for a consumer that checks them later


@dataclass(frozen=True)
class ReadRows:
    """Where a chunk's rows were read, for rows refused after the read (records/source.py ``Records.accept``).

    ``path``: the file or folder a message names; ``input``: its index among the dataset's inputs;
    ``columnar``: rows of a Parquet, Arrow or ``datasets`` input (named by row, not by line); ``lines``:
    each row's 0-based JSONL line or row number; ``ids`` and ``columns``: what the dataset fingerprint
    takes of the rows (records/fingerprint.py)."""

    path: str
    input: int
    columnar: bool
    lines: Sequence[int]
    ids: Any
    columns: list[Any]

    def place(self, offset: int) -> str:
        """``PATH line N`` (1-based, as editors count) or ``PATH row N`` (0-based): row ``offset`` in messages."""
        number = self.lines[offset]
        return f"{self.path} row {number}" if self.columnar else f"{self.path} line {number + 1}"

    def at(self, offset: int) -> tuple[int, int]:
        """Row ``offset``'s place in dataset order: (input, line)."""
        return self.input, self.lines[offset]


class RowFailure(NamedTuple):
    """Row ``offset`` of a chunk, refused after the read with ``code``: ``problem`` says what is wrong with
    it, as it follows the row's place in a message (``has 'messages' that ...``, ``does not render ...``)."""

    offset: int
    code: str
    problem: str


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
    _places: list[tuple[float, ...]] = field(default_factory=list, repr=False, compare=False)

    def add(self, error: UmlosError, at: tuple[int, int] | None = None) -> None:
        """Count a skipped line; keep its message if it is among the first five in dataset order (``at``:
        its input and line; lines read ahead of an earlier one refused later still list after it)."""
        self.count += 1
        self._places += [(float("inf"),)] * (len(self.first) - len(self._places))  # messages added as they are
        place = (float("inf"),) if at is None else at
        index = bisect.bisect_right(self._places, place)
        if index < MAX_FIRST:
            self._places.insert(index, place)
            self.first.insert(index, error.message)
            del self._places[MAX_FIRST:], self.first[MAX_FIRST:]


#: The skipped lines whose messages are kept.
MAX_FIRST = 5


def skip_or_raise(error: UmlosError, skipped: SkippedLines | None, at: tuple[int, int] | None = None) -> None:
    """Count a bad record in ``skipped`` (``at``: its input and line or row, for the order of the first
    five), or raise it saying how to skip such records."""
    if skipped is None:
        raise UmlosError(error.code, f"{error.message} (--skip-bad-lines skips such records and counts them)",
                         operator=errors.BATCHING_OPERATOR) from None
    skipped.add(error, at)


def id_required(id_field: str) -> bool:
    """Whether every record must hold ``id_field``: an id field other than the default was named
    (``--id-field``), and a name given and not found is a mistake, not rows to number (their ids, and
    what depends on them such as a split, would then follow the row order without a word)."""
    return id_field != DEFAULT_ID_FIELD


def missing_field_hint(name: str, id_field: str | None = None, conversations: Sequence[str] = ()) -> str:
    """What to do when a record or a file lacks the field ``name``: the options that name each field
    (those of ``data tokenize``; ``--length-field`` is ``data lengths build``'s), and
    ``--messages-field`` with the field when one of ``conversations`` (fields holding lists of
    messages) is there."""
    if id_field is not None and name == id_field:
        return (f"--id-field names the field holding each record's id, here {name!r}: name the field that holds "
                "the ids, or leave --id-field out to number the records")
    hint = ("name the field to read with --text-field, --prompt-field/--response-field, "
            "--chosen-field/--rejected-field, --completion-field/--label-field or --messages-field (and for data "
            "lengths build, a token count with --length-field)")
    if conversations:
        hint += f"; {conversations[0]!r} holds conversations: --messages-field {conversations[0]}"
    return hint
