"""``plan build`` end to end, from a length cache on disk to a plan folder, beside chuk-lazarus 0.4.1.

The job: N samples (default 10^6) with string ids ``train_0000000``, ...
and lognormal lengths (bench_batching.py's: median 245, sigma 1) sit in a
length cache; plan 2 epochs with token-budget buckets (edges 128 to 2048,
overflow 4096, budget 16384, pad to the bucket) and write the plan with its
JSONL. Rows, all timed in one run on the same files:

* ``ours CLI``: ``umlos-cuda plan build`` in a subprocess (interpreter
  start and imports included), from the cache with its ``.u32`` sidecar,
  from the same JSONL without it, and a packed plan (``--pack``, rows of
  2048 tokens) from the cache with its sidecar;
* ``ours API``: ``LengthCache.load(read_ids=True)`` +
  ``BatchPlanBuilder.build(2)`` + ``save_plan`` in this process;
* ``chuk``: chuk-lazarus 0.4.1 doing the same job from the same lengths:
  its length cache file (its header line, then rows byte for byte ours),
  read row by row with its own row parser ``LengthEntry.from_json`` (its
  ``LengthCache.load`` reads the same rows through ``aiofiles``, one thread
  hand-off per line, about 25 times slower here: ``--chuk-async`` times that
  too), its ``BatchPlanBuilder`` (``BatchingConfig.predictable``, the same
  edges, overflow and budget) for 2 epochs, and ``save_batch_plan`` (its
  meta.json and one JSONL per epoch). chuk-lazarus does not pack, so the
  packed row has no ratio.

Each row is the median of ``--repeat`` runs (chuk's: ``--chuk-repeat``),
after a garbage collection. chuk-lazarus's package imports MLX, so
``chuk_lazarus.data.batching`` is loaded under bare parent packages
(bench_batching.py); install it with ``pip install --no-deps
chuk-lazarus==0.4.1 pydantic aiofiles`` (and pydantic's own dependencies), a
benchmark-only dependency::

    python bench/bench_plan_build.py                 # 10^6 samples, 2 epochs
    python bench/bench_plan_build.py --samples 1e5 --repeat 1
    python bench/bench_plan_build.py --baseline ../before   # beside an earlier checkout
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_batching import load_chuk, lognormal_lengths

from umlos_cuda.batching import BatchingConfig, BatchPlanBuilder, LengthCache, save_plan

EDGES = (128, 256, 512, 1024, 2048)
OVERFLOW = 4096
BUDGET = 16384
SEED = 42
EPOCHS = 2
TOKENIZER_HASH = "ab" * 32


def make_files(folder: str, n: int) -> dict[str, str]:
    """Our cache with and without its sidecar, and chuk-lazarus's cache of the same rows."""
    lengths = lognormal_lengths(n)
    ids = [f"train_{i:07d}" for i in range(n)]
    ours = os.path.join(folder, "lengths.jsonl")
    LengthCache.from_arrays(ids, lengths, TOKENIZER_HASH).write(ours)
    bare = os.path.join(folder, "bare", "lengths.jsonl")
    os.makedirs(os.path.dirname(bare))
    shutil.copyfile(ours, bare)
    chuk = os.path.join(folder, "chuk_lengths.jsonl")
    with open(chuk, "wb") as out, open(ours, "rb") as rows:
        # chuk-lazarus's LengthCache writes this header line, then json.dumps(LengthEntry.model_dump()) per row,
        # which are our rows byte for byte (checked below on the first row).
        out.write((json.dumps({"tokenizer_hash": TOKENIZER_HASH, "version": 1}) + "\n").encode())
        shutil.copyfileobj(rows, out)
    return {"ours": ours, "bare": bare, "chuk": chuk}


def cli_args(lengths: str, output: str, packed: bool) -> list[str]:
    common = ["plan", "build", "--lengths", lengths, "--token-budget", str(BUDGET), "--epochs", str(EPOCHS),
              "--seed", str(SEED), "--output", output, "--force", "--quiet"]
    if packed:
        return common + ["--pack", "--pack-max-len", "2048"]
    return common + ["--bucket-edges", ",".join(map(str, EDGES)), "--overflow-max", str(OVERFLOW)]


def run_cli(lengths: str, output: str, packed: bool = False, checkout: str | None = None) -> float:
    """Seconds of ``umlos-cuda plan build`` in a subprocess (of the package in ``checkout`` when given)."""
    command = [sys.executable, "-c", "import sys; from umlos_cuda.cli import main; sys.exit(main())",
               *cli_args(lengths, output, packed)]
    # As an installed package runs: its modules compiled once (the warm-up run writes their .pyc files).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if checkout is not None:
        env["PYTHONPATH"] = checkout
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env, cwd=checkout)  # ("-c" imports from cwd)
    return time.perf_counter() - start


def run_api(lengths: str, output: str) -> float:
    gc.collect()
    start = time.perf_counter()
    cache = LengthCache.load(lengths, read_ids=True)
    config = BatchingConfig.predictable(BUDGET, EDGES, OVERFLOW, seed=SEED)
    plan = BatchPlanBuilder(cache, config).build(EPOCHS)
    save_plan(plan, output, force=True)
    return time.perf_counter() - start


