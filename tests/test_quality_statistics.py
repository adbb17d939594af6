"""The quality report's statistics against hand-computed values on tiny inputs
and against direct, slow computations of their definitions (umlos_cuda.quality)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from umlos_cuda import errors
from umlos_cuda.quality import (batch_class_tv, chi2_sf, chi_square_independence, first_batch_overlap,
                                jump_statistics, random_jump_cdf, spearman_position_index)
from umlos_cuda.quality.chi2 import regularized_gamma_q


# ------------------------------------------------------------------ chi-square survival function
def even_dof_sf(x: float, dof: int) -> float:
    """Closed form for even dof: exp(-x/2) * sum_{j < dof/2} (x/2)^j / j!."""
    half = x / 2.0
    return math.exp(-half) * sum(half**j / math.factorial(j) for j in range(dof // 2))


@pytest.mark.parametrize("x", [0.01, 0.5, 1.0, 2.0, 3.0, 7.5, 20.0, 60.0])
def test_chi2_sf_dof_2_is_exp(x):
    assert chi2_sf(x, 2) == pytest.approx(math.exp(-x / 2), rel=1e-12)


@pytest.mark.parametrize("x", [0.001, 0.3, 1.0, 3.841458820694124, 9.0, 40.0])
def test_chi2_sf_odd_dof_closed_forms(x):
    assert chi2_sf(x, 1) == pytest.approx(math.erfc(math.sqrt(x / 2)), rel=1e-12)
    three = math.erfc(math.sqrt(x / 2)) + math.sqrt(2 * x / math.pi) * math.exp(-x / 2)
    assert chi2_sf(x, 3) == pytest.approx(three, rel=1e-12)


def test_chi2_sf_textbook_critical_values():
    assert chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, rel=1e-9)
    assert chi2_sf(124.342, 100) == pytest.approx(0.05, abs=2e-5)  # tables: chi2_{0.95}(100) = 124.342


@pytest.mark.parametrize("dof", [4, 10, 50, 100, 224])
@pytest.mark.parametrize("ratio", [0.2, 0.8, 1.0, 1.3, 3.0])
def test_chi2_sf_even_dof_on_both_sides_of_the_switch(dof, ratio):
    x = ratio * dof  # below a + 1 the series runs, above it the continued fraction
    assert chi2_sf(x, dof) == pytest.approx(even_dof_sf(x, dof), rel=1e-10, abs=1e-300)


def test_chi2_sf_limits():
    assert chi2_sf(0.0, 225) == 1.0
    assert chi2_sf(-3.0, 1) == 1.0
    assert chi2_sf(1e9, 225) == 0.0  # underflows, as an order far from independent does
    assert regularized_gamma_q(3.0, math.inf) == 0.0


@pytest.mark.parametrize("dof", [0, -1, 1.5, True, 1024 * 1024])
def test_chi2_sf_refuses_a_bad_dof(dof):
    with pytest.raises(errors.UmlosError) as info:
        chi2_sf(1.0, dof)
    assert info.value.code == errors.INVALID_ARGUMENT
    assert info.value.record["failure_operator"] == errors.QUALITY_OPERATOR


# ------------------------------------------------------------------ batch class-mix TV
def test_batch_tv_by_hand():
    frequencies = np.array([0.5, 0.5])
    # batches {0, 0} and {1, 1}: each 1/2 (|1 - 1/2| + |0 - 1/2|) = 0.5
    assert batch_class_tv(np.array([0, 0, 1, 1]), 2, frequencies).tolist() == [0.5, 0.5]
    # batches {0, 1} twice: the dataset's mix
    assert batch_class_tv(np.array([0, 1, 1, 0]), 2, frequencies).tolist() == [0.0, 0.0]
    # three classes 1/2, 1/4, 1/4;
    # batch {0, 0, 0, 2}: 1/2 (1/4 + 1/4 + 0) = 1/4; batch {1, 1, 2, 0}: 1/2 (1/4 + 1/4 + 0) = 1/4
    frequencies = np.array([0.5, 0.25, 0.25])
    assert batch_class_tv(np.array([0, 0, 0, 2, 1, 1, 2, 0]), 4, frequencies) == pytest.approx([0.25, 0.25])
    # a partial last batch is left out
    assert batch_class_tv(np.array([0, 1, 0]), 2, np.array([0.5, 0.5])).tolist() == [0.0]


def test_batch_tv_equals_the_dense_definition():
    rng = np.random.default_rng(3)
    classes, batch = 37, 50
    labels = np.repeat(np.arange(classes), rng.integers(1, 60, classes))
    frequencies = np.bincount(labels, minlength=classes) / labels.size
    in_order = labels[rng.permutation(labels.size)]
    expected = [0.5 * np.abs(np.bincount(in_order[b : b + batch], minlength=classes) / batch - frequencies).sum()
                for b in range(0, in_order.size - batch + 1, batch)]
    assert batch_class_tv(in_order, batch, frequencies) == pytest.approx(expected, abs=1e-12)


def test_batch_tv_refuses_no_full_batch():
    for size, batch in ((3, 4), (3, 0)):
        with pytest.raises(errors.UmlosError) as info:
            batch_class_tv(np.zeros(size, dtype=np.int64), batch, np.array([1.0]))
        assert info.value.code == errors.INVALID_ARGUMENT


# ------------------------------------------------------------------ jumps
def test_jump_statistics_by_hand():
    # jumps |0-2| = 2, |3-0| = 3, |1-3| = 2; random CDF k(7-k)/12 = 0, 1/2, 5/6, 1 at k = 0..3;
    # empirical 0, 0, 2/3, 1: the largest gap is 1/2 at k = 1
    stats = jump_statistics(np.array([2, 0, 3, 1]))
    assert (stats.median, stats.mean) == (2, pytest.approx(7 / 3))
    assert stats.ks == pytest.approx(0.5)
    identity = jump_statistics(np.arange(4))
    assert (identity.median, identity.mean, identity.ks) == (1, 1.0, pytest.approx(0.5))


@pytest.mark.parametrize("n", [2, 3, 5, 6])
def test_random_jump_cdf_is_the_distribution_over_all_permutations(n):
    counts = np.zeros(n, dtype=np.int64)
    for permutation in itertools.permutations(range(n)):
        np.add.at(counts, np.abs(np.diff(permutation)), 1)
    cdf = np.cumsum(counts) / counts.sum()
    assert random_jump_cdf(np.arange(n), n) == pytest.approx(cdf, abs=1e-12)


def test_jump_statistics_equal_a_sort_of_the_jumps():
    order = np.random.default_rng(5).permutation(5000)
    stats = jump_statistics(order)
    jumps = np.sort(np.abs(np.diff(order)))
    assert stats.median == jumps[(jumps.size + 1) // 2 - 1]
    assert stats.mean == pytest.approx(jumps.mean())
    empirical = np.searchsorted(jumps, np.arange(order.size), side="right") / jumps.size
    assert stats.ks == pytest.approx(np.abs(empirical - random_jump_cdf(np.arange(order.size), order.size)).max())
    assert stats.ks < 0.05  # a random permutation's jumps are distributed as random_jump_cdf says


# ------------------------------------------------------------------ Spearman
def test_spearman_by_hand():
    assert spearman_position_index(np.arange(10)) == pytest.approx(1.0)
    assert spearman_position_index(np.arange(10)[::-1]) == pytest.approx(-1.0)
    # d = (1, -1, 0): 1 - 6 * 2 / (3 * 8) = 0.5
    assert spearman_position_index(np.array([1, 0, 2])) == pytest.approx(0.5)


def test_spearman_equals_pearson_of_ranks():
    order = np.random.default_rng(9).permutation(1000)
    ranks = np.argsort(np.argsort(order))
    assert spearman_position_index(order) == pytest.approx(np.corrcoef(np.arange(1000), ranks)[0, 1], abs=1e-12)


# ------------------------------------------------------------------ chi-square table
def test_chi_square_by_hand():
    # identity, 2 buckets: [[2, 0], [0, 2]], expected 1 per cell: (1 + 1 + 1 + 1) / 1 = 4, dof 1
    identity = chi_square_independence(np.arange(4), 2)
    assert identity.table.tolist() == [[2, 0], [0, 2]]
    assert (identity.statistic, identity.dof) == (4.0, 1)
    assert identity.p_value == pytest.approx(math.erfc(math.sqrt(2.0)))  # 0.0455
    assert not identity.passes(0.05) and identity.passes(0.01)
    # positions 0, 1 -> indices 0, 2 and positions 2, 3 -> 1, 3: one per cell, exactly the expected table
    even = chi_square_independence(np.array([0, 2, 1, 3]), 2)
    assert even.table.tolist() == [[1, 1], [1, 1]] and even.statistic == 0.0 and even.p_value == 1.0
    assert not even.passes(0.01)  # too even for a shuffle


def test_chi_square_equals_a_loop_over_the_definition():
    n, k = 1003, 5
    order = np.random.default_rng(11).permutation(n)
    table = np.zeros((k, k))
    for p, index in enumerate(order):
        table[p * k // n, index * k // n] += 1
    expected = np.outer(table.sum(1), table.sum(0)) / n
    statistic = ((table - expected) ** 2 / expected).sum()
    result = chi_square_independence(order, k)
    assert result.table.tolist() == table.tolist()
    assert result.statistic == pytest.approx(statistic, rel=1e-12)
    assert result.p_value == pytest.approx(chi2_sf(statistic, 16))


@pytest.mark.parametrize("buckets", [1, 1025, 2.0, True])
def test_chi_square_refuses_bad_buckets(buckets):
    with pytest.raises(errors.UmlosError) as info:
        chi_square_independence(np.arange(2000), buckets)
    assert info.value.code == errors.INVALID_ARGUMENT


# ------------------------------------------------------------------ overlap
def test_first_batch_overlap_by_hand():
    batches = [np.array([1, 2, 3, 4]), np.array([4, 3, 9, 8]), np.array([7, 6, 5, 0])]
    assert first_batch_overlap(batches).tolist() == [0.5, 0.0]
    with pytest.raises(errors.UmlosError):
        first_batch_overlap(batches[:1])
