"""``--workers``: tokens/s of ``data tokenize`` and ``data lengths build`` for N workers, side by side.

One run, the same JSONL dataset and tokenizer for every row of the table:
``tokenize_dataset`` and ``build_lengths`` with ``workers=1`` (one encoding
thread beside the reader, the path before ``--workers``) and ``workers=N``
for each N asked (N spawned processes), and, as the floors, the records
reader alone (JSON parsed, checked and fingerprinted: what stays in the main
process) and the tokenizer's ``encode_batch_fast`` on the texts in memory,
4096 a call, in this one process (``TOKENIZERS_PARALLELISM`` as set). The
outputs of every N are compared byte for byte before any time is printed.
The runs are interleaved (round r runs every path once, so load from other
jobs falls on all alike); each path keeps its best round, with the CPU
seconds it used in this process and in its workers (a measure of the work
that does not depend on the load). A timing includes starting the workers
(spawn, import, tokenizer load).

The tokenizer is a byte-level BPE trained here (bench/bench_lengths.py), the
texts Zipf-like words (bench/bench_records.py); everything is local.

    python bench/bench_tokenize_workers.py [--rows 200000] [--workers 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import resource
import shutil
import tempfile
import time

from bench_lengths import train_tokenizer  # bench/ is on sys.path when a script in it runs
from bench_records import make_texts, table


def timed(run) -> tuple[float, float]:
    """Wall seconds of ``run()`` and the CPU seconds it used, in this process and in the workers it waited for."""
    def used() -> float:
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    cpu, start = used(), time.perf_counter()
    run()
    return time.perf_counter() - start, used() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--workers", type=int, nargs="+", default=[2])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--folder", default=None)
    args = parser.parse_args()
    from umlos_cuda.batching import build_lengths
    from umlos_cuda.batching.lengths.workers import available_cores
    from umlos_cuda.batching.records import Records
    from umlos_cuda.batching.tokens.writer import tokenize_dataset

    folder = args.folder or tempfile.mkdtemp(prefix="bench-workers-")
    try:
        texts = make_texts(args.rows, seed=2)
        tokenizer = train_tokenizer(texts[:5000], args.vocab)
        model = os.path.join(folder, "model")
        os.makedirs(model, exist_ok=True)
        tokenizer.save(os.path.join(model, "tokenizer.json"))
        path = os.path.join(folder, "train.jsonl")
        with open(path, "w", encoding="utf-8") as handle:
            for i, text in enumerate(texts):
                handle.write(json.dumps({"id": f"doc-{i}", "text": text}) + "\n")
        tokens = sum(len(e) for e in tokenizer.encode_batch_fast(texts))

        def reader_alone() -> None:
            records = Records(path, ("text",))
            for _ in records.chunks(4096):
                pass
            records.fingerprint("h")

        def encode_alone() -> None:
            for start in range(0, len(texts), 4096):
                tokenizer.encode_batch_fast(texts[start:start + 4096])

        runs = {"records reader alone (JSON parsed, checked, fingerprinted)": (reader_alone, None),
                "encode_batch_fast alone, texts in memory, 4096 a call": (encode_alone, None)}
        outputs = {}
        for workers in [1, *args.workers]:
            store = os.path.join(folder, f"store-{workers}")
            cache = os.path.join(folder, f"lengths-{workers}.jsonl")

            def clear_store(store=store) -> None:
                shutil.rmtree(store, ignore_errors=True)

            def clear_cache(cache=cache) -> None:
                for name in (cache, cache + ".u32"):
                    if os.path.exists(name):
                        os.unlink(name)

            runs[f"data tokenize, --workers {workers}"] = (
                lambda w=workers, s=store: tokenize_dataset(path, model, s, workers=w), clear_store)
            runs[f"data lengths build, --workers {workers}"] = (
                lambda w=workers, c=cache: build_lengths(path, model, c, workers=w), clear_cache)
            outputs[workers] = (store, cache)
        # Interleaved: round r runs every path once, so a load that comes and goes (other jobs on the
        # machine) falls on all of them alike; each path keeps its best round.
        wall = {name: float("inf") for name in runs}
        cpu = {name: float("inf") for name in runs}
        for _ in range(args.repeat):
            for name, (run, before) in runs.items():
                if before is not None:
                    before()
                seconds, used = timed(run)
                if seconds < wall[name]:
                    wall[name], cpu[name] = seconds, used
        rows = [(name, wall[name], cpu[name]) for name in runs]
        store_1, cache_1 = outputs[1]
        for workers, (store, cache) in outputs.items():  # the same bytes, or no table
            names = sorted(os.listdir(store_1))
            assert names == sorted(os.listdir(store)), workers
            assert all(filecmp.cmp(os.path.join(store_1, n), os.path.join(store, n), shallow=False) for n in names)
            assert filecmp.cmp(cache_1, cache, shallow=False) and filecmp.cmp(cache_1 + ".u32", cache + ".u32",
                                                                              shallow=False)
        size = os.path.getsize(path)
        base = {name.split(",")[0]: t for name, t, _ in rows if name.endswith("--workers 1")}
        table(f"{args.rows:,} JSONL records ({size / 1e6:.1f} MB), {tokens:,} tokens, BPE vocab {args.vocab}, "
              f"{available_cores()} cores available, {time.strftime('%Y-%m-%d %H:%M')}",
              ("path", "seconds", "tokens/s", "x --workers 1", "CPU seconds (all processes)"),
              [(name, f"{t:.2f}", f"{tokens / t:,.0f}",
                f"{base[name.split(',')[0]] / t:.2f}" if name.split(",")[0] in base else "", f"{used:.2f}")
               for name, t, used in rows])
        print("\nevery file of the store and of the length cache is byte-identical for every --workers")
    finally:
        if args.folder is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
