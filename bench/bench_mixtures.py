"""Weighted mixtures (docs/batching.md, "Weighted mixtures"): the index of a 3-way mixture, built a window at a time.

The mixture BlendedDataset's row of bench/bench_megatron.py blends: three datasets of ``--documents``
documents each (seeded synthetic lengths, ``SyntheticLengths``: lognormal bins, median about 735,
clipped to [16, 16384]; no file), weights 0.5, 0.3, 0.2, ``--samples`` samples in all, each dataset
in its own engine order and seed, the third capped at ``--cap`` epochs when given; ``--mapped DIR``
writes the three as ``.u32`` sidecars in DIR (bench_windowed_plans.write_sidecar) and maps them
(``MappedLengths``) instead, so the peak RSS counts the mapped length pages. In a fresh
interpreter (``OMP_NUM_THREADS=1``, as bench_windowed_plans.py): the definition (its segment table),
``MixedPlan.build`` (every mixed window computed and its microbatches counted: the index), its
time and samples/s, the peak RSS (``ru_maxrss``) and its rise over the RSS after the imports; then
``--draws`` microbatches at random from a fresh ``MixedPlan`` over the same index (the median and
largest time: one mixed window planned each), and one mixed window's order alone
(``window_of``), the median of 20.

``--schedule scheduled`` gives the mixture a schedule (docs/batching.md, "Mixture schedules") instead
of its fixed weights: d2 joins at 10 % of the samples, the weights ramp from 0.5, 0.3, 0.2 to 0.3, 0.3,
0.4 until 60 % (a segment per window), and d1 retires at 80 %; ``--schedule both`` runs the fixed and the
scheduled mixture each in its own fresh interpreter and prints both rows and their ratios. ``--unit tokens``
counts the weights in tokens (docs/batching.md, "Token quotas": each window's quotas from its streams' lengths,
computed in the definition, which a reopened plan pays again).

    python bench/bench_mixtures.py [--documents 10000000] [--samples 10000000] [--window 65536] [--cap 2]
        [--schedule fixed|scheduled|both] [--unit samples|tokens]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)


def rss_mb() -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def scheduled_weights(samples: int):
    """The bench's schedule (module docstring), its positions fractions of ``samples``."""
    from fractions import Fraction

    from umlos_cuda.batching.plans.windows import MixSchedule, Piece

    def weights(*values: str) -> tuple[Fraction, ...]:
        return tuple(Fraction(v) for v in values)

    return MixSchedule((Piece(0, weights("0.5", "0.3", "0")),
                        Piece(samples // 10, weights("0.5", "0.3", "0.2"), ramp=True),
                        Piece(samples * 6 // 10, weights("0.3", "0.3", "0.4")),
                        Piece(samples * 8 // 10, weights("0.3", "0", "0.4"))))


def child(spec: dict) -> dict:
    from umlos_cuda.batching import BatchingConfig
    from umlos_cuda.batching.plans.windows import (Component, MappedLengths, MixedPlan, MixtureDefinition,
                                                   SyntheticLengths)

    base = rss_mb()
    config = BatchingConfig.throughput(token_budget=16384, bucket_edges=(256, 512, 1024, 2048, 4096),
                                       overflow_max=16384, seed=7)
    n = spec["documents"]
    sources = ([MappedLengths(os.path.join(spec["mapped"], f"d{i}.u32")) for i in range(3)] if spec["mapped"]
               else [SyntheticLengths(n, seed=i) for i in range(3)])
    components = tuple(Component(sources[i], w, seed=100 + i,
                                 max_epochs=spec["cap"] if i == 2 else None, name=f"d{i}")
                       for i, w in enumerate((0.5, 0.3, 0.2)))
    schedule = scheduled_weights(spec["samples"]) if spec["schedule"] == "scheduled" else None
    started = time.perf_counter()
    definition = MixtureDefinition(config, components, spec["window"], spec["samples"], schedule,
                                   spec.get("unit", "samples"))
    defined = time.perf_counter() - started
    plan = MixedPlan.build(definition)
    built = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    fresh = MixedPlan(definition, plan.index)
    rng = random.Random(1)
    times = []
    for _ in range(spec["draws"]):
        j = rng.randrange(plan.num_microbatches)
        t = time.perf_counter()
        fresh.microbatch(j)
        times.append(time.perf_counter() - t)
    orders = []
    for m in rng.sample(range(definition.num_windows), min(20, definition.num_windows)):
        t = time.perf_counter()
        definition.window_of(m)
        orders.append(time.perf_counter() - t)
    return {"samples": definition.total, "windows": definition.num_windows, "segments": len(definition.segments),
            "quotas0": list(definition.quotas(0)), "define_s": defined, "build_s": built,
            "rate": definition.total / built, "peak_mb": peak, "rise_mb": peak - base,
            "index_kb": plan.index.nbytes / 1024, "microbatches": plan.num_microbatches,
            "mb_k_ms_median": 1000 * statistics.median(times), "mb_k_ms_max": 1000 * max(times),
            "window_order_ms": 1000 * statistics.median(orders)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=10_000_000)
    parser.add_argument("--samples", type=int, default=10_000_000)
    parser.add_argument("--window", type=int, default=1 << 16)
    parser.add_argument("--cap", type=int, default=None)
    parser.add_argument("--draws", type=int, default=50)
    parser.add_argument("--mapped", default=None, metavar="DIR", help="map sidecars written in DIR (kept)")
    parser.add_argument("--schedule", choices=("fixed", "scheduled", "both"), default="fixed")
    parser.add_argument("--unit", choices=("samples", "tokens"), default="samples")
    parser.add_argument("--child", default=None)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child))))
        return
    if args.mapped:
        from bench_windowed_plans import write_sidecar

        os.makedirs(args.mapped, exist_ok=True)
        for i in range(3):
            path = os.path.join(args.mapped, f"d{i}.u32")
            if not os.path.exists(path):
                write_sidecar(path, args.documents, i)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    kinds = ("fixed", "scheduled") if args.schedule == "both" else (args.schedule,)
    rows = {}
    print("| weights | documents per dataset | samples | windows (segments) | build s | samples/s "
          "| peak RSS MB (rise) | index KB | microbatch k ms (median, max) | window order ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind in kinds:
        spec = {"documents": args.documents, "samples": args.samples, "window": args.window, "cap": args.cap,
                "draws": args.draws, "mapped": args.mapped, "schedule": kind, "unit": args.unit}
        out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], check=True,
                             capture_output=True, text=True, env=env).stdout
        r = rows[kind] = json.loads(out.strip().splitlines()[-1])
        print(f"| {kind} | {args.documents:,} | {r['samples']:,} | {r['windows']} ({r['segments']}) "
              f"| {r['build_s']:.2f} | {r['rate']:,.0f} | {r['peak_mb']:.0f} (+{r['rise_mb']:.0f}) "
              f"| {r['index_kb']:.1f} | {r['mb_k_ms_median']:.1f}, {r['mb_k_ms_max']:.1f} "
              f"| {r['window_order_ms']:.1f} |")
    for kind, r in rows.items():
        print(f"{kind}: window 0 quotas {r['quotas0']}, {r['microbatches']:,} microbatches; "
              f"definition {r['define_s'] * 1000:.1f} ms")
    if len(rows) == 2:
        fixed, scheduled = rows["fixed"], rows["scheduled"]
        print(f"scheduled / fixed: build {scheduled['build_s'] / fixed['build_s']:.2f}x, peak RSS "
              f"{scheduled['peak_mb'] / fixed['peak_mb']:.2f}x, definition "
              f"{scheduled['define_s'] / fixed['define_s']:.2f}x")


if __name__ == "__main__":
    main()
