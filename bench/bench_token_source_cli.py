"""Peak memory of the pretraining commands over a Megatron prefix, run as a user runs them: the CLI in a fresh process.

What it measures, for each ``--documents`` N: a Megatron pair of N one-sequence documents is written
(lengths lognormal, median about 735 tokens, clipped to [16, 16384], as bench/bench_megatron.py writes
them; the ``.idx`` in bounded pieces, 20 bytes a document; the ``.bin`` a sparse file of the right size:
none of these commands reads a token), then each command runs as a child process
(``python -c 'umlos_cuda.cli.main'``), and the row reports its wall time and its peak resident memory
(``getrusage(RUSAGE_CHILDREN).ru_maxrss`` in a small launcher process whose only child it is: :data:`LAUNCH`):

* ``plan cut --tokens PREFIX`` (``--sequence-length 2048``, 4096 documents a window): the cut's index in
  one streaming pass, every pointer checked in pieces;
* ``plan build --window 65536 --lengths PREFIX`` (token-budget buckets, the bench_windowed_plans config);
* ``plan build --window 65536 --mix PREFIX:1:1`` (one component capped at one epoch);
* ``plan verify PLAN --windows 16`` and ``plan info PLAN`` of the windowed plan (the lengths reopened
  from meta.json's ``lengths_path``, bound by a piecewise SHA-256 of the ``.idx`` sizes).

``--baseline PYTHONPATH`` runs ``plan cut`` and ``--mix`` again with another checkout (say a worktree
of a commit before this change, whose commands copy the lengths) for comparison. The ``.idx`` is deleted after each N
unless ``--keep``. Usage::

    PYTHONPATH=$PWD python bench/bench_token_source_cli.py --documents 10000000,100000000 --folder /tmp/tsc
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import time

import numpy as np

PIECE = 1 << 22
MAIN = "import sys; from umlos_cuda.cli import main; sys.exit(main(sys.argv[1:]))"


def _sizes(documents: int, seed: int, start: int) -> np.ndarray:
    """Piece ``start // PIECE``'s sizes, seeded by the piece: the same in every pass."""
    rng = np.random.default_rng([seed, start // PIECE])
    count = min(PIECE, documents - start)
    return np.clip(rng.lognormal(6.6, 0.75, count), 16, 16384).astype("<i4")


def write_dataset(prefix: str, documents: int, seed: int) -> float:
    """The Megatron pair at ``prefix`` (module docstring), written a piece at a time; returns the seconds."""
    started = time.perf_counter()
    with open(prefix + ".idx", "wb") as handle:
        handle.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, documents, documents + 1))
        for start in range(0, documents, PIECE):
            handle.write(_sizes(documents, seed, start).tobytes())
        tokens = 0
        for start in range(0, documents, PIECE):
            sizes = _sizes(documents, seed, start).astype(np.int64)
            pointers = np.empty_like(sizes)
            pointers[0] = tokens
            np.cumsum(sizes[:-1], out=pointers[1:])
            pointers[1:] += tokens
            tokens += int(sizes.sum())
            handle.write((pointers * 2).astype("<i8").tobytes())
        for start in range(0, documents + 1, PIECE):
            handle.write(np.arange(start, min(documents + 1, start + PIECE), dtype="<i8").tobytes())
    with open(prefix + ".bin", "wb") as handle:
        handle.truncate(tokens * 2)  # sparse: no command here reads a token
    return time.perf_counter() - started


#: A small launcher (``python -S``, about 10 MB): the command's child is forked from it, not from this bench
#: (Linux carries the forked copy's resident size into the child's ``ru_maxrss`` across exec), and it reports
#: ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` of its one child.
LAUNCH = """
import json, os, resource, subprocess, sys
child = subprocess.run(json.loads(sys.argv[1]), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
print(json.dumps({"status": child.returncode, "peak_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
                  "out": child.stdout.decode(errors="replace")}))
"""


