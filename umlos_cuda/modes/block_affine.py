"""The default sampling mode, ``block_affine``: permuted blocks, an affine map inside each.

The epoch's positions are cut into blocks of ``sampler_block_size`` (2^20 by
default); the full blocks are shuffled by a seeded Fisher-Yates (R5,
SeededBlockPermute_v1) and each block's samples are visited in the order of
``l -> (a*l + c) mod m`` with ``a`` coprime to the block's length ``m`` (R6,
SeededIntraBlockMap_v1). A position's index is then O(1) from per-block
tables, and an epoch's plan is O(num_blocks): about 3 MiB at N = 10^11.

The trade-off: reads stay inside one block for ``block_size`` consecutive
positions (I/O locality), so a global batch sees one block's slice of the
data, not the whole dataset.

Where its pieces live: the NumPy twin in ``umlos_cuda/reference.py``; the
device and host C++ in ``kernels/block_affine.cuh``; the CUDA launchers in
``kernels/block_affine.cu``; the native entry points ``build_plan`` and
``map_positions`` in ``umlos_cuda/_native.cpp``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .. import reference
from .base import SamplingMode

NAME = "block_affine"
#: The R9 ``sampling_mode`` strings of this order.
TRAIN_MODE = "SHUFFLE_WITHOUT_REPLACEMENT_BLOCK_AFFINE_V1"
STREAMING_MODE = "STREAMING_SHUFFLE_BLOCK_AFFINE_V1"
#: R9's tokens after ``[sampling_mode, S, drop_last]``.
CONFIG_TOKENS = ("epoch_seed_rule_v2", "intra_block_affine_coprime_v1", "rank_contiguous_shard_v1")


@dataclass(frozen=True, eq=False)
class BlockAffinePlan:
    """Tables indexed by *virtual* block ``b = position // block_size``.

    ``base[b]``, ``m[b]``, ``a[b]``, ``c[b]`` describe block ``b``'s bijection
    ``l -> base + (a*l + c) mod m``; the full blocks are permuted by
    ``block_order`` and the short tail block (if any) is last and fixed.
    """

    mode: ClassVar[str] = NAME

    n: int
    block_size: int
    epoch_seed: bytes
    key: tuple[int, int]
    w2: int
    w3: int
    block_order: np.ndarray
    base: np.ndarray
    m: np.ndarray
    a: np.ndarray
    c: np.ndarray

    @property
    def num_full_blocks(self) -> int:
        return self.n // self.block_size

    @property
    def num_blocks(self) -> int:
        return int(self.base.shape[0])

    def kernel_tables(self) -> tuple[np.ndarray, ...]:
        return (self.base, self.m, self.a, self.c)

    def kernel_params(self) -> tuple[np.generic, ...]:
        return block_kernel_params(self.block_size)


@functools.lru_cache(maxsize=64)
def block_kernel_params(block_size: int) -> tuple[np.generic, ...]:
    """``(block_size, block_magic, block_info)``, the scalars of the block modes' map
    kernels: division by the block size without a 64-bit divide."""
    magic, info = reference.divider_params(block_size)
    return (np.uint64(block_size), magic, info)


def count_blocks(n: int, block_size: int) -> int:
    """Blocks of an epoch: the full ones and the short tail, if any."""
    return n // block_size + (1 if n % block_size else 0)


def build_plan(seed16: bytes, n: int, block_size: int) -> BlockAffinePlan:
    """An epoch's plan with the NumPy reference functions (R5, R6)."""
    key, w2, w3 = reference.philox_key_words(seed16)
    num_full = n // block_size
    order = reference.seeded_block_permute(num_full, key, w2, w3)
    perm_ids = order if n % block_size == 0 else np.append(order, np.uint64(num_full))
    base, m, a, c = reference.block_affine_params(perm_ids, n, block_size, key, w2, w3)
    return BlockAffinePlan(n, block_size, seed16, key, w2, w3, order, base, m, a, c)


def build_plan_native(native, seed16: bytes, n: int, block_size: int) -> BlockAffinePlan:
    """The same plan through the native extension's ``build_plan`` (draws, swaps and tables in one call)."""
    key, w2, w3 = reference.philox_key_words(seed16)
    order = np.empty(n // block_size, dtype=np.uint64)
    base, m, a, c = (np.empty(count_blocks(n, block_size), dtype=np.uint64) for _ in range(4))
    native.build_plan(n, block_size, key[0], key[1], w2, w3, order, base, m, a, c)
    return BlockAffinePlan(n, block_size, seed16, key, w2, w3, order, base, m, a, c)


def virtual_blocks(plan) -> np.ndarray:
    """The virtual block (place in the epoch's order) of each permuted block id:
    the inverse of R5's ``block_order``; the short tail block, if any, is its own."""
    num_full = plan.block_order.shape[0]
    virtual = np.empty(count_blocks(plan.n, plan.block_size), dtype=np.uint64)
    virtual[plan.block_order.astype(np.int64)] = np.arange(num_full, dtype=np.uint64)
    if virtual.shape[0] > num_full:
        virtual[num_full] = num_full
    return virtual


def invert(plan: BlockAffinePlan, indices: np.ndarray) -> np.ndarray:
    """Positions of sample ``indices`` (each ``< n``): the block holding each index
    (inverse block order), then ``l = a^-1 (r - c) mod m`` with ``a^-1`` the modular
    inverse of the block's multiplier (it exists: ``a`` is coprime with ``m``)."""
    indices = np.asarray(indices, dtype=np.uint64)
    block_size = np.uint64(plan.block_size)
    pb = indices // block_size
    b = virtual_blocks(plan)[pb]
    m = plan.m[b]
    r = indices - plan.base[b]
    shifted = np.where(r >= plan.c[b], r - plan.c[b], r + (m - plan.c[b]))  # (r - c) mod m, no wrap
    unique, where = np.unique(b, return_inverse=True)
    a_inverse = np.array(
        [pow(int(plan.a[block]), -1, int(plan.m[block])) if plan.m[block] > 1 else 0 for block in unique],
        dtype=np.uint64,
    )[where.reshape(-1)]
    local = reference.mulmod_add(a_inverse, shifted, np.zeros_like(m), m, int(m.max(initial=1)))
    return b * block_size + local


MODE = SamplingMode(
    name=NAME,
    train_sampling_mode=TRAIN_MODE,
    streaming_sampling_mode=STREAMING_MODE,
    config_tokens=CONFIG_TOKENS,
    build_plan=build_plan,
    reference_map=reference.map_positions,
    plan_blocks=count_blocks,
    build_plan_native=build_plan_native,
    native_map="map_positions",
    cuda_source="block_affine.cu",
    cuda_map={
        "uint64": "umlos_map_positions_u64",
        "int64": "umlos_map_positions_i64",
        "int32": "umlos_map_positions_i32",
    },
    inverse=invert,
)
