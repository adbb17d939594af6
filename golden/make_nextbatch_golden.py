"""Generate golden/nextbatch_v2.json, the NextBatch_v2 golden traces (docs/spec/README.md, "The golden file").

Run from the repository root::

    python golden/make_nextbatch_golden.py            # writes golden/nextbatch_v2.json
    python golden/make_nextbatch_golden.py --out F    # somewhere else

Tests and ``umlos-cuda golden verify`` only ever verify the file; regenerate it
only for a deliberate, reproducibility-breaking change (docs/spec/README.md, "Versioning": a MAJOR
version bump), and say so in the commit. Bump GENERATOR_VERSION whenever the
case list below changes.

What it holds (the byte encoding and case kinds are documented in
``umlos_cuda/commands/_golden_vectors.py``):

* N = 10^6, G = 3072, blocks of 4096 (244 full blocks and a tail of 576):
  5 seeds x world sizes {1, 8, 12} x {train, eval}, each a whole epoch through
  ``next_batch``; plus the default block size (one tail block of 10^6), a
  non-power-of-two block size with ``drop_last``, and ``streaming_infinite``.
* N = 10^9, G = 3072, blocks of 2^20 (953 full blocks and a tail of 707,072):
  per seed, train windows of 2^20 positions at the start, middle and end, 32
  sampled positions, and ``next_batch`` steps mid-epoch and at the final
  partial batch for world sizes {1, 8, 12} x {train, eval}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

GENERATOR_VERSION = "1"

SEEDS = [0, 1, 20260218, 2**32 + 1, 2**64 - 1]
WORLD_SIZES = [1, 8, 12]
STAGES = ["train", "eval"]
G = 3072
N6 = 10**6
N9 = 10**9
WINDOW = 1 << 20
DATASET = "train"


def dataset(n: int) -> dict:
    return {DATASET: {"id": f"golden-corpus-{n}", "version": "1", "hash": "sha256:" + "ab" * 32, "cardinality": n}}


def manifests() -> dict:
    out = {}
    for i, seed in enumerate(SEEDS):
        raw = {
            "spec_version": "UML_OS-v3.8-OS",
            "seed": seed,
            "global_batch_size": G,
            "data": {"sampler_block_size": 4096, "drop_last": False},
            "datasets": dataset(N6),
        }
        if i == 2:  # a declared policy and environment move the replay token (R3)
            raw["policy"] = {"precision": "bf16", "deterministic": True}
            raw["env"] = {"cuda": "12.4", "driver": "550.54"}
        out[f"n1e6_s{i}"] = raw
    # Defaults omitted: spec_version, seed 0, sampler_block_size 2^20, drop_last false (R3).
    out["n1e6_defaults"] = {"global_batch_size": G, "datasets": dataset(N6)}
    out["n1e6_b1000_drop_last"] = {
        "seed": 7, "global_batch_size": G, "data": {"sampler_block_size": 1000, "drop_last": True},
        "datasets": dataset(N6),
    }
    for i, seed in enumerate(SEEDS):
        out[f"n1e9_s{i}"] = {
            "spec_version": "UML_OS-v3.8-OS",
            "seed": seed,
            "global_batch_size": G,
            "data": {"sampler_block_size": 1 << 20, "drop_last": False},
            "datasets": dataset(N9),
        }
    return out


def sampled_positions(n: int, salt: int, count: int = 32) -> list[int]:
    """Fixed positions: block edges, the tail, the last one, then an LCG."""
    block = 1 << 20
    tail_start = (n // block) * block
    fixed = [0, 1, block - 1, block, 2 * block + 12345, n // 2, tail_start - 1, tail_start, n - 2, n - 1]
    state = (0x9E3779B97F4A7C15 * (salt + 1)) & (2**64 - 1)
    while len(fixed) < count:
        state = (6364136223846793005 * state + 1442695040888963407) & (2**64 - 1)
        fixed.append((state >> 11) % n)
    return fixed


def cases(raws: dict) -> list[dict]:
    out = []
    for name in raws:
        out.append({"id": f"manifest/{name}", "kind": "manifest", "input": {"manifest": name}})
    for i in range(len(SEEDS)):
        for world_size in WORLD_SIZES:
            for stage in STAGES:
                out.append({
                    "id": f"n1e6/s{i}/w{world_size}/{stage}",
                    "kind": "epoch_run",
                    "input": {"manifest": f"n1e6_s{i}", "dataset": DATASET, "stage": stage, "epoch": i,
                              "world_size": world_size},
                })
    out.append({"id": "n1e6/defaults/w8/train", "kind": "epoch_run",
                "input": {"manifest": "n1e6_defaults", "dataset": DATASET, "stage": "train", "epoch": 0,
                          "world_size": 8}})
    for stage in STAGES:
        out.append({"id": f"n1e6/b1000_drop_last/w12/{stage}", "kind": "epoch_run",
                    "input": {"manifest": "n1e6_b1000_drop_last", "dataset": DATASET, "stage": stage, "epoch": 1,
                              "world_size": 12}})
    out.append({"id": "n1e6/s1/w12/streaming_infinite", "kind": "epoch_run",
                "input": {"manifest": "n1e6_s1", "dataset": DATASET, "stage": "train", "preset": "streaming_infinite",
                          "epoch": 2, "world_size": 12}})
    out.append({"id": "n1e6/s1/w8/streaming_infinite/boundary", "kind": "batch",
                "input": {"manifest": "n1e6_s1", "dataset": DATASET, "stage": "train", "preset": "streaming_infinite",
                          "world_size": 8, "cursor": {"epoch": 2, "global_index": N6 - 1000}}})

    middle = G * ((N9 // 2) // G)
    last = N9 - N9 % G  # the final partial batch: N9 % 3072 = 2560 positions
    for i in range(len(SEEDS)):
        name = f"n1e9_s{i}"
        for label, start in (("start", 0), ("middle", N9 // 2 - WINDOW // 2), ("end", N9 - WINDOW)):
            out.append({"id": f"n1e9/s{i}/window/{label}", "kind": "window",
                        "input": {"manifest": name, "dataset": DATASET, "epoch": i, "start": start, "count": WINDOW}})
        out.append({"id": f"n1e9/s{i}/positions", "kind": "positions",
                    "input": {"manifest": name, "dataset": DATASET, "epoch": i, "positions": sampled_positions(N9, i)}})
        for world_size in WORLD_SIZES:
            for stage in STAGES:
                for label, index in (("middle", middle), ("last", last)):
                    out.append({"id": f"n1e9/s{i}/w{world_size}/{stage}/{label}", "kind": "batch",
                                "input": {"manifest": name, "dataset": DATASET, "stage": stage,
                                          "world_size": world_size,
                                          "cursor": {"epoch": i, "global_index": index}}})
    return out


def render(document: dict) -> str:
    """JSON with one case per line, so a diff names the cases that changed."""
    head = {key: value for key, value in document.items() if key != "cases"}
    text = json.dumps(head, indent=2)
    lines = [",\n".join("    " + json.dumps(case, separators=(", ", ": ")) for case in document["cases"])]
    return text[:-2] + ',\n  "cases": [\n' + lines[0] + "\n  ]\n}\n"


def generate(raws: dict, todo: list[dict], *, out: str, backend: str, spec: str, script: str, version: str) -> None:
    """Compute every case of ``todo`` over the manifests ``raws`` on ``backend`` and
    write the golden document to ``out`` (atomically). Shared by the golden generators."""
    import umlos_cuda
    from umlos_cuda.commands import _golden_vectors as golden

    document = {
        "format": golden.FORMAT,
        "format_version": golden.FORMAT_VERSION,
        "operator": "UML_OS.Data.NextBatch_v2",
        "spec": spec,
        "generator": {"script": script, "version": version, "umlos_cuda": umlos_cuda.__version__, "backend": backend},
        "encoding": {
            "sha256": "SHA-256 (lowercase hex) of the indices in emission order, "
                      "each uint64 little-endian, concatenated",
            "epoch_run": "next_batch from cursor (epoch, 0) until the cursor leaves the epoch; at each step every rank "
                         "0..W-1 in order",
            "data_replay_t_sha256": "SHA-256 of the 32-byte data_replay_t of every call, concatenated in call order",
        },
        "manifests": raws,
        "cases": [],
    }
    built = golden.build_manifests(document)
    for number, case in enumerate(todo, 1):
        case["expected"] = golden.compute_case(case, built, backend)
        document["cases"].append(case)
        print(f"[{number}/{len(todo)}] {case['id']}", file=sys.stderr)
    text = render(document)
    assert json.loads(text) == json.loads(json.dumps(document))
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, out)
    print(f"wrote {out}: {len(todo)} cases", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from umlos_cuda.commands import _golden_vectors as golden

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), golden.GOLDEN_NAME))
    parser.add_argument("--backend", default="numpy", help="backend that computes the expected values (default numpy)")
    args = parser.parse_args(argv)
    raws = manifests()
    generate(raws, cases(raws), out=args.out, backend=args.backend,
             spec="docs/spec/nextbatch-v2.md (NextBatch_v2, rules R1-R10)",
             script="golden/make_nextbatch_golden.py", version=GENERATOR_VERSION)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
