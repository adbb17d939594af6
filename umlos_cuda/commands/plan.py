"""``umlos-cuda plan build|cut|info|verify|shard|explain|edit``: token-budget batch plans.

``build`` reads a length cache and writes a plan folder (JSON and JSONL files
plus a memory-mapped binary form, docs/batching.md "Plan files"); ``info``
prints its counts, metrics and, with ``--world-size``, each rank's share;
``verify`` recomputes the fingerprint and checks every invariant (exit 2
with the failure code on any mismatch); ``shard`` writes one plan per rank;
``explain`` prints what each rank trains on at a step of a run (docs/batching.md,
"Explaining a step"); ``edit`` derives a plan that leaves out a run's steps (docs/batching.md,
"Editing a plan").
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

from .. import errors
from ._args import (add_no_verify_argument, add_option, add_order_argument, add_pack_arguments, integer_list,
                    integer_pair, non_negative_int, positive_int, resolve_order)
from ._artifacts import add_verify_arguments, report_kind, verify_kind
from ._plan_windows import build_mixed, build_windowed, run_cut


def register(subparsers) -> None:
    plan = subparsers.add_parser(
        "plan", help="build, inspect, verify and shard token-budget batch plans",
        description="Token-budget batch plans on the engine's order: build one from a length cache, print what it "
        "holds, verify it, or split it into one plan per rank.",
    )
    actions = plan.add_subparsers(dest="plan_action", metavar="ACTION")

    build = actions.add_parser(
        "build", help="build a plan folder from a source of lengths",
        description="Cut each epoch's engine order into token-budget microbatches per length bucket, interleave "
        "the buckets evenly, and write the plan folder atomically. Long invocations can keep their flags in a "
        "file: --config FILE (docs/cli.md).",
    )
    source = build.add_argument_group("what the plan reads")
    add_option(source, "--source", old=("--lengths",), dest="lengths", metavar="SOURCE",
               help="what the plan reads lengths from: a length cache (data lengths build) or its .u32 sidecar, a "
               "token store (sharded or not), a Megatron prefix (docs/batching.md, Sources; required unless --mix)")
    source.add_argument("--mix", nargs="+", metavar="SOURCE:WEIGHT[:CAP[:SEED]]",
                        help="with --window: a weighted mixture of sources instead of --source, exact per window; "
                        "CAP caps that dataset's epochs ('-': none), SEED its order (default --seed + 1 + its place) "
                        "(docs/batching.md, Weighted mixtures)")
    source.add_argument("--num-samples", type=positive_int("--num-samples"), metavar="N",
                        help="with --mix: the mixture's samples (default: until every capped dataset runs out)")
    source.add_argument("--mix-schedule", metavar="FILE",
                        help="with --mix: a JSON file of the weights over the mixture's samples or steps (pieces held "
                        "or ramped; a weight of 0 before a component joins or after it retires) (docs/batching.md, "
                        "Mixture schedules)")
    source.add_argument("--mix-unit", choices=("samples", "tokens", "loss-tokens"),
                        help="with --mix: what the weights count: samples (the default), tokens or loss-bearing "
                        "tokens (each window's samples shared so each dataset's tokens are in proportion, within one "
                        "sample's length; loss-tokens needs token stores with loss masks) (docs/batching.md, Token "
                        "quotas)")
    microbatches = build.add_argument_group("microbatches")
    microbatches.add_argument("--token-budget", required=True, type=positive_int("token budget"), metavar="T",
                              help="padded tokens per microbatch")
    microbatches.add_argument("--bucket-edges", metavar="E1,E2,...",
                              help="ascending bucket edges, e.g. 128,256,512 (required unless --pack; with --pack "
                              "default none: every length shares rows)")
    microbatches.add_argument("--overflow-max", type=positive_int("overflow max"), metavar="L",
                              help="the longest accepted length; longer samples are skipped and listed (required "
                              "unless --pack, which defaults it to --pack-max-len)")
    microbatches.add_argument("--pad-policy", choices=("pad_to_bucket", "pad_to_max"), default="pad_to_bucket",
                              help="pad_to_bucket (predictable shapes, default) or pad_to_max (throughput)")
    microbatches.add_argument("--min-length", type=non_negative_int("min length"), default=1, metavar="L",
                              help="shorter samples are skipped (default 1: empty ones)")
    order = build.add_argument_group("order")
    add_order_argument(order)
    order.add_argument("--seed", type=non_negative_int("seed"), default=42, metavar="S", help="plan seed (default 42)")
    order.add_argument("--epochs", type=positive_int("epochs"), default=1, metavar="E", help="epochs (default 1)")
    order.add_argument("--block-size", type=positive_int("block size"), default=1 << 20, metavar="B",
                       help="the engine's sampler_block_size (default 1048576)")
    order.add_argument("--window", type=positive_int("--window"), metavar="W",
                       help="build a windowed plan instead: windows of W positions of the order, the lengths read "
                       "by rows from the source, a per-window index on disk (docs/batching.md, Windowed plans)")
    add_pack_arguments(build.add_argument_group("packing"), what="pack", default_max_len=2048)
    add_overlong_arguments(build.add_argument_group("over-long samples and train/validation splits"))
    output = build.add_argument_group("output")
    output.add_argument("--output", required=True, metavar="DIR", help="the plan folder to create")
    output.add_argument("--force", action="store_true", help="replace an existing plan folder")
    output.add_argument("--jsonl", choices=("auto", "always", "never"), default="auto",
                        help="write microbatches.jsonl: auto (up to 10^7 sample entries), always or never")
    output.add_argument("--quiet", action="store_true", help="no progress line")
    build.set_defaults(func=run_build)

    cut = actions.add_parser(
        "cut", help="build pretraining sequences: documents concatenated and cut, by windows",
        description="Join each epoch's documents, in the engine's order, with an optional EOS, cut the stream into "
        "samples of L + 1 tokens (as Megatron-LM's GPTDataset does) and write a per-window token index "
        "(docs/batching.md, Pretraining sequences). Nothing of the documents is copied.",
    )
    add_option(cut, "--source", old=("--tokens",), dest="tokens", metavar="SOURCE",
               help="a token source: a token store folder (sharded or not) or the prefix of a Megatron .idx/.bin "
               "pair (required unless --mix)")
    cut.add_argument("--sequence-length", required=True, type=positive_int("--sequence-length"), metavar="L")
    cut.add_argument("--window", type=positive_int("--window"), default=1 << 12, metavar="W",
                     help="documents per window (default 4096)")
    cut.add_argument("--eos", type=non_negative_int("--eos"), metavar="ID",
                     help="append this token id after every document (default: none, the documents as stored)")
    cut.add_argument("--tail", choices=("drop", "pad"), default="drop",
                     help="drop the last partial sample of an epoch (Megatron's count, default) or pad it")
    cut.add_argument("--epochs", type=positive_int("epochs"), default=1, metavar="E", help="epochs (default 1)")
    cut.add_argument("--seed", type=non_negative_int("seed"), default=42, metavar="S", help="order seed (default 42)")
    add_order_argument(cut)
    cut.add_argument("--block-size", type=positive_int("block size"), default=1 << 20, metavar="B",
                     help="the engine's sampler_block_size (default 1048576)")
    cut.add_argument("--mix", nargs="+", metavar="PATH:WEIGHT[:CAP[:SEED]]",
                     help="instead of --source: a weighted mixture of token stores or Megatron prefixes, each cut "
                     "in its own order, exact per window of --window samples; CAP caps that dataset's epochs ('-': "
                     "none), SEED its order (default --seed + 1 + its place; --seed is the mixture's) "
                     "(docs/batching.md, Mixtures of pretraining sequences)")
    cut.add_argument("--num-samples", type=positive_int("--num-samples"), metavar="N",
                     help="with --mix: the mixture's samples (default: until every capped dataset runs out)")
    cut.add_argument("--mix-schedule", metavar="FILE",
                     help="with --mix: a JSON file of the weights over the mixture's samples or steps "
                     "(docs/batching.md, Mixture schedules)")
    cut.add_argument("--mix-unit", choices=("samples", "tokens", "loss-tokens"),
                     help="with --mix: only samples (the default): every sequence holds the same tokens, so a token "
                     "quota is the sample quota (docs/batching.md, Token quotas)")
    cut.add_argument("--show", type=non_negative_int("--show"), metavar="K",
                     help="print sample K of epoch 0 (of the mixture, with --mix)")
    cut.add_argument("--output", required=True, metavar="DIR", help="the folder to create")
    cut.add_argument("--force", action="store_true",
                     help="replace an existing pretraining sequences folder (of the same kind)")
    cut.add_argument("--quiet", action="store_true", help="no progress line")
    cut.set_defaults(func=run_cut)

    info = actions.add_parser("info", help="print a plan's counts and metrics",
                              description="Print a plan's configuration, counts and metrics per epoch.")
    info.add_argument("plan", metavar="DIR")
    info.add_argument("--rank", type=non_negative_int("rank"), metavar="R", help="with --world-size: only this rank")
    info.add_argument("--world-size", type=positive_int("world size"), metavar="W", help="print each rank's share")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(func=run_info)

    verify = actions.add_parser(
        "verify", help="check a plan's invariants and fingerprint",
        description="Recompute the fingerprint and check every invariant: each non-skipped sample exactly once per "
        "epoch, budgets, bucket ids and max_len against the lengths, stats.json and microbatches.jsonl, and that "
        "the configuration rebuilds the plan. Exit 2 with the failure code on any mismatch.",
    )
    verify.add_argument("plan", metavar="DIR")
    add_verify_arguments(verify, store=False)
    verify.set_defaults(func=run_verify)

    shard = actions.add_parser(
        "shard", help="write one pre-sharded plan per rank",
        description="Write OUT/rank_<r> for each rank r: the global microbatches i with i % W == r, keeping their "
        "global indices, and OUT/shards.json.",
    )
    shard.add_argument("plan", metavar="DIR")
    shard.add_argument("--world-size", required=True, type=positive_int("world size"), metavar="W")
    shard.add_argument("--output", required=True, metavar="OUT")
    shard.add_argument("--jsonl", choices=("auto", "always", "never"), default="auto")
    shard.add_argument("--force", action="store_true", help="replace an existing shard set at OUT (nothing else)")
    add_no_verify_argument(shard, reads="the plan")
    shard.set_defaults(func=run_shard)

    explain = actions.add_parser(
        "explain", help="print what each rank trains on at a step of a run",
        description="For a global step K (or the steps K to N - 1) of a run over the plan at --world-size ranks, "
        "print each rank's microbatches (or samples): sample ids, the component and source of each, the document "
        "and its token range, tokens and loss tokens, from the plan and its recorded sources alone "
        "(docs/batching.md, Explaining a step).",
    )
    explain.add_argument("plan", metavar="DIR")
    explain.add_argument("--step", type=integer_pair("--step", optional_second=True), metavar="K[:N]",
                         help="the step K (0: the first step from --start), or the steps K to N - 1 (required "
                         "unless --check-tape)")
    explain.add_argument("--world-size", type=positive_int("world size"), default=1, metavar="W",
                         help="the run's ranks (default 1)")
    explain.add_argument("--rank", type=non_negative_int("rank"), metavar="R",
                         help="only this rank (default: every rank)")
    explain.add_argument("--batch-size", type=positive_int("--batch-size"), default=1, metavar="B",
                         help="pretraining sequences: the samples one rank takes a step (SequenceBatchSampler's "
                         "batch_size; default 1); a plan of microbatches takes one a step")
    explain.add_argument("--start", type=integer_pair("--start"), default=(0, 0), metavar="EPOCH:INDEX",
                         help="the plan cursor the run started or resumed from (default 0:0)")
    explain.add_argument("--source", nargs="+", metavar="SOURCE",
                         help="the token source to count loss tokens from, for a plan that records none (a whole "
                         "plan; a windowed plan over lengths); a mixed plan: one per component")
    explain.add_argument("--check-tape", metavar="STORE",
                         help="instead of --step: check every step the checkpoint store's tape records (plan.step "
                         "records) against the plan: its rows, none skipped or repeated")
    explain.add_argument("--json", action="store_true", help="print JSON (docs/batching.md, Explaining a step)")
    explain.set_defaults(func=run_explain)

    edit = actions.add_parser(
        "edit", help="derive a plan that leaves out the units of some steps of a run",
        description="Write a plan that hands out the plan's units less those of the steps A to B - 1 of a run at "
        "--world-size ranks (steps as plan explain counts them): before step A the same units at the same cursor, "
        "then the rest, each once, resumable at any step and world size. Its fingerprint chains to the plan's "
        "(docs/batching.md, Editing a plan).",
    )
    edit.add_argument("plan", metavar="DIR")
    what = edit.add_mutually_exclusive_group(required=True)
    what.add_argument("--skip-steps", type=integer_pair("--skip-steps"), metavar="A:B",
                      help="leave out the units of the steps A to B - 1 (B > A)")
    what.add_argument("--skip-samples", metavar="FILE",
                      help="leave the dataset rows FILE lists (one a line; plan explain's row) out of every "
                      "microbatch from step --from-step on (unpacked plans of microbatches)")
    edit.add_argument("--from-step", type=non_negative_int("--from-step"), default=0, metavar="A",
                      help="with --skip-samples: the step from which the rows are left out (default 0)")
    edit.add_argument("--world-size", type=positive_int("world size"), default=1, metavar="W",
                      help="the ranks of the run whose steps are named (default 1); the edit names units, so the "
                      "edited plan runs at any world size")
    edit.add_argument("--batch-size", type=positive_int("--batch-size"), default=1, metavar="B",
                      help="pretraining sequences: the samples one rank takes a step (default 1)")
    edit.add_argument("--start", type=integer_pair("--start"), default=(0, 0), metavar="EPOCH:INDEX",
                      help="the plan cursor the run started or resumed from (default 0:0)")
    edit.add_argument("--output", required=True, metavar="OUT", help="the edited plan's folder")
    edit.add_argument("--force", action="store_true", help="replace an edited plan of the same kind at OUT")
    edit.add_argument("--json", action="store_true", help="print the edited plan's plan info report as JSON")
    edit.set_defaults(func=run_edit)
    plan.set_defaults(func=lambda args: (plan.print_help(), 1)[1])


def add_overlong_arguments(build) -> None:
    """``--max-length``/``--overlong`` and ``--split``/``--validation-fraction``/``--split-seed``
    (docs/batching.md, "Over-long samples and splits")."""
    build.add_argument("--max-length", type=positive_int("max length"), metavar="L",
                       help="longest sample, in tokens; longer ones follow --overlong (default: none, and samples "
                            "above --overflow-max are skipped and counted; defaults --overflow-max to L)")
    build.add_argument("--overlong", choices=("truncate_right", "truncate_left", "split", "skip"), metavar="POLICY",
                       help="what a sample longer than --max-length becomes: truncate_right (its first L tokens; "
                            "the default with --max-length), truncate_left (its last L), split (pieces of L tokens "
                            "keeping the sample id and a piece number) or skip (counted); alone, L is --overflow-max")
    build.add_argument("--split", choices=("train", "validation"), dest="split_side",
                       help="plan one side of a train/validation split by a keyed hash of each sample id (stable "
                            "when rows are appended); needs --validation-fraction")
    build.add_argument("--validation-fraction", metavar="F", help="share of samples in validation, in (0, 1)")
    build.add_argument("--split-seed", type=non_negative_int("split seed"), metavar="S",
                       help="the split's hash key (default 0), independent of --seed")


def overlong_and_split(args, overflow_max: int):
    """The :class:`OverlongConfig` and :class:`SplitConfig` of ``plan build``'s options (None: not asked for)."""
    from ..batching.plans.buckets import config_error
    from ..batching.plans.overlong import OverlongConfig, OverlongPolicy
    from ..batching.plans.splits import SplitConfig

    overlong = None
    if args.max_length is not None or args.overlong is not None:
        overlong = OverlongConfig(overflow_max if args.max_length is None else args.max_length,
                                  OverlongPolicy.parse(args.overlong or "truncate_right"))
    if args.split_side is None:
        if args.validation_fraction is not None or args.split_seed is not None:
            raise config_error("--validation-fraction and --split-seed choose a split; give --split train or "
                               "--split validation too")
        return overlong, None
    if args.validation_fraction is None:
        raise config_error("--split needs --validation-fraction F, the share of samples in validation, in (0, 1)")
    try:
        fraction = float(args.validation_fraction)
    except ValueError:
        raise config_error(f"--validation-fraction must be a number in (0, 1), got {args.validation_fraction!r}") \
            from None
    return overlong, SplitConfig(args.split_side, fraction, args.split_seed or 0)


