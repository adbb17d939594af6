"""Check the rows of one batch of a Parquet, Arrow or ``datasets`` input, then take their values.

What goes in: one Arrow record batch holding the columns read (records/arrow.py, records/hf.py), the path
messages name, the number of its first row (0-based, counted across the input), the fields wanted
(records/chunk.py :class:`Field`) and the id column (None when the input has none). What comes out:
:class:`CheckedBatch`: :meth:`~CheckedBatch.problems`, the rows that are not records, and
:meth:`~CheckedBatch.take`, the ids, values and Arrow arrays (for the fingerprint) of consecutive rows
that are; ``size``, the bytes the batch decodes to (what records/source.py counts against the expansion
cap of records/compressed.py).

The rules are JSONL's (records/jsonl.py), a row for a line:

* **Whole columns**, refused at once (DATASET_RECORD_INVALID, never skipped): a column missing or named
  twice (which of the two to read would be a guess), or of a type its field cannot take. A string field
  takes string, large string and string view columns and dictionary-encoded strings (what pandas writes
  for ``category``), decoded here; an id a string or an integer column; a token count an integer column;
  a ``messages``-like field a list of structs; a label (true or false) a boolean column.
* **Rows**, DATASET_RECORD_INVALID naming the file, the row and the column, what ``--skip-bad-lines``
  skips and counts: a null; a string that is not UTF-8 (Arrow's full validation, one vectorised pass,
  before any value becomes a Python string; a lone surrogate, half of a character cut in two, is not
  UTF-8 either); a record larger than :data:`MAX_RECORD_BYTES`, the JSONL line cap, measured on Arrow's
  buffers before any value is copied out (the batch's total first, row by row only when the total is
  over the cap; a dictionary column by its values' lengths, taken by index, before anything is
  decoded); an empty id; a token count outside 0 to 2^32 - 1; a list of messages holding a null.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ... import errors
from ...errors import UINT32_MAX, UmlosError
from ...files.reader import MAX_LINE_BYTES
from .arrow import check_columns, pyarrow
from .chunk import Field

#: The most bytes the columns read of one row may hold: a JSONL line's cap, so that a record is bounded
#: the same in every format.
MAX_RECORD_BYTES = MAX_LINE_BYTES


class CheckedBatch:
    """One batch's columns found and typed (see the module docstring); whole-column problems raise here."""

    def __init__(self, batch: Any, path: str, first_row: int, fields: Sequence[Field], id_field: str | None) -> None:
        self.path, self.first_row, self.fields, self.id_field = path, first_row, tuple(fields), id_field
        self.rows = batch.num_rows
        check_columns(path, batch.schema.names, [f.name for f in self.fields] + ([id_field] if id_field else []),
                      batch.schema)
        self.ids = None if id_field is None else self._typed(batch, id_field, "id")
        self.columns = [self._typed(batch, field.name, field.kind) for field in self.fields]
        self.size = sum(_size_bound(array) for array in self._named_arrays())

    def problems(self) -> dict[int, UmlosError]:
        """The rows (0-based within the batch) that are not records, each with its first problem, in order."""
        pa = pyarrow()
        found: dict[int, str] = {}

        def mark(rows: Any, problem: str) -> None:
            for row in np.asarray(rows).tolist():
                found.setdefault(int(row), problem)

        for name, array, kind in self._named():
            if array.null_count:
                mark(np.flatnonzero(np.asarray(array.is_null())), f"has {name!r} null; every row holds a value")
            if kind not in ("integer", "boolean"):
                mark(_not_utf8(array), f"has {name!r} that is not UTF-8 text (a character cut in two, or bytes of "
                                       "another encoding)")
            if kind == "json" and len(array):
                items = array.flatten()
                if items.null_count:
                    parents = np.asarray(pa.compute.list_parent_indices(array))
                    mark(parents[np.asarray(items.is_null())], f"has {name!r} holding a null; {name!r} must be a "
                                                               "list of objects")
            elif kind == "id" and not pa.types.is_integer(array.type) and _shortest(array) == 0:
                mark(np.flatnonzero(_row_bytes(array) == 0), f"has {name!r} = ''; an id is a non-empty string or "
                                                             "an integer")
            elif kind == "integer":
                numbers = array.fill_null(0).to_numpy(zero_copy_only=False)
                bad = np.flatnonzero((numbers < 0) | (numbers > UINT32_MAX))
                for row in bad.tolist():
                    found.setdefault(row, f"has {name!r} = {int(numbers[row])}; a token count is an integer from 0 "
                                          "to 4294967295")
        if self.size > MAX_RECORD_BYTES:  # a row can only be over the cap if the whole batch is
            sizes = np.sum([_row_bytes(array) for array in self._named_arrays()], axis=0)
            for row in np.flatnonzero(sizes > MAX_RECORD_BYTES).tolist():
                found.setdefault(row, f"is {int(sizes[row]):,} bytes, over the {MAX_RECORD_BYTES:,} a record may "
                                      "hold (the longest JSONL line read; is it one record per row?)")
        return {row: invalid_row(self.path, self.first_row + row, found[row]) for row in sorted(found)}

    def take(self, start: int, stop: int) -> tuple[list[str] | None, Any, list[Any], list[Any]]:
        """``(sample ids or None, the id array or None, values per field, Arrow array per field)`` of the rows
        ``start`` to ``stop - 1``, which :meth:`problems` passed."""
        pa = pyarrow()
        whole = start == 0 and stop == self.rows

        def part(array: Any) -> Any:
            array = array if whole else array.slice(start, stop - start)
            return array.dictionary_decode() if pa.types.is_dictionary(array.type) else array

        ids = id_array = None
        if self.ids is not None:
            id_array = part(self.ids)
            if pa.types.is_integer(id_array.type):
                id_array = id_array.cast(pa.large_string())
            ids = id_array.to_pylist()
        arrays = [part(array) for array in self.columns]
        values = [array.to_numpy(zero_copy_only=False).astype(np.int64, copy=False) if field.kind == "integer"
                  else array.to_pylist() for field, array in zip(self.fields, arrays)]
        return ids, id_array, values, arrays

    # ------------------------------------------------------------------ the columns
    def _named(self) -> list[tuple[str, Any, str]]:
        """``(name, array, kind)`` of the id column (kind ``"id"``) and the fields' columns."""
        named = [(self.id_field, self.ids, "id")] if self.ids is not None and self.id_field is not None else []
        return named + [(field.name, array, field.kind) for field, array in zip(self.fields, self.columns)]

    def _named_arrays(self) -> list[Any]:
        return [array for _, array, _ in self._named()]

    def _typed(self, batch: Any, name: str, kind: str) -> Any:
        """The column ``name`` as one contiguous array of a type ``kind`` takes (string views as large strings)."""
        pa = pyarrow()
        array = batch.column(batch.schema.get_field_index(name))
        array = array.combine_chunks() if hasattr(array, "combine_chunks") else array  # a table's column
        found = array.type
        text = _is_text(found.value_type if pa.types.is_dictionary(found) else found)
        if kind == "id":
            ok, wanted = text or pa.types.is_integer(found), "an id is a string or an integer"
        elif kind == "string":
            ok, wanted = text, "it must be a string column"
        elif kind == "integer":
            ok, wanted = pa.types.is_integer(found), "a token count is an integer column"
        elif kind == "boolean":
            ok, wanted = pa.types.is_boolean(found), f"{name!r} must be a boolean column (true or false)"
        else:
            ok = _is_list(found) and pa.types.is_struct(found.value_type)
            wanted = f"{name!r} must be a list of objects (a list of structs)"
        if not ok:
            raise invalid_row(self.path, self.first_row, f"column {name!r} is {found}; {wanted}")
        if pa.types.is_string_view(found):
            return array.cast(pa.large_string())
        if pa.types.is_dictionary(found) and pa.types.is_string_view(found.value_type):
            return array.dictionary_decode().cast(pa.large_string())
        return array


