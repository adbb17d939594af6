"""Split a plan across ranks: global microbatch ``i`` goes to rank ``i % world_size``.

What goes in: a full plan, a rank and a world size. What comes out: a plan
holding only that rank's microbatches, each keeping its global index (so a
plan cursor is the same at every world size), with its own statistics and
fingerprint and ``meta.shard = {rank, world_size, source_fingerprint}``.
:func:`rank_shares` gives every rank's counts without building the shards.

The global sequence itself never depends on the world size: sharding only
deals it out. When an epoch's microbatch count is not a multiple of the
world size, ranks ``>= M % world_size`` get one microbatch fewer.
"""

from __future__ import annotations

from functools import partial
from dataclasses import replace

import numpy as np

from ... import checks, errors
from .plan import BatchPlan, EpochPlan, plan_error
from .fingerprint import finish_meta
from .stats import epoch_stats, tokens_per_batch
from .packing import select_rows
from .planner import gather_batches

#: world_size and rank are uint32 (docs/spec/nextbatch-v2.md §1; one definition, in umlos_cuda.errors).
MAX_WORLD_SIZE = errors.MAX_WORLD_SIZE
#: ``rank_shares`` lists at most this many ranks (one row each), and ``save_shards`` writes at most
#: this many shard folders: a world size the engine takes (up to 2^32 - 1) would otherwise mean
#: billions of folders, written for years.
MAX_SHARE_RANKS = 1 << 16


def check_rank(rank, world_size) -> tuple[int, int]:
    """``(rank, world_size)`` as ints, else INVALID_RANK naming the interval."""
    world_size, rank = (checks.integer(value, what, None, None, fail=partial(plan_error, errors.INVALID_RANK),
                                       message="{name} must be an integer, got {type} {value!r}")
                        for value, what in ((world_size, "world_size"), (rank, "rank")))
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise plan_error(errors.INVALID_RANK, f"world_size {world_size} is outside [1, {MAX_WORLD_SIZE}]")
    if not 0 <= rank < world_size:
        raise plan_error(errors.INVALID_RANK,
                         f"Invalid rank {rank}, rank should be in the interval [0, {world_size - 1}]")
    return rank, world_size


def check_shard_count(world_size) -> int:
    """``world_size`` when :func:`check_rank` takes it and one folder per rank stays within
    :data:`MAX_SHARE_RANKS` (BATCHING_CONFIG_INVALID otherwise)."""
    _, world_size = check_rank(0, world_size)
    if world_size > MAX_SHARE_RANKS:
        raise plan_error(errors.BATCHING_CONFIG_INVALID,
                         f"shards are written for at most {MAX_SHARE_RANKS} ranks (one folder each), got world_size "
                         f"{world_size}; a larger job reads the full plan with its rank (PlanSampler, shard_plan) "
                         "instead of one folder per rank")
    return world_size


def shard_plan(plan: BatchPlan, rank: int, world_size: int) -> BatchPlan:
    """The plan of one rank (see the module docstring)."""
    rank, world_size = check_rank(rank, world_size)
    if plan.meta.shard is not None:
        raise plan_error(errors.BATCHING_CONFIG_INVALID,
                         f"this plan is already shard {plan.meta.shard['rank']} of {plan.meta.shard['world_size']}; "
                         "shard the full plan instead")
    epochs = [_shard_epoch(plan, e, rank, world_size) for e in plan.epochs]
    meta = replace(plan.meta, fingerprint=None, epoch_digests=(),
                   shard={"rank": rank, "world_size": world_size, "source_fingerprint": plan.meta.fingerprint})
    return BatchPlan(finish_meta(meta, epochs), epochs, plan.lengths, plan.sample_ids)


