"""The keyed Feistel bijection of [0, n), NumPy twin of ``kernels/feistel.cuh``.

docs/spec/feistel.md is the normative text; the names here match the kernel
header's. In short, for ``1 <= n <= 2^64 - 1``:

* ``feistel_width(n)``: the cipher works on ``w = max(2, bit_length(n - 1))``
  bits, the smallest width that covers ``[0, n)`` (so ``2^w < 2n`` and
  cycle-walking costs fewer than two evaluations per index on average), split
  into a high half of ``w // 2`` bits and a low half of ``w - w // 2`` bits
  (unbalanced by one bit when ``w`` is odd);
* ``feistel_encrypt``: ``FEISTEL_ROUNDS`` rounds ``(a, b) -> (b, a XOR t)``
  with ``t`` the top bits of ``lo32(p) XOR hi32(p)``, ``p = (b XOR k_i) *
  FEISTEL_M`` (one 32x32 -> 64-bit multiply per round);
* ``feistel_permute``: cycle-walking, encrypt again while the value is ``>= n``;
* ``feistel_invert``: the rounds backwards, walking the other way.

The round keys are eight 32-bit words, packed two per uint64 as Philox
returns them (``r0, r1`` of two draws): ``keys[j] = k_{2j} | k_{2j+1} << 32``.
Every function is vectorised over a uint64 array of values and exact; the four
key words are ints (one bijection) or uint64 arrays shaped like the values
(one bijection per value, all of the same ``n``: mode ``block_feistel``).
"""

from __future__ import annotations

import numpy as np

from .philox import philox_draws

#: Rounds of the network (even, so the halves end where they began).
FEISTEL_ROUNDS = 8
#: The odd 32-bit multiplier of the round function (Philox4x32's M0).
FEISTEL_M = 0xD2511F53

_U32 = np.uint64(0xFFFFFFFF)
_32 = np.uint64(32)
_M = np.uint64(FEISTEL_M)


def feistel_width(n: int) -> int:
    """Bits the cipher works on for a domain of ``n`` values: ``max(2, bit_length(n - 1))``."""
    return max(2, (int(n) - 1).bit_length())


def feistel_halves(n: int) -> tuple[int, int]:
    """``(high_bits, low_bits)`` of the cipher for ``n``: ``w // 2`` and ``w - w // 2``."""
    width = feistel_width(n)
    return width >> 1, width - (width >> 1)


def feistel_round_keys(keys) -> list:
    """The eight 32-bit round keys ``k_0 .. k_7`` from four packed uint64 words
    (ints, or uint64 arrays: then each round key is an array)."""
    words = list(keys)
    if len(words) != FEISTEL_ROUNDS // 2:
        raise ValueError(f"a Feistel key is {FEISTEL_ROUNDS // 2} uint64 words, got {len(words)}")
    if all(isinstance(word, (int, np.integer)) for word in words):
        return [np.uint64((int(word) >> shift) & 0xFFFFFFFF) for word in words for shift in (0, 32)]
    arrays = [np.asarray(word, dtype=np.uint64) for word in words]
    return [(word >> np.uint64(shift)) & _U32 for word in arrays for shift in (0, 32)]


def feistel_key(key, w2: int, w3: int, domain: int, first_draw: int) -> tuple[int, int, int, int]:
    """The packed round keys of draws ``first_draw`` and ``first_draw + 1`` of ``domain``:
    ``(r0, r1)`` of the first draw, then ``(r0, r1)`` of the second."""
    draws = np.array([first_draw, first_draw + 1], dtype=np.uint64)
    r0, r1 = philox_draws(draws, key, w2, w3, domain)
    return int(r0[0]), int(r1[0]), int(r0[1]), int(r1[1])


