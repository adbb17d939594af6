"""Tokens/s of ``data tokenize --engine ray`` on a local two-worker Ray cluster, beside the single-machine path.

Generates a dataset of F JSONL files (bench_lengths.py's records and
tokenizer), then, in one run on this machine, times:

* ``tokenize_dataset``: the classic one-folder store, one process (the seed's path);
* ``tokenize_sharded``: the sharded store, one process, one file after the other;
* ``tokenize_on_ray``: the same sharded store written by the Ray Data job on
  tests/ray_cluster.py's local cluster (a head without CPUs, two worker nodes
  of one CPU each), timed from the job's call to its return: connecting to
  the cluster, starting the job's actors (each loads the tokenizer), the
  job, the adoption. Starting the cluster is printed apart.

Every store is checked: the Ray job's files equal ``tokenize_sharded``'s
byte for byte. Each path runs ``--repeats`` times, the three taking turns
(median and best printed). The tokenizer's own threads (Rust, on every core) run in every
path; on a machine of C cores the Ray job runs two tokenizers of C threads
each at once. Everything is local; the folder defaults to a temporary one.

    python bench/bench_tokenize_ray.py [--files 4] [--samples 20000] [--repeats 3] [--folder DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
sys.path.insert(0, os.path.dirname(HERE))

from bench_lengths import make_dataset, train_tokenizer  # noqa: E402  (bench/ and tests/ are put on sys.path above)
from ray_cluster import LocalRayCluster  # noqa: E402


def files_of(root: str) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(Path(root).rglob("*")) if path.is_file()}


def rotated(repeats: int, runs: dict[str, object]) -> dict[str, tuple[float, float, object]]:
    """``label -> (best, median seconds, last result)``, the runs taking turns (A B C A B C ...), so that
    a change in the machine's load over the run falls on every path alike."""
    seconds: dict[str, list[float]] = {label: [] for label in runs}
    results: dict[str, object] = {}
    for _ in range(repeats):
        for label, run in runs.items():
            start = time.perf_counter()
            results[label] = run()
            seconds[label].append(time.perf_counter() - start)
            print(f"  {label}: {seconds[label][-1]:.2f} s", flush=True)
    return {label: (min(s), statistics.median(s), results[label]) for label, s in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--samples", type=int, default=20_000, help="records per file")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--folder", default=None)
    args = parser.parse_args()
    import shutil

    from umlos_cuda.batching.tokens.distributed import tokenize_on_ray
    from umlos_cuda.batching.tokens.sharded import tokenize_sharded
    from umlos_cuda.batching.tokens.writer import tokenize_dataset

    folder = args.folder or tempfile.mkdtemp(prefix="bench-tokenize-ray-")
    os.makedirs(folder, exist_ok=True)
    paths = [os.path.join(folder, f"part-{i:05d}.jsonl") for i in range(args.files)]
    sample: list[str] = []
    for i, path in enumerate(paths):
        sample += make_dataset(path, args.samples, seed=i)
        with open(path, encoding="utf-8") as handle:  # no ids: rows get content ids, as Parquet shards do
            lines = [json.dumps({"text": json.loads(line)["text"]}) for line in handle]
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
    model = os.path.join(folder, "model")
    os.makedirs(model, exist_ok=True)
    train_tokenizer(sample[:5000], args.vocab).save(os.path.join(model, "tokenizer.json"))
    size = sum(os.path.getsize(path) for path in paths)
    print(f"{args.files} files x {args.samples} records, {size / 2**20:.1f} MiB, {os.cpu_count()} CPUs", flush=True)

    def out(name: str) -> str:
        return os.path.join(folder, name)

    def fresh(name: str) -> str:
        shutil.rmtree(out(name), ignore_errors=True)
        return out(name)

    start = time.perf_counter()
    with LocalRayCluster(workers=2) as cluster:
        print(f"local Ray cluster (head + 2 one-CPU worker nodes) started in {time.perf_counter() - start:.1f} s",
              flush=True)
        os.environ.update({name: cluster.env[name] for name in ("RAY_TMPDIR", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")})
        timings = rotated(args.repeats, {
            "classic": lambda: tokenize_dataset(paths, model, fresh("classic")),
            "sharded": lambda: tokenize_sharded(paths, model, fresh("sharded")),
            "ray": lambda: tokenize_on_ray(paths, model, fresh("ray"), address=cluster.address),
        })
    assert files_of(out("ray")) == files_of(out("sharded")), "the Ray job's store differs from tokenize_sharded's"
    tokens = timings["classic"][2].num_tokens
    assert timings["sharded"][2].num_tokens == timings["ray"][2].num_tokens == tokens
    sharded_s = timings["sharded"][1]
    print()
    print("| path | workers | seconds (median; best) | M tokens/s (median) | vs tokenize_sharded |")
    print("|---|---|---|---|---|")
    for key, label, workers in (("classic", "`tokenize_dataset` (classic store)", "1 process"),
                                ("sharded", "`tokenize_sharded` (`--sharded`)", "1 process"),
                                ("ray", "`tokenize_on_ray` (`--engine ray`)", "2 Ray worker nodes")):
        best, median, _ = timings[key]
        print(f"| {label} | {workers} | {median:.2f}; {best:.2f} | {tokens / median / 1e6:.2f} | "
              f"{sharded_s / median:.2f}x |")
    print(f"\n{tokens} tokens in {len(timings['ray'][2])} samples ({args.repeats} runs each, taking turns); "
          "the Ray store equals tokenize_sharded's byte for byte")


if __name__ == "__main__":
    main()
