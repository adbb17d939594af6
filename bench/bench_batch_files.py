"""Batch file sizes per layout, and the reader against a bare read, side by side.

Builds a realistic token store with ``tokenize_dataset`` (the path of
``umlos-cuda data tokenize``): N prompt/response records of lognormal word
counts over a Zipf-weighted lexicon of pseudo-words, a byte-level BPE
tokenizer trained on them (``--vocab``, 8,000 by default: uint16 ids), ids
``train_NNNNNNN``. Plans 2 epochs over it (predictable: edges 128..1024,
overflow 2048, token budget 16384), then for each layout (``npz``, the six
int32 arrays; ``compact``; ``compact`` + zstd; ``index``, no files: the
reader collates from the store) writes the batch files and
reports their bytes per epoch against the store's bytes (every file of the
store folder), and times reading epoch 0:

* ``BatchReader.iter_epoch(0)``: every microbatch as the dict of the six
  int32 ``[rows, width]`` arrays and the plan's fields, decoded;
* the bare read: ``dict(numpy.load(path))`` of each file of the ``npz``
  layout (the same six arrays and fields, with nothing checked or decoded:
  what a training loop without this package would do with those files);
* for the compact layouts, also ``dict(numpy.load(path))`` of each compact
  file (its members as stored, not decoded: not the same arrays, a floor).

Reads are from the page cache, best of ``--repeat`` alternating rounds.

    python bench/bench_batch_files.py [--samples 20000] [--vocab 8000] [--repeat 3] [--folder DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_lengths import train_tokenizer  # bench/ is not a package

LAYOUTS = (("npz", "npz", None), ("compact", "compact", None), ("compact+zstd", "compact", "zstd"),
           ("index", "index", None))


def make_dataset(path: str, samples: int, seed: int = 0) -> list[str]:
    """Prompt/response records (the loss mask is 0 on the prompt): lognormal word counts."""
    rng = random.Random(seed)
    syllables = [a + b for a in "bcdfghjklmnprstvwz" for b in "aeiou"] + ["th", "ng", "st", "qu"]
    lexicon = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(5000)]
    weights = [1 / (rank + 1) for rank in range(len(lexicon))]
    texts = []
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(samples):
            prompt = " ".join(rng.choices(lexicon, weights, k=max(1, int(rng.lognormvariate(3.5, 0.8))))) + "?"
            response = " ".join(rng.choices(lexicon, weights, k=max(1, int(rng.lognormvariate(4.3, 0.8))))) + "."
            handle.write(json.dumps({"id": f"train_{i:07d}", "prompt": prompt, "response": response}) + "\n")
            if i < 5000:
                texts.append(prompt + " " + response)
    return texts


def folder_bytes(path: str, prefix: str = "") -> int:
    total = 0
    for base, _, names in os.walk(path):
        if os.path.basename(base) == "plan" or "/plan/" in base + "/":
            continue
        total += sum(os.path.getsize(os.path.join(base, n)) for n in names if n.startswith(prefix))
    return total


def best_of(repeat: int, *functions) -> list[float]:
    best = [float("inf")] * len(functions)
    for _ in range(repeat):
        for k, function in enumerate(functions):
            start = time.perf_counter()
            function()
            best[k] = min(best[k], time.perf_counter() - start)
    return best


def bare(paths: list[str]):
    def read() -> None:
        for path in paths:
            with np.load(path) as archive:
                dict(archive)
    return read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--folder", default=None)
    args = parser.parse_args()
    from umlos_cuda.batching import BatchingConfig, BatchPlanBuilder, save_plan
    from umlos_cuda.batching.batches.reader import BatchReader
    from umlos_cuda.batching.batches.writer import BatchWriter
    from umlos_cuda.batching.tokens.writer import tokenize_dataset

    folder = args.folder or tempfile.mkdtemp(prefix="bench-batch-files-")
    os.makedirs(folder, exist_ok=True)
    dataset = os.path.join(folder, "train.jsonl")
    tokenizer = train_tokenizer(make_dataset(dataset, args.samples), args.vocab)
    store_dir = os.path.join(folder, "store")
    store = tokenize_dataset(dataset, tokenizer, store_dir, prompt_field="prompt", response_field="response",
                             eos_token="</s>", force=True)
    store_bytes = folder_bytes(store_dir)
    config = BatchingConfig.predictable(16384, (128, 256, 512, 1024), 2048, seed=1)
    plan = BatchPlanBuilder(store.length_cache(), config).build(2)
    save_plan(plan, os.path.join(folder, "plan"), force=True)
    epoch0 = list(plan.iter_epoch(0))
    padded = sum(len(mb.samples) * mb.max_len for mb in epoch0)
    print(f"{args.samples} samples, {store.num_tokens / 1e6:.2f} M tokens ({store.meta['token_dtype']}, vocabulary "
          f"{store.vocab_size}), store {store_bytes / 2**20:.1f} MiB ({store_bytes / store.num_tokens:.2f} B/token); "
          f"2 epochs of {len(epoch0)} microbatches, {padded / store.num_tokens:.2f}x padded; {os.cpu_count()} CPUs")
    print("| Layout | Write s | MiB per epoch | x store per epoch | BatchReader s | bare npz read s | ratio | "
          "bare read of its own members s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    npz_paths: list[str] = []
    for label, layout, compression in LAYOUTS:
        out = os.path.join(folder, f"batches-{label}")
        shutil.rmtree(out, ignore_errors=True)
        start = time.perf_counter()
        BatchWriter(plan, out, store, workers=args.workers, layout=layout, compression=compression).write_all()
        written = time.perf_counter() - start
        per_epoch = folder_bytes(out, "epoch_") / 2
        reader = BatchReader(out, store=store)
        paths = [reader.path(0, mb.index) for mb in epoch0] if layout != "index" else []
        if layout == "npz":
            npz_paths = paths

        def with_reader(reader=reader) -> None:
            for _ in reader.iter_epoch(0):
                pass

        functions = [with_reader, bare(npz_paths)]
        if layout == "compact" and compression is None:
            functions.append(bare(paths))
        times = best_of(args.repeat, *functions)
        own = f"{times[2]:.3f}" if len(times) > 2 else {"npz": "=", "index": "n/a (no files)"}.get(layout, "n/a (zstd)")
        print(f"| {label} | {written:.2f} | {per_epoch / 2**20:.1f} | {per_epoch / store_bytes:.2f} | "
              f"{times[0]:.3f} | {times[1]:.3f} | {times[0] / times[1]:.2f}x | {own} |")
        if layout != "npz":
            shutil.rmtree(out)  # keep the npz files for the bare read of the next layouts
    if args.folder is None:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
