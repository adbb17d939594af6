"""Resuming from a sampler's state_dict() taken while a DataLoader with workers prefetches.

A loader with ``num_workers`` workers pulls ``prefetch_factor * num_workers``
batches ahead of the training loop. Every sampler here must save the
position of what the *loop* received, so that a loader built on the
resumed sampler yields exactly the batches the uninterrupted loader would
have yielded from that step on: none skipped, none repeated. Batches are
compared by their dataset rows; nothing here depends on timing (the loader
hands batches back in order, whatever its workers' speed).
"""

from __future__ import annotations

import copy
import pickle
import time
import warnings

import numpy as np
import pytest

import umlos_cuda as uc
from umlos_cuda.batching import BatchingConfig, BatchPlanBuilder

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset, TensorDataset  # noqa: E402

from umlos_cuda.torch import (  # noqa: E402
    DistributedSampler,
    NextBatchSampler,
    PackedBatchSampler,
    PlanBatchSampler,
)

LOADERS = [(0, None)] + [(w, p) for w in (1, 2) for p in (1, 2, 3, 4)]


def make_plan():
    lengths = np.clip(np.random.default_rng(3).lognormal(5.0, 1.0, 500), 1, 2048).astype(np.uint32)
    config = BatchingConfig.throughput(4096, (128, 256, 512, 1024), 2048, seed=3)
    return BatchPlanBuilder(lengths, config, tokenizer_hash="t").build(2)


PLAN = make_plan()
ROWS = TensorDataset(torch.arange(PLAN.meta.num_samples))


def loader(sampler, workers, prefetch, data=ROWS, **kwargs):
    return DataLoader(data, batch_sampler=sampler, num_workers=workers, prefetch_factor=prefetch, **kwargs)


def rows(batches):
    return [b.tolist() for (b,) in batches]


def plan_sequence(epoch, rank=1, world_size=2):
    return [PLAN.epochs[epoch].rows(i).tolist() for i in range(rank, len(PLAN.epochs[epoch]), world_size)]


def resume_plan(state, workers, prefetch):
    sampler = PlanBatchSampler(PLAN, rank=1, world_size=2)
    sampler.load_state_dict(state)
    return rows(loader(sampler, workers, prefetch))


@pytest.mark.parametrize("workers,prefetch", LOADERS)
def test_plan_state_saved_in_the_loop_resumes_exactly(workers, prefetch):
    """The common loop: save sampler.state_dict() every few steps; each state resumes at the next step."""
    expected = plan_sequence(0)
    sampler = PlanBatchSampler(PLAN, rank=1, world_size=2)
    states = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no prefetch warning: the count is known
        got = []
        for step, (batch,) in enumerate(loader(sampler, workers, prefetch)):
            got.append(batch.tolist())
            if step in (0, 3, 9, len(expected) - 2, len(expected) - 1):
                states[step] = sampler.state_dict()
    assert got == expected
    assert (states[len(expected) - 1]["epoch"], states[len(expected) - 1]["microbatch_index"]) == (1, 0)
    for step in (0, 9, len(expected) - 2):
        assert states[step]["microbatch_index"] == 2 * (step + 1)  # world size 2: global index after the step
        assert resume_plan(states[step], workers, prefetch) == expected[step + 1:]
    assert sampler.state_dict() == states[len(expected) - 1]  # after the loop: the next epoch


@pytest.mark.parametrize("workers,prefetch", [(1, 4), (2, 2), (2, 3)])
def test_plan_state_after_break_and_after_the_epoch(workers, prefetch):
    """Saved once the loop has left (the loader iterator is gone, its prefetched batches unused)."""
    expected = plan_sequence(0)
    for stop in (4, len(expected) - 2):  # in mid-epoch, and within the last prefetch window
        sampler = PlanBatchSampler(PLAN, rank=1, world_size=2)
        for step, _ in enumerate(loader(sampler, workers, prefetch)):
            if step == stop:
                break
        state = sampler.state_dict()
        assert state["microbatch_index"] == 2 * (stop + 1)
        assert resume_plan(state, workers, prefetch) == expected[stop + 1:]
    sampler = PlanBatchSampler(PLAN, rank=1, world_size=2)
    assert rows(loader(sampler, workers, prefetch)) == expected
    assert (sampler.state_dict()["epoch"], sampler.state_dict()["microbatch_index"]) == (1, 0)
    assert rows(loader(sampler, workers, prefetch)) == plan_sequence(1)  # the next pass is epoch 1


