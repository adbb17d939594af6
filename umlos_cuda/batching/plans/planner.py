"""Token-budget microbatches of one epoch, on the engine's order, in NumPy.

What goes in: the lengths (``uint32``, one per dataset row), a
:class:`BatchingConfig` and an epoch number. What comes out:
:class:`EpochArrays`: the rows of every microbatch concatenated
(``samples``), where each microbatch starts (``offsets``), its bucket and
its pad length (``max_len``), plus the skipped rows.

The steps, each a few array operations (no Python loop per sample):

1. **Order.** The epoch's order is the engine's (``epoch_indices`` of a
   manifest with one dataset of cardinality N, seeded with the plan seed),
   fetched in windows so memory stays at a few bytes per sample. It does not
   depend on any world size.
2. **Buckets.** Each position's bucket (``BucketSpec.bucket_ids``); rows are
   grouped by bucket, keeping the epoch order inside each bucket.
3. **Cutting.** Each bucket's rows are cut in order, a microbatch ending when
   the next sample would break the budget: ``count x bucket_max <= budget``
   for ``pad_to_bucket`` (fixed-size chunks), ``count x longest <= budget``
   for ``pad_to_max``. The greedy ``pad_to_max`` cut is one pass per bucket
   in the native extension (``umlos_cuda._packing.cut``) when it is built;
   the NumPy fallback gives the same cuts, in buckets of short samples by
   scanning one microbatch's window at a time, and in the others for every
   start at once by binary lifting over window maxima (log2 of the largest
   count levels), following the chain of cuts from the first row, one step
   per microbatch. A packed plan (``config.pack``)
   instead packs each bucket's rows into rows of ``pack.max_length`` tokens
   and cuts every ``token_budget // pack.max_length`` rows (:mod:`.packing`).
4. **Interleaving.** Microbatch ``j`` of a bucket with ``n`` microbatches gets
   the key ``(j + u) / n`` with ``u`` a Philox draw in [0, 1) (a jittered
   stratified merge); all microbatches are sorted by key (integer keys,
   ties by bucket). Every prefix of the epoch then holds each bucket in
   proportion, within one microbatch, so the bucket mix is the same at the
   start and at the end of an epoch, and the jitter keeps the pattern from
   repeating across epochs (a fixed pattern would hand the same buckets to
   the same ranks).

A plan of preference pairs (``config.group_size = 2``) runs these steps over
the pairs, then lays each pair out as its two rows (:mod:`.groups`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from ...epoch import epoch_seed, philox_key_words
from ...hashing import hash_canonical
from ...manifest.core import Manifest
from ...nextbatch import MODE_SEQUENTIAL, epoch_indices, next_batch
from ...philox import philox_draws
from ...presets import MODE_STREAMING
from .buckets import SKIPPED
from .config import BatchingConfig, PadPolicy
from ..packing.pack import native_module
from .packing import arrange_rows, pack_bucket
from .groups import expand_epoch, group_lengths, unit_config

#: Positions fetched from the engine per call (memory: a few bytes each).
ORDER_WINDOW = 1 << 22
#: Rows per pad_to_max lifting chunk.
CUT_CHUNK = 1 << 20
#: pad_to_max cuts a bucket by scanning when its microbatches hold this many samples on average.
SCAN_MIN_COUNT = 48
#: The dataset key of the manifest a plan's order comes from.
PLAN_DATASET_KEY = "train"
#: Philox domain of the interleaving jitter (the engine's draws use others).
INTERLEAVE_DOMAIN = 0x504C414E  # "PLAN"


@dataclass(frozen=True)
class EpochArrays:
    """One epoch's microbatches as arrays (``M`` microbatches, ``S`` rows)."""

    offsets: np.ndarray  # int64 [M + 1]: microbatch i is samples[offsets[i]:offsets[i+1]]
    samples: np.ndarray  # uint32 or uint64 [S]: dataset rows
    bucket_ids: np.ndarray  # int16 [M]
    max_len: np.ndarray  # uint32 [M]: the pad length
    skipped: np.ndarray  # the rows no bucket accepts, ascending
    row_offsets: np.ndarray | None = None  # packed: int64 [R + 1], row r is samples[row_offsets[r]:row_offsets[r+1]]
    pack_rows: np.ndarray | None = None  # packed: int64 [M + 1], microbatch i is rows pack_rows[i]:pack_rows[i+1]


