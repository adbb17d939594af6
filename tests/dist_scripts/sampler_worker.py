"""One rank of a ``torchrun --standalone --nproc_per_node=W`` run (gloo, CPU).

Phases (argument ``--phase``):

``start``   (W = 4) DistributedSampler: epoch 0 in full, epoch 1 up to mid-epoch,
            then save the sampler state. NextBatchSampler: epoch 0 in full,
            epoch 1 for two global batches, save the cursor. Exact evaluation
            with DistributedEvalSampler. A small DDP model trained with
            DistributedSampler given torch's own arguments.
``resume``  (any W) load both saved states, run the rest of DistributedSampler's
            epoch 1 and NextBatchSampler's epochs 1 (rest) and 2.

Every rank runs a DataLoader over a dataset whose sample ``i`` is ``i``, so
what a rank records is what it read. Rank 0 gathers everything, checks it
(disjoint, every index once, rank order equals the W = 1 sequence, resumed
rest equals the uninterrupted W = 1 run), writes ``report.json`` and exits
non-zero if a check failed. The test reads the report and checks it again.
``run_distributed`` ends every rank cleanly (exit status 0 every time).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from itertools import chain

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from umlos_cuda.torch import (DistributedEvalSampler, DistributedSampler, MaskedDataset, NextBatchSampler,
                              run_distributed)

# DistributedSampler scenario: N not divisible by 4, 3 or 2; loader batch 5.
DS_N = 103
DS_SEED = 7
DS_BATCH = 5
DS_STEPS_BEFORE_SAVE = 3  # epoch 1: every rank reads 3 batches (15 samples), then saves
DS_BLOCK = 16  # several blocks, so the engine's block permutation is exercised
# NextBatchSampler scenario: N = 50, G = 12 (divisible by 4, 3, 2 and 1).
NB_MANIFEST = {
    "seed": 11,
    "global_batch_size": 12,
    "data": {"sampler_block_size": 8},
    "datasets": {"train": {"id": "toy", "version": 1, "hash": "", "cardinality": 50}},
}
NB_STEPS_BEFORE_SAVE = 2
# Exact evaluation: N = 50, per-rank batch 4.
EVAL_N = 50
EVAL_BATCH = 4


def ds_dataset(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(n))


def read(loader, limit=None):
    """Sample values (= indices) of each batch the loader yields, up to ``limit`` batches."""
    batches = []
    for (values,) in loader:
        batches.append(values.tolist())
        if limit is not None and len(batches) == limit:
            break
    return batches


def gather(obj):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def interleave(per_rank: list[list[int]], start: int = 0) -> list[int]:
    """Rank r's i-th sample sits at global position start + ((r - start) mod W) + i*W."""
    w = len(per_rank)
    total = sum(len(x) for x in per_rank)
    out = [None] * total
    for r, values in enumerate(per_rank):
        first = (r - start) % w
        for i, v in enumerate(values):
            out[first + i * w] = v
    assert None not in out, "ranks' samples leave a hole in the global order"
    return out


def w1_order(epoch: int) -> list[int]:
    s = DistributedSampler(DS_N, num_replicas=1, rank=0, seed=DS_SEED, block_size=DS_BLOCK)
    s.set_epoch(epoch)
    return list(s)


def nb_w1_steps(epochs: int) -> list[dict]:
    """The uninterrupted W = 1 run: one record per global batch."""
    s = NextBatchSampler(NB_MANIFEST, "train", world_size=1, rank=0)
    steps = []
    for _ in range(epochs):
        for batch in s:
            meta = s.last_metadata
            steps.append({"epoch": meta["epoch"], "global_position": meta["global_position"], "indices": batch})
    return steps


def nb_run(sampler: NextBatchSampler, limit: int | None = None) -> list[dict]:
    """Read one epoch (or ``limit`` batches) through a DataLoader; each record
    carries the global batch it belongs to."""
    loader = DataLoader(ds_dataset(50), batch_sampler=sampler)
    out = []
    for (values,) in loader:
        meta = sampler.last_metadata
        out.append({"epoch": meta["epoch"], "global_position": meta["global_position"], "values": values.tolist()})
        if limit is not None and len(out) == limit:
            break
    return out


def nb_merge(per_rank: list[list[dict]]) -> list[dict]:
    """Concatenate ranks' micro-batches of each global batch in rank order."""
    steps: dict[tuple[int, int], list[list[int]]] = {}
    for r, records in enumerate(per_rank):
        for rec in records:
            steps.setdefault((rec["epoch"], rec["global_position"]), [[] for _ in per_rank])[r] = rec["values"]
    return [
        {"epoch": e, "global_position": g, "indices": list(chain.from_iterable(parts))} for (e, g),
        parts in sorted(steps.items())
    ]


