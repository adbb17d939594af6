"""The text of a plan's JSONL files, a chunk at a time: sample_ids.jsonl and microbatches.jsonl.

What goes in: the sample ids (None: the row numbers) and an epoch's arrays.
What comes out: the files' bytes, exactly what ``json.dumps`` (ASCII, its
default ``", "`` and ``": "`` separators) writes for each line:

* sample_ids.jsonl: ``json.dumps(id)`` per line;
* microbatches.jsonl: ``json.dumps(MicrobatchSpec.to_json())`` per line,
  ``{"index": I, "samples": [ids], "bucket_id": B, "max_len": L, "packs": null}``,
  ``"packs"`` listing each packed row's ids in a packed plan.

Why not ``json.dumps`` per line: at 10^6 samples an epoch is 10^6 id
strings in 10^5 lines, and one call per line (with a
:class:`~.plan.MicrobatchSpec` each) took longer than planning the epoch.
Here each id is encoded once (:func:`id_texts`: ``json.dumps(id)`` without
its quotes, which for a plain id, printable ASCII without ``"`` or ``\\``,
is the id itself), and a chunk of lines is made with ``str.join`` from the ids'
texts: a line joins its ids' texts with ``", "`` between them, a packed
line joins each packed row's once and then the rows twice (as its samples
and as its packs). tests/test_batching_plan_lines.py checks the
bytes against ``json.dumps`` line by line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from itertools import pairwise

import numpy as np

from ..lengths.plain_ids import PlainIds, is_plain
from .plan import EpochPlan

#: Sample entries per chunk of microbatches.jsonl (a chunk ends at a microbatch's end).
CHUNK_ENTRIES = 1 << 18
_IDS_PER_CHUNK = 1 << 16


def id_texts(ids: Sequence[str]) -> Sequence[str]:
    """``json.dumps(id)[1:-1]`` of every id: ``ids`` itself when every id is plain (a :class:`PlainIds` is)."""
    if isinstance(ids, PlainIds) or is_plain("".join(ids)):
        return ids
    return [json.dumps(i)[1:-1] for i in ids]


def sample_ids_lines(ids: Sequence[str], texts: Sequence[str] | None = None) -> Iterator[bytes]:
    """sample_ids.jsonl, chunk by chunk: ``json.dumps(id)`` per line (``texts``: :func:`id_texts` of ``ids``)."""
    texts = id_texts(ids) if texts is None else texts
    if isinstance(texts, PlainIds):
        for start in range(0, len(texts), _IDS_PER_CHUNK):
            yield texts.lines(start, min(start + _IDS_PER_CHUNK, len(texts)))
        return
    for start in range(0, len(texts), _IDS_PER_CHUNK):
        yield ('"' + '"\n"'.join(texts[start:start + _IDS_PER_CHUNK]) + '"\n').encode("ascii")


def parse_sample_ids(block: bytes) -> list[str] | None:
    """The ids of ``block``, whole lines of sample_ids.jsonl, when every line is a plain id between
    quotes (what :func:`sample_ids_lines` writes for plain ids); None otherwise. Exact: with only plain
    bytes, quotes and line ends in the block, every line at least two bytes long, starting and ending
    with a quote, and two quotes per line, no quote is inside a line, so each line is the JSON text
    of the id between its quotes."""
    rows = block.count(b"\n")
    if (not rows or not block.startswith(b'"') or not block.endswith(b'"\n') or block.startswith(b'"\n')
            or b'\n"\n' in block or block.count(b'"') != 2 * rows or block.count(b'\n"') != rows - 1
            or block.count(b'"\n') != rows or block.translate(None, _PLAIN_TEXT)):
        return None
    return block.replace(b'"', b"").decode("ascii").split("\n")[:-1]


#: The bytes of a plain id's text, and the quote and line end around it.
_PLAIN_TEXT = bytes(b for b in range(0x20, 0x7F) if b != ord("\\")) + b"\n"


def microbatch_lines(epoch: EpochPlan, texts: Sequence[str] | np.ndarray | PlainIds | None) -> Iterator[bytes]:
    """microbatches.jsonl of ``epoch``, chunk by chunk; ``texts``: :func:`id_texts` of the plan's ids,
    or that as a NumPy object array (made once for every epoch), or the plan's :class:`PlainIds`
    (whose lines are made of their bytes; None: the ids are the row numbers)."""
    offsets = np.asarray(epoch.offsets, dtype=np.int64)
    table = texts if texts is None or isinstance(texts, (np.ndarray, PlainIds)) else np.asarray(texts, dtype=object)
    j, count = 0, len(epoch)
    while j < count:
        stop = int(np.searchsorted(offsets, offsets[j] + CHUNK_ENTRIES, side="right")) - 1
        stop = min(max(stop, j + 1), count)
        if isinstance(table, PlainIds):
            yield _plain_chunk(epoch, table, j, stop)
        else:
            yield _chunk(epoch, table, j, stop).encode("ascii")
        j = stop


def _chunk(epoch: EpochPlan, table: np.ndarray | None, first: int, stop: int) -> str:
    """The lines of microbatches ``first .. stop - 1``."""
    offsets = np.asarray(epoch.offsets[first:stop + 1], dtype=np.int64)
    base = int(offsets[0])
    rows = np.asarray(epoch.samples[base:int(offsets[-1])])
    entries = list(map(str, rows.tolist())) if table is None else table[rows.astype(np.intp, copy=False)].tolist()
    index = [epoch.global_index(j) for j in range(first, stop)]
    fields = zip(index, np.asarray(epoch.bucket_ids[first:stop]).tolist(),
                 np.asarray(epoch.max_len[first:stop]).tolist())
    if epoch.pack_rows is None:
        bounds = (offsets - base).tolist()
        return "".join(f'{{"index": {i}, "samples": ["{_SEP.join(entries[a:b])}"], "bucket_id": {bucket}, '
                       f'"max_len": {most}, "packs": null}}\n'
                       for (i, bucket, most), a, b in zip(fields, bounds, bounds[1:]))
    # A packed line lists its ids twice: as samples, then by packed row; each packed row's ids are joined once.
    assert epoch.row_offsets is not None  # a packed epoch has both
    pack_rows = np.asarray(epoch.pack_rows[first:stop + 1], dtype=np.int64)
    row_bounds = (np.asarray(epoch.row_offsets[int(pack_rows[0]):int(pack_rows[-1]) + 1], dtype=np.int64)
                  - base).tolist()
    packed = [_SEP.join(entries[a:b]) for a, b in pairwise(row_bounds)]
    bounds = (pack_rows - pack_rows[0]).tolist()
    return "".join(f'{{"index": {i}, "samples": ["{_SEP.join(packed[a:b])}"], "bucket_id": {bucket}, '
                   f'"max_len": {most}, "packs": [["{_ROWS.join(packed[a:b])}"]]}}\n'
                   for (i, bucket, most), a, b in zip(fields, bounds, bounds[1:]))


def _plain_chunk(epoch: EpochPlan, ids: PlainIds, first: int, stop: int) -> bytes:
    """:func:`_chunk` of plain ids, made of their bytes: the same lines (each id's text is itself), with
    each line's fields between its ids' bytes joined once (PlainIds.joined), then the padding dropped."""
    offsets = np.asarray(epoch.offsets[first:stop + 1], dtype=np.int64)
    base = int(offsets[0])
    rows = np.asarray(epoch.samples[base:int(offsets[-1])]).astype(np.intp, copy=False)
    index = [epoch.global_index(j) for j in range(first, stop)]
    buckets = np.asarray(epoch.bucket_ids[first:stop]).tolist()
    most = np.asarray(epoch.max_len[first:stop]).tolist()
    if epoch.pack_rows is None:
        # The ids' bytes as one string (ASCII, padding included), sliced into each line's f-string.
        flat, step, cut = ids.joined_text(rows, _SEP_BYTES)
        bounds = ((offsets - base) * step).tolist()
        text = "".join(f'{{"index": {i}, "samples": ["{flat[a:max(a, b - cut)]}"], "bucket_id": {bucket}, '
                       f'"max_len": {longest}, "packs": null}}\n'
                       for i, bucket, longest, a, b in zip(index, buckets, most, bounds, bounds[1:]))
        return ids.drop_padding(text.encode("ascii"))
    parts: list[bytes] = []
    assert epoch.row_offsets is not None  # a packed epoch has both
    pack_rows = np.asarray(epoch.pack_rows[first:stop + 1], dtype=np.int64)
    row_bounds = (np.asarray(epoch.row_offsets[int(pack_rows[0]):int(pack_rows[-1]) + 1], dtype=np.int64)
                  - base).tolist()
    packed = ids.joined(rows, row_bounds, _SEP_BYTES)
    bounds = (pack_rows - pack_rows[0]).tolist()
    for i, bucket, longest, a, b in zip(index, buckets, most, bounds, bounds[1:]):
        parts += (f'{{"index": {i}, "samples": ["'.encode("ascii"), _SEP_BYTES.join(packed[a:b]),
                  f'"], "bucket_id": {bucket}, "max_len": {longest}, "packs": [["'.encode("ascii"),
                  _ROWS_BYTES.join(packed[a:b]), b'"]]}\n')
    return ids.drop_padding(b"".join(parts))


#: Between two ids of a list, and between two packed rows' lists.
_SEP = '", "'
_ROWS = '"], ["'
_SEP_BYTES = _SEP.encode("ascii")
_ROWS_BYTES = _ROWS.encode("ascii")
