"""Check a plan folder: every invariant, its fingerprint, and that it rebuilds.

What goes in: a plan folder (optionally the length cache it should match and
the fingerprint it should have). What comes out: a report of the checks that
passed, or the first failure as an :class:`~umlos_cuda.UmlosError` with its
code (docs/batching.md, "Failure codes"). The checks, in order:

1. the folder loads (PLAN_NOT_FOUND, PLAN_FORMAT_INVALID);
2. the lengths and ids are the ones meta.json binds, and those of
   ``lengths`` when given (PLAN_LENGTHS_MISMATCH);
   with a split or an over-long policy, the checks below run on the units
   (:mod:`.units`): every entry (row, and piece in a split plan) must be a
   unit of the configuration (PLAN_SAMPLES_INVALID), and meta.json's
   ``units`` their counts (PLAN_NOT_REPRODUCIBLE);
3. per epoch: rows in range, each non-skipped sample exactly once, no
   skipped sample planned (a shard: no sample twice), and in a plan of
   pairs both rows of each pair side by side in one microbatch
   (PLAN_SAMPLES_INVALID);
   each microbatch's bucket id is its samples' bucket and ``max_len`` its pad
   length (PLAN_BUCKET_MISMATCH); ``count x max_len <= token_budget``
   (PLAN_BUDGET_EXCEEDED); in a packed plan instead, the rows tile each
   microbatch, no row holds more than ``pack.max_length`` tokens and
   ``rows x max_length <= token_budget`` (PLAN_PACKS_INVALID,
   PLAN_BUDGET_EXCEEDED); stats.json (PLAN_STATS_MISMATCH) and
   microbatches.jsonl, packs included (PLAN_JSONL_MISMATCH), agree with the
   arrays;
4. the recomputed fingerprint equals meta.json's and the expected one
   (PLAN_FINGERPRINT_MISMATCH);
5. the configuration rebuilds exactly this plan from the lengths, on the
   engine's order (PLAN_NOT_REPRODUCIBLE); ``reproduce=False`` skips it.

All checks are array operations; memory is a few bytes per sample.
"""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np

from ... import errors
from ...errors import UmlosError
from .builder import BatchPlanBuilder
from .config import PadPolicy
from .plan import BatchPlan, EpochPlan, plan_error
from ...hashing import sha256_array
from .fingerprint import epoch_plan_digest, plan_fingerprint
from .io import load_plan, read_microbatches_jsonl
from .packing import check_packs
from .groups import check_groups, row_group_lengths
from .sharding import shard_plan
from .stats import epoch_stats
from .builder import sample_ids_sha256


def verify_plan(directory, *, expected_fingerprint: str | None = None, lengths=None,
                reproduce: bool = True) -> dict:
    """Run every check on the plan in ``directory``; return ``{"fingerprint", "checks"}``.
    A failure's message starts with the folder (the checks below speak of epochs and files in it)."""
    try:
        return _verify(directory, expected_fingerprint, lengths, reproduce)
    except UmlosError as exc:
        where = os.fspath(directory)
        if where in exc.message:
            raise
        raise UmlosError(exc.code, f"{where}: {exc.message}", operator=exc.record["failure_operator"]) from None


