"""A tiny Llama trained by ``transformers.Trainer`` on a plan, for tests/test_trainer.py.

:func:`train` runs one training (fresh or resumed) and appends one JSON line
per microbatch the Trainer trained on to ``record``: the global step it
belongs to, the loss (``float.hex``, so equal means bit-identical) and a
SHA-256 of the tensors the model took. Lines are flushed as they are
written, so a run killed with SIGKILL leaves every line before the kill.
Run as a script (``python trainer_cases.py ARGS_JSON``), it is the
subprocess the SIGKILL test kills: ``kill_at`` sends SIGKILL to itself at
the end of that step, after the checkpoint before it was written.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys

#: The Trainer's settings every run shares (only ``max_steps`` decides the learning-rate schedule).
MAX_STEPS = 40
SAVE_STEPS = 10
ACCUMULATION = 2


def digest(inputs: dict) -> str:
    sha = hashlib.sha256()
    for key in sorted(inputs):
        value = inputs[key]
        sha.update(key.encode())
        sha.update(value.numpy().tobytes() if hasattr(value, "numpy") else repr(value).encode())
    return sha.hexdigest()


def train(store: str, plan: str, output_dir: str, record: str, *, resume: str | bool | None = None,
          stop_at: int | None = None, kill_at: int | None = None, base: str = "Trainer",
          preset: str = "hf", workers: int = 0, trainer_skips: bool = False, trainer_epoch: bool = False,
          eval_plan: str | None = None, tape: str | None = None, tamper_at: int | None = None) -> dict:
    """Train the tiny model; ``stop_at`` ends the run cleanly after that step (as a job's time limit would);
    ``trainer_skips`` turns the Trainer's own skip of trained batches back on, ``trainer_epoch`` its own
    ``state.epoch`` (to show what they would do); ``eval_plan`` is evaluated every ``SAVE_STEPS`` steps; ``tape``:
    a checkpoint store the steps are recorded in (``plan_tape``), ``tamper_at`` the step whose record's digest is
    changed on its way to the tape.

    Returns the last global step, the cursor, ``state.epoch``, the ``[step, eval_loss hex]`` of each
    evaluation in the Trainer's history (a resumed run's includes those before its checkpoint) and the last
    ``num_tokens`` TRL's SFTTrainer logged (None under the Trainer)."""
    import torch
    import transformers

    from umlos_cuda.torch.trainer import PlanTrainerData, plan_trainer_class

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    from umlos_cuda.torch.trainer import PlanEvalData

    data = PlanTrainerData(plan, store, rank=0, world_size=1, preset=preset)
    evaluation = {} if eval_plan is None else {
        "eval_dataset": PlanEvalData(eval_plan, store, rank=0, world_size=1, preset=preset)}
    schedule = {} if eval_plan is None else {"eval_strategy": "steps", "eval_steps": SAVE_STEPS}
    vocab = max(int(data.dataset.source.arrays(r)[0].max()) for r in range(len(data.dataset))) + 1
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=vocab, max_position_embeddings=512, attn_implementation="sdpa", use_cache=False))
    if base == "SFTTrainer":
        import datasets
        import trl

        base_class = trl.SFTTrainer
        args = trl.SFTConfig(dataset_kwargs={"skip_prepare_dataset": True}, bf16=False, gradient_checkpointing=False,
                             **_arguments(output_dir), **schedule)
        # SFTTrainer accepts only a datasets.Dataset; the plan replaces it, so a one-row stand-in suffices
        extra = {"train_dataset": datasets.Dataset.from_dict({"input_ids": [[0]]}),
                 "processing_class": transformers.AutoTokenizer.from_pretrained(os.path.join(store, "..", "model"))}
    else:
        base_class = transformers.Trainer
        args = transformers.TrainingArguments(**_arguments(output_dir), dataloader_num_workers=workers, **schedule)
        extra = {}

    class Recording(plan_trainer_class(base_class)):
        def training_step(self, model, inputs, num_items_in_batch=None):
            taken = digest(inputs)  # before the step, which may add keys (SFTTrainer: use_cache)
            loss = super().training_step(model, inputs, num_items_in_batch)
            # the epoch the step starts from: a resumed run's must be the uninterrupted run's
            line = {"step": self.state.global_step + 1, "loss": float(loss).hex(), "inputs": taken,
                    "epoch": self.state.epoch}
            handle.write(json.dumps(line) + "\n")
            handle.flush()
            return loss

    class Stop(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if kill_at is not None and state.global_step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            if stop_at is not None and state.global_step == stop_at:
                control.should_training_stop = True

    steps = None if tape is None else _open_tape(tape)
    if steps is not None:
        extra["plan_tape"] = steps
    with open(record, "a", encoding="utf-8") as handle:
        trainer = Recording(model=model, args=args, plan_data=data, callbacks=[Stop()], **extra, **evaluation)
        if tamper_at is not None:
            trainer.plan_steps.tape = Tampered(trainer.plan_steps.tape, tamper_at)
        if trainer_skips:
            trainer.args.ignore_data_skip = False
        if trainer_epoch:
            trainer.callback_handler.callbacks = [callback for callback in trainer.callback_handler.callbacks
                                                  if type(callback).__name__ != "EpochCallback"]
        try:
            trainer.train(resume_from_checkpoint=resume)
        finally:
            if steps is not None:
                steps.close()
    # a resumed run's history holds the evaluations before its checkpoint too
    evaluated = [[line["step"], float(line["eval_loss"]).hex()] for line in trainer.state.log_history
                 if "eval_loss" in line]
    counted = [line["num_tokens"] for line in trainer.state.log_history if "num_tokens" in line]  # TRL's count
    return {"global_step": trainer.state.global_step, "cursor": list(data.cursor()), "epoch": trainer.state.epoch,
            "evaluated": evaluated, "num_tokens": counted[-1] if counted else None}


def _open_tape(path: str):
    """The checkpoint store at ``path``, its run started if it is new."""
    from test_checkpoint_support import DATASET, KEY, identity

    from umlos_cuda.checkpoint import CheckpointStore

    store = CheckpointStore.open(path, identity(), KEY)
    if store.tape.event_count == 0:
        store.start_run(DATASET, world_size=1, task_type="training")
    return store


class Tampered:
    """A tape whose ``plan.step`` record of step ``t`` gets another digest (a record that lies about its rows)."""

    def __init__(self, tape, t: int) -> None:
        self.tape, self.t = tape, t

    def append(self, record: dict) -> bytes:
        if record.get("t") == self.t:
            record = {**record, "digest": bytes(b ^ 1 for b in record["digest"])}
        return self.tape.append(record)


def _arguments(output_dir: str) -> dict:
    return {"output_dir": output_dir, "max_steps": MAX_STEPS, "per_device_train_batch_size": 1,
            "gradient_accumulation_steps": ACCUMULATION, "learning_rate": 3e-3, "save_steps": SAVE_STEPS,
            "logging_steps": 1, "report_to": "none", "use_cpu": True, "seed": 0, "disable_tqdm": True}


def records(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


if __name__ == "__main__":
    kwargs = json.loads(sys.argv[1])
    print(json.dumps(train(**kwargs)))