def test_plan_persistent_workers_second_epoch_and_plan_cursor():
    """persistent_workers keeps one loader iterator over both epochs; the checkpoint store's
    PlanCursor.of(sampler), read in the loop, is the same exact cursor."""
    from umlos_cuda.batching.plans.checkpoint_kinds import PlanCursor

    sampler = PlanBatchSampler(PLAN, rank=1, world_size=2)
    persistent = loader(sampler, 2, 3, persistent_workers=True)
    assert rows(persistent) == plan_sequence(0)
    for step, _ in enumerate(persistent):
        if step == 3:
            state, cursor = sampler.state_dict(), PlanCursor.of(sampler)
            break
    assert (state["epoch"], state["microbatch_index"]) == (1, 8)
    assert (cursor.epoch, cursor.microbatch_index) == (1, 8)
    assert resume_plan(state, 2, 3) == plan_sequence(1)[4:]


class Uneven(Dataset):
    """Rows whose worker takes longer now and then, so batches reach the main process out of order
    (the loader still hands them to the loop in order, and the count must not care)."""

    def __len__(self):
        return PLAN.meta.num_samples

    def __getitem__(self, row):
        if row % 7 == 0:
            time.sleep(0.002)
        return torch.tensor(row)


def test_plan_exact_when_workers_finish_out_of_order():
    expected = plan_sequence(0)
    sampler = PlanBatchSampler(PLAN, rank=1, world_size=2)
    for step, _ in enumerate(loader(sampler, 2, 4, Uneven())):
        if step == 6:
            state = sampler.state_dict()
            break
    assert resume_plan(state, 2, 4) == expected[7:]


def test_a_sampler_copied_mid_pass_keeps_the_count():
    """pickle and deepcopy of a sampler while a loader with workers pulls it (the link to the loader
    does not pickle; the copy keeps the count of that moment)."""
    sampler = PlanBatchSampler(PLAN, rank=1, world_size=2)
    for step, _ in enumerate(loader(sampler, 2, 2)):
        if step == 4:
            copies = [pickle.loads(pickle.dumps(sampler)), copy.deepcopy(sampler)]
            break
    assert [c.state_dict()["microbatch_index"] for c in copies] == [10, 10]
    assert sampler.state_dict()["microbatch_index"] == 10


def test_plan_batches_consumed_still_overrides():
    sampler = PlanBatchSampler(PLAN, rank=1, world_size=2)
    for step, _ in enumerate(loader(sampler, 2, 2)):
        if step == 5:
            assert sampler.state_dict()["microbatch_index"] == 12
            assert sampler.state_dict(batches_consumed=3)["microbatch_index"] == 6
            assert sampler.state_dict(batches_consumed=8)["microbatch_index"] == 16
            break


def test_plan_out_of_order_loader_warns():
    """With in_order=False the loop's batches are no prefix of the pass: the sampler cannot count, and says so."""
    sampler = PlanBatchSampler(PLAN, rank=1, world_size=2)
    for step, _ in enumerate(loader(sampler, 2, 2, in_order=False)):
        if step == 3:
            with pytest.warns(UserWarning, match="batches_consumed=K"):
                state = sampler.state_dict()
            assert state["microbatch_index"] == 2 * (4 + 4)  # what was handed out, as the warning says
            break


@pytest.mark.parametrize("workers,every", [(0, 1), (2, 1), (2, 3)])
def test_plan_with_stateful_dataloader(workers, every):
    """torchdata snapshots the sampler when it sends a batch to a worker; its own state resumes exactly,
    and so does the sampler's state_dict() read in the same loop."""
    tdl = pytest.importorskip("torchdata.stateful_dataloader")
    expected = plan_sequence(0)

    def stateful(sampler):
        return tdl.StatefulDataLoader(ROWS, batch_sampler=sampler, num_workers=workers,
                                      prefetch_factor=2 if workers else None, snapshot_every_n_steps=every)

    sampler = PlanBatchSampler(PLAN, rank=1, world_size=2)
    first = stateful(sampler)
    head = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for step, (batch,) in enumerate(first):
            head.append(batch.tolist())
            if step == 6:
                loader_state, sampler_state = first.state_dict(), sampler.state_dict()
                break
    assert sampler_state["microbatch_index"] == 14
    second = stateful(PlanBatchSampler(PLAN, rank=1, world_size=2))
    second.load_state_dict(loader_state)
    assert head + rows(second) == expected
    assert resume_plan(sampler_state, workers, 2 if workers else None) == expected[7:]


class Keys(Dataset):
    """Item ``key`` is ``key`` itself: ``(row, packed row)`` pairs pass through to the batch."""

    def __len__(self):
        return PLAN.meta.num_samples

    def __getitem__(self, key):
        return key


def keep(items):
    return [tuple(int(x) for x in item) for item in items]