def _verify(directory, expected_fingerprint: str | None, lengths, reproduce: bool) -> dict:
    plan = load_plan(directory)
    checks = ["loads"]
    _check_bindings(plan, lengths)
    checks.append("lengths and ids match meta.json" + (" and the given length cache" if lengths is not None else ""))
    units = plan.units
    if units is not None and plan.meta.units != units.record():
        raise plan_error(errors.PLAN_NOT_REPRODUCIBLE, f"meta.json units is {plan.meta.units}; the split and "
                         f"over-long policy give {units.record()}")
    # what decides a bucket and a skip: the lengths, a pair's (groups), or a unit's (units: no pairs then)
    bucketed = row_group_lengths(np.asarray(plan.lengths), plan.config) if units is None else units.lengths
    skip_mask = plan.config.bucket_spec.bucket_ids(bucketed) < 0
    for epoch in plan.epochs:
        _check_epoch(plan, epoch, skip_mask, bucketed)
        jsonl = os.path.join(os.fspath(directory), f"epoch_{epoch.epoch}", "microbatches.jsonl")
        if os.path.exists(os.path.join(os.fspath(directory), f"epoch_{epoch.epoch}", "offsets.npy")) \
                and os.path.exists(jsonl):
            _check_jsonl(plan, epoch, jsonl)
    checks.append("samples, buckets, budgets, stats and JSONL of every epoch")
    digests = tuple(epoch_plan_digest(e) for e in plan.epochs)
    fingerprint = plan_fingerprint(plan.meta.header(), digests)
    if fingerprint != plan.meta.fingerprint or digests != plan.meta.epoch_digests:
        bad = [e for e, (a, b) in enumerate(zip(digests, plan.meta.epoch_digests)) if a != b]
        raise plan_error(errors.PLAN_FINGERPRINT_MISMATCH,
                         f"the plan's content hashes to {fingerprint} but meta.json records {plan.meta.fingerprint}"
                         + (f" (epochs that differ: {bad})" if bad else " (meta.json's fields differ)"))
    if expected_fingerprint is not None and fingerprint != expected_fingerprint:
        raise plan_error(errors.PLAN_FINGERPRINT_MISMATCH,
                         f"the plan's fingerprint is {fingerprint}, not the expected {expected_fingerprint}")
    checks.append("fingerprint" + (" (as expected)" if expected_fingerprint is not None else ""))
    if reproduce:
        _check_reproduces(plan, digests)
        checks.append("rebuilds from its configuration and lengths")
    return {"fingerprint": fingerprint, "checks": checks}


def _check_bindings(plan: BatchPlan, lengths) -> None:
    meta = plan.meta
    if sha256_array(np.asarray(plan.lengths)) != meta.lengths_sha256:
        raise plan_error(errors.PLAN_LENGTHS_MISMATCH, "lengths.npy does not hash to meta.json's lengths_sha256")
    if plan.sample_ids is not None and sample_ids_sha256(plan.sample_ids) != meta.sample_ids_sha256:
        raise plan_error(errors.PLAN_LENGTHS_MISMATCH,
                         "sample_ids.jsonl does not hash to meta.json's sample_ids_sha256")
    if lengths is None:
        return
    given = np.asarray(lengths.lengths, dtype="<u4")
    if lengths.tokenizer_hash != meta.tokenizer_hash:
        raise plan_error(errors.PLAN_LENGTHS_MISMATCH,
                         f"the length cache was counted by tokenizer {lengths.tokenizer_hash}, the plan by "
                         f"{meta.tokenizer_hash}")
    if given.shape[0] != meta.num_samples or sha256_array(given) != meta.lengths_sha256:
        raise plan_error(errors.PLAN_LENGTHS_MISMATCH,
                         f"the length cache ({given.shape[0]} samples) holds other lengths than the plan "
                         "was built from")
    ids_are_rows = getattr(lengths, "ids_are_line_numbers", False)
    plan_ids = plan.sample_ids
    if (plan_ids is None) != ids_are_rows or (plan_ids is not None and list(lengths.sample_ids) != list(plan_ids)):
        raise plan_error(errors.PLAN_LENGTHS_MISMATCH, "the length cache names its samples differently from the plan")


