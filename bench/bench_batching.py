"""Token-budget batch plans: umlos_cuda.batching beside chuk-lazarus 0.4.1.

Both libraries plan one epoch of the same lognormal lengths (edges 128, 256,
512, 1024, 2048, overflow 4096, budget 16384) in the same mode:

* predictable: ours ``pad_to_bucket``; theirs ``BatchingConfig.predictable``
  (pad to the bucket; it also drops each bucket's last partial batch and
  does not interleave buckets);
* throughput: ours ``pad_to_max``; theirs ``BatchingConfig.throughput``
  (round-robin interleaving; it cuts by the bucket length and pads to the
  longest sample of each batch, its ``PAD_TO_MAX_IN_BATCH``).

Columns: samples/s (N / build time of one epoch, one run after a warm-up
plan of each mode and a garbage collection), padding waste
(padding tokens / padded tokens), bucket drift (total-variation distance
between the bucket mix of the first and the last 10 % of microbatches) and
peak memory of the build (tracemalloc, in a second run: NumPy's arrays and
Python's objects). chuk-lazarus's package imports MLX, which does not run
here, so ``chuk_lazarus.data.batching`` is loaded under bare parent
packages; install it beside this checkout with
``pip install --no-deps chuk-lazarus==0.4.1 pydantic aiofiles`` (and
pydantic's own dependencies). It is a benchmark-only dependency.

``--huge N`` instead builds one epoch of N samples (default 10^8) in binary
form (``pad_to_max``, the costlier cut), writes it, and prints the time and
the peak RSS of the process per sample::

    python bench/bench_batching.py                  # 10^4, 10^5, 10^6
    python bench/bench_batching.py --huge 1e8       # the 10^8-sample plan
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import os
import resource
import shutil
import sys
import tempfile
import time
import tracemalloc
import types

import numpy as np

from umlos_cuda.batching import BatchingConfig, BatchPlanBuilder, save_plan
from umlos_cuda.batching.plans.planner import bucket_mix_drift

EDGES = (128, 256, 512, 1024, 2048)
OVERFLOW = 4096
BUDGET = 16384
SEED = 42


def lognormal_lengths(n: int, seed: int = 0, chunk: int = 1 << 22) -> np.ndarray:
    """Token lengths, lognormal (median 245, sigma 1), clipped to [1, 8192], built in chunks."""
    out = np.empty(n, dtype=np.uint32)
    rng = np.random.default_rng(seed)
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        out[start:stop] = np.clip(rng.lognormal(5.5, 1.0, stop - start), 1, 8192)
    return out


# ---------------------------------------------------------------------- chuk-lazarus
def load_chuk():
    """``chuk_lazarus.data.batching`` without the top-level package (which imports MLX)."""
    spec = importlib.util.find_spec("chuk_lazarus")
    if spec is None:
        return None
    root = spec.submodule_search_locations[0]
    for name, path in (("chuk_lazarus", root), ("chuk_lazarus.data", os.path.join(root, "data"))):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = [path]
            sys.modules[name] = module
    import chuk_lazarus.data.batching as batching

    return batching


def chuk_plan(batching, ids, lengths, mode):
    lengths_by_id = dict(zip(ids, lengths.tolist()))
    factory = batching.BatchingConfig.predictable if mode == "predictable" else batching.BatchingConfig.throughput
    config = factory(token_budget=BUDGET, bucket_edges=EDGES, overflow_max=OVERFLOW, seed=SEED)
    builder = batching.BatchPlanBuilder(lengths=lengths_by_id, batching_config=config, dataset_hash="d",
                                        tokenizer_hash="t")
    return asyncio.run(builder.build(num_epochs=1)), lengths_by_id


def chuk_metrics(plan, lengths_by_id, mode):
    tokens = padded = 0
    buckets = []
    for mb in plan.get_epoch(0).microbatches:
        sizes = [lengths_by_id[s] for s in mb.samples]
        tokens += sum(sizes)
        padded += len(sizes) * (mb.max_len if mode == "predictable" else max(sizes))
        buckets.append(mb.bucket_id)
    return (padded - tokens) / padded, bucket_mix_drift(np.asarray(buckets), len(EDGES) + 1)


# ---------------------------------------------------------------------- umlos-cuda
def our_config(mode):
    factory = BatchingConfig.predictable if mode == "predictable" else BatchingConfig.throughput
    return factory(BUDGET, EDGES, OVERFLOW, seed=SEED)


def our_plan(lengths, mode):
    return BatchPlanBuilder(lengths, our_config(mode), tokenizer_hash="t").build(1)


def timed(function, *args):
    """``function(*args)`` and its seconds, after a full garbage collection (so
    that neither library pays for the other's garbage)."""
    gc.collect()
    start = time.perf_counter()
    result = function(*args)
    return result, time.perf_counter() - start


def peak_bytes(function, *args):
    tracemalloc.start()
    try:
        function(*args)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def compare(sizes):
    batching = load_chuk()
    if batching is None:
        print("chuk-lazarus is not installed: its columns are empty "
              "(pip install --no-deps chuk-lazarus==0.4.1 pydantic aiofiles)")
    print(f"lognormal lengths (median 245, sigma 1), edges {EDGES}, overflow {OVERFLOW}, budget {BUDGET}, one epoch")
    header = (f"{'N':>9} {'mode':<11} | {'ours samples/s':>14} {'waste':>6} {'drift':>6} {'peak MiB':>8} | "
              f"{'chuk samples/s':>14} {'waste':>6} {'drift':>6} {'peak MiB':>8} | {'speed-up':>8}")
    print(header)
    print("-" * len(header))
    warm = lognormal_lengths(1000, seed=1)  # imports and first calls, outside the timings
    for mode in ("predictable", "throughput"):
        our_plan(warm, mode)
        if batching is not None:
            chuk_plan(batching, [str(i) for i in range(1000)], warm, mode)
    for n in sizes:
        lengths = lognormal_lengths(n)
        ids = [str(i) for i in range(n)]
        for mode in ("predictable", "throughput"):
            plan, seconds = timed(our_plan, lengths, mode)
            stats = plan.epochs[0].stats
            ours = (n / seconds, stats["padding_waste"], stats["bucket_mix_drift"], peak_bytes(our_plan, lengths, mode))
            theirs = None
            if batching is not None:
                (cplan, by_id), cseconds = timed(chuk_plan, batching, ids, lengths, mode)
                waste, drift = chuk_metrics(cplan, by_id, mode)
                del cplan, by_id
                theirs = (n / cseconds, waste, drift, peak_bytes(chuk_plan, batching, ids, lengths, mode))
            row = f"{n:>9,} {mode:<11} | {ours[0]:>14,.0f} {ours[1]:>6.3f} {ours[2]:>6.3f} {ours[3] / 2**20:>8.1f} | "
            if theirs:
                row += (f"{theirs[0]:>14,.0f} {theirs[1]:>6.3f} {theirs[2]:>6.3f} {theirs[3] / 2**20:>8.1f} | "
                        f"{ours[0] / theirs[0]:>7.0f}x")
            print(row, flush=True)


def huge(n: int, mode: str, keep: str | None) -> None:
    lengths, seconds_lengths = timed(lognormal_lengths, n)
    start = time.perf_counter()
    plan = BatchPlanBuilder(lengths, our_config(mode), tokenizer_hash="t").build(1)
    built = time.perf_counter() - start
    folder = keep or tempfile.mkdtemp(prefix="plan-bench-")
    target = os.path.join(folder, "plan")
    start = time.perf_counter()
    save_plan(plan, target, jsonl="never")
    saved = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    stats = plan.epochs[0].stats
    print(f"N = {n:,} ({mode}, one epoch, binary form)")
    print(f"  lengths generated in {seconds_lengths:.1f} s")
    print(f"  plan built in {built:.1f} s ({n / built:,.0f} samples/s): {stats['microbatches']:,} microbatches, "
          f"padding_waste {stats['padding_waste']:.4f}, bucket_mix_drift {stats['bucket_mix_drift']:.5f}, "
          f"{stats['skipped_samples']:,} skipped")
    print(f"  written in {saved:.1f} s "
          f"({sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(target) for f in fs) / 2**20:,.0f} MiB)")
    print(f"  peak RSS {peak / 2**30:.2f} GiB = {peak / n:.1f} bytes per sample (goal: <= 64)")
    if keep is None:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1e4,1e5,1e6", help="comma-separated N (default 1e4,1e5,1e6)")
    parser.add_argument("--huge", type=float, nargs="?", const=1e8, help="build one N-sample plan (default 1e8)")
    parser.add_argument("--mode", choices=("predictable", "throughput"), default="throughput", help="with --huge")
    parser.add_argument("--keep", metavar="DIR", help="with --huge: write the plan under DIR and keep it")
    args = parser.parse_args()
    if args.huge:
        huge(int(args.huge), args.mode, args.keep)
    else:
        compare([int(float(x)) for x in args.sizes.split(",")])


if __name__ == "__main__":
    main()
