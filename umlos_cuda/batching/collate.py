"""Collation: the samples of one microbatch become padded int32 arrays.

What goes in: the microbatch's rows, each a single sequence or a packed row
of several (anything with ``input_ids`` and ``loss_mask``, and for a packed
row ``segment_ids``: a :class:`~umlos_cuda.batching.samples.Sample`, a
packed row, a mapping, or a ``(input_ids, loss_mask[, segment_ids])``
tuple), the pad length and the pad policy. What comes out: a
:class:`CollatedBatch` of ``[rows, width]`` int32 arrays, the names users of
Hugging Face models and variable-length attention already know:

* ``input_ids``: the tokens, ``pad_id`` after the end of each row;
* ``labels``: shifted, ``labels[b, t] = input_ids[b, t + 1]`` where token
  ``t + 1`` is trained on (``loss_mask`` 1) and in the same segment as ``t``,
  else :data:`IGNORE_INDEX` (-100): at the prompt, at padding, at the last
  token of each segment (its successor belongs to another sequence) and at
  the last column. A model given ``labels`` must not shift them again;
* ``loss_mask``: each token's own mask (1: trained on), 0 at padding;
* ``attention_mask``: 1 at tokens, 0 at padding;
* ``segment_ids``: 0 for a single sequence, ``0, 0, 1, 1, 1, 2, ...`` for
  a packed row, -1 at padding;
* ``position_ids``: restart at 0 for each segment, 0 at padding.

The width: ``pad_to_bucket`` (predictable shapes) pads every row to
``max_len``; ``pad_to_max`` (throughput) to the longest row, which must not
exceed ``max_len`` when one is given. A row longer than ``max_len`` is
refused (COLLATE_INPUT_INVALID), never cut. A plan's microbatch collates
to its ``max_len`` under either policy (``max_len`` is its pad length);
from a plan with an over-long policy it takes each sample's token range
the plan gives (``MicrobatchSpec.spans``: :func:`sample_arrays`), the
plan's cut, never one of its own.

These arrays are the ``shifted`` convention; :mod:`~umlos_cuda.batching.presets`
hands a batch out as ``transformers`` models take it (``hf``: int64,
unshifted labels; ``padding_free``: one row with ``cu_seq_lens``), and
``collate_microbatch(..., preset=...)`` does so directly.

Each row is one slice copy; the masks, labels and positions are whole-array
NumPy operations, so collation runs at memory speed (bench/bench_collate.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from .. import checks, errors
from ..errors import UmlosError
from .plans.config import PadPolicy
from .presets import IGNORE_INDEX, PAD_SEGMENT, apply_preset
from .packing.rows import pack_rows

#: The arrays of a collated batch, in the order files and fingerprints list them.
FIELDS = ("input_ids", "labels", "loss_mask", "attention_mask", "segment_ids", "position_ids")
_INT32_MAX = np.iinfo(np.int32).max


@dataclass(frozen=True)
class CollatedBatch:
    """One collated microbatch: six int32 arrays of shape ``[rows, width]`` (see the module docstring)."""

    input_ids: np.ndarray
    labels: np.ndarray
    loss_mask: np.ndarray
    attention_mask: np.ndarray
    segment_ids: np.ndarray
    position_ids: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.input_ids.shape)

    @property
    def num_tokens(self) -> int:
        """Tokens, padding excluded."""
        return int(self.attention_mask.sum())

    def as_dict(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in FIELDS}

    @classmethod
    def from_dict(cls, arrays: Mapping[str, np.ndarray]) -> CollatedBatch:
        """From a mapping holding (at least) the six arrays, e.g. a batch file."""
        missing = [name for name in FIELDS if name not in arrays]
        if missing:
            raise collate_error(f"a collated batch needs {', '.join(FIELDS)}; missing {', '.join(missing)}")
        return cls(**{name: np.asarray(arrays[name]) for name in FIELDS})


def default_collate(samples: Sequence[Any], max_len: int | None = None,
                    pad_policy: PadPolicy | str = PadPolicy.PAD_TO_MAX_IN_BATCH, *, pad_id: int = 0) -> CollatedBatch:
    """Collate ``samples`` (one row each; see the module docstring) into a :class:`CollatedBatch`.

    Args:
        samples: the rows, single sequences or packed rows.
        max_len: the pad length (``pad_to_bucket``, required) or the most a
            row may hold (``pad_to_max``, optional).
        pad_policy: :class:`PadPolicy` or its value.
        pad_id: the token id written at padding (masked out everywhere).
    """
    try:
        policy = PadPolicy.parse(pad_policy)
    except UmlosError as exc:
        raise collate_error(exc.message) from None
    checks.sequence(samples, "samples", empty=False, fail=collate_error,
                    message="{name} must be a non-empty sequence of rows, got {type}")
    rows = [_row(sample, i) for i, sample in enumerate(samples)]
    ids, masks, segments, positions = zip(*rows)
    longest = max(len(row) for row in ids)
    if policy is PadPolicy.PAD_TO_BUCKET:
        if max_len is None:
            raise collate_error("pad_to_bucket pads every row to max_len; give max_len")
        width = _width(max_len)
    else:
        width = longest if max_len is None else min(_width(max_len), longest)
    return collate_arrays(ids, masks, width, pad_id=pad_id, max_len=max_len,
                          segment_ids=None if all(s is None for s in segments) else segments,
                          position_ids=None if any(p is None for p in positions) else positions)


def collate_arrays(input_ids: Sequence[np.ndarray], loss_masks: Sequence[np.ndarray], width: int, *,
                   pad_id: int = 0, max_len: int | None = None, segment_ids: Sequence[np.ndarray | None] | None = None,
                   position_ids: Sequence[np.ndarray] | None = None) -> CollatedBatch:
    """The core of :func:`default_collate` on arrays: rows padded to ``width``.

    ``segment_ids`` (per row, None for a single sequence) and
    ``position_ids`` (per row) are optional; positions default to a restart
    at each segment. Token ids must fit int32, masks be 0 or 1.
    """
    count = len(input_ids)
    if len(loss_masks) != count or count == 0:
        raise collate_error(f"{count} rows of input_ids but {len(loss_masks)} loss masks; give one per row")
    checks.integer(pad_id, "pad_id", 0, _INT32_MAX, fail=collate_error,
                   message="{name} must be an integer in [0, 2^31 - 1], got {value!r}")
    lengths = np.fromiter((len(row) for row in input_ids), dtype=np.int64, count=count)
    limit = width if max_len is None else min(width, int(max_len))
    if int(lengths.min()) < 1:
        raise collate_error(f"row {int(np.argmin(lengths))} is empty; a row holds at least one token")
    if int(lengths.max()) > limit:
        bad = int(np.argmax(lengths))
        raise collate_error(f"row {bad} holds {int(lengths[bad])} tokens; rows hold at most {limit} "
                            f"(max_len {max_len}, width {width}); a longer sample is refused, never cut")
    tokens = np.full((count, width), pad_id, dtype=np.int32)
    mask = np.zeros((count, width), dtype=np.int32)
    segments = np.full((count, width), PAD_SEGMENT, dtype=np.int32)
    positions = np.zeros((count, width), dtype=np.int32)
    ranges = np.arange(width, dtype=np.int32)
    for b in range(count):
        n = int(lengths[b])
        row = np.asarray(input_ids[b])
        if row.dtype.kind not in "iu" or row.ndim != 1:
            raise collate_error(f"row {b}: input_ids must be a flat integer array, got {row.dtype} {row.shape}")
        if (row.dtype.kind == "i" and int(row.min()) < 0) or (row.dtype.itemsize >= 4 and int(row.max()) > _INT32_MAX):
            raise collate_error(f"row {b}: token ids must lie in [0, 2^31 - 1] (int32)")  # signed of any width
        tokens[b, :n] = row
        row_mask = np.asarray(loss_masks[b])
        if row_mask.shape != (n,):
            raise collate_error(f"row {b}: loss_mask has shape {row_mask.shape} for {n} tokens")
        mask[b, :n] = row_mask
        row_segments = None if segment_ids is None else segment_ids[b]
        if row_segments is None:
            segments[b, :n] = 0
            positions[b, :n] = ranges[:n]
        else:
            segments[b, :n] = _segments(row_segments, n, b)
            if position_ids is not None:
                positions[b, :n] = _positions(position_ids[b], n, b)
            else:
                positions[b, :n] = _restarts(segments[b, :n], ranges[:n])
    if int(mask.max()) > 1 or int(mask.min()) < 0:
        raise collate_error("loss_mask values must be 0 or 1")
    attention = (segments != PAD_SEGMENT).astype(np.int32)
    labels = np.full((count, width), IGNORE_INDEX, dtype=np.int32)
    trained = (mask[:, 1:] == 1) & (segments[:, 1:] == segments[:, :-1])
    labels[:, :-1] = np.where(trained, tokens[:, 1:], IGNORE_INDEX)
    return CollatedBatch(tokens, labels, mask, attention, segments, positions)


def _row(sample: Any, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """``(input_ids, loss_mask, segment_ids or None, position_ids or None)`` of one row."""
    if isinstance(sample, Mapping):
        get = sample.get
    elif isinstance(sample, tuple):
        if len(sample) not in (2, 3):
            raise collate_error(f"row {index}: a tuple row is (input_ids, loss_mask[, segment_ids]), "
                                f"got {len(sample)} items")
        values = dict(zip(("input_ids", "loss_mask", "segment_ids"), sample))
        get = values.get
    else:
        def get(name, default=None):
            return getattr(sample, name, default)
    ids, mask = get("input_ids"), get("loss_mask")
    if ids is None or mask is None:
        raise collate_error(f"row {index} ({type(sample).__name__}) has no input_ids and loss_mask")
    ids = np.asarray(ids)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise collate_error(f"row {index}: input_ids must be a flat sequence of integers, got {ids.dtype} {ids.shape}")
    segments, positions = get("segment_ids"), get("position_ids")
    return (ids, np.asarray(mask), None if segments is None else np.asarray(segments),
            None if positions is None else np.asarray(positions))


def _segments(values: np.ndarray, n: int, b: int) -> np.ndarray:
    values = np.asarray(values)
    if values.shape != (n,) or values.dtype.kind not in "iu":
        raise collate_error(f"row {b}: segment_ids must be {n} integers, got {values.dtype} {values.shape}")
    steps = np.diff(values.astype(np.int64))
    if int(values[0]) != 0 or (steps.size and (int(steps.min()) < 0 or int(steps.max()) > 1)):
        raise collate_error(f"row {b}: segment_ids must start at 0 and step by 0 or 1 (0, 0, 1, 1, 2, ...)")
    return values


def _positions(values: np.ndarray, n: int, b: int) -> np.ndarray:
    values = np.asarray(values)
    if values.shape != (n,) or values.dtype.kind not in "iu" or (n and int(values.min()) < 0):
        raise collate_error(f"row {b}: position_ids must be {n} non-negative integers")
    return values


def _restarts(segments: np.ndarray, ranges: np.ndarray) -> np.ndarray:
    """Positions that restart at 0 where the segment id changes."""
    starts = np.zeros(segments.shape[0], dtype=np.int32)
    starts[1:] = np.where(segments[1:] != segments[:-1], ranges[1:], 0)
    return ranges - np.maximum.accumulate(starts)


def _width(max_len: Any) -> int:
    return checks.integer(max_len, "max_len", 1, _INT32_MAX, fail=collate_error,
                          message="{name} must be an integer in [1, 2^31 - 1], got {value!r}")


def collate_error(message: str) -> UmlosError:
    return UmlosError(errors.COLLATE_INPUT_INVALID, message, operator=errors.BATCHING_OPERATOR)


@overload
def collate_microbatch(source: Any, microbatch: Any, *, pad_id: int = 0, separator_ids: Sequence[int] = (),
                       preset: None = None) -> CollatedBatch: ...


@overload
def collate_microbatch(source: Any, microbatch: Any, *, pad_id: int = 0, separator_ids: Sequence[int] = (),
                       preset: str, **preset_options: Any) -> dict[str, Any]: ...


def collate_microbatch(source: Any, microbatch: Any, *, pad_id: int = 0, separator_ids: Sequence[int] = (),
                       preset: str | None = None, **preset_options: Any) -> CollatedBatch | dict[str, Any]:
    """A plan microbatch (:class:`~umlos_cuda.batching.plans.plan.MicrobatchSpec`)
    collated from a token source (umlos_cuda/batching/tokens/sources.py),
    padded to its ``max_len`` (the pad length under either policy).

    One row per sample; in a packed plan, one row per packed row, laid out by
    :func:`~umlos_cuda.batching.packing.rows.pack_rows` (``separator_ids``
    between a row's samples, as many as the plan's ``separator_len``; see
    :func:`plan_separator_ids`).

    Without ``preset``, the :class:`CollatedBatch`; with one (``shifted``,
    ``hf``, ``padding_free``), the dict
    :func:`~umlos_cuda.batching.presets.apply_preset` makes of it, given
    ``preset_options`` (``dtype``, ``attention``, ``mask_dtype``,
    ``cu_seq_lens_dtype``)."""
    try:
        batch = _collate_microbatch(source, microbatch, pad_id, separator_ids)
        return batch if preset is None else apply_preset(batch, preset, **preset_options)
    except UmlosError as exc:  # say which store and microbatch: a message about "row 0" alone names no file
        if exc.code != errors.COLLATE_INPUT_INVALID:
            raise
        where = getattr(source, "root", None) or getattr(source, "prefix", None) or type(source).__name__
        raise collate_error(f"{where}, microbatch {getattr(microbatch, 'index', '?')}: {exc.message}") from None


def _collate_microbatch(source: Any, microbatch: Any, pad_id: int, separator_ids: Sequence[int]) -> CollatedBatch:
    width = int(microbatch.max_len)
    packed = microbatch.packed_rows() if hasattr(microbatch, "packed_rows") else None
    pairs = sample_arrays(source, microbatch)
    if packed is None:
        return collate_arrays([p[0] for p in pairs], [p[1] for p in pairs], width, pad_id=pad_id, max_len=width)

    ids, arrays = iter(microbatch.samples), iter(pairs)
    rows = [[dict(zip(("input_ids", "loss_mask"), next(arrays)), sample_id=next(ids)) for _ in row.tolist()]
            for row in packed]
    built = pack_rows(rows, tuple(separator_ids), max_length=width)
    return collate_arrays([r.input_ids for r in built], [r.loss_mask for r in built], width, pad_id=pad_id,
                          max_len=width, segment_ids=[r.segment_ids for r in built],
                          position_ids=[r.position_ids for r in built])


def sample_arrays(source: Any, microbatch: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(input_ids, loss_mask)`` of each sample of a plan microbatch, in order: the
    token range the plan gives it (``microbatch.spans``: a truncated end, a split
    piece; :mod:`~umlos_cuda.batching.plans.overlong`), the whole sample otherwise."""
    rows = np.asarray(microbatch.rows).tolist()
    spans = getattr(microbatch, "spans", None)
    if spans is None:
        return [source.arrays(row) for row in rows]
    pairs = []
    for row, span in zip(rows, np.asarray(spans).tolist()):
        ids, mask = source.arrays(row)
        pairs.append(take_span(ids, mask, row, span))
    return pairs


