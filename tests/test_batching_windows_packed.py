"""Windowed packed plans (docs/batching.md, "Windowed packed plans"): the packed plan applied per window
with the flush edge rule. Exactness: wherever W >= N it is the whole-epoch packed plan array for array;
with W < N each window is the reference packer on that window's samples alone; the index counts rows;
the fingerprint covers the packing; verify and the folder round trip work."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from packing_reference import reference_pack_lengths
from umlos_cuda import errors
from umlos_cuda.batching.packing.config import PackingConfig
from umlos_cuda.batching.plans.config import BatchingConfig
from umlos_cuda.batching.plans.planner import build_epoch
from umlos_cuda.batching.plans.windows import (ArrayLengths, WindowDefinition, WindowedPlan, count_window,
                                               load_windowed_plan, plan_window, save_windowed_plan,
                                               verify_windowed_plan)
from umlos_cuda.batching.plans.windows.window import window_rows
from umlos_cuda.errors import UmlosError

MODES = ("first_fit", "best_fit", "greedy")


@st.composite
def packed_configs(draw):
    max_length = draw(st.integers(8, 300))
    edges = draw(st.sampled_from([(), (max_length // 3 + 1,), (max_length // 4 + 1, max_length // 2 + 2)]))
    edges = tuple(e for e in edges if e < max_length)
    overflow = draw(st.integers((edges[-1] + 1) if edges else 1, max_length))
    budget = max_length * draw(st.integers(1, 5)) + draw(st.integers(0, max_length - 1))
    pack = PackingConfig(max_length, draw(st.sampled_from(MODES)), separator_len=draw(st.integers(0, 2)))
    stage = draw(st.sampled_from(["SHUFFLE_WITHOUT_REPLACEMENT_BLOCK_AFFINE_V1", "SEQUENTIAL_V1"]))
    return BatchingConfig(budget, edges, overflow, seed=draw(st.integers(0, 2**64 - 1)), stage=stage,
                          min_length=draw(st.integers(0, 2)), order=draw(st.sampled_from(["block_affine", "feistel"])),
                          sampler_block_size=draw(st.sampled_from([7, 64, 1 << 20])), pack=pack)


def lengths_for(seed: int, n: int, high: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, high, n).astype(np.uint32)


@settings(max_examples=60, deadline=None)
@given(packed_configs(), st.integers(1, 500), st.integers(0, 2**32 - 1), st.integers(0, 3), st.integers(0, 64))
def test_a_window_of_at_least_n_is_the_whole_epoch_packed_plan_array_for_array(config, n, seed, epoch, extra):
    lengths = lengths_for(seed, n, config.bucket_spec.overflow_max + 40)
    window = plan_window(WindowDefinition(config, n, window=n + extra), ArrayLengths(lengths), epoch, 0)
    whole = build_epoch(lengths, config, epoch)
    for name in ("offsets", "samples", "bucket_ids", "max_len", "skipped", "row_offsets", "pack_rows"):
        assert np.array_equal(getattr(window, name), getattr(whole, name)), name
        assert getattr(window, name).dtype == getattr(whole, name).dtype, name


def reference_window(lengths: np.ndarray, rows: np.ndarray, config: BatchingConfig) -> dict[int, list]:
    """Per bucket, the window's microbatches by the definition, in plain Python: the bucket's samples
    of this window in position order, packed by the reference packer, every ``budget // max_length``
    rows a microbatch, the last one closed by the window (flush). A microbatch is a tuple of rows."""
    pack, spec = config.pack, config.bucket_spec
    per = config.token_budget // pack.max_length
    out: dict[int, list] = {}
    for k in range(spec.num_buckets):
        low, high = spec.bucket_range(k)
        members = [int(r) for r in rows if low <= int(lengths[r]) <= high]
        row_of = reference_pack_lengths([int(lengths[r]) for r in members], pack.max_length, pack.mode.value,
                                        pack.separator_len)
        packed = [tuple(r for r, b in zip(members, row_of) if b == row) for row in range(max(row_of, default=-1) + 1)]
        out[k] = [tuple(packed[i:i + per]) for i in range(0, len(packed), per)]
    return {k: v for k, v in out.items() if v}


def window_microbatches(arrays) -> dict[int, list]:
    out: dict[int, list] = {}
    for j in range(arrays.bucket_ids.shape[0]):
        first, last = int(arrays.pack_rows[j]), int(arrays.pack_rows[j + 1])
        packed = tuple(tuple(int(r) for r in arrays.samples[arrays.row_offsets[i]:arrays.row_offsets[i + 1]])
                       for i in range(first, last))
        out.setdefault(int(arrays.bucket_ids[j]), []).append(packed)
    return out


@settings(max_examples=50, deadline=None)
@given(packed_configs(), st.integers(1, 400), st.integers(1, 150), st.integers(0, 2**32 - 1), st.integers(0, 2))
def test_each_window_is_the_packer_on_its_samples_alone(config, n, window, seed, epoch):
    lengths = lengths_for(seed, n, config.bucket_spec.overflow_max + 40)
    definition = WindowDefinition(config, n, window=window)
    source = ArrayLengths(lengths)
    seen = []
    for w in range(definition.num_windows):
        rows = window_rows(definition, epoch, w)
        arrays = plan_window(definition, source, epoch, w)
        assert window_microbatches(arrays) == reference_window(lengths, rows, config)
        counts = count_window(definition, source, epoch, w)
        assert counts.microbatches == arrays.bucket_ids.shape[0]
        assert counts.padded_tokens == (arrays.row_offsets.shape[0] - 1) * config.pack.max_length
        assert counts.tokens == int(lengths[arrays.samples].sum(dtype=np.uint64))
        assert np.all(np.diff(arrays.pack_rows) * config.pack.max_length <= config.token_budget)
        seen.append(np.concatenate((arrays.samples, arrays.skipped)))
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(n))  # every sample once per epoch


def _packed(mode="first_fit", max_length=256, budget=1024, edges=(64,)):
    return BatchingConfig(budget, edges, max_length, seed=3, pack=PackingConfig(max_length, mode))


def test_random_access_and_specs_carry_the_rows():
    lengths = lengths_for(5, 3000, 257)
    plan = WindowedPlan.build(WindowDefinition(_packed(), 3000, window=500), ArrayLengths(lengths), 2)
    full = list(plan.iter_from(1, 0))
    assert len(full) == plan.epoch_microbatches(1)
    for _, j, spec in full[::37]:
        again = plan.microbatch(1, j)
        assert again.samples == spec.samples and again.packs == spec.packs
        assert sum(spec.pack_sizes) == len(spec.samples)
        assert [tuple(str(r) for r in row) for row in spec.packed_rows()] == list(spec.packs)
        assert all(int(lengths[row].sum()) <= 256 for row in spec.packed_rows())
    rows = sum(len(spec.packs) for _, _, spec in full)
    assert plan.epoch_counts(1)["padded_tokens"] == rows * 256


def test_the_fingerprint_covers_the_packing_and_unpacked_plans_hash_as_before():
    lengths = ArrayLengths(lengths_for(6, 800, 257))
    base = WindowedPlan.build(WindowDefinition(_packed(), 800, window=300), lengths)
    assert "pack_config" in base.header()
    prints = {base.fingerprint}
    for config in (_packed("greedy"), _packed(budget=768), _packed(max_length=300)):
        prints.add(WindowedPlan.build(WindowDefinition(config, 800, window=300), lengths).fingerprint)
    assert len(prints) == 4
    plain = WindowedPlan.build(WindowDefinition(BatchingConfig(1024, (64,), 256, seed=3), 800, window=300), lengths)
    assert "pack_config" not in plain.header()


def test_a_saved_packed_plan_reopens_verifies_and_refuses_a_changed_pack(tmp_path):
    import json

    lengths = lengths_for(7, 2000, 257)
    plan = WindowedPlan.build(WindowDefinition(_packed("best_fit"), 2000, window=333), ArrayLengths(lengths), 2)
    folder = tmp_path / "wp"
    save_windowed_plan(plan, folder, lengths_path=None)
    again = load_windowed_plan(folder, lengths=lengths)
    assert again.fingerprint == plan.fingerprint and again.config.pack == plan.config.pack
    assert [s.packs for _, _, s in again.iter_from(0, 0)] == [s.packs for _, _, s in plan.iter_from(0, 0)]
    report = verify_windowed_plan(folder, lengths=lengths)
    assert report["windows_checked"] == plan.definition.num_windows
    meta = json.loads((folder / "meta.json").read_text())
    meta["pack_config"]["mode"] = "greedy"
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UmlosError) as caught:
        load_windowed_plan(folder, lengths=lengths)
    assert caught.value.code == errors.PLAN_FINGERPRINT_MISMATCH


def test_the_row_check_refuses_a_row_over_max_length_or_rows_that_miss_their_samples():
    from dataclasses import replace

    from umlos_cuda.batching.plans.windows.packed import check_window_rows

    lengths = lengths_for(8, 600, 257)
    definition = WindowDefinition(_packed(), 600, window=200)
    source = ArrayLengths(lengths)
    arrays = plan_window(definition, source, 0, 1)
    check_window_rows(arrays, lengths[arrays.samples], definition.config, "w1")  # the planned window passes
    everything = arrays.samples.shape[0]  # one row holding every sample: far over max_length
    assert int(lengths[arrays.samples].sum()) > 256
    merged = replace(arrays, row_offsets=np.array([0, everything], dtype=np.int64),
                     pack_rows=np.array([0] + [1] * arrays.bucket_ids.shape[0], dtype=np.int64),
                     offsets=np.array([0] + [everything] * arrays.bucket_ids.shape[0], dtype=np.int64))
    shifted = replace(arrays, pack_rows=np.minimum(arrays.pack_rows + 1, arrays.row_offsets.shape[0] - 1))
    for broken, words in ((merged, "pack max_length is 256"), (shifted, "do not hold exactly its samples")):
        with pytest.raises(UmlosError) as caught:
            check_window_rows(broken, lengths[broken.samples], definition.config, "w1")
        assert caught.value.code == errors.PLAN_PACKS_INVALID and words in caught.value.message


@pytest.mark.parametrize("pack_config", ["x", [1], None, {"max_length": "a"}, {"mode": "first_fit", "max_length": 4096,
                                                                             "separator_len": 0}])
def test_a_tampered_pack_config_is_a_format_error(tmp_path, pack_config):
    import json

    lengths = lengths_for(9, 300, 257)
    plan = WindowedPlan.build(WindowDefinition(_packed(), 300, window=100), ArrayLengths(lengths))
    save_windowed_plan(plan, tmp_path / "wp")
    meta = json.loads((tmp_path / "wp" / "meta.json").read_text())
    meta["pack_config"] = pack_config  # the last: max_length above the token budget
    (tmp_path / "wp" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UmlosError) as caught:
        load_windowed_plan(tmp_path / "wp", lengths=lengths)
    assert caught.value.code == errors.PLAN_FORMAT_INVALID
