"""Open training records in any supported format as one stream of chunks.

What goes in: a dataset (a path, a glob, a list, a ``save_to_disk`` folder
or a ``datasets.Dataset``; records/shards.py), the fields wanted
(records/chunk.py :class:`Field`), the id field, an optional format and an
optional :class:`SkippedLines`. What comes out: :class:`Records`, whose
:meth:`Records.chunks` yields :class:`RecordChunk` s in dataset order
(shard after shard, a chunk never spanning two files), feeding the dataset
fingerprint (records/fingerprint.py) as it goes; then
:meth:`Records.fingerprint`.

Every file is opened by files/reader.py (regular files only) and read in a
stream: JSONL line by line (records/jsonl.py), gzip and zstd JSONL through
a bounded decompressor (records/compressed.py), Parquet and Arrow IPC batch
by batch with the wanted columns only (records/arrow.py). Rows without an
id get one by records/ids.py's rules.

Fields can be *checked later*, by the consumer of the chunks (the messages of
chat records and the conversations of preference records, rendered by the
workers that encode them: umlos_cuda/batching/lengths/builder.py). Their
values are handed on as read, and the consumer gives every chunk back to
:meth:`Records.accept` in dataset order with the rows it refuses: those are
raised or skipped (``--skip-bad-lines``) in line order, among the lines the
reader itself refused, and the dataset fingerprint takes the rows kept, so
the fingerprint, the skipped lines and the first error are those of a read
that refused the rows itself. A shard whose rows' ids hang on its content
(records/ids.py) gets its rows checked by :attr:`Records.screen` for that.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ... import errors
from ...errors import UmlosError
from ...files import reader
from . import arrow, hf
from .chunk import Field, ReadRows, RecordChunk, RowFailure, RowIds, SkippedLines, id_required, skip_or_raise
from .columns import CheckedBatch
from .compressed import bomb, expansion_cap, open_decompressed
from .fingerprint import RowDigest
from .ids import shard_row_id
from .jsonl import DEFAULT_ID_FIELD, invalid_record, stream_chunks, unreadable
from .shards import Input, resolve

DEFAULT_CHUNK = 4096


class Records:
    """A dataset opened for reading (see the module docstring).

    ``paths``: every file read (what an output must not be); ``name``: the
    dataset as messages show it; ``total_bytes``: the bytes of its files (for
    progress); ``sharded``: more than one input, whose rows without ids get
    derived ids; ``sharded=True`` gives them to one input too: a file read alone as one shard of a
    multi-file dataset (tokens/partition.py), so that its rows get the ids they have in the whole."""

    def __init__(self, dataset: Any, fields: Sequence[str | Field], *, id_field: str = DEFAULT_ID_FIELD,
                 format: str | None = None, skipped: SkippedLines | None = None,
                 sharded: bool | None = None) -> None:
        self.fields = tuple(f if isinstance(f, Field) else Field(f) for f in fields)
        self.id_field = id_field
        self.skipped = skipped
        self.inputs = resolve(dataset, format)
        self.sharded = len(self.inputs) > 1 if sharded is None else bool(sharded)
        self.paths = tuple(path for item in self.inputs for path in (item.path, *item.files) if item.format != "object")
        self.name = self.inputs[0].path if len(self.inputs) == 1 else \
            f"{self.inputs[0].path} and {len(self.inputs) - 1} more shard{'s' if len(self.inputs) > 2 else ''}"
        self.total_bytes = sum(_size(item) for item in self.inputs)
        self._content: dict[int, str] = {}
        self._digest: RowDigest | None = None
        self._accepting: RowDigest | None = None  # the fingerprint being fed by accept()
        self._accepted = 0
        #: The fields the consumer checks (see the module docstring), and how the rows of a chunk of them are
        #: checked where this reader needs to know which are kept (``screen(chunks)`` yields each chunk and
        #: its refused rows, in order: the content hash of a shard whose ids hang on it).
        self.checked_later: tuple[str, ...] = ()
        self.screen: Callable[[Iterator[RecordChunk]], Iterator[tuple[RecordChunk, Sequence[RowFailure]]]] | None \
            = None

    def chunks(self, chunk_size: int = DEFAULT_CHUNK, *, fields: Sequence[Field] | None = None,
               digest: bool = True) -> Iterator[RecordChunk]:
        """The records in chunks of at most ``chunk_size``, in dataset order; with ``digest``, the
        dataset fingerprint is computed on the way (:meth:`fingerprint` after the last chunk).
        ``fields`` reads other fields than those opened (``()``: ids only)."""
        fields = self.fields if fields is None else tuple(fields)
        row_digest = RowDigest(fields) if digest else None
        later = self._checks_later(fields)
        if digest:
            self._digest = None
            self._accepting, self._accepted = (row_digest, 0) if later else (None, 0)
        before, rows = 0, 0
        for index, item in enumerate(self.inputs):
            for chunk, ids, columns in self._read(index, item, fields, chunk_size, before, self.skipped):
                if row_digest is not None and not later:
                    row_digest.add(ids, columns, len(chunk.sample_ids))
                rows += len(chunk.sample_ids)
                yield chunk
            before += _size(item)
        if rows == 0:
            raise UmlosError(errors.DATASET_EMPTY, f"dataset {self.name} holds no record",
                             operator=errors.BATCHING_OPERATOR)
        if not later:
            self._digest = row_digest

    def accept(self, chunk: RecordChunk, refused: Sequence[RowFailure] = ()) -> RecordChunk:
        """A chunk of :meth:`chunks` back from the consumer of a field checked later, in dataset order,
        with the rows it refused: each raised (the failure's code, naming its line or row) or, with
        ``skipped``, skipped and counted, in row order; the rows kept feed the dataset fingerprint and come
        back as a chunk."""
        if chunk.read is None or self._accepting is None:
            raise RuntimeError("accept() takes the chunks of chunks() over a field checked later")
        kept = self._kept(chunk, refused, self.skipped)
        assert kept.read is not None
        self._accepting.add(kept.read.ids, kept.read.columns, len(kept.sample_ids))
        self._accepted += len(kept.sample_ids)
        return kept

    def _kept(self, chunk: RecordChunk, refused: Sequence[RowFailure], skipped: SkippedLines | None
              ) -> RecordChunk:
        """Each refused row raised or skipped into ``skipped``, in row order; the chunk of the rows kept."""
        read = chunk.read
        if not refused or read is None:
            return chunk
        for failure in sorted(refused):
            error = UmlosError(failure.code, f"{read.place(failure.offset)} {failure.problem}",
                               operator=errors.BATCHING_OPERATOR)
            skip_or_raise(error, skipped, read.at(failure.offset))
        return _without(chunk, {failure.offset for failure in refused})

    def accepted_all(self) -> None:
        """After the last chunk was accepted: DATASET_EMPTY when every row was refused; the fingerprint is then
        that of the rows kept."""
        if self._accepted == 0:
            single = len(self.inputs) == 1 and not self.inputs[0].columnar and not self.sharded
            raise UmlosError(errors.DATASET_EMPTY, f"dataset {self.name} holds no record"
                             + (" (every line is blank or was skipped)" if single else ""),
                             operator=errors.BATCHING_OPERATOR)
        self._digest, self._accepting = self._accepting, None

    def _checks_later(self, fields: Sequence[Field]) -> bool:
        return any(field.name in self.checked_later for field in fields)

    def fingerprint(self, tokenizer_hash: str) -> str:
        """The dataset fingerprint of the rows the last full :meth:`chunks` read."""
        if self._digest is None:
            raise RuntimeError("fingerprint() comes after a full read of chunks()")
        return self._digest.hexdigest(tokenizer_hash)

    def place(self, chunk: RecordChunk, offset: int) -> str:
        """Where record ``offset`` of ``chunk`` is, as a message names it (``PATH line N``, ``PATH row N``)."""
        item = next((i for i in self.inputs if i.path == chunk.shard), self.inputs[0]) if chunk.shard else \
            self.inputs[0]
        number = chunk.first_line + offset
        return f"{item.path} row {number}" if item.columnar else f"{item.path} line {number + 1}"

    def refuse_repeated_ids(self, hashes: np.ndarray) -> None:
        """Raise DATASET_RECORD_INVALID when two records share an id. ``hashes`` (Python's ``hash`` of each
        id, in order) only nominate candidates (64 bits may collide); a second read of the ids decides."""
        ordered = np.sort(hashes)
        candidates = set(ordered[1:][ordered[1:] == ordered[:-1]].tolist())
        if not candidates:
            return
        first: dict[str, tuple[RecordChunk, int]] = {}
        for chunk in self.chunks(fields=(), digest=False):
            for offset, sample_id in enumerate(chunk.sample_ids):
                if hash(sample_id) not in candidates:
                    continue
                if sample_id in first:
                    earlier, at = first[sample_id]
                    if len(self.inputs) == 1 and not self.inputs[0].columnar:  # the wording of one JSONL file
                        raise invalid_record(self.inputs[0].path, chunk.first_line + offset,
                                             f"repeats the id {sample_id!r} of line {earlier.first_line + at + 1}; "
                                             "ids must be unique (records without an id get their 0-based line "
                                             "number)")
                    raise UmlosError(errors.DATASET_RECORD_INVALID,
                                     f"{self.place(chunk, offset)} repeats the id {sample_id!r} of "
                                     f"{self.place(earlier, at)}; ids must be unique (two shards with the same "
                                     "content get the same derived ids: docs/batching.md, 'Sample ids')",
                                     operator=errors.BATCHING_OPERATOR)
                first[sample_id] = (chunk, offset)

    # ------------------------------------------------------------------ one input
    def _row_id(self, index: int, item: Input) -> Callable[[int], str]:
        """How a row of input ``index`` without an id is named (records/ids.py)."""
        if not self.sharded:
            return str

        def derived(row: int) -> str:
            if index not in self._content:
                self._content[index] = self._content_hash(index, item)
            return shard_row_id(self._content[index], row)

        return derived

    def _content_hash(self, index: int, item: Input) -> str:
        """The content hash of input ``index``: the rows a read that skips bad lines keeps (records/ids.py)."""
        digest = RowDigest(self.fields, ids=False)
        read = self._read(index, item, self.fields, DEFAULT_CHUNK, 0, SkippedLines(), row_id=str)
        if not self._checks_later(self.fields):
            for chunk, _ids, columns in read:
                digest.add(None, columns, len(chunk.sample_ids))
            return digest.content_hash()
        if self.screen is None:
            raise RuntimeError(f"rows of {', '.join(self.checked_later)} are checked later, and no screen checks them")
        for chunk, refused in self.screen(chunk for chunk, _ids, _columns in read):
            kept = self._kept(chunk, refused, SkippedLines())
            assert kept.read is not None
            digest.add(None, kept.read.columns, len(kept.sample_ids))
        return digest.content_hash()

    def _read(self, index: int, item: Input, fields: Sequence[Field], chunk_size: int, before: int,
              skipped: SkippedLines | None, row_id: Callable[[int], str] | None = None
              ) -> Iterator[tuple[RecordChunk, Any, list[Any]]]:
        """``(chunk, ids for the digest, columns for the digest)`` of one input."""
        row_id = row_id or self._row_id(index, item)
        shard = item.path if self.sharded else None
        if item.columnar:
            yield from self._read_columnar(index, item, fields, chunk_size, before, row_id, shard, skipped)
            return
        try:
            with reader.open_regular(item.path, unreadable) as handle:
                size = reader.file_size(handle)
                stream: Any = handle
                if item.format != "jsonl":
                    stream = open_decompressed(handle, item.path, "gzip" if item.format == "jsonl.gz" else "zstd",
                                               size)
                later = frozenset(self.checked_later) & {field.name for field in fields}
                for chunk in stream_chunks(stream, item.path, tuple(fields), id_field=self.id_field,
                                           chunk_size=chunk_size, skipped=skipped, row_id=row_id,
                                           consumed=lambda: min(handle.tell(), size), shard=shard,
                                           bytes_before=before, empty_ok=self.sharded, unchecked=later,
                                           input_index=index):
                    yield chunk, chunk.sample_ids, chunk.values
        except FileNotFoundError:
            raise unreadable(f"dataset {item.path} does not exist") from None

    def _read_columnar(self, index: int, item: Input, fields: Sequence[Field], chunk_size: int, before: int,
                       row_id: Callable[[int], str], shard: str | None, skipped: SkippedLines | None
                       ) -> Iterator[tuple[RecordChunk, Any, list[Any]]]:
        wanted = [field.name for field in fields]
        if item.format == "object":
            with_id = self.id_field in item.dataset.column_names
            columns = wanted + ([self.id_field] if (with_id or id_required(self.id_field))
                                and self.id_field not in wanted else [])
            total = max(int(item.dataset.num_rows), 1)
            batches = hf.object_batches(item.dataset, columns, chunk_size, self.id_field)
            yield from self._columnar_chunks(index, ((item.path, b, None, None) for b in batches), fields, [with_id],
                                             before,
                                             lambda rows: before + _size(item) * rows // total, row_id, shard,
                                             skipped)
            return
        done = [before]
        has_id = [False]  # known once a file's schema is read, before its first batch

        def file_batches():
            for path in item.files:
                try:
                    with reader.open_regular(path, unreadable) as handle:
                        size = reader.file_size(handle)
                        names, batches = (arrow.open_parquet if item.format == "parquet" else arrow.open_ipc)(
                            handle, path)
                        has_id[0] = self.id_field in names
                        if not has_id[0] and id_required(self.id_field):
                            raise arrow.missing_column(path, names, self.id_field, id_field=self.id_field)
                        columns = wanted + ([self.id_field] if has_id[0] and self.id_field not in wanted else [])
                        decoded = _Decoded(path, size)
                        for batch in batches(columns, chunk_size):
                            # a folder's rows are numbered across its files: messages name the folder and that row
                            where = item.path if item.format == "hf" else path
                            yield where, batch, lambda handle=handle, size=size: done[0] + min(handle.tell(), size), \
                                decoded
                        done[0] += size
                except FileNotFoundError:
                    raise unreadable(f"dataset {path} does not exist") from None

        yield from self._columnar_chunks(index, file_batches(), fields, has_id, before, None, row_id, shard, skipped)

    def _columnar_chunks(self, index: int, batches, fields: Sequence[Field], has_id: list[bool], before: int,
                         progress: Callable[[int], int] | None, row_id: Callable[[int], str], shard: str | None,
                         skipped: SkippedLines | None) -> Iterator[tuple[RecordChunk, Any, list[Any]]]:
        """The chunks of checked batches: a bad row (records/columns.py) is skipped and counted, or raised;
        the rows around it make chunks of their own, so that each chunk's rows are consecutive and keep
        their numbers."""
        row = 0
        later = self._checks_later(fields)
        for path, batch, consumed, decoded in batches:
            count = batch.num_rows
            if count == 0:
                continue
            checked = CheckedBatch(batch, path, row, fields, self.id_field if has_id[0] else None)
            if decoded is not None:
                decoded.add(checked.size)
            read = consumed() if consumed is not None else progress(row + count) if progress else before
            for start, stop, problem in _runs(count, checked.problems()):
                if problem is not None:
                    skip_or_raise(problem, skipped, (index, row + start))
                    continue
                found, id_array, values, arrays = checked.take(start, stop)
                ids: Sequence[str]
                if found is not None:
                    ids = found
                elif row_id is str:
                    ids = id_array = RowIds(row + start, row + stop)
                else:
                    ids = id_array = [row_id(r) for r in range(row + start, row + stop)]
                rows = ReadRows(path, index, True, range(row + start, row + stop), id_array, arrays) if later \
                    else None
                yield RecordChunk(ids, values, row + start, read, shard, rows), id_array, arrays
            row += count


class _Decoded:
    """The bytes the columns read of one file decode to, held to the expansion cap of compressed JSONL
    (records/compressed.py): a few bytes that decode to gigabytes are a bomb, not a dataset."""

    def __init__(self, path: str, size: int) -> None:
        self.path, self.cap, self.total = path, expansion_cap(size), 0

    def add(self, count: int) -> None:
        self.total += count
        if self.total > self.cap:
            raise bomb(self.path, self.cap)


def _runs(count: int, problems: Mapping[int, UmlosError]) -> Iterator[tuple[int, int, UmlosError | None]]:
    """``(start, stop, None)`` for each run of good rows of ``range(count)`` and ``(row, row + 1, problem)``
    for each bad one, in row order."""
    start = 0
    for row in sorted(problems):
        if row > start:
            yield start, row, None
        yield row, row + 1, problems[row]
        start = row + 1
    if start < count:
        yield start, count, None


def _without(chunk: RecordChunk, refused: set[int]) -> RecordChunk:
    """A chunk without the rows at ``refused``: its ids (row numbers as text, where they were
    :class:`RowIds`: the rows kept keep their numbers), values, places and what the fingerprint takes."""
    read = chunk.read
    assert read is not None
    keep = [offset for offset in range(len(chunk.sample_ids)) if offset not in refused]
    ids = [chunk.sample_ids[offset] for offset in keep]
    values = [_taken(column, keep) for column in chunk.values]
    lines = [read.lines[offset] for offset in keep]
    digest_ids = ids if read.ids is chunk.sample_ids or isinstance(read.ids, RowIds) else _taken(read.ids, keep)
    columns = values if read.columns is chunk.values else [_taken(column, keep) for column in read.columns]
    return RecordChunk(ids, values, lines[0] if lines else chunk.first_line, chunk.bytes_read, chunk.shard,
                       ReadRows(read.path, read.input, read.columnar, lines, digest_ids, columns))


def _taken(values: Any, keep: list[int]) -> Any:
    """The rows ``keep`` of a column: a list, a NumPy array or an Arrow array."""
    if isinstance(values, np.ndarray):
        return values[keep]
    if hasattr(values, "take"):  # an Arrow array
        return values.take(keep)
    return [values[offset] for offset in keep]


def _size(item: Input) -> int:
    if item.format == "object":
        return hf.object_bytes(item.dataset)
    total = 0
    for path in item.files:
        with contextlib.suppress(OSError):  # the reader says what is wrong with it
            total += os.path.getsize(path)
    return total


def open_records(dataset: Any, fields: Sequence[str | Field], **options: Any) -> Records:
    """:class:`Records` (a function, for symmetry with the other readers)."""
    return Records(dataset, fields, **options)


def dataset_paths(dataset: Any, format: str | None = None) -> tuple[str, ...]:
    """Every path a dataset argument names (its shards, a folder and its files): what an output must not be."""
    return tuple(path for item in resolve(dataset, format) if item.format != "object"
                 for path in (item.path, *item.files))
