"""``umlos-cuda batch generate|check|fingerprint|verify``: batch files and content fingerprints.

``generate`` collates every microbatch of a plan from its token store (or
Megatron dataset) into ``epoch_{e}_batch_{index:04d}.npz`` files (compact
or the six-array ``npz`` layout, optionally zstd: batches/layouts.py), resuming
after a crash; ``check`` verifies a finished folder against its plan (and
the store); ``fingerprint`` prints (and saves) the content fingerprint of
the first N microbatches; ``verify`` recomputes it and exits 2 with
BATCH_FINGERPRINT_MISMATCH, naming the first differing microbatch, when it
is not the expected one. docs/batching.md, "Batch files" and "Fingerprints".
"""

from __future__ import annotations

import argparse

import os
import time

from ._args import add_no_verify_argument, add_option, integer_list, non_negative_int, positive_int


def register(subparsers) -> None:
    batch = subparsers.add_parser(
        "batch", help="write batch files from a plan and a token store; content fingerprints",
        description="Turn a batch plan and its token store into collated batch files, check them, and fingerprint "
        "the content of the first microbatches for replay verification.",
    )
    actions = batch.add_subparsers(dest="batch_action", metavar="ACTION")

    generate = actions.add_parser(
        "generate", help="write one batch file per microbatch of a plan",
        description="Collate every microbatch of every epoch of the plan (whole, windowed or mixed) from the token "
        "store (a folder written by `data tokenize`, or the prefix of a Megatron .idx/.bin pair; for a mixed plan, "
        "one per component, in the plan's order) and write OUTPUT/epoch_<e>_batch_<i>.npz "
        "(.npz.zst with --compress zstd), "
        "each atomically, with OUTPUT/plan and OUTPUT/batches.json. Run it again after a crash: finished files are "
        "kept when they are byte-identical to what it would write, the rest is written.",
    )
    _plan_and_store(generate)
    add_no_verify_argument(generate, reads="the plan and the store")
    generate.add_argument("--output", required=True, metavar="DIR", help="the batch folder (created)")
    generate.add_argument("--workers", type=positive_int("workers"), metavar="N",
                          help="writer threads (default: the CPU count, at most 8)")
    generate.add_argument("--force", action="store_true", help="replace a batch folder written for another job")
    generate.add_argument("--layout", choices=("compact", "npz", "index"), default="compact",
                          help="compact (default): each token once, uint16 when the store's vocabulary fits, masks "
                          "bit-packed or derived; npz: the six int32 arrays of collation; index: no files, the "
                          "reader collates from the store and checks each microbatch's recorded digest "
                          "(docs/batching.md, \"Batch file layouts\")")
    generate.add_argument("--compress", choices=("none", "zstd"), default="none",
                          help="zstd-compress each compact file (needs the zstandard package: the data extra)")
    generate.add_argument("--quiet", action="store_true", help="no progress line")
    generate.set_defaults(func=run_generate)

    check = actions.add_parser(
        "check", help="verify every batch file of a finished folder",
        description="Check every file against its plan microbatch (epoch, index, sample ids, bucket, pad length), "
        "the consistency of its arrays and the digest batches.json records; with --source, also that its bytes are "
        "exactly a fresh collation's. Exit 2 with the failure code at the first file that fails.",
    )
    check.add_argument("batches", metavar="DIR")
    add_option(check, "--source", old=("--store",), dest="store", metavar="SOURCE", nargs="+", action=StoreSource,
               help="also compare with this token source (a token store, sharded or not, or Megatron prefixes; for "
               "a mixed plan, one per component, in the plan's order); needed for an index-only folder")
    check.add_argument("--rank", type=non_negative_int("rank"), metavar="R",
                       help="with --world-size: only this rank's files")
    check.add_argument("--world-size", type=positive_int("world size"), metavar="W")
    add_no_verify_argument(check, reads="the folder's plan and the --source")
    check.set_defaults(func=run_check)

    fingerprint = actions.add_parser(
        "fingerprint", help="print the content fingerprint of the first N microbatches",
        description="Collate the plan's first N microbatches (in training order from epoch 0) from the store, or "
        "read them from a batch folder (--batches), and print their content fingerprint; --output saves it with "
        "each microbatch's digest, so that `batch verify` can name the first microbatch that differs.",
    )
    _plan_and_store(fingerprint, batches=True)
    add_no_verify_argument(fingerprint, reads="the plan and the store")
    fingerprint.add_argument("--n-batches", type=positive_int("n batches"), default=100, metavar="N",
                             help="microbatches covered (default 100)")
    fingerprint.add_argument("--output", metavar="FILE", help="save the fingerprint (JSON) here")
    fingerprint.add_argument("--force", action="store_true", help="replace an existing --output file")
    fingerprint.set_defaults(func=run_fingerprint)

    verify = actions.add_parser(
        "verify", help="check the batches' content against an expected fingerprint",
        description="Recompute the content fingerprint of the plan's first N microbatches from the store and compare "
        "it with --expected-fingerprint: a hex digest, or a file saved by `batch fingerprint --output` (then N is "
        "the file's, and a mismatch names the first microbatch that differs). With --batches DIR instead of --plan "
        "and --source, the microbatches are those the batch files decode to, in any layout. Exit 2 with "
        "BATCH_FINGERPRINT_MISMATCH on a mismatch.",
    )
    _plan_and_store(verify, batches=True)
    verify.add_argument("--expected-fingerprint", required=True, metavar="F",
                        help="hex digest or saved fingerprint file")
    verify.add_argument("--n-batches", type=positive_int("n batches"), default=100, metavar="N",
                        help="microbatches covered when F is a hex digest (default 100)")
    verify.set_defaults(func=run_verify)
    batch.set_defaults(func=lambda args: (batch.print_help(), 1)[1])


