"""Collation (docs/batching.md, "Collation").

* default_collate equals a position-by-position reference of the documented
  rules (hypothesis over single and packed rows, pad ids, both pad policies);
* every kind of row it accepts gives the same arrays: Sample, tuple, mapping,
  and the packed rows of umlos_cuda.batching.packing.rows (labels ignored at
  separators and segment ends, its position_ids kept);
* every refused input raises COLLATE_INPUT_INVALID;
* a DataLoader with PlanBatchSampler, TokenDataset and PlanCollator, with
  worker processes (fork and spawn), yields exactly the plan's microbatches
  collated from the store.
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
