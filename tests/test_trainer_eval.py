"""Evaluation over a validation plan (``PlanEvalData``), alone and as the ``eval_dataset`` of ``transformers.Trainer``.

One token store split by ``plan build --split``'s rule into a train plan and a validation plan (the validation plan
truncates over-long samples from the left, so evaluation runs on cut samples too). Checked: every rank of every
world size takes the same number of steps, the real microbatches over the ranks are the plan's epoch, each once,
in global order, and the rest is masked padding; ``Trainer.evaluate()`` gives the mean of the microbatches' losses,
the same bits every time, and leaves a padded rank's padding out; evaluating during training changes no trained
microbatch and no loss, and a resumed run evaluates to the same bits. Multi-process runs (``torchrun``, W = 1, 2, 3)
give bit-identical ``eval_loss``: tests/dist_scripts/trainer_eval_worker.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from token_cases import make_store  # noqa: E402
from trainer_cases import MAX_STEPS, records, train  # noqa: E402
import umlos_cuda as uc  # noqa: E402
from umlos_cuda import errors  # noqa: E402
from umlos_cuda.batching import (BatchingConfig, BatchPlanBuilder, TokenStore, collate_microbatch,  # noqa: E402
                                 load_plan, save_plan)
from umlos_cuda.batching.plans.overlong import OverlongConfig  # noqa: E402
from umlos_cuda.batching.plans.splits import SplitConfig  # noqa: E402
from umlos_cuda.torch import Padding  # noqa: E402
from umlos_cuda.torch.trainer import EVAL_PADDING, PlanEvalData, PlanTrainerData, plan_trainer_class  # noqa: E402


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """A store of 100 records; the train side (4 epochs, a multiple of every world size used here in each epoch is
    not needed: only rank 0 of 1 trains) and the validation side, truncated from the left at 48 tokens."""
    root = tmp_path_factory.mktemp("eval")
    source = make_store(root, 100, seed=11)
    cache = source.length_cache()
    train_side = BatchingConfig.predictable(512, (32, 64, 128), 256, seed=7, split=SplitConfig("train", 0.25, 3))
    save_plan(BatchPlanBuilder(cache, train_side).build(4), root / "train")
    validation = BatchingConfig.predictable(128, (16, 32), 48, seed=7, split=SplitConfig("validation", 0.25, 3),
                                            overlong=OverlongConfig(48, "truncate_left"))
    plan = BatchPlanBuilder(cache, validation).build(1)
    count = len(plan.epochs[0])
    assert plan.epochs[0].stats["overlong"]["samples"] > 0 and count % 2 and count % 3  # W = 2 and 3 pad a rank
    save_plan(plan, root / "validation")
    return root


def real(keys) -> bool:
    return not any(isinstance(key, Padding) for key in keys)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_every_rank_steps_alike_and_the_real_microbatches_are_the_epoch_once(split, world_size):
    plan = load_plan(split / "validation")
    count = len(plan.epochs[0])
    ranks = [PlanEvalData(split / "validation", split / "store", rank=rank, world_size=world_size)
             for rank in range(world_size)]
    steps = -(-count // world_size)
    passes = [list(data) for data in ranks]
    assert all(len(data) == steps == len(keys) for data, keys in zip(ranks, passes))
    assert all(list(data) == keys for data, keys in zip(ranks, passes))  # every evaluation from the first, the same
    in_order = [passes[rank][step] for step in range(steps) for rank in range(world_size)]
    taken = [keys for keys in in_order if real(keys)]
    assert [[(k.row, k.start, k.stop) for k in keys] for keys in taken] == [
        [(int(r), int(a), int(b)) for r, (a, b) in zip(mb.rows, mb.spans)] for mb in plan.iter_epoch(0)]
    padding = [keys for keys in in_order if not real(keys)]
    assert len(padding) == steps * world_size - count and all(data.padded == bool(padding) for data in ranks)
    for keys in passes:  # a padded step holds the keys of the rank's first microbatch, masked
        assert real(keys[0]) and all([p.fill for p in step] == keys[0] for step in keys if not real(step))


def test_the_collated_batches_are_the_microbatches_and_padding_is_masked(split):
    plan = load_plan(split / "validation")
    store = TokenStore.open(split / "store")
    count = len(plan.epochs[0])
    rank, world_size = count % 3, 3  # a rank that takes padding in the last step
    data = PlanEvalData(split / "validation", split / "store", rank=rank, world_size=world_size)
    loader = torch.utils.data.DataLoader(data.dataset, batch_sampler=data, collate_fn=data.collate_fn, num_workers=1)
    batches = list(loader)
    mine = [mb for mb in plan.iter_epoch(0) if mb.index % world_size == rank]
    assert len(batches) == len(mine) + 1
    for batch, mb in zip(batches, mine):
        direct = collate_microbatch(store, mb, preset="hf")
        assert batch.pop(EVAL_PADDING) is False and batch.keys() == direct.keys()
        assert all(np.array_equal(batch[key].numpy(), value) for key, value in direct.items())
    last = batches[-1]
    assert last.pop(EVAL_PADDING) is True and (last["labels"] == -100).all()
    first = collate_microbatch(store, mine[0], preset="hf")
    assert np.array_equal(last["input_ids"].numpy(), first["input_ids"])  # shapes of a real microbatch


def tiny_model(vocab: int):
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=vocab, max_position_embeddings=512, attn_implementation="sdpa", use_cache=False))


def test_trainer_evaluate_gives_the_mean_of_the_microbatch_losses_every_time(split, tmp_path):
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    store = TokenStore.open(split / "store")
    vocab = max(int(store.arrays(row)[0].max()) for row in range(len(store))) + 1
    model = tiny_model(vocab)
    plan = load_plan(split / "validation")
    count = len(plan.epochs[0])
    padded_rank = count % 3
    datasets = {"all": PlanEvalData(plan, split / "store", rank=0, world_size=1),
                "padded": PlanEvalData(plan, split / "store", rank=padded_rank, world_size=3)}
    args = transformers.TrainingArguments(str(tmp_path), per_device_train_batch_size=1, report_to="none",
                                          use_cpu=True, disable_tqdm=True)
    trainer = plan_trainer_class()(model=model, args=args, eval_dataset=datasets,
                                   plan_data=PlanTrainerData(split / "train", split / "store", rank=0, world_size=1))
    metrics = trainer.evaluate()
    again = trainer.evaluate()
    assert [again[k] for k in ("eval_all_loss", "eval_padded_loss")] == [
        metrics[k] for k in ("eval_all_loss", "eval_padded_loss")]  # every evaluation the same bits
    model.eval()
    with torch.no_grad():
        losses = np.array([float(model(**{k: torch.from_numpy(v) for k, v in collate_microbatch(
            store, mb, preset="hf").items()}).loss) for mb in plan.iter_epoch(0)], dtype=np.float32)
    assert metrics["eval_all_loss"] == pytest.approx(float(losses.mean()), rel=1e-6)
    # one process of three: its own microbatches, the NaN of the padding step left out
    assert metrics["eval_padded_loss"] == pytest.approx(float(losses[padded_rank::3].mean()), rel=1e-6)

    trainer.args.logging_nan_inf_filter = False  # the padding's NaN would be averaged in: refused
    with pytest.raises(uc.UmlosError) as caught:
        trainer.evaluate(datasets["padded"])
    assert caught.value.code == errors.INVALID_ARGUMENT and "logging_nan_inf_filter" in caught.value.message
    assert "eval_loss" in trainer.evaluate(datasets["all"])  # a layout without padding needs no filter


def test_evaluating_during_training_changes_no_step_and_resumes_to_the_same_bits(split):
    kwargs = {"store": str(split / "store"), "plan": str(split / "train")}
    plain = train(**kwargs, output_dir=str(split / "plain"), record=str(split / "plain.jsonl"))
    whole = train(**kwargs, output_dir=str(split / "whole"), record=str(split / "whole.jsonl"),
                  eval_plan=str(split / "validation"))
    assert records(split / "whole.jsonl") == records(split / "plain.jsonl")  # the same microbatches and loss bits
    assert [step for step, _ in whole["evaluated"]] == [10, 20, 30, 40]
    assert len({loss for _, loss in whole["evaluated"]}) == 4  # the model changed between evaluations
    train(**kwargs, output_dir=str(split / "cut"), record=str(split / "cut.jsonl"), stop_at=20,
          eval_plan=str(split / "validation"))
    resumed = train(**kwargs, output_dir=str(split / "cut"), record=str(split / "resumed.jsonl"), resume=True,
                    eval_plan=str(split / "validation"))
    assert resumed == whole and plain["cursor"] == whole["cursor"]
    with open(split / "cut" / "checkpoint-40" / "trainer_state.json", encoding="utf-8") as handle:
        assert json.load(handle)["epoch"] == whole["epoch"] == 2 * MAX_STEPS / len(PlanTrainerData(
            split / "train", split / "store", rank=0, world_size=1))


@pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                    reason="this torch build has no gloo backend for torch.distributed")
def test_eval_loss_is_the_same_bits_at_every_world_size(split):
    """``torchrun`` with 1, 2 and 3 ranks (gloo, CPU): the Trainer gathers the ranks' losses in global microbatch
    order, the padding's NaN is dropped, and ``eval_loss`` comes out bit-identical."""
    from dist_scripts.torchrun import finish, launch

    count = len(load_plan(split / "validation").epochs[0])
    losses = {}
    for world_size in (1, 2, 3):
        out = split / f"eval-w{world_size}.json"
        finish(launch(world_size, "trainer_eval_worker.py", str(split), str(out)), f"torchrun W={world_size}")
        with open(out, encoding="utf-8") as handle:
            losses[world_size] = json.load(handle)
        assert losses[world_size]["microbatches"] == count
    assert losses[1]["eval_loss"] == losses[2]["eval_loss"] == losses[3]["eval_loss"]


