"""``plan edit --skip-samples`` on a large windowed plan: the scan of every microbatch, one by one and by window.

For each sample count N (default 10^5 and 10^6) the bench builds a windowed plan in memory over seeded
synthetic lengths (``SyntheticLengths``, the lengths bench_windowed_plans.py plans; window 65536, one epoch,
bench_windowed_plans.py's batching config), draws ``--rows`` rows the plan trains (1,000 by default, plus every row
of one microbatch, so that the edit empties one), and times ``skip_rows`` two ways in the same process:

* **one by one**: each microbatch's rows read through ``parent_microbatch`` (``single_row_chunks``: one
  ``MicrobatchSpec`` a microbatch, the scan before windows were read as arrays), up to ``--one-by-one-max``
  samples (it is O(plan) in Python);
* **by window** (what ``plan edit --skip-samples`` runs now): ``unit_row_chunks`` hands out each window's
  planned arrays and the scan tests them with ``searchsorted``.

Both must give the same edit (the script fails otherwise). Times are CPU seconds (``time.process_time``), which a
busy shared machine disturbs less than wall time; both are printed.

    python bench/bench_skip_samples.py [--samples 100000,1000000,10000000] [--rows 1000] [--one-by-one-max 1000000]
"""

from __future__ import annotations

import argparse
import os
from functools import partial
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def timed(call):
    wall, cpu = time.perf_counter(), time.process_time()
    out = call()
    return out, time.process_time() - cpu, time.perf_counter() - wall


def run(n: int, args: argparse.Namespace) -> dict:
    import numpy as np

    from umlos_cuda.batching.plans.config import BatchingConfig
    from umlos_cuda.batching.plans.edits.edit import skip_rows
    from umlos_cuda.batching.plans.edits.plan import single_row_chunks, unit_row_chunks
    from umlos_cuda.batching.plans.windows import SyntheticLengths, WindowDefinition, WindowedPlan

    config = BatchingConfig.throughput(token_budget=16384, bucket_edges=(128, 256, 512, 1024, 2048),
                                       overflow_max=4096, seed=42)
    plan = WindowedPlan.build(WindowDefinition(config, n, args.window), SyntheticLengths(n, 11), 1)
    middle = plan.window(0, plan.definition.num_windows // 2)
    emptied = middle.samples[int(middle.offsets[0]):int(middle.offsets[1])].astype(np.int64)
    everything = plan.epoch_arrays(0).samples.astype(np.int64)
    rows = np.concatenate([emptied, np.random.default_rng(0).choice(everything, args.rows, replace=False)])
    fast, fast_cpu, fast_wall = timed(lambda: skip_rows(plan, rows, partial(unit_row_chunks, plan)))
    out = {"samples": n, "microbatches": plan.epoch_microbatches(0), "windows": plan.definition.num_windows,
           "emptied": len(fast.ranges), "window_cpu_s": fast_cpu, "window_wall_s": fast_wall}
    if n <= args.one_by_one_max:
        slow, slow_cpu, slow_wall = timed(lambda: skip_rows(plan, rows, partial(single_row_chunks, plan)))
        if slow != fast:
            raise SystemExit(f"N={n}: the two scans give different edits")
        out.update(one_cpu_s=slow_cpu, one_wall_s=slow_wall)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", default="100000,1000000", help="sample counts, comma-separated")
    parser.add_argument("--rows", type=int, default=1000, help="rows left out, drawn from the plan (1000)")
    parser.add_argument("--window", type=int, default=65536)
    parser.add_argument("--one-by-one-max", type=int, default=1000000,
                        help="time the one-by-one scan up to this N (it takes minutes at 10^6)")
    args = parser.parse_args()
    print(f"{'N':>12} {'microbatches':>12} {'windows':>7} {'one by one cpu s':>17} {'by window cpu s':>16} "
          f"{'speed-up':>9}")
    for n in (int(v) for v in args.samples.split(",")):
        r = run(n, args)
        one, window = r.get("one_cpu_s"), r["window_cpu_s"]
        slow = "-" if one is None else f"{one:.2f}"
        ratio = "-" if one is None else f"{one / window:.0f}x"
        print(f"{r['samples']:>12,} {r['microbatches']:>12,} {r['windows']:>7} {slow:>17} {window:>16.3f} "
              f"{ratio:>9}", flush=True)


if __name__ == "__main__":
    main()
