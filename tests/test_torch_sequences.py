"""SequenceBatchSampler and SequenceDataset: pretraining sequences by batches of samples in a DataLoader, the
plan cursor counted in samples, resumed at another world size and batch size."""

from __future__ import annotations

import json

import numpy as np
import pytest
from token_cases import random_sequences, write_megatron

from umlos_cuda import errors
from umlos_cuda.batching.plans.checkpoint_kinds import PlanCursor
from umlos_cuda.batching.plans.windows import CutDefinition, PretrainingSequences, save_sequences
from umlos_cuda.batching.plans.windows import load_sequences
from umlos_cuda.batching.tokens.mapped import MappedMegatron

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from umlos_cuda.torch import SamplerArgumentError, SequenceBatchSampler, SequenceDataset  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Pretraining sequences of 150 Megatron documents, 2 epochs, sequence length 16, windows of 20."""
    root = tmp_path_factory.mktemp("sequences")
    prefix = write_megatron(root / "mega", random_sequences(150, seed=3, high=60))
    plan = PretrainingSequences.build(CutDefinition(150, 16, window=20, seed=9, eos=1), MappedMegatron(prefix), 2)
    save_sequences(plan, root / "seq", tokens_path=prefix)
    return root / "seq"


def keys_of(batches):
    return [key for batch in batches for key in batch]


@pytest.mark.parametrize("world_size,batch_size", [(1, 8), (3, 4), (4, 5)])
def test_ranks_deal_out_every_sample_once_per_epoch(folder, world_size, batch_size):
    plan = load_sequences(folder)
    samplers = [SequenceBatchSampler(plan, batch_size, rank=r, world_size=world_size) for r in range(world_size)]
    for epoch in range(2):
        lengths = [len(s) for s in samplers]
        steps = {s.batches_remaining for s in samplers}
        passes = [list(s) for s in samplers]
        assert [len(p) for p in passes] == lengths and len(steps) == 1
        (lockstep,) = steps
        assert all(lockstep - 1 <= len(p) <= lockstep for p in passes)  # a rank may run out one batch early
        flat = sorted(key for p in passes for key in keys_of(p))
        assert flat == [(epoch, k) for k in range(plan.epoch_samples(epoch))]
        for r, batches in enumerate(passes):
            assert all(0 < len(b) <= batch_size for b in batches)
            assert all(k % world_size == r and e == epoch for e, k in keys_of(batches))
    assert (samplers[0].epoch, samplers[0].microbatch_index) == (1, plan.epoch_samples(1))  # the plan is done


@pytest.mark.parametrize("before,after,batches", [((4, 3), (2, 5), 2), ((2, 8), (3, 1), 1), ((1, 4), (4, 4), 3)])
def test_resume_at_another_world_size_and_batch_size(folder, before, after, batches):
    plan = load_sequences(folder)
    (r_before, b_before), (r_after, b_after) = before, after
    samplers = [SequenceBatchSampler(plan, b_before, rank=r, world_size=r_before) for r in range(r_before)]
    iterators = [iter(s) for s in samplers]
    consumed = [key for _ in range(batches) for it in iterators for key in next(it)]
    state = samplers[0].state_dict()
    assert all(s.state_dict() == state for s in samplers) and state["microbatch_index"] == batches * b_before * r_before
    resumed = [SequenceBatchSampler(plan, b_after, rank=r, world_size=r_after) for r in range(r_after)]
    for s in resumed:
        s.load_state_dict(json.loads(json.dumps(state)))
        consumed += keys_of(list(s))
    assert sorted(consumed) == [(0, k) for k in range(plan.epoch_samples(0))]  # each sample once, in epoch 0


def test_a_dataloader_with_workers_collates_the_samples_and_saves_the_cursor(folder):
    plan = load_sequences(folder)
    sampler = SequenceBatchSampler(str(folder), 4, rank=1, world_size=2)
    loader = DataLoader(SequenceDataset(str(folder)), batch_sampler=sampler, num_workers=2)
    for step, batch in enumerate(loader):
        keys = [(0, k) for k in range(1, plan.epoch_samples(0), 2)][4 * step:4 * step + 4]
        for name in ("input_ids", "labels", "loss_mask", "position_ids", "segment_ids"):
            expected = np.stack([plan.sample(e, k)[name] for e, k in keys])
            assert np.array_equal(batch[name].numpy(), expected), name
        assert batch["input_ids"].shape == (4, 16) and batch["input_ids"].dtype == torch.int64
        if step == 2:
            cursor = PlanCursor.of(sampler)  # 3 batches of 4 at 2 ranks, not what the workers prefetched
            break
    assert cursor == PlanCursor(plan.fingerprint, 0, 24)
    resumed = SequenceBatchSampler(plan, 3, rank=0, world_size=3)
    cursor.restore_into(resumed)
    assert next(iter(resumed)) == [(0, 24), (0, 27), (0, 30)]


def test_refusals(folder):
    plan = load_sequences(folder)
    for bad, code in ((0, errors.BATCHING_CONFIG_INVALID), ("4", errors.BATCHING_CONFIG_INVALID)):
        with pytest.raises(SamplerArgumentError) as info:
            SequenceBatchSampler(plan, bad)
        assert info.value.code == code
    with pytest.raises(SamplerArgumentError) as info:
        SequenceBatchSampler(12, 4)
    assert info.value.code == errors.PLAN_NOT_FOUND
    with pytest.raises(SamplerArgumentError) as info:
        SequenceBatchSampler(plan, 4, epoch=2)
    assert info.value.code == errors.PLAN_CURSOR_INVALID
    other = PretrainingSequences.build(CutDefinition(150, 16, window=20, seed=10, eos=1), plan.lengths, 2)
    with pytest.raises(SamplerArgumentError) as info:
        SequenceBatchSampler(plan, 4).load_state_dict(SequenceBatchSampler(other, 4).state_dict())
    assert info.value.code == errors.PLAN_FINGERPRINT_MISMATCH


def test_a_mixture_of_sequences_through_a_dataloader(tmp_path):
    """A mixture (plan cut --mix) is one epoch of samples numbered across datasets: each batch item is
    ``mixture.sample(k)``, with the dataset it came from."""
    from umlos_cuda.batching.plans.windows import load_mixed_sequences
    from umlos_cuda.cli import main

    web = write_megatron(tmp_path / "web", random_sequences(120, seed=2, high=50))
    code = write_megatron(tmp_path / "code", random_sequences(30, seed=3, high=50))
    assert main(["plan", "cut", "--mix", f"{web}:0.7", f"{code}:0.3:2", "--num-samples", "100", "--sequence-length",
                 "16", "--window", "16", "--eos", "0", "--output", str(tmp_path / "mix")]) == 0
    mixture = load_mixed_sequences(tmp_path / "mix")
    sampler = SequenceBatchSampler(str(tmp_path / "mix"), 8, rank=1, world_size=3)
    loader = DataLoader(SequenceDataset(str(tmp_path / "mix")), batch_sampler=sampler, num_workers=2)
    count = len(sampler)
    batches = list(loader)
    keys = list(range(1, 100, 3))
    assert len(batches) == count == -(-len(keys) // 8)
    got = torch.cat([b["input_ids"] for b in batches]).numpy()
    assert np.array_equal(got, np.stack([mixture.sample(k)["input_ids"] for k in keys]))
    assert torch.cat([b["component"] for b in batches]).tolist() == [mixture.sample(k)["component"] for k in keys]
    assert {0, 1} <= set(torch.cat([b["component"] for b in batches]).tolist())
    assert (sampler.epoch, sampler.microbatch_index) == (0, 100)  # one epoch, done
    with pytest.raises(errors.UmlosError) as info:
        SequenceDataset(str(tmp_path / "mix"))[(1, 0)]
    assert info.value.code == errors.PLAN_CURSOR_INVALID
    # under hf, only what model(**batch) takes: the component index is not handed to the model
    assert sorted(SequenceDataset(str(tmp_path / "mix"), preset="hf")[(0, 5)]) == ["input_ids", "labels",
                                                                                  "position_ids"]


def test_hf_labels_move_right_where_the_loss_mask_keeps_them():
    from umlos_cuda.torch._sequences import hf_labels

    labels = np.array([11, 12, 13, 14, -100, -100])  # the next token of each position; a padded tail of 2
    mask = np.array([0, 1, 1, 0, 0, 0], dtype=np.uint8)  # 11 and 14 are not trained on (a prompt, say)
    assert hf_labels(labels, mask).tolist() == [-100, -100, 12, 13, -100, -100]


def test_the_hf_preset_is_what_a_transformers_model_shifts_once(folder):
    """``SequenceDataset(preset="hf")`` gives the loss of the shifted convention (``cross_entropy(logits,
    labels)`` where the loss mask is 1), position ``L - 1`` aside; handing the shifted labels to the model as
    ``labels=`` (what the docs once said) gives the loss of the token after next: the model shifts them again."""
    transformers = pytest.importorskip("transformers")
    plan = load_sequences(folder)
    keys = [(1, k) for k in (0, 3, 7)] + [(1, plan.epoch_samples(1) - 1)]
    hf = torch.utils.data.default_collate([SequenceDataset(str(folder), preset="hf")[key] for key in keys])
    shifted = torch.utils.data.default_collate([SequenceDataset(str(folder))[key] for key in keys])
    assert sorted(hf) == ["input_ids", "labels", "position_ids"] and all(v.dtype == torch.int64 for v in hf.values())
    assert torch.equal(hf["input_ids"], shifted["input_ids"]) and torch.equal(hf["position_ids"],
                                                                              shifted["position_ids"])
    trained = torch.where(shifted["loss_mask"] == 1, shifted["labels"], -100)
    assert (hf["labels"][:, 0] == -100).all() and torch.equal(hf["labels"][:, 1:], trained[:, :-1])
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=int(hf["input_ids"].max()) + 1, attn_implementation="sdpa", use_cache=False)).double().eval()
    with torch.no_grad():
        logits = model(input_ids=hf["input_ids"], position_ids=hf["position_ids"]).logits
        loss = model(**hf).loss
        double = model(input_ids=shifted["input_ids"], labels=shifted["labels"],
                       position_ids=shifted["position_ids"]).loss
    def cross(targets):  # transformers takes the loss over float32 logits
        return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten())

    assert torch.isclose(loss, cross(trained[:, :-1]), rtol=1e-6)
    assert torch.isclose(double, cross(shifted["labels"][:, 1:]), rtol=1e-6)
    assert not torch.isclose(double, loss, rtol=1e-4)


def test_a_preset_without_a_per_sample_form_is_refused(folder):
    with pytest.raises(errors.UmlosError) as info:
        SequenceDataset(str(folder), preset="padding_free")
    assert info.value.code == errors.COLLATE_INPUT_INVALID and "shifted, hf" in info.value.message
