"""Length statistics and the bucket edges that minimise padding.

What goes in: an array of sample lengths (a length cache's ``lengths``).
What comes out: a power-of-two histogram, percentiles, and for each number
of buckets k the edges that minimise padding, with that padding.

Buckets and padding. Edges ``e_1 < ... < e_k`` are inclusive upper bounds:
bucket ``b`` holds the lengths in ``(e_{b-1}, e_b]`` (``e_0 = 0``) and every
sample in it is padded to ``e_b``, as in the predictable (``pad_to_bucket``)
mode; ``e_k`` is the longest length. Padding is ``sum(e_bucket - length)``
over the samples; waste is padding over padded tokens
(``padding / (padding + tokens)``).

The optimum is exact. Over the histogram's m distinct lengths ``v_1 < ... <
v_m`` (counts ``c``), an optimal edge always sits at some ``v`` (lowering an
edge to the longest length in its bucket only removes padding), so the
problem is to cut the sorted histogram into k runs, each padded to its last
value: ``D[t][j] = min_i D[t-1][i] + cost(i, j)``, where ``cost(i, j)`` is
the padding of values ``i..j-1`` in one bucket, computed in O(1) from prefix
sums. That cost is Monge (``cost(a, d) + cost(b, c) - cost(a, c) -
cost(b, d) = sum_{a <= l < b} c_l (v_d - v_c) >= 0``), so the leftmost
optimal split moves right as j grows, and each row is filled by divide and
conquer: O(k m log m) work in O(k log m) NumPy passes, in exact int64
arithmetic. tests/test_batching_lengths.py checks it against brute force.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import checks, errors
from ...errors import UmlosError

PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)
_INF = np.int64(1) << np.int64(62)


@dataclass(frozen=True)
class BucketChoice:
    """The best edges for one number of buckets, and what they cost."""

    edges: tuple[int, ...]
    padding_tokens: int
    tokens: int

    @property
    def buckets(self) -> int:
        return len(self.edges)

    @property
    def padding_waste(self) -> float:
        padded = self.padding_tokens + self.tokens
        return self.padding_tokens / padded if padded else 0.0

    def to_dict(self) -> dict:
        return {"buckets": self.buckets, "edges": list(self.edges), "padding_tokens": self.padding_tokens,
                "padding_waste": self.padding_waste}


def length_histogram(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct lengths, ascending, and how many samples have each."""
    array = _lengths(lengths)
    values, counts = np.unique(array, return_counts=True)
    return values.astype(np.int64), counts.astype(np.int64)


def power_of_two_histogram(lengths: np.ndarray) -> list[tuple[int, int, int]]:
    """``(low, high, count)`` for the bins ``[0, 1), [1, 2), [2, 4), [4, 8), ...``
    from the shortest sample's bin to the longest's."""
    array = _lengths(lengths).astype(np.int64)
    bins = np.frexp(array.astype(np.float64))[1].astype(np.int64)  # the bit length, exact below 2^53
    counts = np.bincount(bins)
    first = int(bins.min())
    return [(0 if b == 0 else 1 << (b - 1), 1 << b if b else 1, int(counts[b])) for b in range(first, len(counts))]


def percentiles(lengths: np.ndarray, points: tuple[float, ...] = PERCENTILES) -> dict[float, int]:
    """Nearest-rank percentiles: each is the length of an actual sample (the
    smallest length with at least p % of the samples at or below it)."""
    array = _lengths(lengths)
    values = np.percentile(array, points, method="inverted_cdf")
    return {float(p): int(v) for p, v in zip(points, values)}


def optimal_bucket_edges(lengths: np.ndarray, buckets: int) -> BucketChoice:
    """The edges of ``buckets`` buckets with the least padding (fewer edges
    when there are fewer distinct lengths: then every length is an edge and
    nothing is padded)."""
    return optimal_bucket_choices(lengths, buckets)[-1]


def optimal_bucket_choices(lengths: np.ndarray, max_buckets: int) -> list[BucketChoice]:
    """:func:`optimal_bucket_edges` for 1, 2, ..., ``max_buckets`` buckets,
    or up to the number of distinct lengths when that is smaller (one pass:
    row t of the table serves t buckets)."""
    max_buckets = checks.integer(max_buckets, "the number of buckets", 1, None, message=checks.POSITIVE,
                                 fail=checks.raising(errors.LENGTHS_INVALID, operator=errors.BATCHING_OPERATOR))
    values, counts = length_histogram(lengths)
    return _choices(values, counts, max_buckets)


