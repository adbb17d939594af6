"""PlanBatchSampler: this rank's microbatches of a plan, its cursor and state,
resume at another world size; and a real torchrun run (4 ranks, stop, 2 ranks)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from umlos_cuda import errors
from umlos_cuda.batching import BatchingConfig, BatchPlanBuilder, save_plan, shard_plan

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from umlos_cuda.torch import PlanBatchSampler, SamplerArgumentError  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dist_scripts.torchrun import finish, launch  # noqa: E402


def make_plan(n=2000, epochs=2, seed=5):
    lengths = np.clip(np.random.default_rng(seed).lognormal(5.0, 1.0, n), 1, 2048).astype(np.uint32)
    config = BatchingConfig.throughput(4096, (128, 256, 512, 1024), 2048, seed=seed)
    return BatchPlanBuilder(lengths, config, tokenizer_hash="t").build(epochs)


PLAN = make_plan()


def sequence(plan, epoch, start=0):
    return [plan.epochs[epoch].rows(i).tolist() for i in range(start, len(plan.epochs[epoch]))]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_ranks_deal_out_the_global_sequence(world_size):
    samplers = [PlanBatchSampler(PLAN, rank=r, world_size=world_size) for r in range(world_size)]
    per_rank = [list(s) for s in samplers]
    m = len(PLAN.epochs[0])
    assert [len(x) for x in per_rank] == [len(range(r, m, world_size)) for r in range(world_size)]
    merged = [per_rank[i % world_size][i // world_size] for i in range(m)]
    assert merged == sequence(PLAN, 0)
    assert all((s.epoch, s.microbatch_index) == (1, 0) for s in samplers)  # the next pass is epoch 1
    passes = [list(s) for s in samplers]  # every rank runs its pass
    assert passes[0] == sequence(PLAN, 1)[0::world_size]
    assert (samplers[0].epoch, samplers[0].microbatch_index) == (1, len(PLAN.epochs[1]))  # the plan is done


@pytest.mark.parametrize("before,after,steps", [(4, 2, 7), (4, 3, 5), (2, 4, 1), (3, 3, 0), (1, 8, 13)])
def test_resume_at_another_world_size(before, after, steps):
    samplers = [PlanBatchSampler(PLAN, rank=r, world_size=before) for r in range(before)]
    iterators = [iter(s) for s in samplers]
    consumed = {}
    for _ in range(steps):
        for s, it in zip(samplers, iterators):
            rows = next(it)
            consumed[s.last_microbatch["index"]] = rows
    states = [s.state_dict() for s in samplers]
    assert all(st == states[0] for st in states) and states[0]["microbatch_index"] == steps * before
    resumed = [PlanBatchSampler(PLAN, rank=r, world_size=after) for r in range(after)]
    for s in resumed:
        s.load_state_dict(json.loads(json.dumps(states[0])))
        assert s.steps_remaining == -(-(len(PLAN.epochs[0]) - steps * before) // after)
        for rows in s:
            consumed[s.last_microbatch["index"]] = rows
    assert [consumed[i] for i in range(len(PLAN.epochs[0]))] == sequence(PLAN, 0)
    assert len(consumed) == len(PLAN.epochs[0])


def test_state_and_dataloader():
    sampler = PlanBatchSampler(PLAN, rank=1, world_size=2, epoch=1, microbatch_index=6)
    loader = DataLoader(TensorDataset(torch.arange(PLAN.meta.num_samples)), batch_sampler=sampler)
    got = [batch.tolist() for (batch,) in loader]
    assert got == sequence(PLAN, 1)[1::2][3:] and len(sampler) == 0
    fresh = PlanBatchSampler(PLAN, rank=1, world_size=2, epoch=1, microbatch_index=6)
    assert len(fresh) == len(got)
    it = iter(fresh)
    next(it), next(it)
    assert fresh.state_dict()["microbatch_index"] == 10
    assert fresh.state_dict(batches_consumed=1)["microbatch_index"] == 8
    fresh.set_epoch(0)
    assert (fresh.epoch, fresh.microbatch_index) == (0, 0)
    assert next(it) == sequence(PLAN, 1)[11]  # an iterator is a snapshot: it keeps its epoch
    assert (fresh.epoch, fresh.microbatch_index) == (0, 0)  # and no longer moves the cursor


def test_refusals(tmp_path):
    sampler = PlanBatchSampler(PLAN, rank=0, world_size=1)
    other = make_plan(seed=6)
    state = PlanBatchSampler(other, rank=0, world_size=1).state_dict()
    with pytest.raises(SamplerArgumentError) as info:
        sampler.load_state_dict(state)
    assert info.value.code == errors.PLAN_FINGERPRINT_MISMATCH and isinstance(info.value, ValueError)
    for bad in ({**sampler.state_dict(), "microbatch_index": 10**6}, {**sampler.state_dict(), "epoch": 9},
                {"format": "other"}, None):
        with pytest.raises(SamplerArgumentError) as info:
            sampler.load_state_dict(bad)
        assert info.value.code == errors.PLAN_CURSOR_INVALID
    for kwargs, code in ((dict(rank=2, world_size=2), errors.INVALID_RANK),
                         (dict(epoch=2), errors.PLAN_CURSOR_INVALID),
                         (dict(microbatch_index=-1), errors.PLAN_CURSOR_INVALID)):
        with pytest.raises(SamplerArgumentError) as info:
            PlanBatchSampler(PLAN, **{"rank": 0, "world_size": 1, **kwargs})
        assert info.value.code == code
    with pytest.raises(SamplerArgumentError) as info:
        PlanBatchSampler(12)
    assert info.value.code == errors.PLAN_NOT_FOUND
    shard = shard_plan(PLAN, 1, 2)
    assert list(PlanBatchSampler(shard, rank=1, world_size=2)) == list(PlanBatchSampler(PLAN, rank=1, world_size=2))
    assert PlanBatchSampler(shard, rank=1, world_size=2).state_dict()["plan_fingerprint"] == PLAN.fingerprint
    with pytest.raises(SamplerArgumentError) as info:
        PlanBatchSampler(shard, rank=0, world_size=2)
    assert info.value.code == errors.INVALID_RANK
    save_plan(PLAN, tmp_path / "plan")
    assert list(PlanBatchSampler(str(tmp_path / "plan"), rank=0, world_size=3)) == sequence(PLAN, 0)[0::3]


def make_windowed(n=2000, epochs=2, seed=5, window=300):
    """The lengths and config of :func:`make_plan`, planned by windows of ``window`` positions."""
    from umlos_cuda.batching.plans.windows import ArrayLengths, WindowDefinition, WindowedPlan

    lengths = np.clip(np.random.default_rng(seed).lognormal(5.0, 1.0, n), 1, 2048).astype(np.uint32)
    config = BatchingConfig.throughput(4096, (128, 256, 512, 1024), 2048, seed=seed)
    return WindowedPlan.build(WindowDefinition(config, n, window), ArrayLengths(lengths), epochs)


WINDOWED = make_windowed()


def windowed_sequence(plan, epoch, start=0):
    return [plan.microbatch(epoch, k).rows.tolist() for k in range(start, plan.epoch_microbatches(epoch))]


def test_a_windowed_plan_of_one_window_deals_out_the_whole_plan():
    """W >= N: the windowed plan is the whole-epoch plan, so the sampler yields the same microbatches."""
    whole = make_windowed(window=4096)
    for world_size, rank in ((1, 0), (3, 1)):
        sampler = PlanBatchSampler(whole, rank=rank, world_size=world_size)
        got = [list(sampler) for _ in range(2)]  # a pass an epoch
        assert got == [sequence(PLAN, e)[rank::world_size] for e in range(2)]


@pytest.mark.parametrize("before,after,steps", [(4, 2, 7), (3, 5, 4), (1, 8, 13)])
def test_a_windowed_plan_resumes_at_another_world_size(before, after, steps):
    from umlos_cuda.batching.plans.windows.resume import WindowedRankReader

    samplers = [PlanBatchSampler(WINDOWED, rank=r, world_size=before) for r in range(before)]
    iterators = [iter(s) for s in samplers]
    consumed = {}
    for _ in range(steps):
        for s, it in zip(samplers, iterators):
            consumed[s.last_microbatch["index"]] = next(it)
    state = samplers[0].state_dict()
    assert state["plan_fingerprint"] == WINDOWED.fingerprint and state["microbatch_index"] == steps * before
    resumed = [PlanBatchSampler(WINDOWED, rank=r, world_size=after) for r in range(after)]
    for r, s in enumerate(resumed):
        s.load_state_dict(json.loads(json.dumps(state)))
        reader = WindowedRankReader(WINDOWED, r, after, epoch=0, microbatch_index=steps * before)
        assert s.steps_remaining == reader.steps_remaining
        mine = []
        for rows in s:
            consumed[s.last_microbatch["index"]] = rows
            mine.append((s.last_microbatch["index"], rows))
        assert mine == [(k, spec.rows.tolist()) for _, k, spec in reader]  # the resume rule, one definition
    assert [consumed[k] for k in range(WINDOWED.epoch_microbatches(0))] == windowed_sequence(WINDOWED, 0)


def test_a_windowed_plan_folder_through_a_dataloader_and_the_checkpoint_cursor(tmp_path):
    from umlos_cuda.batching.lengths.cache import LengthCache, sidecar_path
    from umlos_cuda.batching.plans.checkpoint_kinds import PlanCursor
    from umlos_cuda.batching.plans.windows import MappedLengths, WindowedPlan, save_windowed_plan

    LengthCache.from_arrays(None, WINDOWED.source.lengths, "t").write(tmp_path / "lengths.jsonl")
    side = sidecar_path(tmp_path / "lengths.jsonl")
    save_windowed_plan(WindowedPlan.build(WINDOWED.definition, MappedLengths(side), 2), tmp_path / "wp",
                       lengths_path=side)
    sampler = PlanBatchSampler(str(tmp_path / "wp"), rank=1, world_size=2, epoch=1, microbatch_index=6)
    assert sampler.fingerprint == WINDOWED.fingerprint  # the same lengths, mapped: the same plan
    loader = DataLoader(TensorDataset(torch.arange(2000)), batch_sampler=sampler, num_workers=2)
    got = []
    for step, (batch,) in enumerate(loader):
        got.append(batch.tolist())
        if step == 4:
            cursor = PlanCursor.of(sampler)  # 5 steps of 2 ranks from 6, not the ones the workers prefetched
            break
    assert got == windowed_sequence(WINDOWED, 1)[7::2][:5] and (cursor.epoch, cursor.microbatch_index) == (1, 16)
    resumed = PlanBatchSampler(WINDOWED, rank=0, world_size=3)
    cursor.restore_into(resumed)
    assert next(iter(resumed)) == windowed_sequence(WINDOWED, 1)[18]  # the first k >= 16 with k % 3 == 0
    with pytest.raises(errors.UmlosError) as info:
        cursor.restore_into(PlanBatchSampler(PLAN, rank=0, world_size=3))  # the whole plan is another plan
    assert info.value.code == errors.PLAN_FINGERPRINT_MISMATCH
    for kwargs in (dict(epoch=2), dict(microbatch_index=WINDOWED.epoch_microbatches(0) + 1)):
        with pytest.raises(SamplerArgumentError) as info:
            PlanBatchSampler(WINDOWED, rank=0, world_size=1, **kwargs)
        assert info.value.code == errors.PLAN_CURSOR_INVALID
    with pytest.raises(SamplerArgumentError) as info:
        resumed.set_epoch(2)
    assert info.value.code == errors.PLAN_CURSOR_INVALID


def test_a_mixed_plan_in_memory_is_dealt_out_as_rows_of_its_components():
    """(tests/test_torch_mixed_plans.py takes mixed plan folders over token stores through to the Trainer.)"""
    from umlos_cuda.batching.plans.windows import ArrayLengths, Component, MixedPlan, MixtureDefinition

    config = BatchingConfig.throughput(4096, (128, 256, 512, 1024), 2048, seed=5)
    parts = tuple(Component(ArrayLengths(np.full(50, 100 + i, dtype=np.uint32)), 1.0, i, name=f"d{i}")
                  for i in range(2))
    mixed = MixedPlan.build(MixtureDefinition(config, parts, 16, 60))
    rows = [row for batch in PlanBatchSampler(mixed, rank=0, world_size=1) for row in batch]
    assert len(rows) == len(set(rows)) == 60 and all(0 <= row < 100 for row in rows)
    assert sum(row >= 50 for row in rows) == 30  # the second component's rows, at its weight


def test_torchrun_stop_at_4_ranks_resume_at_2(tmp_path):
    """4 gloo ranks train over a 2-epoch plan and stop in epoch 1; 2 ranks resume
    from the saved cursor. The microbatches consumed, in global order, are the
    single-process sequence: none lost, none twice."""
    plan = make_plan(n=1200, epochs=2, seed=8)
    save_plan(plan, tmp_path / "plan")
    finish(launch(4, "plan_worker.py", "--phase", "start", "--workdir", str(tmp_path)), "torchrun W=4 (start)")
    state = json.loads(Path(tmp_path / "state.json").read_text())
    assert state["world_size"] == 4 and (state["epoch"], state["microbatch_index"]) == (1, 5 * 4)
    finish(launch(2, "plan_worker.py", "--phase", "resume", "--workdir", str(tmp_path)), "torchrun W=2 (resume)")
    start, resume = (json.loads(Path(tmp_path / f"{phase}.json").read_text()) for phase in ("start", "resume"))
    assert start["world_size"] == 4 and resume["world_size"] == 2
    assert min((e, i) for e, i, _ in resume["records"]) == (1, 20)
    consumed = sorted((e, i, rows) for e, i, rows in start["records"] + resume["records"])
    expected = [(e, i, plan.epochs[e].rows(i).tolist()) for e in range(2) for i in range(len(plan.epochs[e]))]
    assert consumed == expected
