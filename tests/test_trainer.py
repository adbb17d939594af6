"""``transformers.Trainer`` (and TRL's ``SFTTrainer``) on a batch plan: a killed and resumed run trains on
exactly the microbatches, and gets exactly the losses, of the run that was not interrupted.

The runs (tests/trainer_cases.py): a randomly initialised 2-layer Llama (hidden 32), 40 optimizer steps of 2
plan microbatches each, a checkpoint every 10 steps, one thread, deterministic algorithms. Each trained
microbatch leaves a line: its step, its loss as ``float.hex`` and a SHA-256 of the tensors the model took.
Equal lines mean the same microbatch in the same place with a bit-identical loss (CPU, one thread: the
same operations on the same values in the same order give the same bits).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from token_cases import make_store  # noqa: E402
from trainer_cases import MAX_STEPS, records, train  # noqa: E402
from umlos_cuda import errors  # noqa: E402
from umlos_cuda.batching import BatchingConfig, BatchPlanBuilder, PackingConfig  # noqa: E402
from umlos_cuda.batching.plans.io import save_plan  # noqa: E402
from umlos_cuda.errors import UmlosError  # noqa: E402
from umlos_cuda.torch.trainer import CURSOR_FILE, PlanTrainerData, plan_trainer_class  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
#: A run of the tiny model takes seconds; this bounds a subprocess that hangs.
TIMEOUT = 300


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """A token store, a padded plan of 4 epochs of 20 microbatches (80 = 40 steps of 2) and a packed one whose
    epochs differ in length (15, 15, 14, 14, 15, 14)."""
    root = tmp_path_factory.mktemp("trainer")
    source = make_store(root, 60, seed=3)
    padded = BatchingConfig.predictable(token_budget=512, bucket_edges=(32, 64, 128), overflow_max=256, seed=7)
    save_plan(BatchPlanBuilder(source.length_cache(), padded).build(4), root / "padded")
    packed = BatchingConfig(512, (), 256, "pad_to_bucket", 7, pack=PackingConfig(256, "first_fit"))
    save_plan(BatchPlanBuilder(source.length_cache(), packed).build(6), root / "packed")
    return root


def run_child(root, name: str, **kwargs) -> subprocess.CompletedProcess:
    """One training in a fresh interpreter (what a job restarted after a kill is)."""
    kwargs = {"store": str(root / "store"), "plan": str(root / "padded"), "output_dir": str(root / f"out-{name}"),
              "record": str(root / f"{name}.jsonl"), **kwargs}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), HERE])}
    return subprocess.run([sys.executable, os.path.join(HERE, "trainer_cases.py"), json.dumps(kwargs)],
                          capture_output=True, text=True, timeout=TIMEOUT, env=env, check=False)


def from_step(lines: list[dict], step: int) -> list[dict]:
    return [line for line in lines if line["step"] > step]


def test_a_run_killed_with_sigkill_resumes_with_the_same_microbatches_and_bit_identical_losses(plans):
    whole = run_child(plans, "whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    # killed at the end of step 23, three steps after checkpoint-20; two workers fetch ahead of the loop,
    # so the sampler has handed out more microbatches than were trained on when checkpoint-20 was written
    killed = run_child(plans, "killed", kill_at=23, workers=2)
    assert killed.returncode == -9, killed.stderr[-3000:]
    out = plans / "out-killed"
    assert sorted(os.listdir(out)) == ["checkpoint-10", "checkpoint-20"]
    with open(out / "checkpoint-20" / CURSOR_FILE, encoding="utf-8") as handle:
        cursor = json.load(handle)
    assert (cursor["epoch"], cursor["microbatch_index"]) == (2, 0)  # 20 steps x 2 microbatches = epochs 0 and 1
    resumed = run_child(plans, "resumed", output_dir=str(out), resume=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout.splitlines()[-1]) == {"global_step": MAX_STEPS, "cursor": [3, 20], "epoch": 1.0,
                                                           "evaluated": [], "num_tokens": None}

    want, before, after = (records(plans / f"{name}.jsonl") for name in ("whole", "killed", "resumed"))
    assert len(want) == 2 * MAX_STEPS and len({line["inputs"] for line in want}) > 40
    assert before == want[:len(before)] and before[-1]["step"] == 23
    assert after == from_step(want, 20)  # steps 21 to 40: same microbatches, same loss bits


def test_a_run_stopped_mid_epoch_of_a_packed_plan_resumes_exactly(plans):
    """The packed plan's epochs differ in length, which the Trainer's own skip cannot count; checkpoint-20
    (40 microbatches: 15 + 15 + 10) stands inside epoch 2."""
    kwargs = {"store": str(plans / "store"), "plan": str(plans / "packed")}
    whole = train(**kwargs, output_dir=str(plans / "p-whole"), record=str(plans / "p-whole.jsonl"))
    assert whole == {"global_step": MAX_STEPS, "cursor": [5, 7], "epoch": 80 / 87, "evaluated": [],
                     "num_tokens": None}  # 80 of 87 microbatches
    train(**kwargs, output_dir=str(plans / "p-cut"), record=str(plans / "p-cut.jsonl"), stop_at=20)
    with open(plans / "p-cut" / "checkpoint-20" / CURSOR_FILE, encoding="utf-8") as handle:
        cursor = json.load(handle)
    assert (cursor["epoch"], cursor["microbatch_index"]) == (2, 10)
    resumed = train(**kwargs, output_dir=str(plans / "p-cut"), record=str(plans / "p-resumed.jsonl"),
                    resume=str(plans / "p-cut" / "checkpoint-20"))
    want = records(plans / "p-whole.jsonl")
    assert records(plans / "p-cut.jsonl") == want[:40]
    assert records(plans / "p-resumed.jsonl") == from_step(want, 20)  # state.epoch of every step included
    assert resumed == whole
    # the Trainer's own state.epoch counts the batches of this run only (its skip is off): 40 of 87 after the resume
    own = train(**kwargs, output_dir=str(plans / "p-cut"), record=str(plans / "p-own.jsonl"),
                resume=str(plans / "p-cut" / "checkpoint-20"), trainer_epoch=True)
    assert own["epoch"] == 40 / 87 and own["cursor"] == whole["cursor"]
    # with the Trainer's own skip on as well, the 40 microbatches after the cursor would be skipped too
    train(**kwargs, output_dir=str(plans / "p-twice"), record=str(plans / "p-twice.jsonl"),
          resume=str(plans / "p-cut" / "checkpoint-20"), trainer_skips=True)
    every = plan_digests(plans / "packed", plans / "store", "hf")
    assert [line["inputs"] for line in want] == every[:80]
    assert [line["inputs"] for line in records(plans / "p-twice.jsonl")] == every[80:]  # 40 later: 80 to 86


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")
def test_sft_trainer_takes_the_same_data_source(plans):
    """TRL's SFTTrainer (a Trainer subclass) with the plan: the same microbatches as the Trainer, losses equal
    to 1e-5 relative (it computes the loss through its own fused head: another summation order), and its own
    stop and resume bit-identical."""
    pytest.importorskip("trl")
    kwargs = {"store": str(plans / "store"), "plan": str(plans / "padded"), "base": "SFTTrainer"}
    train(**kwargs, output_dir=str(plans / "s-whole"), record=str(plans / "s-whole.jsonl"))
    train(**kwargs, output_dir=str(plans / "s-cut"), record=str(plans / "s-cut.jsonl"), stop_at=10)
    train(**kwargs, output_dir=str(plans / "s-cut"), record=str(plans / "s-resumed.jsonl"), resume=True)
    want = records(plans / "s-whole.jsonl")
    assert records(plans / "s-cut.jsonl") == want[:20] and records(plans / "s-resumed.jsonl") == from_step(want, 10)
    plain = records(plans / "whole.jsonl") if os.path.exists(plans / "whole.jsonl") else None
    if plain is None:
        plain = records(_plain_run(plans))
    assert [line["inputs"] for line in want] == [line["inputs"] for line in plain]
    for ours, theirs in zip(want, plain):
        assert float.fromhex(ours["loss"]) == pytest.approx(float.fromhex(theirs["loss"]), rel=1e-5)


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")
def test_sft_trainer_trains_on_a_packed_plan_padding_free(plans):
    """SFTTrainer's own packing is dataset preparation (skipped: the plan packs); its model takes the packed
    plan's microbatches in the ``padding_free`` form, every one in the plan's order."""
    pytest.importorskip("trl")
    record = plans / "s-packed.jsonl"
    ran = train(str(plans / "store"), str(plans / "packed"), str(plans / "s-packed"), str(record), base="SFTTrainer",
                preset="padding_free")
    assert (ran["global_step"], ran["cursor"], ran["epoch"]) == (MAX_STEPS, [5, 7], 80 / 87)
    want = plan_digests(plans / "packed", plans / "store", "padding_free")[:2 * MAX_STEPS]
    assert [line["inputs"] for line in records(record)] == want
    # TRL counts num_tokens as position_ids.size(1) without an attention mask: every token trained on, exactly
    assert ran["num_tokens"] == plan_tokens(plans / "packed", plans / "store", 2 * MAX_STEPS)


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")
def test_sft_trainer_counts_a_4d_mask_as_token_pairs_and_is_warned(plans):
    """TRL's num_tokens is attention_mask.sum(): the hf preset's 4-D mask of a packed plan sums the pairs of tokens
    that attend to each other, far more than the tokens (the issue's "100x"); the data source warns."""
    pytest.importorskip("trl")
    with pytest.warns(UserWarning, match="TRL's num_tokens will be counted as attention_mask.sum"):
        ran = train(str(plans / "store"), str(plans / "packed"), str(plans / "s-4d"), str(plans / "s-4d.jsonl"),
                    base="SFTTrainer", preset="hf")
    assert ran["num_tokens"] > 10 * plan_tokens(plans / "packed", plans / "store", 2 * MAX_STEPS)


def plan_tokens(plan, store, microbatches: int) -> int:
    """The tokens (padding excluded) of the plan's first ``microbatches`` microbatches."""
    from umlos_cuda.batching import TokenStore, collate_microbatch, load_plan

    opened, source = load_plan(plan), TokenStore.open(store)
    every = (mb for epoch in range(opened.num_epochs) for mb in opened.iter_epoch(epoch))
    return sum(collate_microbatch(source, next(every)).num_tokens for _ in range(microbatches))


def plan_digests(plan, store, preset: str) -> list[str]:
    """The digest of every microbatch of the plan, in order, as the data source collates it."""
    from torch.utils.data import DataLoader

    from trainer_cases import digest

    data = PlanTrainerData(plan, store, rank=0, world_size=1, preset=preset)
    return [digest(batch) for batch in DataLoader(data.dataset, batch_sampler=data, collate_fn=data.collator)]


def _plain_run(root):
    path = root / "plain.jsonl"
    train(str(root / "store"), str(root / "padded"), str(root / "out-plain"), str(path))
    return path


# ====================================================================== the data source alone
@pytest.mark.parametrize("plan, sizes, world_sizes", [("packed", (15, 15, 14, 14, 15, 14), (1,)),
                                                    ("padded", (20, 20, 20, 20), (1, 2, 4, 5))])
def test_the_cursor_counts_trained_microbatches(plans, plan, sizes, world_sizes):
    """``cursor()`` after k of this rank's microbatches is where the sampler stood when it had handed out k
    (no prefetch here), across epochs (of unequal length in the packed plan), at every rank."""
    for world_size in world_sizes:
        for rank in range(world_size):
            data = PlanTrainerData(plans / plan, plans / "store", rank=rank, world_size=world_size)
            total = len(data)
            assert total == sum(sizes) // world_size
            handed = [(0, 0)]
            for _ in data:  # one pass of the data source is the whole plan
                handed.append((data.sampler.epoch, data.sampler.microbatch_index))
            assert len(handed) == total + 1 and handed[-1] == (len(sizes) - 1, sizes[-1])
            assert len(data) == total  # whatever the cursor
            fresh = PlanTrainerData(plans / plan, plans / "store", rank=rank, world_size=world_size)
            for consumed, want in enumerate(handed):
                fresh.consumed = consumed
                assert fresh.cursor() == want, (world_size, rank, consumed)


def test_a_world_size_that_leaves_a_rank_without_a_microbatch_is_refused(plans):
    with pytest.raises(UmlosError) as caught:
        PlanTrainerData(plans / "packed", plans / "store", rank=0, world_size=2)
    assert caught.value.code == errors.INVALID_ARGUMENT
    assert "epoch 0 of the plan has 15 microbatches" in caught.value.message
    assert "(umlos-cuda plan info shows them)" in caught.value.message  # a command that exists


def test_another_datasets_store_of_the_same_row_count_is_refused(plans, tmp_path):
    """It trained on the other store's rows without a word; batch generate refused the same pair."""
    make_store(tmp_path, 60, seed=4)
    with pytest.raises(UmlosError) as caught:
        PlanTrainerData(plans / "padded", tmp_path / "store", rank=0, world_size=1)
    assert caught.value.code == errors.BATCH_STORE_MISMATCH and "lengths of" in caught.value.message


def test_a_checkpoint_without_a_cursor_or_of_another_plan_is_refused(plans, tmp_path):
    data = PlanTrainerData(plans / "padded", plans / "store", rank=0, world_size=1)
    with pytest.raises(UmlosError) as caught:
        data.load(str(tmp_path))
    assert caught.value.code == errors.PLAN_CURSOR_INVALID and CURSOR_FILE in caught.value.message
    other = PlanTrainerData(plans / "packed", plans / "store", rank=0, world_size=1)
    other.save(str(tmp_path))
    with pytest.raises(UmlosError) as caught:
        data.load(str(tmp_path))
    assert caught.value.code == errors.PLAN_FINGERPRINT_MISMATCH


def test_a_batch_size_other_than_one_microbatch_is_refused(plans, tmp_path):
    data = PlanTrainerData(plans / "padded", plans / "store", rank=0, world_size=1)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=300))
    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, report_to="none",
                                          use_cpu=True)
    with pytest.raises(UmlosError) as caught:
        plan_trainer_class()(model=model, args=args, plan_data=data)
    assert caught.value.code == errors.INVALID_ARGUMENT and "per_device_train_batch_size=1" in caught.value.message


