"""The NumPy reference path, a one-to-one twin of the kernel headers
``kernels/nextbatch.cuh`` (what every sampling mode shares) and
``kernels/block_affine.cuh`` (the default mode: SeededBlockPermute_v1,
SeededIntraBlockMap_v1 and the position map).

Every backend must produce exactly these bits (resolutions R4-R7). The
functions keep the kernel headers' names and split the work the same way:

* ``philox_key_words``     R4: the epoch seed as Philox key and counter words;
* ``block_permute_j``      the Fisher-Yates draws of R5, one per swap (parallel);
* ``seeded_block_permute`` the sequential swaps, O(num_full_blocks);
* ``block_affine_params``  the per-block ``(m, a, c)`` of R6 (parallel);
* ``mulmod_add``           ``(a * x + c) mod m`` without wrapping;
* ``divider_params``       the invariant divider of the device map (``divider_make``);
* ``map_positions``        a window of positions (``start + i * stride``) to indices.

All arithmetic is uint64 and exact; nothing is proportional to N, only to the
number of blocks and to the window asked for.
"""

from __future__ import annotations

import struct

import numpy as np

from . import errors
from .errors import UmlosError
from .philox import mulhi64, philox_draws

#: R4 draw domains, one per use of an epoch's Philox stream (the list of
#: kernels/nextbatch.cuh): SeededBlockPermute draws from domain 1,
#: SeededIntraBlockMap from 2, the round keys of mode ``feistel`` from 3 and
#: those of each block of mode ``block_feistel`` from 4. A new sampling mode
#: takes a new number.
DOMAIN_BLOCK_PERMUTE = 1
DOMAIN_INTRA_BLOCK = 2
DOMAIN_FEISTEL = 3
DOMAIN_BLOCK_FEISTEL = 4

#: Positions processed per step of ``map_positions``: bounds the temporaries
#: (about ten uint64 arrays of this length) whatever the window size.
MAP_CHUNK = 1 << 18

_ONE = np.uint64(1)
_U32_LIMIT = 1 << 32


def philox_key_words(seed16: bytes) -> tuple[tuple[int, int], int, int]:
    """Split an epoch seed into the Philox key ``(w0, w1)`` and counter words ``w2, w3`` (R4).

    Twin of ``make_epoch_key``: the four words are read little-endian.
    """
    w0, w1, w2, w3 = struct.unpack("<4I", seed16)
    return (w0, w1), w2, w3


def block_permute_j(num_full_blocks: int, key, w2: int, w3: int) -> np.ndarray:
    """``j[i] = (r0 * (i + 1)) >> 64`` of draw ``i`` (domain 1), for i = 0..B-1.

    ``j[0]`` is unused (Fisher-Yates stops at i = 1) and set to 0, so that the
    array is indexed by ``i`` like the kernel's output buffer.
    """
    i = np.arange(num_full_blocks, dtype=np.uint64)
    r0, _ = philox_draws(i, key, w2, w3, DOMAIN_BLOCK_PERMUTE)
    j = mulhi64(r0, i + _ONE)
    if num_full_blocks:
        j[0] = 0
    return j


def seeded_block_permute(num_full_blocks: int, key, w2: int, w3: int) -> np.ndarray:
    """SeededBlockPermute_v1 (R5): Fisher-Yates over full blocks, ``B - 1`` draws.

    The draws are computed in parallel; only the swaps are sequential. They run
    over Python lists, which is about five times faster than indexing a NumPy
    array element by element.
    """
    j = block_permute_j(num_full_blocks, key, w2, w3).tolist()
    order = list(range(num_full_blocks))
    for i in range(num_full_blocks - 1, 0, -1):
        k = j[i]
        order[i], order[k] = order[k], order[i]
    return np.asarray(order, dtype=np.uint64)


def block_affine_params(perm_block_ids: np.ndarray, n: int, block_size: int, key, w2: int, w3: int):
    """SeededIntraBlockMap_v1's per-block parameters (R6) for permuted block ids ``pb``.

    Returns ``(base, m, a, c)`` with ``base = pb * block_size`` and
    ``m = min(block_size, N - base)``. For ``m = 1`` the map is the constant
    ``base``, which the uniform formula gives with ``a = c = 0``.
    """
    pb = np.asarray(perm_block_ids, dtype=np.uint64)
    base = pb * np.uint64(block_size)
    m = np.minimum(np.uint64(block_size), np.uint64(n) - base)
    k0, k1 = philox_draws(pb, key, w2, w3, DOMAIN_INTRA_BLOCK)
    a = np.zeros_like(m)
    c = np.zeros_like(m)
    multi = m > _ONE
    if np.any(multi):
        mm = m[multi]
        span = mm - _ONE  # candidates are 1..m-1
        cand = _ONE + k0[multi] % span
        # R6 (docs/spec/nextbatch-v2.md §3.2): scan cand, cand+1, ..., m-1, 1, 2, ... for the
        # first value coprime with m. Coprimes are dense, so a handful of
        # vectorised passes settle every block.
        pending = np.gcd(cand, mm) != _ONE
        while np.any(pending):
            nxt = np.where(cand[pending] < span[pending], cand[pending] + _ONE, _ONE)
            cand[pending] = nxt
            pending[pending] = np.gcd(nxt, mm[pending]) != _ONE
        a[multi] = cand
        c[multi] = k1[multi] % mm
    return base, m, a, c


