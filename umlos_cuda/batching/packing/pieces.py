"""Where the pieces of packed rows come from: sequence objects, flat token arrays or a token source.

What goes in: the sequences of a packing, in one of three forms. What comes
out, for the pieces of the rows a lazy :class:`~.view.PackedRows` lays out
(``sources``, ``starts``, ``lengths``: which sequence, from which token,
how many), the four fields :func:`~.rows.layout_segments` lays out: token
ids and loss masks (contiguous int32 arrays), sample ids and offsets in
the sample. The packing decision needs none of this: only the lengths and,
for the metrics, the loss tokens of the pieces (:meth:`loss_tokens`).

* :class:`ObjectPieces`: a list of :class:`~.rows.SequenceToPack`
  (``pack_sequences``); a cut piece is ``SequenceToPack.piece``.
* :class:`FlatPieces`: every sequence's tokens in one flat array, sequence
  ``i`` being ``tokens[offsets[i]:offsets[i + 1]]`` (the layout of a token
  store and of Megatron-LM's indexed dataset), with an optional flat loss
  mask (all ones without). A piece is a slice of those arrays, copied to
  int32 once per layout call for the pieces of the rows asked for, with
  their values checked there (ids in [0, 2^31 - 1], mask values 0 or 1):
  nothing is read per sequence when the packing is decided.
* :class:`SourcePieces`: any token source (tokens/sources.py protocol: a
  sharded store, a Megatron dataset or list of them), each piece read by
  ``source.arrays(row)``.

A row laid out from any of them equals the row laid out from
``SequenceToPack`` objects holding the same tokens, masks and ids
(tests/test_batching_packing_columns.py).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable
from typing import Protocol

import numpy as np

from .config import MAX_TOKEN_ID
from .rows import SequenceToPack, input_error

_LOSS_TOKENS = operator.attrgetter("loss_tokens")
_FIELDS = tuple(map(operator.attrgetter, ("input_ids", "loss_mask", "sample_id", "offset")))


class Pieces(Protocol):
    """What :func:`~.sequences.pack_pieces` and :class:`~.view.PackedRows` read of the sequences."""

    def sample_id(self, index: int) -> str: ...

    def loss_tokens(self, lengths: np.ndarray, source: np.ndarray, start: np.ndarray, piece: np.ndarray,
                    oversized: bool) -> int: ...

    def segments(self, sources: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple: ...


class ObjectPieces:
    """Pieces of :class:`SequenceToPack` objects (what ``pack_sequences`` takes)."""

    def __init__(self, items: list[SequenceToPack]) -> None:
        self.items = items

    def sample_id(self, index: int) -> str:
        return self.items[index].sample_id

    def loss_tokens(self, lengths: np.ndarray, source: np.ndarray, start: np.ndarray, piece: np.ndarray,
                    oversized: bool) -> int:
        """Loss tokens of all pieces: each whole sequence's own count, and the
        mask of each cut piece (truncated or split) counted over its tokens."""
        items = self.items
        per_sequence = np.fromiter(map(_LOSS_TOKENS, items), dtype=np.int64, count=len(items))
        if not oversized:  # every sequence whole, once (oversize_pieces): no gather
            return int(per_sequence.sum())
        cut = (start != 0) | (piece != lengths[source])
        total = int(per_sequence[source[~cut]].sum())
        for p in np.flatnonzero(cut).tolist():
            mask, s = items[int(source[p])].loss_mask, int(start[p])
            assert mask is not None  # SequenceToPack.__post_init__ fills in the all-ones default
            total += int(np.count_nonzero(mask[s:s + int(piece[p])]))
        return total

    def segments(self, sources: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple:
        pieces = list(map(self.items.__getitem__, sources.tolist()))
        whole = np.fromiter(map(operator.attrgetter("length"), pieces), dtype=np.int64, count=len(pieces))
        cut = np.flatnonzero((starts != 0) | (lengths != whole))  # pieces, not whole sequences
        for p, s, n in zip(cut.tolist(), starts[cut].tolist(), lengths[cut].tolist()):
            pieces[p] = pieces[p].piece(s, s + n)
        return tuple(tuple(map(field, pieces)) for field in _FIELDS)


class FlatPieces:
    """Pieces sliced out of flat arrays (see the module docstring); ``sample_id(i)`` names sequence ``i``."""

    def __init__(self, tokens: np.ndarray, offsets: np.ndarray, loss_mask: np.ndarray | None,
                 sample_id: Callable[[int], str], longest: int) -> None:
        # Plain ndarray views of a memory map: slicing an np.memmap makes a memmap object
        # each time, which tripled the time of a microbatch over a token store's arrays.
        self.tokens = np.asarray(tokens)
        self.offsets = np.asarray(offsets)
        self.mask = None if loss_mask is None else np.asarray(loss_mask)
        self.sample_id = sample_id
        self._ones = np.ones(longest, dtype=np.int32)  # every mask of a run without one: slices of this
        self._ones.flags.writeable = False

    def loss_tokens(self, lengths: np.ndarray, source: np.ndarray, start: np.ndarray, piece: np.ndarray,
                    oversized: bool) -> int:
        """Loss tokens of all pieces: one count over the whole mask, less the
        sequences that are not one whole piece, plus their pieces (a loop over
        those alone: ``np.add.reduceat`` over a uint8 mask is far slower)."""
        if self.mask is None:
            return int(piece.sum())
        base = int(self.offsets[0])
        total = int(np.count_nonzero(self.mask[base:int(self.offsets[-1])]))
        if not oversized:
            return total
        cut = (start != 0) | (piece != lengths[source])
        for i in np.unique(source[cut]).tolist() + np.flatnonzero(np.bincount(source, minlength=lengths.shape[0])
                                                                  == 0).tolist():
            total -= self._count(int(self.offsets[i]), int(lengths[i]))  # not whole: cut, or skipped
        for p in np.flatnonzero(cut).tolist():
            total += self._count(int(self.offsets[int(source[p])] + start[p]), int(piece[p]))
        return total

    def _count(self, at: int, count: int) -> int:
        assert self.mask is not None
        return int(np.count_nonzero(self.mask[at:at + count]))

    def segments(self, sources: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple:
        begin = self.offsets[sources] + starts
        bounds = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
        np.cumsum(lengths, out=bounds[1:])
        spans = list(zip(begin.tolist(), (begin + lengths).tolist()))
        ids = _gathered(self.tokens, spans, "token ids", MAX_TOKEN_ID, sources, bounds, self.sample_id)
        if self.mask is None:
            ones = self._ones
            masks = tuple(ones[:n] for n in lengths.tolist())
        else:
            masks = _split(_gathered(self.mask, spans, "loss_mask values", 1, sources, bounds, self.sample_id),
                           bounds)
        return (_split(ids, bounds), masks, tuple(map(self.sample_id, sources.tolist())), tuple(starts.tolist()))


class SourcePieces:
    """Pieces read row by row from a token source (``source.arrays(row)``)."""

    def __init__(self, source) -> None:
        self.source = source
        self.sample_id = source.sample_id

    def loss_tokens(self, lengths: np.ndarray, source: np.ndarray, start: np.ndarray, piece: np.ndarray,
                    oversized: bool) -> int:
        """Loss tokens of all pieces: every token when the source says each is in the loss
        (``trains_on_every_token``: a Megatron dataset's masks are all ones), by the flat masks of
        the source's parts when each part has them (a sharded store's shards), else mask by mask."""
        if getattr(self.source, "trains_on_every_token", False):
            return int(piece.sum(dtype=np.int64))
        parts = _flat_parts(self.source)
        if parts is None:
            arrays = self.source.arrays
            return sum(int(np.count_nonzero(arrays(int(i))[1][int(s):int(s) + int(n)]))
                       for i, s, n in zip(source.tolist(), start.tolist(), piece.tolist()))
        total, first = 0, 0
        for part in parts:
            count = int(part.offsets.shape[0]) - 1
            inside = (source >= first) & (source < first + count)
            flat = FlatPieces(np.zeros(0, dtype=np.int32), part.offsets, part.loss_mask_array, str, 0)
            total += flat.loss_tokens(lengths[first:first + count], source[inside] - first, start[inside],
                                      piece[inside], oversized)
            first += count
        return total

    def segments(self, sources: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple:
        arrays = self.source.arrays
        bounds = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
        np.cumsum(lengths, out=bounds[1:])
        id_parts, mask_parts = [], []
        for row, s, n in zip(sources.tolist(), starts.tolist(), lengths.tolist()):
            tokens, mask = arrays(row)
            id_parts.append(tokens[s:s + n])
            mask_parts.append(mask[s:s + n])
        ids = _split(_checked(np.concatenate(id_parts) if id_parts else np.zeros(0, dtype=np.int32), "token ids",
                              MAX_TOKEN_ID, sources, bounds, self.sample_id), bounds)
        masks = _split(_checked(np.concatenate(mask_parts) if mask_parts else np.zeros(0, dtype=np.int32),
                                "loss_mask values", 1, sources, bounds, self.sample_id), bounds)
        return ids, masks, tuple(map(self.sample_id, sources.tolist())), tuple(starts.tolist())


def _flat_parts(source) -> list | None:
    """The parts of ``source`` as objects with flat ``offsets`` and ``loss_mask_array``
    (token stores), or None when some part has no such arrays."""
    if hasattr(source, "loss_mask_array") and hasattr(source, "offsets"):
        return [source]
    if not hasattr(source, "num_parts"):
        return None
    parts = [source.part(i) for i in range(source.num_parts)]
    return parts if all(hasattr(p, "loss_mask_array") and hasattr(p, "offsets") for p in parts) else None


def _gathered(array: np.ndarray, spans: list, what: str, top: int, sources, bounds, sample_id) -> np.ndarray:
    """The spans of ``array`` in one int32 array, values checked to lie in [0, top]."""
    gathered = np.concatenate([array[a:b] for a, b in spans]) if spans else np.zeros(0, dtype=array.dtype)
    return _checked(gathered, what, top, sources, bounds, sample_id)


def _checked(values: np.ndarray, what: str, top: int, sources, bounds, sample_id) -> np.ndarray:
    """``values`` as int32, PACKING_INPUT_INVALID naming the sample of the first value outside [0, top]."""
    if values.size and (int(values.max()) > top or int(values.min()) < 0):
        bad = int(np.flatnonzero((values < 0) | (values > top))[0])
        piece = int(np.searchsorted(bounds, bad, side="right")) - 1
        raise input_error(f"sample {sample_id(int(sources[piece]))!r}: {what} must lie in [0, {top}]")
    return values.astype(np.int32, copy=False)


def _split(values: np.ndarray, bounds: np.ndarray) -> tuple:
    """Views of ``values``, one per piece."""
    edges = bounds.tolist()
    return tuple(values[a:b] for a, b in itertools.pairwise(edges))


def check_flat(tokens, offsets, loss_mask, sample_ids) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, Callable]:
    """Flat arrays checked where that costs no pass over the tokens: shapes,
    integer dtypes, offsets within the tokens and increasing (no empty
    sequence, as ``SequenceToPack`` refuses one), mask values 0 or 1 (one
    pass over the mask; :meth:`FlatPieces.loss_tokens` counts it in another). Token ids
    are checked when their rows are laid out."""
    tokens = _integer_array(tokens, "tokens")
    offsets = _integer_array(offsets, "offsets")
    if offsets.shape[0] == 0:
        raise input_error("offsets must hold at least one value (0 for no sequence)")
    count = offsets.shape[0] - 1
    if sample_ids is None:
        name: Callable[[int], str] = str
    else:
        if isinstance(sample_ids, (str, bytes)) or len(sample_ids) != count:
            raise input_error(f"sample_ids must name each of the {count} sequences, got "
                              f"{len(sample_ids) if not isinstance(sample_ids, (str, bytes)) else sample_ids!r}")
        ids = list(sample_ids)
        if not set(map(type, ids)) <= {str}:
            raise input_error("sample_ids must be strings")
        name = ids.__getitem__
    offsets = np.asarray(offsets, dtype=np.int64)
    if count and (int(offsets[0]) < 0 or int(offsets[-1]) > tokens.shape[0]):
        raise input_error(f"offsets must lie in [0, {tokens.shape[0]}] (the tokens), got {int(offsets[0])} to "
                          f"{int(offsets[-1])}")
    lengths = np.diff(offsets)
    if count and int(lengths.min()) <= 0:
        first = int(np.flatnonzero(lengths <= 0)[0])
        if lengths[first] < 0:
            raise input_error(f"offsets must not decrease; position {first + 1} is below position {first}")
        raise input_error(f"sample {name(first)!r} is empty; a packed segment holds at least one token")
    if loss_mask is not None:
        loss_mask = _integer_array(loss_mask, "loss_mask")
        if loss_mask.shape != tokens.shape:
            raise input_error(f"loss_mask has {loss_mask.shape[0]} values for {tokens.shape[0]} tokens")
        if loss_mask.size and (int(loss_mask.max()) > 1 or int(loss_mask.min()) < 0):
            raise input_error("loss_mask values must be 0 or 1")
    return tokens, offsets, loss_mask, name


def _integer_array(values, what: str) -> np.ndarray:
    try:
        array = values if isinstance(values, np.ndarray) else np.asarray(values)
    except (TypeError, ValueError) as exc:
        raise input_error(f"{what} is not an array of integers ({exc})") from None
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iub"):
        raise input_error(f"{what} must be a one-dimensional array of integers, got {array.dtype} {array.shape}")
    return array


def longest(lengths: np.ndarray, max_length: int) -> int:
    """The longest piece a packing can hold: the all-ones mask's size."""
    return int(min(int(lengths.max(initial=0)), max_length))