# ====================================================================== the steps on a checkpoint store's tape
def test_a_trainer_run_s_steps_on_the_tape_check_against_its_plan_across_a_resume(plans, capsys):
    """``plan_tape``: the packed plan (epochs of 15 and 14 microbatches, so steps of 2 cross epochs' ends) stopped
    at step 20 and resumed from checkpoint-20; the tape holds all 40 steps once, each the plan's rows, and the
    model was given what it is given without a tape (bit-identical losses)."""
    from umlos_cuda.batching.plans.explain import StepExplainer, check_tape
    from umlos_cuda.cli import main

    kwargs = {"store": str(plans / "store"), "plan": str(plans / "packed"), "tape": str(plans / "t-store")}
    train(**kwargs, output_dir=str(plans / "t-cut"), record=str(plans / "t-cut.jsonl"), stop_at=20)
    train(**kwargs, output_dir=str(plans / "t-cut"), record=str(plans / "t-cut.jsonl"),
          resume=str(plans / "t-cut" / "checkpoint-20"))
    report = check_tape(kwargs["tape"], StepExplainer.open(plans / "packed"))
    # 80 microbatches: 15 + 15 + 14 + 14 + 15 and 7 of epoch 5; the steps at microbatches 15 and 73 cross an
    # epoch's end (two records each, one per epoch)
    assert report == {"steps": 42, "units": 80, "first": {"t": 1, "epoch": 0, "cursor": 0},
                      "last": {"t": MAX_STEPS, "epoch": 5, "cursor": 7}}
    capsys.readouterr()
    assert main(["plan", "explain", str(plans / "packed"), "--check-tape", kwargs["tape"]]) == 0
    assert capsys.readouterr().out.startswith(f"tape {kwargs['tape']}: 42 steps (t 1 to {MAX_STEPS}), 80 microbatches")
    plain = records(plans / "p-whole.jsonl") if os.path.exists(plans / "p-whole.jsonl") else None
    if plain is None:
        train(kwargs["store"], kwargs["plan"], str(plans / "p-whole"), str(plans / "p-whole.jsonl"))
        plain = records(plans / "p-whole.jsonl")
    assert [(line["step"], line["loss"]) for line in records(plans / "t-cut.jsonl")] == \
        [(line["step"], line["loss"]) for line in plain]


