"""The whole plan: one dataset's engine order, every epoch planned at once (``plan build``; plans/io.py).

What goes in: a plan folder (marker ``plan``, or a folder written before markers with a plan's meta.json).
What comes out: :data:`KIND`, and the words ``plan build`` and ``plan info`` print about a plan (over-long
samples, the split, packing) so that both say them alike.
"""

from __future__ import annotations

import numpy as np

from .... import errors
from ...sources import length_cache
from ..explain.rows import microbatch_unit
from ..integrity import check_digests
from ..io import PLAN, load_plan, save_plan, save_plan_into
from ..plan import BatchPlan
from ..overlong import default_overlong_counts
from ..plan import plan_error
from ..sharding import rank_shares, share_ranks
from ..verify import verify_plan
from .kind import PlanKind


def overlong_counts(plan) -> dict:
    """stats.json ``overlong`` (the same in every epoch), or for a plan without an over-long policy
    the samples above overflow_max that its buckets skip, counted from the lengths of the rows it
    takes (those on its split's side)."""
    if plan.config.overlong is not None:
        return plan.epochs[0].stats["overlong"]
    lengths = np.asarray(plan.lengths)
    return default_overlong_counts(lengths if plan.units is None else lengths[plan.units.rows],
                                   plan.config.overflow_max)


def overlong_line(counted: dict, has_policy: bool) -> str:
    """What happened to over-long samples, in words (:func:`overlong_counts`)."""
    if not has_policy:
        return (f"over-long: {counted['samples']} sample(s) above overflow_max {counted['max_length']} skipped, "
                f"{counted['tokens_lost']} tokens lost (the default; --max-length L --overlong "
                "truncate_right|truncate_left|split keeps them)")
    done = {"truncate_right": "truncated to their first {L} tokens", "truncate_left": "truncated to their last {L} "
            "tokens", "split": "split into {pieces} pieces", "skip": "skipped"}[counted["policy"]]
    return (f"over-long: {counted['samples']} sample(s) above max_length {counted['max_length']} "
            f"{done.format(L=counted['max_length'], pieces=counted['pieces'])}, {counted['tokens_lost']} tokens lost "
            f"({counted['policy']})")


def split_line(config: dict, units: dict | None, num_samples: int) -> str | None:
    """The split side a plan takes and the units it plans (None for a plan of every sample); ``config`` is
    :meth:`~..config.BatchingConfig.to_dict`'s."""
    split = config.get("split")
    if split is None or units is None:
        return None
    return (f"split {split['side']} (validation_fraction {split['validation_fraction']}, split seed "
            f"{split['seed']}): {units['samples']} of {num_samples} samples, {units['units']} planned units")


def config_words(config: dict) -> str:
    """A configuration (:meth:`~..config.BatchingConfig.to_dict`'s) in words, as every plan report gives it."""
    return (f"budget {config['token_budget']}, {config['pad_policy']}, edges {list(config['bucket_edges'])} + "
            f"overflow {config['overflow_max']}, seed {config['seed']}, {config['sampling_mode']}")


def packed_line(config: dict, pack: dict) -> str:
    """How a packed plan packs (``pack``: :meth:`~...packing.config.PackingConfig.to_dict`'s), in words."""
    return (f"  packed: {pack['mode']}, rows of {pack['max_length']} tokens, "
            f"{config['token_budget'] // pack['max_length']} rows per microbatch, separator {pack['separator_len']}")


def packing_line(packing: dict) -> str:
    """One line of a packed epoch's PackingMetrics (stats.json ``packing``)."""
    return (f"packing: {packing['rows']} rows (lower bound {packing['lower_bound_rows']}), packing_efficiency "
            f"{packing['packing_efficiency']:.4f}, {packing['segments_per_row']:.2f} segments per row")


def report(folder, *, world_size: int | None = None, rank: int | None = None) -> dict:
    """``plan info``'s report: the configuration, what happened to over-long samples, each epoch's stats and,
    with a world size, each rank's share (its microbatches, samples, tokens and padded tokens)."""
    ranks = share_ranks(world_size, rank)
    plan = load_plan(folder)
    meta = plan.meta
    pack = meta.config.pack
    epochs: list[dict] = []
    out = {"plan": str(folder), "kind": KIND.name, "fingerprint": meta.fingerprint, "config": meta.config.to_dict(),
           "pack_config": None if pack is None else pack.to_dict(), "num_samples": meta.num_samples,
           "shard": meta.shard, "units": meta.units, "overlong": overlong_counts(plan), "epochs": epochs}
    for epoch in plan.epochs:
        stats = {k: v for k, v in epoch.stats.items() if k != "skipped"}
        if ranks:
            shares = rank_shares(plan, epoch.epoch, world_size or 1)
            stats["ranks"] = [shares[r] for r in ranks]
        epochs.append(stats)
    return out


