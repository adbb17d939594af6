"""Resuming pretraining sequences (docs/batching.md, "Pretraining"): the windowed plans' resume rule with the
sample as the unit. Rank r of R takes the global samples k >= cursor with k mod R == r; the cursor is the
checkpoint store's ``plan`` cursor (the sequences' fingerprint, epoch, sample index); a job interrupted at
any step and resumed at another world size sees exactly the samples of the plain pass; a resume reads at
most two windows."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import umlos_cuda as uc
from umlos_cuda import errors
from umlos_cuda.batching.plans.checkpoint_kinds import PlanCursor
from umlos_cuda.batching.plans.windows import ArrayLengths, cut as cut_module
from umlos_cuda.batching.plans.windows.cut import CutDefinition
from umlos_cuda.batching.plans.windows.resume import WindowedRankReader
from umlos_cuda.batching.plans.windows.sequences import PretrainingSequences
from umlos_cuda.batching.plans.windows.sequences_io import load_sequences, save_sequences
from umlos_cuda.checkpoint import CheckpointStore, restore_latest
from umlos_cuda.errors import UmlosError
from test_batching_sequences import Tokens
from test_checkpoint_support import DATASET, KEY, identity, state


def plain_pass(plan: PretrainingSequences) -> list:
    """Every sample of every epoch in order, by the plan's own pass (each window read once)."""
    return [(e, k, tuple(plan.pieces(e, k))) for e in range(plan.num_epochs) for k in range(plan.epoch_samples(e))]


def lockstep(readers: list[WindowedRankReader], steps: int | None, seen: list) -> bool:
    total = readers[0].steps_remaining
    assert all(r.steps_remaining == total for r in readers)
    iterators = [iter(r) for r in readers]
    todo = total if steps is None else min(steps, total)
    for _ in range(todo):
        step = [item for it in iterators for item in [next(it, None)] if item is not None]
        seen.extend(sorted(step, key=lambda item: item[1]))
    if todo == total:
        assert all(next(it, None) is None for it in iterators)
    return todo == total


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 60), min_size=1, max_size=80), st.integers(1, 20), st.integers(1, 40),
       st.integers(0, 2**32 - 1), st.sampled_from(["drop", "pad"]),
       st.lists(st.tuples(st.integers(1, 9), st.integers(0, 30)), min_size=1, max_size=5))
def test_interrupted_and_resumed_at_other_world_sizes_the_samples_are_the_same(lengths, window, length, seed, tail,
                                                                               legs):
    plan = PretrainingSequences.build(CutDefinition(len(lengths), length, window=window, seed=seed, eos=7,
                                                    tail=tail), ArrayLengths(lengths), 2)
    seen: list = []
    cursor = PlanCursor(plan.fingerprint, 0, 0)
    for world_size, steps in legs + [(3, None), (5, None), (2, None)]:
        readers = [WindowedRankReader.resume(plan, cursor, rank, world_size) for rank in range(world_size)]
        ended = lockstep(readers, steps, seen)
        cursors = {r.cursor() for r in readers}
        assert len(cursors) == 1
        cursor = PlanCursor.from_state(cursors.pop().to_state())
        if ended and cursor.epoch == 1 and cursor.microbatch_index == plan.epoch_samples(1):
            break
    assert seen == plain_pass(plan)


def test_a_resume_reads_at_most_two_windows(tmp_path, monkeypatch):
    lengths = np.random.default_rng(3).integers(1, 257, 6000).astype(np.uint32)
    plan = PretrainingSequences.build(CutDefinition(6000, 64, window=300, seed=5, eos=7), ArrayLengths(lengths), 2)
    save_sequences(plan, tmp_path / "seq")
    read: list[tuple[int, int]] = []
    real = cut_module.window_documents

    def counted(definition, source, epoch, w, *args, **kwargs):
        read.append((epoch, w))
        return real(definition, source, epoch, w, *args, **kwargs)

    monkeypatch.setattr(cut_module, "window_documents", counted)
    total = plan.epoch_samples(1)
    rng = np.random.default_rng(0)
    for k in [0, total - 1, *rng.integers(0, total, 20).tolist()]:
        world_size = int(rng.integers(1, 17))
        opened = load_sequences(tmp_path / "seq", lengths=plan.lengths)
        assert read == []  # opening reads no window
        for rank in range(world_size):
            first = next(iter(WindowedRankReader.resume(opened, PlanCursor(plan.fingerprint, 1, k), rank,
                                                        world_size)), None)
            if first is not None:
                assert first[1] == k + (rank - k) % world_size
                assert first[2] == tuple(plan.pieces(1, first[1]))
        assert 1 <= len(set(read)) <= 2, (k, world_size, read)
        read.clear()


