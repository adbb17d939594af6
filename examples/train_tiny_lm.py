"""Train a tiny Llama on packed plan batches, checkpoint it, kill it, resume it: the same losses, bit for bit.

Run (CPU, about 10 s for 300 steps):

    python examples/train_tiny_lm.py --out runs/tiny
    python examples/train_tiny_lm.py --out runs/killed --kill-at-step 130    # dies with SIGKILL
    python examples/train_tiny_lm.py --out runs/killed --resume              # from its last checkpoint

Without ``--store`` and ``--plan`` the script makes its own data in
``OUT/data`` (a synthetic text, a byte-level BPE tokenizer trained on it
in-process, nothing downloaded), tokenizes it into the token store
``OUT/store`` (``tokenize_dataset``, what ``umlos-cuda data tokenize`` runs)
and builds the packed plan ``OUT/plan``. Then it trains a randomly initialised
2-layer ``LlamaForCausalLM`` (hidden 64, float32, one thread, deterministic
algorithms) on the plan's microbatches, read through ``TokenDataset``,
``PackedBatchSampler(PlanBatchSampler(plan))`` and ``PlanCollator(plan,
preset="hf")``: int64 ``input_ids``, unshifted ``labels``, the 4-D
block-diagonal mask of each packed row and its ``position_ids``.

Every ``--checkpoint-every`` steps it commits a checkpoint to the checkpoint
store ``OUT/checkpoints`` (docs/checkpoint-format.md): the model's tensors,
AdamW's state, torch's RNG state, the run's configuration, and the plan
cursor as the cursor kind ``plan`` (``PlanCursor``), all in one signed,
atomic commit. ``--resume`` restores the latest one and continues; the plan
cursor puts the sampler at the first microbatch not trained on. A run stopped
before its first checkpoint starts again from step 0, saying so; ``--resume``
where no run was started (no ``OUT/checkpoints``: a wrong ``--out``) is
refused (INVALID_ARGUMENT), not taken for a new run.

What it writes into ``OUT`` (a folder with the marker ``tiny LM run``):

* ``loss.jsonl``, the loss trace: one line a step, ``step``, ``loss`` (the
  float32 loss as ``float.hex``, exact), ``loss_repr``, the plan position
  ``epoch`` and ``microbatch``, and ``batch_sha256``, a fingerprint of the
  tensors the model was given (every key's name, dtype, shape and bytes).
  It is replaced atomically before every checkpoint and at the end, so it
  never holds less than the latest checkpoint; a resume keeps its lines up
  to the restored step and recomputes the rest.
* ``timing.json``: where the time of a step goes (reading and collating the
  batch against forward, backward and optimizer step), what a checkpoint
  costs, and what the plan cursor costs in it (capture, bytes, restore).

``--kill-at-step N`` sends the process SIGKILL right after the optimizer step
of step ``N`` and before that step's trace line is published or its
checkpoint (if one is due) committed: the worst moment, since everything
since the last checkpoint is lost, a due checkpoint included, and all of it
must be recomputed identically.

The signing key of the checkpoint store is a fixed, published example key
(``EXAMPLE_KEY_SEED``): fine for an example, never for real checkpoints.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import signal
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader

from umlos_cuda import errors
from umlos_cuda.batching import (BatchingConfig, BatchPlanBuilder, PackingConfig, TokenStore, load_plan, save_plan,
                                 tokenize_dataset)
from umlos_cuda.batching.plans.checkpoint_kinds import PlanCursor
from umlos_cuda.batching.plans.planner import plan_manifest
from umlos_cuda.checkpoint import CheckpointState, CheckpointStore, RunIdentity
from umlos_cuda.errors import UmlosError
from umlos_cuda.files.reader import read_bytes
from umlos_cuda.files.writer import ArtifactKind, atomic_output, open_in_place
from umlos_cuda.hashing import sha256
from umlos_cuda.torch import PackedBatchSampler, PlanBatchSampler, PlanCollator, TokenDataset

#: The run folder's artifact kind: ``--out`` is reopened only when it is one (or empty).
RUN = ArtifactKind("tiny LM run")
#: The checkpoint store's signing key seed: public on purpose, never use it for real checkpoints.
EXAMPLE_KEY_SEED = sha256(b"umlos-cuda train_tiny_lm example key: public, never use for real checkpoints")
TENANT, RUN_ID = "examples", "train-tiny-lm"
WORDS = {
    "det": ["the", "a", "every", "no", "some"],
    "adj": ["quick", "lazy", "red", "small", "old", "bright", "quiet", "heavy"],
    "noun": ["fox", "dog", "cat", "bird", "robot", "model", "plan", "kernel", "token", "store"],
    "verb": ["sees", "packs", "trains", "finds", "reads", "writes", "likes", "checks"],
}


def fail(message: str) -> UmlosError:
    return UmlosError(errors.INVALID_ARGUMENT, message, operator="examples.train_tiny_lm")


# ------------------------------------------------------------------ data
def synthetic_texts(n: int, seed: int) -> list[str]:
    """Sentences of a tiny grammar (determiner, adjectives, noun, verb, ...): enough structure to learn."""
    rng = random.Random(seed)

    def phrase() -> str:
        return " ".join([rng.choice(WORDS["det"])] + [rng.choice(WORDS["adj"]) for _ in range(rng.randint(0, 2))]
                        + [rng.choice(WORDS["noun"])])

    return [" ".join(f"{phrase()} {rng.choice(WORDS['verb'])} {phrase()} ." for _ in range(rng.randint(1, 6)))
            for _ in range(n)]


def make_data(folder: str, records: int, seed: int) -> tuple[str, str]:
    """``folder/train.jsonl`` and ``folder/tokenizer`` (byte-level BPE trained here); returns their paths."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = synthetic_texts(records, seed)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    model = os.path.join(folder, "tokenizer")
    os.makedirs(model, exist_ok=True)
    dataset = os.path.join(folder, "train.jsonl")
    # force: a run killed while it made its data remakes the same bytes (these are regular files only)
    for path, data in ((os.path.join(model, "tokenizer.json"), tokenizer.to_str()),
                       (os.path.join(model, "tokenizer_config.json"), json.dumps({"eos_token": "</s>"})),
                       (dataset, "".join(json.dumps({"id": f"s{i:05d}", "text": text}) + "\n"
                                         for i, text in enumerate(texts)))):
        with atomic_output(path, force=True) as handle:
            handle.write(data.encode())
    return dataset, model


