"""Windowed plans (docs/batching.md, "Windowed plans"): exactness against the whole-epoch planner,
random access and resume, every sample once per epoch, the index, the fingerprint, the length sources."""

from __future__ import annotations

import os

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from umlos_cuda import errors
from umlos_cuda.batching.lengths.cache import LengthCache, sidecar_path
from umlos_cuda.batching.plans.config import BatchingConfig, PadPolicy
from umlos_cuda.batching.plans.planner import build_epoch, plan_manifest
from umlos_cuda.batching.plans.windows import (ArrayLengths, MappedLengths, SyntheticLengths, WindowDefinition,
                                               WindowedPlan, count_window, plan_window)
from umlos_cuda.batching.plans.windows.window import window_rows
from umlos_cuda.errors import UmlosError
from umlos_cuda.nextbatch import epoch_indices

EDGES = st.sampled_from([(), (64,), (32, 128), (16, 48, 200), (100, 300, 700)])


@st.composite
def configs(draw, sequential=True, least_min_length=0):
    edges = draw(EDGES)
    overflow = draw(st.integers(min_value=(edges[-1] + 1) if edges else 1, max_value=1024))
    budget = draw(st.integers(min_value=overflow, max_value=4 * overflow + 64))
    policy = draw(st.sampled_from(list(PadPolicy)))
    stage = draw(st.sampled_from(["SHUFFLE_WITHOUT_REPLACEMENT_BLOCK_AFFINE_V1", "SEQUENTIAL_V1"]
                                 if sequential else ["SHUFFLE_WITHOUT_REPLACEMENT_BLOCK_AFFINE_V1"]))
    return BatchingConfig(budget, edges, overflow, policy, draw(st.integers(0, 2**64 - 1)), stage=stage,
                          min_length=draw(st.integers(least_min_length, 2)),
                          order=draw(st.sampled_from(["block_affine", "feistel"])),
                          sampler_block_size=draw(st.sampled_from([7, 64, 1 << 20])))


def lengths_for(seed: int, n: int, high: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, high, n).astype(np.uint32)


@settings(max_examples=60, deadline=None)
@given(configs(), st.integers(1, 700), st.integers(0, 2**32 - 1), st.integers(0, 3), st.integers(0, 64))
def test_one_window_is_the_whole_epoch_plan_array_for_array(config, n, seed, epoch, extra):
    lengths = lengths_for(seed, n, config.overflow_max + 64)
    window = plan_window(WindowDefinition(config, n, window=n + extra), ArrayLengths(lengths), epoch, 0)
    whole = build_epoch(lengths, config, epoch)
    for name in ("offsets", "samples", "bucket_ids", "max_len", "skipped"):
        assert np.array_equal(getattr(window, name), getattr(whole, name)), name
        assert getattr(window, name).dtype == getattr(whole, name).dtype, name


def reference_cuts(lengths: list[int], config: BatchingConfig) -> list[tuple[int, tuple[int, ...], int]]:
    """The cuts of one window, one sample at a time: each bucket's positions in order, a microbatch
    closed when the next sample would break the budget (and at the window's end: flush)."""
    spec = config.bucket_spec
    out = []
    for k in range(spec.num_buckets):
        low, high = spec.bucket_range(k)
        members = [p for p, length in enumerate(lengths) if low <= length <= high]
        current: list[int] = []
        for p in members:
            candidate = current + [p]
            pad_to_bucket = config.pad_policy is PadPolicy.PAD_TO_BUCKET
            width = high if pad_to_bucket else max(lengths[q] for q in candidate)
            if current and len(candidate) * width > config.token_budget:
                out.append((k, tuple(current), 0))
                current = [p]
            else:
                current = candidate
        if current:
            out.append((k, tuple(current), 0))
    return [(k, members, high if config.pad_policy is PadPolicy.PAD_TO_BUCKET else max(lengths[p] for p in members))
            for k, members, _ in out for high in [spec.bucket_max_length(k)]]


# min_length >= 1: the planner caps a microbatch at budget // shortest length, which binds only for zero lengths
@settings(max_examples=50, deadline=None)
@given(configs(least_min_length=1), st.integers(1, 600), st.integers(1, 200), st.integers(0, 2**32 - 1),
       st.integers(0, 2))
