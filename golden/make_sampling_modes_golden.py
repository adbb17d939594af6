"""Generate golden/sampling_modes.json, the golden traces of the sampling modes
``feistel`` and ``block_feistel`` (docs/spec/feistel.md).

Run from the repository root::

    python golden/make_sampling_modes_golden.py            # writes golden/sampling_modes.json
    python golden/make_sampling_modes_golden.py --out F    # somewhere else

The file has the format of golden/nextbatch_v2.json (cases ``manifest``,
``epoch_run``, ``batch``, ``window``, ``positions``; ``umlos_cuda/commands/_golden_vectors.py``),
so ``umlos-cuda golden verify --file golden/sampling_modes.json`` and the tests
recompute it on any backend. Regenerate it only for a deliberate,
reproducibility-breaking change of a mode (a new ``_V2`` mode string), and
bump GENERATOR_VERSION whenever the case list changes.

What it holds, for each of the two modes:

* N = 10^6, G = 3072, blocks of 4096: whole epochs through ``next_batch`` for
  world sizes 1 and 8 (train) and 12 (eval), ``streaming_infinite`` over a
  whole epoch and one step across the epoch boundary;
* N = 10^9, blocks of 2^20: train windows of 2^20 positions at the start,
  middle and end, and 32 sampled positions;
* single positions of the largest epoch, N = 2^64 - 1 (``block_feistel`` with
  blocks of 2^50, 16,384 blocks);
* for ``feistel``, whole epochs at the edges of the cipher's width:
  N = 2^20 - 1, 2^20 and 2^20 + 1, and N = 1, 2, 3;

and one manifest that states ``sampling_mode: block_affine``, whose hash is the
hash of the same manifest without the key (the default is not hashed).
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_nextbatch_golden import dataset, generate, sampled_positions  # noqa: E402

GENERATOR_VERSION = "1"

MODES = ("feistel", "block_feistel")
G = 3072
N6 = 10**6
N9 = 10**9
N_MAX = (1 << 64) - 1
WINDOW = 1 << 20
DATASET = "train"
EDGES = {"n2p20m1": (1 << 20) - 1, "n2p20": 1 << 20, "n2p20p1": (1 << 20) + 1, "n1": 1, "n2": 2, "n3": 3}


def manifest(seed: int, n: int, mode: str | None, block_size: int, g: int = G) -> dict:
    data = {"sampler_block_size": block_size, "drop_last": False}
    if mode is not None:
        data["sampling_mode"] = mode
    return {"seed": seed, "global_batch_size": g, "data": data, "datasets": dataset(n)}


def manifests() -> dict:
    out = {}
    for i, mode in enumerate(MODES):
        out[f"n1e6_{mode}"] = manifest(11 + i, N6, mode, 4096)
        out[f"n1e9_{mode}"] = manifest(21 + i, N9, mode, 1 << 20)
        out[f"nmax_{mode}"] = manifest(31 + i, N_MAX, mode, 1 << 50)
    for j, (name, n) in enumerate(EDGES.items()):
        out[f"{name}_feistel"] = manifest(41 + j, n, "feistel", 1 << 20, g=1 if n < 1024 else 1024)
    out["n1e6_block_affine_stated"] = manifest(11, N6, "block_affine", 4096)
    out["n1e6_block_affine_default"] = manifest(11, N6, None, 4096)
    return out


def cases(raws: dict) -> list[dict]:
    out = [{"id": f"manifest/{name}", "kind": "manifest", "input": {"manifest": name}} for name in raws]
    for i, mode in enumerate(MODES):
        name = f"n1e6_{mode}"
        for world_size, stage in ((1, "train"), (8, "train"), (12, "eval")):
            out.append({"id": f"n1e6/{mode}/w{world_size}/{stage}", "kind": "epoch_run",
                        "input": {"manifest": name, "dataset": DATASET, "stage": stage, "epoch": i,
                                  "world_size": world_size}})  # fmt: skip
        out.append({"id": f"n1e6/{mode}/w8/streaming_infinite", "kind": "epoch_run",
                    "input": {"manifest": name, "dataset": DATASET, "stage": "train", "preset": "streaming_infinite",
                              "epoch": 2, "world_size": 8}})  # fmt: skip
        out.append({"id": f"n1e6/{mode}/w8/streaming_infinite/boundary", "kind": "batch",
                    "input": {"manifest": name, "dataset": DATASET, "stage": "train", "preset": "streaming_infinite",
                              "world_size": 8, "cursor": {"epoch": 2, "global_index": N6 - 1000}}})  # fmt: skip
        name = f"n1e9_{mode}"
        for label, start in (("start", 0), ("middle", N9 // 2 - WINDOW // 2), ("end", N9 - WINDOW)):
            out.append({"id": f"n1e9/{mode}/window/{label}", "kind": "window",
                        "input": {"manifest": name, "dataset": DATASET, "epoch": 3, "start": start, "count": WINDOW}})
        out.append({"id": f"n1e9/{mode}/positions", "kind": "positions",
                    "input": {"manifest": name, "dataset": DATASET, "epoch": 3,
                              "positions": sampled_positions(N9, 10 + i)}})  # fmt: skip
        out.append({"id": f"nmax/{mode}/positions", "kind": "positions",
                    "input": {"manifest": f"nmax_{mode}", "dataset": DATASET, "epoch": 5,
                              "positions": sampled_positions(N_MAX, 20 + i)}})  # fmt: skip
    for name in EDGES:
        out.append({"id": f"{name}/feistel/w1/train", "kind": "epoch_run",
                    "input": {"manifest": f"{name}_feistel", "dataset": DATASET, "stage": "train", "epoch": 1,
                              "world_size": 1}})  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, os.path.dirname(HERE))
    from umlos_cuda import Manifest

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(HERE, "sampling_modes.json"))
    parser.add_argument("--backend", default="numpy", help="backend that computes the expected values (default numpy)")
    args = parser.parse_args(argv)
    raws = manifests()
    stated, default = (Manifest.from_dict(raws[f"n1e6_block_affine_{k}"]) for k in ("stated", "default"))
    assert stated.hash == default.hash, "stating the default sampling mode must not change the hash"
    generate(raws, cases(raws), out=args.out, backend=args.backend,
             spec="docs/spec/feistel.md (the sampling modes feistel and block_feistel)",
             script="golden/make_sampling_modes_golden.py", version=GENERATOR_VERSION)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
