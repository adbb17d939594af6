"""One epoch's O(num_blocks) state: the epoch seed (R4), the block order (R5) and
the per-block affine tables (R6).

Everything proportional to the dataset is avoided: an epoch at N = 10^11 with
the default block size has 95,368 blocks, so its plan is about 3 MiB, and any
position's index is then O(1). Plans are cached (a few, LRU) because a training
loop asks for the same epoch thousands of times.
"""

from __future__ import annotations

import os
import struct
from collections import OrderedDict
from dataclasses import dataclass
from threading import Lock

import numpy as np

from . import errors
from .errors import UmlosError
from .hashing import hash_canonical, sha256

#: Largest number of blocks an epoch plan may have. Each block costs 40 bytes
#: (order + four table words), so the default bound is about 2.7 GB; past it the
#: call fails with BLOCK_TABLE_TOO_LARGE instead of exhausting memory. Raise it
#: with UMLOS_MAX_BLOCKS on a machine that has the memory.
DEFAULT_MAX_BLOCKS = 1 << 26

#: Plans kept per process.
PLAN_CACHE_SIZE = 8


def epoch_seed(replay_token: bytes, manifest_hash: bytes, dataset_key: str, epoch: int) -> bytes:
    """R4 / seed 000 §3: the 16-byte Philox seed of one epoch."""
    return hash_canonical(["nextbatch_epoch_seed_v2", replay_token, manifest_hash, dataset_key, epoch])[:16]


def philox_key_words(seed16: bytes) -> tuple[tuple[int, int], int, int]:
    """Split an epoch seed into the Philox key ``(w0, w1)`` and counter words ``w2, w3`` (R4)."""
    w0, w1, w2, w3 = struct.unpack("<4I", seed16)
    return (w0, w1), w2, w3


@dataclass(frozen=True, eq=False)
class EpochPlan:
    """Tables indexed by *virtual* block ``b = position // block_size``.

    ``base[b]``, ``m[b]``, ``a[b]``, ``c[b]`` describe block ``b``'s bijection
    ``l -> base + (a*l + c) mod m``; the full blocks are permuted by
    ``block_order`` and the short tail block (if any) is last and fixed.
    """

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

    @property
    def epoch_seed_hash(self) -> str:
        """SHA-256 of the epoch seed (hex): the trace's ``epoch_seed_hash`` (seed 000 §7)."""
        return sha256(self.epoch_seed).hex()


def count_blocks(n: int, block_size: int) -> int:
    return n // block_size + (1 if n % block_size else 0)


def check_block_budget(n: int, block_size: int) -> None:
    limit = int(os.environ.get("UMLOS_MAX_BLOCKS", DEFAULT_MAX_BLOCKS))
    blocks = count_blocks(n, block_size)
    if blocks > limit:
        raise UmlosError(
            errors.BLOCK_TABLE_TOO_LARGE,
            f"N = {n} with sampler_block_size = {block_size} needs {blocks} blocks; "
            f"the limit is {limit} (raise UMLOS_MAX_BLOCKS, or use a larger sampler_block_size; "
            f"the default is {1 << 20})",
        )


def build_plan_reference(seed16: bytes, n: int, block_size: int) -> EpochPlan:
    """Build a plan with the NumPy reference functions."""
    from .reference import block_affine_params, seeded_block_permute

    key, w2, w3 = philox_key_words(seed16)
    num_full = n // block_size
    order = seeded_block_permute(num_full, key, w2, w3)
    perm_ids = order if n % block_size == 0 else np.append(order, np.uint64(num_full))
    base, m, a, c = block_affine_params(perm_ids, n, block_size, key, w2, w3)
    return EpochPlan(n, block_size, seed16, key, w2, w3, order, base, m, a, c)


class PlanCache:
    """A small thread-safe LRU of epoch plans, keyed by what determines them."""

    def __init__(self, size: int = PLAN_CACHE_SIZE) -> None:
        self._size = size
        self._plans: OrderedDict[tuple, EpochPlan] = OrderedDict()
        self._lock = Lock()

    def get(self, key: tuple, build) -> EpochPlan:
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
                return plan
        plan = build()
        with self._lock:
            self._plans[key] = plan
            while len(self._plans) > self._size:
                self._plans.popitem(last=False)
        return plan

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()