def run(argv: list[str], pythonpath: str, cwd: str) -> dict:
    """``umlos-cuda ARGV`` in a child of the launcher, run in ``cwd`` (``python -c`` puts the working folder
    first on ``sys.path``: never a checkout's root, or ``pythonpath`` would not choose the package); its
    status, wall seconds, peak RSS (MB) and last line."""
    env = {**os.environ, "PYTHONPATH": pythonpath}
    started = time.perf_counter()
    launched = subprocess.run([sys.executable, "-S", "-c", LAUNCH, json.dumps([sys.executable, "-c", MAIN, *argv])],
                              env=env, cwd=cwd, stdout=subprocess.PIPE, check=True, text=True)
    result = json.loads(launched.stdout)
    out = result["out"].strip()
    return {"status": result["status"], "wall_s": time.perf_counter() - started, "peak_mb": result["peak_kb"] / 1024,
            "out": out.splitlines()[-1] if out else ""}


BUILD = ["--bucket-edges", "128,256,512,1024,2048", "--overflow-max", "4096", "--token-budget", "16384",
         "--pad-policy", "pad_to_max", "--window", "65536", "--quiet", "--force"]


def commands(prefix: str, folder: str, documents: int) -> dict[str, list[str]]:
    plan = os.path.join(folder, "windowed")
    return {
        "plan cut --tokens": ["plan", "cut", "--tokens", prefix, "--sequence-length", "2048", "--force", "--output",
                              os.path.join(folder, "cut")],
        "plan build --window --lengths": ["plan", "build", "--lengths", prefix, *BUILD, "--output", plan],
        "plan build --window --mix": ["plan", "build", "--mix", f"{prefix}:1:1", *BUILD, "--output",
                                      os.path.join(folder, "mixed")],
        "plan verify --windows 16": ["plan", "verify", plan, "--windows", "16"],
        "plan info": ["plan", "info", plan],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--documents", default="10000000,100000000")
    parser.add_argument("--folder", default="/tmp/bench-token-source-cli", help="where the datasets are written; "
                        "the commands run in it")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--baseline", metavar="PYTHONPATH", help="also run plan cut and --mix with this checkout")
    parser.add_argument("--keep", action="store_true", help="keep the datasets")
    parser.add_argument("--skip", default="", metavar="NAMES",
                        help="comma-separated words; commands whose name holds one are not run (say --mix)")
    args = parser.parse_args()
    here = os.environ.get("PYTHONPATH", os.getcwd())
    args.folder = os.path.abspath(args.folder)
    os.makedirs(args.folder, exist_ok=True)
    print(f"{'command':<34} {'documents':>13} {'wall s':>8} {'peak RSS MB':>12}  status / last line")
    for documents in [int(n) for n in args.documents.split(",")]:
        prefix = os.path.join(args.folder, f"mega{documents}")
        seconds = write_dataset(prefix, documents, args.seed)
        print(f"{'(write the .idx, ' + format(os.path.getsize(prefix + '.idx') / 1e9, '.1f') + ' GB)':<34} "
              f"{documents:>13,} {seconds:>8.1f}", flush=True)
        skipped = [word for word in args.skip.split(",") if word]
        runs = [(name, argv, here) for name, argv in commands(prefix, args.folder, documents).items()
                if not any(word in name for word in skipped)]
        if args.baseline:
            runs += [(f"{name} [baseline]", argv, args.baseline) for name, argv in
                     commands(prefix, args.folder, documents).items() if name in ("plan cut --tokens",
                                                                                 "plan build --window --mix")]
        for name, argv, path in runs:
            result = run(argv, os.path.abspath(path), args.folder)
            print(f"{name:<34} {documents:>13,} {result['wall_s']:>8.1f} {result['peak_mb']:>12.0f}  "
                  f"{result['status']} {result['out'][:90]}", flush=True)
        for name in ("cut", "windowed", "mixed"):
            shutil.rmtree(os.path.join(args.folder, name), ignore_errors=True)
        if not args.keep:
            for suffix in (".idx", ".bin"):
                os.unlink(prefix + suffix)


if __name__ == "__main__":
    main()
