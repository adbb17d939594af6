"""R1 Philox4x32-10 (known answers), R4 draws and the 128-bit high product."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

import oracle
from umlos_cuda import philox

U32 = st.integers(0, 2**32 - 1)
U64 = st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 2**32 - 1, 2**32, 2**63, 2**64 - 2, 2**64 - 1]))


@pytest.mark.parametrize("counter,key,expected", oracle.PHILOX_KATS)
def test_engine_matches_r1_known_answers(counter, key, expected):
    words = philox.philox4x32_10(*counter, *key)
    assert tuple(int(w) for w in words) == expected


@pytest.mark.parametrize("counter,key,expected", oracle.PHILOX_KATS)
def test_oracle_matches_r1_known_answers(counter, key, expected):
    assert oracle.philox4x32_10(counter, key) == expected


def test_known_answers_vectorised_in_one_call():
    """All three KAT counters as one array: lanes do not leak into each other.

    The key differs per KAT, so the lanes share key 0 and are checked against
    the oracle, then the first lane against the table."""
    counters = np.array([kat[0] for kat in oracle.PHILOX_KATS], dtype=np.uint64).T
    words = philox.philox4x32_10(*counters, 0, 0)
    for lane, (counter, _, _) in enumerate(oracle.PHILOX_KATS):
        assert tuple(int(w[lane]) for w in words) == oracle.philox4x32_10(counter, (0, 0))
    assert tuple(int(w[0]) for w in words) == oracle.PHILOX_KATS[0][2]


@given(st.tuples(U32, U32, U32, U32), st.tuples(U32, U32))
def test_engine_matches_oracle_on_random_counters(counter, key):
    words = philox.philox4x32_10(*counter, *key)
    assert tuple(int(w) for w in words) == oracle.philox4x32_10(counter, key)


@given(st.lists(U64, min_size=1, max_size=40), st.binary(min_size=16, max_size=16), st.sampled_from([1, 2, 3, 7]))
def test_r4_draws_match_oracle(draw_numbers, seed16, domain):
    w0, w1, w2, w3 = oracle.seed_words(seed16)
    r0, r1 = philox.philox_draws(np.array(draw_numbers, dtype=np.uint64), (w0, w1), w2, w3, domain)
    for n, a, b in zip(draw_numbers, r0.tolist(), r1.tolist()):
        assert (int(a), int(b)) == oracle.draw(seed16, n, domain)


def test_domains_give_different_streams():
    seed16 = bytes(range(16))
    assert oracle.draw(seed16, 5, 1) != oracle.draw(seed16, 5, 2)
    w0, w1, w2, w3 = oracle.seed_words(seed16)
    d1 = philox.philox_draws(np.arange(8, dtype=np.uint64), (w0, w1), w2, w3, 1)[0]
    d2 = philox.philox_draws(np.arange(8, dtype=np.uint64), (w0, w1), w2, w3, 2)[0]
    assert not np.array_equal(d1, d2)


@given(st.lists(st.tuples(U64, U64), min_size=1, max_size=50))
def test_mulhi64_is_the_exact_high_half(pairs):
    a = np.array([p[0] for p in pairs], dtype=np.uint64)
    b = np.array([p[1] for p in pairs], dtype=np.uint64)
    high = philox.mulhi64(a, b)
    assert [int(h) for h in high.tolist()] == [(x * y) >> 64 for x, y in pairs]


def test_mulhi64_extremes():
    top = 2**64 - 1
    assert int(philox.mulhi64(np.uint64(top), np.uint64(top))) == (top * top) >> 64 == top - 1
    assert int(philox.mulhi64(np.uint64(2**32), np.uint64(2**32))) == 1
    assert int(philox.mulhi64(np.uint64(top), np.uint64(1))) == 0
