"""Windowed plans at pretraining scale: index build rate, peak memory, open, microbatch 0 and k.

For each sample count N (default 10^7 and 10^8; ``--samples 1000000000`` adds 10^9) the bench
writes the lengths once as a length cache's ``.u32`` sidecar (seeded synthetic lengths,
``SyntheticLengths``: lognormal bins, median about 735, clipped to [16, 16384]; no JSONL beside
it, the windowed plan maps the sidecar alone), then runs three fresh interpreters:

* **build**: ``MappedLengths`` over the sidecar, ``WindowedPlan.build`` (the index, one
  streaming pass) and ``save_windowed_plan``; build time, samples/s, peak RSS (``ru_maxrss``)
  and its rise over the RSS after the imports (VmHWM: mapped length pages included), the peak
  anonymous memory (RssAnon, sampled every 16 windows), the folder's bytes;
* **open**: ``load_windowed_plan`` and ``microbatch(0)``: time to open, to the first microbatch;
  then ``--draws`` microbatches at random (epoch 0): the median and the largest time each;
* **verify**: ``verify_windowed_plan`` of 8 windows at random (which rehashes the sidecar).

``--cli`` also runs the command line, as a user would, each in a fresh interpreter (``umlos_cuda.cli.main``,
what the ``umlos-cuda`` script calls): ``plan build --window W --lengths SIDECAR.u32`` (the bytes checked
against their own SHA-256, then mapped) and ``plan verify --windows 8``, with the wall time and the peak RSS
(VmHWM) of each. ``--jsonl 10000000,100000000`` writes real length caches (JSONL and sidecar, line-number
ids) of those sizes and times ``plan build --window`` over the JSONL: the sidecar checked against every row
in one streaming read, the bounded path a cache named by its JSONL takes.

``--explain W`` also times ``plan explain`` (``StepExplainer``, docs/batching.md "Explaining a step") in a fresh
interpreter per size: the folder opened once, then ``--draws`` steps drawn at random from the run at world size
``W``, each explained for every rank (``W`` microbatches: one or two windows planned, every row's sample, range
and tokens); the median and the largest time, and the machine's load average (``os.getloadavg``) before and after.
It also times what a training loop adds per step to record it on the checkpoint store's tape: ``step_record``
(the digest of the drawn steps' rows) and its append to a temporary store's tape, committed, in microseconds.

``--compare`` (at the smallest N) also builds the whole-epoch plan of the same lengths
(``build_epoch``) to count what the flush edge rule costs: microbatches and padded tokens.
``--synthetic 10000000000`` plans windows of a 10^10-sample epoch straight from the seeded
source (no file): the time and peak RSS of counting and of planning ``--probe`` windows at
random, and the whole index pass extrapolated from them (time per window x windows).

The children run with ``OMP_NUM_THREADS=1`` unless ``--threads`` says otherwise (``--threads 0``
leaves it as it is), so that runs compare; a window of 2^16 positions is one chunk of the native
order's parallel map, which runs on the calling thread whatever the variable (docs/kernels.md).

    python bench/bench_windowed_plans.py [--samples 10000000,100000000] [--window 65536]
        [--folder DIR] [--order block_affine] [--compare] [--synthetic 10000000000] [--cli]
        [--jsonl 10000000] [--explain 8]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def _status(key: str) -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    return 0.0


def rss_mb() -> float:
    return _status("VmRSS:")


def peak_mb() -> float:
    """This process image's peak RSS: VmHWM, which exec resets. (``ru_maxrss`` is not reset by exec
    on Linux: a child would report its parent's RSS at the fork when that was larger.)"""
    return _status("VmHWM:") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def config(args_or_spec):
    from umlos_cuda.batching.plans.config import BatchingConfig

    spec = args_or_spec if isinstance(args_or_spec, dict) else vars(args_or_spec)
    return BatchingConfig.throughput(token_budget=16384, bucket_edges=(128, 256, 512, 1024, 2048),
                                     overflow_max=4096, seed=42, order=spec["order"])


