"""``umlos-cuda demo``: the main job on a bundled default.

It plays a data-parallel training job: every rank of a ``W``-rank job asks
NextBatch_v2 for its micro-batch, batch after batch, and the demo checks on the
fly what the engine promises: the ranks' slices are disjoint, and in rank order
they are exactly the global batch a single process (W = 1) would see. It ends
with a table of what it checked and how fast each available backend produces
indices. The default manifest (``umlos_cuda/manifests/demo.yaml``) describes a
10^9-sample dataset, global batch 4096.
"""

from __future__ import annotations

import importlib
import sys
import time
from importlib import resources

import numpy as np

from .. import errors
from ..backends import AUTO_ORDER, available_backends, get_backend, to_numpy
from ..cursor import Cursor
from ..errors import UmlosError
from ..manifest.core import Manifest
from ..nextbatch import epoch_indices, next_batch
from ._args import any_int
from ._progress import Progress
from ._sampling_mode import add_sampling_mode_argument, with_sampling_mode

#: Positions timed per backend for the throughput column.
THROUGHPUT_WINDOW = 1 << 22
#: Timed runs per backend after the warm-up; the row shows the best.
THROUGHPUT_REPEAT = 5
#: What ``--workdir`` needs beyond NumPy: Ed25519 signatures and tensor shards.
#: Both are core dependencies; only an install made with ``--no-deps`` lacks them.
CHECKPOINT_PACKAGES = ("cryptography", "safetensors")


def missing_checkpoint_packages() -> list[str]:
    """The packages of CHECKPOINT_PACKAGES that cannot be imported here."""
    missing = []
    for name in CHECKPOINT_PACKAGES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def default_manifest_path() -> str:
    return str(resources.files("umlos_cuda").joinpath("manifests/demo.yaml"))


def register(subparsers) -> None:
    demo = subparsers.add_parser(
        "demo",
        help="stream global batches for every rank on a bundled 10^9-sample manifest and check them",
        description=__doc__.split("\n\n")[1],
    )
    demo.add_argument("--manifest", default=None, help="manifest file (default: the bundled demo.yaml)")
    demo.add_argument("--dataset", default="train")
    demo.add_argument("--world-size", type=any_int("world size"), default=8)
    demo.add_argument("--batches", type=any_int("batches"), default=64, help="global batches to stream (default 64)")
    demo.add_argument("--epoch", type=any_int("epoch"), default=0)
    demo.add_argument("--global-index", type=any_int("global index"), default=0, help="cursor position to start from")
    demo.add_argument("--backend", default="auto", choices=("auto",) + AUTO_ORDER)
    add_sampling_mode_argument(demo)
    demo.add_argument(
        "--workdir",
        default=None,
        help="also write a checkpoint store here every --every-k steps, crash, restore, and check the continuation",
    )
    demo.add_argument("--steps", type=any_int("steps"), default=48,
                      help="training steps of the checkpoint part (default 48)")
    demo.add_argument("--every-k", type=any_int("every k"), default=8,
                      help="checkpoint interval of the checkpoint part (default 8)")
    demo.add_argument("--quiet", action="store_true", help="no progress line")
    demo.set_defaults(func=run)


def run(args) -> int:
    missing = missing_checkpoint_packages() if args.workdir else []
    if missing:  # say so before the first part runs, not with a traceback after it
        print(
            f"error: --workdir writes signed checkpoints and needs {' and '.join(missing)}, which umlos-cuda "
            f"depends on but this environment lacks (installed with --no-deps?): pip install {' '.join(missing)}",
            file=sys.stderr,
        )
        return 2
    manifest = with_sampling_mode(Manifest.load(args.manifest or default_manifest_path()), args.sampling_mode)
    summary = stream_and_check(
        manifest,
        args.dataset,
        world_size=args.world_size,
        batches=args.batches,
        cursor=Cursor(args.epoch, args.global_index),
        backend=args.backend,
        show_progress=not args.quiet,
    )
    print_table(summary, throughput(manifest, args.dataset))
    if args.workdir:
        checkpoint_part(manifest, args)
    return 0