def _xor_t(dst: np.ndarray, src: np.ndarray, k, shift: np.uint64, p: np.ndarray, t: np.ndarray) -> None:
    """``dst ^= t(src)`` in place: ``t = (lo32(p) XOR hi32(p)) >> (32 - width)`` for
    ``p = (src XOR k) * M``, computed in 64 bits as ``((p << 32) XOR p) >> (64 - width)``
    (the top 32 bits of ``(p << 32) XOR p`` are ``lo32(p) XOR hi32(p)``; ``shift = 64 - width``).
    ``p`` and ``t`` are scratch arrays: no temporaries, which keeps the data in cache."""
    np.bitwise_xor(src, k, out=p)
    np.multiply(p, _M, out=p)
    np.left_shift(p, _32, out=t)
    np.bitwise_xor(t, p, out=t)
    np.right_shift(t, shift, out=t)
    np.bitwise_xor(dst, t, out=dst)


def _halves(x: np.ndarray, low: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, dtype=np.uint64)
    return x >> np.uint64(low), x & np.uint64((1 << low) - 1)


def _join(a: np.ndarray, b: np.ndarray, low: int) -> np.ndarray:
    a <<= np.uint64(low)
    a |= b
    return a


def feistel_encrypt(x: np.ndarray, n: int, keys) -> np.ndarray:
    """One pass of the network over values ``x < 2^w`` (a new uint64 array).

    Two rounds at a time: round ``2j`` writes the high half ``a`` (``w // 2``
    bits), round ``2j + 1`` the low half ``b``, so ``(a, b) -> (b, a XOR t)``
    twice is ``a ^= t(b)`` then ``b ^= t(a)``, with no swap.
    """
    high, low = feistel_halves(n)
    k = feistel_round_keys(keys)
    shift_high, shift_low = np.uint64(64 - high), np.uint64(64 - low)
    a, b = _halves(x, low)
    p, t = np.empty_like(a), np.empty_like(a)
    for i in range(0, FEISTEL_ROUNDS, 2):
        _xor_t(a, b, k[i], shift_high, p, t)
        _xor_t(b, a, k[i + 1], shift_low, p, t)
    return _join(a, b, low)


def feistel_decrypt(y: np.ndarray, n: int, keys) -> np.ndarray:
    """The inverse of :func:`feistel_encrypt` (the same rounds, last to first)."""
    high, low = feistel_halves(n)
    k = feistel_round_keys(keys)
    shift_high, shift_low = np.uint64(64 - high), np.uint64(64 - low)
    a, b = _halves(y, low)
    p, t = np.empty_like(a), np.empty_like(a)
    for i in range(FEISTEL_ROUNDS - 2, -1, -2):
        _xor_t(b, a, k[i + 1], shift_low, p, t)
        _xor_t(a, b, k[i], shift_high, p, t)
    return _join(a, b, low)


def _walk(step, values: np.ndarray, n: int, keys) -> np.ndarray:
    """Apply ``step`` once, then again to every value still ``>= n`` (cycle-walking)."""
    out = step(values, n, keys)
    if n < 1 << feistel_width(n):
        limit = np.uint64(n)
        per_value = not all(isinstance(word, (int, np.integer)) for word in keys)
        pending = np.flatnonzero(out >= limit)
        while pending.size:
            moved = step(out[pending], n, [np.asarray(word)[pending] for word in keys] if per_value else keys)
            out[pending] = moved
            pending = pending[moved >= limit]
    return out


def feistel_permute(x: np.ndarray, n: int, keys) -> np.ndarray:
    """The bijection of ``[0, n)``: values ``x < n`` to their images (a new uint64 array)."""
    return _walk(feistel_encrypt, np.asarray(x, dtype=np.uint64), n, keys)


def feistel_invert(y: np.ndarray, n: int, keys) -> np.ndarray:
    """The inverse bijection: ``feistel_invert(feistel_permute(x)) == x`` for every ``x < n``."""
    return _walk(feistel_decrypt, np.asarray(y, dtype=np.uint64), n, keys)
