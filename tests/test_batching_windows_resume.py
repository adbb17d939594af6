"""Resuming windowed plans (docs/batching.md, "Resuming a windowed plan"): rank r of R takes the global
microbatches k >= cursor with k mod R == r; the cursor is the checkpoint store's ``plan`` cursor; a job
interrupted at any step and resumed at another world size sees exactly the same global sequence; a
resume plans at most two windows. Mixed plans go through the same reader (one epoch)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import umlos_cuda as uc
from umlos_cuda import errors
from umlos_cuda.batching.packing.config import PackingConfig
from umlos_cuda.batching.plans.checkpoint_kinds import PlanCursor
from umlos_cuda.batching.plans.config import BatchingConfig
from umlos_cuda.batching.plans.windows import (ArrayLengths, WindowDefinition, WindowedPlan, load_windowed_plan,
                                               save_windowed_plan)
from umlos_cuda.batching.plans.windows import mixed as mixed_module, plan as plan_module
from umlos_cuda.batching.plans.windows.io import load_mixed_plan, save_mixed_plan
from umlos_cuda.batching.plans.windows.mixed import MixedPlan
from umlos_cuda.batching.plans.windows.mixture import Component, MixtureDefinition
from umlos_cuda.batching.plans.windows.resume import WindowedRankReader, rank_indices
from umlos_cuda.checkpoint import CheckpointStore, restore_latest
from umlos_cuda.errors import UmlosError
from test_checkpoint_support import DATASET, KEY, identity, state


def lengths_for(seed: int, n: int, high: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, high, n).astype(np.uint32)


def _plan(packed: bool, n: int, window: int, seed: int, epochs: int = 2) -> WindowedPlan:
    pack = PackingConfig(256, "first_fit") if packed else None
    config = BatchingConfig(768, (64,), 256, seed=seed, pack=pack)
    return WindowedPlan.build(WindowDefinition(config, n, window=window), ArrayLengths(lengths_for(seed, n, 257)),
                              epochs)


def global_sequence(plan: WindowedPlan) -> list[tuple[int, int, tuple[str, ...]]]:
    """The plan's global sequence by the definition: every epoch's microbatches in index order."""
    return [(e, j, spec.samples) for e, j, spec in plan.iter_from(0, 0)]


def run_lockstep(readers: list[WindowedRankReader], steps: int | None, seen: list) -> bool:
    """Lockstep steps over one pass of every rank (``steps`` of them, or to the pass's end); each step's
    microbatches are appended in rank order of their global index. True when the pass ended."""
    total = readers[0].steps_remaining
    assert all(r.steps_remaining == total for r in readers)  # every rank agrees on the pass's length
    iterators = [iter(r) for r in readers]
    todo = total if steps is None else min(steps, total)
    for _ in range(todo):
        step = [item for it in iterators for item in [next(it, None)] if item is not None]
        seen.extend(sorted(((e, k, spec.samples) for e, k, spec in step), key=lambda x: x[1]))
    if todo == total:
        for it in iterators:
            assert next(it, None) is None
        return True
    return False


@settings(max_examples=40, deadline=None)
@given(st.booleans(), st.integers(50, 900), st.integers(7, 300), st.integers(0, 2**32 - 1),
       st.lists(st.tuples(st.integers(1, 9), st.integers(0, 60)), min_size=1, max_size=5))
def test_interrupted_and_resumed_at_other_world_sizes_the_global_sequence_is_the_same(packed, n, window, seed,
                                                                                        legs):
    plan = _plan(packed, n, window, seed)
    seen: list = []
    cursor = PlanCursor(plan.fingerprint, 0, 0)
    for world_size, steps in legs + [(3, None), (5, None), (2, None)]:
        readers = [WindowedRankReader.resume(plan, cursor, rank, world_size) for rank in range(world_size)]
        ended = run_lockstep(readers, steps, seen)
        cursors = {r.cursor() for r in readers}
        assert len(cursors) == 1  # every rank saves the same global cursor
        cursor = PlanCursor.from_state(cursors.pop().to_state())  # through its stored form
        if ended and cursor.epoch == plan.num_epochs - 1 and \
                cursor.microbatch_index == plan.epoch_microbatches(cursor.epoch):
            break
    assert seen == global_sequence(plan)


def test_the_rank_rule_deals_k_mod_r():
    assert list(rank_indices(5, 20, 1, 4)) == [5, 9, 13, 17]
    assert list(rank_indices(5, 20, 2, 4)) == [6, 10, 14, 18]
    assert sorted(k for r in range(3) for k in rank_indices(4, 11, r, 3)) == list(range(4, 11))
    plan = _plan(True, 600, 100, 1)
    reader = WindowedRankReader(plan, 2, 3, epoch=0, microbatch_index=4)
    assert [k for _, k, _ in reader][:3] == [5, 8, 11]


@pytest.mark.parametrize("packed", [False, True])
def test_a_resume_plans_at_most_two_windows(packed, tmp_path, monkeypatch):
    plan = _plan(packed, 5000, 250, 4)
    save_windowed_plan(plan, tmp_path / "wp")
    calls: list[tuple[int, int]] = []
    real = plan_module.plan_window

    def counted(definition, source, epoch, w, backend="auto"):
        calls.append((epoch, w))
        return real(definition, source, epoch, w, backend)

    monkeypatch.setattr(plan_module, "plan_window", counted)
    lengths = plan.source
    total = plan.epoch_microbatches(1)
    rng = np.random.default_rng(0)
    for k in [0, total - 1, *rng.integers(0, total, 20).tolist()]:
        world_size = int(rng.integers(1, 17))
        opened = load_windowed_plan(tmp_path / "wp", lengths=lengths)  # opening plans no window
        assert calls == []
        cursor = PlanCursor(plan.fingerprint, 1, k)
        for rank in range(world_size):
            reader = WindowedRankReader.resume(opened, cursor, rank, world_size)
            first = next(iter(reader), None)
            if first is not None:
                assert first[1] == k + (rank - k) % world_size
                assert first[2].samples == plan.microbatch(1, first[1]).samples
        assert 1 <= len(set(calls)) <= 2, (k, world_size, calls)  # every rank's first microbatch: <= 2 windows
        calls.clear()


def test_the_cursor_goes_through_the_checkpoint_store_and_resumes_at_another_world_size(tmp_path):
    plan = _plan(True, 2000, 300, 9)
    store_dir = str(tmp_path / "store")
    readers = [WindowedRankReader(plan, r, 4) for r in range(4)]
    iterators = [iter(r) for r in readers]
    seen: dict[int, tuple[str, ...]] = {}
    with CheckpointStore.open(store_dir, identity(), KEY) as store:
        store.start_run(DATASET, world_size=4)
        for t in (1, 2):
            for _ in range(3):
                for it in iterators:
                    _, k, spec = next(it)
                    seen[k] = spec.samples
            store.commit(dataclasses.replace(state(t, uc.Cursor(0, 8 * t)),
                                             extra_cursors={"plan": readers[0].cursor()}))
    cursor = restore_latest(store_dir, identity()).extra_cursors["plan"]
    assert cursor == PlanCursor(plan.fingerprint, 0, 24)
    resumed = [WindowedRankReader.resume(plan, cursor, r, 3) for r in range(3)]
    for reader in resumed:
        for _, k, spec in reader:
            seen[k] = spec.samples
    epoch0 = [s.samples for e, _, s in plan.iter_from(0, 0) if e == 0]
    assert sorted(seen) == list(range(len(epoch0))) and [seen[k] for k in range(len(epoch0))] == epoch0


def test_cursors_of_another_plan_or_outside_the_plan_are_refused():
    plan = _plan(False, 500, 100, 2)
    other = _plan(False, 500, 101, 2)
    with pytest.raises(UmlosError) as caught:
        WindowedRankReader.resume(plan, PlanCursor(other.fingerprint, 0, 0))
    assert caught.value.code == errors.PLAN_FINGERPRINT_MISMATCH
    for epoch, k in ((2, 0), (0, plan.epoch_microbatches(0) + 1)):
        with pytest.raises(UmlosError) as caught:
            WindowedRankReader.resume(plan, {"plan_fingerprint": plan.fingerprint, "epoch": epoch,
                                             "microbatch_index": k})
        assert caught.value.code == errors.PLAN_CURSOR_INVALID
    with pytest.raises(UmlosError) as caught:
        WindowedRankReader(plan, 3, 3)
    assert caught.value.code == errors.INVALID_RANK
    done = WindowedRankReader(plan, 0, 2, epoch=1, microbatch_index=plan.epoch_microbatches(1))
    assert list(done) == [] and done.steps_remaining == 0


# ---------------------------------------------------------------- mixed plans: the same reader, the same rule
def _mixed(n_parts: tuple[int, ...], window: int, seed: int, num_samples: int) -> MixedPlan:
    config = BatchingConfig(768, (64,), 256, seed=seed)
    components = tuple(Component(ArrayLengths(lengths_for(seed + i, n, 257)), 1 + i, seed + 7 * i, None, f"d{i}")
                       for i, n in enumerate(n_parts))
    return MixedPlan.build(MixtureDefinition(config, components, window, num_samples))


def mixed_sequence(plan: MixedPlan) -> list[tuple[int, int, tuple[str, ...]]]:
    """A mixture's global sequence by its definition: its one epoch's microbatches in index order."""
    return [(0, j, spec.samples) for j, spec in plan.iter_from(0)]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(5, 200), min_size=1, max_size=3), st.integers(7, 200), st.integers(0, 2**32 - 1),
       st.integers(50, 900), st.lists(st.tuples(st.integers(1, 9), st.integers(0, 40)), min_size=1, max_size=5))
def test_a_mixed_plan_interrupted_and_resumed_at_other_world_sizes_sees_the_same_sequence(parts, window, seed,
                                                                                           total, legs):
    plan = _mixed(tuple(parts), window, seed, total)
    seen: list = []
    cursor = PlanCursor(plan.fingerprint, 0, 0)
    for world_size, steps in legs + [(3, None)]:
        readers = [WindowedRankReader.resume(plan, cursor, rank, world_size) for rank in range(world_size)]
        ended = run_lockstep(readers, steps, seen)
        cursors = {r.cursor() for r in readers}
        assert len(cursors) == 1
        cursor = PlanCursor.from_state(cursors.pop().to_state())
        if ended:
            assert cursor.microbatch_index == plan.num_microbatches  # one epoch: done stays at M
            break
    assert seen == mixed_sequence(plan)


def test_a_mixed_resume_plans_at_most_two_windows_and_goes_through_the_store(tmp_path, monkeypatch):
    plan = _mixed((300, 1000, 80), 200, 3, 4000)
    save_mixed_plan(plan, tmp_path / "mp")
    planned: list[int] = []
    real = mixed_module.plan_ordered

    def counted(*args, **kwargs):
        planned.append(int(kwargs["draw_base"]) >> 32)
        return real(*args, **kwargs)

    monkeypatch.setattr(mixed_module, "plan_ordered", counted)
    total = plan.num_microbatches
    rng = np.random.default_rng(1)
    for k in [0, total - 1, *rng.integers(0, total, 15).tolist()]:
        world_size = int(rng.integers(1, 17))
        opened = load_mixed_plan(tmp_path / "mp", lengths=[c.source for c in plan.definition.components])
        assert planned == []  # opening plans no window
        for rank in range(world_size):
            first = next(iter(WindowedRankReader.resume(opened, PlanCursor(plan.fingerprint, 0, k), rank,
                                                        world_size)), None)
            if first is not None:
                assert first[1] == k + (rank - k) % world_size and first[2] == plan.microbatch(first[1])
        assert 1 <= len(set(planned)) <= 2, (k, world_size, planned)
        planned.clear()
    monkeypatch.undo()
    # four ranks, a checkpoint, three ranks resume from the store's plan cursor
    readers = [WindowedRankReader(plan, r, 4) for r in range(4)]
    iterators = [iter(r) for r in readers]
    seen: dict[int, tuple[str, ...]] = {}
    store_dir = str(tmp_path / "store")
    with CheckpointStore.open(store_dir, identity(), KEY) as store:
        store.start_run(DATASET, world_size=4)
        for _ in range(5):
            for it in iterators:
                _, k, spec = next(it)
                seen[k] = spec.samples
        store.commit(dataclasses.replace(state(1, uc.Cursor(0, 8)), extra_cursors={"plan": readers[0].cursor()}))
    cursor = restore_latest(store_dir, identity()).extra_cursors["plan"]
    assert cursor == PlanCursor(plan.fingerprint, 0, 20)
    for reader in [WindowedRankReader.resume(plan, cursor, r, 3) for r in range(3)]:
        for _, k, spec in reader:
            seen[k] = spec.samples
    assert [seen[k] for k in range(total)] == [s for _, _, s in mixed_sequence(plan)]
    with pytest.raises(UmlosError) as caught:
        WindowedRankReader.resume(plan, PlanCursor(plan.fingerprint, 1, 0))
    assert caught.value.code == errors.PLAN_CURSOR_INVALID
    with pytest.raises(UmlosError) as caught:
        WindowedRankReader.resume(plan, PlanCursor(_mixed((300, 1000, 80), 201, 3, 4000).fingerprint, 0, 0))
    assert caught.value.code == errors.PLAN_FINGERPRINT_MISMATCH
