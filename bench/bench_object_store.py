"""A token store read from an S3-compatible server: the planned cache against direct ranged reads and local disk.

Writes a token store of ``--samples`` rows (lognormal lengths, uint16 ids; bench/bench_sharded_store.py's
writer, no tokenizer), copies it into moto's server behind the tests' counting proxy
(tests/objstore_support.py, in this process), plans it (a windowed plan, ``--window`` positions, the
engine's default order) and, for each added latency of ``--latency`` ms per request, reads one epoch of
rank 0 of ``--world`` through a torch ``DataLoader`` (``num_workers=0``, ``PlanCollator``):

* ``planned``: :class:`~umlos_cuda.remote.PlannedTokenSource` with a cache of every block of the store,
  then of a quarter of the store's bytes (``cache 1/4``); its bytes fetched are checked against an offline
  Belady count of the same references before anything is printed (the small cache at ``--quarter-latency``
  only: it can fetch only as far ahead as it has room, so its epoch takes minutes at 100 ms);
* ``resumed``: the same reader started half way through the epoch at rank 0 of ``--world + 1`` (a resume at
  another world size, in a new process's cold cache): its first batch and what it fetches;
* ``direct``: ``TokenDataset(URL)`` (two ranged GETs a row), over the first ``--direct-steps`` steps only;
* ``local``: the same store on disk, memory-mapped.

Columns: seconds to the first batch, samples/s over the epoch (or the steps read), bytes fetched / bytes
stored (tokens.npy and loss_mask.npy, as the proxy counted them), GET requests. Then, from the references
alone (no server): the smallest cache, in blocks, for which Belady fetches each stored byte at most once.

    python bench/bench_object_store.py [--samples 20000] [--latency 0 20 100] [--world 2] [--block-kb 16]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
from bench_collate import documents  # noqa: E402
from bench_sharded_store import write_store  # noqa: E402
from objstore_support import object_store_session  # noqa: E402

from umlos_cuda.batching import BatchingConfig  # noqa: E402
from umlos_cuda.batching.plans.windows import ArrayLengths, WindowDefinition, WindowedPlan  # noqa: E402
from umlos_cuda.remote import PlannedTokenSource, RemoteTokenStore, belady  # noqa: E402
from umlos_cuda.remote.planned import block_refs, pass_rows  # noqa: E402


def epoch(dataset, plan, sampler, steps: int | None = None) -> tuple[float, float, int]:
    """Seconds to the first batch, samples/s, and samples, of one pass of ``sampler`` (at most ``steps`` steps)."""
    from torch.utils.data import DataLoader

    from umlos_cuda.torch import PlanCollator

    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=PlanCollator(plan), num_workers=0)
    began = time.perf_counter()
    first, samples = None, 0
    for step, batch in enumerate(loader):
        samples += int(batch["rows"].shape[0])
        first = first if first is not None else time.perf_counter() - began
        if steps is not None and step + 1 >= steps:
            break
    return first or 0.0, samples / (time.perf_counter() - began), samples


def belady_bytes(store, refs: np.ndarray, capacity: int, block: int) -> int:
    schedule = belady(refs, capacity)
    missed = refs[schedule.misses]
    sizes = np.where(missed >> 40 == 0, store.objects["tokens"].size, store.objects["loss_mask"].size)
    return int(np.minimum(block, sizes - (missed & ((1 << 40) - 1)) * block).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--latency", type=float, nargs="+", default=[0.0, 20.0, 100.0], help="ms per request")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--window", type=int, default=4096)
    parser.add_argument("--block-kb", type=int, default=16)
    parser.add_argument("--lookahead", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--direct-steps", type=int, default=10)
    parser.add_argument("--quarter-latency", type=float, nargs="*", default=[0.0],
                        help="the latencies (ms) at which the cache of 1/4 reads its epoch (slow: a small cache "
                             "can fetch only as far ahead as it has room)")
    args = parser.parse_args()
    from umlos_cuda.torch import PlanBatchSampler, TokenDataset

    rng = np.random.default_rng(0)
    lengths, tokens = documents(rng, args.samples)
    block = args.block_kb << 10
    with tempfile.TemporaryDirectory() as folder, object_store_session() as served:
        local = os.path.join(folder, "store")
        write_store(local, tokens, lengths, 0)
        url = served.upload_folder(local, served.bucket("bench"), "store")
        config = BatchingConfig.throughput(8192, (256, 512, 1024), 2048, seed=1)
        plan = WindowedPlan.build(WindowDefinition(config, args.samples, args.window),
                                  ArrayLengths(lengths.astype(np.uint32)), 1)
        opened = RemoteTokenStore.open(url)
        stored = opened.objects["tokens"].size + opened.objects["loss_mask"].size
        rows = [row for step in pass_rows(PlanBatchSampler(plan, rank=0, world_size=args.world), 0, 0)
                for row in step]
        refs, _ = block_refs(opened, rows, block)
        print(f"{args.samples} samples, {int(lengths.sum()):,} tokens, {stored / 1e6:.1f} MB stored "
              f"(tokens + loss mask); rank 0 of {args.world}; blocks of {args.block_kb} KiB; lookahead "
              f"{args.lookahead}, {args.concurrency} in flight; moto and the proxy in this process")
        print(f"{'reader':12} {'ms':>5} {'first s':>8} {'samples/s':>10} {'fetched/stored':>15} {'GETs':>6}")
        for latency in args.latency:
            served.proxy.latency = latency / 1000
            blocks = -(-opened.objects["tokens"].size // block) + -(-opened.objects["loss_mask"].size // block)
            readers = [("planned", blocks * block)] + ([("cache 1/4", stored // 4)] if latency in args.quarter_latency
                                                       else [])
            for name, cache in readers:
                served.proxy.reset()
                sampler = PlanBatchSampler(plan, rank=0, world_size=args.world)
                source = PlannedTokenSource(opened, sampler, cache_bytes=max(cache, block), block_bytes=block,
                                            lookahead=args.lookahead, concurrency=args.concurrency)
                first, rate, _ = epoch(TokenDataset(source, plan=plan), plan, sampler)
                fetched = sum(r.sent for r in served.proxy.gets() if r.key.endswith(("tokens.npy", "loss_mask.npy")))
                expected = belady_bytes(opened, refs, max(cache, block) // block, block)
                if fetched != source.fetched_bytes or fetched != expected or source.unplanned_rows:
                    raise SystemExit(f"{name}: fetched {fetched}, counted {source.fetched_bytes}, Belady {expected}, "
                                     f"{source.unplanned_rows} rows out of order")
                source.close()
                print(f"{name:12} {latency:5.0f} {first:8.3f} {rate:10.0f} {fetched / stored:15.3f} "
                      f"{source.requests:6d}", flush=True)
            served.proxy.reset()  # a resume in a new reader at another world size, half way through the epoch
            half = plan.epoch_microbatches(0) // 2
            sampler = PlanBatchSampler(plan, rank=0, world_size=args.world + 1, epoch=0, microbatch_index=half)
            source = PlannedTokenSource(opened, sampler, cache_bytes=blocks * block, block_bytes=block,
                                        lookahead=args.lookahead, concurrency=args.concurrency)
            first, rate, _ = epoch(TokenDataset(source, plan=plan), plan, sampler)
            source.close()
            print(f"{'resumed':12} {latency:5.0f} {first:8.3f} {rate:10.0f} "
                  f"{source.fetched_bytes / stored:15.3f} {source.requests:6d}", flush=True)
            served.proxy.reset()
            sampler = PlanBatchSampler(plan, rank=0, world_size=args.world)
            first, rate, _ = epoch(TokenDataset(url, plan=plan), plan, sampler, args.direct_steps)
            print(f"{'direct':12} {latency:5.0f} {first:8.3f} {rate:10.0f} {f'({args.direct_steps} steps)':>15} "
                  f"{len(served.proxy.gets()):6d}", flush=True)
        sampler = PlanBatchSampler(plan, rank=0, world_size=args.world)
        first, rate, _ = epoch(TokenDataset(local, plan=plan), plan, sampler)
        print(f"{'local':12} {'':5} {first:8.3f} {rate:10.0f}")
        low, high = 1, -(-stored // block) + 2
        while low < high:  # Belady's bytes fall as the cache grows
            middle = (low + high) // 2
            if belady_bytes(opened, refs, middle, block) <= stored:
                high = middle
            else:
                low = middle + 1
        print(f"smallest cache fetching each stored byte at most once: {low} blocks of {args.block_kb} KiB "
              f"({low * block / stored:.0%} of the store); the pass references {len(np.unique(refs))} of "
              f"{-(-opened.objects['tokens'].size // block) + -(-opened.objects['loss_mask'].size // block)} blocks")


if __name__ == "__main__":
    main()