def _check_epoch(plan: BatchPlan, epoch: EpochPlan, skip_mask: np.ndarray, bucketed: np.ndarray) -> None:
    e = epoch.epoch
    config, spec = plan.config, plan.config.bucket_spec
    n = plan.meta.num_samples
    offsets = np.asarray(epoch.offsets, dtype=np.int64)
    sizes = np.diff(offsets)
    if sizes.size and int(sizes.min()) < 1:
        raise plan_error(errors.PLAN_FORMAT_INVALID, f"epoch {e}: microbatch {int(np.argmin(sizes))} is empty")
    samples = np.asarray(epoch.samples)
    if samples.size and int(samples.max()) >= n:
        raise plan_error(errors.PLAN_SAMPLES_INVALID, f"epoch {e}: row {int(samples.max())} is past the {n} samples")
    samples, lengths = plan.unit_index(epoch)
    if samples.size and int(samples.min()) < 0:
        bad = int(np.argmin(samples))
        piece = "" if epoch.pieces is None else f" piece {int(epoch.pieces[bad])}"
        raise plan_error(errors.PLAN_SAMPLES_INVALID,
                         f"epoch {e}: entry {bad} (row {int(epoch.samples[bad])}{piece}) is no sample or piece that "
                         "the plan's split and over-long policy keep")
    n = int(lengths.shape[0])
    seen = np.zeros(n, dtype=bool)
    seen[samples] = True
    distinct = int(np.count_nonzero(seen))
    if distinct != samples.shape[0]:
        raise plan_error(errors.PLAN_SAMPLES_INVALID,
                         f"epoch {e}: {samples.shape[0] - distinct} sample(s) appear more than once")
    planned_skipped = np.flatnonzero(seen & skip_mask)
    if planned_skipped.size:
        raise plan_error(errors.PLAN_SAMPLES_INVALID,
                         f"epoch {e}: row {int(planned_skipped[0])} is planned but its length "
                         f"{int(lengths[planned_skipped[0]])} is outside [{spec.min_length}, {spec.overflow_max}]")
    if plan.meta.shard is None:
        missing = np.flatnonzero(~seen & ~skip_mask)
        if missing.size:
            raise plan_error(errors.PLAN_SAMPLES_INVALID,
                             f"epoch {e}: {missing.size} sample(s) are neither planned nor skipped (first: row "
                             f"{int(missing[0])})")
    bucket_ids = np.asarray(epoch.bucket_ids, dtype=np.int64)
    if bucket_ids.size and (int(bucket_ids.min()) < 0 or int(bucket_ids.max()) >= spec.num_buckets):
        raise plan_error(errors.PLAN_BUCKET_MISMATCH, f"epoch {e}: a bucket id is outside [0, {spec.num_buckets - 1}]")
    sample_lengths = np.asarray(lengths)[samples]
    wrong = np.flatnonzero(spec.bucket_ids(bucketed[samples]) != np.repeat(bucket_ids, sizes))
    if wrong.size:
        j = int(np.searchsorted(offsets, wrong[0], side="right")) - 1
        raise plan_error(errors.PLAN_BUCKET_MISMATCH, f"epoch {e}: microbatch {j} holds a sample of another bucket")
    if config.group_size > 1:
        check_groups(epoch, config.group_size)
    if config.pack is not None:
        check_packs(replace(epoch, samples=samples), config.pack, config.token_budget, lengths)
    else:
        _check_padding(epoch, config, sample_lengths, offsets)
    units = plan.units
    skipped = [plan.sample_id(r) if units is None else units.label(r, plan.sample_id)
               for r in np.flatnonzero(skip_mask).tolist()]
    stats = epoch_stats(e, offsets, samples, epoch.bucket_ids, epoch.max_len, lengths, spec, skipped,
                        row_offsets=epoch.row_offsets, pack_rows=epoch.pack_rows, pack=config.pack)
    if units is not None and units.overlong is not None:
        stats["overlong"] = dict(units.overlong)
    if plan.meta.shard is not None:
        stats["global_microbatches"] = epoch.stats.get("global_microbatches")
    if stats != epoch.stats:
        differ = sorted(k for k in set(stats) | set(epoch.stats) if stats.get(k) != epoch.stats.get(k))
        raise plan_error(errors.PLAN_STATS_MISMATCH,
                         f"epoch {e}: stats.json disagrees with the microbatches on {differ}")