def lines(report: dict) -> list[str]:
    """The text of ``plan info`` for :func:`report`'s dict."""
    config, pack, shard = report["config"], report["pack_config"], report["shard"]
    out = [f"plan {report['plan']}", f"  fingerprint {report['fingerprint']}",
           f"  {report['num_samples']} samples, {len(report['epochs'])} epoch(s), {config_words(config)}"]
    group_size = config.get("group_size", 1)
    if group_size > 1:
        out.append(f"  preference pairs: {report['num_samples'] // group_size} pairs, rows 2p and 2p + 1 in one "
                   "microbatch")
    if pack is not None:
        out.append(packed_line(config, pack))
    out.append("  " + overlong_line(report["overlong"], config.get("overlong") is not None))
    split = split_line(config, report["units"], report["num_samples"])
    if split is not None:
        out.append("  " + split)
    if shard:
        out.append(f"  shard {shard['rank']} of {shard['world_size']} (source {shard['source_fingerprint']})")
    for stats in report["epochs"]:
        out.append(f"  epoch {stats['epoch']}: {stats['microbatches']} microbatches, {stats['samples']} samples, "
                   f"{stats['skipped_samples']} skipped, {stats['tokens']} tokens, padding_waste "
                   f"{stats['padding_waste']:.4f}, bucket_mix_drift {stats['bucket_mix_drift']:.4f}")
        if "packing" in stats:
            out.append("    " + packing_line(stats["packing"]))
        out += [f"    rank {row['rank']}: {row['microbatches']} microbatches, {row['samples']} samples, "
                f"{row['tokens']} tokens, {row['padded_tokens']} padded tokens" for row in stats.get("ranks", [])]
    return out


def verify(folder, *, expected_fingerprint: str | None = None, lengths=None, rebuild: bool = True) -> dict:
    """:func:`~..verify.verify_plan`; ``lengths``: any source, whose whole length cache is compared with the plan's
    (its ids too)."""
    given = None if lengths is None else length_cache(lengths, read_ids=False)
    return verify_plan(folder, expected_fingerprint=expected_fingerprint, lengths=given, reproduce=rebuild)


def explain_unit(plan, epoch: int, k: int, tokens=None) -> dict:
    """Global microbatch ``k`` of ``epoch``, row by row (``plan explain``): each sample's token range is its span
    under the over-long policy, else the whole sample; a whole plan records no token source, so its loss tokens
    need ``tokens``. A shard holds only its rank's microbatches (INVALID_RANK for another's)."""
    plan_epoch = plan.get_epoch(epoch)
    local = plan_epoch.local_index(k)
    if local is None or local >= len(plan_epoch):
        shard = plan.meta.shard or {"rank": 0, "world_size": 1}
        raise plan_error(errors.INVALID_RANK, f"microbatch {k} of epoch {epoch} is not in this plan, shard "
                                              f"{shard['rank']} of {shard['world_size']}: explain a shard at its own "
                                              "rank and world size, or the full plan")
    spec = plan.microbatch(epoch, local)
    return microbatch_unit(spec, np.asarray(plan.lengths)[spec.rows], tokens)


def _whole(plan, lengths=None):
    """A whole plan is its own whole plan (``lengths``, given by a caller that has them, add nothing)."""
    return plan


def _save_into(plan: BatchPlan, parent, name: str, *, force: bool = False, sources=None) -> None:
    """:func:`~..io.save_plan_into`: a whole plan holds its lengths, so where its rows were read (``sources``) is
    not recorded (a batch folder's copy keeps its bytes)."""
    save_plan_into(plan, parent, name, force=force)


KIND = PlanKind(PLAN, order="dataset", scope="epoch", unit="microbatch", rows=True, open=load_plan, save=save_plan,
                verify=verify, report=report, lines=lines,
                verify_options=frozenset({"expected_fingerprint", "lengths", "rebuild"}), whole=_whole,
                plan_type=BatchPlan, save_into=_save_into, digests=check_digests, explain=explain_unit)