def prepare(args: argparse.Namespace) -> tuple[str, str]:
    """The token store and the packed plan: given, already in ``OUT`` (a resume), or made now."""
    store = args.store or os.path.join(args.out, "store")
    plan = args.plan or os.path.join(args.out, "plan")
    if args.store is None and not os.path.isdir(store):
        data = os.path.join(args.out, "data")
        os.makedirs(data, exist_ok=True)
        tokenize_dataset(*make_data(data, args.records, args.seed), store)
    if args.plan is None and not os.path.isdir(plan):
        config = BatchingConfig.predictable(args.row_length * args.rows, (), args.row_length, seed=args.seed,
                                            pack=PackingConfig(args.row_length, "first_fit"))
        save_plan(BatchPlanBuilder(TokenStore.open(store).length_cache(), config).build(args.epochs), plan)
    return store, plan


# ------------------------------------------------------------------ model and state
def make_model(vocab_size: int, max_len: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=max_len,
                         use_cache=False, attn_implementation="sdpa", torch_dtype="float32")
    return LlamaForCausalLM(config)


def learning_rate(step: int, args: argparse.Namespace) -> float:
    """Linear warm-up, then cosine decay to a tenth: a pure function of the step, so nothing to checkpoint."""
    warmup = max(1, args.steps // 10)
    if step <= warmup:
        return args.lr * step / warmup
    progress = (step - warmup) / max(1, args.steps - warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def optimizer_arrays(optimizer: torch.optim.Optimizer) -> dict[str, np.ndarray]:
    """AdamW's per-parameter state as ``{"<param>.<field>": array}`` (a 0-d ``step`` as shape [1])."""
    out = {}
    for index, fields in optimizer.state_dict()["state"].items():
        for name, value in fields.items():
            out[f"{index}.{name}"] = value.detach().numpy().reshape(-1 if value.dim() == 0 else value.shape).copy()
    return out


def load_optimizer(optimizer: torch.optim.Optimizer, arrays: dict[str, np.ndarray]) -> None:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in arrays.items():
        index, name = key.split(".", 1)
        tensor = torch.from_numpy(np.array(value))
        state.setdefault(int(index), {})[name] = tensor.reshape(()) if name == "step" else tensor
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})


