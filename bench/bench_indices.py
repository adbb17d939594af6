"""Throughput of a whole epoch's order: umlos-cuda beside the O(N) shuffles.

Prints one table. For each N it measures, in the same run and on the same
machine, the time to produce a full epoch's order with
``umlos_cuda.epoch_indices`` (every available backend, into a reused buffer)
and with ``numpy.random.Generator.permutation`` (and ``torch.randperm`` when
torch is installed), and reports indices/s and the ratio to NumPy's
permutation. Then it measures what a resumed job pays before its first batch
at N = 10^11: epoch setup (the O(num_blocks) plan) and first-batch latency.

Timings are the best of ``--repeat`` runs: the machine is shared, and the
minimum is the least noisy estimate of what the code costs.

    python bench/bench_indices.py                 # N = 10^6 .. 10^8
    python bench/bench_indices.py --max-n 1e9     # adds 10^9 (needs ~16 GB)
"""

from __future__ import annotations

import argparse
import platform
import time
from functools import partial

import numpy as np

import umlos_cuda as uc
from umlos_cuda.backends import available_backends, get_backend
from umlos_cuda.epoch import epoch_seed
from umlos_cuda.nextbatch import _plans


def manifest_for(n: int, block_size: int = 1 << 20, batch: int = 4096) -> uc.Manifest:
    return uc.Manifest.from_dict(
        {
            "seed": 7,
            "global_batch_size": batch,
            "data": {"sampler_block_size": block_size},
            "datasets": {"train": {"id": "bench", "version": 1, "hash": "none", "cardinality": n}},
        }
    )


def best_of(repeat: int, fn) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        synchronize = getattr(fn, "synchronize", None)
        if synchronize:
            synchronize()
        best = min(best, time.perf_counter() - started)
    return best


def epoch_rows(sizes, backends, repeat):
    rows = []
    for n in sizes:
        manifest = manifest_for(n)
        rng = np.random.default_rng(0)
        t_perm = best_of(repeat, partial(rng.permutation, n))
        rows.append((n, "numpy.random.Generator.permutation", n / t_perm, 1.0))
        try:
            import torch

            t_torch = best_of(repeat, partial(torch.randperm, n))
            rows.append((n, "torch.randperm (cpu)", n / t_torch, t_perm / t_torch))
        except ImportError:
            pass
        for name in backends:
            engine = get_backend(name)
            out = engine.xp.empty(n, dtype=np.uint64)
            uc.epoch_indices(manifest, "train", epoch=0, out=out, backend=name)  # warm: plan, compile, page faults
            t = best_of(repeat, partial(uc.epoch_indices, manifest, "train", epoch=0, out=out, backend=name))
            rows.append((n, f"umlos_cuda.epoch_indices [{name}]", n / t, t_perm / t))
            del out
    return rows


def _first_batch(manifest, name: str) -> None:
    _plans.clear()
    uc.next_batch(manifest, "train", world_size=8, rank=0, cursor=uc.Cursor(0, 0), backend=name)


def _warm_batch(manifest, name: str) -> None:
    uc.next_batch(manifest, "train", world_size=8, rank=0, cursor=uc.Cursor(0, 4096), backend=name)


def setup_rows(backends, repeat, n=10**11):
    manifest = manifest_for(n)
    rows = []
    for name in backends:
        engine = get_backend(name)
        seed16 = epoch_seed(manifest.replay_token, manifest.hash, "train", 0)

        t_setup = best_of(repeat, partial(engine.build_plan, seed16, n, manifest.sampler_block_size))
        t_first = best_of(repeat, partial(_first_batch, manifest, name))
        uc.next_batch(manifest, "train", world_size=8, rank=0, backend=name)  # plan now cached
        t_warm = best_of(repeat * 10, partial(_warm_batch, manifest, name))
        rows.append((name, t_setup, t_first, t_warm))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-n", type=float, default=1e8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backend", action="append", help="backends to time (default: every available one)")
    args = parser.parse_args()
    backends = args.backend or [name for name, status in available_backends().items() if status == "ok"]
    sizes = [n for n in (10**6, 10**7, 10**8, 10**9) if n <= args.max_n]

    print(f"machine: {platform.machine()}, {platform.processor() or 'cpu'}, numpy {np.__version__}")
    print(f"backends timed: {', '.join(backends)}; best of {args.repeat}\n")
    print(f"{'N':>14}  {'method':<44} {'indices/s':>16} {'vs permutation':>15}")
    for n, method, rate, ratio in epoch_rows(sizes, backends, args.repeat):
        print(f"{n:>14,}  {method:<44} {rate:>16,.0f} {ratio:>14.2f}x")

    print("\nN = 10^11, block size 2^20 (95,368 blocks), global batch 4096, W = 8:")
    print(f"{'backend':<10} {'epoch setup':>14} {'first batch (cold)':>20} {'next batch (warm)':>19}")
    for name, t_setup, t_first, t_warm in setup_rows(backends, args.repeat):
        print(f"{name:<10} {t_setup * 1e3:>11.1f} ms {t_first * 1e3:>17.1f} ms {t_warm * 1e3:>16.3f} ms")


if __name__ == "__main__":
    main()