def _check_padding(epoch: EpochPlan, config, sample_lengths: np.ndarray, offsets: np.ndarray) -> None:
    """``max_len`` is the pad policy's and ``count x max_len`` within the budget (a plan that does not pack)."""
    e, spec, sizes = epoch.epoch, config.bucket_spec, np.diff(offsets)
    bucket_ids = np.asarray(epoch.bucket_ids, dtype=np.int64)
    max_len = np.asarray(epoch.max_len, dtype=np.int64)
    if config.pad_policy is PadPolicy.PAD_TO_BUCKET:
        expected = spec.max_lengths.astype(np.int64)[bucket_ids]
    else:
        expected = np.maximum.reduceat(sample_lengths, offsets[:-1]).astype(np.int64) if sizes.size else max_len
    bad = np.flatnonzero(max_len != expected)
    if bad.size:
        j = int(bad[0])
        raise plan_error(errors.PLAN_BUCKET_MISMATCH,
                         f"epoch {e}: microbatch {j} has max_len {int(max_len[j])}; {config.pad_policy.value} gives "
                         f"{int(expected[j])}")
    over = np.flatnonzero(sizes * max_len > config.token_budget)
    if over.size:
        j = int(over[0])
        raise plan_error(errors.PLAN_BUDGET_EXCEEDED,
                         f"epoch {e}: microbatch {j} holds {int(sizes[j])} x {int(max_len[j])} = "
                         f"{int(sizes[j] * max_len[j])} tokens; the budget is {config.token_budget}")


def _check_jsonl(plan: BatchPlan, epoch: EpochPlan, path: str) -> None:
    base, step = epoch.index_base, epoch.index_step
    try:
        arrays = read_microbatches_jsonl(path, plan.meta, plan.sample_ids, base, step)
    except UmlosError as exc:
        raise plan_error(errors.PLAN_JSONL_MISMATCH, f"{exc.message}") from None
    packed = ("row_offsets", "pack_rows") if "pack_rows" in arrays else ()
    names = ("offsets", "samples", "bucket_ids", "max_len") + packed + (("pieces",) if "pieces" in arrays else ())
    for name in names:
        if not np.array_equal(arrays[name], np.asarray(getattr(epoch, name))):
            raise plan_error(errors.PLAN_JSONL_MISMATCH, f"{path}: its {name} differ from the binary form's")


def _check_reproduces(plan: BatchPlan, digests: tuple[str, ...]) -> None:
    rebuilt = BatchPlanBuilder(np.asarray(plan.lengths), plan.config, tokenizer_hash=plan.meta.tokenizer_hash,
                               sample_ids=plan.sample_ids, dataset_hash=plan.meta.dataset_hash).build(plan.num_epochs)
    if plan.meta.shard is not None:
        rebuilt = shard_plan(rebuilt, plan.meta.shard["rank"], plan.meta.shard["world_size"])
        assert rebuilt.meta.shard is not None  # shard_plan names the source
        if plan.meta.shard["source_fingerprint"] != rebuilt.meta.shard["source_fingerprint"]:
            raise plan_error(errors.PLAN_NOT_REPRODUCIBLE,
                             "the shard names a source plan its configuration does not build")
    meta, again = plan.meta, rebuilt.meta
    for field in ("sampler_config_hash", "manifest_hash"):
        if getattr(meta, field) != getattr(again, field):
            raise plan_error(errors.PLAN_NOT_REPRODUCIBLE,
                             f"meta.json {field} is {getattr(meta, field)}; the engine gives {getattr(again, field)}")
    differ = [e for e, (a, b) in enumerate(zip(digests, again.epoch_digests)) if a != b]
    if differ:
        raise plan_error(errors.PLAN_NOT_REPRODUCIBLE,
                         f"epochs {differ} differ from what the configuration builds from these lengths on the "
                         "engine's order")
