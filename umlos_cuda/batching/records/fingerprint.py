"""The dataset fingerprint: SHA-256 of the rows read, the same whatever the format.

What goes in: the columns of each chunk of rows, in dataset order: the
sample ids, then each field read (records/chunk.py :class:`Field`), as
Python lists (the JSONL reader) or as Arrow arrays (Parquet, Arrow,
``datasets``). What comes out: :meth:`RowDigest.hexdigest`, and
:meth:`RowDigest.content_hash` (the same without ids or tokenizer: what a
shard's derived ids hang on, records/ids.py).

The canonical value of a column is a pair of byte streams, independent of
how the rows are cut into chunks:

* ``string`` (and sample ids): the UTF-8 bytes of every value, concatenated,
  and beside them each value's byte length as uint64 little-endian;
* ``integer``: each value as int64 little-endian (no second stream);
* ``boolean``: each value as one byte, 0 or 1 (no second stream);
* ``json``: each value's canonical JSON text (keys sorted, no spaces,
  non-ASCII kept as UTF-8), then as a string.

Each stream goes through its own SHA-256 as the rows arrive. The
fingerprint is SHA-256 of ``umlos-cuda dataset fingerprint v2\\0``, the
tokenizer hash (its byte length as uint64 LE, then its UTF-8 bytes), the
number of rows (uint64 LE), and for each column in order (``sample_id``
first) its role and kind (each length-prefixed the same way) and the 32-byte
digests of its two streams (the second of an integer column is that of no
bytes). From Arrow the streams are the arrays' own value and offset
buffers (one NumPy difference per chunk, no Python loop over rows); from
Python lists, one join and one encode per chunk; row-number ids (a single
columnar input without an id column) are made as text by Arrow's cast.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from .chunk import Field, RowIds

DOMAIN = b"umlos-cuda dataset fingerprint v2\0"
CONTENT_DOMAIN = b"umlos-cuda shard content v1\0"
ID_FIELD = Field("sample_id", "string")


def _prefixed(text: str) -> bytes:
    encoded = text.encode("utf-8")
    return len(encoded).to_bytes(8, "little") + encoded


class ColumnDigest:
    """The two streams of one column (see the module docstring)."""

    __slots__ = ("field", "values", "sizes")

    def __init__(self, field: Field) -> None:
        self.field = field
        self.values = hashlib.sha256()
        self.sizes = hashlib.sha256()

    def add(self, column: Any) -> None:
        """Feed one chunk of the column: a list or NumPy array, or an Arrow array."""
        if isinstance(column, RowIds):  # row numbers as text, made by Arrow's cast rather than one str a row
            import pyarrow as pa

            column = pa.array(np.arange(column.start, column.stop, dtype=np.int64)).cast(pa.large_string())
        if hasattr(column, "buffers") and hasattr(column, "type"):
            self._add_arrow(column)
        elif self.field.kind == "integer":
            self.values.update(np.ascontiguousarray(column, dtype="<i8").data)
        elif self.field.kind == "boolean":
            self.values.update(np.asarray(column, dtype=np.uint8).data)
        elif self.field.kind == "json":
            self._add_strings([canonical_json(value) for value in column])
        else:
            self._add_strings(column)

    def _add_strings(self, values: Sequence[str]) -> None:
        joined = "".join(values)
        data = joined.encode("utf-8", "surrogatepass")
        if len(data) == len(joined):  # ASCII: a string's byte length is its length
            sizes = np.fromiter(map(len, values), dtype="<u8", count=len(values))
        else:
            sizes = np.fromiter((len(v.encode("utf-8", "surrogatepass")) for v in values), dtype="<u8",
                                count=len(values))
        self.values.update(data)
        self.sizes.update(sizes.data)

    def _add_arrow(self, array: Any) -> None:
        import pyarrow as pa

        kind = array.type
        if self.field.kind == "integer":
            self.values.update(np.ascontiguousarray(array.to_numpy(zero_copy_only=False), dtype="<i8").data)
            return
        if self.field.kind == "boolean":
            self.values.update(np.asarray(array.to_numpy(zero_copy_only=False), dtype=np.uint8).data)
            return
        if self.field.kind == "json":
            self._add_strings([canonical_json(value) for value in array.to_pylist()])
            return
        if not (pa.types.is_large_string(kind) or pa.types.is_string(kind)):
            array = array.cast(pa.large_string())
            kind = array.type
        width = "<i8" if pa.types.is_large_string(kind) else "<i4"
        buffers = array.buffers()
        offsets = np.frombuffer(buffers[1], dtype=width)[array.offset:array.offset + len(array) + 1]
        if len(array):
            data = buffers[2]
            start, stop = int(offsets[0]), int(offsets[-1])
            self.values.update(memoryview(data)[start:stop] if data is not None else b"")
        self.sizes.update(np.diff(offsets).astype("<u8").data)

    def digest(self) -> bytes:
        return (_prefixed(self.field.role) + _prefixed(self.field.kind) + self.values.digest()
                + self.sizes.digest())


class RowDigest:
    """The running fingerprint of the rows read: ids and the fields' columns."""

    def __init__(self, fields: Sequence[Field], *, ids: bool = True) -> None:
        self.columns = [ColumnDigest(ID_FIELD)] if ids else []
        self.columns += [ColumnDigest(field) for field in fields]
        self.ids = ids
        self.rows = 0

    def add(self, sample_ids: Any, columns: Sequence[Any], count: int) -> None:
        """Feed one chunk: its ids (ignored without ``ids``), its columns in field order, its row count."""
        given = ([sample_ids] if self.ids else []) + list(columns)
        for digest, column in zip(self.columns, given):
            digest.add(column)
        self.rows += count

    def _body(self) -> bytes:
        return self.rows.to_bytes(8, "little") + b"".join(column.digest() for column in self.columns)

    def hexdigest(self, tokenizer_hash: str) -> str:
        """The dataset fingerprint of the rows fed so far, for ``tokenizer_hash``."""
        return hashlib.sha256(DOMAIN + _prefixed(tokenizer_hash) + self._body()).hexdigest()

    def content_hash(self) -> str:
        """What the rows hold, without the tokenizer (a shard's content hash)."""
        return hashlib.sha256(CONTENT_DOMAIN + self._body()).hexdigest()


def canonical_json(value: Any) -> str:
    """The canonical JSON text of a value: keys sorted, no spaces, non-ASCII as UTF-8."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=True)
