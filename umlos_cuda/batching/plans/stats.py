"""The numbers of one epoch of a plan (stats.json): counts, tokens, padding, buckets.

What goes in: an epoch's arrays, the lengths and the bucket spec. What comes
out: a plain dict. ``tokens`` counts real tokens, ``padded_tokens`` what the
microbatches hold once padded (``count x max_len`` each), ``padding_waste``
the padding's share of it, ``bucket_mix_drift`` the
total-variation distance between the bucket mix of the first and the last
10 % of microbatches. Skipped samples are counted and listed by id.

In a packed plan a microbatch is ``rows x max_len`` padded tokens (its packed
rows, not its samples, are padded), and ``packing`` holds the epoch's
:class:`~umlos_cuda.batching.packing.metrics.PackingMetrics`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .buckets import BucketSpec
from .packing import plan_packing_metrics
from .planner import bucket_mix_drift


def epoch_stats(epoch: int, offsets: np.ndarray, samples: np.ndarray, bucket_ids: np.ndarray, max_len: np.ndarray,
                lengths: np.ndarray, spec: BucketSpec, skipped_ids: list[str], *, row_offsets=None, pack_rows=None,
                pack=None) -> dict:
    sizes = np.diff(np.asarray(offsets, dtype=np.int64))
    bucket_ids = np.asarray(bucket_ids, dtype=np.int64)
    padded_rows = sizes if pack is None else np.diff(np.asarray(pack_rows, dtype=np.int64))
    padded = padded_rows * np.asarray(max_len, dtype=np.int64)
    per_batch_tokens = tokens_per_batch(offsets, samples, lengths)
    tokens, padded_tokens = int(per_batch_tokens.sum()), int(padded.sum())
    k = spec.num_buckets
    per_bucket_samples = np.bincount(bucket_ids, weights=sizes, minlength=k)
    per_bucket_batches = np.bincount(bucket_ids, minlength=k)
    per_bucket_tokens = np.bincount(bucket_ids, weights=per_batch_tokens, minlength=k)
    per_bucket_padded = np.bincount(bucket_ids, weights=padded, minlength=k)
    histogram = [
        {"bucket_id": b, "max_length": int(spec.max_lengths[b]), "samples": int(per_bucket_samples[b]),
         "microbatches": int(per_bucket_batches[b]), "tokens": int(per_bucket_tokens[b]),
         "padded_tokens": int(per_bucket_padded[b])}
        for b in range(k)
    ]
    stats = {
        "epoch": int(epoch),
        "microbatches": int(sizes.shape[0]),
        "samples": int(sizes.sum()),
        "skipped_samples": len(skipped_ids),
        "tokens": tokens,
        "padded_tokens": padded_tokens,
        "padding_tokens": padded_tokens - tokens,
        "padding_waste": round((padded_tokens - tokens) / padded_tokens, 9) if padded_tokens else 0.0,
        "bucket_mix_drift": round(bucket_mix_drift(bucket_ids, k), 9),
        "bucket_histogram": histogram,
        "skipped": list(skipped_ids),
    }
    if pack is not None:
        stats["packing"] = plan_packing_metrics(row_offsets, samples, lengths, pack).to_dict()
    return stats


def tokens_per_batch(offsets: np.ndarray, samples: np.ndarray, lengths: np.ndarray,
                     window: int = 1 << 22) -> np.ndarray:
    """Sum of the lengths of each microbatch, a bounded number of rows at a time."""
    offsets = np.asarray(offsets, dtype=np.int64)
    cumulative = np.zeros(offsets.shape[0], dtype=np.int64)
    total = int(offsets[-1])
    running = 0
    position = 0
    boundary = 1
    while position < total:
        stop = min(position + window, total)
        part = np.cumsum(np.asarray(lengths)[np.asarray(samples[position:stop])], dtype=np.int64) + running
        running = int(part[-1])
        hi = int(np.searchsorted(offsets, stop, side="right"))
        ends = offsets[boundary:hi]
        cumulative[boundary:hi] = part[ends - position - 1]
        boundary = hi
        position = stop
    return np.diff(cumulative)


def skipped_ids(skipped_rows: np.ndarray, sample_id: Callable[[int], str]) -> list[str]:
    return [sample_id(r) for r in np.asarray(skipped_rows).tolist()]
