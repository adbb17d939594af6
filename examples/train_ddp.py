"""Train a tiny causal LM under torchrun with DDP, the plan sampler and the checkpoint store.

Run (CPU, gloo; 2 ranks, each step takes 2 global microbatches, one per rank):

    torchrun --standalone --nproc-per-node 2 examples/train_ddp.py --workdir runs/ddp
    torchrun --standalone --nproc-per-node 2 examples/train_ddp.py --workdir runs/ddp-k --kill-at-step 23
    torchrun --standalone --nproc-per-node 2 examples/train_ddp.py --workdir runs/ddp-k --resume
    torchrun --standalone --nproc-per-node 1 examples/train_ddp.py --workdir runs/ddp-k --resume  # or on 1 rank

What it does (docs/training.md, "torchrun"):

* data: rank 0 writes a small token store (a byte-level BPE tokenizer
  trained on synthetic text, ``tokenize_dataset``) and a batch plan over it
  (``BatchPlanBuilder``, token budget 256, 2 epochs) into ``--workdir``
  unless they are there; ``--store`` reads an existing token store instead.
* model: a randomly initialised ``transformers`` Llama (2 layers, hidden
  size 32, seeded), wrapped in ``DistributedDataParallel``; AdamW.
* batches: :class:`~umlos_cuda.torch.PlanBatchSampler` gives rank ``r`` the
  plan's global microbatches ``i`` with ``i % W == r``;
  :class:`~umlos_cuda.torch.PlanCollator` collates them with the
  ``shifted`` preset (int64, labels already shifted, -100 where no loss is
  taken), so the loss is a plain ``cross_entropy``. A step consumes
  ``--microbatches-per-step`` (G) consecutive global microbatches whatever
  the world size W: each rank accumulates ``G / W`` of them (``no_sync``
  until the last), and every microbatch's loss is scaled so that the
  update is the gradient of the mean of the step's microbatch losses at
  any W. A rank with no microbatch in an epoch's short last step runs a
  zero-weighted forward so that DDP's all-reduce still matches.
* checkpoints: every ``--checkpoint-every`` steps rank 0 commits the model,
  the optimizer state and the plan cursor (the ``plan`` cursor kind, the
  global microbatch the next step starts at) to the engine's checkpoint
  store ``WORKDIR/checkpoints`` (docs/checkpoint-format.md §9). The DDP
  replicas are identical, so one copy (rank 0's) is the whole state, and a
  resume at any world size reads it.
* trace: rank 0 appends one JSON line per step to ``WORKDIR/trace.jsonl``:
  ``step``, ``epoch``, ``loss`` (``repr`` of the mean of the step's
  microbatch losses, summed in global index order), ``microbatches`` (the
  global indices consumed), ``losses`` (each one's loss, ``repr``) and
  ``digests`` (each one's batch digest, ``microbatch_digest`` of its
  ``input_ids`` and ``loss_mask``, the bytes batch fingerprints hash). It
  also appends a ``plan.step`` record per step to the checkpoint store's tape
  (``StepRecorder``, the helper the Trainer's ``plan_tape`` uses too: the
  plan, the epoch, the step's first global microbatch, their count and a
  digest of each one's dataset rows, the collator's ``rows``), committed with the next checkpoint, so that
  ``umlos-cuda plan explain WORKDIR/plan --check-tape WORKDIR/checkpoints``
  checks afterwards that the run trained every microbatch of its plan once,
  each the plan's rows, across the kill and the resume (docs/batching.md,
  "Explaining a step").
* ``--kill-at-step N``: in step N, after the backward pass and before the
  optimizer step and the trace line, rank 0 sends SIGKILL to every other
  rank, to the torchrun agent and to itself: the whole job dies at once,
  as on a lost node. ``--resume`` restores the latest checkpoint, cuts the
  trace back to its step and goes on from the cursor.

The program ends through :func:`~umlos_cuda.torch.run_distributed` (a DDP
job on gloo otherwise aborts at exit now and then; docs/integrations.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader

import umlos_cuda as uc
from umlos_cuda.batching import BatchingConfig, BatchPlanBuilder, TokenStore, load_plan, save_plan, tokenize_dataset
from umlos_cuda.batching.batches.fingerprint import microbatch_digest
from umlos_cuda.batching.plans.explain import StepRecorder
from umlos_cuda.batching.plans.checkpoint_kinds import PlanCursor  # importing it registers the "plan" cursor kind
from umlos_cuda.checkpoint import CheckpointState, CheckpointStore, RunIdentity
from umlos_cuda.torch import PlanBatchSampler, PlanCollator, TokenDataset, run_distributed

#: The example's signing key for its checkpoint store: a fixed demonstration key, not a secret.
STORE_KEY = bytes(range(32))
WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "gravity", "explains",
         "why", "python", "is", "what", "it", "is")


# -- data: a token store and a plan over it (rank 0 writes them once) ------------------------------


def write_token_store(workdir: str, samples: int) -> str:
    """A byte-level BPE tokenizer trained on synthetic text, and the token store of that text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(1)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40))) for _ in range(samples)]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    os.makedirs(os.path.join(workdir, "tokenizer"), exist_ok=True)
    tokenizer.save(os.path.join(workdir, "tokenizer", "tokenizer.json"))
    dataset = os.path.join(workdir, "train.jsonl")
    with open(dataset, "w", encoding="utf-8") as handle:
        for i, text in enumerate(texts):
            handle.write(json.dumps({"id": f"doc-{i:04d}", "text": text}) + "\n")
    store = os.path.join(workdir, "store")
    tokenize_dataset(dataset, os.path.join(workdir, "tokenizer"), store, text_field="text")
    return store


