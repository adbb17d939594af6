"""Throughput of collation, batch files and the batch reader.

Writes a token source of N samples with lognormal lengths (a Megatron-LM
indexed dataset of random uint16 ids, written directly: no tokenizer
needed), builds a predictable plan over it (edges 128..2048, budget 16384),
then times, over epoch 0:

* ``collate``: ``collate_microbatch`` for every microbatch (tokens/s, real
  and padded);
* ``BatchWriter.write_all`` in the ``npz`` layout, the six int32 arrays
  (files/s, tokens/s; bench/bench_batch_files.py compares the layouts);
* reading the epoch back: ``BatchReader.iter_epoch`` against a loop of
  ``dict(numpy.load(path))`` over the same files (tokens/s, and the ratio:
  what the reader costs beyond the read).

Each read is timed best of ``--repeat`` runs, alternating the two, with the
files in the page cache (the second run onward). Everything is local and
deterministic; the folder defaults to a temporary one.

    python bench/bench_collate.py [--samples 20000] [--workers N] [--repeat 3] [--folder DIR]
"""

from __future__ import annotations

import argparse
import os
import struct
import tempfile
import time

import numpy as np


def documents(rng: np.random.Generator, samples: int) -> tuple[np.ndarray, np.ndarray]:
    """The benches' corpus: ``samples`` documents of log-normal lengths in [1, 2048] (a median of about 200
    tokens) and their uint16 ids below 32,000, drawn from ``rng`` (lengths first, then ids)."""
    lengths = np.clip(rng.lognormal(5.3, 0.8, samples).astype(np.int64), 1, 2048)
    return lengths, rng.integers(0, 32000, int(lengths.sum()), dtype=np.uint16)


def write_source(prefix: str, samples: int, seed: int = 0) -> np.ndarray:
    """A Megatron indexed dataset (uint16 ids) of lognormal lengths in [1, 2048]."""
    lengths, tokens = documents(np.random.default_rng(seed), samples)
    tokens.tofile(prefix + ".bin")
    pointers = np.concatenate(([0], np.cumsum(lengths)[:-1])) * 2
    with open(prefix + ".idx", "wb") as handle:
        handle.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, samples, samples + 1))
        handle.write(lengths.astype(np.int32).tobytes() + pointers.astype(np.int64).tobytes())
        handle.write(np.arange(samples + 1, dtype=np.int64).tobytes())
    return lengths


def best_of(repeat: int, *functions) -> list[float]:
    """Best seconds of each function over ``repeat`` alternating rounds."""
    best = [float("inf")] * len(functions)
    for _ in range(repeat):
        for k, function in enumerate(functions):
            start = time.perf_counter()
            function()
            best[k] = min(best[k], time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--folder", default=None)
    args = parser.parse_args()
    from umlos_cuda.batching import BatchingConfig, BatchPlanBuilder
    from umlos_cuda.batching.batches.reader import BatchReader
    from umlos_cuda.batching.batches.writer import BatchWriter
    from umlos_cuda.batching.collate import collate_microbatch
    from umlos_cuda.batching.tokens.megatron import MegatronDataset

    folder = args.folder or tempfile.mkdtemp(prefix="bench-collate-")
    os.makedirs(folder, exist_ok=True)
    prefix = os.path.join(folder, "corpus")
    write_source(prefix, args.samples)
    source = MegatronDataset.open(prefix)
    config = BatchingConfig.predictable(16384, (128, 256, 512, 1024), 2048, seed=1)
    plan = BatchPlanBuilder(source.length_cache(), config).build(1)
    microbatches = list(plan.iter_epoch(0))
    real = int(sum(int(np.asarray(source.lengths)[mb.rows].sum()) for mb in microbatches))
    padded = int(sum(len(mb.samples) * mb.max_len for mb in microbatches))
    print(f"{args.samples} samples, {real / 1e6:.1f} M tokens, {len(microbatches)} microbatches, "
          f"{padded / 1e6:.1f} M padded tokens, {os.cpu_count()} CPUs")

    (collate_s,) = best_of(args.repeat, lambda: [collate_microbatch(source, mb) for mb in microbatches])
    print(f"collate:      {collate_s:.3f} s, {real / collate_s / 1e6:7.1f} M tokens/s "
          f"({padded / collate_s / 1e6:.1f} M padded tokens/s, six int32 arrays)")

    out = os.path.join(folder, "batches")
    start = time.perf_counter()
    report = BatchWriter(plan, out, source, workers=args.workers, force=True, layout="npz").write_all()
    written = time.perf_counter() - start
    size = sum(os.path.getsize(os.path.join(out, n)) for n in os.listdir(out) if n.endswith(".npz"))
    print(f"BatchWriter:  {written:.3f} s, {report.files / written:7.0f} files/s, "
          f"{real / written / 1e6:.1f} M tokens/s, {size / 2**20:.0f} MiB ({report.written} written)")

    reader = BatchReader(out)
    paths = [reader.path(0, mb.index) for mb in microbatches]

    def with_reader():
        for _ in reader.iter_epoch(0):
            pass

    def with_numpy():
        for path in paths:
            with np.load(path) as archive:
                dict(archive)

    reader_s, numpy_s = best_of(args.repeat, with_reader, with_numpy)
    print(f"BatchReader:  {reader_s:.3f} s, {real / reader_s / 1e6:7.1f} M tokens/s")
    print(f"numpy.load:   {numpy_s:.3f} s, {real / numpy_s / 1e6:7.1f} M tokens/s "
          f"(the reader takes {reader_s / numpy_s:.2f}x the time of the bare read)")


if __name__ == "__main__":
    main()
