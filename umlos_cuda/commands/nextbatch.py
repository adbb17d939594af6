"""``umlos-cuda next-batch`` and ``umlos-cuda indices`` (resolution R10).

``next-batch`` is one NextBatch_v2 call; ``indices`` writes a window of an
epoch's train sequence to a ``.npy`` file. Large windows are computed in
chunks straight into a memory-mapped file, so memory stays bounded and a
progress line shows how far it got; the file appears under its name only when
complete.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from ..atomic_file import atomic_path
from ..backends import BACKEND_NAMES, to_numpy
from ..cursor import Cursor
from ..manifest import Manifest
from ..nextbatch import STAGES, epoch_indices, epoch_window, next_batch
from ..presets import PRESETS
from ..progress import Progress

#: Positions computed per step of ``indices`` (128 MiB of uint64).
INDICES_CHUNK = 1 << 24
#: Indices printed by the human-readable form of ``next-batch``.
PREVIEW = 16


def register(subparsers) -> None:
    nb = subparsers.add_parser(
        "next-batch",
        help="one NextBatch_v2 call: this rank's micro-batch and the next cursor",
        description="Compute this rank's next micro-batch of sample indices and the cursor after it.",
    )
    nb.add_argument("manifest", help="manifest file (YAML or JSON)")
    nb.add_argument("--dataset", required=True, help="dataset key in manifest.datasets")
    nb.add_argument("--world-size", type=int, default=1)
    nb.add_argument("--rank", type=int, default=0)
    nb.add_argument("--stage", default="train", help=f"one of {', '.join(STAGES)} (default train)")
    nb.add_argument("--preset", choices=sorted(PRESETS), help="a seed §0.M preset (overrides --stage)")
    nb.add_argument("--epoch", type=int, default=0, help="cursor epoch before the call")
    nb.add_argument("--global-index", type=int, default=0, help="cursor global_index before the call")
    nb.add_argument("--backend", default="auto", choices=BACKEND_NAMES)
    output = nb.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print one JSON object: indices, cursor, metadata")
    output.add_argument("--out", metavar="F.npy", help="write the indices to a .npy file")
    nb.set_defaults(func=run_next_batch)

    ix = subparsers.add_parser(
        "indices",
        help="write a window of an epoch's train sequence to a .npy file",
        description="Write positions [start, start+count) of one epoch's train-mode sequence to a .npy file.",
    )
    ix.add_argument("manifest", help="manifest file (YAML or JSON)")
    ix.add_argument("--dataset", required=True, help="dataset key in manifest.datasets")
    ix.add_argument("--epoch", type=int, required=True)
    ix.add_argument("--start", type=int, default=0)
    ix.add_argument("--count", type=int, default=None, help="default: to the end of the epoch")
    ix.add_argument("--backend", default="auto", choices=BACKEND_NAMES)
    ix.add_argument("--out", metavar="F.npy", required=True)
    ix.add_argument("--quiet", action="store_true", help="no progress line")
    ix.set_defaults(func=run_indices)


def run_next_batch(args) -> int:
    manifest = Manifest.load(args.manifest)
    batch = next_batch(
        manifest,
        args.dataset,
        world_size=args.world_size,
        rank=args.rank,
        stage=args.stage,
        cursor=Cursor(args.epoch, args.global_index),
        backend=args.backend,
        preset=args.preset,
    )
    indices = to_numpy(batch.indices)
    if args.out:
        _save_npy(args.out, indices)
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
    manifest = Manifest.load(args.manifest)
    # Validate the whole window (and learn its length) before creating any file.
    start, count = epoch_window(manifest, args.dataset, args.start, args.count)
    progress = Progress(count, f"indices {args.out}", enabled=not args.quiet)
    with atomic_path(args.out) as temp:
        mapped = np.lib.format.open_memmap(temp, mode="w+", dtype=np.uint64, shape=(count,))
        for offset in range(0, count, INDICES_CHUNK):
            length = min(INDICES_CHUNK, count - offset)
            chunk = epoch_indices(
                manifest, args.dataset, epoch=args.epoch, start=start + offset, count=length, backend=args.backend
            )
            mapped[offset : offset + length] = to_numpy(chunk)
            progress.update(offset + length)
        mapped.flush()
        del mapped
    progress.close()
    print(f"wrote {count} indices (epoch {args.epoch}, positions [{start}, {start + count})) to {args.out}")
    return 0


def _save_npy(path: str, array: np.ndarray) -> None:
    with atomic_path(path) as temp:
        with open(temp, "wb") as handle:
            np.save(handle, array)
