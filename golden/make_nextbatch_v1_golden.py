"""Generate golden/nextbatch_v1.json, the NextBatch_v1 and RNG sub-stream golden traces.

Run from the repository root::

    python golden/make_nextbatch_v1_golden.py            # writes golden/nextbatch_v1.json
    python golden/make_nextbatch_v1_golden.py --out F    # somewhere else

Tests only ever verify the file (tests/test_nextbatch_v1.py recomputes every
case on each backend); regenerate it only for a deliberate,
reproducibility-breaking change, which also changes the operator's version
(docs/spec/nextbatch-v1.md, "Versioning"). Bump GENERATOR_VERSION whenever
the case list below changes.

What it holds (docs/spec/nextbatch-v1.md §6 describes the encoding):

* ``shard`` cases: whole epochs of N = 30 (blocks of 8), N = 100,000 (blocks
  of 4096, three seeds), N = 100,000 with the default block size (one tail
  block) and with ``drop_last`` (ignored by v1), for world sizes 1, 3 and 8,
  every rank, epochs 0, 1 and 2^64 - 1; each rank's count, SHA-256, first and
  last 8 indices, and the epoch's order hash.
* ``draws`` cases: the first 16 draws of each sub-stream of each manifest's
  RNG master, and 6 draws straddling offset 2^32 of ``misc``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

GENERATOR_VERSION = "1"
DATASET = "train"
WORLD_SIZES = [1, 3, 8]
EPOCHS = [0, 1, 2**64 - 1]


def dataset(n: int) -> dict:
    return {DATASET: {"id": f"golden-v1-{n}", "version": "1", "hash": "sha256:" + "cd" * 32, "cardinality": n}}


def manifests() -> dict:
    out = {"n30_b8": {"seed": 14, "global_batch_size": 12, "data": {"sampler_block_size": 8}, "datasets": dataset(30)}}
    for i, seed in enumerate([0, 20260218, 2**64 - 1]):
        out[f"n1e5_b4096_s{i}"] = {"seed": seed, "global_batch_size": 64, "data": {"sampler_block_size": 4096},
                                   "datasets": dataset(10**5)}
    out["n1e5_defaults"] = {"global_batch_size": 64, "datasets": dataset(10**5)}
    out["n1e5_b4096_drop_last"] = {"seed": 5, "global_batch_size": 96,
                                   "data": {"sampler_block_size": 4096, "drop_last": True}, "datasets": dataset(10**5)}
    return out


def digest(indices) -> str:
    import hashlib

    import numpy as np

    return hashlib.sha256(np.ascontiguousarray(indices, dtype="<u8").tobytes()).hexdigest()


def shard_case(name: str, raw: dict, epoch: int, world_size: int) -> dict:
    from umlos_cuda.rng.nextbatch_v1 import next_batch_v1

    ranks = []
    order = None
    for rank in range(world_size):
        batch = next_batch_v1(raw, DATASET, world_size, rank, epoch, backend="numpy")
        order = batch.order_hash.hex()
        values = batch.indices.tolist()
        ranks.append({"count": len(values), "sha256": digest(batch.indices), "first_8": values[:8],
                      "last_8": values[-8:]})
    return {"id": f"shard/{name}/e{epoch}/w{world_size}", "kind": "shard",
            "input": {"manifest": name, "dataset": DATASET, "epoch": epoch, "world_size": world_size},
            "expected": {"order_hash": order, "ranks": ranks}}


def draws_cases(name: str, raw: dict) -> list[dict]:
    from umlos_cuda.rng.streams import STREAMS, draws_at, RngStreams

    streams = RngStreams.from_manifest(raw)
    cases = []
    for stream in STREAMS:
        cases.append({"id": f"draws/{name}/{stream}/0", "kind": "draws",
                      "input": {"manifest": name, "stream": stream, "offset": 0, "count": 16},
                      "expected": {"master_seed": streams.master_seed.hex(),
                                   "draws": draws_at(streams.master_seed, stream, 0, 16).tolist()}})
    offset = 2**32 - 3
    cases.append({"id": f"draws/{name}/misc/{offset}", "kind": "draws",
                  "input": {"manifest": name, "stream": "misc", "offset": offset, "count": 6},
                  "expected": {"master_seed": streams.master_seed.hex(),
                               "draws": draws_at(streams.master_seed, "misc", offset, 6).tolist()}})
    return cases


def build() -> dict:
    raws = manifests()
    cases = []
    for name, raw in raws.items():
        cases += draws_cases(name, raw)
        for epoch in EPOCHS:
            for world_size in WORLD_SIZES:
                cases.append(shard_case(name, raw, epoch, world_size))
    return {
        "format": "umlos-cuda/nextbatch-v1-golden",
        "format_version": 1,
        "generator_version": GENERATOR_VERSION,
        "specification": "docs/spec/nextbatch-v1.md and docs/spec/rng.md",
        "encoding": {
            "sha256": "SHA-256 of a rank's indices, each as 8 bytes little-endian, in order",
            "order_hash": "docs/spec/rng.md §5.3 order hash of the epoch's permutation (hex)",
            "draws": "uint32 draws of the sub-stream from the given offset",
        },
        "manifests": raws,
        "cases": cases,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "nextbatch_v1.json"))
    args = parser.parse_args(argv)
    data = build()
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
        handle.write("\n")
    print(f"wrote {len(data['cases'])} cases to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