def prepare_data(args: argparse.Namespace) -> tuple[str, str]:
    """``(token store, plan folder)``, written by rank 0 when absent; the other ranks wait."""
    store = args.store or os.path.join(args.workdir, "store")
    plan_dir = os.path.join(args.workdir, "plan")
    if dist.get_rank() == 0:
        os.makedirs(args.workdir, exist_ok=True)
        if not os.path.exists(store):
            write_token_store(args.workdir, args.samples)
        if not os.path.exists(plan_dir):
            config = BatchingConfig.predictable(token_budget=args.token_budget, bucket_edges=(16, 32, 64),
                                                overflow_max=128, seed=args.seed)
            save_plan(BatchPlanBuilder(TokenStore.open(store).length_cache(), config).build(args.epochs), plan_dir)
    dist.barrier()
    return store, plan_dir


# -- the checkpoint store ---------------------------------------------------------------------------


def run_identity(store: TokenStore, args: argparse.Namespace) -> RunIdentity:
    """Whose run the checkpoints belong to: the manifest names the token store as the dataset."""
    manifest = uc.Manifest.from_dict({
        "seed": args.seed,
        "global_batch_size": args.microbatches_per_step,
        "datasets": {"train": {"id": "train-ddp-example", "version": "1",
                               "hash": f"sha256:{store.meta['tokens_sha256']}", "cardinality": len(store)}},
    })
    return RunIdentity("examples", "train-ddp", manifest)


def model_arrays(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {name: value.detach().numpy().copy() for name, value in model.state_dict().items()}


def optimizer_arrays(optimizer: torch.optim.Optimizer) -> dict[str, np.ndarray]:
    """AdamW's per-parameter state as ``state.<param>.<key>`` arrays (its hyperparameters are the program's)."""
    return {f"state.{index}.{key}": value.detach().numpy().copy()
            for index, state in optimizer.state_dict()["state"].items() for key, value in state.items()}


def load_optimizer(optimizer: torch.optim.Optimizer, arrays: dict[str, np.ndarray]) -> None:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in arrays.items():
        _, index, key = name.split(".", 2)
        state.setdefault(int(index), {})[key] = torch.from_numpy(value.copy())
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})