def write_sidecar(path: str, n: int, seed: int) -> float:
    """A length cache sidecar of ``n`` synthetic lengths (header, then the bytes), written in chunks."""
    import numpy as np

    from umlos_cuda.batching.lengths.cache import SIDECAR_ALIGN, SIDECAR_MAGIC, SIDECAR_VERSION
    from umlos_cuda.batching.plans.windows import SyntheticLengths

    started = time.perf_counter()
    source = SyntheticLengths(n, seed)

    def header(sha: str) -> bytes:
        fields = {"count": n, "dataset_hash": None, "format_version": SIDECAR_VERSION, "jsonl_sha256": "0" * 64,
                  "jsonl_size": 0, "lengths_sha256": sha, "sample_ids": "line_numbers", "tokenizer_hash": "synthetic"}
        text = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode("ascii")
        prefix = SIDECAR_MAGIC + struct.pack("<I", len(text)) + text
        return prefix + b"\0" * (-len(prefix) % SIDECAR_ALIGN)

    digest = hashlib.sha256()
    with open(path + ".tmp", "wb") as handle:
        handle.write(header("0" * 64))
        for start in range(0, n, 1 << 22):
            chunk = source.take(np.arange(start, min(n, start + (1 << 22)), dtype=np.uint64)).astype("<u4").tobytes()
            digest.update(chunk)
            handle.write(chunk)
        handle.seek(0)
        handle.write(header(digest.hexdigest()))
    os.replace(path + ".tmp", path)
    return time.perf_counter() - started


# ---------------------------------------------------------------------- children
def child_build(spec: dict) -> dict:
    from umlos_cuda.batching.plans.windows import MappedLengths, WindowDefinition, WindowedPlan, save_windowed_plan

    before = rss_mb()
    anon = [0.0]

    def track(done: int, total: int) -> None:  # the private memory, after each window (VmHWM has it all)
        if done % 16 == 0 or done == total:
            anon[0] = max(anon[0], _status("RssAnon:"))

    started = time.perf_counter()
    source = MappedLengths(spec["lengths"])
    plan = WindowedPlan.build(WindowDefinition(config(spec), source.count, spec["window"]), source, progress=track)
    built = time.perf_counter() - started
    shutil.rmtree(spec["plan"], ignore_errors=True)
    save_windowed_plan(plan, spec["plan"])
    total = time.perf_counter() - started
    size = sum(os.path.getsize(os.path.join(spec["plan"], f)) for f in os.listdir(spec["plan"]))
    counts = plan.epoch_counts(0)
    return {"build_s": built, "saved_s": total, "rate": source.count / built, "rss_before_mb": before,
            "peak_mb": peak_mb(), "anon_mb": anon[0], "plan_bytes": size, "windows": plan.definition.num_windows,
            **counts}


def child_open(spec: dict) -> dict:
    import numpy as np

    from umlos_cuda.batching.plans.windows import load_windowed_plan

    before = rss_mb()
    started = time.perf_counter()
    plan = load_windowed_plan(spec["plan"])
    opened = time.perf_counter() - started
    plan.microbatch(0, 0)
    first = time.perf_counter() - started
    total = plan.epoch_microbatches(0)
    times = []
    for k in np.random.default_rng(1).integers(0, total, spec["draws"]).tolist():
        tick = time.perf_counter()
        plan.microbatch(0, k)
        times.append(time.perf_counter() - tick)
    return {"open_ms": opened * 1e3, "first_ms": first * 1e3, "k_ms": statistics.median(times) * 1e3,
            "k_max_ms": max(times) * 1e3, "rss_before_mb": before, "peak_mb": peak_mb()}


def child_explain(spec: dict) -> dict:
    """``plan explain`` of ``--draws`` random steps at world size ``spec["explain"]``, the folder opened once."""
    import numpy as np

    import umlos_cuda.batching.plans.kinds  # noqa: F401  (the registry's imports, out of the open's time)
    from umlos_cuda.batching.plans.explain import StepExplainer, total_steps

    load_before = os.getloadavg()
    started = time.perf_counter()
    explainer = StepExplainer.open(spec["plan"])
    opened = time.perf_counter() - started
    world = spec["explain"]
    steps = total_steps(explainer.plan, world)
    times, rows, drawn = [], 0, []
    for step in np.random.default_rng(4).integers(0, steps, spec["draws"]).tolist():
        tick = time.perf_counter()
        report = explainer.explain(step, world_size=world)
        times.append(time.perf_counter() - tick)
        rows += sum(len(unit["rows"]) for rank in report["steps"][0]["ranks"] for unit in rank["units"])
        drawn.append(report["steps"][0])
    return {"open_ms": opened * 1e3, "steps": steps, "median_ms": statistics.median(times) * 1e3,
            "max_ms": max(times) * 1e3, "rows_per_step": rows / len(times), "load_before": load_before,
            "load_after": os.getloadavg(), "peak_mb": peak_mb(), **step_records(explainer.plan.fingerprint, drawn)}


