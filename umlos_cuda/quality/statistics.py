"""How well an epoch's order mixes a dataset: the report's five statistics.

Each function takes an epoch's order (``order[p]`` is the sample index at
position ``p``, a permutation of ``[0, N)``) and returns plain numbers, with
what a uniformly random permutation would give named beside it, so a reader
can tell good from bad without a second run:

* :func:`batch_class_tv`: how far each global batch's class mix is from the
  dataset's (total-variation distance; 0 = the same mix). On data stored
  sorted by class, an order that stays in one region for a whole batch sees
  a few classes per batch and scores near 1.
* :func:`jump_statistics`: the distribution of ``|order[p+1] - order[p]|``;
  a random permutation's is known exactly (:func:`random_jump_cdf`), and the
  Kolmogorov-Smirnov distance from it says how far from random the steps are.
  An affine map inside blocks takes the same step again and again.
* :func:`spearman_position_index`: rank correlation of position and index
  (0 for a random order, 1 for the identity): an order that walks through the
  data front to back scores high.
* :func:`chi_square_independence`: a test that the position's bucket and the
  index's bucket are independent (``K x K`` table); a random permutation
  passes at any size, an order that keeps regions of the epoch on regions of
  the data fails, and so does one that spreads them too evenly (a lattice).
* :func:`first_batch_overlap`: the samples that consecutive epochs' first
  batches share (a random order shares ``B / N`` of a batch on average).

Everything is vectorised NumPy, O(N) time and memory (one sort of each batch
for the class mix), so N = 10^7 takes about a second per order.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from .. import checks, errors
from ..errors import QUALITY_OPERATOR as OPERATOR, UmlosError
from .chi2 import chi2_sf

#: Positions compared per step of the jump distribution (bounds temporaries).
_CHUNK = 1 << 22


def _error(message: str) -> UmlosError:
    return UmlosError(errors.INVALID_ARGUMENT, message, operator=OPERATOR)


def class_frequencies(labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Each class's share of the dataset (``labels`` are class ids in ``[0, num_classes)``)."""
    return np.bincount(labels, minlength=num_classes) / float(labels.size)


