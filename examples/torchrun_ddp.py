"""DDP training with umlos_cuda's samplers, interrupted and resumed at another world size.

Run (CPU, gloo; any number of processes that divides the global batch of 32):

    torchrun --standalone --nproc_per_node=4 examples/torchrun_ddp.py --stop-after 5
    torchrun --standalone --nproc_per_node=2 examples/torchrun_ddp.py

The first command trains for 5 steps and writes ``runs/ddp-checkpoint.pt``
(model, optimiser and the sampler's cursor; ``--output-dir`` picks another
folder); the second resumes on 2 processes from the same global batch and
finishes the run. ``--sampler distributed`` uses the drop-in DistributedSampler
instead of NextBatchSampler. The last lines on rank 0 evaluate exactly (every
sample once, masked padding) with DistributedEvalSampler.

``run_distributed`` initialises the process group, runs ``train`` and ends every
rank cleanly (barrier, ``destroy_process_group``, exit without interpreter
finalization), which a DDP job on gloo needs to exit with status 0 every time
(docs/integrations.md, "Shutting down").
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from umlos_cuda.torch import (DistributedEvalSampler, DistributedSampler, MaskedDataset, NextBatchSampler,
                              run_distributed)

N, GLOBAL_BATCH, EPOCHS = 1000, 32, 3
CHECKPOINT = "ddp-checkpoint.pt"


def make_data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 8, generator=g)
    y = x @ torch.linspace(-1, 1, 8) + 0.1 * torch.randn(N, generator=g)
    return TensorDataset(x, y)


def train(args: argparse.Namespace) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    checkpoint = os.path.join(args.output_dir, CHECKPOINT)
    data = make_data()
    if args.sampler == "nextbatch":
        manifest = {
            "seed": 1234,
            "global_batch_size": GLOBAL_BATCH,
            "data": {"drop_last": True},  # every rank takes every step
            "datasets": {"train": {"id": "toy-regression", "version": 1, "hash": "", "cardinality": N}},
        }
        sampler = NextBatchSampler(manifest, "train", dataset=data)  # rank and world from torch.distributed
        loader = DataLoader(data, batch_sampler=sampler)
    else:
        sampler = DistributedSampler(data, shuffle=True, seed=1234, drop_last=True)
        loader = DataLoader(data, batch_size=GLOBAL_BATCH // world, sampler=sampler)

    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start_epoch, step = 0, 0
    if os.path.exists(checkpoint):
        state = torch.load(checkpoint, weights_only=True)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sampler.load_state_dict(state["sampler"])  # written at any world size
        start_epoch, step = state["epoch"], state["step"]
        if rank == 0:
            print(f"resumed at epoch {start_epoch}, step {step}, sampler {state['sampler']} on {world} ranks")

    for epoch in range(start_epoch, EPOCHS):
        sampler.set_epoch(epoch)  # keeps a restored mid-epoch position
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
            loss.backward()
            opt.step()
            step += 1
            if args.stop_after is not None and step == args.stop_after:
                if rank == 0:
                    # DistributedSampler counts what it handed out; with DataLoader
                    # workers pass samples_consumed=... (see docs/integrations.md).
                    os.makedirs(args.output_dir, exist_ok=True)
                    torch.save(
                        {"model": model.module.state_dict(), "optimizer": opt.state_dict(),
                         "sampler": sampler.state_dict(), "epoch": epoch, "step": step},
                        checkpoint,
                    )
                    print(f"saved {checkpoint} at epoch {epoch}, step {step}; resume with any world size")
                return
        if rank == 0:
            print(f"epoch {epoch}: step {step}, loss {loss.item():.4f}")

    # Exact evaluation: every sample once, the same number of steps on every rank.
    evaluation = DataLoader(MaskedDataset(data), batch_sampler=DistributedEvalSampler(data, batch_size=16))
    totals = torch.zeros(2)
    with torch.no_grad():
        for (x, y), mask in evaluation:
            err = (model(x).squeeze(1) - y) ** 2
            totals += torch.stack([err[mask].sum(), mask.sum()])
    dist.all_reduce(totals)
    if rank == 0:
        print(f"eval: {int(totals[1])} samples (N = {N}), mse {float(totals[0] / totals[1]):.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sampler", choices=("nextbatch", "distributed"), default="nextbatch")
    parser.add_argument("--stop-after", type=int, default=None, help="save and exit after this many steps")
    parser.add_argument(
        "--output-dir", default="runs", help=f"folder of the checkpoint ({CHECKPOINT}); default: runs (ignored by git)"
    )
    args = parser.parse_args()
    run_distributed(lambda: train(args))


if __name__ == "__main__":
    main()
