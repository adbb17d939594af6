"""``umlos-cuda quality``: how well each sampling mode mixes a dataset, beside a true shuffle.

It measures every registered sampling mode (modes made of blocks at several
block sizes) and ``numpy.random.Generator.permutation`` on one dataset: by
default N = 10^7 samples stored sorted into 100 classes, or the classes of
your own samples (``--labels labels.npy``, one label per sample in storage
order). It prints a table (batch class-mix TV, consecutive jumps, Spearman
correlation, a chi-square test, first-batch overlap between epochs) and writes
a PNG with one panel per statistic (needs matplotlib: the ``plot`` extra).
docs/sampling-modes.md explains the columns and which mode to pick.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..files.atomic import check_output_path
from ..backends import BACKEND_NAMES
from ..quality import QualityConfig, candidates, class_sorted_labels, describe, format_table, load_labels, run_report
from ..quality.figure import matplotlib_missing, write_png
from ..quality.orders import DEFAULT_BLOCK_SIZES
from ..quality.report import DEFAULT_BATCH_SIZE, DEFAULT_BUCKETS, DEFAULT_EPOCHS
from ._args import add_option, non_negative_int, positive_int

DEFAULT_SAMPLES = 10_000_000
DEFAULT_CLASSES = 100
DEFAULT_OUT = "quality.png"


def _int_list(what: str):
    item = positive_int(what)

    def parse(text: str) -> list[int]:
        return [item(part.strip()) for part in text.split(",") if part.strip()] or [item(text)]

    return parse


def _name_list(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"--modes takes a comma-separated list of sampling modes, got {text!r}")
    return names


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "quality",
        help="compare how well each sampling mode mixes a class-sorted dataset (or your labels) with a true shuffle",
        description=__doc__.split("\n\n")[1],
    )
    data = parser.add_argument_group("dataset (a synthetic class-sorted one, or --labels)")
    data.add_argument("--samples", type=positive_int("--samples"), default=None, metavar="N",
                      help=f"samples of the synthetic dataset (default {DEFAULT_SAMPLES:,})")
    data.add_argument("--classes", type=positive_int("--classes"), default=None, metavar="C",
                      help=f"classes the synthetic dataset is sorted into (default {DEFAULT_CLASSES})")
    data.add_argument("--labels", metavar="FILE.npy",
                      help="a .npy array of one label per sample, in the dataset's storage order "
                           "(integers, booleans or strings), instead of the synthetic dataset")
    parser.add_argument("--batch-size", type=positive_int("--batch-size"), default=DEFAULT_BATCH_SIZE, metavar="B",
                        help=f"global batch size (default {DEFAULT_BATCH_SIZE})")
    parser.add_argument("--modes", type=_name_list, default=None, metavar="M1,M2",
                        help="sampling modes to compare (default: every registered mode)")
    parser.add_argument("--block-sizes", type=_int_list("--block-sizes"), default=list(DEFAULT_BLOCK_SIZES),
                        metavar="S1,S2", help="sampler_block_size values for modes made of blocks "
                        f"(default {','.join(str(b) for b in DEFAULT_BLOCK_SIZES)})")
    parser.add_argument("--buckets", type=positive_int("--buckets"), default=DEFAULT_BUCKETS, metavar="K",
                        help="position and index buckets of the chi-square table, 2 to 1024 (default "
                             f"{DEFAULT_BUCKETS})")
    parser.add_argument("--epochs", type=positive_int("--epochs"), default=DEFAULT_EPOCHS, metavar="E",
                        help=f"epochs whose first batches are compared, at least 2 (default {DEFAULT_EPOCHS})")
    parser.add_argument("--seed", type=non_negative_int("--seed"), default=0, help="manifest seed (default 0)")
    parser.add_argument("--backend", default="auto", choices=BACKEND_NAMES,
                        help="where the engine's orders are computed (default auto: the first of cupy, native, "
                             "numpy that has each mode's code; the bits are the same)")
    figure = parser.add_argument_group("output")
    add_option(figure, "--output", old=("--out",), dest="out", default=DEFAULT_OUT, metavar="FILE.png",
               help=f"the figure to write (default {DEFAULT_OUT}; a new file, or an existing one with --force)")
    figure.add_argument("--force", action="store_true", help="replace an existing --output file")
    figure.add_argument("--no-plot", action="store_true", help="print the table only")
    figure.add_argument("--json", action="store_true", help="print the measurements as one JSON object")
    figure.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.set_defaults(func=run, parser=parser)


def run(args) -> int:
    if args.labels is not None and (args.samples is not None or args.classes is not None):
        args.parser.error("--labels gives the dataset; leave out --samples and --classes")
    missing = None if args.no_plot else matplotlib_missing()
    plot = not args.no_plot and missing is None
    if plot:
        check_output_path(args.out, args.force, inputs=(args.labels,))  # refuse a bad --output before the work
    if args.labels is not None:
        labels = load_labels(args.labels)
    else:
        labels = class_sorted_labels(args.samples or DEFAULT_SAMPLES, args.classes or DEFAULT_CLASSES)
    config = QualityConfig(batch_size=args.batch_size, buckets=args.buckets, epochs=args.epochs, seed=args.seed,
                           backend=args.backend)
    log = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    report = run_report(labels, candidates(args.modes, args.block_sizes), config, log=log)
    if args.json:
        json.dump(report.to_dict(), sys.stdout)
        sys.stdout.write("\n")
    else:
        print(describe(report))
        print()
        print(format_table(report))
    if plot:
        write_png(report, args.out, force=args.force)
        print(f"wrote {args.out}", file=sys.stderr if args.json else sys.stdout)
    elif missing is not None:
        print(f"no figure: {missing}", file=sys.stderr)
    return 0