def check_epoch(values: list[int], n: int, what: str) -> None:
    assert sorted(values) == list(range(n)), f"{what}: not every index exactly once"


def phase_start(workdir: str, report: dict) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()

    # -- DistributedSampler: epoch 0 in full, epoch 1 to mid-epoch (exactly once: pad=False) --
    sampler = DistributedSampler(ds_dataset(DS_N), world, rank, True, DS_SEED, False, pad=False, block_size=DS_BLOCK)
    loader = DataLoader(ds_dataset(DS_N), batch_size=DS_BATCH, sampler=sampler)
    sampler.set_epoch(0)
    epoch0 = list(chain.from_iterable(read(loader)))
    sampler.set_epoch(1)
    epoch1_head = list(chain.from_iterable(read(loader, DS_STEPS_BEFORE_SAVE)))
    ds_state = sampler.state_dict()
    all0, all1 = gather(epoch0), gather(epoch1_head)
    states = gather(ds_state)

    # -- NextBatchSampler: epoch 0 in full, two global batches of epoch 1 ----
    nb = NextBatchSampler(NB_MANIFEST, "train")  # rank and world size from torch.distributed
    assert (nb.rank, nb.world_size) == (rank, world)
    nb_epoch0 = nb_run(nb)
    nb_epoch1_head = nb_run(nb, NB_STEPS_BEFORE_SAVE)
    nb_state = nb.state_dict()
    nb_all0, nb_all1, nb_states = gather(nb_epoch0), gather(nb_epoch1_head), gather(nb_state)

    # -- exact evaluation ----------------------------------------------------
    ev = DistributedEvalSampler(ds_dataset(EVAL_N), EVAL_BATCH)
    ev_loader = DataLoader(MaskedDataset(ds_dataset(EVAL_N)), batch_sampler=ev)
    seen, steps = [], 0
    for (values,), mask in ev_loader:
        assert values.shape[0] == EVAL_BATCH and mask.dtype == torch.bool
        count = torch.tensor([int(mask.sum())])
        dist.all_reduce(count)  # a collective every step: equal step counts or a hang
        seen.append({"values": values.tolist(), "mask": mask.tolist()})
        steps += 1
    ev_all = gather({"steps": steps, "len": len(ev), "batches": seen})

    # -- drop-in training: torch's arguments, a DDP model, every rank steps --
    torch.manual_seed(0)
    n_train = 96
    x = torch.randn(n_train, 4)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1
    train_set = TensorDataset(x, y)
    train_sampler = DistributedSampler(train_set)  # as users call PyTorch's: rank and world from the process group
    assert (train_sampler.num_replicas, train_sampler.rank) == (world, rank)
    train_loader = DataLoader(train_set, batch_size=8, sampler=train_sampler)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for epoch in range(3):
        train_sampler.set_epoch(epoch)
        for xb, yb in train_loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb).squeeze(1), yb)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    params = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
    train_all = gather({"losses": losses, "params": params})

    if rank != 0:
        return
    checks = report["checks"]
    # DistributedSampler, epoch 0: disjoint, exactly once, rank order == W = 1
    flat0 = list(chain.from_iterable(all0))
    assert len(set(flat0)) == len(flat0), "epoch 0: ranks overlap"
    check_epoch(flat0, DS_N, "DistributedSampler epoch 0")
    assert [len(v) for v in all0] == [len(range(r, DS_N, world)) for r in range(world)], "no padding, remainder spread"
    assert interleave(all0) == w1_order(0), "epoch 0 in rank order differs from W = 1"
    checks.append("distributed_sampler_epoch0")
    prefix = DS_STEPS_BEFORE_SAVE * DS_BATCH * world
    assert all(s["global_position"] == prefix for s in states), "ranks disagree on the saved position"
    assert interleave(all1) == w1_order(1)[:prefix], "epoch 1 head differs from W = 1"
    assert w1_order(1) != w1_order(0), "epochs 0 and 1 have the same order"
    checks.append("distributed_sampler_epoch1_head")
    # NextBatchSampler, epoch 0: micro-batches in rank order == W = 1 global batches
    merged0 = nb_merge(nb_all0)
    w1 = nb_w1_steps(3)
    w1_epoch0 = [s for s in w1 if s["epoch"] == 0]
    assert merged0 == w1_epoch0, "NextBatch epoch 0 at W = 4 differs from W = 1"
    flat = list(chain.from_iterable(s["indices"] for s in merged0))
    check_epoch(flat, 50, "NextBatchSampler epoch 0")
    assert len(nb_all0[0]) == 5 and all(len(nb_all0[r]) == 4 for r in range(1, world)), \
        "last batch: only rank 0 has data"
    merged1 = nb_merge(nb_all1)
    assert merged1 == [s for s in w1 if s["epoch"] == 1][:NB_STEPS_BEFORE_SAVE]
    assert all(s["cursor"] == {"epoch": 1, "global_index": 24} for s in nb_states), nb_states
    checks.append("nextbatch_sampler_epoch0_and_head")
    # Exact evaluation: equal steps, every sample once among the unmasked, rank order ascending
    assert len({e["steps"] for e in ev_all}) == 1 and all(e["steps"] == e["len"] for e in ev_all)
    valid = []
    for step in range(ev_all[0]["steps"]):
        for r in range(world):
            b = ev_all[r]["batches"][step]
            valid.extend(v for v, m in zip(b["values"], b["mask"]) if m)
    assert valid == list(range(EVAL_N)), "evaluation: unmasked samples are not 0..N-1 exactly once"
    checks.append("exact_eval")
    # Training: every rank took the same steps and holds the same parameters
    assert len({len(t["losses"]) for t in train_all}) == 1
    assert all(t["params"] == train_all[0]["params"] for t in train_all), "DDP replicas diverged"
    first, last = train_all[0]["losses"][0], train_all[0]["losses"][-1]
    assert last < first, f"training did not reduce the loss ({first} -> {last})"
    checks.append("ddp_training")

    with open(os.path.join(workdir, "ds_state.json"), "w") as fh:
        json.dump(states[0], fh)
    with open(os.path.join(workdir, "nb_state.json"), "w") as fh:
        json.dump(nb_states[0], fh)
    report.update(
        ds_epoch0=all0, ds_epoch1_head=all1, ds_state=states[0], nb_epoch0=merged0, nb_epoch1_head=merged1,
        nb_state=nb_states[0], eval_steps=ev_all[0]["steps"], train_steps=len(train_all[0]["losses"]),
    )