def run_build(args) -> int:
    from ..batching.plans.builder import BatchPlanBuilder
    from ..batching.plans.buckets import config_error
    from ..batching.plans.config import BatchingConfig, BatchingProfile
    from ..batching.lengths.cache import sidecar_path
    from ..batching.plans.io import check_output_dir, save_plan
    from ..batching.packing.config import PackingConfig
    from ..batching.plans.kinds.whole import overlong_counts, overlong_line, packing_line, split_line
    from ..batching.sources import length_cache, source_kind
    from ..batching.sources.builtin import LENGTH_CACHE
    from ._progress import Progress

    pack = None
    overflow_from = "--overflow-max"  # the option that set overflow_max, for the messages
    if args.pack:
        pack = PackingConfig(max_length=args.pack_max_len, mode=args.pack_mode, separator_len=args.pack_separator_len)
        args.bucket_edges = "" if args.bucket_edges is None else args.bucket_edges
        if args.overflow_max is None:
            args.overflow_max, overflow_from = args.pack_max_len, "--pack-max-len"
    if args.overflow_max is None and args.max_length is not None:
        args.overflow_max, overflow_from = args.max_length, "--max-length"
    for value, flag in ((args.bucket_edges, "--bucket-edges"), (args.overflow_max, "--overflow-max")):
        if value is None:
            raise config_error(f"{flag} is required (unless --pack)")
    edges = integer_list(args.bucket_edges, "--bucket-edges", None, None, fail=config_error)  # the config checks them
    _check_last_edge(edges, args.overflow_max, overflow_from)
    stage, order = resolve_order(args)
    config = BatchingConfig(args.token_budget, edges, args.overflow_max, args.pad_policy, args.seed, stage=stage,
                            sampler_block_size=args.block_size, min_length=args.min_length,
                            profile=(BatchingProfile.PREDICTABLE if args.pad_policy == "pad_to_bucket"
                                     else BatchingProfile.THROUGHPUT),
                            pack=pack, order=order, **_selection(args))
    if args.mix is not None or args.num_samples is not None or args.mix_schedule is not None \
            or args.mix_unit is not None:
        return build_mixed(args, config)
    if args.lengths is None:
        raise config_error("--source is required (unless --mix)")
    inputs = (args.lengths, sidecar_path(args.lengths)) if source_kind(args.lengths) is LENGTH_CACHE \
        else (args.lengths,)
    if args.window is not None:
        return build_windowed(args, config, inputs)
    check_output_dir(args.output, args.force, inputs)  # fail before the work
    started = time.perf_counter()
    cache = length_cache(args.lengths)
    config = _with_pairs(config, cache, args.lengths)
    progress = Progress(args.epochs * 2, f"plan {args.output}", enabled=not args.quiet)
    plan = BatchPlanBuilder(cache, config).build(args.epochs, progress=lambda done, _: progress.update(done))
    save_plan(plan, args.output, jsonl=args.jsonl, force=args.force, inputs=inputs,
              progress=lambda done, _: progress.update(args.epochs + done))
    progress.close()
    seconds = time.perf_counter() - started
    stats = plan.epochs[0].stats
    print(f"plan {args.output}: {plan.num_epochs} epoch(s), {plan.total_microbatches} microbatches, "
          f"{stats['samples']} samples per epoch, {stats['skipped_samples']} skipped")
    print(overlong_line(overlong_counts(plan), plan.config.overlong is not None))
    split = split_line(plan.meta.config.to_dict(), plan.meta.units, plan.meta.num_samples)
    if split is not None:
        print(split)
    print(f"padding_waste {stats['padding_waste']:.4f}, bucket_mix_drift {stats['bucket_mix_drift']:.4f} (epoch 0)")
    if "packing" in stats:
        print(packing_line(stats["packing"]) + " (epoch 0)")
    if config.group_size > 1:
        print(f"preference pairs: {len(cache) // config.group_size} pairs, both rows of each in one microbatch "
              "(group_size 2, from the length cache's ids)")
    print(f"fingerprint {plan.fingerprint}")
    print(f"built in {seconds:.2f} s ({len(cache) * plan.num_epochs / max(seconds, 1e-9):,.0f} samples/s)")
    return 0


