"""The native backend against the two yardsticks that bound it, in one run.

Prints one table for N positions (default 10^8, the default block size 2^20):

* ``native epoch_indices``: a whole epoch through the public API into a reused
  buffer (``uc.epoch_indices(..., backend="native", out=buf)``), once per
  sampling mode (``data.sampling_mode``: ``block_affine``, ``feistel``,
  ``block_feistel``; ``--modes`` picks);
* ``ndarray.fill``: writing the same number of uint64 into the same kind of
  pre-faulted buffer, the memory-write bound no index generator can beat;
* ``Generator.permutation``: NumPy's O(N) shuffle of the same N, what a data
  loader does without umlos-cuda;
* ``numpy epoch_indices``: the reference path of each mode, for scale
  (``--no-numpy`` skips it);

with indices/s and ratios measured in this run (each mode against
``block_affine`` and against the permutation). Then, at N = 10^11 (block
2^20), each mode's epoch setup (its plan: for the block modes the Fisher-Yates
draws and swaps and the per-block tables, for ``feistel`` two Philox draws)
and the first-batch latency of ``next_batch`` with the plan cache cold (what
a resumed job pays before its first batch).

Times are the minimum of ``--repeat`` runs (the machine may be shared; the
minimum is the least noisy estimate of the code's cost). No number here is
asserted anywhere: the tests check bits, never time.

    python bench/bench_native.py
    python bench/bench_native.py --n 1e7 --repeat 3 --modes feistel
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from functools import partial

import numpy as np

import umlos_cuda as uc
from umlos_cuda import nextbatch
from umlos_cuda.backends import get_backend
from umlos_cuda.epoch import epoch_seed
from umlos_cuda.errors import UmlosError

KEY = "train"


MODES = ("block_affine", "feistel", "block_feistel")


def manifest_for(n: int, block_size: int = 1 << 20, batch: int = 4096, mode: str = "block_affine") -> uc.Manifest:
    return uc.Manifest.from_dict(
        {
            "seed": 7,
            "global_batch_size": batch,
            "data": {"sampler_block_size": block_size, "sampling_mode": mode},
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


def throughput(n: int, repeat: int, with_numpy: bool, modes: tuple[str, ...]) -> None:
    native = get_backend("native")
    buffer = np.empty(n, dtype=np.uint64)
    buffer.fill(0)  # pre-fault the pages: the runs below measure writes, not page faults
    native_times, checks = {}, {}
    for mode in modes:
        manifest = manifest_for(n, mode=mode)
        uc.epoch_indices(manifest, KEY, 0, backend="native", out=buffer)  # builds and caches the plan
        native_times[mode] = best_of(repeat, partial(uc.epoch_indices, manifest, KEY, 0, backend="native", out=buffer))
        if with_numpy:
            checks[mode] = buffer.copy()
    fill_target = np.empty(n, dtype=np.uint64)
    fill_target.fill(0)
    t_fill = best_of(repeat, lambda: fill_target.fill(7))
    rng = np.random.default_rng(0)
    t_perm = best_of(max(1, repeat // 2), lambda: rng.permutation(n))
    base = native_times.get("block_affine")
    rows = []
    for mode, seconds in native_times.items():
        notes = [f"{native.threads} threads"]
        if base is not None and mode != "block_affine":
            notes.append(f"{base / seconds:.0%} of block_affine's rate")
        notes.append(f"{t_perm / seconds:.1f}x permutation's rate")
        name = f"native epoch_indices, {mode}" + (f" ({native.feistel_path})" if "feistel" in mode else "")
        rows.append(row(name, seconds, n, "; ".join(notes)))
    rows.append(row("ndarray.fill, pre-faulted (write bound)", t_fill, n, "the memory-write bound"))
    rows.append(row("numpy Generator.permutation", t_perm, n, "what a loader does without umlos-cuda"))
    if with_numpy:
        out = np.empty(n, dtype=np.uint64)
        out.fill(0)
        for mode in modes:
            manifest = manifest_for(n, mode=mode)
            uc.epoch_indices(manifest, KEY, 0, backend="numpy", out=out)
            t_numpy = best_of(1, partial(uc.epoch_indices, manifest, KEY, 0, backend="numpy", out=out))
            assert np.array_equal(out, checks[mode]), f"numpy and native differ ({mode})"
            rows.append(row(f"numpy epoch_indices, {mode} (reference)", t_numpy, n,
                            f"numpy / native = {t_numpy / native_times[mode]:.1f}x the time"))
    print(f"\nOne epoch of N = {n:,} (block 2^20), best of {repeat}:\n")
    print_table(("what", "ms", "M idx/s", "ratio (same run)"), rows)


def _first_batch(manifest, backend: str) -> None:
    nextbatch._plans.clear()
    uc.next_batch(manifest, KEY, 8, 3, "train", uc.Cursor(5, 4096 * 1000), backend=backend)


def setup_and_first_batch(n: int, repeat: int, modes: tuple[str, ...]) -> None:
    native = get_backend("native")
    numpy_backend = get_backend("numpy")
    seed16 = epoch_seed(b"\0" * 32, b"\1" * 32, KEY, 0)
    rows = []
    for mode in modes:
        t_plan_native = best_of(repeat, partial(native.build_plan, seed16, n, 1 << 20, mode))
        t_plan_numpy = best_of(max(1, repeat // 2), partial(numpy_backend.build_plan, seed16, n, 1 << 20, mode))
        manifest = manifest_for(n, batch=4096, mode=mode)
        t_first_native = best_of(repeat, partial(_first_batch, manifest, "native"))
        t_first_numpy = best_of(max(1, repeat // 2), partial(_first_batch, manifest, "numpy"))
        rows += [
            (f"{mode}: epoch setup (its plan)", f"{t_plan_native * 1e3:.3f}", f"{t_plan_numpy * 1e3:.3f}"),
            (f"{mode}: first batch, cold plan cache (W=8, G=4096)", f"{t_first_native * 1e3:.3f}",
             f"{t_first_numpy * 1e3:.3f}"),
        ]
    blocks = -(-n // (1 << 20))
    print(f"\nN = {n:,}, block 2^20 ({blocks:,} blocks for the block modes), best of {repeat}:\n")
    print_table(("what", "native ms", "numpy ms"), rows)


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
    parser.add_argument("--no-numpy", action="store_true", help="skip the NumPy reference rows (seconds at 10^8)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"sampling modes, comma-separated (default {','.join(MODES)})")
    args = parser.parse_args()
    try:
        get_backend("native")
    except UmlosError as exc:
        raise SystemExit(f"backend 'native' is unavailable: {exc.message}") from None
    print(
        f"umlos-cuda {uc.__version__} | {platform.python_implementation()} {platform.python_version()} | "
        f"NumPy {np.__version__} | {cpu_model()} | {os.cpu_count()} CPUs | "
        f"{time.strftime('%Y-%m-%d')}"
    )
    modes = tuple(mode.strip() for mode in args.modes.split(",") if mode.strip())
    throughput(int(args.n), args.repeat, not args.no_numpy, modes)
    setup_and_first_batch(int(args.setup_n), args.repeat, modes)


if __name__ == "__main__":
    main()