def chuk_load_rows(batching, path: str):
    """chuk-lazarus's LengthCache.load without aiofiles: the same header and rows, parsed by its LengthEntry."""
    from chuk_lazarus.data.batching.generation.length_cache import LengthCache as ChukCache, LengthEntry

    entries = {}
    with open(path) as handle:
        header = json.loads(handle.readline())
        for line in handle:
            if line.strip():
                entry = LengthEntry.from_json(line)
                entries[entry.sample_id] = entry.length
    return ChukCache(path, header["tokenizer_hash"], entries)


def chuk_load_async(batching, path: str):
    from chuk_lazarus.data.batching.generation.length_cache import LengthCache as ChukCache

    return asyncio.run(ChukCache.load(path))


def run_chuk(batching, lengths: str, output: str, load) -> float:
    from chuk_lazarus.data.batching.planning.batch_plan import save_batch_plan

    gc.collect()
    start = time.perf_counter()
    cache = load(batching, lengths)
    config = batching.BatchingConfig.predictable(token_budget=BUDGET, bucket_edges=EDGES, overflow_max=OVERFLOW,
                                                 seed=SEED)
    builder = batching.BatchPlanBuilder(lengths=cache.get_all(), batching_config=config, dataset_hash="d",
                                        tokenizer_hash=cache.tokenizer_hash)
    plan = asyncio.run(builder.build(num_epochs=EPOCHS))
    shutil.rmtree(output, ignore_errors=True)
    save_batch_plan(plan, output)
    return time.perf_counter() - start


def check_same_rows(batching, files: dict[str, str]) -> None:
    from chuk_lazarus.data.batching.generation.length_cache import LengthEntry

    with open(files["ours"]) as ours, open(files["chuk"]) as chuk:
        chuk.readline()
        first = ours.readline()
        assert chuk.readline() == first
        entry = LengthEntry.from_json(first)
        assert LengthEntry(sample_id=entry.sample_id, tokenizer_hash=entry.tokenizer_hash,
                           length=entry.length).to_json() + "\n" == first


def median(function, repeat: int, *args) -> float:
    return statistics.median(function(*args) for _ in range(repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=float, default=1e6, help="N (default 1e6)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each of our rows (median; default 3)")
    parser.add_argument("--chuk-repeat", type=int, default=1, help="runs of chuk-lazarus's row (default 1)")
    parser.add_argument("--chuk-async", action="store_true",
                        help="also time chuk-lazarus's own async LengthCache.load (minutes at 10^6)")
    parser.add_argument("--folder", help="keep the files here (default: a temporary folder)")
    parser.add_argument("--baseline", metavar="CHECKOUT",
                        help="also time the CLI rows with the package of this checkout (an earlier commit), "
                        "interleaved with ours: a before/after under the same load")
    args = parser.parse_args()
    n = int(args.samples)
    folder = args.folder or tempfile.mkdtemp(prefix="bench-plan-build-")
    os.makedirs(folder, exist_ok=True)
    batching = load_chuk()
    try:
        files = make_files(folder, n)
        out = os.path.join(folder, "out")
        os.makedirs(out, exist_ok=True)
        run_cli(files["ours"], os.path.join(out, "warm"))  # page cache and .pyc files, outside the timings
        checkouts = [(None, "ours")]
        if args.baseline:
            run_cli(files["ours"], os.path.join(out, "warm"), False, args.baseline)
            checkouts.append((args.baseline, "baseline"))
        rows = []
        for name, lengths, packed in (("CLI, cache + sidecar", files["ours"], False),
                                      ("CLI, JSONL only", files["bare"], False),
                                      ("CLI, packed (--pack)", files["ours"], True)):
            runs: dict[str | None, list[float]] = {checkout: [] for checkout, _ in checkouts}
            for _ in range(args.repeat):  # interleaved, so that both see the same load
                for checkout, _ in checkouts:
                    runs[checkout].append(run_cli(lengths, os.path.join(out, "cli"), packed, checkout))
            rows += [(f"{label} {name}", statistics.median(runs[checkout])) for checkout, label in checkouts]
        rows.insert(len(checkouts) * 2, ("ours API, cache + sidecar",
                                         median(run_api, args.repeat, files["ours"], os.path.join(out, "api"))))
        chuk = None
        if batching is None:
            print("chuk-lazarus is not installed: no ratios "
                  "(pip install --no-deps chuk-lazarus==0.4.1 pydantic aiofiles)")
        else:
            check_same_rows(batching, files)
            chuk = median(run_chuk, args.chuk_repeat, batching, files["chuk"], os.path.join(out, "chuk"),
                          chuk_load_rows)
            if args.chuk_async:
                seconds = run_chuk(batching, files["chuk"], os.path.join(out, "chuk_async"), chuk_load_async)
                rows.append(("chuk, its async LengthCache.load", seconds))
        print(f"plan build end to end: {n:,} samples with string ids, {EPOCHS} epochs, edges {EDGES}, "
              f"overflow {OVERFLOW}, budget {BUDGET}; median of {args.repeat} (chuk-lazarus: {args.chuk_repeat})")
        print("| what | seconds | samples x epochs / s | chuk-lazarus 0.4.1 s | ratio |")
        print("|---|---:|---:|---:|---:|")
        for name, seconds in rows:
            theirs = ratio = "—"
            if chuk is not None and not name.startswith("chuk") and "packed" not in name:
                theirs, ratio = f"{chuk:.2f}", f"{chuk / seconds:.1f}x"
            print(f"| {name} | {seconds:.2f} | {n * EPOCHS / seconds:,.0f} | {theirs} | {ratio} |")
    finally:
        if args.folder is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
