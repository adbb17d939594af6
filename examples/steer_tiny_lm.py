"""Steer a run: a loss spike at step 150, steps 150-160 left out by a plan edit, a SIGKILL, a resume at another
world size, and the same loss trace as the run that was never interrupted.

Run (CPU, one thread; about 15 s for the whole run):

    python examples/steer_tiny_lm.py --out runs/steer                                   # uninterrupted, 2 ranks
    python examples/steer_tiny_lm.py --out runs/steer-k --kill-at-step 175              # dies with SIGKILL
    python examples/steer_tiny_lm.py --out runs/steer-k --resume --world-size 1         # goes on on 1 rank

What it does (docs/batching.md, "Steering a run: the demonstration"):

* data: two synthetic corpora (examples/train_tiny_lm.py's grammar, and its sentences read backwards), one
  byte-level BPE tokenizer trained in-process, two token stores; a windowed **mixture** of them, 0.7 and 0.3
  until step ``--change-at`` (100), then 0.3 and 0.7 by a mixture schedule, planned by :func:`build_mixture`
  (the one place the mixture is defined; ``OUT/schedule.json`` is the schedule, ``OUT/mixture.json`` says where
  the change took effect).
* training: examples/train_tiny_lm.py's 2-layer Llama, AdamW, ``--microbatches-per-step`` (G) global microbatches
  a step. ``--world-size W`` ranks are emulated in one process: rank ``r`` reads its microbatches through its own
  ``PlanBatchSampler(plan, rank=r, world_size=W)``, ``G / W`` of them a step, as under torchrun; the step's
  microbatches are then run in global index order and their gradients accumulated, each loss divided by their
  count, so that the arithmetic is the same at every W. An equal loss trace at another W therefore says that the
  samplers dealt the same microbatches to every step, across the edit, the kill and the resume. (Real DDP sums
  the ranks' gradients in its all-reduce's order instead: examples/train_ddp.py and tests/test_train_ddp.py show
  that resume under torchrun and bound the difference.)
* the spike: at step ``--spike-at`` (150) a synthetic monitor reports a loss spike (no real spike is needed to
  show the steering: the step is only named). The run then derives the edited plan from its parent at that step,
  ``skip_steps(parent, 150, 161, world_size=G)``, what ``umlos-cuda plan edit OUT/plan --skip-steps 150:161
  --world-size 2 --output OUT/plan-edited`` writes (a step of a plan of microbatches is one microbatch a rank, so
  the run's steps of G microbatches are ``plan explain``'s steps at world size G, at any number of ranks): the
  microbatches of steps 150 to 160 left out, every other one kept in order, so the run stands at the same cursor
  in the edited plan and goes on from there. A checkpoint is committed at once, naming the edited plan.
* checkpoints: every ``--checkpoint-every`` steps, examples/train_tiny_lm.py's checkpoint store layout (the model,
  AdamW's state, the plan cursor as the cursor kind ``plan``, and which plan the cursor is in).
* ``loss.jsonl``: one line a step (counted from 0, as ``plan explain`` counts them): ``step``, ``plan``
  (``parent`` or ``edited``), ``loss`` (``float.hex``: equal means bit-identical), ``microbatches`` (the global
  indices trained), published atomically before every checkpoint.
* ``--kill-at-step N``: SIGKILL right after step N's optimizer step, before its trace line or checkpoint.
  ``--resume`` restores the latest checkpoint (its plan, parent or edited, and its cursor) at any ``--world-size``
  that divides G.

``umlos-cuda plan explain OUT/plan-edited --step 150 --world-size 2`` then lists what step 150 trained: the
parent's step 161, its microbatches 322 and 323.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

import numpy as np
import torch
from torch.utils.data import DataLoader

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from train_tiny_lm import (EXAMPLE_KEY_SEED, fail, load_optimizer, make_data, make_model,  # noqa: E402
                           optimizer_arrays, publish_trace, run_checked)

from umlos_cuda.batching import tokenize_dataset  # noqa: E402
from umlos_cuda.batching.plans.checkpoint_kinds import PlanCursor  # noqa: E402
from umlos_cuda.batching.plans.edits import edit_plan, load_edited_plan, save_edited_plan, skip_steps  # noqa: E402
from umlos_cuda.batching.plans.kinds import open_plan  # noqa: E402
from umlos_cuda.batching.plans.planner import plan_manifest  # noqa: E402
from umlos_cuda.checkpoint import CheckpointState, CheckpointStore, RunIdentity  # noqa: E402
from umlos_cuda.files.reader import read_bytes  # noqa: E402
from umlos_cuda.files.writer import ArtifactKind, open_in_place  # noqa: E402
from umlos_cuda.torch import PlanBatchSampler, PlanCollator, TokenDataset  # noqa: E402

#: The run folder's artifact kind.
RUN = ArtifactKind("steered tiny LM run")
#: The mixture: (store folder name, weight); the plan's own flags (a small token budget: a fast demonstration).
MIXTURE = (("forward", 0.7), ("backward", 0.3))
#: The weights from the schedule's change on (``--change-at``, step 100).
CHANGED = (("forward", 0.3), ("backward", 0.7))
PLAN_FLAGS = ("--window", "32", "--bucket-edges", "32,64", "--overflow-max", "128", "--token-budget", "256",
              "--seed", "3", "--quiet")
PLANS = {"parent": "plan", "edited": "plan-edited"}


# ------------------------------------------------------------------ data and the mixture
def make_stores(out: str, records: int) -> list[str]:
    """Two token stores, one tokenizer: the tiny grammar's sentences, and the same sentences read backwards."""
    data = os.path.join(out, "data")
    os.makedirs(data, exist_ok=True)
    forward, tokenizer = make_data(data, records, 0)
    backward = os.path.join(data, "backward.jsonl")
    with open(forward, encoding="utf-8") as handle:
        lines = [json.loads(line) for line in handle]
    with open(backward, "w", encoding="utf-8") as handle:
        for line in lines[: records // 2]:
            handle.write(json.dumps({"id": line["id"], "text": " ".join(reversed(line["text"].split()))}) + "\n")
    stores = []
    for (name, _), dataset in zip(MIXTURE, (forward, backward)):
        stores.append(os.path.join(out, name))
        if not os.path.isdir(stores[-1]):
            tokenize_dataset(dataset, tokenizer, stores[-1])
    return stores


def build_mixture(run_folder, stores: list[str], folder: str, num_samples: int, change_step: int, width: int) -> str:
    """The two-component windowed mixture the run trains on: the one place it is defined.

    Its weights follow a **mixture schedule** (docs/batching.md, "Mixture schedules"): ``MIXTURE`` until
    step ``change_step``, then ``CHANGED``. A schedule counts the mixture's samples and a window keeps the
    weights it starts with, while a step here is ``width`` token-budget microbatches (a varying number of
    samples), so the change is put at the first window that starts at or after the step's first microbatch.
    Windows before it are the same with or without the schedule (each window is planned from its own
    weights), so that window is found on the plan with the first weights alone, then the plan is built with
    the schedule (``OUT/schedule.json``). Each component keeps its own cursor across the change: no document is
    repeated or lost. Returns the folder; ``OUT/mixture.json`` records where the change took effect."""
    from umlos_cuda.batching.plans.windows.index import locate
    from umlos_cuda.cli import main

    def build(output: str, *schedule: str) -> None:
        mix = [f"{store}:{weight}" for store, (_, weight) in zip(stores, MIXTURE)]
        if main(["plan", "build", "--mix", *mix, "--num-samples", str(num_samples), *PLAN_FLAGS, *schedule,
                 "--output", output]) != 0:
            raise fail(f"could not build the mixture plan {output}")

    out = os.path.dirname(folder)
    first_weights = os.path.join(out, "plan-first-weights")
    if not os.path.isdir(first_weights):
        build(first_weights)
    plan = open_plan(first_weights)
    window, local = locate(plan.index, 0, change_step * width)
    window += local > 0  # the first window starting at or after the step's first microbatch
    at = window * plan.definition.window
    first_microbatch = int(plan.index[0, window, 0])
    schedule = {"pieces": [{"at": 0, "weights": {name: weight for name, weight in MIXTURE}},
                           {"at": at, "weights": {name: weight for name, weight in CHANGED}}]}
    record = {"window": window, "first_microbatch": first_microbatch, "first_step": first_microbatch // width}
    run_folder.replace_file("schedule.json", (json.dumps(schedule, indent=1) + "\n").encode())
    run_folder.replace_file("mixture.json", (json.dumps(record) + "\n").encode())
    run_folder.sync()
    schedule_file = os.path.join(out, "schedule.json")
    build(folder, "--mix-schedule", schedule_file)
    print(f"mixture: {dict(MIXTURE)} until sample {at} (window {window}, microbatch {first_microbatch}, step "
          f"{first_microbatch // width}), then {dict(CHANGED)}", flush=True)
    return folder


def edited_plan(out: str, parent: str, spike: int, skip: int, width: int) -> str:
    """``OUT/plan-edited``: the parent less steps ``spike .. spike + skip - 1`` of the run from its start, a step
    being ``width`` consecutive microbatches (``G``): ``plan explain``'s steps at world size ``G``, one microbatch a
    rank a step, which name the same microbatches however many ranks train them. Written once; a run that reaches
    the spike again (a resume from before it, at any world size) finds the same plan."""
    folder = os.path.join(out, PLANS["edited"])
    derived = edit_plan(parent, lambda p: skip_steps(p, spike, spike + skip, world_size=width))
    if os.path.isdir(folder):
        if load_edited_plan(folder).fingerprint != derived.fingerprint:
            raise fail(f"{folder} holds another edit than steps {spike}:{spike + skip} of {parent}")
        return folder
    return save_edited_plan(derived, folder)


def read_steps(out: str, done: int) -> list[dict]:
    """The trace lines of steps ``0 .. done - 1`` of an earlier run (those after it are recomputed)."""
    if done == 0:
        return []
    path = os.path.join(out, "loss.jsonl")
    lines = [json.loads(line) for line in read_bytes(path, fail, max_bytes=1 << 26, what="loss trace").splitlines()]
    kept = [line for line in lines if line["step"] < done]
    if [line["step"] for line in kept] != list(range(done)):
        raise fail(f"{path} lacks steps of 0..{done - 1}; it is not the trace of this checkpoint store")
    return kept


# ------------------------------------------------------------------ the emulated ranks
class Ranks:
    """``world_size`` ranks in one process, each with its own sampler and loader over ``plan``, from a cursor."""

    def __init__(self, plan_folder: str, world_size: int, cursor: tuple[int, int]) -> None:
        self.plan = open_plan(plan_folder)
        dataset = TokenDataset(self.plan.dataset(), plan=self.plan)
        collate = PlanCollator(self.plan, preset="hf")
        self.samplers = [PlanBatchSampler(plan_folder, rank=r, world_size=world_size, epoch=cursor[0],
                                          microbatch_index=cursor[1]) for r in range(world_size)]
        self.batches = [iter(DataLoader(dataset, batch_sampler=s, collate_fn=collate)) for s in self.samplers]

    def step(self, per_rank: int) -> list[tuple[int, dict]]:
        """The step's microbatches, ``(global index, batch)`` in global index order (fewer at the plan's end)."""
        taken = []
        for sampler, batches in zip(self.samplers, self.batches):
            for _ in range(per_rank):
                batch = next(batches, None)
                if batch is not None:
                    taken.append((sampler.last_microbatch["index"], batch))
        return sorted(taken, key=lambda item: item[0])

    def cursor(self) -> tuple[int, int]:
        """The plan cursor after the steps taken: the first global microbatch no rank has taken."""
        ends = [(s.epoch, s.microbatch_index) for s in self.samplers]
        return min(ends)


# ------------------------------------------------------------------ training
def train(args: argparse.Namespace) -> dict:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    g, w = args.microbatches_per_step, args.world_size
    if g % w:
        raise fail(f"--world-size {w} must divide --microbatches-per-step {g}")
    checkpoints = os.path.join(args.out, "checkpoints")
    if args.resume and not os.path.isdir(checkpoints):
        raise fail(f"--resume: {args.out} holds no run to resume (no {checkpoints})")
    if not args.resume and os.path.exists(checkpoints):
        raise fail(f"{args.out} holds a run already: pass --resume, or choose another --out")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    run_folder = open_in_place(args.out, RUN, foreign=lambda path, found: fail(
        f"{path} holds a {found or 'folder of something else'}, not a steered tiny LM run: choose another --out"))
    try:
        return _train(args, run_folder, checkpoints)
    finally:
        run_folder.close()


def _train(args: argparse.Namespace, run_folder, checkpoints: str) -> dict:
    g, w = args.microbatches_per_step, args.world_size
    per_rank = g // w
    parent = os.path.join(args.out, PLANS["parent"])
    if not os.path.isdir(parent):
        build_mixture(run_folder, make_stores(args.out, args.records), parent, args.num_samples, args.change_at, g)
    plan = open_plan(parent)
    identity = RunIdentity("examples", "steer-tiny-lm", plan_manifest(plan.config, len(plan.dataset())))
    with CheckpointStore.open(checkpoints, identity, EXAMPLE_KEY_SEED, keep_last=2) as ckpt:
        restored = ckpt.restore_latest() if args.resume else None
        torch.manual_seed(args.seed)
        model = make_model(int(max(TokenDataset(plan.dataset()).source.arrays(r)[0].max()
                                   for r in range(len(plan.dataset()))) + 1), 256)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
        step, which, cursor = 0, "parent", (0, 0)
        if restored is None:
            ckpt.start_run("train", world_size=w, task_type="training")
        else:
            model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in restored.tensors[0][0].items()})
            load_optimizer(optimizer, restored.optimizer[0])
            step, which = restored.t, restored.user_state["plan"].decode()
            saved = restored.extra_cursors["plan"]
            cursor = (saved.epoch, saved.microbatch_index)
        trace = read_steps(args.out, step)
        folder = os.path.join(args.out, PLANS[which])
        ranks = Ranks(folder, w, cursor)
        if restored is not None and ranks.plan.fingerprint != restored.extra_cursors["plan"].plan_fingerprint:
            raise fail(f"the checkpoint's cursor is in another plan than {folder}")
        print(f"{'resumed at' if restored else 'starting at'} step {step} in {which} plan, cursor {cursor}, "
              f"{w} rank(s) of {per_rank} microbatch(es)", flush=True)

        model.train()
        while step < args.steps:
            if which == "parent" and step == args.spike_at:  # the synthetic monitor: a spike at this step
                cursor = ranks.cursor()
                folder = edited_plan(args.out, parent, args.spike_at, args.skip, g)
                which, ranks = "edited", Ranks(folder, w, cursor)
                print(f"step {step}: loss spike reported; steps {args.spike_at}:{args.spike_at + args.skip} left "
                      f"out ({folder}), going on from cursor {cursor}", flush=True)
                commit(ckpt, step, model, optimizer, ranks, which, trace, run_folder)
            units = ranks.step(per_rank)
            if not units:
                break  # the plan's end
            optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for _, batch in units:  # global index order, whatever the world size
                loss = model(**batch).loss / len(units)
                loss.backward()
                total += float(loss.detach())
            optimizer.step()
            if step == args.kill_at_step:
                print(f"step {step}: SIGKILL", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            trace.append({"step": step, "plan": which, "loss": total.hex(), "microbatches": [i for i, _ in units]})
            step += 1
            if step % args.checkpoint_every == 0 or step == args.steps:
                commit(ckpt, step, model, optimizer, ranks, which, trace, run_folder)
        if step % args.checkpoint_every and step != args.steps:
            commit(ckpt, step, model, optimizer, ranks, which, trace, run_folder)
    print(f"done at step {step}: loss {float.fromhex(trace[-1]['loss']):.4f}", flush=True)
    return {"steps": step, "plan": which}


def commit(ckpt, step: int, model, optimizer, ranks: Ranks, which: str, trace: list, run_folder) -> None:
    """Publish the trace, then commit the model, AdamW's state, the cursor and which plan it is in."""
    publish_trace(run_folder, trace)
    epoch, index = ranks.cursor()
    ckpt.commit(CheckpointState(
        step, {}, tensors={0: [{k: v.detach().numpy().copy() for k, v in model.state_dict().items()}]},
        optimizer={0: optimizer_arrays(optimizer)}, user_state={"plan": which.encode()},
        extra_cursors={"plan": PlanCursor(ranks.plan.fingerprint, epoch, index)}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/steer", help="the run folder (default runs/steer)")
    parser.add_argument("--steps", type=int, default=200, help="steps to train (default 200)")
    parser.add_argument("--world-size", type=int, default=2, help="ranks emulated (default 2)")
    parser.add_argument("--microbatches-per-step", type=int, default=2, help="global microbatches a step (2)")
    parser.add_argument("--change-at", type=int, default=100,
                        help="the step the mixture's weights change at (the first window from it on; default 100)")
    parser.add_argument("--spike-at", type=int, default=150, help="the step the synthetic spike is reported at")
    parser.add_argument("--skip", type=int, default=11, help="steps left out from the spike on (11: 150:161)")
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--kill-at-step", type=int, default=None, help="SIGKILL after this step's optimizer step")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    parser.add_argument("--records", type=int, default=1200, help="records of the forward corpus (1200)")
    parser.add_argument("--num-samples", type=int, default=1300,
                        help="samples of the mixture (1300: about 430 microbatches, 215 steps of 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=3e-3)
    return run_checked(parser, argv, train, ("steps", "world_size", "microbatches_per_step", "spike_at", "skip",
                                             "checkpoint_every", "records", "num_samples"))


if __name__ == "__main__":
    sys.exit(main())
