"""Packed rows: the arrays a model takes for several sequences in one row.

What goes in: the sequences of each row, in order (:class:`SequenceToPack`,
or anything :func:`as_sequence` turns into one), and the separator ids.
What comes out: one :class:`PackedRow` per row, with int32 arrays:

* ``input_ids``: the sequences' tokens, the separator after each but the last;
* ``loss_mask``: each sequence's mask, 0 at separators;
* ``segment_ids``: ``0, 0, 0, 1, 1, 2, ...``: which sequence a token belongs
  to (a separator belongs to the sequence before it);
* ``position_ids``: restart at 0 for each segment;
* ``cu_seqlens``: ``[0, end of segment 0, end of segment 1, ...]``, the
  cumulative boundaries that variable-length attention kernels (e.g.
  FlashAttention's ``flash_attn_varlen_func``) take;

plus ``sample_ids`` and ``sample_offsets`` (one per segment: which sample,
and where in it the segment starts: 0 unless the sample was split).

Rows are not padded: a row is as long as what it holds (at most the
packing's ``max_length``); padding is the collator's job. This module only
lays out rows; which sequences share a row is ``pack_lengths``'s job.

All rows of one call share four flat arrays, each row's arrays being views
of them. They are written by ``umlos_cuda._packing.layout`` (C++, one pass
that writes each value once) or, without the extension, by the NumPy
whole-array operations of :func:`_numpy_layout`, which define the result;
the tests compare the two bit for bit.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ... import checks, errors
from .pack import BACKENDS, native_module
from .config import MAX_TOKEN_ID, PackingConfig, config_error, packing_error

#: What :func:`layout_rows` reads of each segment (one C-level map each).
_SEGMENT_FIELDS = tuple(map(operator.attrgetter, ("input_ids", "loss_mask", "sample_id", "offset")))


def input_error(message: str):
    return packing_error(errors.PACKING_INPUT_INVALID, message)


@dataclass(frozen=True, eq=False)
class SequenceToPack:
    """One sequence to pack (checked on construction).

    ``input_ids`` non-empty token ids in [0, 2^31 - 1]; ``loss_mask`` 0s and
    1s, one per token (default: all 1); ``offset``: where this sequence
    starts in its sample (set for the pieces of a split sample).

    ``length`` and ``loss_tokens`` (the mask's 1s) are counted once here,
    where the arrays are checked anyway: :func:`pack_sequences` reads them
    as plain numbers for a million sequences without touching their arrays.
    The arrays must not be changed in place afterwards (the class is
    frozen; a lazy :class:`PackedRows` reads them when it lays out rows).
    """

    sample_id: str
    input_ids: np.ndarray
    loss_mask: np.ndarray | None = None
    offset: int = 0
    length: int = field(init=False, repr=False)
    loss_tokens: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        checks.text(self.sample_id, "sample_id", fail=input_error,
                    message="{name} must be a string, got {type} {value!r}")
        ids = _int_array(self.input_ids, f"sample {self.sample_id!r}: input_ids")
        if ids.shape[0] == 0:
            raise input_error(f"sample {self.sample_id!r} is empty; a packed segment holds at least one token")
        if int(ids.min()) < 0 or int(ids.max()) > MAX_TOKEN_ID:
            raise input_error(f"sample {self.sample_id!r}: token ids must lie in [0, {MAX_TOKEN_ID}]")
        if self.loss_mask is None:
            mask = np.ones(ids.shape[0], dtype=np.int32)
        else:
            mask = _int_array(self.loss_mask, f"sample {self.sample_id!r}: loss_mask")
            if mask.shape != ids.shape:
                raise input_error(f"sample {self.sample_id!r}: loss_mask has {mask.shape[0]} values for "
                                  f"{ids.shape[0]} tokens")
            if mask.size and (int(mask.min()) < 0 or int(mask.max()) > 1):
                raise input_error(f"sample {self.sample_id!r}: loss_mask values must be 0 or 1")
        loss_tokens = int(np.count_nonzero(mask)) if self.loss_mask is not None else int(ids.shape[0])
        offset = checks.integer(self.offset, "offset", 0, None, message=checks.NON_NEGATIVE,
                                fail=lambda message: input_error(f"sample {self.sample_id!r}: {message}"))
        set_(self, "input_ids", ids.astype(np.int32, copy=False))
        set_(self, "loss_mask", mask.astype(np.int32, copy=False))
        set_(self, "offset", offset)
        set_(self, "length", int(ids.shape[0]))
        set_(self, "loss_tokens", loss_tokens)

    def piece(self, start: int, stop: int) -> SequenceToPack:
        """Tokens ``[start, stop)`` as a sequence of the same sample."""
        assert self.loss_mask is not None  # __post_init__ fills in the all-ones default
        return SequenceToPack(self.sample_id, self.input_ids[start:stop], self.loss_mask[start:stop],
                              self.offset + start)


def _int_array(values, what: str) -> np.ndarray:
    try:
        array = np.asarray(values)
    except (TypeError, ValueError) as exc:
        raise input_error(f"{what} is not an array of integers ({exc})") from None
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iub"):
        raise input_error(f"{what} must be a one-dimensional sequence of integers, got {array.dtype} {array.shape}")
    if array.dtype.kind == "u" and array.size and int(array.max()) > MAX_TOKEN_ID:
        raise input_error(f"{what}: values must lie in [0, {MAX_TOKEN_ID}]")
    return array.astype(np.int64, copy=False)


def as_sequence(item, index: int) -> SequenceToPack:
    """``item`` as a :class:`SequenceToPack`: one already, a ``Sample`` (its
    tokens, loss mask and ``meta.sample_id``), a mapping with ``input_ids``
    (and optionally ``loss_mask``, ``sample_id``), or a sequence of token
    ids. Without an id, the sequence's ``index`` (as text) names it."""
    if isinstance(item, SequenceToPack):
        return item
    if hasattr(item, "input_ids") and hasattr(item, "meta"):  # a Sample
        return SequenceToPack(item.meta.sample_id, item.input_ids, item.loss_mask)
    if isinstance(item, dict):
        if "input_ids" not in item:
            raise input_error(f"sequence {index} is a mapping without input_ids (keys: {sorted(item)})")
        return SequenceToPack(str(item.get("sample_id", index)), item["input_ids"], item.get("loss_mask"))
    return SequenceToPack(str(index), item)


@dataclass(frozen=True, eq=False)
class PackedRow:
    """One packed row (see the module docstring); arrays are int32."""

    input_ids: np.ndarray
    loss_mask: np.ndarray
    segment_ids: np.ndarray
    position_ids: np.ndarray
    cu_seqlens: np.ndarray
    sample_ids: tuple[str, ...]
    sample_offsets: tuple[int, ...] = field(default=())
    separator_tokens: int = 0

    @property
    def length(self) -> int:
        """Tokens in the row (separators included, no padding)."""
        return int(self.input_ids.shape[0])

    @property
    def num_segments(self) -> int:
        return len(self.sample_ids)

    @property
    def loss_tokens(self) -> int:
        return int(self.loss_mask.sum())

    def to_dict(self) -> dict:
        """Plain data (lists), e.g. for JSON."""
        return {"input_ids": self.input_ids.tolist(), "loss_mask": self.loss_mask.tolist(),
                "segment_ids": self.segment_ids.tolist(), "position_ids": self.position_ids.tolist(),
                "cu_seqlens": self.cu_seqlens.tolist(), "sample_ids": list(self.sample_ids),
                "sample_offsets": list(self.sample_offsets)}


def build_row(segments: Sequence[SequenceToPack], separator_ids: Sequence[int] = ()) -> PackedRow:
    """One :class:`PackedRow` from its segments, in order."""
    return build_rows([segments], separator_ids)[0]


def build_rows(rows: Sequence[Sequence[SequenceToPack]], separator_ids: Sequence[int] = ()) -> list[PackedRow]:
    """The :class:`PackedRow` of each row (its segments, in order), laid out
    for all rows at once: every token is placed by whole-array operations
    (one concatenation, separators scattered between a row's segments), then
    each row is a view."""
    if not rows:
        return []
    if not all(rows):
        raise input_error("a packed row holds at least one sequence")
    counts = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    return layout_rows([segment for row in rows for segment in row], counts, separator_ids)[0]


def layout_rows(segments: Sequence[SequenceToPack], counts: np.ndarray, separator_ids: Sequence[int] = (),
                lengths: np.ndarray | None = None, *, backend: str = "auto") -> tuple[list[PackedRow], int]:
    """:func:`build_rows` on the segments of all rows in one list (row ``r``
    holds the next ``counts[r] >= 1`` of them), with the segments' token
    counts when the caller knows them; also returns the loss tokens of all
    rows (one sum, not one per row).

    ``backend`` (the names of :func:`~umlos_cuda.batching.packing.pack.pack_lengths`):
    ``python`` (NumPy whole-array operations; the definition), ``native``
    (``umlos_cuda._packing.layout``: the four token arrays in one pass, each
    output value written once) or ``auto`` (native when built). Both give
    the same arrays bit for bit (tests/test_batching_packing.py).
    """
    ids, masks, sample_ids, offsets = (tuple(map(field, segments)) for field in _SEGMENT_FIELDS)
    return layout_segments(ids, masks, sample_ids, offsets, counts, separator_ids, lengths, backend=backend)


def layout_segments(ids: Sequence[np.ndarray], masks: Sequence[np.ndarray], sample_ids: Sequence[str],
                    offsets: Sequence[int], counts: np.ndarray, separator_ids: Sequence[int] = (),
                    lengths: np.ndarray | None = None, *, backend: str = "auto") -> tuple[list[PackedRow], int]:
    """:func:`layout_rows` on the segments' fields, one sequence each: token
    ids and loss masks (contiguous int32 arrays, what ``SequenceToPack``
    holds), sample ids and offsets. This is the one layout of packed rows:
    :func:`layout_rows` reads these fields off ``SequenceToPack`` objects,
    a lazy :class:`~.view.PackedRows` over flat token arrays slices them
    out of those arrays (:mod:`.pieces`)."""
    if backend not in BACKENDS:
        raise config_error(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    module = native_module() if backend != "python" else None
    if backend == "native" and module is None:
        raise config_error("backend 'native' is unavailable: the extension umlos_cuda._packing is not built "
                           "(reinstall with a C++ compiler), use backend 'auto' or 'python'")
    if counts.shape[0] == 0:
        return [], 0
    separator = np.asarray(separator_ids, dtype=np.int32)
    sep_len = int(separator.shape[0])
    first = np.zeros(counts.shape[0] + 1, dtype=np.int64)  # index of each row's first segment
    np.cumsum(counts, out=first[1:])
    if lengths is None:
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    seg_lengths = lengths + sep_len
    seg_lengths[first[1:] - 1] = lengths[first[1:] - 1]  # no separator after a row's last segment
    cu = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(seg_lengths, out=cu[1:])
    row_tokens = np.diff(cu[first])
    if int(row_tokens.max()) > MAX_TOKEN_ID:
        raise input_error(f"a packed row of {int(row_tokens.max())} tokens is longer than 2^31 - 1")
    if module is not None:
        arrays = _native_layout(module, ids, masks, first, lengths, separator, int(cu[-1]))
    else:
        arrays = _numpy_layout(ids, masks, first, counts, lengths, seg_lengths, cu, separator)
    return _rows(arrays, sample_ids, offsets, counts, first, cu, sep_len)


def _native_layout(module, ids, masks, first, lengths, separator, total):
    """The four arrays and the loss tokens, by ``umlos_cuda._packing.layout``.

    ``SequenceToPack`` keeps contiguous int32 arrays, which is what the
    extension reads; one changed behind its back (``object.__setattr__``)
    is refused as PACKING_INPUT_INVALID, not as the extension's TypeError."""
    arrays = [np.empty(total, dtype=np.int32) for _ in range(4)]
    try:
        loss = module.layout(ids, masks, np.ascontiguousarray(lengths, dtype=np.int64), first, separator,
                             *arrays)
    except (TypeError, ValueError) as exc:
        raise input_error(f"a sequence's arrays are not what SequenceToPack holds ({exc})") from None
    return (*arrays, loss)


def _numpy_layout(ids, masks, first, counts, lengths, seg_lengths, cu, separator):
    """The four arrays and the loss tokens, by whole-array operations (the definition)."""
    sep_len = int(separator.shape[0])
    tokens = np.concatenate(ids)
    masks = np.concatenate(masks)
    if sep_len:
        total = int(cu[-1])
        input_ids = np.empty(total, dtype=np.int32)
        loss_mask = np.zeros(total, dtype=np.int32)
        source_starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        where = np.arange(tokens.shape[0], dtype=np.int64) + np.repeat(cu[:-1] - source_starts, lengths)
        input_ids[where] = tokens
        loss_mask[where] = masks
        followed = np.ones(len(ids), dtype=bool)
        followed[first[1:] - 1] = False
        sep_starts = (cu[:-1] + lengths)[followed]
        input_ids[(sep_starts[:, None] + np.arange(sep_len)).reshape(-1)] = np.tile(separator, sep_starts.shape[0])
    else:
        input_ids, loss_mask = tokens.astype(np.int32, copy=False), masks.astype(np.int32, copy=False)
    segment_ids = np.repeat((np.arange(len(ids)) - np.repeat(first[:-1], counts)).astype(np.int32), seg_lengths)
    # Positions by one running sum in place (no temporary as long as the tokens):
    # steps of 1, and at each segment's first token the step back to 0.
    position_ids = np.ones(int(cu[-1]), dtype=np.int32)
    position_ids[cu[1:-1]] = 1 - seg_lengths[:-1]
    position_ids[0] = 0
    np.cumsum(position_ids, out=position_ids)
    return input_ids, loss_mask, segment_ids, position_ids, int(masks.sum(dtype=np.int64))


def _rows(arrays, sample_ids, offsets, counts, first, cu, sep_len) -> tuple[list[PackedRow], int]:
    """Each row's views of the flat arrays, and the loss tokens."""
    input_ids, loss_mask, segment_ids, position_ids, loss_tokens = arrays
    # Every row's cu_seqlens in one array: row r's are at [first[r] + r, first[r + 1] + r + 1).
    num_rows = int(counts.shape[0])
    row_of = np.repeat(np.arange(num_rows, dtype=np.int64), counts + 1)
    boundary = np.arange(row_of.shape[0], dtype=np.int64) - row_of
    cu_rows = (cu[boundary] - cu[first[:-1]][row_of]).astype(np.int32)
    firsts, starts = first.tolist(), cu[first].tolist()
    out = []
    for r in range(num_rows):
        a, b = firsts[r], firsts[r + 1]
        lo, hi = starts[r], starts[r + 1]
        out.append(_packed_row({"input_ids": input_ids[lo:hi], "loss_mask": loss_mask[lo:hi],
                                "segment_ids": segment_ids[lo:hi], "position_ids": position_ids[lo:hi],
                                "cu_seqlens": cu_rows[a + r:b + r + 1], "sample_ids": sample_ids[a:b],
                                "sample_offsets": offsets[a:b], "separator_tokens": sep_len * (b - a - 1)}))
    return out, loss_tokens


def _packed_row(fields: dict) -> PackedRow:
    """A :class:`PackedRow` from fields that :func:`layout_rows` has checked.

    The dataclass's own ``__init__`` sets a frozen instance's fields one
    ``object.__setattr__`` at a time, which is most of the cost of a row when
    thousands are made in one call; this sets them in one step and gives
    the same object (same fields, same ``__dict__``)."""
    row = _new_object(PackedRow)
    _set_attribute(row, "__dict__", fields)
    return row


_new_object, _set_attribute = object.__new__, object.__setattr__


def pack_rows(rows: Iterable[Iterable], separator_ids: Sequence[int] = (), *, max_length: int | None = None,
              config: PackingConfig | None = None) -> list[PackedRow]:
    """The :class:`PackedRow` of each row; ``rows`` lists each row's sequences in order.

    This is the row builder for packs that are already decided (a packed
    plan's ``packs``, or :func:`pack_sequences`). Each sequence is anything
    :func:`as_sequence` accepts. ``config`` gives ``separator_ids`` and
    ``max_length``; with a ``max_length``, a row that holds more tokens
    (separators included) is refused with PACKING_INPUT_INVALID.
    """
    if config is not None:
        separator_ids, max_length = config.layout_separator(), config.max_length
    separator_ids = tuple(checks.integer(t, "a separator id", 0, MAX_TOKEN_ID, fail=config_error)
                          for t in separator_ids)
    packed = build_rows([[as_sequence(item, k) for k, item in enumerate(row)] for row in rows], separator_ids)
    for r, row in enumerate(packed):
        if max_length is not None and row.length > max_length:
            raise input_error(f"row {r} holds {row.length} tokens (separators included); max_length is {max_length}")
    return packed
