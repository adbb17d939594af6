"""Plans over groups of adjacent rows: preference pairs that share a microbatch.

What goes in: the row lengths (``uint32 [N]``) and a :class:`BatchingConfig`
with ``group_size = 2``. What comes out: the lengths of the pairs the
planner plans as its units, the config it plans them with, and, after
planning, the epoch laid out as rows again. With ``group_size = 1`` (every
plan that is not of pairs) none of this runs and nothing changes.

A preference record is two adjacent rows of the length cache, chosen then
rejected (``data lengths build --prompt-field P --chosen-field C
--rejected-field R``; umlos_cuda/batching/lengths/pairs.py), so pair ``p``
is rows ``2p`` and ``2p + 1``. The rules, each one line of code below:

* **Order.** The epoch's order is the engine's over the ``P = N / 2`` pairs
  (the plan's manifest has cardinality P), so it does not depend on any
  world size, like every plan's.
* **Length of a pair.** Without packing, its longer row: both rows are
  padded to one width, and the pair's bucket is the longer row's. In a
  packed plan, ``chosen + separator_len + rejected``: the two rows sit side
  by side in one packed row (chosen first), so a pair is never split across
  packed rows, let alone microbatches.
* **Skipped.** A pair whose shorter row is below ``min_length``, or whose
  length (above) is over ``overflow_max``, is skipped whole: both rows are
  listed as skipped, neither is planned.
* **Budget.** Without packing, a microbatch of ``k`` pairs holds ``2k`` rows
  of ``max_len`` tokens, and ``2k x max_len <= token_budget`` exactly when
  ``k x max_len <= token_budget // 2``: the pairs are cut with half the
  budget (rounded down), by the same cutting rules as rows. A packed plan's
  budget counts packed rows, which pairs do not change.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ... import errors
from ...errors import UINT32_MAX
from .buckets import config_error
from .config import BatchingConfig
from .plan import plan_error


def check_group_rows(n: int, group_size: int) -> None:
    """BATCHING_CONFIG_INVALID unless the ``n`` rows split into whole groups."""
    if n % group_size:
        raise config_error(f"a plan of pairs (group_size {group_size}) needs an even number of rows, chosen then "
                           f"rejected for each pair; the lengths hold {n}")


def group_lengths(lengths: np.ndarray, config: BatchingConfig) -> np.ndarray:
    """The length of each pair (``uint32 [N / 2]``) by the rules of the module docstring."""
    rows = np.asarray(lengths, dtype=np.int64).reshape(-1, config.group_size)
    shortest = rows.min(axis=1)
    if config.pack is None:
        size = rows.max(axis=1)
    else:
        size = rows.sum(axis=1) + config.pack.separator_len * (config.group_size - 1)
    size = np.where(shortest < config.min_length, shortest, size)
    return np.minimum(size, UINT32_MAX).astype(np.uint32)


def row_group_lengths(lengths: np.ndarray, config: BatchingConfig) -> np.ndarray:
    """Each row's pair length (the lengths themselves when the plan is not of pairs): what
    decides a row's bucket and whether it is skipped, for ``plan verify``."""
    if config.group_size == 1:
        return np.asarray(lengths)
    return np.repeat(group_lengths(lengths, config), config.group_size)


def unit_config(config: BatchingConfig) -> BatchingConfig:
    """The config the pairs are planned with: one unit per pair, and without packing half the budget."""
    budget = config.token_budget if config.pack is not None else config.token_budget // config.group_size
    return replace(config, group_size=1, token_budget=budget)


def expand_epoch(arrays, group_size: int, dtype: np.dtype):
    """An epoch planned over pairs (an ``EpochArrays`` of pair numbers) as rows: pair ``p`` becomes
    rows ``2p, 2p + 1`` in place, and every count of samples doubles."""
    steps = np.arange(group_size, dtype=dtype)

    def rows(units: np.ndarray) -> np.ndarray:
        return (np.asarray(units).astype(dtype)[:, None] * dtype.type(group_size) + steps).reshape(-1)

    return replace(arrays, offsets=arrays.offsets * group_size, samples=rows(arrays.samples),
                   skipped=rows(arrays.skipped),
                   row_offsets=None if arrays.row_offsets is None else arrays.row_offsets * group_size)


def check_groups(epoch, group_size: int) -> None:
    """PLAN_SAMPLES_INVALID unless every microbatch (and every packed row) of ``epoch`` holds whole
    pairs, each as its rows ``2p, 2p + 1`` side by side."""
    e = epoch.epoch
    offsets = np.asarray(epoch.offsets, dtype=np.int64)
    bad = np.flatnonzero(offsets % group_size)
    if bad.size:
        raise _split(f"epoch {e}: microbatch {max(int(bad[0]) - 1, 0)} holds part of a pair (a plan of pairs keeps "
                     "both rows of each pair in one microbatch)")
    if epoch.row_offsets is not None:
        rows = np.flatnonzero(np.asarray(epoch.row_offsets, dtype=np.int64) % group_size)
        if rows.size:
            raise _split(f"epoch {e}: packed row {max(int(rows[0]) - 1, 0)} holds part of a pair (a packed plan of "
                         "pairs keeps both rows of each pair in one packed row)")
    samples = np.asarray(epoch.samples, dtype=np.int64).reshape(-1, group_size)
    broken = np.flatnonzero((samples[:, 0] % group_size != 0)
                            | np.any(samples != samples[:, :1] + np.arange(group_size), axis=1))
    if broken.size:
        j = int(np.searchsorted(offsets, int(broken[0]) * group_size, side="right")) - 1
        raise _split(f"epoch {e}: microbatch {j} does not hold the rows of one pair side by side (rows "
                     f"{samples[int(broken[0])].tolist()}; pair p is rows {group_size}p to {group_size}p + "
                     f"{group_size - 1})")


def _split(message: str):
    return plan_error(errors.PLAN_SAMPLES_INVALID, message)