def test_packed_wrapper_with_stateful_dataloader_and_plain_loader():
    """PackedBatchSampler passes torchdata's snapshot calls through (cursor of what was handed out),
    and a plain state_dict() through it counts what the loop received."""
    tdl = pytest.importorskip("torchdata.stateful_dataloader")

    def packed():
        return PackedBatchSampler(PlanBatchSampler(PLAN, rank=1, world_size=2))

    expected = list(DataLoader(Keys(), batch_sampler=packed(), collate_fn=keep))
    first = tdl.StatefulDataLoader(Keys(), batch_sampler=packed(), collate_fn=keep, num_workers=2)
    it = iter(first)
    head = [next(it) for _ in range(5)]
    state = first.state_dict()
    del it
    second = tdl.StatefulDataLoader(Keys(), batch_sampler=packed(), collate_fn=keep, num_workers=2)
    second.load_state_dict(state)
    assert head + list(second) == expected
    sampler = packed()
    for step, _ in enumerate(DataLoader(Keys(), batch_sampler=sampler, collate_fn=keep, num_workers=2)):
        if step == 5:
            state = sampler.state_dict()
            break
    resumed = packed()
    resumed.load_state_dict(state)
    assert list(DataLoader(Keys(), batch_sampler=resumed, collate_fn=keep, num_workers=2)) == expected[6:]


def manifest():
    return uc.Manifest.from_dict({"seed": 11, "global_batch_size": 4,
                                  "data": {"sampler_block_size": 8, "drop_last": False},
                                  "datasets": {"train": {"id": "toy", "version": 1, "hash": "", "cardinality": 90}}})


@pytest.mark.parametrize("workers,prefetch", [(0, None), (1, 3), (2, 1), (2, 4)])
def test_nextbatch_state_saved_in_the_loop_resumes_exactly(workers, prefetch):
    data = TensorDataset(torch.arange(90))

    def sampler():
        return NextBatchSampler(manifest(), "train", rank=1, world_size=2, backend="numpy")

    expected = rows(loader(sampler(), 0, None, data))
    s = sampler()
    states = {}
    for step, _ in enumerate(loader(s, workers, prefetch, data)):
        if step in (0, 5, len(expected) - 2):
            states[step] = s.state_dict()
        if step == 4:
            assert s.state_dict(batches_consumed=2)["cursor"] == {"epoch": 0, "global_index": 8}
    for step, state in states.items():
        assert state["cursor"] == {"epoch": 0, "global_index": 4 * (step + 1)}
        resumed = sampler()
        resumed.load_state_dict(state)
        assert rows(loader(resumed, workers, prefetch, data)) == expected[step + 1:]
    assert s.state_dict()["cursor"] == {"epoch": 1, "global_index": 0}


@pytest.mark.parametrize("workers,prefetch", [(0, None), (1, 2), (2, 1), (2, 3)])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_distributed_sampler_state_saved_in_the_loop_resumes_exactly(workers, prefetch, batch_size):
    data = TensorDataset(torch.arange(61))

    def sampler():
        s = DistributedSampler(data, num_replicas=2, rank=1, seed=6, block_size=8)
        s.set_epoch(2)
        return s

    def load(s):
        return DataLoader(data, batch_size=batch_size, sampler=s, num_workers=workers, prefetch_factor=prefetch)

    expected = rows(load(sampler()))
    s = sampler()
    states = {}
    for step, _ in enumerate(load(s)):
        if step in (0, 2, len(expected) - 2):
            states[step] = s.state_dict()
        if step == 1:
            assert s.state_dict(samples_consumed=1)["global_position"] == 2
    broke = sampler()
    for step, _ in enumerate(load(broke)):
        if step == 3:
            break
    states[3] = broke.state_dict()
    for step, state in states.items():
        assert state["global_position"] == 2 * batch_size * (step + 1)
        resumed = DistributedSampler(data, num_replicas=2, rank=1, seed=6, block_size=8)
        resumed.load_state_dict(state)
        resumed.set_epoch(2)
        assert rows(load(resumed)) == expected[step + 1:]


def test_distributed_sampler_under_an_unknown_batch_sampler_warns():
    data = TensorDataset(torch.arange(61))
    s = DistributedSampler(data, num_replicas=2, rank=1, seed=6, block_size=8)

    class Pairs:  # a batch sampler of the user's, without batch_size
        def __init__(self, inner):
            self.inner = inner

        def __iter__(self):
            it = iter(self.inner)
            return iter(lambda: [next(it), next(it)], None)

        def __len__(self):
            return len(self.inner) // 2

    for step, _ in enumerate(DataLoader(data, batch_sampler=Pairs(s), num_workers=2)):
        if step == 2:
            with pytest.warns(UserWarning, match="samples_consumed=K"):
                assert s.state_dict()["global_position"] == 2 * 2 * (3 + 4)
            assert s.state_dict(samples_consumed=6)["global_position"] == 12
            break
