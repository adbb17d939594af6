"""Collation (docs/batching.md, "Collation").

* default_collate equals a position-by-position reference of the documented
  rules (hypothesis over single and packed rows, pad ids, both pad policies);
* every kind of row it accepts gives the same arrays: Sample, tuple, mapping,
  and the packed rows of umlos_cuda.batching.packing.rows (labels ignored at
  separators and segment ends, its position_ids kept);
* every refused input raises COLLATE_INPUT_INVALID;
* the presets (umlos_cuda/batching/presets.py): ``shifted`` is the batch's
  own arrays; ``hf`` and ``padding_free`` equal a position-by-position
  reference of their documented rules; dtypes are the ones asked for; every
  refused argument raises COLLATE_INPUT_INVALID naming the choices;
* a DataLoader with PlanBatchSampler, TokenDataset and PlanCollator, with
  worker processes (fork and spawn), yields exactly the plan's microbatches
  collated from the store. (tests/test_batching_hf_models.py feeds the
  presets to a ``transformers`` model.)
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from batching_cases import expect
from token_cases import make_store
from umlos_cuda import errors
from umlos_cuda.batching import BatchingConfig, BatchPlanBuilder, Sample, SampleMeta, save_plan
from umlos_cuda.batching.collate import (FIELDS, IGNORE_INDEX, CollatedBatch, collate_arrays, collate_microbatch,
                                         default_collate)
from umlos_cuda.batching.packing.rows import pack_rows
from umlos_cuda.batching.presets import apply_preset


def reference(rows, width: int, pad_id: int = 0) -> dict:
    """The documented rules, one position at a time."""
    out = {name: [] for name in FIELDS}
    for ids, mask, segments in rows:
        n = len(ids)
        segments = list(segments) if segments is not None else [0] * n
        lines = {name: [] for name in FIELDS}
        for t in range(width):
            real = t < n
            lines["input_ids"].append(ids[t] if real else pad_id)
            lines["loss_mask"].append(mask[t] if real else 0)
            lines["attention_mask"].append(1 if real else 0)
            lines["segment_ids"].append(segments[t] if real else -1)
            lines["position_ids"].append(t - segments.index(segments[t]) if real else 0)
            trained = t + 1 < n and mask[t + 1] == 1 and segments[t + 1] == segments[t]
            lines["labels"].append(ids[t + 1] if trained else IGNORE_INDEX)
        for name in FIELDS:
            out[name].append(lines[name])
    return out


@st.composite
def rows_strategy(draw):
    count = draw(st.integers(1, 5))
    rows = []
    for _ in range(count):
        n = draw(st.integers(1, 12))
        ids = draw(st.lists(st.integers(0, 2 ** 31 - 1), min_size=n, max_size=n))
        mask = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
        segments = None
        if draw(st.booleans()):
            steps = draw(st.lists(st.integers(0, 1), min_size=n - 1, max_size=n - 1))
            segments = list(np.concatenate([[0], np.cumsum(steps)]).astype(int)) if n > 1 else [0]
        rows.append((ids, mask, segments))
    return rows


@settings(max_examples=300, deadline=None)
@given(rows_strategy(), st.integers(0, 6), st.integers(0, 1000), st.booleans())
def test_collation_follows_the_documented_rules(rows, extra, pad_id, bucket):
    longest = max(len(ids) for ids, _, _ in rows)
    items = [(np.array(ids), np.array(mask)) if seg is None else (np.array(ids), np.array(mask), np.array(seg))
             for ids, mask, seg in rows]
    if bucket:
        batch = default_collate(items, longest + extra, "pad_to_bucket", pad_id=pad_id)
        width = longest + extra
    else:
        batch = default_collate(items, longest + extra, "pad_to_max", pad_id=pad_id)
        width = longest
    expected = reference(rows, width, pad_id)
    for name in FIELDS:
        array = getattr(batch, name)
        assert array.dtype == np.int32 and array.shape == (len(rows), width)
        assert array.tolist() == expected[name], name
    assert batch.num_tokens == sum(len(ids) for ids, _, _ in rows) and batch.shape == (len(rows), width)


def test_a_worked_example():
    batch = default_collate([([5, 6, 7], [0, 1, 1]), ([8, 9], [1, 1])], 4, "pad_to_bucket")
    assert batch.labels.tolist() == [[6, 7, -100, -100], [9, -100, -100, -100]]
    assert batch.segment_ids.tolist() == [[0, 0, 0, -1], [0, 0, -1, -1]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 0], [0, 1, 0, 0]]


def test_every_kind_of_row_gives_the_same_arrays():
    meta = SampleMeta("s", "d")
    samples = [Sample([3, 4, 5], [0, 1, 1], None, meta), Sample([6, 7], [1, 1], [0, 1], meta)]
    tuples = [((3, 4, 5), (0, 1, 1)), ([6, 7], [1, 1], [0, 1])]
    mappings = [{"input_ids": [3, 4, 5], "loss_mask": [0, 1, 1]},
                {"input_ids": np.array([6, 7]), "loss_mask": [1, 1], "segment_ids": [0, 1]}]
    first = default_collate(samples, 5, "pad_to_bucket")
    for other in (tuples, mappings):
        again = default_collate(other, 5, "pad_to_bucket")
        assert all(np.array_equal(getattr(first, n), getattr(again, n)) for n in FIELDS)
    assert first.labels.tolist()[1] == [-100, -100, -100, -100, -100]  # segment end, then padding
    restored = CollatedBatch.from_dict(first.as_dict())
    assert all(np.array_equal(getattr(restored, n), getattr(first, n)) for n in FIELDS)


def test_packed_rows_collate_with_their_segments_and_positions():
    rows = pack_rows([[{"sample_id": "a", "input_ids": [10, 11, 12], "loss_mask": [0, 1, 1]},
                       {"sample_id": "b", "input_ids": [20, 21]}],
                      [{"sample_id": "c", "input_ids": [30]}]], separator_ids=[2])
    batch = default_collate(rows, 8, "pad_to_bucket")
    assert batch.input_ids.tolist()[0] == [10, 11, 12, 2, 20, 21, 0, 0]
    assert batch.segment_ids.tolist()[0] == [0, 0, 0, 0, 1, 1, -1, -1]  # the separator belongs to segment 0
    assert batch.position_ids.tolist()[0] == rows[0].position_ids.tolist() + [0, 0]
    # trained: 11 -> 12 (mask 1); the separator and the first token of "b" are not predicted
    assert batch.labels.tolist()[0] == [11, 12, -100, -100, 21, -100, -100, -100]
    assert batch.loss_mask.tolist()[0] == [0, 1, 1, 0, 1, 1, 0, 0]
    assert batch.labels.tolist()[1] == [-100] * 8


@pytest.mark.parametrize("call, mention", [
    (lambda: default_collate([], 4), "non-empty sequence"),
    (lambda: default_collate("ab", 4), "non-empty sequence"),
    (lambda: default_collate([object()], 4), "no input_ids"),
    (lambda: default_collate([([1, 2], [1])], 4), "loss_mask has shape"),
    (lambda: default_collate([([1, 2], [1, 2])], 4), "0 or 1"),
    (lambda: default_collate([(np.array([2 ** 31], dtype=np.uint32), [1])], 4), "int32"),
    (lambda: default_collate([(np.array([-1]), [1])], 4), "int32"),
    (lambda: default_collate([(["a"], [1])], 4), "integer"),
    (lambda: default_collate([([1, 2, 3], [1, 1, 1])], 2, "pad_to_bucket"), "rows hold at most 2"),
    (lambda: default_collate([([1, 2, 3], [1, 1, 1])], 2, "pad_to_max"), "never cut"),
    (lambda: default_collate([([], [])], 2), "is empty"),
    (lambda: default_collate([([[1]], [1])], 2), "flat sequence"),
    (lambda: default_collate([([1], [1])], None, "pad_to_bucket"), "give max_len"),
    (lambda: default_collate([([1], [1])], 0, "pad_to_bucket"), "max_len must be"),
    (lambda: default_collate([([1], [1])], True, "pad_to_bucket"), "max_len must be"),
    (lambda: default_collate([([1], [1])], 4, "pad_to_middle"), "pad_to_bucket, pad_to_max"),
    (lambda: default_collate([([1], [1])], 4, pad_id=-1), "pad_id"),
    (lambda: default_collate([([1, 2], [1, 1], [1, 1])], 4), "start at 0"),
    (lambda: default_collate([([1, 2], [1, 1], [0, 2])], 4), "step by 0 or 1"),
    (lambda: default_collate([([1, 2], [1, 1], [0])], 4), "segment_ids must be 2"),
    (lambda: default_collate([([1, 2, 3], [1, 1, 1], None, 4)], 4), "tuple row"),
    (lambda: collate_arrays([np.array([1])], [], 2), "one per row"),
    (lambda: CollatedBatch.from_dict({"input_ids": np.zeros((1, 1))}), "missing labels"),
])
def test_refused_inputs(call, mention):
    expect(errors.COLLATE_INPUT_INVALID, call, mention=mention)


def test_an_empty_row_is_refused():
    expect(errors.COLLATE_INPUT_INVALID, collate_arrays, [np.array([], dtype=np.int64)], [np.array([])], 3,
           mention="row 0 is empty")


# ====================================================================== presets
def preset_reference(rows, width: int) -> tuple[dict, dict]:
    """The ``hf`` labels and the ``padding_free`` arrays, one position at a time."""
    hf_labels, flat, lengths = [], {"input_ids": [], "labels": [], "position_ids": []}, []
    for ids, mask, segments in rows:
        segments = list(segments) if segments is not None else [0] * len(ids)
        line = []
        for t in range(width):
            follows = 0 < t < len(ids) and segments[t] == segments[t - 1]
            line.append(ids[t] if follows and mask[t] == 1 else IGNORE_INDEX)
            if t < len(ids):
                if not follows:
                    lengths.append(0)
                lengths[-1] += 1
                flat["input_ids"].append(ids[t])
                flat["labels"].append(line[-1])
                flat["position_ids"].append(t - segments.index(segments[t]))
        hf_labels.append(line)
    flat["cu"] = np.cumsum([0] + lengths).tolist()
    return {"labels": hf_labels}, flat


@settings(max_examples=200, deadline=None)
@given(rows_strategy(), st.integers(0, 4), st.sampled_from(["int32", "int64"]))
def test_presets_follow_their_documented_rules(rows, extra, dtype):
    from umlos_cuda.batching.attention_mask import create_segment_attention_mask

    items = [(np.array(ids), np.array(mask)) if seg is None else (np.array(ids), np.array(mask), np.array(seg))
             for ids, mask, seg in rows]
    width = max(len(ids) for ids, _, _ in rows) + extra
    batch = default_collate(items, width, "pad_to_bucket")
    hf_want, flat_want = preset_reference(rows, width)
    hf = apply_preset(batch, "hf", dtype=dtype)
    assert list(hf) == ["input_ids", "labels", "attention_mask", "position_ids"]
    assert hf["labels"].tolist() == hf_want["labels"]
    assert np.array_equal(hf["labels"][:, 1:], batch.labels[:, :-1])  # the shifted targets, one column on
    assert all(hf[name].dtype == np.dtype(dtype) for name in ("input_ids", "labels", "position_ids"))
    assert np.array_equal(hf["input_ids"], batch.input_ids) and np.array_equal(hf["position_ids"], batch.position_ids)
    packed = int(batch.segment_ids.max()) > 0
    if packed:
        assert hf["attention_mask"].dtype == bool and hf["attention_mask"].shape == (len(rows), 1, width, width)
        assert np.array_equal(hf["attention_mask"][:, 0], create_segment_attention_mask(batch.segment_ids))
    else:
        assert hf["attention_mask"].dtype == np.dtype(dtype)
        assert np.array_equal(hf["attention_mask"], batch.attention_mask)
    flat = apply_preset(batch, "padding_free", dtype=dtype)
    assert list(flat) == ["input_ids", "labels", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
                          "max_length_k"]
    for name in ("input_ids", "labels", "position_ids"):
        assert flat[name].dtype == np.dtype(dtype) and flat[name].tolist() == [flat_want[name]], name
    for name in ("cu_seq_lens_q", "cu_seq_lens_k"):
        assert flat[name].dtype == np.int32 and flat[name].tolist() == flat_want["cu"]
    assert flat["max_length_q"] == flat["max_length_k"] == max(np.diff(flat_want["cu"]))
    assert type(flat["max_length_q"]) is int


def test_the_shifted_preset_is_the_batch_itself():
    batch = default_collate([([5, 6, 7], [0, 1, 1]), ([8, 9], [1, 1])], 4, "pad_to_bucket")
    arrays = apply_preset(batch, "shifted")
    assert list(arrays) == list(FIELDS) and all(arrays[n] is getattr(batch, n) for n in FIELDS)  # byte for byte
    wide = apply_preset(batch, "shifted", dtype="int64")
    assert all(wide[n].dtype == np.int64 and np.array_equal(wide[n], getattr(batch, n)) for n in FIELDS)


def test_an_additive_mask_for_eager_attention():
    packed = default_collate([([5, 6, 7], [1, 1, 1], [0, 0, 1])], 4, "pad_to_bucket")
    mask = apply_preset(packed, "hf", mask_dtype="float32")["attention_mask"]
    attend = apply_preset(packed, "hf")["attention_mask"]
    assert mask.dtype == np.float32 and set(np.unique(mask).tolist()) == {0.0, float(np.finfo(np.float32).min)}
    assert np.array_equal(mask == 0, attend)
    assert apply_preset(packed, "hf", attention="4d")["attention_mask"].shape == (1, 1, 4, 4)
    single = default_collate([([5, 6], [1, 1])], 3, "pad_to_bucket")
    assert apply_preset(single, "hf", attention="4d")["attention_mask"][0, 0].tolist() == [
        [True, False, False], [True, True, False], [False, False, True]]  # padding attends to padding only


@pytest.mark.parametrize("options, mention", [
    ({"preset": "huggingface"}, "shifted, hf, padding_free"),
    ({"preset": "hf", "dtype": "float32"}, "dtype must be one of int32, int64"),
    ({"preset": "hf", "dtype": "int16"}, "int32, int64"),
    ({"preset": "hf", "attention": "3d"}, "auto, 2d, 4d"),
    ({"preset": "hf", "mask_dtype": "bfloat16"}, "bool, float16, float32, float64"),
    ({"preset": "padding_free", "cu_seq_lens_dtype": "uint32"}, "cu_seq_lens_dtype"),
    ({"preset": "hf", "attention": "2d"}, "use attention='4d'"),
])
def test_refused_preset_arguments(options, mention):
    packed = default_collate([([5, 6, 7], [1, 1, 1], [0, 0, 1])], 4, "pad_to_bucket")
    expect(errors.COLLATE_INPUT_INVALID, apply_preset, packed, **options, mention=mention)


def test_padding_free_refuses_a_batch_without_tokens():
    batch = default_collate([([5], [1])], 2, "pad_to_bucket")
    empty = CollatedBatch(*(np.zeros_like(batch.input_ids) for _ in FIELDS))
    expect(errors.COLLATE_INPUT_INVALID, apply_preset, empty, "padding_free", mention="no tokens")


# ====================================================================== plans, stores and DataLoader
@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    root = tmp_path_factory.mktemp("collate")
    store = make_store(root, 200, seed=9)
    plans = {}
    for policy in ("predictable", "throughput"):
        config = getattr(BatchingConfig, policy)(token_budget=1024, bucket_edges=(32, 64, 128), overflow_max=256,
                                                 seed=5)
        plans[policy] = BatchPlanBuilder(store.length_cache(), config).build(2)
        save_plan(plans[policy], root / f"plan-{policy}")
    return root, store, plans


def test_a_plan_microbatch_collates_like_its_samples(planned):
    _, store, plans = planned
    for plan in plans.values():
        for mb in list(plan.iter_epoch(1))[:10]:
            batch = collate_microbatch(store, mb)
            samples = [store.sample(int(r)) for r in mb.rows]
            again = default_collate(samples, mb.max_len, plan.config.pad_policy)
            assert batch.shape == (len(mb.samples), mb.max_len)
            assert all(np.array_equal(getattr(batch, n), getattr(again, n)) for n in FIELDS)
            for preset in ("shifted", "hf", "padding_free"):
                direct = collate_microbatch(store, mb, preset=preset, dtype="int32")
                assert all(np.array_equal(a, b) for a, b in zip(direct.values(), apply_preset(
                    batch, preset, dtype="int32").values()))
    expect(errors.COLLATE_INPUT_INVALID, collate_microbatch, store, mb, preset="hf", dtype="uint8",
           mention="microbatch")  # the store and microbatch are named, as for every collation failure


def test_a_token_dataset_given_its_plan_refuses_another_datasets_store(planned, tmp_path):
    """Another dataset's store of the same row count was indexed by the plan without a word; batch generate
    refused the same pair (BATCH_STORE_MISMATCH): now TokenDataset(store, plan=...) refuses it too."""
    from umlos_cuda.batching.plans.windows import ArrayLengths, WindowDefinition, WindowedPlan
    from umlos_cuda.torch import TokenDataset

    root, store, plans = planned
    other = make_store(tmp_path, len(store), seed=10)
    assert len(other) == len(store) and other.tokenizer_hash == store.tokenizer_hash
    windowed = WindowedPlan.build(WindowDefinition(plans["predictable"].config, len(store), 64),
                                  ArrayLengths(store.lengths), 1)
    for plan in (plans["predictable"], root / "plan-predictable", windowed):
        assert len(TokenDataset(root / "store", plan=plan)) == len(store)
        expect(errors.BATCH_STORE_MISMATCH, TokenDataset, tmp_path / "store", plan=plan, mention="lengths of")
    assert len(TokenDataset(tmp_path / "store")) == len(store)  # without its plan, nothing to check against
    expect(errors.BATCH_STORE_MISMATCH, TokenDataset, tmp_path / "store", plan=BatchPlanBuilder(
        store.length_cache().lengths[:100], plans["predictable"].config).build(1), mention="holds 200 samples")


@pytest.mark.parametrize("policy, context, workers, rank, world", [
    ("predictable", "fork", 2, 0, 1),
    ("throughput", "fork", 2, 1, 2),
    ("predictable", "spawn", 1, 0, 1),
])
def test_a_dataloader_with_workers_yields_the_plans_microbatches(planned, policy, context, workers, rank, world):
    import torch
    from torch.utils.data import DataLoader

    from umlos_cuda.torch import PlanBatchSampler, PlanCollator, TokenDataset

    root, store, plans = planned
    plan = plans[policy]
    loader = DataLoader(TokenDataset(root / "store"), batch_sampler=PlanBatchSampler(plan, rank, world),
                        collate_fn=PlanCollator(root / f"plan-{policy}"), num_workers=workers,
                        multiprocessing_context=context)
    got = list(loader)
    expected = [mb for mb in plan.iter_epoch(0) if mb.index % world == rank]
    assert len(got) == len(expected) > 0
    for batch, mb in zip(got, expected):
        assert batch["rows"].tolist() == mb.rows.tolist()
        reference_batch = collate_microbatch(store, mb)
        for name in FIELDS:
            assert batch[name].dtype == torch.int32
            assert np.array_equal(batch[name].numpy(), getattr(reference_batch, name)), name