def _shard_epoch(plan: BatchPlan, epoch: EpochPlan, rank: int, world_size: int) -> EpochPlan:
    chosen = np.arange(rank, len(epoch), world_size, dtype=np.int64)
    offsets = np.asarray(epoch.offsets, dtype=np.int64)
    sizes = (offsets[1:] - offsets[:-1])[chosen]
    new_offsets = np.zeros(chosen.shape[0] + 1, dtype=np.int64)
    np.cumsum(sizes, out=new_offsets[1:])
    samples = gather_batches(np.asarray(epoch.samples), offsets[chosen], sizes, new_offsets)
    bucket_ids = np.asarray(epoch.bucket_ids)[chosen]
    max_len = np.asarray(epoch.max_len)[chosen]
    row_offsets = pack_rows = None
    if epoch.pack_rows is not None:
        assert epoch.row_offsets is not None  # a packed epoch has both
        row_offsets, pack_rows = select_rows(epoch.row_offsets, epoch.pack_rows, chosen, gather_batches)
    pieces = None
    if epoch.pieces is not None:
        pieces = gather_batches(np.asarray(epoch.pieces), offsets[chosen], sizes, new_offsets)
    shard = EpochPlan(epoch.epoch, new_offsets, samples, bucket_ids, max_len, {}, rank, world_size, row_offsets,
                      pack_rows, pieces)
    units, lengths = plan.unit_index(shard)
    stats = epoch_stats(epoch.epoch, new_offsets, units, bucket_ids, max_len, lengths,
                        plan.config.bucket_spec, epoch.stats["skipped"], row_offsets=row_offsets,
                        pack_rows=pack_rows, pack=plan.config.pack)
    if "overlong" in epoch.stats:
        stats["overlong"] = epoch.stats["overlong"]
    stats["global_microbatches"] = len(epoch)
    return replace(shard, stats=stats)


def share_ranks(world_size: int | None, rank: int | None) -> list[int]:
    """The ranks whose share ``plan info`` lists: none without ``world_size``, else every rank of it or only
    ``rank``. ``rank`` needs ``world_size`` and a list of every rank stops at :data:`MAX_SHARE_RANKS` ranks
    (BATCHING_CONFIG_INVALID); a rank outside the world is INVALID_RANK. Checked before any plan is read."""
    if rank is not None and world_size is None:
        raise plan_error(errors.BATCHING_CONFIG_INVALID, "--rank needs --world-size")
    if world_size is None:
        return []
    rank_, world_size = check_rank(rank or 0, world_size)
    if rank is None and world_size > MAX_SHARE_RANKS:
        raise plan_error(errors.BATCHING_CONFIG_INVALID, f"per-rank shares are listed for at most {MAX_SHARE_RANKS} "
                                                         f"ranks, got world_size {world_size}")
    return list(range(world_size)) if rank is None else [rank_]


def rank_shares(plan: BatchPlan, epoch: int, world_size: int) -> list[dict]:
    """Per rank of ``world_size``: microbatches, samples, tokens and padded tokens of ``epoch``."""
    _, world_size = check_rank(0, world_size)
    plan_epoch = plan.get_epoch(epoch)
    if plan.meta.shard is not None:
        raise plan_error(errors.BATCHING_CONFIG_INVALID, "per-rank shares are computed from the full plan, not a shard")
    sizes = plan_epoch.sizes()
    padded = plan_epoch.padded_rows() * np.asarray(plan_epoch.max_len, dtype=np.int64)
    units, lengths = plan.unit_index(plan_epoch)
    tokens = tokens_per_batch(plan_epoch.offsets, units, lengths)
    if world_size > MAX_SHARE_RANKS:
        raise plan_error(errors.BATCHING_CONFIG_INVALID,
                         f"per-rank shares are listed for at most {MAX_SHARE_RANKS} ranks, got world_size {world_size}")
    ranks = np.arange(len(plan_epoch), dtype=np.int64) % world_size
    columns = [np.bincount(ranks, weights=w, minlength=world_size).astype(np.int64)
               for w in (None, sizes, tokens, padded)]
    return [{"rank": r, "microbatches": int(columns[0][r]), "samples": int(columns[1][r]),
             "tokens": int(columns[2][r]), "padded_tokens": int(columns[3][r])} for r in range(world_size)]