def checkpoint_part(manifest, args) -> None:
    """Write, crash, restore and compare through a real checkpoint store (docs/checkpoint-format.md)."""
    from ._checkpoint_demo import run_checkpoint_demo

    print(f"\ncheckpoint store in {args.workdir}: a checkpoint every {args.every_k} of {args.steps} steps")
    result = run_checkpoint_demo(
        args.workdir,
        manifest,
        dataset_key=args.dataset,
        world_size=args.world_size,
        steps=args.steps,
        every_k=args.every_k,
        backend=args.backend,
        log=(lambda line: None) if args.quiet else (lambda line: print(f"  {line}")),
    )
    rows = [
        ("commits", result["commits"]),
        ("crashed after step", result["crash_after_step"]),
        ("restored from step", result["restored_from_step"]),
        ("steps compared", f"{result['steps_compared']} (identical: {result['identical']})"),
        ("latest checkpoint", result["container"]),
        ("checkpoint_hash", result["checkpoint_hash"]),
        ("head", f"{result['head']} (keep it elsewhere: --expect-head refuses a rolled-back store)"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    print(f"  verify it:  umlos-cuda checkpoint verify {result['store']} --public-key {result['public_key']} "
          f"--expect-head {result['head']}")


def stream_and_check(manifest, dataset_key, *, world_size, batches, cursor, backend, show_progress=True) -> dict:
    """Stream ``batches`` global batches for every rank and verify them on the fly.

    Raises UmlosError(CONTRACT_VIOLATION) at the first batch whose ranks
    overlap or do not reconstruct the W = 1 batch.
    """
    if batches < 1:
        raise UmlosError(errors.INVALID_ARGUMENT, f"--batches must be at least 1, got {batches}",
                         operator=errors.DEMO_OPERATOR)
    progress = Progress(batches, f"demo W={world_size}", enabled=show_progress)
    seen = []
    start_cursor = cursor
    backend_name = None
    started = time.perf_counter()
    for step in range(batches):
        parts = []
        for rank in range(world_size):
            batch = next_batch(manifest, dataset_key, world_size=world_size, rank=rank, cursor=cursor, backend=backend)
            parts.append(to_numpy(batch.indices))
            backend_name = batch.metadata["backend"]
            config_hash = batch.metadata["sampler_config_hash"]
            sampling_mode = batch.metadata["sampling_mode"]
        single = next_batch(manifest, dataset_key, world_size=1, rank=0, cursor=cursor, backend=backend)
        combined = np.concatenate(parts)
        if np.unique(combined).size != combined.size:
            raise UmlosError(errors.CONTRACT_VIOLATION, f"batch {step}: ranks' slices overlap",
                             operator=errors.DEMO_OPERATOR)
        if not np.array_equal(combined, to_numpy(single.indices)):
            raise UmlosError(errors.CONTRACT_VIOLATION, f"batch {step}: ranks do not reconstruct the W = 1 batch",
                             operator=errors.DEMO_OPERATOR)
        if single.cursor != batch.cursor:
            raise UmlosError(errors.CONTRACT_VIOLATION,
                             f"batch {step}: cursors differ between W = {world_size} and W = 1",
                             operator=errors.DEMO_OPERATOR)
        seen.append(combined)
        cursor = batch.cursor
        progress.update(step + 1)
    progress.close()
    elapsed = time.perf_counter() - started
    everything = np.concatenate(seen)
    if np.unique(everything).size != everything.size:
        raise UmlosError(errors.CONTRACT_VIOLATION, "an index repeated within the streamed window",
                         operator=errors.DEMO_OPERATOR)
    return {
        "manifest": manifest,
        "dataset_key": dataset_key,
        "world_size": world_size,
        "batches": batches,
        "indices": int(everything.size),
        "cursor_start": start_cursor,
        "cursor_end": cursor,
        "backend": backend_name,
        "sampler_config_hash": config_hash,
        "sampling_mode": sampling_mode,
        "calls_per_second": batches * (world_size + 1) / elapsed,
    }


def throughput(manifest, dataset_key, window: int = THROUGHPUT_WINDOW,
               repeat: int = THROUGHPUT_REPEAT) -> dict[str, str | float]:
    """indices/s of ``epoch_indices`` on each backend (a reason where unavailable).

    Each backend first runs the window once, untimed: that builds the epoch
    plan, compiles the kernels and touches every page of the output array.
    Then ``repeat`` timed runs write into that same array, and the rate is the
    best of them. A single cold run measured page faults and compiles more than
    the index map (native once came out slower than NumPy that way), and on a
    shared machine the best run is the least disturbed one.
    """
    n = manifest.dataset(dataset_key).cardinality
    window = min(window, n)
    start = (n - window) // 2
    rates: dict[str, str | float] = {}
    for name, status in available_backends().items():
        if status != "ok":
            rates[name] = status
            continue
        synchronize = getattr(get_backend(name), "synchronize", None) or (lambda: None)
        try:
            out = epoch_indices(manifest, dataset_key, start=start, count=window, backend=name)  # warm-up
        except UmlosError as exc:  # a backend without the code of the manifest's sampling mode
            if exc.code != errors.INVALID_MANIFEST:
                raise
            rates[name] = exc.message
            continue
        synchronize()
        best = float("inf")
        for _ in range(repeat):
            started = time.perf_counter()
            epoch_indices(manifest, dataset_key, start=start, count=window, backend=name, out=out)
            synchronize()
            best = min(best, time.perf_counter() - started)
        rates[name] = window / best
        del out
    return rates


def print_table(summary: dict, rates: dict) -> None:
    manifest = summary["manifest"]
    n = manifest.dataset(summary["dataset_key"]).cardinality
    rows = [
        ("dataset", f"{summary['dataset_key']} (N = {n:,}, global batch {manifest.global_batch_size})"),
        ("world size", f"{summary['world_size']} ranks, each checked against W = 1"),
        ("global batches", f"{summary['batches']} ({summary['indices']:,} indices, all distinct)"),
        ("cursor", f"{summary['cursor_start'].to_dict()} -> {summary['cursor_end'].to_dict()}"),
        ("sampling mode", f"{manifest.sampling_mode} ({summary['sampling_mode']})"),
        ("backend used", summary["backend"]),
        ("next_batch calls/s", f"{summary['calls_per_second']:,.0f}"),
        ("sampler_config_hash", summary["sampler_config_hash"]),
        ("manifest_hash", manifest.hash.hex()),
    ]
    for name, rate in rates.items():
        value = (f"{rate:,.0f} indices/s (best of {THROUGHPUT_REPEAT} warm runs)"
                 if isinstance(rate, float) else f"unavailable: {rate}")
        rows.append((f"epoch_indices [{name}]", value))
    width = max(len(name) for name, _ in rows)
    print("\nall checks passed")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