def _is_text(kind: Any) -> bool:
    pa = pyarrow()
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind))


def _is_list(kind: Any) -> bool:
    pa = pyarrow()
    return bool(pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind))


def _not_utf8(array: Any) -> list[int]:
    """The rows of ``array`` holding a string that is not UTF-8: one full validation of the array, and
    row by row only when it fails (a dictionary column: the rows whose value fails)."""
    pa = pyarrow()
    if _valid(array):
        return []
    if pa.types.is_dictionary(array.type):
        bad = np.asarray(_not_utf8(array.dictionary), dtype=np.int64)
        return np.flatnonzero(np.isin(array.indices.fill_null(0).to_numpy(zero_copy_only=False), bad)).tolist()
    return [row for row in range(len(array)) if not _valid(array.slice(row, 1))]


def _valid(array: Any) -> bool:
    pa = pyarrow()
    try:
        array.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def _shortest(array: Any) -> int:
    """The byte length of the shortest string of ``array`` (of its dictionary's values; nulls not counted)."""
    pa = pyarrow()
    values = array.dictionary if pa.types.is_dictionary(array.type) else array
    if pa.types.is_string_view(values.type):
        values = values.cast(pa.large_string())
    shortest = pa.compute.min(pa.compute.binary_length(values)).as_py()
    return 1 if shortest is None else int(shortest)


def _size_bound(array: Any) -> int:
    """At least the bytes ``array`` decodes to: its buffers (as sliced), or for a dictionary inside it,
    the lengths of the values its rows name."""
    return int(_row_bytes(array).sum()) if _has_dictionary(array.type) else int(array.nbytes)


def _has_dictionary(kind: Any) -> bool:
    pa = pyarrow()
    return pa.types.is_dictionary(kind) or any(_has_dictionary(kind.field(i).type) for i in range(kind.num_fields))


def _row_bytes(array: Any) -> np.ndarray:
    """The bytes each row of ``array`` holds, from its buffers: strings by their lengths, lists and structs
    by what they hold, fixed-width values by their width; a dictionary's rows by their values' lengths."""
    pa = pyarrow()
    kind = array.type
    if pa.types.is_dictionary(kind):
        return _row_bytes(array.dictionary)[array.indices.fill_null(0).to_numpy(zero_copy_only=False)]
    if _is_text(kind) or pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        if pa.types.is_string_view(kind):
            array = array.cast(pa.large_string())
        return np.asarray(pa.compute.binary_length(array).fill_null(0), dtype=np.int64)
    if _is_list(kind):
        parents = np.asarray(pa.compute.list_parent_indices(array))
        return np.bincount(parents, weights=_row_bytes(array.flatten()), minlength=len(array)).astype(np.int64)
    if pa.types.is_struct(kind):
        return sum((_row_bytes(child) for child in array.flatten()), np.zeros(len(array), dtype=np.int64))
    try:
        width = kind.bit_width
    except ValueError:  # not of a fixed width, and none of the above: counted as nothing
        width = 0
    return np.full(len(array), (width + 7) // 8, dtype=np.int64)


def invalid_row(path: str, row: int, problem: str) -> UmlosError:
    return UmlosError(errors.DATASET_RECORD_INVALID, f"{path} row {row} {problem}", operator=errors.BATCHING_OPERATOR)
