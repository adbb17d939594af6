"""Seconds to the first batch from a cold planned cache, two checkouts of the project alternating on one server.

Writes ``--samples`` documents (the lognormal lengths of bench/bench_object_peers.py) as one token store, copies
it into moto's server behind the tests' counting proxy (the bench's server that slices ranges from each object's
bytes, ``HELD_CHILD``), adds ``--latency`` ms before each request, and then, ``--rounds`` times, for each
checkout given and each ``--lookahead``, starts a new process with that checkout first on ``PYTHONPATH``, which
builds the windowed ``feistel`` plan, a ``PlannedTokenSource`` with a cache of every block, and a
``DataLoader`` (``num_workers=0``), and prints the seconds of ``next(iter(loader))``: the pass listed, the
schedule built, the first step's blocks fetched and collated. The checkouts alternate, so a change in the
machine's load falls on both.

    git archive <commit> umlos_cuda | tar -x -C /tmp/before
    python bench/bench_first_batch.py --checkouts /tmp/before . [--rounds 3] [--lookahead 32 256]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
from bench_collate import documents  # noqa: E402
from bench_object_peers import HELD_CHILD  # noqa: E402
from bench_sharded_store import write_store  # noqa: E402
from objstore_support import object_store_session  # noqa: E402

CHILD = r'''
import sys, time
import numpy as np
from torch.utils.data import DataLoader
from umlos_cuda.batching import BatchingConfig
from umlos_cuda.batching.plans.windows import ArrayLengths, WindowDefinition, WindowedPlan
from umlos_cuda.remote import PlannedTokenSource
from umlos_cuda.torch import PlanBatchSampler, PlanCollator, TokenDataset
url, n, lookahead, block = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(0)
lengths = np.clip(rng.lognormal(5.3, 0.8, n).astype(np.int64), 1, 2048)
config = BatchingConfig.throughput(40960, (2048,), 4096, seed=1, order="feistel")
plan = WindowedPlan.build(WindowDefinition(config, n, 4096), ArrayLengths(lengths.astype(np.uint32)), 1)
sampler = PlanBatchSampler(plan, rank=0, world_size=1)
every = (3 * int(lengths.sum()) // block + 4) * block  # the tokens (2 bytes each) and the mask, in whole blocks
source = PlannedTokenSource(url, sampler, cache_bytes=every, block_bytes=block, lookahead=lookahead)
loader = DataLoader(TokenDataset(source, plan=plan), batch_sampler=sampler, collate_fn=PlanCollator(plan))
began = time.perf_counter()
next(iter(loader))
print(f"{time.perf_counter() - began:.3f}")
source.close()
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkouts", nargs="+", required=True, help="folders holding umlos_cuda/ to compare")
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--latency", type=float, default=100.0, help="ms per request")
    parser.add_argument("--lookahead", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--block-kb", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    lengths, tokens = documents(rng, args.samples)
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as folder, object_store_session(HELD_CHILD) as served:
        write_store(os.path.join(folder, "store"), tokens, lengths, 0)
        url = served.upload_folder(os.path.join(folder, "store"), served.bucket("firstbatch"), "store")
        served.proxy.latency = args.latency / 1000
        for round_ in range(args.rounds):
            for checkout in args.checkouts:
                root = os.path.abspath(checkout)
                for lookahead in args.lookahead:
                    name = f"{checkout}, lookahead {lookahead}"
                    load = os.getloadavg()[0]
                    out = subprocess.run([sys.executable, "-c", CHILD, url, str(args.samples), str(lookahead),
                                          str(args.block_kb << 10)], cwd=root, capture_output=True, text=True,
                                         env={**os.environ, "PYTHONPATH": root}, check=False)
                    if out.returncode:
                        raise SystemExit(f"{name}: {out.stderr[-2000:]}")
                    results.setdefault(name, []).append(float(out.stdout.strip().splitlines()[-1]))
                    print(f"round {round_} {name}: {results[name][-1]:.3f} s (load {load:.1f})", flush=True)
    for name, values in results.items():
        print(f"{name}: median {np.median(values):.3f} s ({', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
