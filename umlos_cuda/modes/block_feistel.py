"""Sampling mode ``block_feistel``: permuted blocks, a keyed Feistel bijection inside each.

The blocks are ``block_affine``'s: the epoch's positions are cut into blocks
of ``sampler_block_size``, the full blocks shuffled by SeededBlockPermute_v1
(R5, domain 1) and the short tail block, if any, kept last. Inside the block
whose permuted id is ``pb`` the local position ``l`` goes through the Feistel
bijection of ``[0, m)`` (docs/spec/feistel.md) keyed by draws ``2 pb`` and
``2 pb + 1`` of R4 domain 4, instead of the affine map of R6 (docs/spec/feistel.md
§3.2 says why this replacement is allowed). A batch still reads one block (I/O locality), but
within it the order is as well mixed as a true permutation of the block.

The plan is O(num_blocks) as for ``block_affine``: per virtual block its base,
length and four round-key words (48 bytes), plus the block order.

Where its pieces live: the NumPy twin here and in ``umlos_cuda/feistel.py``;
the C++ in ``kernels/block_feistel.cuh`` and ``kernels/feistel.cuh``; the CUDA
launchers in ``kernels/block_feistel.cu``; the native entry points
``block_feistel_build_plan`` and ``block_feistel_map`` in ``umlos_cuda/_native.cpp``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .. import reference
from ..feistel import feistel_invert, feistel_permute
from ..philox import philox_draws
from .base import SamplingMode
from .block_affine import block_kernel_params, count_blocks, virtual_blocks
from .feistel import MAP_CHUNK  # the same rounds, the same cache-sized steps

NAME = "block_feistel"
#: The R9 ``sampling_mode`` strings of this order.
TRAIN_MODE = "SHUFFLE_WITHOUT_REPLACEMENT_BLOCK_FEISTEL_V1"
STREAMING_MODE = "STREAMING_SHUFFLE_BLOCK_FEISTEL_V1"
#: R9's tokens after ``[sampling_mode, S, drop_last]``.
CONFIG_TOKENS = ("epoch_seed_rule_v2", "intra_block_feistel_cycle_walk_v1", "rank_contiguous_shard_v1")
#: The R4 draw domain of the blocks' round keys (draws 2 pb and 2 pb + 1).
DOMAIN = reference.DOMAIN_BLOCK_FEISTEL


@dataclass(frozen=True, eq=False)
class BlockFeistelPlan:
    """Tables indexed by *virtual* block ``b = position // block_size``: block ``b``
    covers ``[base[b], base[b] + m[b])`` and its bijection's round keys are
    ``(k0[b], k1[b], k2[b], k3[b])``; ``block_order`` is R5's order of the full blocks."""

    mode: ClassVar[str] = NAME

    n: int
    block_size: int
    block_order: np.ndarray
    base: np.ndarray
    m: np.ndarray
    k0: np.ndarray
    k1: np.ndarray
    k2: np.ndarray
    k3: np.ndarray

    def kernel_tables(self) -> tuple[np.ndarray, ...]:
        return (self.base, self.m, self.k0, self.k1, self.k2, self.k3)

    def kernel_params(self) -> tuple[np.generic, ...]:
        """``(block_size, block_magic, block_info)``, as for ``block_affine``."""
        return block_kernel_params(self.block_size)

    def keys_of(self, blocks) -> tuple[np.ndarray, ...]:
        """The round-key words of virtual blocks ``blocks``."""
        return (self.k0[blocks], self.k1[blocks], self.k2[blocks], self.k3[blocks])


def block_feistel_params(perm_block_ids: np.ndarray, n: int, block_size: int, key, w2: int, w3: int):
    """``(base, m, k0, k1, k2, k3)`` of permuted block ids ``pb``: ``base = pb * S``,
    ``m = min(S, N - base)``, and ``(r0, r1)`` of draws ``2 pb`` and ``2 pb + 1`` of domain 4."""
    pb = np.asarray(perm_block_ids, dtype=np.uint64)
    base = pb * np.uint64(block_size)
    m = np.minimum(np.uint64(block_size), np.uint64(n) - base)
    first = pb * np.uint64(2)
    k0, k1 = philox_draws(first, key, w2, w3, DOMAIN)
    k2, k3 = philox_draws(first + np.uint64(1), key, w2, w3, DOMAIN)
    return base, m, k0, k1, k2, k3


