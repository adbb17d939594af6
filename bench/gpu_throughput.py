"""GPU throughput of the index kernel: indices/s and GB/s written, beside the O(N) shuffles.

For each N (default 10^6, 10^7, 10^8, 10^9) it times, on one CUDA device and in
the same run:

* ``umlos_cuda`` backend ``cupy``: a whole epoch's order (``map_train`` over
  [0, N)) into a reused device buffer, as uint64 (8 B/index) and as int32
  (4 B/index, N < 2^31), for every sampling mode (``block_affine``,
  ``feistel``, ``block_feistel``; ``--modes`` picks);
* ``cupy.random.permutation(N)``;
* ``torch.randperm(N, device="cuda")`` when PyTorch with CUDA is installed;
* a baseline: ``out.fill(0)`` on the same uint64 buffer, the write bandwidth a
  plain store kernel gets on this device;

and prints indices/s, the bytes the output holds per second (GB/s, 10^9
bytes), and that as a share of the device's nominal HBM bandwidth where it is
known (``--peak-gbs`` overrides). Times come from CUDA events around the
launch, best of ``--repeat``; the epoch plan (host, O(num_blocks)) and the
first compile are timed separately. docs/performance.md says what to expect.

    python bench/gpu_throughput.py                    # 10^6 .. 10^9
    python bench/gpu_throughput.py --max-n 1e8 --json gpu.json
    python bench/gpu_throughput.py --modes feistel

Without CuPy or a CUDA device it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from functools import partial

import numpy as np

from umlos_cuda.commands import _device_info as device_info
from umlos_cuda.errors import UmlosError

#: Nominal HBM bandwidth (GB/s, 10^9 B/s) by device-name fragment, from the vendors' data
#: sheets; the first fragment found in the device name wins.
NOMINAL_PEAK_GBS = (
    ("H200", 4800.0),
    ("H100 PCIe", 2000.0),
    ("H100 NVL", 3900.0),
    ("H100", 3350.0),  # SXM5 80 GB, HBM3
    ("A100-SXM4-80GB", 2039.0),
    ("A100 80GB PCIe", 1935.0),
    ("A100", 1555.0),  # 40 GB
    ("L4", 300.0),
)
DEFAULT_SIZES = (10**6, 10**7, 10**8, 10**9)
MODES = ("block_affine", "feistel", "block_feistel")
BLOCK_SIZE = 1 << 20
SEED16 = bytes(range(16))


def nominal_peak(name: str) -> float | None:
    for fragment, gbs in NOMINAL_PEAK_GBS:
        if fragment in name:
            return gbs
    return None


def time_gpu(cp, repeat: int, fn) -> float:
    """Best of ``repeat`` runs of ``fn`` in seconds, by CUDA events on the current stream."""
    fn()  # warm: allocations, compile, caches
    cp.cuda.Device().synchronize()
    best = float("inf")
    for _ in range(repeat):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(start, stop) / 1e3)
    return best


def row(n: int, what: str, seconds: float, bytes_per_index: int | None, peak: float | None) -> dict:
    rate = n / seconds
    gbs = None if bytes_per_index is None else rate * bytes_per_index / 1e9
    return {
        "n": n,
        "what": what,
        "seconds": seconds,
        "indices_per_s": rate,
        "gb_per_s": gbs,
        "share_of_peak": None if gbs is None or peak is None else gbs / peak,
    }


def measure(cp, backend, sizes, repeat: int, peak: float | None, torch_cuda, modes=MODES) -> list[dict]:
    rows = []
    free, _ = cp.cuda.runtime.memGetInfo()
    for n in sizes:
        # uint64 output, plus headroom for the shuffles' temporaries.
        if 8 * n * 3 > free:
            print(f"N = {n:.0e}: skipped, needs about {24 * n / 2**30:.0f} GiB of {free / 2**30:.0f} GiB free",
                  file=sys.stderr)
            continue
        out = cp.empty(n, dtype=np.uint64)
        # What this device's memory system gives a plain store of the same bytes.
        t = time_gpu(cp, repeat, partial(out.fill, 0))
        rows.append(row(n, "baseline: out.fill(0), uint64", t, 8, peak))
        out32 = cp.empty(n, dtype=np.int32) if n <= (1 << 31) else None
        for mode in modes:
            started = time.perf_counter()
            plan = backend.build_plan(SEED16, n, BLOCK_SIZE, mode)
            plan_s = time.perf_counter() - started
            t = time_gpu(cp, repeat, partial(backend.map_train, plan, 0, n, out=out))
            rows.append(row(n, f"{mode} map_train uint64", t, 8, peak) | {"plan_build_s": plan_s,
                                                                          "plan_builder": plan.builder, "mode": mode})
            if out32 is not None:
                t = time_gpu(cp, repeat, partial(backend.map_train, plan, 0, n, out=out32))
                rows.append(row(n, f"{mode} map_train int32", t, 4, peak))
            plan = None
        out = out32 = None  # free before the shuffles run
        cp.get_default_memory_pool().free_all_blocks()
        try:
            t = time_gpu(cp, repeat, partial(cp.random.permutation, n))
            rows.append(row(n, "cupy.random.permutation", t, 8, peak))
        except Exception as exc:  # out of memory at large N: reported, not fatal
            rows.append({"n": n, "what": "cupy.random.permutation", "error": f"{type(exc).__name__}: {exc}"})
        cp.get_default_memory_pool().free_all_blocks()
        if torch_cuda is not None:
            try:
                t = time_gpu(cp, repeat, partial(torch_cuda.randperm, n, device="cuda"))
                rows.append(row(n, "torch.randperm(device='cuda')", t, 8, peak))
            except Exception as exc:
                rows.append({"n": n, "what": "torch.randperm(device='cuda')", "error": f"{type(exc).__name__}: {exc}"})
            torch_cuda.cuda.empty_cache()
    return rows


def torch_with_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def print_table(header: dict, rows: list[dict]) -> None:
    for key, value in header.items():
        print(f"{key:<14} {value}")
    print()
    print(f"{'N':>14}  {'what':<34} {'indices/s':>12} {'GB/s':>8} {'of peak':>8}")
    for r in rows:
        if "error" in r:
            print(f"{r['n']:>14,}  {r['what']:<34} {r['error']}")
            continue
        gbs = f"{r['gb_per_s']:.1f}" if r["gb_per_s"] is not None else "-"
        share = f"{r['share_of_peak']:.0%}" if r["share_of_peak"] is not None else "-"
        print(f"{r['n']:>14,}  {r['what']:<34} {r['indices_per_s']:>12.3e} {gbs:>8} {share:>8}")
    plans = [r for r in rows if "plan_build_s" in r]
    if plans:
        print()
        for r in plans:
            print(f"{r['mode']} plan for N = {r['n']:,} (block {BLOCK_SIZE}): "
                  f"{r['plan_build_s'] * 1e3:.3f} ms on the host ({r['plan_builder']})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-n", type=float, default=1e9, help="largest N (default 1e9)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--peak-gbs", type=float, default=None, help="HBM bandwidth to compare with (GB/s)")
    parser.add_argument("--json", metavar="F", help="also write the rows and the header to F")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"sampling modes, comma-separated (default {','.join(MODES)})")
    args = parser.parse_args(argv)

    from umlos_cuda.backends import get_backend

    started = time.perf_counter()
    try:
        backend = get_backend("cupy")
    except UmlosError as exc:
        print(f"no GPU benchmark on this machine: {exc.message}")
        print(f"NVIDIA: {'; '.join(device_info.summary_lines())}")
        return 0
    setup_s = time.perf_counter() - started
    cp = backend.xp
    nvml_name = device_info.device_name(int(cp.cuda.runtime.getDevice()))
    name = backend.device_name()
    peak = args.peak_gbs if args.peak_gbs is not None else nominal_peak(name)
    header = {
        "device": name,
        "nvml": nvml_name,
        "nominal peak": f"{peak:.0f} GB/s" if peak else "unknown (pass --peak-gbs)",
        "cupy": cp.__version__,
        "host": f"{platform.node()} {platform.machine()}",
        "block size": BLOCK_SIZE,
        "timing": f"CUDA events, best of {args.repeat}",
    }
    header["backend setup"] = f"{setup_s * 1e3:.0f} ms (NVRTC compile or CuPy's cache, and the Philox check)"
    sizes = [n for n in DEFAULT_SIZES if n <= args.max_n]
    modes = tuple(mode.strip() for mode in args.modes.split(",") if mode.strip())
    rows = measure(cp, backend, sizes, args.repeat, peak, torch_with_cuda(), modes)
    print_table(header, rows)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"header": header, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