def index_dtype(n: int) -> np.dtype:
    """Row dtype of a plan over ``n`` samples: uint32 when it fits, else uint64."""
    return np.dtype("<u4") if n <= (1 << 32) else np.dtype("<u8")


#: The dataset id of every plan's manifest. It is hashed into ``manifest_hash``
#: and so into every epoch seed: it names the module that first built plans
#: (before the plans/ sub-package existed) and must stay byte for byte, or
#: every plan's order and fingerprint would change (tests pin both).
PLAN_DATASET_ID = "umlos_cuda.batching.plan"


def plan_manifest(config: BatchingConfig, n: int) -> Manifest:
    """The manifest whose dataset ``"train"`` gives the order of the plan's ``n`` rows: its cardinality
    is ``n``, or the number of pairs ``n / 2`` in a plan of pairs (the order is over the pairs)."""
    n //= config.group_size
    return Manifest.from_dict({
        "seed": config.seed,
        "global_batch_size": 1,
        "data": {"sampler_block_size": config.sampler_block_size, "drop_last": False, "sampling_mode": config.order},
        "datasets": {
            PLAN_DATASET_KEY: {"id": PLAN_DATASET_ID, "version": 1, "hash": "", "cardinality": n},
        },
    })


def engine_metadata(config: BatchingConfig, manifest: Manifest) -> dict:
    """The engine's own metadata for the order the plan follows (its
    ``sampling_mode`` and ``sampler_config_hash`` are copied into meta.json)."""
    if config.stage == MODE_SEQUENTIAL:
        batch = next_batch(manifest, PLAN_DATASET_KEY, stage="eval", backend="numpy")
    elif config.stage == MODE_STREAMING:
        batch = next_batch(manifest, PLAN_DATASET_KEY, preset="streaming_infinite", backend="numpy")
    else:
        batch = next_batch(manifest, PLAN_DATASET_KEY, stage="train", backend="numpy")
    return batch.metadata


#: What a windowed plan, a mixture's component or pretraining sequences record of the engine's order
#: (loading compares them again: PLAN_NOT_REPRODUCIBLE).
ORDER_FIELDS = ("sampling_mode", "sampler_config_hash", "manifest_hash")


def order_fields(metadata: dict) -> dict:
    """The :data:`ORDER_FIELDS` of ``metadata`` (the engine's, or a meta.json that records them)."""
    return {key: metadata[key] for key in ORDER_FIELDS}


def engine_order(config: BatchingConfig, manifest: Manifest) -> dict:
    """The :data:`ORDER_FIELDS` of the engine's metadata for this order."""
    return order_fields(engine_metadata(config, manifest))


def epoch_order(config: BatchingConfig, manifest: Manifest, n: int, epoch: int, backend: str = "auto"):
    """Yield the epoch's rows in order, window by window (arrays of :func:`index_dtype`)."""
    for start in range(0, n, ORDER_WINDOW):
        yield order_slice(config, manifest, n, epoch, start, min(ORDER_WINDOW, n - start), backend)


def order_slice(config: BatchingConfig, manifest: Manifest, n: int, epoch: int, start: int, count: int,
                backend: str = "auto") -> np.ndarray:
    """The rows at positions ``start .. start + count - 1`` of the epoch's order (:func:`index_dtype`)."""
    dtype = index_dtype(n)
    if config.stage == MODE_SEQUENTIAL:
        return np.arange(start, start + count, dtype=dtype)
    # the streaming preset's epoch e is the train order of epoch e
    return epoch_indices(manifest, PLAN_DATASET_KEY, epoch, start, count, backend=backend).astype(dtype, copy=False)