def cursor_after(plan, epoch: int, start: int, g: int) -> tuple[int, int]:
    """The plan cursor once the step that began at ``(epoch, start)`` is done."""
    length = plan.epoch_microbatches(epoch)
    if start + g < length:
        return epoch, start + g
    if epoch + 1 < plan.num_epochs:
        return epoch + 1, 0
    return epoch, length


# -- the trace ----------------------------------------------------------------------------------------


def cut_trace(path: str, last_step: int) -> None:
    """Keep the trace lines of steps up to ``last_step`` (those a resume from that checkpoint does not redo)."""
    kept = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            kept = [line for line in handle if line.strip() and json.loads(line)["step"] <= last_step]
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        handle.writelines(kept)
    os.replace(path + ".tmp", path)


def kill_job(pids: list[int]) -> None:
    """SIGKILL every rank and the torchrun agent: the job ends as on a lost node, with nothing flushed or saved."""
    me = os.getpid()
    for pid in pids:
        if pid != me:
            os.kill(pid, signal.SIGKILL)
    if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun: its agent is our parent
        os.kill(os.getppid(), signal.SIGKILL)
    os.kill(me, signal.SIGKILL)


# -- training -----------------------------------------------------------------------------------------


def build_model(vocab_size: int, seed: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def train(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)  # one thread per rank: the same float reductions in every run
    rank, world = dist.get_rank(), dist.get_world_size()
    g = args.microbatches_per_step
    if g % world:
        raise SystemExit(f"--microbatches-per-step {g} must be a multiple of the world size {world}")
    store_dir, plan_dir = prepare_data(args)
    store, plan = TokenStore.open(store_dir), load_plan(plan_dir)
    sampler = PlanBatchSampler(plan)  # rank and world size from the process group
    loader = DataLoader(TokenDataset(store_dir, plan=plan), batch_sampler=sampler,
                        collate_fn=PlanCollator(plan, preset="shifted", dtype="int64"))
    model = build_model(int(store.meta["vocab_size"]), args.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    checkpoints = trace_path = None
    if rank == 0:
        trace_path = os.path.join(args.workdir, "trace.jsonl")
        store_path = os.path.join(args.workdir, "checkpoints")
        if os.path.exists(store_path) and not args.resume:
            raise SystemExit(f"{store_path} exists: pass --resume, or give a new --workdir")
        checkpoints = CheckpointStore.open(store_path, run_identity(store, args), STORE_KEY, keep_last=2)

    # Restore: rank 0 reads the checkpoint and hands it to every rank (any world size).
    restored = None
    if args.resume and rank == 0:
        latest = checkpoints.restore_latest()
        if latest is not None:
            restored = {"t": latest.t, "model": latest.tensors[0][0], "optimizer": latest.optimizer[0],
                        "cursor": latest.extra_cursors["plan"].to_state()}
    box = [restored]
    dist.broadcast_object_list(box, src=0)
    restored = box[0]
    t = 0
    if restored is not None:
        t = restored["t"]
        model.load_state_dict({name: torch.from_numpy(value.copy()) for name, value in restored["model"].items()})
        load_optimizer(optimizer, restored["optimizer"])
        PlanCursor.from_state(restored["cursor"]).restore_into(sampler)  # refuses another plan
    if rank == 0:
        if restored is not None:
            cut_trace(trace_path, t)
            print(f"resumed at step {t}, plan cursor {restored['cursor']['epoch']}:"
                  f"{restored['cursor']['microbatch_index']}, on {world} rank(s)", flush=True)
        else:
            if checkpoints.tape.event_count == 0:
                checkpoints.start_run("train", world_size=world, task_type="training")
            cut_trace(trace_path, 0)
    model = torch.nn.parallel.DistributedDataParallel(model)
    recorder = StepRecorder(checkpoints.tape, sampler.fingerprint) if rank == 0 else None
    pids = [0] * world
    dist.all_gather_object(pids, os.getpid())

    start_epoch = sampler.epoch
    for epoch in range(start_epoch, plan.num_epochs):
        sampler.set_epoch(epoch)  # keeps a restored mid-epoch cursor
        length = plan.epoch_microbatches(epoch)
        batches = iter(loader)
        for start in range(sampler.microbatch_index, length, g):
            t += 1
            step = range(start, min(start + g, length))  # the global microbatches of this step
            mine = [i for i in step if i % world == rank]
            scale = world / len(step)  # DDP averages over ranks: the update is d(mean of the step's losses)
            records = []
            for k, index in enumerate(mine):
                batch = next(batches)
                assert sampler.last_microbatch["index"] == index, (sampler.last_microbatch, index)
                sync = contextlib.nullcontext() if k == len(mine) - 1 else model.no_sync()
                with sync:
                    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                   position_ids=batch["position_ids"]).logits
                    loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())  # -100: no loss
                    (loss * scale).backward()
                digest = microbatch_digest(batch["input_ids"].numpy(), batch["loss_mask"].numpy())
                records.append((index, loss.item(), digest, batch["rows"].tolist()))
            if not mine:  # no microbatch for this rank in the epoch's short last step: join the all-reduce
                logits = model(input_ids=torch.zeros(1, 1, dtype=torch.int64)).logits
                (logits.sum() * 0.0).backward()
            gathered = [None] * world
            dist.all_gather_object(gathered, records)
            if args.kill_at_step == t and rank == 0:
                kill_job(pids)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if rank == 0:
                done = sorted(r for part in gathered for r in part)
                mean = sum(loss for _, loss, _, _ in done) / len(done)
                with open(trace_path, "a", encoding="utf-8") as trace:  # on disk before the next step
                    trace.write(json.dumps({"step": t, "epoch": epoch, "loss": repr(mean),
                                            "microbatches": [i for i, _, _, _ in done],
                                            "losses": [repr(loss) for _, loss, _, _ in done],
                                            "digests": [d for _, _, d, _ in done]}) + "\n")
                # what the step trained, on the tape: committed with the next checkpoint, checked against the plan
                for i, _, _, rows in done:
                    recorder.add(epoch, i, rows)
                recorder.end_step(t)
                last = epoch == plan.num_epochs - 1 and start + g >= length
                if t % args.checkpoint_every == 0 or last:
                    after = cursor_after(plan, epoch, start, g)
                    checkpoints.commit(CheckpointState(
                        t, {}, tensors={0: [model_arrays(model.module)]}, optimizer={0: optimizer_arrays(optimizer)},
                        extra_cursors={"plan": PlanCursor(sampler.fingerprint, *after)}))
    if rank == 0:
        checkpoints.close()
        print(f"trained {t} steps on {world} rank(s); trace {trace_path}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default="runs/ddp",
                        help="token store, plan, checkpoints/ and trace.jsonl (default runs/ddp, ignored by git)")
    parser.add_argument("--store", default=None, help="an existing token store (default: write one in --workdir)")
    parser.add_argument("--samples", type=int, default=240, help="samples of the written token store (default 240)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs of the plan (default 2)")
    parser.add_argument("--token-budget", type=int, default=256, help="tokens per microbatch after padding")
    parser.add_argument("--microbatches-per-step", type=int, default=2,
                        help="global microbatches per optimizer step, a multiple of the world size (default 2)")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="commit a checkpoint every N steps")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0, help="the plan's and the model's seed")
    parser.add_argument("--kill-at-step", type=int, default=None, help="SIGKILL the whole job in this step")
    parser.add_argument("--resume", action="store_true", help="resume from the latest checkpoint in --workdir")
    args = parser.parse_args()
    run_distributed(lambda: train(args))


if __name__ == "__main__":
    main()
