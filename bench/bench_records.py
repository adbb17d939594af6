"""Reading training records from Parquet: length build and tokenization, beside pyarrow and the tokenizer alone.

Two tables, each measured side by side in one run on the same files:

(a) ``data lengths build --length-field`` from a Parquet dataset of N rows
    holding a text column and an integer token-count column: the time to read
    the count column with pyarrow alone (``ParquetFile.iter_batches`` over that
    column, to NumPy), the records reader alone (the same column through
    umlos_cuda/batching/records/, checked and fingerprinted), and the whole
    build (reader, fingerprint and the length cache written). MB/s is the
    Parquet file's size over the time (what a user waits for per byte of
    dataset); MB/s of the column is its 8 bytes a row over the time.
(b) ``data tokenize`` (``tokenize_dataset``) from a Parquet text column
    beside the tokenizer's own ``encode_batch`` (and ``encode_batch_fast``,
    which the builder calls) on the same texts already in memory, all at
    once and 4096 texts a call (the builder's chunk); tokens/s and the ratio
    (the goal is within 1.2x of ``encode_batch``).

The tokenizer is a small byte-level BPE trained here with ``tokenizers`` on
a sample of the texts; everything is local and deterministic. Each timing
is the best of ``--repeat`` runs.

    python bench/bench_records.py [--rows 1000000] [--tokenize-rows 200000] [--folder DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time

from bench_lengths import train_tokenizer  # the same BPE tokenizer as the length-cache bench (bench/ is on sys.path)


def make_texts(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    syllables = [a + b for a in "bcdfghjklmnprstvwz" for b in "aeiou"] + ["th", "ng", "st", "qu"]
    lexicon = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(5000)]
    weights = [1 / (rank + 1) for rank in range(len(lexicon))]  # Zipf-like word frequencies
    base = [" ".join(rng.choices(lexicon, weights, k=max(1, int(rng.lognormvariate(4.0, 0.8))))) + "."
            for _ in range(min(count, 20_000))]
    return [base[i % len(base)] if i < len(base) else base[(i * 7919) % len(base)] for i in range(count)]


def best(repeat: int, run, before=None) -> float:
    times = []
    for _ in range(repeat):
        if before is not None:
            before()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def table(title: str, header: tuple[str, ...], rows: list[tuple]) -> None:
    print(f"\n{title}")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in row) + " |")


def bench_lengths(folder: str, rows: int, repeat: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from umlos_cuda.batching import build_lengths
    from umlos_cuda.batching.records import Field, Records

    texts = make_texts(rows)
    counts = np.fromiter((len(t) // 4 + 1 for t in texts), dtype=np.int64, count=rows)
    path = os.path.join(folder, "train.parquet")
    pq.write_table(pa.table({"text": texts, "n_tokens": counts}), path, row_group_size=128 * 1024)
    del texts
    size = os.path.getsize(path)

    def pyarrow_alone() -> None:
        total = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=4096, columns=["n_tokens"]):
            total += int(batch.column(0).to_numpy().sum())
        assert total == int(counts.sum())

    def reader_alone() -> None:
        records = Records(path, (Field("n_tokens", "integer", "length"),))
        total = sum(int(chunk.values[0].sum()) for chunk in records.chunks(4096))
        records.fingerprint("unknown")
        assert total == int(counts.sum())

    out = os.path.join(folder, "lengths.jsonl")

    def clear() -> None:
        for name in (out, out + ".u32"):
            if os.path.exists(name):
                os.unlink(name)

    def build() -> None:
        build_lengths(path, None, out, length_field="n_tokens")

    results = [("pyarrow alone (iter_batches, one column)", best(repeat, pyarrow_alone)),
               ("records reader (checked, fingerprinted)", best(repeat, reader_alone)),
               ("data lengths build --length-field (cache written)", best(repeat, build, clear))]
    base = results[0][1]
    table(f"(a) length build from Parquet, {rows:,} rows, file {size / 1e6:.1f} MB (text + n_tokens columns)",
          ("path", "seconds", "rows/s", "MB/s of the file", "MB/s of the column", "x pyarrow"),
          [(name, f"{t:.3f}", f"{rows / t:,.0f}", f"{size / t / 1e6:,.0f}", f"{8 * rows / t / 1e6:,.1f}",
            f"{t / base:.1f}") for name, t in results])


def bench_tokenize(folder: str, rows: int, vocab: int, repeat: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from umlos_cuda.batching.tokens.writer import tokenize_dataset

    texts = make_texts(rows, seed=1)
    tokenizer = train_tokenizer(texts[:5000], vocab)
    model = os.path.join(folder, "model")
    os.makedirs(model, exist_ok=True)
    tokenizer.save(os.path.join(model, "tokenizer.json"))
    path = os.path.join(folder, "texts.parquet")
    pq.write_table(pa.table({"text": texts}), path, row_group_size=64 * 1024)
    tokens = sum(len(e) for e in tokenizer.encode_batch_fast(texts))
    store = os.path.join(folder, "store")

    def clear() -> None:
        shutil.rmtree(store, ignore_errors=True)

    def chunked(encode) -> None:
        for start in range(0, len(texts), 4096):
            encode(texts[start:start + 4096])

    results = [("tokenizer.encode_batch (texts in memory)", best(repeat, lambda: tokenizer.encode_batch(texts))),
               ("tokenizer.encode_batch_fast (texts in memory)",
                best(repeat, lambda: tokenizer.encode_batch_fast(texts))),
               ("tokenizer.encode_batch, 4096 texts a call", best(repeat, lambda: chunked(tokenizer.encode_batch))),
               ("tokenizer.encode_batch_fast, 4096 texts a call",
                best(repeat, lambda: chunked(tokenizer.encode_batch_fast))),
               ("data tokenize from Parquet (store written)",
                best(repeat, lambda: tokenize_dataset(path, model, store), clear))]
    base = results[0][1]
    table(f"(b) tokenization from Parquet, {rows:,} texts, {tokens:,} tokens, BPE vocab {vocab}, "
          f"{os.cpu_count()} cores", ("path", "seconds", "tokens/s", "x encode_batch"),
          [(name, f"{t:.3f}", f"{tokens / t:,.0f}", f"{t / base:.2f}") for name, t in results])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the length-build dataset")
    parser.add_argument("--tokenize-rows", type=int, default=200_000, help="texts of the tokenization dataset")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--folder", default=None)
    parser.add_argument("--only", choices=("lengths", "tokenize"), help="run one of the two tables")
    args = parser.parse_args()
    folder = args.folder or tempfile.mkdtemp(prefix="bench-records-")
    try:
        if args.only != "tokenize":
            bench_lengths(folder, args.rows, args.repeat)
        if args.only != "lengths":
            bench_tokenize(folder, args.tokenize_rows, args.vocab, args.repeat)
    finally:
        if args.folder is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