def _check_last_edge(edges: Sequence[int], overflow_max: int, flag: str) -> None:
    """Refuse, naming the option the user gave, an ``overflow_max`` that another option set (``--max-length``,
    ``--pack-max-len``) and that does not exceed the last bucket edge; BucketSpec's own message would blame
    ``overflow_max``, which the user never set."""
    from ..batching.plans.buckets import config_error

    if flag == "--overflow-max" or not edges or overflow_max > edges[-1]:
        return
    at_or_above = [edge for edge in edges if edge >= overflow_max]
    raise config_error(f"{flag} {overflow_max} is also the longest accepted length (--overflow-max), which must "
                       f"exceed the last bucket edge {edges[-1]}: the lengths above the last edge, up to it, make the "
                       f"last bucket; drop {', '.join(map(str, at_or_above))} from --bucket-edges, or give "
                       "--overflow-max above the last edge")


def _with_pairs(config, cache, path: str):
    """``config`` with ``group_size`` 2 when the cache's ids are those of preference pairs
    (umlos_cuda/batching/lengths/pairs.py): the cache says so itself, no option to forget."""
    from dataclasses import replace

    from ..batching.lengths.pairs import PAIR_ROWS, holds_pairs

    plain = cache.plain_ids  # plain ids stay bytes (one id is read unless the first names a pair)
    if cache.ids_are_line_numbers or not holds_pairs(plain if plain is not None else cache.sample_ids, path):
        return config
    return replace(config, group_size=PAIR_ROWS)