def test_each_window_is_its_positions_planned_alone_with_flush(config, n, window, seed, epoch):
    lengths = lengths_for(seed, n, config.overflow_max + 64)
    definition = WindowDefinition(config, n, window=window)
    manifest = plan_manifest(config, n)
    for w in range(definition.num_windows):
        start, stop = w * window, min((w + 1) * window, n)
        if config.stage == "SEQUENTIAL_V1":
            rows = np.arange(start, stop)
        else:  # the engine's order, asked for directly
            rows = epoch_indices(manifest, "train", epoch, start, stop - start).astype(np.int64)
        arrays = plan_window(definition, ArrayLengths(lengths), epoch, w)
        planned = [arrays.samples[arrays.offsets[j]:arrays.offsets[j + 1]].tolist()
                   for j in range(arrays.bucket_ids.shape[0])]
        got = sorted((int(arrays.bucket_ids[j]), tuple(planned[j]), int(arrays.max_len[j]))
                     for j in range(arrays.bucket_ids.shape[0]))
        expected = sorted((k, tuple(int(rows[p]) for p in members), width)
                          for k, members, width in reference_cuts(lengths[rows].tolist(), config))
        assert got == expected
        spec = config.bucket_spec
        assert arrays.skipped.tolist() == sorted(int(r) for r in rows if spec.get_bucket_id(int(lengths[r])) < 0)