def _choices(values: np.ndarray, counts: np.ndarray, max_buckets: int) -> list[BucketChoice]:
    m = values.shape[0]
    count_sum = np.concatenate(([0], np.cumsum(counts)))
    token_sum = np.concatenate(([0], np.cumsum(counts * values)))
    if int(values[-1]) * int(count_sum[-1]) >= int(_INF):
        raise UmlosError(errors.LENGTHS_INVALID, "lengths times samples exceed 2^62; the padding cannot be "
                         "computed exactly in 64 bits", operator=errors.BATCHING_OPERATOR)
    tokens = int(token_sum[-1])
    j = np.arange(m + 1)
    row = np.full(m + 1, _INF, dtype=np.int64)
    row[1:] = values[j[1:] - 1] * count_sum[1:] - token_sum[1:]  # one bucket: everything padded to v_j
    splits = []
    rows = [row]
    for t in range(2, min(max_buckets, m) + 1):
        row, split = _next_row(rows[-1], t, values, count_sum, token_sum)
        rows.append(row)
        splits.append(split)
    choices = []
    for used in range(1, min(max_buckets, m) + 1):
        edges, end = [], m
        for level in range(used, 0, -1):
            edges.append(int(values[end - 1]))
            end = int(splits[level - 2][end]) if level > 1 else 0
        choices.append(BucketChoice(tuple(reversed(edges)), int(rows[used - 1][m]), tokens))
    return choices


def _next_row(previous: np.ndarray, t: int, values: np.ndarray, count_sum: np.ndarray,
              token_sum: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row t of the table from row t-1, by divide and conquer on the
    monotone leftmost argmin, one NumPy pass per level of the recursion."""
    m = values.shape[0]
    row = np.full(m + 1, _INF, dtype=np.int64)
    split = np.zeros(m + 1, dtype=np.int64)
    # Pending ranges: columns j in [j_lo, j_hi], splits i in [i_lo, i_hi].
    j_lo, j_hi = np.array([t]), np.array([m])
    i_lo, i_hi = np.array([t - 1]), np.array([m - 1])
    while j_lo.size:
        mid = (j_lo + j_hi) // 2
        low, high = i_lo, np.minimum(i_hi, mid - 1)
        sizes = high - low + 1
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        offsets = np.arange(int(sizes.sum())) - np.repeat(starts, sizes)
        i = np.repeat(low, sizes) + offsets
        jj = np.repeat(mid, sizes)
        cost = previous[i] + values[jj - 1] * (count_sum[jj] - count_sum[i]) - (token_sum[jj] - token_sum[i])
        best_cost = np.minimum.reduceat(cost, starts)
        at_best = np.flatnonzero(cost == np.repeat(best_cost, sizes))
        best = i[at_best[np.searchsorted(at_best, starts)]]  # the leftmost minimum of each range
        row[mid] = best_cost
        split[mid] = best
        left = j_lo <= mid - 1
        right = mid + 1 <= j_hi
        j_lo, j_hi, i_lo, i_hi = (np.concatenate((j_lo[left], mid[right] + 1)),
                                  np.concatenate((mid[left] - 1, j_hi[right])),
                                  np.concatenate((i_lo[left], best[right])),
                                  np.concatenate((best[left], i_hi[right])))
    return row, split


def _lengths(lengths) -> np.ndarray:
    array = np.asarray(lengths)
    if array.ndim != 1 or array.size == 0 or array.dtype.kind not in "iu":
        raise UmlosError(errors.LENGTHS_INVALID, "statistics need a non-empty one-dimensional integer array of "
                         f"lengths, got shape {array.shape} dtype {array.dtype}", operator=errors.BATCHING_OPERATOR)
    if array.dtype.kind == "i" and int(array.min()) < 0:
        raise UmlosError(errors.LENGTHS_INVALID, f"lengths are non-negative, got {int(array.min())}",
                         operator=errors.BATCHING_OPERATOR)
    return array
