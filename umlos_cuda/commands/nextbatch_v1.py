"""``umlos-cuda next-batch-v1``: one NextBatch_v1 call (docs/spec/nextbatch-v1.md).

Prints this rank's shard of an epoch's permutation, or one JSON object
(``--json``), or writes the shard to a ``.npy`` file (``--output``), as
``next-batch`` does for v2. The command keeps no state: ``--misc-offset O``
runs the call as the declared operator with the ``misc`` sub-stream of the
manifest's RNG master at offset ``O`` (as restored from a checkpoint) and
prints the draw it takes and the offset after; without it no draw is made.
"""

from __future__ import annotations

import json
import sys

from ..files.atomic import check_output_path
from ..backends import BACKEND_NAMES
from ..manifest.core import Manifest
from ..rng.nextbatch_v1 import next_batch_v1
from ..rng.streams import STATE_FORMAT, RngStreams
from ._args import add_option, non_negative_int, positive_int
from .nextbatch import BACKEND_HELP, PREVIEW, write_npy


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "next-batch-v1",
        help="one NextBatch_v1 call: this rank's strided shard of an epoch's permutation",
        description="Compute indices[rank::world_size] of epoch E's permutation (UML_OS.Data.NextBatch_v1). "
        "Prints a summary, or one JSON object (--json), or writes the shard to a .npy file (--output).",
    )
    parser.add_argument("manifest", help="manifest file (YAML or JSON)")
    parser.add_argument("--dataset", required=True, help="dataset key in the manifest's datasets")
    parser.add_argument("--world-size", type=positive_int("world size"), default=1, metavar="W",
                        help="number of data-parallel ranks, any W >= 1 (default 1)")
    parser.add_argument("--rank", type=non_negative_int("rank"), default=0, metavar="R",
                        help="this process's rank, 0 to W-1 (default 0)")
    parser.add_argument("--epoch", type=non_negative_int("epoch"), default=0, metavar="E",
                        help="the epoch (v1's only cursor) (default 0)")
    parser.add_argument("--misc-offset", type=non_negative_int("misc offset"), default=None, metavar="O",
                        help="take the operator's one misc draw at offset O of the manifest's RNG master "
                             "(default: no draw)")
    parser.add_argument("--backend", default="auto", choices=BACKEND_NAMES, help=BACKEND_HELP)
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print one JSON object: indices, misc_draw, metadata")
    add_option(output, "--output", old=("--out",), dest="out", metavar="F.npy",
               help="write the shard to a .npy file (a new file, or an existing one with --force)")
    parser.add_argument("--force", action="store_true", help="with --output: replace an existing regular file")
    parser.set_defaults(func=run)


def run(args) -> int:
    if args.out:
        check_output_path(args.out, args.force, inputs=(args.manifest,))
    manifest = Manifest.load(args.manifest)
    streams = None
    if args.misc_offset is not None:
        streams = RngStreams.from_manifest(manifest)
        streams.load_state_dict({"format": STATE_FORMAT, "master_seed": streams.master_seed,
                                 "offsets": {"init": 0, "cluster": 0, "misc": args.misc_offset}})
    batch = next_batch_v1(manifest, args.dataset, args.world_size, args.rank, args.epoch, streams=streams,
                          backend=args.backend)
    indices = batch.indices
    draw = "" if batch.misc_draw is None else f"; misc draw {batch.misc_draw}"
    if args.out:
        write_npy(args.out, args.force, indices, inputs=(args.manifest,))
        print(f"wrote {indices.size} indices to {args.out}{draw}")
    elif args.json:
        json.dump({"indices": indices.tolist(), "misc_draw": batch.misc_draw, "metadata": batch.metadata}, sys.stdout)
        sys.stdout.write("\n")
    else:
        meta = batch.metadata
        shown = " ".join(str(i) for i in indices[:PREVIEW].tolist())
        more = f" ... ({indices.size} in all)" if indices.size > PREVIEW else ""
        print(f"indices       {shown}{more}")
        print(f"epoch         {meta['epoch']}  (rank {meta['rank']} of {meta['world_size']}, strided)")
        if batch.misc_draw is not None:
            print(f"misc draw     {batch.misc_draw}  (misc offset {meta['misc_offset_before']} -> "
                  f"{meta['misc_offset_after']})")
        for name in ("order_hash", "manifest_hash", "backend"):
            print(f"{name:<13} {meta[name]}")
    return 0
