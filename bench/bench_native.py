"""The native backend against the two yardsticks that bound it, in one run.

Prints one table for N positions (default 10^8, the default block size 2^20):

* ``native epoch_indices``: a whole epoch through the public API into a reused
  buffer (``uc.epoch_indices(..., backend="native", out=buf)``);
* ``ndarray.fill``: writing the same number of uint64 into the same kind of
  pre-faulted buffer, the memory-write bound no index generator can beat;
* ``Generator.permutation``: NumPy's O(N) shuffle of the same N, what a data
  loader does without umlos-cuda;
* ``numpy epoch_indices``: the reference path, for scale (``--no-numpy`` skips it);

with indices/s and ratios measured in this run. Then, at N = 10^11 (block
2^20), the epoch setup (the O(num_blocks) plan: Fisher-Yates draws and swaps
and the per-block tables) and the first-batch latency of ``next_batch``
with the plan cache cold (what a resumed job pays before its first batch).

Times are the minimum of ``--repeat`` runs (the machine may be shared; the
minimum is the least noisy estimate of the code's cost). No number here is
asserted anywhere: the tests check bits, never time.

    python bench/bench_native.py
    python bench/bench_native.py --n 1e7 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

import umlos_cuda as uc
from umlos_cuda import nextbatch
from umlos_cuda.backends import get_backend
from umlos_cuda.epoch import epoch_seed
from umlos_cuda.errors import UmlosError

KEY = "train"


def manifest_for(n: int, block_size: int = 1 << 20, batch: int = 4096) -> uc.Manifest:
    return uc.Manifest.from_dict(
        {
            "seed": 7,
            "global_batch_size": batch,
            "data": {"sampler_block_size": block_size},
            "datasets": {KEY: {"id": "bench", "version": "1", "hash": "sha256:" + "0" * 64, "cardinality": n}},
        }
    )


def best_of(repeat: int, fn) -> float:
    """The smallest wall time of ``repeat`` calls of ``fn`` (seconds)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def row(name: str, seconds: float, n: int, note: str = "") -> tuple[str, str, str, str]:
    return name, f"{seconds * 1e3:10.1f}", f"{n / seconds / 1e6:10.0f}", note


def print_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = " | ".join(h.ljust(w) for h, w in zip(header, widths))
    print(line)
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(str(c).ljust(w) for c, w in zip(r, widths)))


def throughput(n: int, repeat: int, with_numpy: bool) -> None:
    native = get_backend("native")
    manifest = manifest_for(n)
    buffer = np.empty(n, dtype=np.uint64)
    buffer.fill(0)  # pre-fault the pages: the runs below measure writes, not page faults
    uc.epoch_indices(manifest, KEY, 0, backend="native", out=buffer)  # builds and caches the plan

    t_native = best_of(repeat, lambda: uc.epoch_indices(manifest, KEY, 0, backend="native", out=buffer))
    check = buffer.copy()
    fill_target = np.empty(n, dtype=np.uint64)
    fill_target.fill(0)
    t_fill = best_of(repeat, lambda: fill_target.fill(7))
    rng = np.random.default_rng(0)
    t_perm = best_of(max(1, repeat // 2), lambda: rng.permutation(n))
    rows = [
        row("native epoch_indices (reused buffer)", t_native, n, f"{native.threads} threads"),
        row("ndarray.fill, pre-faulted (write bound)", t_fill, n, f"native / fill = {t_native / t_fill:.2f}x the time"),
        row(
            "numpy Generator.permutation",
            t_perm,
            n,
            f"permutation / native = {t_perm / t_native:.1f}x the time",
        ),
    ]
    if with_numpy:
        out = np.empty(n, dtype=np.uint64)
        out.fill(0)
        uc.epoch_indices(manifest, KEY, 0, backend="numpy", out=out)
        t_numpy = best_of(1, lambda: uc.epoch_indices(manifest, KEY, 0, backend="numpy", out=out))
        assert np.array_equal(out, check), "numpy and native differ"
        rows.append(row("numpy epoch_indices (reference)", t_numpy, n, f"numpy / native = {t_numpy / t_native:.1f}x"))
    print(f"\nOne epoch of N = {n:,} (block 2^20), best of {repeat}:\n")
    print_table(("what", "ms", "M idx/s", "ratio (same run)"), rows)


def setup_and_first_batch(n: int, repeat: int) -> None:
    native = get_backend("native")
    numpy_backend = get_backend("numpy")
    seed16 = epoch_seed(b"\0" * 32, b"\1" * 32, KEY, 0)
    t_plan_native = best_of(repeat, lambda: native.build_plan(seed16, n, 1 << 20))
    t_plan_numpy = best_of(max(1, repeat // 2), lambda: numpy_backend.build_plan(seed16, n, 1 << 20))
    manifest = manifest_for(n, batch=4096)

    def first_batch(backend: str) -> None:
        nextbatch._plans.clear()
        uc.next_batch(manifest, KEY, 8, 3, "train", uc.Cursor(5, 4096 * 1000), backend=backend)

    t_first_native = best_of(repeat, lambda: first_batch("native"))
    t_first_numpy = best_of(max(1, repeat // 2), lambda: first_batch("numpy"))
    blocks = -(-n // (1 << 20))
    print(f"\nN = {n:,}, block 2^20 ({blocks:,} blocks), best of {repeat}:\n")
    print_table(
        ("what", "native ms", "numpy ms"),
        [
            ("epoch setup (block order + tables)", f"{t_plan_native * 1e3:.1f}", f"{t_plan_numpy * 1e3:.1f}"),
            ("first batch, cold plan cache (W=8, G=4096)", f"{t_first_native * 1e3:.1f}", f"{t_first_numpy * 1e3:.1f}"),
        ],
    )


def cpu_model() -> str:
    """The CPU's model name (Linux), else what platform knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=float, default=1e8, help="positions per epoch for the throughput table")
    parser.add_argument("--setup-n", type=float, default=1e11, help="N for epoch setup and first-batch latency")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-numpy", action="store_true", help="skip the NumPy reference row (seconds at 10^8)")
    args = parser.parse_args()
    try:
        get_backend("native")
    except UmlosError as exc:
        raise SystemExit(f"backend 'native' is unavailable: {exc.message}")
    print(
        f"umlos-cuda {uc.__version__} | {platform.python_implementation()} {platform.python_version()} | "
        f"NumPy {np.__version__} | {cpu_model()} | {os.cpu_count()} CPUs | "
        f"{time.strftime('%Y-%m-%d')}"
    )
    throughput(int(args.n), args.repeat, not args.no_numpy)
    setup_and_first_batch(int(args.setup_n), args.repeat)


if __name__ == "__main__":
    main()