def mulmod_add(a: np.ndarray, x: np.ndarray, c: np.ndarray, m: np.ndarray | np.uint64, max_m: int) -> np.ndarray:
    """``(a * x + c) mod m`` exactly, for ``a, x, c < m`` (uint64 arrays; ``m`` may be one uint64).

    When every ``m <= 2^32`` the product and sum fit in 64 bits:
    ``(m-1)^2 + (m-1) < 2^64``. Otherwise the 128-bit product is reduced bit by
    bit (``mulmod_u128`` in the kernel header), which is slow but exact; R6
    forbids wrapping silently.
    """
    if max_m <= _U32_LIMIT:
        return (a * x + c) % m
    hi = mulhi64(a, x)
    lo = a * x
    rem = hi % m
    top_bit = np.uint64(1 << 63)
    for bit in range(63, -1, -1):
        carry = rem >= top_bit
        rem = (rem << _ONE) | ((lo >> np.uint64(bit)) & _ONE)
        over = carry | (rem >= m)
        rem = np.where(over, rem - m, rem)  # wraps back into [0, m) when carry was set
    total = rem + c
    over = (total < rem) | (total >= m)
    return np.where(over, total - m, total)


# Divider flags of kernels/nextbatch.cuh.
DIVIDER_SHIFT_MASK = 0x3F
DIVIDER_ADD = 0x40
DIVIDER_POW2 = 0x80


def divider_params(d: int) -> tuple[np.uint64, np.uint32]:
    """``(magic, info)`` for dividing by ``d`` in the map kernels: twin of ``divider_make``.

    libdivide's unsigned 64-bit scheme: a power of two is a shift; otherwise
    ``q = mulhi64(magic, x) >> shift``, plus a fix-up add when the exact magic
    needs 65 bits.
    """
    d = int(d)
    if not 1 <= d < 1 << 64:
        raise UmlosError(errors.INVALID_ARGUMENT, f"a divisor must be in [1, 2^64 - 1], got {d}",
                         operator=errors.BACKEND_OPERATOR)
    floor_log2 = d.bit_length() - 1
    if d & (d - 1) == 0:
        return np.uint64(0), np.uint32(floor_log2 | DIVIDER_POW2)
    proposed, rem = divmod(1 << (64 + floor_log2), d)
    if d - rem < 1 << floor_log2:
        info = floor_log2
    else:
        proposed = 2 * proposed + (1 if 2 * rem >= d else 0)
        info = floor_log2 | DIVIDER_ADD
    return np.uint64((proposed + 1) & ((1 << 64) - 1)), np.uint32(info)


def map_positions(plan, start: int, count: int, out: np.ndarray, stride: int = 1) -> np.ndarray:
    """Indices of train positions ``start + i * stride``, ``i < count``, of an epoch, into ``out``.

    ``plan`` holds the per-virtual-block tables (``BlockAffinePlan``): for
    position ``p`` with ``b = p // block_size`` and ``l = p % block_size`` the
    index is ``base[b] + (a[b] * l + c[b]) mod m[b]``, as in the kernel. When
    the window covers long runs of each block (the usual case: blocks of 2^20),
    the run's parameters are scalars and the table gathers disappear, which
    makes the reference path several times faster; the arithmetic is the same.
    """
    if count == 0:
        return out
    block_size = plan.block_size
    first_block = start // block_size
    last_block = (start + (count - 1) * stride) // block_size
    if count >= RUN_THRESHOLD * (last_block - first_block + 1):
        return _map_by_block_runs(plan, start, count, out, stride)
    return _map_by_gather(plan, start, count, out, stride)


#: Use per-block runs when the window averages at least this many positions per block.
RUN_THRESHOLD = 64


def _map_by_block_runs(plan, start: int, count: int, out: np.ndarray, stride: int = 1) -> np.ndarray:
    block_size = plan.block_size
    i = 0
    while i < count:
        position = start + i * stride
        b = position // block_size
        local0 = position - b * block_size
        run = min(count - i, (block_size - local0 - 1) // stride + 1)  # positions left in block b
        m = int(plan.m[b])
        for offset in range(0, run, MAP_CHUNK):
            length = min(MAP_CHUNK, run - offset)
            local = np.arange(length, dtype=np.uint64)
            local *= np.uint64(stride)
            local += np.uint64(local0 + offset * stride)
            target = out[i + offset : i + offset + length]
            target[...] = mulmod_add(plan.a[b], local, plan.c[b], np.uint64(m), m)
            target += plan.base[b]
        i += run
    return out


def _map_by_gather(plan, start: int, count: int, out: np.ndarray, stride: int = 1) -> np.ndarray:
    block_size = np.uint64(plan.block_size)
    max_m = min(plan.block_size, plan.n)
    for offset in range(0, count, MAP_CHUNK):
        length = min(MAP_CHUNK, count - offset)
        p = np.arange(length, dtype=np.uint64)
        p *= np.uint64(stride)
        p += np.uint64(start + offset * stride)
        b = p // block_size
        local = p - b * block_size
        out[offset : offset + length] = plan.base[b] + mulmod_add(
            plan.a[b], local, plan.c[b], plan.m[b], max_m
        )
    return out
