"""One rank of ``torchrun --standalone --nproc_per_node=W`` (gloo, CPU): DistributedSampler
with PyTorch's arguments and defaults, ``N`` not divisible by ``W``, in a DDP loop.

``N = W * BATCH * 2 + 1``: without padding rank 0 would take one sample more,
hence one step more (``N // W`` is a whole number of batches), and DDP's
all-reduce in that step would wait for peers that never come. With the default
every rank takes ``ceil(N / W)`` samples and the same steps. The process
group's timeout turns a hang into an error, so a regression fails, never hangs.

Every rank also builds PyTorch's own sampler on the same process group and
compares lengths (default, ``drop_last``, a one-sample dataset) and the
unshuffled partition. Rank 0 gathers everything, checks it and writes
``report-w{W}.json`` to ``--workdir``; tests/test_torch_ddp_defaults.py reads it.
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
from torch.utils.data.distributed import DistributedSampler as TorchSampler

from umlos_cuda.torch import DistributedSampler, run_distributed

BATCH = 4
EPOCHS = 2
#: Collectives give up after this long instead of waiting forever (a safety net).
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=60)


def run(workdir: str) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    n = world * BATCH * 2 + 1
    data = TensorDataset(torch.arange(n))
    sampler = DistributedSampler(data)  # rank and world size from the process group, as users call PyTorch's
    theirs = TorchSampler(data)
    one = TensorDataset(torch.zeros(1))
    mine = {
        "rank": rank,
        "num_replicas": sampler.num_replicas,
        "len": len(sampler),
        "torch_len": len(theirs),
        "drop_last_len": len(DistributedSampler(data, drop_last=True)),
        "torch_drop_last_len": len(TorchSampler(data, drop_last=True)),
        "one_sample_len": len(DistributedSampler(one)),
        "torch_one_sample_len": len(TorchSampler(one)),
        "unshuffled": list(DistributedSampler(data, shuffle=False)),
        "torch_unshuffled": list(TorchSampler(data, shuffle=False)),
    }

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    steps, seen = [], []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        count = 0
        for (x,) in loader:
            opt.zero_grad()
            model(x.float().unsqueeze(1)).pow(2).mean().backward()  # all-reduces: every rank must take this step
            opt.step()
            count += 1
            if epoch == 0:
                seen.extend(x.tolist())
        steps.append(count)
    mine.update(steps=steps, seen=seen)

    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    if rank != 0:
        return
    size = -(-n // world)
    checks = []
    assert [r["num_replicas"] for r in everyone] == [world] * world
    assert all(r["len"] == r["torch_len"] == size for r in everyone), "default: ceil(N / W) per rank, as PyTorch"
    checks.append("lengths_equal_pytorch")
    assert all(r["drop_last_len"] == r["torch_drop_last_len"] == n // world for r in everyone)
    assert all(r["one_sample_len"] == r["torch_one_sample_len"] == 1 for r in everyone)
    checks.append("drop_last_and_one_sample_equal_pytorch")
    assert all(r["unshuffled"] == r["torch_unshuffled"] for r in everyone), "unshuffled partition differs from PyTorch"
    checks.append("unshuffled_equal_pytorch")
    expected_steps = -(-size // BATCH)
    assert all(r["steps"] == [expected_steps] * EPOCHS for r in everyone), "ranks took different numbers of steps"
    checks.append("equal_steps")
    flat = list(chain.from_iterable(r["seen"] for r in everyone))
    assert set(flat) == set(range(n)) and len(flat) == size * world, "epoch 0: an index missing or over-repeated"
    checks.append("every_index_seen")
    report = {"world_size": world, "n": n, "checks": checks, "steps": [r["steps"] for r in everyone]}
    with open(os.path.join(workdir, f"report-w{world}.json"), "w") as fh:
        json.dump(report, fh)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    run_distributed(lambda: run(args.workdir), timeout=COLLECTIVE_TIMEOUT)


if __name__ == "__main__":
    main()