@settings(max_examples=40, deadline=None)
@given(configs(), st.integers(1, 500), st.integers(1, 120), st.integers(0, 2**32 - 1))
def test_every_sample_once_per_epoch_and_random_access_is_the_full_pass(config, n, window, seed):
    lengths = lengths_for(seed, n, config.overflow_max + 64)
    plan = WindowedPlan.build(WindowDefinition(config, n, window=window), ArrayLengths(lengths), 2)
    spec = config.bucket_spec
    accepted = np.flatnonzero(spec.bucket_ids(lengths) >= 0)
    for epoch in range(2):
        passed = list(plan.iter_from(epoch, 0))
        assert [(e, j) for e, j, _ in passed] == [(e, j) for e in range(epoch, 2)
                                                 for j in range(plan.epoch_microbatches(e))]
        this_epoch = [mb for e, _, mb in passed if e == epoch]
        rows = np.concatenate([mb.rows for mb in this_epoch]) if this_epoch else np.zeros(0, np.int64)
        assert np.array_equal(np.sort(rows), accepted)  # each accepted sample exactly once
        for mb in this_epoch:
            assert len(mb.rows) * mb.max_len <= config.token_budget
            assert set(spec.bucket_ids(lengths[mb.rows]).tolist()) == {mb.bucket_id}
        counts = plan.epoch_counts(epoch)
        assert counts["microbatches"] == len(this_epoch) and counts["samples"] == accepted.shape[0]
        assert counts["tokens"] == int(lengths[accepted].sum())
        assert counts["padded_tokens"] == sum(len(mb.rows) * mb.max_len for mb in this_epoch)
        fresh = WindowedPlan(plan.definition, plan.source, plan.index)  # no window cached
        for k in sorted({0, len(this_epoch) // 3, len(this_epoch) - 1} - {-1}):
            if k < len(this_epoch):
                assert fresh.microbatch(epoch, k) == this_epoch[k]
                assert np.array_equal(fresh.microbatch(epoch, k).rows, this_epoch[k].rows)
                resumed = [mb for e, _, mb in WindowedPlan(plan.definition, plan.source, plan.index).iter_from(epoch, k)
                           if e == epoch]
                assert resumed == this_epoch[k:]


def test_the_index_counts_what_the_windows_hold():
    config = BatchingConfig.throughput(token_budget=2048, bucket_edges=(64, 256), overflow_max=1024, seed=3)
    lengths = lengths_for(5, 3000, 1100)
    definition = WindowDefinition(config, 3000, window=257)
    plan = WindowedPlan.build(definition, ArrayLengths(lengths), 2)
    assert plan.index.shape == (2, definition.num_windows + 1, 5)
    for epoch in range(2):
        for w in range(definition.num_windows):
            arrays = plan_window(definition, ArrayLengths(lengths), epoch, w)
            counts = plan.window_counts(epoch, w)
            assert counts["microbatches"] == arrays.bucket_ids.shape[0]
            assert counts["samples"] == arrays.samples.shape[0]
            assert counts["skipped"] == arrays.skipped.shape[0]
            assert counts["padded_tokens"] == int((np.diff(arrays.offsets) * arrays.max_len).sum())
            assert counts == dict(zip(counts, count_window(definition, ArrayLengths(lengths), epoch, w).as_tuple()))


def test_flush_costs_at_most_one_short_microbatch_per_bucket_and_window():
    config = BatchingConfig.predictable(token_budget=4096, bucket_edges=(128, 512), overflow_max=2048, seed=1)
    lengths = lengths_for(9, 20_000, 2048)
    whole = build_epoch(lengths, config, 0)
    definition = WindowDefinition(config, 20_000, window=1000)
    plan = WindowedPlan.build(definition, ArrayLengths(lengths))
    extra = plan.epoch_microbatches(0) - whole.bucket_ids.shape[0]
    assert 0 <= extra <= config.bucket_spec.num_buckets * definition.num_windows


def test_the_fingerprint_covers_the_window_the_lengths_and_the_epochs():
    config = BatchingConfig.throughput(token_budget=2048, bucket_edges=(64, 256), overflow_max=1024, seed=3)
    lengths = lengths_for(5, 2000, 1100)

    def fingerprint(window=300, values=lengths, epochs=1, cfg=config):
        return WindowedPlan.build(WindowDefinition(cfg, 2000, window=window), ArrayLengths(values), epochs).fingerprint

    base = fingerprint()
    assert base == fingerprint()
    changed = lengths.copy()
    changed[7] ^= 1
    others = {fingerprint(window=301), fingerprint(values=changed), fingerprint(epochs=2),
              fingerprint(cfg=BatchingConfig.throughput(token_budget=2048, bucket_edges=(64, 256), overflow_max=1024,
                                                        seed=4))}
    assert base not in others and len(others) == 4
    plan = WindowedPlan.build(WindowDefinition(config, 2000, window=300), ArrayLengths(lengths))
    assert plan.header()["window"] == {"window": 300, "edge": "flush", "num_samples": 2000}
    # the same lengths memory-mapped from a sidecar bind as they do in memory


def test_mapped_lengths_read_a_length_cache_sidecar(tmp_path):
    lengths = lengths_for(2, 5000, 3000)
    path = os.path.join(tmp_path, "lengths.jsonl")
    LengthCache.from_arrays(None, lengths, "tok").write(path)
    mapped = MappedLengths(sidecar_path(path))
    assert mapped.count == 5000 and mapped.tokenizer_hash == "tok"
    assert np.array_equal(mapped.take(np.arange(5000)[::-7]), lengths[::-7])
    assert mapped.binding() == ArrayLengths(lengths).binding()
    mapped.check_bytes()
    config = BatchingConfig.throughput(seed=11)
    definition = WindowDefinition(config, 5000, window=999)
    assert WindowedPlan.build(definition, mapped).fingerprint == \
        WindowedPlan.build(definition, ArrayLengths(lengths)).fingerprint
    mapped.release()
    assert np.array_equal(mapped.take(np.arange(10)), lengths[:10])  # pages map again after a release


def test_a_tampered_or_truncated_sidecar_is_refused(tmp_path):
    path = os.path.join(tmp_path, "lengths.jsonl")
    LengthCache.from_arrays(None, lengths_for(2, 100, 3000), "tok").write(path)
    side = sidecar_path(path)
    data = bytearray(Path(side).read_bytes())
    data[-1] ^= 0xFF
    Path(side).write_bytes(bytes(data))
    mapped = MappedLengths(side)  # opening reads the header only
    with pytest.raises(UmlosError) as caught:
        mapped.check_bytes()
    assert caught.value.code == errors.LENGTHS_SIDECAR_MISMATCH
    Path(side).write_bytes(bytes(data[:-4]))
    with pytest.raises(UmlosError) as caught:
        MappedLengths(side)
    assert caught.value.code == errors.LENGTHS_SIDECAR_MISMATCH and "100 lengths" in caught.value.message


def test_synthetic_lengths_are_a_fixed_function_of_seed_and_row():
    source = SyntheticLengths(10**10, seed=1)
    rows = np.asarray([0, 1, 2, 10**10 - 1])
    first = source.take(rows)
    assert first.tolist() == SyntheticLengths(10**10, seed=1).take(rows).tolist()
    assert first.tolist() != SyntheticLengths(10**10, seed=2).take(rows).tolist()
    assert first.tolist() == KNOWN_SYNTHETIC
    sample = source.take(np.arange(200_000))
    assert int(sample.min()) >= 16 and int(sample.max()) < 16384
    assert 700 <= float(np.median(sample)) <= 770  # the table's median is 735
    assert source.binding() == {"kind": "synthetic", "count": 10**10, "seed": 1,
                                "generator": "umlos_synthetic_lengths_v1"}


#: SyntheticLengths(10**10, seed=1) at rows 0, 1, 2 and 10^10 - 1 (a known answer: the formula never changes).
KNOWN_SYNTHETIC = [536, 1213, 1522, 423]


def test_synthetic_lengths_follow_their_definition_one_row_at_a_time():
    """SplitMix64's finaliser of key + (i + 1) x golden, in Python integers, against the vectorised source."""
    from umlos_cuda.batching.lengths.sources import SYNTHETIC_QUANTILES
    from umlos_cuda.hashing import hash_canonical

    mask = (1 << 64) - 1
    key = int.from_bytes(hash_canonical(["umlos_synthetic_lengths_v1", 9])[:8], "little")
    table = SYNTHETIC_QUANTILES.tolist()

    def length(i: int) -> int:
        z = (key + (i + 1) * 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        z ^= z >> 31
        b = z >> 56
        return table[b] + (((z & 0xFFFFFFFF) * (table[b + 1] - table[b])) >> 32)

    rows = [0, 1, 5, 2**33 + 7, 10**12 - 1]
    assert SyntheticLengths(10**12, seed=9).take(np.asarray(rows)).tolist() == [length(i) for i in rows]


def test_windows_refuse_what_they_do_not_plan_yet_and_bad_cursors():
    from umlos_cuda.batching.plans.overlong import OverlongConfig

    with pytest.raises(UmlosError) as caught:  # packing is planned (test_batching_windows_packed.py); over-long not
        WindowDefinition(BatchingConfig.throughput(overlong=OverlongConfig(max_length=1024)), 10)
    assert caught.value.code == errors.BATCHING_CONFIG_INVALID and "over-long" in caught.value.message
    for window in (0, 2**32 + 1):
        with pytest.raises(UmlosError) as caught:
            WindowDefinition(BatchingConfig.throughput(), 10, window=window)
        assert caught.value.code == errors.BATCHING_CONFIG_INVALID
    plan = WindowedPlan.build(WindowDefinition(BatchingConfig.throughput(), 50, window=8),
                              ArrayLengths(lengths_for(1, 50, 2000)))
    total = plan.epoch_microbatches(0)
    assert list(plan.iter_from(0, total)) == []  # the epoch is done
    for epoch, j in ((1, 0), (0, total), (0, -1)):
        with pytest.raises(UmlosError) as caught:
            plan.microbatch(epoch, j)
        assert caught.value.code == errors.PLAN_CURSOR_INVALID
    with pytest.raises(UmlosError) as caught:
        WindowedPlan.build(WindowDefinition(BatchingConfig.throughput(), 51), ArrayLengths(lengths_for(1, 50, 2000)))
    assert caught.value.code == errors.PLAN_LENGTHS_MISMATCH


def test_window_rows_are_the_engine_order():
    config = BatchingConfig.throughput(seed=5, order="feistel")
    definition = WindowDefinition(config, 10_000, window=999)
    rows = np.concatenate([window_rows(definition, 2, w) for w in range(definition.num_windows)])
    assert np.array_equal(rows, epoch_indices(plan_manifest(config, 10_000), "train", 2))


# ---------------------------------------------------------------------- folders and verify
def _saved(tmp_path, epochs=2, window=999):
    from umlos_cuda.batching.plans.windows import save_windowed_plan

    lengths = lengths_for(4, 10_000, 2200)
    path = os.path.join(tmp_path, "lengths.jsonl")
    LengthCache.from_arrays(None, lengths, "tok").write(path)
    plan = WindowedPlan.build(WindowDefinition(BatchingConfig.throughput(seed=2), 10_000, window=window),
                              MappedLengths(sidecar_path(path)), epochs)
    save_windowed_plan(plan, os.path.join(tmp_path, "wp"))
    return plan, lengths, os.path.join(tmp_path, "wp")


def test_a_saved_plan_reopens_to_the_same_microbatches_and_verifies(tmp_path):
    from umlos_cuda.batching.plans.windows import load_windowed_plan, verify_windowed_plan

    plan, lengths, folder = _saved(tmp_path)
    assert sorted(os.listdir(folder)) == ["index.npy", "meta.json", "umlos-artifact.json"]
    again = load_windowed_plan(folder)
    assert again.fingerprint == plan.fingerprint and np.array_equal(again.index, plan.index)
    k = plan.epoch_microbatches(1) - 3
    assert again.microbatch(1, k) == plan.microbatch(1, k)
    assert load_windowed_plan(folder, lengths=lengths).fingerprint == plan.fingerprint  # in memory: same binding
    report = verify_windowed_plan(folder, windows=3, seed=1, expected_fingerprint=plan.fingerprint)
    assert report["windows_checked"] == 3 and report["fingerprint"] == plan.fingerprint
    assert verify_windowed_plan(folder)["windows_checked"] == plan.definition.num_windows
    synthetic = WindowedPlan.build(WindowDefinition(BatchingConfig.throughput(), 5000, window=512),
                                   SyntheticLengths(5000, 8))
    from umlos_cuda.batching.plans.windows import save_windowed_plan

    save_windowed_plan(synthetic, os.path.join(tmp_path, "ws"))
    assert load_windowed_plan(os.path.join(tmp_path, "ws")).fingerprint == synthetic.fingerprint


def _refused(call, code):
    with pytest.raises(UmlosError) as caught:
        call()
    assert caught.value.code == code, caught.value.message
    return caught.value.message


def test_tampered_folders_and_lengths_are_refused_with_their_codes(tmp_path):
    import json

    from umlos_cuda.batching.plans.windows import load_windowed_plan, verify_windowed_plan

    plan, lengths, folder = _saved(tmp_path)
    meta_path, index_path = os.path.join(folder, "meta.json"), os.path.join(folder, "index.npy")
    meta, index = Path(meta_path).read_text(), Path(index_path).read_bytes()
    _refused(lambda: load_windowed_plan(os.path.join(tmp_path, "nothing")), errors.PLAN_NOT_FOUND)
    _refused(lambda: load_windowed_plan(folder, lengths=lengths[::-1].copy()), errors.PLAN_LENGTHS_MISMATCH)

    def edit(change):
        data = json.loads(meta)
        change(data)
        Path(meta_path).write_text(json.dumps(data))

    edit(lambda d: d["window"].update(window=1000))  # the same number of windows, other positions
    _refused(lambda: load_windowed_plan(folder), errors.PLAN_FORMAT_INVALID)
    edit(lambda d: d["window"].update(window=500))  # another index shape
    assert "index.npy" in _refused(lambda: load_windowed_plan(folder), errors.PLAN_FORMAT_INVALID)
    edit(lambda d: d.update(extra=1))
    _refused(lambda: load_windowed_plan(folder), errors.PLAN_FORMAT_INVALID)
    edit(lambda d: d["config"].update(seed=3))  # a consistent index of another plan: the engine's order differs
    _refused(lambda: load_windowed_plan(folder), errors.PLAN_NOT_REPRODUCIBLE)
    edit(lambda d: d.update(fingerprint="0" * 64))
    _refused(lambda: load_windowed_plan(folder), errors.PLAN_FINGERPRINT_MISMATCH)
    Path(meta_path).write_text(meta)
    # one window's counts moved to its neighbour: the totals still cover the epoch, the digest does not match
    raw = np.load(index_path).reshape(plan.index.shape)
    raw[0, 1, 3] += 5
    raw[0, 2:, 3] += 5
    np.save(index_path, raw.reshape(-1))
    _refused(lambda: load_windowed_plan(folder), errors.PLAN_FINGERPRINT_MISMATCH)
    Path(index_path).write_bytes(index)
    side = sidecar_path(os.path.join(tmp_path, "lengths.jsonl"))
    data = bytearray(Path(side).read_bytes())
    data[-2] ^= 1
    Path(side).write_bytes(bytes(data))
    _refused(lambda: verify_windowed_plan(folder, windows=1), errors.LENGTHS_SIDECAR_MISMATCH)


def test_verify_replans_windows_against_the_index(tmp_path, monkeypatch):
    from umlos_cuda.batching.plans.windows import verify_windowed_plan
    from umlos_cuda.batching.plans.windows import plan as plan_module

    _, _, folder = _saved(tmp_path, epochs=1)
    real = plan_module.plan_window

    def one_sample_short(*args, **kwargs):  # a planner that loses a microbatch's last sample
        from dataclasses import replace

        arrays = real(*args, **kwargs)
        return replace(arrays, offsets=np.minimum(arrays.offsets, arrays.offsets[-1] - 1),
                       samples=arrays.samples[:-1])

    monkeypatch.setattr(plan_module, "plan_window", one_sample_short)
    _refused(lambda: verify_windowed_plan(folder, windows=2), errors.PLAN_NOT_REPRODUCIBLE)


def test_plan_verify_checks_a_windowed_plan_and_refuses_windows_of_a_batch_plan(tmp_path, capsys):
    from umlos_cuda.batching import BatchPlanBuilder, save_plan
    from umlos_cuda.cli import main

    plan, lengths, folder = _saved(tmp_path)
    assert main(["plan", "verify", folder, "--windows", "2", "--seed", "4",
                 "--expected-fingerprint", plan.fingerprint]) == 0
    out = capsys.readouterr().out
    assert f"2 of {plan.definition.num_windows} windows" in out and plan.fingerprint in out
    assert main(["plan", "verify", folder, "--lengths", os.path.join(tmp_path, "lengths.jsonl")]) == 0
    assert f"{plan.definition.num_windows} of {plan.definition.num_windows} windows" in capsys.readouterr().out
    assert main(["plan", "verify", folder, "--expected-fingerprint", "0" * 64]) == 2
    assert "error PLAN_FINGERPRINT_MISMATCH" in capsys.readouterr().err
    save_plan(BatchPlanBuilder(lengths[:100], BatchingConfig.throughput()).build(1), os.path.join(tmp_path, "plan"))
    assert main(["plan", "verify", os.path.join(tmp_path, "plan"), "--windows", "2"]) == 2
    assert "error BATCHING_CONFIG_INVALID" in capsys.readouterr().err
    assert main(["plan", "verify", os.path.join(tmp_path, "plan")]) == 0


def test_plan_build_window_writes_the_plan_the_api_builds(tmp_path, capsys):
    from umlos_cuda.batching.plans.windows import load_windowed_plan
    from umlos_cuda.cli import main

    plan, _, _ = _saved(tmp_path)  # seed 2, throughput defaults, window 999, 2 epochs, over lengths.jsonl's sidecar
    lengths = os.path.join(tmp_path, "lengths.jsonl")
    argv = ["plan", "build", "--lengths", lengths, "--bucket-edges", "128,256,512,1024", "--overflow-max", "2048",
            "--token-budget", "4096", "--pad-policy", "pad_to_max", "--seed", "2", "--epochs", "2", "--window", "999",
            "--quiet", "--output"]
    assert main(argv + [os.path.join(tmp_path, "cli")]) == 0
    assert f"fingerprint {plan.fingerprint}" in capsys.readouterr().out
    assert load_windowed_plan(os.path.join(tmp_path, "cli")).fingerprint == plan.fingerprint
    assert main(argv + [os.path.join(tmp_path, "cli")]) == 2  # it exists
    assert "error OUTPUT_EXISTS" in capsys.readouterr().err
    assert main(argv + [os.path.join(tmp_path, "cli"), "--force"]) == 0
    assert main(argv + [os.path.join(tmp_path, "packed"), "--pack"]) == 0  # windowed packed plans: packed.py
    packed = load_windowed_plan(os.path.join(tmp_path, "packed"))
    assert packed.config.pack is not None and f"fingerprint {packed.fingerprint}" in capsys.readouterr().out
    os.unlink(sidecar_path(lengths))  # the sidecar is required
    assert main(argv + [os.path.join(tmp_path, "nosidecar")]) == 2
    assert "error LENGTHS_SIDECAR_MISMATCH" in capsys.readouterr().err


def test_plan_build_window_over_the_u32_alone_is_the_same_plan_and_its_bytes_are_checked(tmp_path, capsys):
    from umlos_cuda.cli import main

    plan, _, _ = _saved(tmp_path)
    side = sidecar_path(os.path.join(tmp_path, "lengths.jsonl"))
    argv = ["plan", "build", "--lengths", side, "--bucket-edges", "128,256,512,1024", "--overflow-max", "2048",
            "--token-budget", "4096", "--pad-policy", "pad_to_max", "--seed", "2", "--epochs", "2", "--window", "999",
            "--quiet", "--output"]
    os.unlink(os.path.join(tmp_path, "lengths.jsonl"))  # named by its .u32, the JSONL is not read
    assert main(argv + [os.path.join(tmp_path, "u32")]) == 0
    assert f"fingerprint {plan.fingerprint}" in capsys.readouterr().out
    data = bytearray(Path(side).read_bytes())
    data[-1] ^= 1  # a length byte changed, the header's SHA-256 not
    Path(side).write_bytes(bytes(data))
    assert main(argv + [os.path.join(tmp_path, "tampered")]) == 2
    err = capsys.readouterr().err
    assert "error LENGTHS_SIDECAR_MISMATCH" in err and "SHA-256" in err
    assert not os.path.exists(os.path.join(tmp_path, "tampered"))


def test_plan_build_window_reads_no_id_and_releases_the_sidecar_as_it_checks_it(tmp_path, capsys, monkeypatch):
    """At 10^9 samples the ids alone are tens of GB: the windowed build checks the sidecar against the JSONL
    in one streaming pass (rows.py) that drops the mapped pages it read, and asks for the first id only."""
    from umlos_cuda.batching.lengths import cache as cache_module, rows
    from umlos_cuda.cli import main

    path = os.path.join(tmp_path, "lengths.jsonl")
    LengthCache.from_arrays([f"doc-{i}" for i in range(40_000)], lengths_for(6, 40_000, 900) + 1, "tok").write(path)
    assert os.path.getsize(path) > 2 * (1 << 20)  # more than two blocks of the scan

    def parse(*_args, **_kwargs):
        raise AssertionError("the windowed build parsed the JSONL's ids")

    released = []
    real = cache_module._releaser
    monkeypatch.setattr(cache_module, "_parse_jsonl", parse)
    monkeypatch.setattr(cache_module, "_releaser", lambda mapped: (lambda: released.append(1), real(mapped))[0])
    monkeypatch.setattr(rows, "_RELEASE_BLOCKS", 1)
    assert main(["plan", "build", "--lengths", path, "--bucket-edges", "128,512", "--overflow-max", "1024",
                 "--token-budget", "4096", "--window", "4096", "--quiet", "--output", os.path.join(tmp_path, "w")]) == 0
    assert "40000 samples per epoch" in capsys.readouterr().out
    assert len(released) >= 3  # the length bytes hashed (one piece), then every block of the JSONL scanned


def test_first_sample_id_reads_one_row(tmp_path):
    path = os.path.join(tmp_path, "lengths.jsonl")
    LengthCache.from_arrays(["a\"b", "c"], [3, 4], "tok").write(path)
    assert LengthCache.load(path).first_sample_id() == 'a"b'
    assert LengthCache.load(path, read_ids=True).first_sample_id() == 'a"b'
    LengthCache.from_arrays(None, [3, 4], "tok").write(path, force=True)
    assert LengthCache.load(path).first_sample_id() == "0"


def test_plan_build_window_refuses_a_cache_of_preference_pairs(tmp_path, capsys):
    from umlos_cuda.batching.lengths.pairs import pair_ids
    from umlos_cuda.cli import main

    ids = [i for r in range(20) for i in pair_ids(f"r{r}")]
    path = os.path.join(tmp_path, "pairs.jsonl")
    LengthCache.from_arrays(ids, lengths_for(1, 40, 500), "tok").write(path)
    assert main(["plan", "build", "--lengths", path, "--bucket-edges", "128", "--overflow-max", "512",
                 "--token-budget", "2048", "--window", "8", "--quiet", "--output", os.path.join(tmp_path, "w")]) == 2
    err = capsys.readouterr().err
    assert "error BATCHING_CONFIG_INVALID" in err and "pairs" in err and not os.path.exists(os.path.join(tmp_path, "w"))
    other = os.path.join(tmp_path, "plain.jsonl")
    LengthCache.from_arrays(None, lengths_for(2, 40, 500), "tok").write(other)
    assert main(["plan", "build", "--mix", f"{other}:1", f"{path}:1", "--num-samples", "30", "--bucket-edges", "128",
                 "--overflow-max", "512", "--token-budget", "2048", "--window", "8", "--quiet", "--output",
                 os.path.join(tmp_path, "m")]) == 2  # nor does a mixture split them
    err = capsys.readouterr().err
    assert "error BATCHING_CONFIG_INVALID" in err and "pairs" in err and not os.path.exists(os.path.join(tmp_path, "m"))