def batch_sha256(batch: dict) -> str:
    """SHA-256 over every tensor the model is given: name, dtype, shape, bytes, keys in sorted order."""
    digest = hashlib.sha256(b"train_tiny_lm batch v1\0")
    for name in sorted(batch):
        array = batch[name].numpy()
        digest.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        digest.update(np.ascontiguousarray(array).data)
    return digest.hexdigest()


def run_config(args: argparse.Namespace, plan, store: TokenStore) -> dict:
    """What a resume must share with the run it continues (checked on --resume)."""
    return {"plan_fingerprint": plan.fingerprint, "store_tokens_sha256": store.meta["tokens_sha256"],
            "steps": args.steps, "lr": args.lr, "seed": args.seed, "threads": 1, "model": "llama-2x64"}


# ------------------------------------------------------------------ the trace
def read_trace(out: str, upto: int) -> list[dict]:
    """The trace lines of steps ``1..upto`` of an earlier run (those after it are recomputed)."""
    path = os.path.join(out, "loss.jsonl")
    if upto == 0:
        return []
    try:
        data = read_bytes(path, fail, max_bytes=1 << 28, what="loss trace")
    except FileNotFoundError:
        raise fail(f"{path} is missing: the checkpoint store is at step {upto}, and its trace is gone") from None
    lines = [json.loads(line) for line in data.decode().splitlines()]
    kept = [line for line in lines if line["step"] <= upto]
    if [line["step"] for line in kept] != list(range(1, upto + 1)):
        raise fail(f"{path} lacks steps of 1..{upto}; it is not the trace of this checkpoint store")
    return kept


def publish_trace(run_folder, trace: list[dict]) -> None:
    run_folder.replace_file("loss.jsonl", "".join(json.dumps(line) + "\n" for line in trace).encode())
    run_folder.sync()


# ------------------------------------------------------------------ training
def train(args: argparse.Namespace) -> dict:
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    checkpoints = os.path.join(args.out, "checkpoints")
    if args.resume and not os.path.isdir(checkpoints):  # before anything is made there: a wrong --out, say
        raise fail(f"--resume: {args.out} holds no run to resume (no checkpoint store {checkpoints}): drop --resume "
                   "to start a run there, or give the --out of the run to continue")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    run_folder = open_in_place(args.out, RUN, foreign=lambda path, found: fail(
        f"{path} holds a {found or 'folder of something else'}, not a tiny LM run: choose another --out"))
    try:
        return _train(args, run_folder)
    finally:
        run_folder.close()