def batch_class_tv(batch_labels: np.ndarray, batch_size: int, frequencies: np.ndarray) -> np.ndarray:
    """Total-variation distance of every full batch's class histogram from ``frequencies``.

    ``batch_labels`` is the class of each position in epoch order
    (``labels[order]``); the batches are its consecutive runs of
    ``batch_size`` (a partial last batch is left out). For a batch with
    ``x_c`` samples of class ``c``, ``TV = 1/2 Σ_c |x_c / B - q_c|``,
    summed here over the classes the batch holds only
    (``1/2 (1 + Σ_{x_c > 0} (|x_c / B - q_c| - q_c))``), so the cost does not
    grow with the number of classes.
    """
    batch_size = checks.integer(batch_size, "batch_size", 1, None, fail=_error,
                                message=(checks.AT_LEAST, "{name} must be at least {low}, got {value}"))
    batches = batch_labels.size // batch_size
    if batches == 0:
        raise _error(f"{batch_labels.size} positions hold no full batch of {batch_size}")
    rows = np.sort(batch_labels[: batches * batch_size].reshape(batches, batch_size), axis=1)
    flat = rows.ravel()
    first = np.ones(flat.size, dtype=bool)
    first[1:] = flat[1:] != flat[:-1]
    first[::batch_size] = True  # a new batch starts a new run
    starts = np.flatnonzero(first)
    counts = np.diff(np.append(starts, flat.size))
    share = frequencies[flat[starts]]
    terms = np.abs(counts / batch_size - share) - share
    return 0.5 * (1.0 + np.bincount(starts // batch_size, weights=terms, minlength=batches))


def random_jump_cdf(k: np.ndarray, n: int) -> np.ndarray:
    """``P(|π(p+1) - π(p)| <= k)`` for a uniformly random permutation ``π`` of ``[0, n)``.

    Two distinct uniform values differ by ``j`` in ``2 (n - j)`` of the
    ``n (n - 1)`` ordered pairs, so the CDF is ``k (2n - k - 1) / (n (n - 1))``.
    """
    k = np.asarray(k, dtype=np.float64)
    return k * (2.0 * n - k - 1.0) / (float(n) * (n - 1.0))


@dataclass(frozen=True)
class JumpStatistics:
    """The distribution of ``|order[p+1] - order[p]|`` over an epoch.

    ``median`` and ``mean`` are in samples; ``ks`` is the largest distance
    between its CDF and :func:`random_jump_cdf` (0 = exactly as random).
    ``quantiles`` are the jumps at ``QUANTILE_LEVELS`` (for the figure).
    """

    n: int
    median: int
    mean: float
    ks: float
    quantiles: np.ndarray

    #: Levels of ``quantiles``: 0.1 %, then 1 % .. 99 %, then 99.9 %.
    QUANTILE_LEVELS = np.concatenate(([0.001], np.linspace(0.01, 0.99, 99), [0.999]))


def jump_statistics(order: np.ndarray) -> JumpStatistics:
    """:class:`JumpStatistics` of an epoch's order (N >= 2), exactly, in O(N)."""
    n = int(order.size)
    if n < 2:
        raise _error(f"the jump distribution needs at least 2 positions, got {n}")
    signed = order.astype(np.int64, copy=False)
    counts = np.zeros(n, dtype=np.int64)  # counts[k]: jumps of size k (1 <= k <= n - 1 in a permutation)
    total = 0
    for start in range(0, n - 1, _CHUNK):
        steps = np.abs(np.diff(signed[start : start + _CHUNK + 1]))
        total += int(steps.sum())
        found = np.bincount(steps)
        counts[: found.size] += found
    cumulative = np.cumsum(counts)
    jumps = n - 1
    ks = 0.0
    for start in range(0, n, _CHUNK):
        k = np.arange(start, min(start + _CHUNK, n))
        ks = max(ks, float(np.max(np.abs(cumulative[k] / jumps - random_jump_cdf(k, n)))))
    levels = JumpStatistics.QUANTILE_LEVELS
    quantiles = np.searchsorted(cumulative, np.ceil(levels * jumps), side="left")
    median = int(np.searchsorted(cumulative, (jumps + 1) // 2, side="left"))
    return JumpStatistics(n, median, total / jumps, ks, quantiles)


def spearman_position_index(order: np.ndarray) -> float:
    """Spearman's rank correlation of position and index over an epoch.

    Position and index are both permutations of ``[0, N)``, so they are their
    own ranks and ``ρ = 1 - 6 Σ (order[p] - p)^2 / (N (N^2 - 1))`` exactly (no
    ties). 0 for a random order, 1 for ``0, 1, 2, ...``, -1 for the reverse.
    """
    n = int(order.size)
    if n < 2:
        raise _error(f"Spearman's correlation needs at least 2 positions, got {n}")
    squares = 0.0
    for start in range(0, n, _CHUNK):
        positions = np.arange(start, min(start + _CHUNK, n), dtype=np.float64)
        d = order[start : start + _CHUNK].astype(np.float64) - positions
        squares += float(np.dot(d, d))
    return 1.0 - 6.0 * squares / (float(n) * (float(n) * n - 1.0))


@dataclass(frozen=True)
class ChiSquare:
    """A chi-square test of independence on a ``K x K`` contingency table."""

    statistic: float
    dof: int
    p_value: float
    table: np.ndarray

    def passes(self, alpha: float) -> bool:
        """``alpha <= p <= 1 - alpha``: neither too far from independence (small
        p) nor too close to it (p near 1). A true shuffle's table fluctuates
        like a random one; an affine map's is too even, a lattice, which a
        one-sided test would call a pass (Knuth, TAOCP vol. 2, §3.3.1, reads
        chi-square p-values of random-number tests this way)."""
        return alpha <= self.p_value <= 1.0 - alpha


def chi_square_independence(order: np.ndarray, buckets: int) -> ChiSquare:
    """Pearson's chi-square test that position bucket and index bucket are independent.

    Positions and indices of ``[0, N)`` fall into ``buckets`` equal ranges
    (``p * K // N``); cell ``(i, j)`` counts the positions of bucket ``i``
    whose index is in bucket ``j``. Under independence its expected count is
    ``row_i * column_j / N``; the statistic ``Σ (O - E)^2 / E`` has
    ``(K - 1)^2`` degrees of freedom, and the p-value is :func:`~.chi2.chi2_sf`'s.
    """
    n = int(order.size)
    buckets = checks.integer(buckets, "buckets", 2, 1024, fail=_error,
                             message="{name} must be an integer in [{low}, {high}], got {value!r}")
    if n < buckets:
        raise _error(f"{n} positions cannot fill {buckets} buckets; use at most {n} buckets")
    table = np.zeros((buckets, buckets), dtype=np.int64)
    for start in range(0, n, _CHUNK):
        positions = np.arange(start, min(start + _CHUNK, n), dtype=np.uint64)
        row = positions * np.uint64(buckets) // np.uint64(n)
        column = order[start : start + _CHUNK].astype(np.uint64) * np.uint64(buckets) // np.uint64(n)
        table += np.bincount((row * np.uint64(buckets) + column).astype(np.int64),
                             minlength=buckets * buckets).reshape(buckets, buckets)
    expected = np.outer(table.sum(axis=1), table.sum(axis=0)) / float(n)
    statistic = float(np.sum((table - expected) ** 2 / expected))
    dof = (buckets - 1) ** 2
    return ChiSquare(statistic, dof, chi2_sf(statistic, dof), table)


def first_batch_overlap(first_batches: list[np.ndarray]) -> np.ndarray:
    """The share of each epoch's first batch found in the next epoch's first batch."""
    if len(first_batches) < 2:
        raise _error(f"the overlap of consecutive epochs needs at least 2 epochs, got {len(first_batches)}")
    return np.array([np.intersect1d(a, b).size / a.size for a, b in pairwise(first_batches)])