def test_collated_samples_resume_through_the_checkpoint_store(tmp_path):
    lengths = np.random.default_rng(8).integers(0, 30, 200)
    plan = PretrainingSequences.build(CutDefinition(200, 16, window=16, seed=1, eos=7), Tokens(lengths), 1)
    store_dir = str(tmp_path / "store")
    readers = [WindowedRankReader(plan, r, 4) for r in range(4)]
    iterators = [iter(r) for r in readers]
    seen: dict[int, np.ndarray] = {}
    with CheckpointStore.open(store_dir, identity(), KEY) as store:
        store.start_run(DATASET, world_size=4)
        for _ in range(5):
            for it in iterators:
                _, k, sample = next(it)
                seen[k] = sample["input_ids"]
        store.commit(dataclasses.replace(state(1, uc.Cursor(0, 8)), extra_cursors={"plan": readers[0].cursor()}))
    cursor = restore_latest(store_dir, identity()).extra_cursors["plan"]
    assert cursor == PlanCursor(plan.fingerprint, 0, 20)
    for reader in [WindowedRankReader.resume(plan, cursor, r, 3) for r in range(3)]:
        for _, k, sample in reader:
            seen[k] = sample["input_ids"]
    total = plan.epoch_samples(0)
    assert sorted(seen) == list(range(total))
    assert all(np.array_equal(seen[k], plan.sample(0, k)["input_ids"]) for k in range(total))
    other = PretrainingSequences.build(CutDefinition(200, 17, window=16, seed=1, eos=7), Tokens(lengths), 1)
    with pytest.raises(UmlosError) as caught:
        WindowedRankReader.resume(plan, PlanCursor(other.fingerprint, 0, 0))
    assert caught.value.code == errors.PLAN_FINGERPRINT_MISMATCH
    with pytest.raises(UmlosError) as caught:
        WindowedRankReader.resume(plan, PlanCursor(plan.fingerprint, 0, total + 1))
    assert caught.value.code == errors.PLAN_CURSOR_INVALID


def test_plan_verify_of_a_sequences_folder(tmp_path, capsys):
    from token_cases import random_sequences, write_megatron
    from umlos_cuda.batching.plans.windows.verify import verify_sequences
    from umlos_cuda.cli import main

    prefix = write_megatron(tmp_path / "mega", random_sequences(120, seed=2, high=50))
    out = tmp_path / "seq"
    assert main(["plan", "cut", "--tokens", prefix, "--sequence-length", "16", "--window", "16", "--eos", "0",
                 "--epochs", "2", "--output", str(out)]) == 0
    capsys.readouterr()
    assert main(["plan", "verify", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "8 of 8 windows of every epoch recounted" in printed and "pretraining sequences" in printed
    assert main(["plan", "verify", str(out), "--windows", "3", "--seed", "4"]) == 0
    assert "3 of 8 windows" in capsys.readouterr().out
    assert main(["plan", "verify", str(out), "--expected-fingerprint", "0" * 64]) != 0
    assert "PLAN_FINGERPRINT_MISMATCH" in capsys.readouterr().err
    assert main(["plan", "verify", str(out), "--lengths", prefix]) != 0
    assert "pretraining sequences folder: --source does not apply" in capsys.readouterr().err
    opened = load_sequences(out)
    assert main(["plan", "info", str(out), "--json", "--world-size", "3"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["fingerprint"] == opened.fingerprint and info["definition"]["sequence_length"] == 16
    for e, epoch in enumerate(info["epochs"]):  # the resume rule: sample k to rank k mod 3
        assert (epoch["tokens"], epoch["samples"]) == (opened.epoch_tokens(e), opened.epoch_samples(e))
        assert [r["samples"] for r in epoch["ranks"]] == [len(range(r, epoch["samples"], 3)) for r in range(3)]
    assert main(["plan", "info", str(out)]) == 0
    assert f"fingerprint {opened.fingerprint}" in capsys.readouterr().out
    assert main(["plan", "info", str(out), "--rank", "1"]) != 0
    assert "--rank needs --world-size" in capsys.readouterr().err
    # an index that hashes to its own fingerprint but miscounts a window: only the recount finds it
    lengths = np.random.default_rng(2).integers(0, 50, 90).astype(np.uint32)
    good = PretrainingSequences.build(CutDefinition(90, 16, window=10, seed=3, eos=7), ArrayLengths(lengths), 2)
    index = good.index.copy()
    index[1, 5:] += 1  # epoch 1, window 4 holds one token more
    save_sequences(PretrainingSequences(good.definition, good.lengths, index), tmp_path / "bad")
    with pytest.raises(UmlosError) as caught:
        verify_sequences(tmp_path / "bad", lengths=good.lengths)
    assert caught.value.code == errors.PLAN_NOT_REPRODUCIBLE and "epoch 1 window 4" in caught.value.message
    save_sequences(good, tmp_path / "good")
    assert verify_sequences(tmp_path / "good", lengths=good.lengths)["windows_checked"] == 9