def _train(args: argparse.Namespace, run_folder) -> dict:
    checkpoints = os.path.join(args.out, "checkpoints")
    if os.path.exists(checkpoints) and not args.resume:
        raise fail(f"{args.out} holds a run already: pass --resume to continue it, or choose another --out")
    store_path, plan_path = prepare(args)
    plan, store = load_plan(plan_path), TokenStore.open(store_path)
    config = run_config(args, plan, store)
    sampler = PlanBatchSampler(plan, rank=0, world_size=1)
    loader = DataLoader(TokenDataset(store_path, plan=plan), batch_sampler=PackedBatchSampler(sampler),
                        collate_fn=PlanCollator(plan, preset="hf"), num_workers=0)
    identity = RunIdentity(TENANT, RUN_ID, plan_manifest(plan.config, plan.meta.num_samples))
    timing: dict = {"data_s": [], "model_s": [], "commit_s": [], "cursor_capture_s": [], "cursor_restore_s": None}

    with CheckpointStore.open(checkpoints, identity, EXAMPLE_KEY_SEED, keep_last=2) as ckpt:
        restored = ckpt.restore_latest() if args.resume else None
        if restored is not None and json.loads(restored.user_state["run_config"]) != config:
            raise fail(f"--resume: the checkpoint was written by another configuration: "
                       f"{json.loads(restored.user_state['run_config'])} != {config}")
        # The model after the checks (transformers imports in seconds); nothing draws from torch's RNG before it.
        longest = max(int(plan.epochs[e].max_len.max()) for e in range(plan.num_epochs))  # packed: the row length
        vocab = store.vocab_size or int(store.tokens.max()) + 1  # a store written before vocab_size was recorded
        model = make_model(int(vocab), longest)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
        step = 0
        if restored is not None:
            model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in restored.tensors[0][0].items()})
            load_optimizer(optimizer, restored.optimizer[0])
            rng_state = np.frombuffer(restored.user_state["torch_rng"], dtype=np.uint8).copy()
            torch.set_rng_state(torch.from_numpy(rng_state))
            began = time.perf_counter()
            restored.extra_cursors["plan"].restore_into(sampler)
            timing["cursor_restore_s"] = time.perf_counter() - began
            step = restored.t
        else:
            ckpt.start_run("train", world_size=1)
        trace = read_trace(args.out, step) if args.resume else []
        resumed_from = step
        if args.resume and restored is None:  # the run stopped before its first checkpoint: nothing to restore
            print(f"--resume: {checkpoints} holds no committed checkpoint yet (the first is due at step "
                  f"{args.checkpoint_every}): starting again from step 0", flush=True)
        print(f"{'resumed at' if restored is not None else 'starting at'} step {step}, plan cursor "
              f"({sampler.epoch}, {sampler.microbatch_index}), {plan.num_epochs} epochs of "
              f"{[len(plan.epochs[e]) for e in range(plan.num_epochs)]} microbatches", flush=True)

        model.train()
        done = step >= args.steps
        for epoch in range(sampler.epoch, plan.num_epochs):
            if done:
                break
            sampler.set_epoch(epoch)
            batches = iter(loader)
            while step < args.steps:
                began = time.perf_counter()
                batch = next(batches, None)
                if batch is None:
                    break
                position = dict(sampler.last_microbatch)
                read = time.perf_counter()
                for group in optimizer.param_groups:
                    group["lr"] = learning_rate(step + 1, args)
                optimizer.zero_grad(set_to_none=True)
                loss = model(**batch).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                timing["data_s"].append(read - began)
                timing["model_s"].append(time.perf_counter() - read)
                step += 1
                value = float(loss.detach())
                trace.append({"step": step, "loss": value.hex(), "loss_repr": repr(value), "epoch": position["epoch"],
                              "microbatch": position["index"], "batch_sha256": batch_sha256(batch)})
                if step == args.kill_at_step:
                    print(f"step {step}: SIGKILL (after the optimizer step, before any checkpoint of it)", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
                if step % args.log_every == 0:
                    print(f"step {step:>4}  loss {value:.4f}  microbatch ({position['epoch']}, {position['index']})",
                          flush=True)
                if step % args.checkpoint_every == 0 or step == args.steps:
                    commit(ckpt, step, model, optimizer, sampler, config, trace, run_folder, timing)
            done = step >= args.steps
        if step % args.checkpoint_every and step != args.steps:  # the plan ended before --steps
            commit(ckpt, step, model, optimizer, sampler, config, trace, run_folder, timing)
    summary = summarize(timing, checkpoints, step, resumed_from)
    run_folder.replace_file("timing.json", (json.dumps(summary, indent=1) + "\n").encode())
    run_folder.sync()
    print(f"done at step {step}: loss {float.fromhex(trace[-1]['loss']):.4f}; data path "
          f"{summary['data_ms_median']:.3f} ms, model step {summary['model_ms_median']:.2f} ms (medians); "
          f"checkpoint {summary['commit_ms_median']:.1f} ms, plan cursor {summary['cursor_bytes']} bytes", flush=True)
    return summary


def commit(ckpt, step, model, optimizer, sampler, config, trace, run_folder, timing) -> None:
    """Publish the trace, then commit the checkpoint: the trace never holds less than the latest checkpoint."""
    publish_trace(run_folder, trace)
    began = time.perf_counter()
    cursor = PlanCursor.of(sampler)
    captured = time.perf_counter()
    state = CheckpointState(
        step, {},
        tensors={0: [{name: value.detach().numpy().copy() for name, value in model.state_dict().items()}]},
        optimizer={0: optimizer_arrays(optimizer)},
        user_state={"torch_rng": torch.get_rng_state().numpy().tobytes(), "run_config": json.dumps(config).encode()},
        extra_cursors={"plan": cursor})
    ckpt.commit(state)
    timing["cursor_capture_s"].append(captured - began)
    timing["commit_s"].append(time.perf_counter() - began)


def summarize(timing: dict, checkpoints: str, step: int, resumed_from: int) -> dict:
    def median_ms(values: list[float]) -> float:
        return float(np.median(values) * 1e3) if values else 0.0

    cursor_bytes = None
    latest = sorted(os.listdir(os.path.join(checkpoints, "checkpoints")))
    for name in reversed(latest):
        path = os.path.join(checkpoints, "checkpoints", name, "data", "cursors=plan.cbor")
        if os.path.exists(path):
            cursor_bytes = os.path.getsize(path)
            break
    steps = len(timing["model_s"])
    return {
        "steps_run": steps, "last_step": step, "resumed_from": resumed_from,
        "data_ms_median": median_ms(timing["data_s"]), "model_ms_median": median_ms(timing["model_s"]),
        "data_ms_mean": float(np.mean(timing["data_s"]) * 1e3) if steps else 0.0,
        "model_ms_mean": float(np.mean(timing["model_s"]) * 1e3) if steps else 0.0,
        "commits": len(timing["commit_s"]), "commit_ms_median": median_ms(timing["commit_s"]),
        "cursor_capture_us_median": median_ms(timing["cursor_capture_s"]) * 1e3,
        "cursor_restore_us": None if timing["cursor_restore_s"] is None else timing["cursor_restore_s"] * 1e6,
        "cursor_bytes": cursor_bytes,
        "threads": torch.get_num_threads(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/tiny-lm", help="the run folder (default runs/tiny-lm)")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    parser.add_argument("--checkpoint-every", type=int, default=50, help="commit a checkpoint every K steps (50)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    parser.add_argument("--kill-at-step", type=int, default=None,
                        help="SIGKILL this process after the optimizer step of step N (a crash, for the proof)")
    parser.add_argument("--store", help="a token store to train on (default: make one in OUT/store)")
    parser.add_argument("--plan", help="a packed plan over the store (default: build one in OUT/plan)")
    parser.add_argument("--records", type=int, default=2000, help="synthetic records when making data (2000)")
    parser.add_argument("--row-length", type=int, default=128, help="packed row length when building the plan (128)")
    parser.add_argument("--rows", type=int, default=4, help="packed rows per microbatch when building the plan (4)")
    parser.add_argument("--epochs", type=int, default=4, help="plan epochs when building the plan (4)")
    parser.add_argument("--seed", type=int, default=0, help="data, plan and model seed (0)")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (3e-3)")
    parser.add_argument("--log-every", type=int, default=50, help="print the loss every N steps (50)")
    return run_checked(parser, argv, train, ("steps", "checkpoint_every", "records", "row_length", "rows", "epochs",
                                             "log_every", "kill_at_step"))


def run_checked(parser: argparse.ArgumentParser, argv: list[str] | None, train, positive: tuple[str, ...]) -> int:
    """Parse ``argv`` (the options named in ``positive`` must be at least 1 where given) and ``train`` on it: 0, or
    2 with the error's code and message on stderr (an example's ``main``)."""
    args = parser.parse_args(argv)
    for name in positive:
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    try:
        train(args)
    except UmlosError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