def step_records(fingerprint: str, drawn: list[dict], repeat: int = 20) -> dict:
    """What a training loop adds per step to record it on the tape: ``step_record`` (the digest of the step's units,
    the rows each rank trained) of each drawn step, and its append to a checkpoint store's tape, committed (a
    temporary store in this folder's temp dir), in microseconds per step."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
    from test_checkpoint_support import DATASET, KEY, identity

    from umlos_cuda.batching.plans.checkpoint_kinds import PlanCursor  # noqa: F401  (registers plan.step)
    from umlos_cuda.batching.plans.explain import step_record, unit_rows
    from umlos_cuda.checkpoint import CheckpointStore

    steps = [(step["epoch"], [(unit["index"], unit_rows(unit)) for rank in step["ranks"] for unit in rank["units"]])
             for step in drawn]
    tick = time.perf_counter()
    records = [step_record(t, fingerprint, epoch, units) for t in range(repeat) for epoch, units in steps]
    made = (time.perf_counter() - tick) / len(records)
    folder = tempfile.mkdtemp(prefix="bench-tape-")
    try:
        with CheckpointStore.open(os.path.join(folder, "store"), identity(), KEY) as store:
            store.start_run(DATASET, world_size=1, task_type="training")
            tick = time.perf_counter()
            for record in records:
                store.tape.append(record)
            store.commit()
            appended = (time.perf_counter() - tick) / len(records)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {"record_us": made * 1e6, "append_us": appended * 1e6, "records": len(records)}


def child_verify(spec: dict) -> dict:
    from umlos_cuda.batching.plans.windows import verify_windowed_plan

    started = time.perf_counter()
    report = verify_windowed_plan(spec["plan"], windows=8, seed=3)
    return {"verify_s": time.perf_counter() - started, "windows_checked": report["windows_checked"],
            "peak_mb": peak_mb()}


def child_compare(spec: dict) -> dict:
    import numpy as np

    from umlos_cuda.batching.plans.planner import build_epoch
    from umlos_cuda.batching.plans.windows import MappedLengths, WindowDefinition, WindowedPlan

    source = MappedLengths(spec["lengths"])
    started = time.perf_counter()
    whole = build_epoch(np.asarray(source.lengths), config(spec), 0)
    whole_s = time.perf_counter() - started
    plan = WindowedPlan.build(WindowDefinition(config(spec), source.count, spec["window"]), source)
    padded = int((np.diff(whole.offsets) * whole.max_len.astype(np.int64)).sum())
    return {"whole_s": whole_s, "whole_microbatches": int(whole.bucket_ids.shape[0]), "whole_padded": padded,
            "windowed_microbatches": plan.epoch_microbatches(0),
            "windowed_padded": plan.epoch_counts(0)["padded_tokens"], "peak_mb": peak_mb()}


def child_synthetic(spec: dict) -> dict:
    import numpy as np

    from umlos_cuda.batching.plans.windows import SyntheticLengths, WindowDefinition, count_window, plan_window

    before = rss_mb()
    n = spec["samples"]
    definition = WindowDefinition(config(spec), n, spec["window"])
    source = SyntheticLengths(n, 11)
    chosen = np.random.default_rng(2).integers(0, definition.num_windows, spec["probe"]).tolist()
    counting, planning = [], []
    for w in chosen:
        tick = time.perf_counter()
        count_window(definition, source, 0, w)
        counting.append(time.perf_counter() - tick)
        tick = time.perf_counter()
        plan_window(definition, source, 0, w)
        planning.append(time.perf_counter() - tick)
    per_window = statistics.mean(counting)
    return {"windows": definition.num_windows, "count_ms": per_window * 1e3,
            "count_median_ms": statistics.median(counting) * 1e3, "plan_ms": statistics.median(planning) * 1e3,
            "index_s": per_window * definition.num_windows, "rate": spec["window"] / per_window,
            "rss_before_mb": before, "peak_mb": peak_mb()}



def child_cli(spec: dict) -> dict:
    """``umlos-cuda ARGV`` in this fresh interpreter: its status, wall time, peak RSS and last output line."""
    import contextlib
    import io

    from umlos_cuda.cli import main

    before = rss_mb()
    out = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out):
        status = main(spec["argv"])
    wall = time.perf_counter() - started
    return {"status": status, "wall_s": wall, "rss_before_mb": before, "peak_mb": peak_mb(),
            "out": out.getvalue()}


def write_jsonl_cache(path: str, n: int, seed: int) -> float:
    """A length cache (JSONL and sidecar, line-number ids) of ``n`` synthetic lengths, written in chunks."""
    import numpy as np

    from umlos_cuda.batching.lengths.cache import LengthCacheWriter
    from umlos_cuda.batching.plans.windows import SyntheticLengths

    started = time.perf_counter()
    source = SyntheticLengths(n, seed)
    with LengthCacheWriter(path, hashlib.sha256(b"synthetic").hexdigest(), force=True) as writer:
        for start in range(0, n, 1 << 22):
            writer.add(None, source.take(np.arange(start, min(n, start + (1 << 22)), dtype=np.uint64)))
    return time.perf_counter() - started


def cli_build_argv(lengths: str, plan: str, spec: dict) -> list[str]:
    """``plan build --window`` with the bench's config (as :func:`config`, through the options)."""
    return ["plan", "build", "--lengths", lengths, "--bucket-edges", "128,256,512,1024,2048", "--overflow-max",
            "4096", "--token-budget", "16384", "--pad-policy", "pad_to_max", "--seed", "42", "--order",
            spec["order"], "--window", str(spec["window"]), "--quiet", "--force", "--output", plan]


