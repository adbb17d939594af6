"""Philox4x32-10 (R1), vectorised over counters with NumPy.

A one-to-one twin of ``kernels/philox.cuh``: same round function, same
constants, same names. Counters are arrays (one lane per draw), the key is a
scalar pair; products are formed in uint64 so the high and low halves of the
32x32 multiply are exact. No Python loop per draw: ten rounds of array ops.
"""

from __future__ import annotations

import numpy as np

PHILOX_M0 = np.uint64(0xD2511F53)
PHILOX_M1 = np.uint64(0xCD9E8D57)
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
PHILOX_ROUNDS = 10

#: R1's known-answer vectors (Random123 ``kat_vectors``): (counter, key, output).
#: Every backend's Philox is checked against them (selftest, CuPy's create()).
PHILOX_KATS = (
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
)

_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)


def philox4x32_10(c0, c1, c2, c3, k0: int, k1: int):
    """Apply Philox4x32-10 to counters ``(c0, c1, c2, c3)`` under key ``(k0, k1)``.

    The counter words may be arrays or scalars (broadcast together); they are
    taken as uint32. Returns four uint64 arrays holding the uint32 output words
    ``(x0, x1, x2, x3)``.
    """
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) & _MASK32 for c in (c0, c1, c2, c3))
    c0, c1, c2, c3 = np.broadcast_arrays(c0, c1, c2, c3)
    k0 &= 0xFFFFFFFF
    k1 &= 0xFFFFFFFF
    for round_index in range(PHILOX_ROUNDS):
        if round_index:
            k0 = (k0 + PHILOX_W0) & 0xFFFFFFFF
            k1 = (k1 + PHILOX_W1) & 0xFFFFFFFF
        product0 = PHILOX_M0 * c0
        product1 = PHILOX_M1 * c2
        hi0, lo0 = product0 >> _SHIFT32, product0 & _MASK32
        hi1, lo1 = product1 >> _SHIFT32, product1 & _MASK32
        c0, c1, c2, c3 = (
            hi1 ^ c1 ^ np.uint64(k0),
            lo1,
            hi0 ^ c3 ^ np.uint64(k1),
            lo0,
        )
    return c0, c1, c2, c3


def philox_draws(draw_numbers, key: tuple[int, int], w2: int, w3: int, domain: int):
    """Draw ``(r0, r1)`` for each draw number ``n`` of ``domain`` (R4).

    The counter of draw ``n`` is ``(lo32(n), hi32(n), w2, w3 XOR domain)``; the
    output words give ``r0 = x0 | x1 << 32`` and ``r1 = x2 | x3 << 32``.
    """
    n = np.asarray(draw_numbers, dtype=np.uint64)
    x0, x1, x2, x3 = philox4x32_10(
        n & _MASK32, n >> _SHIFT32, np.uint64(w2), np.uint64((w3 ^ domain) & 0xFFFFFFFF), key[0], key[1]
    )
    return x0 | (x1 << _SHIFT32), x2 | (x3 << _SHIFT32)


def mulhi64(a, b):
    """High 64 bits of the exact 128-bit product of two uint64 arrays.

    NumPy has no 128-bit integers, so the product is assembled from four
    32x32 partial products, as ``__umul64hi`` does in hardware.
    """
    a = np.asarray(a, dtype=np.uint64)
    b = np.asarray(b, dtype=np.uint64)
    a_lo, a_hi = a & _MASK32, a >> _SHIFT32
    b_lo, b_hi = b & _MASK32, b >> _SHIFT32
    lo_lo = a_lo * b_lo
    lo_hi = a_lo * b_hi
    hi_lo = a_hi * b_lo
    middle = (lo_lo >> _SHIFT32) + (lo_hi & _MASK32) + (hi_lo & _MASK32)
    return a_hi * b_hi + (lo_hi >> _SHIFT32) + (hi_lo >> _SHIFT32) + (middle >> _SHIFT32)
