"""``umlos-cuda next-batch`` and ``umlos-cuda indices`` (resolution R10).

``next-batch`` is one NextBatch_v2 call; ``indices`` writes a window of an
epoch's train sequence to a ``.npy`` file. Large windows are computed in
chunks and written with ordinary ``write`` calls, so memory stays bounded, a
progress line shows how far it got, and a full disk is an error message
rather than the SIGBUS a memory-mapped file gets. Output files are written by
``umlos_cuda.files.atomic``: only to a new name or (``--force``) an existing
regular file, appearing under their name only when complete.
"""

from __future__ import annotations

import io
import json
import sys

import numpy as np

from ..files.atomic import atomic_output, check_output_path
from ..backends import BACKEND_NAMES, to_numpy
from ..manifest.core import Manifest
from ..nextbatch import STAGES, epoch_indices, epoch_window, next_batch
from ..presets import PRESETS
from ._progress import Progress
from ._args import add_option, non_negative_int, positive_int
from ._sampling_mode import add_sampling_mode_argument, with_sampling_mode

#: Positions computed per step of ``indices`` (128 MiB of uint64).
INDICES_CHUNK = 1 << 24
#: Indices printed by the human-readable form of ``next-batch``.
PREVIEW = 16
#: What the .npy files hold: little-endian uint64, whatever the host.
NPY_DTYPE = np.dtype("<u8")
BACKEND_HELP = ("numpy, native (C++ on this CPU), cupy (NVIDIA GPU) or auto: the first usable of cupy, native, numpy "
                "(default auto)")


def register(subparsers) -> None:
    nb = subparsers.add_parser(
        "next-batch",
        help="one NextBatch_v2 call: this rank's micro-batch and the next cursor",
        description="Compute this rank's next micro-batch of sample indices and the cursor after it. "
        "Prints a summary, or one JSON object (--json), or writes the indices to a .npy file (--output).",
    )
    nb.add_argument("manifest", help="manifest file (YAML or JSON)")
    nb.add_argument("--dataset", required=True, help="dataset key in the manifest's datasets")
    nb.add_argument("--world-size", type=positive_int("world size"), default=1, metavar="W",
                    help="number of data-parallel ranks; must divide global_batch_size (default 1)")
    nb.add_argument("--rank", type=non_negative_int("rank"), default=0, metavar="R",
                    help="this process's rank, 0 to W-1 (default 0)")
    nb.add_argument("--stage", default="train", choices=STAGES,
                    help="train (shuffled), eval or infer (in order, last partial batch kept) (default train)")
    nb.add_argument("--preset", choices=sorted(PRESETS),
                    help="a named configuration instead of --stage: train_shuffle, eval_sequential, or "
                         "streaming_infinite (batches run on into the next epoch; see docs/nextbatch.md)")
    nb.add_argument("--epoch", type=non_negative_int("epoch"), default=0, metavar="E",
                    help="the cursor's epoch before the call (default 0)")
    nb.add_argument("--global-index", type=non_negative_int("global index"), default=0, metavar="G",
                    help="the cursor's position within the epoch before the call (default 0)")
    nb.add_argument("--backend", default="auto", choices=BACKEND_NAMES, help=BACKEND_HELP)
    add_sampling_mode_argument(nb)
    output = nb.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print one JSON object: indices, cursor, metadata")
    add_option(output, "--output", old=("--out",), dest="out", metavar="F.npy",
               help="write the indices to a .npy file (a new file, or an existing one with --force)")
    nb.add_argument("--force", action="store_true", help="with --output: replace an existing regular file")
    nb.set_defaults(func=run_next_batch)

    ix = subparsers.add_parser(
        "indices",
        help="write a window of an epoch's train sequence to a .npy file",
        description="Write positions [start, start+count) of one epoch's shuffled (train) sequence to a "
        ".npy file of little-endian uint64. The file appears under its name only when complete.",
    )
    ix.add_argument("manifest", help="manifest file (YAML or JSON)")
    ix.add_argument("--dataset", required=True, help="dataset key in the manifest's datasets")
    ix.add_argument("--epoch", type=non_negative_int("epoch"), required=True, metavar="E",
                    help="the epoch whose order to write")
    ix.add_argument("--start", type=non_negative_int("start"), default=0, metavar="S",
                    help="first position of the window (default 0)")
    ix.add_argument("--count", type=non_negative_int("count"), default=None, metavar="C",
                    help="number of positions (default: to the end of the epoch)")
    ix.add_argument("--backend", default="auto", choices=BACKEND_NAMES, help=BACKEND_HELP)
    add_sampling_mode_argument(ix)
    add_option(ix, "--output", old=("--out",), dest="out", metavar="F.npy", required=True,
               help="the .npy file to write (a new file, or an existing one with --force)")
    ix.add_argument("--force", action="store_true", help="replace an existing regular file")
    ix.add_argument("--quiet", action="store_true", help="no progress line")
    ix.set_defaults(func=run_indices)


