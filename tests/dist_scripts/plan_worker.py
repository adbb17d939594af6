"""One rank of a ``torchrun --standalone`` run that trains over a batch plan (gloo, CPU).

Phases (argument ``--phase``):

``start``   (W = 4) every epoch from the start, stopping after ``STOP_STEP``
            lockstep steps of epoch 1; rank 0 writes the sampler's state.
``resume``  (any W) loads that state and trains to the end of the plan.

Each step, every rank takes its microbatch (or none, in an epoch's short last
step), computes a loss on a tiny model and all-reduces the gradients, so all
ranks step together. The dataset's sample ``i`` is ``i``, so what a rank
records (epoch, global microbatch index, rows) is what it read. Rank 0
gathers the records into ``<phase>.json``; the test compares them with the
single-process sequence. ``run_distributed`` ends every rank cleanly.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from umlos_cuda.batching import load_plan
from umlos_cuda.torch import PlanBatchSampler, run_distributed

STOP_EPOCH = 1
STOP_STEP = 5


def main(args) -> None:
    plan = load_plan(os.path.join(args.workdir, "plan"))
    sampler = PlanBatchSampler(plan)  # rank and world size from the process group
    if args.phase == "resume":
        with open(os.path.join(args.workdir, "state.json")) as handle:
            sampler.load_state_dict(json.load(handle))
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(TensorDataset(torch.arange(plan.meta.num_samples, dtype=torch.float32)), batch_sampler=sampler)
    records, stopped = [], False
    for epoch in range(sampler.epoch, plan.num_epochs):
        sampler.set_epoch(epoch)
        steps = sampler.steps_remaining
        batches = iter(loader)
        for step in range(steps):
            if args.phase == "start" and epoch == STOP_EPOCH and step == STOP_STEP:
                stopped = True
                break
            batch = next(batches, None)
            optimizer.zero_grad()
            if batch is None:  # no microbatch for this rank in the epoch's short last step
                loss = model.weight.sum() * 0.0
            else:
                (values,) = batch
                records.append([epoch, sampler.last_microbatch["index"], values.long().tolist()])
                loss = model(values[:, None] / 1000.0).pow(2).mean()
            loss.backward()
            for parameter in model.parameters():
                dist.all_reduce(parameter.grad)
            optimizer.step()
        if stopped:
            break
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, sampler.state_dict() if stopped else None)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, records)
    if dist.get_rank() == 0:
        if stopped:
            assert all(state == states[0] for state in states), states  # every rank saves the same cursor
            with open(os.path.join(args.workdir, "state.json"), "w") as handle:
                json.dump(states[0], handle)
        report = {"world_size": dist.get_world_size(), "records": [r for rank in gathered for r in rank],
                  "weight": model.weight.item()}
        with open(os.path.join(args.workdir, f"{args.phase}.json"), "w") as handle:
            json.dump(report, handle)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--phase", choices=("start", "resume"), required=True)
    parser.add_argument("--workdir", required=True)
    arguments = parser.parse_args()
    run_distributed(lambda: main(arguments))
