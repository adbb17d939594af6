"""The compact batch file: a microbatch's tokens, once, and what derives the rest.

What goes in: a collated microbatch (:class:`~umlos_cuda.batching.collate.CollatedBatch`,
six ``[rows, width]`` int32 arrays) and its plan microbatch. What comes out:
the members of a compact file, and back from them exactly the six arrays,
bit for bit. The six arrays repeat one thing six times (docs/batching.md,
"Batch file layouts"): padding is ``pad_id`` / 0 / -1, ``attention_mask`` is
"before the row's end", ``segment_ids`` and ``position_ids`` follow from the
segments' lengths, and ``labels`` from the tokens, the loss mask and the
segments (:func:`~umlos_cuda.batching.collate.collate_arrays`). A compact
file keeps only:

* ``input_ids``: the rows' tokens without padding, concatenated row by row,
  ``uint16`` when the store's vocabulary fits (``<u2``), else ``uint32``;
* ``loss_mask``: one bit per token (``numpy.packbits``, little bit order;
  the bits past the last token are 0);
* ``segment_lengths`` (uint32): the length of every segment, row by row;
* ``row_sizes`` (uint32): the segments of each row (1 unless packed);
* ``epoch``, ``index``, ``max_len`` (int64 scalars) and ``fingerprint``
  (the microbatch's content digest), as in the ``npz`` layout.

The plan names the rest (``sample_ids``, ``rows``, ``bucket_id``,
``plan_fingerprint``): the reader takes them from the folder's plan, so a
compact file read back gives the same dict as the ``npz`` layout's.

Every file is checked when written: :func:`encode` decodes what it made and
refuses (BATCH_FILE_INVALID) a microbatch whose arrays the members would not
give back exactly, so no file is ever written that reads back differently.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .npz import file_error, row_sizes
from ..collate import FIELDS, CollatedBatch
from ..presets import IGNORE_INDEX, PAD_SEGMENT

#: The members of a compact file, in the order they are written.
MEMBERS = ("input_ids", "loss_mask", "segment_lengths", "row_sizes", "epoch", "index", "max_len", "fingerprint")
TOKEN_DTYPES = ("<u2", "<u4")


def token_dtype_for(source: Any, separator_ids=()) -> str:
    """``<u2`` when every token id the source can hold fits 16 bits (its ``vocab_size``, else the
    unsigned type of its token array: a token store's ``tokens``, a Megatron dataset's ``dtype``),
    and so do the separator ids; ``<u4`` otherwise, or when the source does not say (a caller's own
    source: the larger type is always right). Several sources read as one (a mixture's components) fit when
    each does; a length source over a store answers for its store."""
    parts = getattr(source, "parts", None)
    if isinstance(parts, list):
        return "<u2" if all(token_dtype_for(part, separator_ids) == "<u2" for part in parts) else "<u4"
    source = getattr(source, "store", source)
    vocab = getattr(source, "vocab_size", None)
    if not isinstance(vocab, int):
        vocab = None
        tokens = getattr(source, "tokens", None)
        dtype = tokens.dtype if isinstance(tokens, np.ndarray) else getattr(source, "dtype", None)
        if isinstance(dtype, np.dtype) and dtype.kind == "u":
            vocab = 1 << (8 * dtype.itemsize)
    fits = vocab is not None and vocab <= 1 << 16 and all(int(t) < 1 << 16 for t in separator_ids)
    return "<u2" if fits else "<u4"


def encode(batch: CollatedBatch, epoch: int, microbatch: Any, digest: str, token_dtype: str,
           *, pad_id: int = 0) -> dict[str, np.ndarray]:
    """The members of ``microbatch``'s compact file (in :data:`MEMBERS` order)."""
    live = batch.attention_mask.astype(bool)
    tokens = batch.input_ids[live]
    limit = np.iinfo(np.dtype(token_dtype)).max
    if tokens.size and (int(tokens.max()) > limit or int(tokens.min()) < 0):
        raise file_error(f"epoch {epoch} microbatch {microbatch.index} holds token id {int(tokens.max())}, past "
                         f"{np.dtype(token_dtype).name}: the store's vocabulary does not fit the file's token type")
    segments = batch.segment_ids[live].astype(np.int64)
    rows = np.repeat(np.arange(live.shape[0]), live.sum(axis=1))
    cuts = np.flatnonzero((np.diff(segments) != 0) | (np.diff(rows) != 0)) + 1
    bounds = np.concatenate(([0], cuts, [tokens.size]))
    members = {
        "input_ids": tokens.astype(token_dtype),
        "loss_mask": np.packbits(batch.loss_mask[live].astype(np.uint8), bitorder="little"),
        "segment_lengths": np.diff(bounds).astype("<u4"),
        "row_sizes": row_sizes(microbatch).astype("<u4"),
        "epoch": np.array(int(epoch), dtype=np.int64),
        "index": np.array(int(microbatch.index), dtype=np.int64),
        "max_len": np.array(int(microbatch.max_len), dtype=np.int64),
        "fingerprint": np.array(digest),
    }
    again = decode(members, pad_id, "the file being written")
    if not all(np.array_equal(getattr(again, name), getattr(batch, name)) for name in FIELDS):
        raise file_error(f"epoch {epoch} microbatch {microbatch.index}: its collated arrays are not the ones its "
                         "tokens, loss mask and segments give back (positions that do not restart at each "
                         "segment?); write it with --layout npz")
    return members


def decode(members: dict[str, np.ndarray], pad_id: int, where: str) -> CollatedBatch:
    """The six arrays the members of a compact file give (BATCH_FILE_INVALID, naming ``where``,
    when the members are not of a compact file: types, shapes, counts that disagree)."""
    ids, bits = members["input_ids"], members["loss_mask"]
    seg_lengths, sizes = members["segment_lengths"], members["row_sizes"]
    if ids.dtype.str not in TOKEN_DTYPES or ids.ndim != 1:
        raise file_error(f"{where}: input_ids is {ids.dtype.str} {ids.shape}; expected one-dimensional "
                         f"{' or '.join(TOKEN_DTYPES)}")
    for name, array, dtype in (("loss_mask", bits, "|u1"), ("segment_lengths", seg_lengths, "<u4"),
                               ("row_sizes", sizes, "<u4")):
        if array.dtype.str != dtype or array.ndim != 1:
            raise file_error(f"{where}: {name} is {array.dtype.str} {array.shape}; expected one-dimensional {dtype}")
    for name in ("epoch", "index", "max_len"):
        if members[name].dtype != np.int64 or members[name].shape != ():
            raise file_error(f"{where}: {name} is {members[name].dtype} {members[name].shape}; expected an int64 "
                             "scalar")
    width = int(members["max_len"])
    count, total = sizes.shape[0], ids.shape[0]
    segment_count = int(sizes.sum(dtype=np.int64))
    if count == 0 or int(sizes.min()) < 1 or segment_count != seg_lengths.shape[0] or \
            (seg_lengths.size and int(seg_lengths.min()) < 1):
        raise file_error(f"{where}: row_sizes ({count} rows, {segment_count} segments) and segment_lengths "
                         f"({seg_lengths.shape[0]}) disagree, or a row or segment is empty")
    ends = np.zeros(segment_count + 1, dtype=np.int64)
    np.cumsum(seg_lengths, out=ends[1:])
    if int(ends[-1]) != total or bits.shape[0] != (total + 7) // 8:
        raise file_error(f"{where}: the segments hold {int(ends[-1])} tokens, input_ids {total}, loss_mask bits for "
                         f"{bits.shape[0] * 8}")
    row_ends = np.cumsum(sizes, dtype=np.int64)
    lengths = ends[row_ends] - ends[row_ends - sizes]
    if width < 1 or int(lengths.max()) > width:
        raise file_error(f"{where}: a row holds {int(lengths.max())} tokens, past its max_len {width}")
    mask_bits = np.unpackbits(bits, bitorder="little")
    if mask_bits[total:].any():
        raise file_error(f"{where}: loss_mask has bits set past its {total} tokens")
    live = np.arange(width)[None, :] < lengths[:, None]
    input_ids = np.full((count, width), pad_id, dtype=np.int32)
    input_ids[live] = ids
    loss_mask = np.zeros((count, width), dtype=np.int32)
    loss_mask[live] = mask_bits[:total]
    local = np.arange(segment_count, dtype=np.int64) - np.repeat(row_ends - sizes, sizes)
    segment_ids = np.full((count, width), PAD_SEGMENT, dtype=np.int32)
    segment_ids[live] = np.repeat(local, seg_lengths)
    position_ids = np.zeros((count, width), dtype=np.int32)
    position_ids[live] = np.arange(total, dtype=np.int64) - np.repeat(ends[:-1], seg_lengths)
    labels = np.full((count, width), IGNORE_INDEX, dtype=np.int32)
    trained = (loss_mask[:, 1:] == 1) & (segment_ids[:, 1:] == segment_ids[:, :-1])
    labels[:, :-1] = np.where(trained, input_ids[:, 1:], IGNORE_INDEX)
    return CollatedBatch(input_ids, labels, loss_mask, live.astype(np.int32), segment_ids, position_ids)
