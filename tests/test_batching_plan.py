"""Token-budget plans: buckets, the planner's invariants on the engine's order,
determinism, world-size independence, resume (iter_from) and the bucket mix."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import umlos_cuda as uc
from umlos_cuda import errors
from umlos_cuda.batching import shard_plan
from umlos_cuda.batching.plans.buckets import BucketSpec
from umlos_cuda.batching.plans.builder import BatchPlanBuilder
from umlos_cuda.batching.plans.config import PLAN_STAGES, BatchingConfig, PadPolicy
from umlos_cuda.batching.packing.pack import native_module
from umlos_cuda.batching.plans.planner import (PLAN_DATASET_KEY, bucket_mix_drift, cuts_by_lifting, cuts_by_scan,
                                               greedy_cuts, greedy_cuts_and_longest, plan_manifest)

SHUFFLE, SEQUENTIAL, STREAMING = PLAN_STAGES


def expect(code, function, *args, **kwargs):
    with pytest.raises(uc.UmlosError) as info:
        function(*args, **kwargs)
    assert info.value.code == code, info.value.message
    return info.value


def lognormal(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(5.5, 0.9, n), 1, 4000).astype(np.uint32)


# --------------------------------------------------------------- buckets
@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=0, max_size=5, unique=True).map(sorted),
       st.integers(1, 200), st.integers(0, 3), st.lists(st.integers(0, 800), min_size=1, max_size=50))
def test_bucket_ids_match_the_definition(edges, extra, min_length, lengths):
    overflow = (edges[-1] if edges else 0) + extra
    spec = BucketSpec(edges, overflow, min(min_length, overflow))
    got = spec.bucket_ids(np.asarray(lengths, dtype=np.uint32)).tolist()
    for length, bucket in zip(lengths, got):
        if length < spec.min_length or length > overflow:
            assert bucket == -1
        else:
            assert bucket == next((k for k, e in enumerate(edges) if length <= e), len(edges))
            low, high = spec.bucket_range(bucket)
            assert low <= length <= high and spec.bucket_max_length(bucket) == high


@pytest.mark.parametrize("edges,overflow,min_length", [
    ((128, 128), 2048, 1), ((256, 128), 2048, 1), ((128, 256), 256, 1), ((0, 128), 2048, 1),
    ((128,), 0, 1), ("128", 2048, 1), ((128.0,), 2048, 1), ((True,), 2048, 1), ((128,), 2048, -1),
    ((128,), 2048, 4096), (tuple(range(1, 1100)), 5000, 1),
])
def test_bad_bucket_specs_are_refused(edges, overflow, min_length):
    error = expect(errors.BATCHING_CONFIG_INVALID, BucketSpec, edges, overflow, min_length)
    assert error.record["failure_operator"] == errors.BATCH_PLAN_OPERATOR


@pytest.mark.parametrize("kwargs", [
    dict(token_budget=1024, overflow_max=2048),  # the longest sample would not fit
    dict(token_budget=0), dict(pad_policy="pad_to_nothing"), dict(seed=-1), dict(seed=1 << 64),
    dict(stage="RANDOM"), dict(sampler_block_size=0), dict(profile="fast"),
])
def test_bad_configs_are_refused(kwargs):
    error = expect(errors.BATCHING_CONFIG_INVALID, BatchingConfig, **kwargs)
    if "pad_policy" in kwargs:
        assert "pad_to_bucket" in error.message and "pad_to_max" in error.message  # names the choices


def test_factories():
    assert BatchingConfig.predictable().pad_policy is PadPolicy.PAD_TO_BUCKET
    assert BatchingConfig.throughput().pad_policy is PadPolicy.PAD_TO_MAX_IN_BATCH
    config = BatchingConfig.predictable(8192, (64, 512), 1024, seed=5)
    assert BatchingConfig.from_dict(config.to_dict()) == config
    expect(errors.BATCHING_CONFIG_INVALID, BatchingConfig.from_dict, {**config.to_dict(), "colour": 1})


# --------------------------------------------------------------- the greedy cut
def reference_cuts(lengths, budget, cap=None):
    starts, longest, count = [], 0, 0
    for i, length in enumerate(lengths):
        if count and ((count + 1) * max(longest, length) > budget or count == cap):
            count = 0
        if count == 0:
            starts.append(i)
            longest = 0
        count += 1
        longest = max(longest, length)
    return starts


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 64), min_size=1, max_size=400), st.integers(64, 700))
def test_greedy_cuts_equal_the_sample_by_sample_loop(lengths, budget):
    array = np.asarray(lengths, dtype=np.uint32)
    expected = reference_cuts(lengths, budget)
    assert greedy_cuts(array, budget, budget // 1).tolist() == expected
    assert cuts_by_lifting(array, budget, budget // 1).tolist() == expected
    assert cuts_by_scan(array, budget).tolist() == expected
    for backend in ("numpy", "native") if native_module() is not None else ("numpy",):
        starts, longest = greedy_cuts_and_longest(array, budget, budget // 1, backend=backend)
        assert starts.tolist() == expected
        assert longest.tolist() == [max(lengths[a:b]) for a, b in zip(expected, expected[1:] + [len(lengths)])]


@pytest.mark.skipif(native_module() is None, reason="umlos_cuda._packing is not built")
@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 64), min_size=1, max_size=400), st.integers(64, 700), st.integers(1, 40))
def test_native_cut_equals_numpy_with_zero_lengths_and_a_cap(lengths, budget, largest_count):
    """Zero lengths make the count cap matter: the native pass caps exactly
    where the NumPy path does (lifting caps, the scan of short samples does not)."""
    array = np.asarray(lengths, dtype=np.uint32)
    native = greedy_cuts_and_longest(array, budget, largest_count, backend="native")
    numpy_ = greedy_cuts_and_longest(array, budget, largest_count, backend="numpy")
    assert native[0].tolist() == numpy_[0].tolist() and native[1].tolist() == numpy_[1].tolist()
    assert native[0].tolist() in (reference_cuts(lengths, budget), reference_cuts(lengths, budget, largest_count))


@pytest.mark.skipif(native_module() is None, reason="umlos_cuda._packing is not built")
def test_native_cut_refuses_short_outputs_and_other_dtypes():
    module = native_module()
    lengths = np.full(10, 9, dtype=np.uint32)
    with pytest.raises(ValueError, match="too short"):
        module.cut(lengths, 9, 10, np.empty(3, np.int64), np.empty(3, np.uint32))
    with pytest.raises(TypeError, match="uint32"):
        module.cut(lengths.astype(np.int64), 9, 10, np.empty(10, np.int64), np.empty(10, np.uint32))
    big = np.random.default_rng(5).integers(1, 2048, 200_000).astype(np.uint32)
    for dtype in (np.uint32, np.int64):  # int64 lengths take the NumPy path; the cuts are the same
        starts, longest = greedy_cuts_and_longest(big.astype(dtype), 16384, 16384)
        assert starts.tolist() == reference_cuts(big.tolist(), 16384) and longest.dtype == np.uint32


def test_greedy_cuts_across_chunks(monkeypatch):
    import umlos_cuda.batching.plans.planner as planner

    monkeypatch.setattr(planner, "CUT_CHUNK", 16)  # many chunks, each with look-ahead
    lengths = np.random.default_rng(3).integers(1, 40, 3000).astype(np.uint32)
    assert cuts_by_lifting(lengths, 300, 300).tolist() == reference_cuts(lengths.tolist(), 300)


# --------------------------------------------------------------- plan invariants
def check_invariants(plan, lengths, config):
    """Every property the issue names, checked from first principles."""
    spec = config.bucket_spec
    skipped = {i for i, x in enumerate(lengths.tolist()) if x < spec.min_length or x > spec.overflow_max}
    manifest = plan_manifest(config, len(lengths))
    for e, epoch in enumerate(plan.epochs):
        if config.stage == SEQUENTIAL:
            order = list(range(len(lengths)))
        else:
            order = uc.epoch_indices(manifest, PLAN_DATASET_KEY, epoch=e, backend="numpy").tolist()
        seen = []
        per_bucket = {}
        for j, mb in enumerate(plan.iter_epoch(e)):
            rows = mb.rows.tolist()
            assert mb.index == j and mb.packs is None and mb.samples == tuple(plan.sample_id(r) for r in rows)
            bucket_lengths = [int(lengths[r]) for r in rows]
            assert {int(b) for b in spec.bucket_ids(np.asarray(bucket_lengths))} == {mb.bucket_id}
            to_bucket = config.pad_policy is PadPolicy.PAD_TO_BUCKET
            pad = spec.bucket_max_length(mb.bucket_id) if to_bucket else max(bucket_lengths)
            assert mb.max_len == pad and len(rows) * pad <= config.token_budget
            per_bucket.setdefault(mb.bucket_id, []).append(rows)
            seen += rows
        assert sorted(seen) == sorted(set(range(len(lengths))) - skipped)  # each non-skipped sample once
        assert epoch.stats["skipped"] == [plan.sample_id(r) for r in sorted(skipped)]
        for bucket, batches in per_bucket.items():
            # each bucket takes its samples in the engine's order, cut greedily by the budget
            flat = [r for rows in batches for r in rows]
            assert flat == [r for r in order if r not in skipped and spec.get_bucket_id(int(lengths[r])) == bucket]
            bucket_lengths = [int(lengths[r]) for r in flat]
            if config.pad_policy is PadPolicy.PAD_TO_MAX_IN_BATCH:
                starts = reference_cuts(bucket_lengths, config.token_budget)
            else:
                starts = list(range(0, len(flat), config.token_budget // spec.bucket_max_length(bucket)))
            assert np.cumsum([0] + [len(b) for b in batches])[:-1].tolist() == starts


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(0, 700), min_size=1, max_size=300),
    st.sampled_from([(), (32,), (16, 64, 256), (100, 200, 300, 400)]),
    st.integers(0, 3), st.sampled_from(list(PadPolicy)), st.sampled_from(PLAN_STAGES),
    st.integers(0, 2**64 - 1), st.sampled_from([8, 64, 1 << 20]),
)
def test_plan_invariants(lengths, edges, budget_step, policy, stage, seed, block):
    lengths = np.asarray(lengths, dtype=np.uint32)
    overflow = 500
    config = BatchingConfig(overflow * (1 + budget_step) + 7 * budget_step, edges, overflow, policy, seed, stage, block)
    plan = BatchPlanBuilder(lengths, config, tokenizer_hash="t").build(2)
    check_invariants(plan, lengths, config)


def test_sample_ids_name_the_rows():
    lengths = lognormal(500, 4)
    ids = [f"row-{i}" for i in range(500)]
    config = BatchingConfig.throughput(8192, (128, 256, 512, 1024), 2048, seed=9)
    plan = BatchPlanBuilder(lengths, config, sample_ids=ids, tokenizer_hash="t").build(1)
    check_invariants(plan, lengths, config)
    assert all(list(mb.samples) == [ids[r] for r in mb.rows] for mb in plan.iter_epoch(0))


def test_engine_metadata_is_recorded():
    lengths = lognormal(100)
    for stage in PLAN_STAGES:
        config = BatchingConfig(4096, (128,), 2048, seed=1, stage=stage, sampler_block_size=32)
        meta = BatchPlanBuilder(lengths, config, tokenizer_hash="t").build(1).meta
        assert meta.sampling_mode == stage
        assert meta.sampler_config_hash == uc.sampler_config_hash(stage, 32, False).hex()
        assert meta.manifest_hash == plan_manifest(config, 100).hash.hex()


def test_all_skipped_and_single_sample():
    config = BatchingConfig(4096, (128,), 2048)
    plan = BatchPlanBuilder(np.asarray([0, 5000, 3000], dtype=np.uint32), config, tokenizer_hash="t").build(1)
    assert plan.total_microbatches == 0 and plan.epochs[0].stats["skipped"] == ["0", "1", "2"]
    plan = BatchPlanBuilder(np.asarray([7], dtype=np.uint32), config, tokenizer_hash="t").build(3)
    assert [mb.samples for e in range(3) for mb in plan.iter_epoch(e)] == [("0",)] * 3


# --------------------------------------------------------------- determinism, world size, resume
def test_determinism_and_seed_sensitivity():
    lengths = lognormal(5000, 1)
    config = BatchingConfig.throughput(16384, (128, 256, 512, 1024), 2048, seed=3)
    first = BatchPlanBuilder(lengths, config, tokenizer_hash="t").build(2)
    again = BatchPlanBuilder(lengths, config, tokenizer_hash="t", backend="numpy").build(2)
    assert first.fingerprint == again.fingerprint and len(first.fingerprint) == 64
    other = BatchPlanBuilder(lengths, BatchingConfig.throughput(16384, (128, 256, 512, 1024), 2048, seed=4),
                             tokenizer_hash="t").build(2)
    assert other.fingerprint != first.fingerprint
    assert first.meta.epoch_digests[0] != first.meta.epoch_digests[1]  # epochs differ


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7])
def test_shards_deal_out_the_one_global_sequence(world_size):
    lengths = lognormal(3000, 2)
    plan = BatchPlanBuilder(lengths, BatchingConfig.predictable(8192, (128, 512, 1024), 2048),
                            tokenizer_hash="t").build(2)
    shards = [shard_plan(plan, r, world_size) for r in range(world_size)]
    for e in range(2):
        merged = sorted((mb.index, mb.samples) for s in shards for mb in s.iter_epoch(e))
        assert merged == [(mb.index, mb.samples) for mb in plan.iter_epoch(e)]
        for r, s in enumerate(shards):
            assert all(mb.index % world_size == r for mb in s.iter_epoch(e))
    assert len({s.fingerprint for s in shards}) == world_size
    assert all(s.meta.shard == {"rank": r, "world_size": world_size, "source_fingerprint": plan.fingerprint}
               for r, s in enumerate(shards))
    expect(errors.INVALID_RANK, shard_plan, plan, world_size, world_size)
    expect(errors.BATCHING_CONFIG_INVALID, shard_plan, shards[0], 0, 1)


def test_iter_from_resumes_the_sequence():
    lengths = lognormal(2000, 5)
    plan = BatchPlanBuilder(lengths, BatchingConfig.throughput(8192, (256, 1024), 2048), tokenizer_hash="t").build(3)
    everything = [(e, mb.index, mb.samples) for e in range(3) for mb in plan.iter_epoch(e)]
    for epoch, index in [(0, 0), (0, 17), (1, 0), (2, len(plan.epochs[2]) - 1), (2, len(plan.epochs[2]))]:
        tail = [(e, i, mb.samples) for e, i, mb in plan.iter_from(epoch, index)]
        assert tail == [x for x in everything if (x[0], x[1]) >= (epoch, index)]
    shard = shard_plan(plan, 1, 3)
    assert [(e, i) for e, i, _ in shard.iter_from(1, 5)] == [(e, i) for e, i, _ in plan.iter_from(1, 5) if i % 3 == 1]

    def drain(cursor):
        return list(plan.iter_from(*cursor))

    for bad in [(3, 0), (0, len(plan.epochs[0]) + 1), (-1, 0), (0, -1), (True, 0), (0, 1.5)]:
        expect(errors.PLAN_CURSOR_INVALID, drain, bad)


# --------------------------------------------------------------- the bucket mix
@pytest.mark.parametrize("policy", list(PadPolicy))
def test_bucket_mix_is_stationary(policy):
    """Lognormal lengths, edges 128..2048, budget 16384 (the issue's setting):
    the first and the last 10 % of microbatches hold the same mix, and so does every decile."""
    lengths = lognormal(100_000, 7)
    config = BatchingConfig(16384, (128, 256, 512, 1024, 2048), 4096, policy, 42)
    plan = BatchPlanBuilder(lengths, config, tokenizer_hash="t").build(1)
    ids = np.asarray(plan.epochs[0].bucket_ids)
    assert plan.epochs[0].stats["bucket_mix_drift"] == pytest.approx(bucket_mix_drift(ids, 6), abs=1e-9)
    assert bucket_mix_drift(ids, 6) <= 0.01
    whole = np.bincount(ids, minlength=6) / ids.size
    for part in np.array_split(ids, 10):
        assert 0.5 * np.abs(np.bincount(part, minlength=6) / part.size - whole).sum() <= 0.01


def test_drift_measures_what_it_says():
    assert bucket_mix_drift(np.asarray([0] * 10 + [1] * 10), 2) == 1.0
    assert bucket_mix_drift(np.asarray([0, 1] * 10), 2) == 0.0
    assert bucket_mix_drift(np.zeros(0, dtype=np.int16), 2) == 0.0


def test_bucket_ids_table_and_search_agree(monkeypatch):
    import umlos_cuda.batching.plans.buckets as buckets

    spec = BucketSpec((128, 256, 512, 1024, 2048), 4096, 3)
    lengths = np.random.default_rng(2).integers(0, 6000, 20_000).astype(np.uint32)
    by_table = spec.bucket_ids(lengths)
    monkeypatch.setattr(buckets, "TABLE_MAX", 0)
    assert np.array_equal(by_table, spec.bucket_ids(lengths)) and by_table.dtype == np.int16
    assert np.array_equal(spec.bucket_ids(lengths.astype(np.int64)), by_table)


#: Fingerprints and manifest hashes of three plans as release 4cbda89 (before the
#: plans/ sub-package) built them. A plan's order hangs on everything hashed into
#: its manifest, the dataset id included, so a rename that reaches such a string
#: changes every user's plan; this pin fails first.
PINNED_PLANS = {
    "block_affine": ("8be676f2a134f99e5c7b9b4323cda63e08111283a77d74408bbc1daa3b730292",
                     "1babb147993012bef3cc5f0b7928591889b89fe681a3453f5caee488687e8952"),
    "feistel": ("05c05a206ebda1501b88b0dc878399939abc4cc9a522d838287db9f82ca99fa0",
                "73cba050c5e1445f09ef3e71173d42048fca8d1d7e039ac029b4ed56e155abbc"),
}


@pytest.mark.parametrize("order", sorted(PINNED_PLANS))
def test_plans_keep_the_fingerprints_of_earlier_releases(order):
    lengths = np.random.default_rng(7).integers(1, 2048, 5000)
    extra = {} if order == "block_affine" else {"order": order}
    plan = BatchPlanBuilder(lengths, BatchingConfig.throughput(token_budget=8192, seed=11, **extra)).build(num_epochs=2)
    assert (plan.meta.fingerprint, plan.meta.manifest_hash) == PINNED_PLANS[order]


def test_packed_plans_keep_the_fingerprint_of_earlier_releases():
    from dataclasses import replace

    from umlos_cuda.batching import PackingConfig

    lengths = np.random.default_rng(7).integers(1, 2048, 5000)
    config = replace(BatchingConfig.throughput(token_budget=8192, seed=11),
                     pack=PackingConfig(max_length=4096, mode="greedy"))
    plan = BatchPlanBuilder(lengths, config).build(num_epochs=1)
    assert plan.meta.fingerprint == "e868496a302fa81cbb3144c41114354c0144e289e1176c6d5ac58f47f5d9735b"