def _selection(args) -> dict:
    """BatchingConfig's ``overlong`` and ``split`` keywords, only those asked for."""
    overlong, split = overlong_and_split(args, args.overflow_max)
    return {**({} if overlong is None else {"overlong": overlong}), **({} if split is None else {"split": split})}


def run_info(args) -> int:
    """``plan info`` of a folder of any plan kind: its report (``--json``: the dict) from the kind's ``report``."""
    from ..batching.plans.kinds import plan_kind_of

    return report_kind(plan_kind_of(args.plan), args.plan, args, ("world_size", "rank"), errors.BATCH_PLAN_OPERATOR)


def run_verify(args) -> int:
    """``plan verify`` of a folder of any plan kind: the kind's ``verify`` with the options given, each checked
    against what the kind takes (BATCHING_CONFIG_INVALID, naming the flags it does take)."""
    from ..batching.plans.kinds import plan_kind_of

    return verify_kind(plan_kind_of(args.plan), args.plan, args, errors.BATCH_PLAN_OPERATOR)


def run_explain(args) -> int:
    """``plan explain`` of a folder of any plan kind whose kind explains it: the steps asked for, as text or JSON."""
    from ..batching.plans.explain import StepExplainer, lines
    from ..batching.plans.kinds import plan_kind_of

    from ..batching.plans.buckets import config_error

    if args.check_tape is not None:
        return _check_tape(args)
    if args.step is None:
        raise config_error("plan explain needs --step K[:N] (or --check-tape STORE)")
    step, stop = args.step
    if stop is not None and stop <= step:
        raise config_error(f"--step {step}:{stop} holds no step: K:N means the steps K to N - 1 (N > K)")
    tokens = None
    if args.source is not None:
        tokens = args.source if plan_kind_of(args.plan).order == "mixture" or len(args.source) > 1 \
            else args.source[0]
    report = StepExplainer.open(args.plan, tokens=tokens).explain(
        step, count=1 if stop is None else stop - step, rank=args.rank, world_size=args.world_size,
        batch_size=args.batch_size, start=args.start)
    print(json.dumps(report, indent=2) if args.json else "\n".join(lines(report)))
    return 0