def phase_resume(workdir: str, report: dict) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    with open(os.path.join(workdir, "ds_state.json")) as fh:
        ds_state = json.load(fh)
    with open(os.path.join(workdir, "nb_state.json")) as fh:
        nb_state = json.load(fh)

    sampler = DistributedSampler(ds_dataset(DS_N), world, rank, True, DS_SEED, False, pad=False, block_size=DS_BLOCK)
    sampler.load_state_dict(ds_state)
    loader = DataLoader(ds_dataset(DS_N), batch_size=DS_BATCH, sampler=sampler)
    sampler.set_epoch(ds_state["epoch"])  # the usual loop: keeps the restored position
    rest = list(chain.from_iterable(read(loader)))
    all_rest = gather(rest)

    nb = NextBatchSampler(NB_MANIFEST, "train")
    nb.load_state_dict(nb_state)
    nb_rest = nb_run(nb) + nb_run(nb)  # the rest of epoch 1, then epoch 2
    nb_all = gather(nb_rest)

    if rank != 0:
        return
    p = ds_state["global_position"]
    flat = list(chain.from_iterable(all_rest))
    assert len(set(flat)) == len(flat), "resumed ranks overlap"
    assert interleave(all_rest, p) == w1_order(1)[p:], "resumed rest of epoch 1 differs from W = 1"
    report["checks"].append("distributed_sampler_resume")
    merged = nb_merge(nb_all)
    w1 = nb_w1_steps(3)
    position = (nb_state["cursor"]["epoch"], nb_state["cursor"]["global_index"])
    expected = [s for s in w1 if (s["epoch"], s["global_position"]) >= position]
    assert merged == expected, "resumed NextBatch sequence differs from the uninterrupted W = 1 run"
    report["checks"].append("nextbatch_sampler_resume")
    report.update(ds_rest=all_rest, nb_rest=merged)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--phase", choices=("start", "resume"), required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    run_distributed(lambda: run(args), timeout=datetime.timedelta(seconds=120))


def run(args: argparse.Namespace) -> None:
    report = {"world_size": dist.get_world_size(), "phase": args.phase, "checks": []}
    (phase_start if args.phase == "start" else phase_resume)(args.workdir, report)
    if dist.get_rank() == 0:
        name = f"report-{args.phase}-w{dist.get_world_size()}.json"
        with open(os.path.join(args.workdir, name), "w") as fh:
            json.dump(report, fh)


if __name__ == "__main__":
    main()
