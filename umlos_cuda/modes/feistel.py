"""Sampling mode ``feistel``: the whole epoch through one keyed Feistel bijection.

Position ``p`` of an epoch of ``N`` samples holds index ``feistel_permute(p)``
(docs/spec/feistel.md): a keyed Feistel network on the smallest bit width that
covers ``[0, N)``, cycle-walking back into range. The round keys are two
Philox draws of the epoch seed in their own domain (R4, domain 3), so the plan
is four words whatever ``N`` is: no block tables, O(1) epoch setup, O(1)
random access, and an order as well mixed as a true permutation.

The trade-off against ``block_affine``: consecutive positions read samples
from anywhere in the dataset (no I/O locality inside a block).

Where its pieces live: the NumPy twin in ``umlos_cuda/feistel.py``; the device
and host C++ in ``kernels/feistel.cuh``; the CUDA launchers in
``kernels/feistel.cu``; the native entry point ``feistel_map`` in
``umlos_cuda/_native.cpp``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .. import reference
from ..feistel import feistel_invert, feistel_key, feistel_permute
from .base import SamplingMode

NAME = "feistel"
#: The R9 ``sampling_mode`` strings of this order.
TRAIN_MODE = "SHUFFLE_WITHOUT_REPLACEMENT_FEISTEL_V1"
STREAMING_MODE = "STREAMING_SHUFFLE_FEISTEL_V1"
#: R9's tokens after ``[sampling_mode, S, drop_last]``.
CONFIG_TOKENS = ("epoch_seed_rule_v2", "feistel_cycle_walk_v1", "rank_contiguous_shard_v1")
#: The R4 draw domain of the round keys (draws 0 and 1).
DOMAIN = reference.DOMAIN_FEISTEL
#: Positions mapped per step of the NumPy map: small enough that the round's
#: arrays stay in the core's cache (2^14 is about three times faster than 2^18).
MAP_CHUNK = 1 << 14


@dataclass(frozen=True, eq=False)
class FeistelPlan:
    """One epoch: ``n`` and the four packed round-key words (``keys``)."""

    mode: ClassVar[str] = NAME

    n: int
    keys: tuple[int, int, int, int]

    def kernel_tables(self) -> tuple[np.ndarray, ...]:
        return ()

    def kernel_params(self) -> tuple[np.generic, ...]:
        """``(n, key0, key1, key2, key3)``, all uint64."""
        return (np.uint64(self.n), *(np.uint64(word) for word in self.keys))


def build_plan(seed16: bytes, n: int, block_size: int) -> FeistelPlan:
    """The epoch's round keys: draws 0 and 1 of domain 3 (the block size is not used)."""
    key, w2, w3 = reference.philox_key_words(seed16)
    return FeistelPlan(int(n), feistel_key(key, w2, w3, DOMAIN, 0))


def map_positions(plan: FeistelPlan, start: int, count: int, out: np.ndarray, stride: int = 1) -> np.ndarray:
    """Indices of positions ``start + i * stride`` (``i < count``) into the uint64 array ``out``."""
    for offset in range(0, count, MAP_CHUNK):
        length = min(MAP_CHUNK, count - offset)
        p = np.arange(length, dtype=np.uint64)
        if stride != 1:
            p *= np.uint64(stride)
        p += np.uint64(start + offset * stride)
        out[offset : offset + length] = feistel_permute(p, plan.n, plan.keys)
    return out


def invert(plan: FeistelPlan, indices: np.ndarray) -> np.ndarray:
    """Positions of sample ``indices`` (each ``< n``) in the epoch: the bijection backwards."""
    return feistel_invert(np.asarray(indices, dtype=np.uint64), plan.n, plan.keys)


MODE = SamplingMode(
    name=NAME,
    train_sampling_mode=TRAIN_MODE,
    streaming_sampling_mode=STREAMING_MODE,
    config_tokens=CONFIG_TOKENS,
    build_plan=build_plan,
    reference_map=map_positions,
    plan_blocks=lambda n, block_size: 0,
    native_map="feistel_map",
    cuda_source="feistel.cu",
    cuda_map={"uint64": "umlos_feistel_map_u64", "int64": "umlos_feistel_map_i64", "int32": "umlos_feistel_map_i32"},
    inverse=invert,
)