def _check_tape(args) -> int:
    """``plan explain --check-tape STORE``: every ``plan.step`` record of the store's tape against the plan."""
    from ..batching.plans.buckets import config_error
    from ..batching.plans.explain import StepExplainer, check_tape

    given = [flag for flag, value in (("--step", args.step), ("--rank", args.rank), ("--source", args.source))
             if value is not None]
    if given:
        raise config_error(f"--check-tape checks every step the tape records, at the world sizes the run had: "
                           f"{' and '.join(given)} do{'es' if len(given) == 1 else ''} not apply")
    explainer = StepExplainer.open(args.plan)
    report = check_tape(args.check_tape, explainer)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    first, last = report["first"], report["last"]
    units = {"microbatch": "microbatches", "sample": "samples"}[explainer.kind.unit]
    print(f"tape {args.check_tape}: {report['steps']} steps (t {first['t']} to {last['t']}), {report['units']} "
          f"{units} from epoch {first['epoch']} unit {first['cursor']} to epoch {last['epoch']} unit "
          f"{last['cursor']}: each step the plan's rows, none skipped or repeated (plan {explainer.plan.fingerprint})")
    return 0


def run_edit(args) -> int:
    """``plan edit``: the plan less the units of the steps asked for (or the rows listed), written to ``--output``."""
    from ..batching.plans.buckets import config_error
    from ..batching.plans.edits import edit_plan, save_edited_plan, skip_steps
    from ..batching.plans.edits.edit import read_rows
    from ..batching.plans.edits.io import skip_samples_from
    from ..batching.plans.kinds import plan_kind_of
    from ..batching.plans.kinds.edited import PLURAL

    kind = plan_kind_of(args.plan)
    if kind.unit != "sample" and args.batch_size != 1:
        raise config_error(f"--batch-size {args.batch_size}: a step of a {kind.name} is one microbatch per rank")
    where = dict(world_size=args.world_size, batch_size=args.batch_size, start=args.start)
    if args.skip_steps is not None:
        first, stop = args.skip_steps
        edited = edit_plan(args.plan, lambda plan: skip_steps(plan, first, stop, **where))
        words = f"steps {first} to {stop - 1} at world size {args.world_size}"
    else:
        rows = read_rows(args.skip_samples)
        edited = edit_plan(args.plan, lambda plan: skip_samples_from(plan, kind, rows, args.from_step, where))
        words = f"{len(set(rows))} rows of {args.skip_samples} from step {args.from_step}"
    path = save_edited_plan(edited, args.output, force=args.force, inputs=(args.plan,))
    report = plan_kind_of(path).report(path)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{report['kind']} {args.output}: {edited.edit.skipped_total()} {PLURAL[report['unit']]} ({words}) "
          f"left out of {report['parent']['kind']} {args.plan}")
    print(f"fingerprint {report['fingerprint']} (parent {report['parent']['fingerprint']})")
    return 0


def run_shard(args) -> int:
    from ..batching.plans.integrity import check_digests
    from ..batching.plans.io import PLAN, check_shards_dir, save_shards
    from ..batching.plans.kinds import open_row_plan, plan_kind_of
    from ..batching.plans.sharding import check_shard_count

    check_shard_count(args.world_size)
    check_shards_dir(args.output, args.force, (args.plan,))  # fail before the work
    plan = open_row_plan(args.plan, "plan shard", whole=True)  # a windowed plan: its microbatches as a whole plan
    if not args.no_verify and plan_kind_of(args.plan).name == PLAN.name:  # (a windowed plan checked its own)
        check_digests(plan, args.plan)
    rows = save_shards(plan, args.world_size, args.output, jsonl=args.jsonl, force=args.force, inputs=(args.plan,))
    for row in rows:
        print(f"rank {row['rank']}: {row['microbatches']} microbatches, fingerprint {row['fingerprint']}")
    print(f"wrote {args.world_size} shard(s) of {plan.fingerprint} to {args.output}")
    return 0