def run_next_batch(args) -> int:
    if args.out:
        check_output_path(args.out, args.force, inputs=(args.manifest,))  # refuse a bad --output before computing
    manifest = with_sampling_mode(Manifest.load(args.manifest), args.sampling_mode)
    batch = next_batch(
        manifest,
        args.dataset,
        world_size=args.world_size,
        rank=args.rank,
        stage=args.stage,
        cursor={"epoch": args.epoch, "global_index": args.global_index},  # checked by the call: spec §2 check 9
        backend=args.backend,
        preset=args.preset,
    )
    indices = to_numpy(batch.indices)
    if args.out:
        write_npy(args.out, args.force, indices, inputs=(args.manifest,))
        print(f"wrote {indices.size} indices to {args.out}; next cursor {batch.cursor.to_dict()}")
    elif args.json:
        json.dump(
            {"indices": indices.tolist(), "cursor": batch.cursor.to_dict(), "metadata": batch.metadata},
            sys.stdout,
        )
        sys.stdout.write("\n")
    else:
        meta = batch.metadata
        shown = " ".join(str(i) for i in indices[:PREVIEW].tolist())
        more = f" ... ({indices.size} in all)" if indices.size > PREVIEW else ""
        print(f"indices       {shown}{more}")
        print(f"cursor        {batch.cursor.to_dict()}  (was {meta['cursor_before']})")
        for name in ("sampling_mode", "sampler_config_hash", "data_replay_t", "backend"):
            print(f"{name:<13} {meta[name]}")
    return 0


def run_indices(args) -> int:
    manifest = with_sampling_mode(Manifest.load(args.manifest), args.sampling_mode)
    # Validate the whole window (and learn its length) before creating any file.
    start, count = epoch_window(manifest, args.dataset, args.start, args.count, epoch=args.epoch)
    header = npy_header(count)
    progress = Progress(count, f"indices {args.out}", enabled=not args.quiet)
    try:
        with atomic_output(args.out, force=args.force, size=len(header) + count * NPY_DTYPE.itemsize,
                           inputs=(args.manifest,)) as handle:
            handle.write(header)
            for offset in range(0, count, INDICES_CHUNK):
                length = min(INDICES_CHUNK, count - offset)
                chunk = epoch_indices(
                    manifest, args.dataset, epoch=args.epoch, start=start + offset, count=length, backend=args.backend
                )
                handle.write(_le_bytes(to_numpy(chunk)))
                progress.update(offset + length)
    finally:
        progress.close()
    print(f"wrote {count} indices (epoch {args.epoch}, positions [{start}, {start + count})) to {args.out}")
    return 0


def write_npy(path: str, force: bool, indices: np.ndarray, inputs=()) -> None:
    """Write ``indices`` to ``path`` as a .npy file of NPY_DTYPE, which appears
    under its name only when complete (a new file, or with ``force`` an
    existing regular one that is none of ``inputs``)."""
    header = npy_header(indices.size)
    with atomic_output(path, force=force, size=len(header) + indices.size * NPY_DTYPE.itemsize,
                       inputs=inputs) as handle:
        handle.write(header)
        handle.write(_le_bytes(indices))


def npy_header(count: int) -> bytes:
    """The .npy (format 1.0) header of a 1-D array of ``count`` NPY_DTYPE values,
    byte for byte what ``np.save`` writes before the data."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": np.lib.format.dtype_to_descr(NPY_DTYPE), "fortran_order": False, "shape": (count,)}
    )
    return buffer.getvalue()


def _le_bytes(indices: np.ndarray) -> memoryview:
    """The array's bytes as NPY_DTYPE, without a copy when it already is one."""
    return np.ascontiguousarray(indices, dtype=NPY_DTYPE).data.cast("B")