class StoreSource(argparse.Action):
    """``--source A`` gives the path ``A``; ``--source A B`` the list (Megatron prefixes read as one)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values[0] if len(values) == 1 else list(values))


def _plan_and_store(parser, *, batches: bool = False) -> None:
    parser.add_argument("--plan", required=not batches, metavar="DIR", help="a plan folder (plan build)")
    add_option(parser, "--source", old=("--store",), dest="store", required=not batches, metavar="SOURCE", nargs="+",
               action=StoreSource, help="the token source: a token store folder (data tokenize, sharded or not) or a "
               "Megatron dataset prefix (PREFIX.idx/.bin); several prefixes are one dataset, in the order given, "
               "except for a mixed plan, which takes one token source per component, in the plan's order")
    if batches:
        parser.add_argument("--batches", metavar="DIR",
                            help="instead of --plan and --source: a batch folder (batch generate), any layout; its "
                            "files are read and their arrays hashed (an index-only folder's are collated from "
                            "--source and checked against its recorded digests)")
    parser.add_argument("--separator-ids", default="", metavar="ID,...",
                        help="for a plan packed with --pack-separator-len N: the N token ids between a row's samples")


def _separator_ids(args) -> tuple[int, ...]:
    from ..batching.collate import collate_error

    return integer_list(args.separator_ids, "--separator-ids", 0, (1 << 31) - 1, fail=collate_error)


def run_generate(args) -> int:
    from ..batching.batches.writer import BatchWriter
    from ._progress import Progress

    started = time.perf_counter()
    writer = BatchWriter(args.plan, args.output, args.store, workers=args.workers, force=args.force,
                         separator_ids=_separator_ids(args), verify=not args.no_verify, layout=args.layout,
                         compression=args.compress)
    progress = Progress(writer.total_microbatches, f"batches {args.output}", enabled=not args.quiet)
    try:
        report = writer.write_all(lambda done, _: progress.update(done))
    finally:
        progress.close()
    seconds = time.perf_counter() - started
    if writer.layout.has_files:
        print(f"batch files {args.output}: {report.files} files ({report.written} written, {report.kept} kept, "
              f"{report.rewritten} rewritten) in {seconds:.2f} s")
    else:
        print(f"batch folder {args.output}: index-only, {report.files} microbatch digests (no batch files) in "
              f"{seconds:.2f} s")
    print(f"batch fingerprint {report.fingerprint.fingerprint} (first {len(report.fingerprint.digests)} microbatches)")
    return 0


def run_check(args) -> int:
    from ..batching.batches.reader import BatchReader
    from ..batching.plans.buckets import config_error

    reader = BatchReader(args.batches, store=args.store)
    if (args.rank is None) != (args.world_size is None):
        raise config_error("--rank and --world-size go together")
    if args.world_size is not None:
        reader = reader.shard(args.rank, args.world_size)
    report = reader.verify(args.store, digests=not args.no_verify)
    against = " and the token store" if report["against_store"] else ""
    what = "batch files" if reader.layout.has_files else "microbatches of an index-only folder"
    print(f"ok  {report['files']} {what} match plan {report['plan_fingerprint']}{against}")
    print(f"batch fingerprint {report['batch_fingerprint']}")
    return 0


def run_fingerprint(args) -> int:
    from ..files.atomic import check_output_path

    stores = [] if args.store is None else args.store if isinstance(args.store, list) else [args.store]
    inputs = (*(path for path in (args.batches, args.plan) if path),
              *(path for store in stores for path in (store, f"{store}.idx", f"{store}.bin")))
    if args.output:
        check_output_path(args.output, args.force, inputs=inputs)
    fingerprint = _fingerprint(args, args.n_batches)
    if args.output:
        fingerprint.save(args.output, force=args.force, inputs=inputs)
        print(f"saved {args.output}")
    print(f"batch fingerprint {fingerprint.fingerprint} (first {len(fingerprint.digests)} microbatches)")
    return 0


def run_verify(args) -> int:
    from ..batching.batches.fingerprint import BatchFingerprint, compare_fingerprints

    expected = args.expected_fingerprint
    if os.path.isfile(expected):
        expected = BatchFingerprint.load(expected)
    elif not (len(expected) == 64 and all(c in "0123456789abcdef" for c in expected)):
        from ..errors import UmlosError, BATCH_FINGERPRINT_INVALID, BATCHING_OPERATOR

        raise UmlosError(BATCH_FINGERPRINT_INVALID, f"--expected-fingerprint {expected!r} is neither a file nor a "
                         "SHA-256 hex digest", operator=BATCHING_OPERATOR)
    got = _fingerprint(args, expected.n_batches if isinstance(expected, BatchFingerprint) else args.n_batches)
    compare_fingerprints(got, expected)
    print(f"ok  the first {len(got.digests)} microbatches fingerprint to {got.fingerprint}, as expected")
    return 0


def _fingerprint(args, n_batches: int):
    from ..batching.batches.fingerprint import fingerprint_plan_batches
    from ..batching.plans.buckets import config_error

    from_files = args.batches is not None and args.plan is None
    if not from_files and (args.batches is not None or args.plan is None or args.store is None):
        raise config_error("give --plan and --source, or --batches (with --source for an index-only folder)")
    if from_files:
        from ..batching.batches.reader import BatchReader

        return BatchReader(args.batches, store=args.store).content_fingerprint(n_batches)
    from ..batching.plans.kinds import open_row_plan
    from ..batching.plans.rows import open_row_source
    from ..batching.tokens.sources import verify_source

    check = not getattr(args, "no_verify", True)  # batch verify compares content itself: it names the microbatch
    plan = open_row_plan(args.plan, f"batch {args.batch_action}", verify=check)
    source = open_row_source(plan, args.store, check=False)  # fingerprint_plan_batches checks it against the plan
    if check:
        verify_source(source)
    return fingerprint_plan_batches(plan, source, n_batches, separator_ids=_separator_ids(args))
