"""The ``plan`` cursor kind: a batch plan's cursor is saved in checkpoints beside
the NextBatch cursors, bound to the plan's fingerprint, verified, and restored
into a sampler at another world size; a restore into another plan is refused."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

import umlos_cuda as uc
from umlos_cuda import errors
from umlos_cuda.batching import BatchingConfig, BatchPlanBuilder
from umlos_cuda.batching.plans.checkpoint_kinds import PlanCursor
from umlos_cuda.checkpoint import CheckpointStore, cursor_kinds, restore_latest, verify_store
from test_checkpoint_support import DATASET, KEY, files_of, identity, state

pytest.importorskip("torch")
from umlos_cuda.torch import PlanBatchSampler


def make_plan(seed=3):
    lengths = np.random.default_rng(seed).integers(1, 2048, 1500).astype(np.uint32)
    return BatchPlanBuilder(lengths, BatchingConfig.throughput(8192, seed=seed), tokenizer_hash="t").build(2)


PLAN = make_plan()


def test_the_kind_is_registered():
    assert "plan" in cursor_kinds()


def test_plan_cursor_through_the_store(tmp_path):
    store_dir = str(tmp_path / "store")
    samplers = [PlanBatchSampler(PLAN, rank=r, world_size=4) for r in range(4)]
    iterators = [iter(s) for s in samplers]
    consumed = {}
    with CheckpointStore.open(store_dir, identity(), KEY) as store:
        store.start_run(DATASET, world_size=4)
        for t in (1, 2):
            for _ in range(3):  # three lockstep steps between checkpoints
                for s, it in zip(samplers, iterators):
                    consumed[s.last_microbatch["index"]] = next(it)
            nextbatch = state(t, uc.Cursor(0, 8 * t))
            store.commit(dataclasses.replace(nextbatch, extra_cursors={"plan": PlanCursor.of(samplers[0])}))
    assert verify_store(store_dir)["checkpoints"] == 2
    assert "data/cursors=plan.cbor" in files_of(os.path.join(store_dir, "checkpoints", "commit=1"))
    restored = restore_latest(store_dir, identity())
    cursor = restored.extra_cursors["plan"]
    assert cursor == PlanCursor(PLAN.fingerprint, 0, 24) and restored.cursors[DATASET] == uc.Cursor(0, 16)
    resumed = [PlanBatchSampler(PLAN, rank=r, world_size=2) for r in range(2)]
    for s in resumed:
        cursor.restore_into(s)
        for rows in s:
            consumed[s.last_microbatch["index"]] = rows
    assert [consumed[i] for i in range(len(PLAN.epochs[0]))] == [PLAN.epochs[0].rows(i).tolist()
                                                                  for i in range(len(PLAN.epochs[0]))]
    other = PlanBatchSampler(make_plan(seed=4), rank=0, world_size=1)
    with pytest.raises(uc.UmlosError) as info:
        cursor.restore_into(other)
    assert info.value.code == errors.PLAN_FINGERPRINT_MISMATCH
    with pytest.raises(uc.UmlosError) as info:
        PlanCursor(PLAN.fingerprint, 0, 10**6).check(PLAN)
    assert info.value.code == errors.PLAN_CURSOR_INVALID


@pytest.mark.parametrize("value", [
    {"plan_fingerprint": "x", "epoch": 0, "microbatch_index": 0},
    {"plan_fingerprint": "a" * 64, "epoch": -1, "microbatch_index": 0},
    {"plan_fingerprint": "a" * 64, "epoch": 0, "microbatch_index": True},
    {"plan_fingerprint": "a" * 64, "epoch": 0},
    [0, 0],
])
def test_a_bad_stored_cursor_is_refused(value):
    with pytest.raises(uc.UmlosError) as info:
        PlanCursor.from_state(value)
    assert info.value.code == errors.PLAN_CURSOR_INVALID


def test_a_sampler_state_cannot_cross_plans():
    with pytest.raises(uc.UmlosError, match="PLAN_FINGERPRINT_MISMATCH"):
        PlanCursor.of(PlanBatchSampler(PLAN, rank=0, world_size=1)).restore_into(
            PlanBatchSampler(make_plan(seed=5), rank=0, world_size=1))
