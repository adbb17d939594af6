"""Sharded token stores: per-row read speed beside one store, and what adopting a shard costs.

Writes ``--samples`` rows (uint16 ids, lognormal lengths as in
bench/bench_collate.py, ids ``row-N``) as ``--shards`` classic token stores
and as one, in the classic format (tokens/store.py; written here directly,
without a tokenizer, so the bench measures the store and not tokenizing),
then, best of ``--repeat``:

* ``adopt``: :func:`append_shards` creating a store of all shards but the
  last, then appending the last (row digests hashed, files moved, index
  replaced), in microseconds a row; the one-store copy adopted as one shard;
* ``read``: one pass of ``arrays(row)`` over every row of the classic
  store, of the sharded store (``--shards`` shards, global rows) and of the
  one-shard sharded store; a bare loop over the classic store's arrays with
  precomputed bounds as the floor;
* ``verify``: :meth:`ShardedTokenStore.verify` (every shard's digests,
  every row digest recomputed, the logical hash).

The logical dataset hash of the two sharded stores is checked equal.
Everything is local and deterministic; the folder defaults to a temporary one.

    python bench/bench_sharded_store.py [--samples 200000] [--shards 16] [--repeat 3] [--folder DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_collate import best_of, documents

from umlos_cuda.batching.lengths.cache import LengthCache
from umlos_cuda.batching.tokens.sharded import ShardedTokenStore, append_shards
from umlos_cuda.batching.tokens.store import STORE_FORMAT, TokenStore
from umlos_cuda.files.artifacts import MARKER
from umlos_cuda.hashing import sha256_array

TOKENIZER_HASH = "bench-" + "0" * 58


def write_store(folder: str, tokens: np.ndarray, lengths: np.ndarray, first: int) -> None:
    """A classic token store of these rows (ids ``row-<first + i>``), as ``data tokenize`` lays it out."""
    os.makedirs(folder)
    offsets = np.zeros(lengths.shape[0] + 1, dtype="<i8")
    np.cumsum(lengths, out=offsets[1:])
    mask = np.ones(tokens.shape[0], dtype=np.uint8)
    for name, array in (("tokens", tokens), ("loss_mask", mask), ("offsets", offsets)):
        np.save(os.path.join(folder, f"{name}.npy"), array, allow_pickle=False)
    ids = [f"row-{first + i}" for i in range(lengths.shape[0])]
    LengthCache.from_arrays(ids, lengths, TOKENIZER_HASH).write(os.path.join(folder, "lengths.jsonl"))
    meta = {"format": STORE_FORMAT, "num_samples": int(lengths.shape[0]), "num_tokens": int(tokens.shape[0]),
            "token_dtype": "<u2", "tokenizer_hash": TOKENIZER_HASH, "dataset_hash": None, "loss_mask": "all",
            "sample_ids": "jsonl", "tokens_sha256": sha256_array(tokens), "loss_mask_sha256": sha256_array(mask),
            "offsets_sha256": sha256_array(offsets), "vocab_size": 32000}
    with open(os.path.join(folder, "meta.json"), "w", encoding="ascii") as handle:
        handle.write(json.dumps(meta, indent=2) + "\n")
    with open(os.path.join(folder, MARKER), "w", encoding="ascii") as handle:
        handle.write('{"artifact":"token store","format":"umlos-cuda/artifact-v1"}\n')


def read_all(source) -> int:
    total = 0
    for row in range(len(source)):
        _ids, mask = source.arrays(row)
        total += mask.shape[0]
    return total


def read_floor(tokens: np.ndarray, offsets: list[int]) -> int:
    total = 0
    for start, end in itertools.pairwise(offsets):
        total += tokens[start:end].shape[0]
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--folder", default=None)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    lengths, tokens = documents(rng, args.samples)
    cuts = np.linspace(0, args.samples, args.shards + 1).astype(np.int64)
    starts = np.concatenate(([0], np.cumsum(lengths)))
    with tempfile.TemporaryDirectory() as temporary:
        folder = args.folder or temporary
        staged = []
        for i in range(args.shards):
            a, b = int(cuts[i]), int(cuts[i + 1])
            path = os.path.join(folder, f"stage-{i:05d}")
            write_store(path, tokens[starts[a]:starts[b]], lengths[a:b], a)
            staged.append(path)
        write_store(os.path.join(folder, "whole"), tokens, lengths, 0)

        begin = time.perf_counter()
        append_shards(os.path.join(folder, "sharded"), staged[:-1], create=True)
        created = time.perf_counter() - begin
        begin = time.perf_counter()
        sharded = append_shards(os.path.join(folder, "sharded"), staged[-1:])
        appended = time.perf_counter() - begin
        last_rows = int(cuts[-1] - cuts[-2])
        begin = time.perf_counter()
        one = append_shards(os.path.join(folder, "one"), [os.path.join(folder, "whole")], create=True)
        one_seconds = time.perf_counter() - begin
        assert sharded.dataset_hash == one.dataset_hash and len(sharded) == len(one) == args.samples

        classic = TokenStore.open(one.shard_path(0))
        plain = np.load(os.path.join(one.shard_path(0), "tokens.npy"))
        offsets = starts.tolist()
        expected = int(lengths.sum())
        runs = {"classic store": lambda: read_all(classic),
                f"sharded, {args.shards} shards": lambda: read_all(ShardedTokenStore.open(sharded.root)),
                "sharded, 1 shard": lambda: read_all(ShardedTokenStore.open(one.root)),
                "floor: bare ndarray slices": lambda: read_floor(plain, offsets)}
        for name, run in runs.items():
            assert run() == expected, name
        best = best_of(args.repeat, *runs.values())
        begin = time.perf_counter()
        ShardedTokenStore.open(sharded.root).verify()
        verified = time.perf_counter() - begin
        digest = hashlib.sha256()
        begin = time.perf_counter()
        digest.update(tokens.data.cast("B"))
        sha_floor = time.perf_counter() - begin

        print(f"{args.samples} rows, {expected} tokens, {args.shards} shards, best of {args.repeat}")
        print(f"{'read pass':<28} {'seconds':>8} {'us/row':>7} {'vs classic':>10}")
        for name, seconds in zip(runs, best):
            print(f"{name:<28} {seconds:8.3f} {seconds / args.samples * 1e6:7.2f} {seconds / best[0]:9.2f}x")
        print(f"{'adopt':<28} {'seconds':>8} {'us/row':>7}")
        create_rows = args.samples - last_rows
        print(f"{f'create of {args.shards - 1} shards':<28} {created:8.3f} {created / create_rows * 1e6:7.2f}")
        print(f"{'append of 1 shard':<28} {appended:8.3f} {appended / last_rows * 1e6:7.2f}")
        print(f"{'1 store adopted as 1 shard':<28} {one_seconds:8.3f} {one_seconds / args.samples * 1e6:7.2f}")
        print(f"{'verify (all shards)':<28} {verified:8.3f} {verified / args.samples * 1e6:7.2f}")
        print(f"{'floor: SHA-256 of tokens':<28} {sha_floor:8.3f} {sha_floor / args.samples * 1e6:7.2f}")


if __name__ == "__main__":
    main()
