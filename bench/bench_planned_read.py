"""The planned cache's read path beside the same store on disk, without a server: what each costs per sample.

Writes ``--samples`` documents (the lognormal lengths of bench/bench_object_peers.py, uint16 ids, a uint8 loss
mask) as a token store on disk, builds the same windowed ``feistel`` plan, and reads one epoch through a
``DataLoader`` (``num_workers=0``, ``PlanBatchSampler``, ``PlanCollator``) twice per round, ``--rounds``
times: from the store on disk (memory-mapped), and through a ``PlannedTokenSource`` of the same folder as a
``file://`` URL with a cache of every block. No proxy, no latency, no other process: the two rates differ by
the cache's own work per row (its schedule, its fetch threads, assembling rows from blocks). Run it with
``PYTHONPATH`` at one checkout, then at another, to compare two versions of the read path on one machine.

    python bench/bench_planned_read.py [--samples 40000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_collate import documents
from bench_sharded_store import write_store

from umlos_cuda.batching import BatchingConfig
from umlos_cuda.batching.plans.windows import ArrayLengths, WindowDefinition, WindowedPlan
from umlos_cuda.remote import PlannedTokenSource


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--block-kb", type=int, default=64)
    args = parser.parse_args()
    from torch.utils.data import DataLoader

    from umlos_cuda.torch import PlanBatchSampler, PlanCollator, TokenDataset

    rng = np.random.default_rng(0)
    lengths, tokens = documents(rng, args.samples)
    config = BatchingConfig.throughput(40960, (2048,), 4096, seed=1, order="feistel")
    plan = WindowedPlan.build(WindowDefinition(config, args.samples, 4096),
                              ArrayLengths(lengths.astype(np.uint32)), 1)
    collator = PlanCollator(plan)
    with tempfile.TemporaryDirectory() as folder:
        local = os.path.join(folder, "store")
        write_store(local, tokens, lengths, 0)

        def rate(source, sampler) -> float:
            loader = DataLoader(TokenDataset(source, plan=plan), batch_sampler=sampler, collate_fn=collator)
            began, rows = time.perf_counter(), 0
            for batch in loader:
                rows += batch["rows"].shape[0]
            if rows != args.samples:
                raise SystemExit(f"read {rows} rows of {args.samples}")
            return rows / (time.perf_counter() - began)

        block = args.block_kb << 10
        for round_ in range(args.rounds):
            disk = rate(local, PlanBatchSampler(plan))
            sampler = PlanBatchSampler(plan)
            every = (2 * tokens.nbytes // block + 4) * block  # the tokens and the loss mask, in whole blocks
            source = PlannedTokenSource("file://" + local, sampler, cache_bytes=every, block_bytes=block)
            cached = rate(source, sampler)
            source.close()
            print(f"round {round_}: local disk {disk:,.0f} samples/s, planned cache {cached:,.0f} samples/s "
                  f"({cached / disk:.0%})", flush=True)


if __name__ == "__main__":
    main()