def build_epoch(lengths: np.ndarray, config: BatchingConfig, epoch: int, *, manifest: Manifest | None = None,
                backend: str = "auto") -> EpochArrays:
    """The microbatches of ``epoch`` (see the module docstring); with ``config.window`` W below the sample count,
    planned a window of W positions at a time (:func:`plan_positions`, joined: :func:`join_arrays`)."""
    n = int(lengths.shape[0])
    manifest = manifest or plan_manifest(config, n)
    if config.window is not None and config.window < n:
        take = lengths.__getitem__
        return join_arrays([plan_positions(take, config, manifest, n, epoch, start, min(start + config.window, n),
                                           start // config.window, backend)
                            for start in range(0, n, config.window)])
    if config.group_size > 1:  # plan the pairs, then lay them out as rows
        units = build_epoch(group_lengths(lengths, config), unit_config(config), epoch, manifest=manifest,
                            backend=backend)
        return expand_epoch(units, config.group_size, index_dtype(n))
    rows, buckets = _ordered_rows_and_buckets(lengths, config, manifest, n, epoch, backend)
    return plan_ordered(lengths, rows, buckets, config, manifest, epoch)


def plan_positions(take: Callable[[np.ndarray], np.ndarray], config: BatchingConfig, manifest: Manifest, n: int,
                   epoch: int, start: int, stop: int, w: int, backend: str = "auto") -> EpochArrays:
    """The microbatches of the positions ``[start, stop)`` of the epoch's order, window ``w`` of a plan made by
    windows (docs/batching.md, "Windowed plans"): those positions' rows, their lengths (``take(rows)``), and
    :func:`plan_ordered` on them alone, its draws numbered from ``w 2^32``; dataset rows, skipped rows ascending."""
    rows = order_slice(config, manifest, n, epoch, start, stop - start, backend)
    lengths = take(rows)
    buckets = config.bucket_spec.bucket_ids(lengths)
    local = np.arange(rows.shape[0], dtype=index_dtype(int(rows.shape[0])))
    arrays = plan_ordered(lengths, local, buckets, config, manifest, epoch, draw_base=w << 32)
    return replace(arrays, samples=rows[arrays.samples], skipped=np.sort(rows[arrays.skipped]))


def join_arrays(parts: list[EpochArrays]) -> EpochArrays:
    """Consecutive windows' microbatches as one epoch's: the bounds shifted, the skipped rows ascending."""
    packed = parts[0].row_offsets is not None
    return EpochArrays(
        offsets=_joined_bounds([p.offsets for p in parts]),
        samples=np.concatenate([p.samples for p in parts]),
        bucket_ids=np.concatenate([p.bucket_ids for p in parts]),
        max_len=np.concatenate([p.max_len for p in parts]),
        skipped=np.sort(np.concatenate([p.skipped for p in parts])),
        row_offsets=_joined_bounds([p.row_offsets for p in parts]) if packed else None,  # type: ignore[misc]
        pack_rows=_joined_bounds([p.pack_rows for p in parts]) if packed else None)  # type: ignore[misc]


def _joined_bounds(parts: list[np.ndarray]) -> np.ndarray:
    """Bounds arrays ``[0, ..., end]`` of consecutive parts as one: each part shifted by the ends before it."""
    shifts = np.cumsum([0] + [int(p[-1]) for p in parts[:-1]])
    return np.concatenate([parts[0][:1].astype(np.int64)] + [p[1:].astype(np.int64) + s for p, s in zip(parts, shifts)])


def plan_ordered(lengths: np.ndarray, rows: np.ndarray, buckets: np.ndarray, config: BatchingConfig,
                 manifest: Manifest, epoch: int, *, draw_base: int = 0) -> EpochArrays:
    """Steps 2 to 4 (buckets, cutting, interleaving) over ``rows`` in the order given, each with its
    bucket in ``buckets``; ``lengths[rows]`` are their lengths. :func:`build_epoch` passes the whole
    epoch's order; a windowed plan (:mod:`.windows`) passes one window's positions, and ``draw_base``
    (``window << 32``) numbers its interleaving draws, so that window 0 draws what the whole epoch does."""
    n = int(rows.shape[0])
    spec = config.bucket_spec
    counts = np.bincount(buckets.astype(np.int64) + 1, minlength=spec.num_buckets + 1)
    # Group rows by bucket, keeping the epoch order inside each bucket.
    bases = np.concatenate(([0], np.cumsum(counts[1:])))
    if n <= ORDER_WINDOW:  # a stable sort of int16 is a radix sort, 3x faster than a mask per bucket
        by_bucket = rows[np.argsort(buckets, kind="stable")]  # skipped rows (-1) first
        skipped = np.sort(by_bucket[:int(counts[0])])
        grouped = by_bucket[int(counts[0]):]
    else:  # masks: a byte a row, where the sort's int64 permutation would cost eight
        skipped = np.sort(rows[buckets == SKIPPED])
        grouped = np.empty(n - int(counts[0]), dtype=rows.dtype)
        for k in range(spec.num_buckets):
            if counts[k + 1]:
                grouped[bases[k]:bases[k + 1]] = rows[buckets == k]
    del rows, buckets
    start_parts: list[np.ndarray] = []
    bucket_parts: list[np.ndarray] = []
    max_len_parts: list[np.ndarray] = []
    row_sizes: list[np.ndarray] = []  # packed plans only
    microbatch_rows: list[np.ndarray] = []
    for k in range(spec.num_buckets):
        if not counts[k + 1]:
            continue
        bucket_lengths = lengths[grouped[bases[k]:bases[k + 1]]]
        if config.pack is None:
            cut, longest = cut_bucket(bucket_lengths, k, config)
        else:
            rows_per_microbatch = config.rows_per_microbatch
            assert rows_per_microbatch is not None  # the plan packs
            permutation, cut, rows_of_batches, sizes_of_rows = pack_bucket(bucket_lengths, config.pack,
                                                                           rows_per_microbatch)
            grouped[bases[k]:bases[k + 1]] = grouped[bases[k]:bases[k + 1]][permutation]
            longest = np.full(cut.shape[0], config.pack.max_length, dtype=np.uint32)
            row_sizes.append(sizes_of_rows)
            microbatch_rows.append(rows_of_batches)
        start_parts.append(cut + bases[k])
        bucket_parts.append(np.full(cut.shape[0], k, dtype=np.int16))
        max_len_parts.append(longest)
    if not start_parts:
        empty = (np.zeros(1, np.int64), np.zeros(1, np.int64)) if config.pack is not None else (None, None)
        return EpochArrays(np.zeros(1, np.int64), grouped, np.zeros(0, np.int16), np.zeros(0, np.uint32), skipped,
                           *empty)
    starts = np.concatenate(start_parts)
    bucket_of = np.concatenate(bucket_parts)
    max_len = np.concatenate(max_len_parts)
    ends = np.append(starts[1:], grouped.shape[0])
    order = _interleave(bucket_of, spec.num_buckets, manifest, epoch, draw_base)
    sizes = (ends - starts)[order]
    offsets = np.zeros(order.shape[0] + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    samples = gather_batches(grouped, starts[order], sizes, offsets)
    packed = (arrange_rows(row_sizes, microbatch_rows, order, gather_batches) if config.pack is not None
              else (None, None))
    return EpochArrays(offsets, samples, bucket_of[order], max_len[order].astype(np.uint32), skipped, *packed)


def _ordered_rows_and_buckets(lengths, config, manifest, n, epoch, backend):
    rows = np.empty(n, dtype=index_dtype(n))
    buckets = np.empty(n, dtype=np.int16)
    start = 0
    for window in epoch_order(config, manifest, n, epoch, backend):
        stop = start + window.shape[0]
        rows[start:stop] = window
        buckets[start:stop] = config.bucket_spec.bucket_ids(lengths[window])
        start = stop
    return rows, buckets


def cut_bucket(bucket_lengths: np.ndarray, k: int, config: BatchingConfig) -> tuple[np.ndarray, np.ndarray]:
    """Start of each microbatch (int64, relative to the bucket) and its pad length (uint32)."""
    m = int(bucket_lengths.shape[0])
    budget = config.token_budget
    bucket_max = int(config.bucket_spec.max_lengths[k])
    if config.pad_policy is PadPolicy.PAD_TO_BUCKET:
        starts = np.arange(0, m, budget // bucket_max, dtype=np.int64)
        return starts, np.full(starts.shape[0], bucket_max, dtype=np.uint32)
    shortest = max(config.bucket_spec.bucket_range(k)[0], 1)
    largest_count = min(budget // shortest, m)
    return greedy_cuts_and_longest(bucket_lengths, budget, largest_count)


def greedy_cuts(lengths: np.ndarray, budget: int, largest_count: int, *, backend: str = "auto") -> np.ndarray:
    """Starts of the greedy ``count x longest <= budget`` microbatches of ``lengths``.

    Every length must be at most ``budget``; no microbatch holds more than
    ``largest_count`` samples (``budget // shortest possible length``) when
    the cut is found by lifting (see :func:`greedy_cuts_and_longest`).
    """
    return greedy_cuts_and_longest(lengths, budget, largest_count, backend=backend)[0]


def greedy_cuts_and_longest(lengths: np.ndarray, budget: int, largest_count: int, *,
                            backend: str = "auto") -> tuple[np.ndarray, np.ndarray]:
    """:func:`greedy_cuts` and the longest length of each microbatch (uint32).

    ``backend``: ``native`` (one pass in ``umlos_cuda._packing.cut``, uint32
    lengths), ``numpy``, or ``auto`` (native when built and the lengths are
    uint32). In NumPy, long microbatches (short samples: few cuts, many
    samples each) are found one at a time with a vectorised scan of a window;
    short ones (many cuts) by binary lifting over all starts at once, which
    also caps a microbatch at ``largest_count`` samples (in a plan, a cap
    that only binds for zero lengths). The native pass applies the same cap in the
    same cases, so every backend gives the same cuts, bit for bit.
    """
    m = int(lengths.shape[0])
    if m == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint32)
    by_scan = budget * m / max(1, int(lengths.sum(dtype=np.uint64))) >= SCAN_MIN_COUNT
    cap = m if by_scan else max(1, min(largest_count, m))
    module = native_module() if backend != "numpy" else None
    if module is not None and lengths.dtype == np.uint32:
        return _native_cuts(module, np.ascontiguousarray(lengths), budget, cap)
    if backend == "native":
        raise ValueError("the native cut needs umlos_cuda._packing and uint32 lengths")
    starts = cuts_by_scan(lengths, budget) if by_scan else cuts_by_lifting(lengths, budget, cap)
    return starts, np.maximum.reduceat(lengths, starts).astype(np.uint32)


def _native_cuts(module, lengths: np.ndarray, budget: int, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """The native pass, its outputs sized by a bound on the microbatches:
    every microbatch but the last holds at least ``min(cap, budget // longest)``
    samples (one more would have broken neither the budget nor the cap)."""
    m = int(lengths.shape[0])
    least = max(1, min(cap, budget // max(1, int(lengths.max()))))
    room = -(-m // least)
    starts = np.empty(room, dtype=np.int64)
    longest = np.empty(room, dtype=np.uint32)
    count = module.cut(lengths, budget, cap, starts, longest)
    return starts[:count].copy(), longest[:count].copy()


def cuts_by_scan(lengths: np.ndarray, budget: int) -> np.ndarray:
    """:func:`greedy_cuts` one microbatch at a time: the running maximum of a
    window (twice the last count, doubled until the budget breaks inside it)."""
    m = int(lengths.shape[0])
    starts = []
    position, window = 0, 64
    while position < m:
        while True:
            stop = min(position + window, m)
            running = np.maximum.accumulate(lengths[position:stop]).astype(np.uint64)
            running *= np.arange(1, stop - position + 1, dtype=np.uint64)
            first_over = int(np.argmax(running > budget))
            if running[first_over] > budget:
                count = first_over
                break
            if stop == m:
                count = stop - position
                break
            window *= 2
        starts.append(position)
        position += count
        window = max(16, 2 * count)
    return np.asarray(starts, dtype=np.int64)


def cuts_by_lifting(lengths: np.ndarray, budget: int, largest_count: int) -> np.ndarray:
    """:func:`greedy_cuts` by binary lifting, in chunks of :data:`CUT_CHUNK`
    rows (plus ``largest_count`` of look-ahead), so memory is
    O(chunk x log2(largest_count))."""
    m = int(lengths.shape[0])
    largest_count = max(1, min(largest_count, m))
    chunk = max(CUT_CHUNK, 2 * largest_count)
    starts = []
    position = 0
    for base in range(0, m, chunk):
        if position >= m:
            break
        stop = min(base + chunk, m)
        window = lengths[base:min(stop + largest_count, m)].astype(np.uint64)
        ends = _batch_ends(window, budget, largest_count, stop - base) + base
        while position < stop:
            starts.append(position)
            position = int(ends[position - base])
    return np.asarray(starts, dtype=np.int64)


def _batch_ends(window: np.ndarray, budget: int, largest_count: int, wanted: int) -> np.ndarray:
    """For each of the first ``wanted`` positions ``i`` of ``window``, the end of
    the longest run ``window[i:j]`` with ``(j - i) x max <= budget`` (binary
    lifting over window maxima: ``levels[l][i] = max(window[i:i + 2^l])``)."""
    m = int(window.shape[0])
    levels = [window]
    while (1 << len(levels)) <= largest_count:
        previous, half = levels[-1], 1 << (len(levels) - 1)
        levels.append(np.maximum(previous[:-half], previous[half:]))
    i = np.arange(wanted, dtype=np.int64)
    count = np.zeros(wanted, dtype=np.int64)
    current = np.zeros(wanted, dtype=np.uint64)
    limit = np.uint64(budget)
    for level in range(len(levels) - 1, -1, -1):
        table, step = levels[level], 1 << level
        candidate = count + step
        fits = (i + candidate <= m) & (candidate <= largest_count)
        longest = np.maximum(current, table[np.minimum(i + count, table.shape[0] - 1)])
        fits &= candidate.astype(np.uint64) * longest <= limit
        count = np.where(fits, candidate, count)
        current = np.where(fits, longest, current)
    return i + np.maximum(count, 1)


def interleave_key_words(manifest: Manifest, epoch: int) -> tuple[tuple[int, int], int, int]:
    """Philox key and counter words of the interleaving jitter of ``epoch``:
    derived from the engine's epoch seed, so a plan's seed decides both."""
    seed16 = epoch_seed(manifest.replay_token, manifest.hash, PLAN_DATASET_KEY, epoch)
    return philox_key_words(hash_canonical(["umlos_batch_plan_interleave_v1", seed16])[:16])


def _interleave(bucket_of: np.ndarray, num_buckets: int, manifest: Manifest, epoch: int,
                draw_base: int = 0) -> np.ndarray:
    """The merged order of microbatches given bucket by bucket (see the module docstring); microbatch
    ``i`` of the merge takes the jitter of draw number ``draw_base + i``."""
    total = bucket_of.shape[0]
    per_bucket = np.bincount(bucket_of, minlength=num_buckets).astype(np.uint64)
    first = np.concatenate(([0], np.cumsum(per_bucket)[:-1])).astype(np.int64)
    j = (np.arange(total, dtype=np.int64) - first[bucket_of]).astype(np.uint64)
    key, w2, w3 = interleave_key_words(manifest, epoch)
    r0, _ = philox_draws(np.arange(total, dtype=np.uint64) + np.uint64(draw_base), key, w2, w3, INTERLEAVE_DOMAIN)
    jitter = r0 >> np.uint64(32)
    keys = ((j << np.uint64(32)) + jitter) // per_bucket[bucket_of]
    return np.argsort(keys, kind="stable")


def gather_batches(grouped: np.ndarray, sources: np.ndarray, sizes: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Copy microbatch ``b`` (``grouped[sources[b]:sources[b] + sizes[b]]``) to
    ``offsets[b]``, a bounded number of rows at a time."""
    out = np.empty(int(offsets[-1]), dtype=grouped.dtype)
    batches = sizes.shape[0]
    first = 0
    while first < batches:
        last = int(np.searchsorted(offsets, offsets[first] + ORDER_WINDOW, side="right")) - 1
        last = min(max(last, first + 1), batches)
        lo, hi = int(offsets[first]), int(offsets[last])
        shift = np.repeat(sources[first:last] - offsets[first:last], sizes[first:last])
        out[lo:hi] = grouped[np.arange(lo, hi, dtype=np.int64) + shift]
        first = last
    return out


def bucket_mix_drift(bucket_ids: np.ndarray, num_buckets: int, fraction: float = 0.1) -> float:
    """Total-variation distance between the bucket mix of the first and the last
    ``fraction`` of microbatches (0: the same mix; 1: no bucket in common)."""
    total = int(bucket_ids.shape[0])
    if total == 0:
        return 0.0
    take = max(1, round(total * float(fraction)))
    head = np.bincount(bucket_ids[:take], minlength=num_buckets) / take
    tail = np.bincount(bucket_ids[total - take:], minlength=num_buckets) / take
    return float(0.5 * np.abs(head - tail).sum())