def test_another_store_of_the_same_size_is_refused(split, tmp_path):
    """The validation plan names its store by identity: a store of another dataset with as many rows is refused
    (as PlanTrainerData and batch generate refuse it), not evaluated without a word."""
    other = make_store(tmp_path, 100, seed=12)
    assert len(other) == len(TokenStore.open(split / "store"))
    with pytest.raises(uc.UmlosError) as caught:
        PlanEvalData(split / "validation", other.root)
    assert caught.value.code == errors.BATCH_STORE_MISMATCH


def test_a_padded_layout_with_the_nan_filter_off_names_the_command_that_shows_the_counts(split):
    from umlos_cuda.torch._plan_eval import check_eval_layout

    data = PlanEvalData(split / "validation", split / "store", rank=0, world_size=2)
    assert data.padded
    with pytest.raises(uc.UmlosError) as caught:
        check_eval_layout(data, filters_nan=False)
    assert caught.value.code == errors.INVALID_ARGUMENT and "umlos-cuda plan info" in str(caught.value)
    assert "plan stats" not in str(caught.value)


def test_a_plan_of_one_store_needs_its_store(split):
    with pytest.raises(uc.UmlosError) as caught:
        PlanEvalData(split / "validation")
    assert caught.value.code == errors.INVALID_ARGUMENT and "store=" in str(caught.value)