def take_span(input_ids: np.ndarray, loss_mask: np.ndarray, row: int,
              span: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """``(input_ids, loss_mask)`` of dataset row ``row`` cut to the token range ``span = (start, stop)`` a plan
    gives it (views, no copy): the one cut of collation, batch files and the PyTorch collator."""
    start, stop = span
    if stop > len(input_ids):
        raise collate_error(f"row {row} holds {len(input_ids)} tokens; the plan takes tokens [{start}, {stop})")
    return input_ids[start:stop], loss_mask[start:stop]


def plan_separator_ids(plan: Any, separator_ids: Sequence[int] | None, source: Any = None) -> tuple[int, ...]:
    """The separator ids to collate ``plan``'s packed rows with: exactly its
    ``separator_len`` of them (none for a plan that does not pack or packs
    without separators), each one ``source`` can hold when it is given
    (``tokens.sources.check_token_ids``: below its vocabulary or inside its
    token type); COLLATE_INPUT_INVALID otherwise."""
    pack = getattr(plan.config, "pack", None)
    wanted = 0 if pack is None else int(pack.separator_len)
    ids = tuple(separator_ids or ())

    def refused(message: str) -> UmlosError:  # one message for a wrong count and a wrong id: it says what to give
        return collate_error(f"the plan puts {wanted} separator token(s) between packed samples; give exactly "
                             f"{wanted} separator id(s) in [0, 2^31 - 1] (--separator-ids ID,... on the command "
                             f"line), got {list(ids)}")

    if len(ids) != wanted:
        raise refused("")
    ids = tuple(checks.integer(t, "a separator id", 0, _INT32_MAX, fail=refused) for t in ids)
    if source is not None:
        from .tokens.sources import check_token_ids

        check_token_ids(ids, source, "separator id", fail=collate_error)
    return ids
