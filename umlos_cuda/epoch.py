"""One epoch: its seed (R4), its plan (built by the sampling mode), and the plan cache.

An epoch's order is a pure function of its 16-byte seed, the dataset's length
N and the sampler block size, through the plan its sampling mode builds
(``umlos_cuda.modes``). Nothing proportional to the dataset is built: the
default mode's plan at N = 10^11 with the default block size has 95,368
blocks, about 3 MiB, and any position's index is then O(1). Plans are cached
(a few, LRU) because a training loop asks for the same epoch thousands of times.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from threading import Lock

from . import checks, errors
from .errors import UmlosError
from .hashing import hash_canonical
from .modes import DEFAULT_MODE, Plan, get_mode
from .reference import philox_key_words

__all__ = [
    "DEFAULT_MAX_BLOCKS",
    "PLAN_CACHE_SIZE",
    "PlanCache",
    "build_plan_reference",
    "check_plan_budget",
    "epoch_seed",
    "philox_key_words",
]

#: Largest number of blocks an epoch plan may have. Each block of the default
#: mode costs 40 bytes (order + four table words), so the default bound is about
#: 2.7 GB; past it the call fails with BLOCK_TABLE_TOO_LARGE instead of
#: exhausting memory. Raise it with UMLOS_MAX_BLOCKS on a machine that has the memory.
DEFAULT_MAX_BLOCKS = 1 << 26

#: Plans kept per process.
PLAN_CACHE_SIZE = 8


def epoch_seed(replay_token: bytes, manifest_hash: bytes, dataset_key: str, epoch: int) -> bytes:
    """R4 (docs/spec/philox-and-hashing.md §4.1): the 16-byte Philox seed of one epoch."""
    return hash_canonical(["nextbatch_epoch_seed_v2", replay_token, manifest_hash, dataset_key, epoch])[:16]


def limit_setting(name: str, default: int, *, operator: str) -> int:
    """The limit in environment variable ``name`` (``default`` when unset), or
    INVALID_ARGUMENT when it is not a non-negative integer: a typo in a limit
    must not pass for no limit, nor end in a bare ValueError."""
    setting = os.environ.get(name, str(default))
    return checks.integer_text(setting, name, 0, None,
                               fail=lambda message: UmlosError(errors.INVALID_ARGUMENT, message, operator=operator),
                               message=checks.literal(f"{name} must be a non-negative integer, got {setting[:200]!r}"))


def check_plan_budget(blocks: int, n: int, block_size: int) -> None:
    """Refuse with BLOCK_TABLE_TOO_LARGE a plan of more than UMLOS_MAX_BLOCKS blocks."""
    limit = limit_setting("UMLOS_MAX_BLOCKS", DEFAULT_MAX_BLOCKS, operator=errors.BLOCK_PERMUTE_OPERATOR)
    if blocks > limit:
        raise UmlosError(
            errors.BLOCK_TABLE_TOO_LARGE,
            f"N = {n} with sampler_block_size = {block_size} needs {blocks} blocks; "
            f"the limit is {limit} (raise UMLOS_MAX_BLOCKS, or use a larger sampler_block_size; "
            f"the default is {1 << 20})",
            operator=errors.BLOCK_PERMUTE_OPERATOR,
        )


def build_plan_reference(seed16: bytes, n: int, block_size: int, mode: str = DEFAULT_MODE) -> Plan:
    """An epoch's plan of sampling mode ``mode``, built on the NumPy reference path."""
    return get_mode(mode).build_plan(seed16, n, block_size)


class PlanCache:
    """A small thread-safe LRU of epoch plans, keyed by what determines them."""

    def __init__(self, size: int = PLAN_CACHE_SIZE) -> None:
        self._size = size
        self._plans: OrderedDict[tuple, Plan] = OrderedDict()
        self._lock = Lock()

    def get(self, key: tuple, build) -> Plan:
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