def test_a_tampered_step_on_a_trainer_run_s_tape_is_named(plans, capsys):
    """A record whose digest is not that of the rows the plan gives for its microbatches: PLAN_TAPE_MISMATCH
    naming the step."""
    from umlos_cuda.batching.plans.explain import StepExplainer, check_tape
    from umlos_cuda.cli import main

    tape = str(plans / "t-tampered")
    train(str(plans / "store"), str(plans / "padded"), str(plans / "t-tampered-out"),
          str(plans / "t-tampered.jsonl"), tape=tape, tamper_at=7, stop_at=10)
    with pytest.raises(UmlosError) as caught:
        check_tape(tape, StepExplainer.open(plans / "padded"))
    assert caught.value.code == errors.PLAN_TAPE_MISMATCH
    assert "step 7 (epoch 0, units 12 to 13) trained other rows than the plan gives" in caught.value.message
    capsys.readouterr()
    assert main(["plan", "explain", str(plans / "padded"), "--check-tape", tape]) == 2
    assert "error PLAN_TAPE_MISMATCH:" in capsys.readouterr().err


def test_a_plan_tape_that_cannot_record_is_refused(plans, tmp_path):
    """Rank 0 writes the tape (a started store); the other ranks send their steps (True)."""
    from test_checkpoint_support import KEY, identity

    from umlos_cuda.checkpoint import CheckpointStore

    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=300))
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=1,
                                          report_to="none", use_cpu=True)
    with CheckpointStore.open(tmp_path / "store", identity(), KEY) as store:
        for rank, given, words in [(0, store, "start the run first"), (0, True, "for ranks other than 0"),
                                   (1, store, "rank 1 was given a CheckpointStore"),
                                   (0, str(tmp_path / "store"), "plan_tape is a str")]:
            data = PlanTrainerData(plans / "padded", plans / "store", rank=rank, world_size=2)
            with pytest.raises(UmlosError) as caught:
                plan_trainer_class()(model=model, args=args, plan_data=data, plan_tape=given)
            assert caught.value.code == errors.INVALID_ARGUMENT and words in caught.value.message, rank


@pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                    reason="this torch build has no gloo backend for torch.distributed")
def test_a_two_rank_trainer_run_s_tape_holds_both_ranks_microbatches(plans):
    """``torchrun`` with 2 ranks (gloo, CPU; tests/dist_scripts/trainer_tape_worker.py): rank 1's microbatches reach
    rank 0's tape at each step's end, so its 6 steps hold the plan's microbatches 0 to 11, each its plan's rows."""
    from dist_scripts.torchrun import finish, launch

    from umlos_cuda.batching.plans.explain import StepExplainer, check_tape

    store = str(plans / "tape-w2")
    finish(launch(2, "trainer_tape_worker.py", str(plans), store), "torchrun W=2 with plan_tape")
    report = check_tape(store, StepExplainer.open(plans / "padded"))
    assert report == {"steps": 6, "units": 12, "first": {"t": 1, "epoch": 0, "cursor": 0},
                      "last": {"t": 6, "epoch": 0, "cursor": 12}}