def microbatches_printed(out: str) -> int:
    """The microbatch count ``plan build --window`` prints (``..., N microbatches, ...``)."""
    return int(out.split(" microbatches")[0].rsplit(" ", 1)[1])


CHILDREN = {"build": child_build, "open": child_open, "verify": child_verify, "compare": child_compare,
            "synthetic": child_synthetic, "cli": child_cli, "explain": child_explain}


def child(spec: dict) -> dict:
    env = dict(os.environ)
    if spec.get("threads"):
        env["OMP_NUM_THREADS"] = str(spec["threads"])
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"child {spec['kind']} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", default="10000000,100000000")
    parser.add_argument("--window", type=int, default=1 << 16)
    parser.add_argument("--order", default="block_affine")
    parser.add_argument("--draws", type=int, default=100)
    parser.add_argument("--folder", default=None, help="where the sidecars and plans go (kept; default: a temp dir)")
    parser.add_argument("--compare", action="store_true")
    parser.add_argument("--synthetic", type=int, default=0, help="probe windows of an epoch of this many samples")
    parser.add_argument("--probe", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1,
                        help="OMP_NUM_THREADS of the children (default 1; 0: leave it as it is)")
    parser.add_argument("--cli", action="store_true", help="also time the command line over each sidecar")
    parser.add_argument("--jsonl", default="", help="sizes of JSONL length caches to time plan build --window on")
    parser.add_argument("--explain", type=int, default=0, metavar="W",
                        help="also time plan explain of --draws random steps at world size W")
    parser.add_argument("--child", default=None)
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(CHILDREN[spec["kind"]](spec)))
        return
    folder = args.folder or tempfile.mkdtemp(prefix="bench-windowed-")
    os.makedirs(folder, exist_ok=True)
    base = {"window": args.window, "order": args.order, "draws": args.draws, "threads": args.threads}
    print(f"window {args.window}, order {args.order}, throughput buckets 128..2048, overflow 4096, budget 16384, "
          f"OMP_NUM_THREADS {args.threads or os.environ.get('OMP_NUM_THREADS', 'unset')}")
    print("| samples | write sidecar s | index build s | samples/s | peak RSS MB (rise) | anon MB | plan KB | "
          "open ms | microbatch 0 ms | microbatch k ms (median, max) | verify 8 windows s (peak RSS MB) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    sizes = [int(s) for s in args.samples.split(",") if s]
    cli_rows: list[str] = []
    explain_rows: list[str] = []
    for n in sizes:
        lengths = os.path.join(folder, f"lengths_{n}.jsonl.u32")
        written = write_sidecar(lengths, n, 5) if not os.path.exists(lengths) else 0.0
        spec = base | {"lengths": lengths, "plan": os.path.join(folder, f"plan_{n}")}
        built = child(spec | {"kind": "build"})
        opened = child(spec | {"kind": "open"})
        checked = child(spec | {"kind": "verify"})
        rise = built["peak_mb"] - built["rss_before_mb"]
        print(f"| {n:,} | {written:.1f} | {built['build_s']:.2f} | {built['rate']:.3g} | {built['peak_mb']:.0f} "
              f"(+{rise:.0f}) | {built['anon_mb']:.0f} | {built['plan_bytes'] / 1024:.1f} | {opened['open_ms']:.1f} | "
              f"{opened['first_ms']:.1f} | {opened['k_ms']:.2f}, {opened['k_max_ms']:.1f} | "
              f"{checked['verify_s']:.2f} ({checked['peak_mb']:.0f}) |", flush=True)
        print(f"<!-- {n}: {json.dumps({'build': built, 'open': opened, 'verify': checked})} -->", flush=True)
        if args.explain:
            told = child(spec | {"kind": "explain", "explain": args.explain})
            load = f"{told['load_before'][0]:.1f} / {told['load_after'][0]:.1f}"
            explain_rows.append(f"| {n:,} | {args.explain} | {told['steps']:,} | {told['open_ms']:.1f} | "
                                f"{told['rows_per_step']:.0f} | {told['median_ms']:.1f} | {told['max_ms']:.1f} | "
                                f"{load} | {told['peak_mb']:.0f} | {told['record_us']:.0f} | "
                                f"{told['append_us']:.0f} |")
        if args.cli:
            cli_plan = os.path.join(folder, f"cli_plan_{n}")
            cli = child(base | {"kind": "cli", "argv": cli_build_argv(lengths, cli_plan, base)})
            verify = child(base | {"kind": "cli", "argv": ["plan", "verify", cli_plan, "--windows", "8", "--seed",
                                                            "3"]})
            if cli["status"] or verify["status"]:
                raise SystemExit(f"the command line failed: {cli['out']}{verify['out']}")
            cli_rows.append(f"| {n:,} | .u32 | {os.path.getsize(lengths) / 1e9:.2f} | {cli['wall_s']:.2f} | "
                            f"{n / cli['wall_s']:.3g} | {cli['peak_mb']:.0f} | {verify['wall_s']:.2f} "
                            f"({verify['peak_mb']:.0f}) | {microbatches_printed(cli['out']):,} |")
            shutil.rmtree(cli_plan, ignore_errors=True)
    for n in [int(s) for s in args.jsonl.split(",") if s]:
        cache = os.path.join(folder, f"cache_{n}.jsonl")
        written = write_jsonl_cache(cache, n, 5) if not os.path.exists(cache) else 0.0
        cli_plan = os.path.join(folder, f"cli_jsonl_plan_{n}")
        cli = child(base | {"kind": "cli", "argv": cli_build_argv(cache, cli_plan, base)})
        if cli["status"]:
            raise SystemExit(f"the command line failed: {cli['out']}")
        cli_rows.append(f"| {n:,} | JSONL (written in {written:.0f} s) | {os.path.getsize(cache) / 1e9:.2f} | "
                        f"{cli['wall_s']:.2f} | {n / cli['wall_s']:.3g} | {cli['peak_mb']:.0f} | - | "
                        f"{microbatches_printed(cli['out']):,} |")
        shutil.rmtree(cli_plan, ignore_errors=True)
        if not args.folder:
            os.unlink(cache)
            os.unlink(cache + ".u32")
    if explain_rows:
        print(f"\nplan explain, a fresh interpreter each: the folder opened once, {args.draws} random steps, every "
              "rank of each")
        print("| samples | world size | steps | open ms | rows a step | explain ms, median | largest | "
              "load average 1 min (before / after) | peak RSS MB | step record us | tape append us |")
        print("|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|")
        print("\n".join(explain_rows), flush=True)
    if cli_rows:
        print("\ncommand line, a fresh interpreter each: `plan build --window` (check, map, index, write), "
              "`plan verify --windows 8`")
        print("| samples | --lengths | input GB | plan build s | samples/s | peak RSS MB | verify s (peak MB) | "
              "microbatches |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|")
        print("\n".join(cli_rows), flush=True)
    if args.compare and sizes:
        n = sizes[0]
        spec = base | {"lengths": os.path.join(folder, f"lengths_{n}.jsonl.u32"), "kind": "compare"}
        result = child(spec)
        extra = result["windowed_microbatches"] - result["whole_microbatches"]
        share = 100 * extra / result["whole_microbatches"]
        print(f"\nflush at {n:,} samples: {result['windowed_microbatches']:,} microbatches against "
              f"{result['whole_microbatches']:,} whole-epoch (+{extra}, {share:.3f} %); "
              f"padded tokens {result['windowed_padded']:,} against {result['whole_padded']:,} "
              f"({100 * (result['windowed_padded'] / result['whole_padded'] - 1):+.4f} %); whole-epoch build "
              f"{result['whole_s']:.1f} s, peak {result['peak_mb']:.0f} MB")
    if args.synthetic:
        result = child(base | {"kind": "synthetic", "samples": args.synthetic, "probe": args.probe})
        print(f"\nsynthetic {args.synthetic:,} samples, {result['windows']:,} windows: counting a window "
              f"{result['count_ms']:.1f} ms (median {result['count_median_ms']:.1f}), planning one "
              f"{result['plan_ms']:.1f} ms, {result['rate']:.3g} samples/s; the index pass extrapolated: "
              f"{result['index_s'] / 60:.0f} min; peak RSS {result['peak_mb']:.0f} MB "
              f"(+{result['peak_mb'] - result['rss_before_mb']:.0f})")
    if not args.folder:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