def build_plan(seed16: bytes, n: int, block_size: int) -> BlockFeistelPlan:
    """An epoch's plan with the NumPy reference functions (R5 and the Feistel keys)."""
    key, w2, w3 = reference.philox_key_words(seed16)
    num_full = n // block_size
    order = reference.seeded_block_permute(num_full, key, w2, w3)
    perm_ids = order if n % block_size == 0 else np.append(order, np.uint64(num_full))
    tables = block_feistel_params(perm_ids, n, block_size, key, w2, w3)
    return BlockFeistelPlan(n, block_size, order, *tables)


def build_plan_native(native, seed16: bytes, n: int, block_size: int) -> BlockFeistelPlan:
    """The same plan through the native extension's ``block_feistel_build_plan``."""
    key, w2, w3 = reference.philox_key_words(seed16)
    order = np.empty(n // block_size, dtype=np.uint64)
    tables = [np.empty(count_blocks(n, block_size), dtype=np.uint64) for _ in range(6)]
    native.block_feistel_build_plan(n, block_size, key[0], key[1], w2, w3, order, *tables)
    return BlockFeistelPlan(n, block_size, order, *tables)


def _by_block_length(plan: BlockFeistelPlan, blocks: np.ndarray):
    """The positions of ``blocks`` grouped by their block's length: the full blocks
    (length ``block_size``) and the short tail block, each one bijection width."""
    lengths = plan.m[blocks]
    for m in np.unique(lengths):
        yield int(m), np.flatnonzero(lengths == m)


def map_positions(plan: BlockFeistelPlan, start: int, count: int, out: np.ndarray, stride: int = 1) -> np.ndarray:
    """Indices of positions ``start + i * stride`` (``i < count``) into the uint64 array ``out``:
    ``base[b] + feistel_permute(l, m[b], keys[b])`` with ``b, l = divmod(p, block_size)``."""
    block_size = np.uint64(plan.block_size)
    for offset in range(0, count, MAP_CHUNK):
        length = min(MAP_CHUNK, count - offset)
        p = np.arange(length, dtype=np.uint64)
        if stride != 1:
            p *= np.uint64(stride)
        p += np.uint64(start + offset * stride)
        b = p // block_size
        local = p - b * block_size
        target = out[offset : offset + length]
        for m, where in _by_block_length(plan, b):
            blocks = b[where]
            target[where] = plan.base[blocks] + feistel_permute(local[where], m, plan.keys_of(blocks))
    return out


def invert(plan: BlockFeistelPlan, indices: np.ndarray) -> np.ndarray:
    """Positions of sample ``indices`` (each ``< n``): the block holding each index
    (inverse block order), then the block's bijection backwards."""
    indices = np.asarray(indices, dtype=np.uint64)
    block_size = np.uint64(plan.block_size)
    pb = indices // block_size
    virtual = virtual_blocks(plan)[pb]
    local = indices - pb * block_size
    positions = np.empty_like(indices)
    for m, where in _by_block_length(plan, virtual):
        blocks = virtual[where]
        positions[where] = blocks * block_size + feistel_invert(local[where], m, plan.keys_of(blocks))
    return positions


MODE = SamplingMode(
    name=NAME,
    train_sampling_mode=TRAIN_MODE,
    streaming_sampling_mode=STREAMING_MODE,
    config_tokens=CONFIG_TOKENS,
    build_plan=build_plan,
    reference_map=map_positions,
    plan_blocks=count_blocks,
    build_plan_native=build_plan_native,
    native_map="block_feistel_map",
    cuda_source="block_feistel.cu",
    cuda_map={
        "uint64": "umlos_block_feistel_map_u64",
        "int64": "umlos_block_feistel_map_i64",
        "int32": "umlos_block_feistel_map_i32",
    },
    inverse=invert,
)
