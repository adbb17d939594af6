"""``umlos-cuda plan build|info|verify|shard``: token-budget batch plans.

``build`` reads a length cache and writes a plan folder (JSON and JSONL files
plus a memory-mapped binary form, docs/batching.md "Plan files"); ``info``
prints its counts, metrics and, with ``--world-size``, each rank's share;
``verify`` recomputes the fingerprint and checks every invariant (exit 2
with the failure code on any mismatch); ``shard`` writes one plan per rank.
"""

from __future__ import annotations

import json
import os
import time

from .. import errors
from ..errors import UmlosError
from ._args import add_no_verify_argument, add_pack_arguments, non_negative_int, positive_int

#: Short names for the engine's sampling modes.
MODE_ALIASES = {
    "shuffle": "SHUFFLE_WITHOUT_REPLACEMENT_BLOCK_AFFINE_V1",
    "sequential": "SEQUENTIAL_V1",
    "streaming": "STREAMING_SHUFFLE_BLOCK_AFFINE_V1",
}


def register(subparsers) -> None:
    plan = subparsers.add_parser(
        "plan", help="build, inspect, verify and shard token-budget batch plans",
        description="Token-budget batch plans on the engine's order: build one from a length cache, print what it "
        "holds, verify it, or split it into one plan per rank.",
    )
    actions = plan.add_subparsers(dest="plan_action", metavar="ACTION")

    build = actions.add_parser(
        "build", help="build a plan folder from a length cache",
        description="Cut each epoch's engine order into token-budget microbatches per length bucket, interleave "
        "the buckets evenly, and write the plan folder atomically.",
    )
    build.add_argument("--lengths", metavar="LENGTHS.jsonl",
                       help="a length cache (data lengths build), or a token store folder (sharded or not): its "
                       "length cache (required unless --mix); with --window also a Megatron prefix, and a store's "
                       "lengths are then read by rows from its offsets")
    build.add_argument("--bucket-edges", metavar="E1,E2,...",
                       help="ascending bucket edges, e.g. 128,256,512 (required unless --pack; with --pack default "
                       "none: every length shares rows)")
    build.add_argument("--overflow-max", type=positive_int("overflow max"), metavar="L",
                       help="the longest accepted length; longer samples are skipped and listed (required unless "
                       "--pack, which defaults it to --pack-max-len)")
    build.add_argument("--token-budget", required=True, type=positive_int("token budget"), metavar="T",
                       help="padded tokens per microbatch")
    build.add_argument("--epochs", type=positive_int("epochs"), default=1, metavar="E", help="epochs (default 1)")
    build.add_argument("--seed", type=non_negative_int("seed"), default=42, metavar="S", help="plan seed (default 42)")
    build.add_argument("--pad-policy", choices=("pad_to_bucket", "pad_to_max"), default="pad_to_bucket",
                       help="pad_to_bucket (predictable shapes, default) or pad_to_max (throughput)")
    build.add_argument("--sampling-mode", default="shuffle", metavar="M",
                       help=f"the engine order: {', '.join(MODE_ALIASES)} or the engine's mode string "
                            "(default shuffle)")
    build.add_argument("--order", default="block_affine", metavar="MODE",
                       help="which shuffle a shuffled or streaming plan follows: block_affine, feistel or "
                            "block_feistel (docs/sampling-modes.md; default block_affine)")
    build.add_argument("--min-length", type=non_negative_int("min length"), default=1, metavar="L",
                       help="shorter samples are skipped (default 1: empty ones)")
    build.add_argument("--block-size", type=positive_int("block size"), default=1 << 20, metavar="B",
                       help="the engine's sampler_block_size (default 1048576)")
    add_pack_arguments(build, what="pack", default_max_len=2048)
    add_overlong_arguments(build)
    build.add_argument("--jsonl", choices=("auto", "always", "never"), default="auto",
                       help="write microbatches.jsonl: auto (up to 10^7 sample entries), always or never")
    build.add_argument("--window", type=positive_int("--window"), metavar="W",
                       help="build a windowed plan instead: windows of W positions of the order, the lengths "
                       "memory-mapped from the cache's .u32 sidecar or the token source, a per-window index on disk "
                       "(docs/batching.md, Windowed plans; token-budget buckets only)")
    build.add_argument("--mix", nargs="+", metavar="LENGTHS.jsonl:WEIGHT[:CAP[:SEED]]",
                       help="with --window: a weighted mixture of length caches, token stores (sharded or not) or "
                       "Megatron prefixes instead of --lengths, exact per "
                       "window; CAP caps that dataset's epochs ('-': none), SEED its order (default --seed + 1 + "
                       "its place) (docs/batching.md, Weighted mixtures)")
    build.add_argument("--num-samples", type=positive_int("--num-samples"), metavar="N",
                       help="with --mix: the mixture's samples (default: until every capped dataset runs out)")
    build.add_argument("--output", required=True, metavar="DIR", help="the plan folder to create")
    build.add_argument("--force", action="store_true", help="replace an existing plan folder")
    build.add_argument("--quiet", action="store_true", help="no progress line")
    build.set_defaults(func=run_build)

    cut = actions.add_parser(
        "cut", help="build pretraining sequences: documents concatenated and cut, by windows",
        description="Join each epoch's documents, in the engine's order, with an optional EOS, cut the stream into "
        "samples of L + 1 tokens (as Megatron-LM's GPTDataset does) and write a per-window token index "
        "(docs/batching.md, Pretraining sequences). Nothing of the documents is copied.",
    )
    cut.add_argument("--tokens", metavar="PATH",
                     help="a token store folder (sharded or not) or the prefix of a Megatron .idx/.bin pair "
                     "(required unless --mix)")
    cut.add_argument("--sequence-length", required=True, type=positive_int("--sequence-length"), metavar="L")
    cut.add_argument("--window", type=positive_int("--window"), default=1 << 12, metavar="W",
                     help="documents per window (default 4096)")
    cut.add_argument("--eos", type=non_negative_int("--eos"), metavar="ID",
                     help="append this token id after every document (default: none, the documents as stored)")
    cut.add_argument("--tail", choices=("drop", "pad"), default="drop",
                     help="drop the last partial sample of an epoch (Megatron's count, default) or pad it")
    cut.add_argument("--epochs", type=positive_int("epochs"), default=1, metavar="E", help="epochs (default 1)")
    cut.add_argument("--seed", type=non_negative_int("seed"), default=42, metavar="S", help="order seed (default 42)")
    cut.add_argument("--sampling-mode", default="shuffle", metavar="M",
                     help=f"the engine order: {', '.join(MODE_ALIASES)} or the engine's mode string (default shuffle)")
    cut.add_argument("--order", default="block_affine", metavar="MODE",
                     help="block_affine (default), feistel or block_feistel")
    cut.add_argument("--block-size", type=positive_int("block size"), default=1 << 20, metavar="B",
                     help="the engine's sampler_block_size (default 1048576)")
    cut.add_argument("--mix", nargs="+", metavar="PATH:WEIGHT[:CAP[:SEED]]",
                     help="instead of --tokens: a weighted mixture of token stores or Megatron prefixes, each cut "
                     "in its own order, exact per window of --window samples; CAP caps that dataset's epochs ('-': "
                     "none), SEED its order (default --seed + 1 + its place; --seed is the mixture's) "
                     "(docs/batching.md, Mixtures of pretraining sequences)")
    cut.add_argument("--num-samples", type=positive_int("--num-samples"), metavar="N",
                     help="with --mix: the mixture's samples (default: until every capped dataset runs out)")
    cut.add_argument("--show", type=non_negative_int("--show"), metavar="K",
                     help="print sample K of epoch 0 (of the mixture, with --mix)")
    cut.add_argument("--output", required=True, metavar="DIR", help="the folder to create")
    cut.add_argument("--force", action="store_true",
                     help="replace an existing pretraining sequences folder (of the same kind)")
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
    verify.add_argument("--expected-fingerprint", metavar="F", help="the fingerprint the plan must have")
    verify.add_argument("--lengths", metavar="LENGTHS.jsonl",
                        help="also check against this length cache (or a token store folder's; for a windowed "
                        "plan also a Megatron prefix)")
    verify.add_argument("--no-rebuild", action="store_true", help="skip the rebuild check (faster on huge plans)")
    verify.add_argument("--windows", metavar="N", type=positive_int("--windows"),
                        help="a windowed, mixed plan or pretraining sequences folder: replan (recount) N windows "
                        "of each epoch, chosen at random (default: all)")
    verify.add_argument("--seed", metavar="S", type=non_negative_int("--seed"), default=0,
                        help="a windowed plan: the seed that chooses the windows (default 0)")
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


def overlong_line(plan) -> str:
    """What happened to over-long samples, in words (:func:`overlong_counts`)."""
    counted = overlong_counts(plan)
    if plan.config.overlong is None:
        return (f"over-long: {counted['samples']} sample(s) above overflow_max {counted['max_length']} skipped, "
                f"{counted['tokens_lost']} tokens lost (the default; --max-length L --overlong "
                "truncate_right|truncate_left|split keeps them)")
    done = {"truncate_right": "truncated to their first {L} tokens", "truncate_left": "truncated to their last {L} "
            "tokens", "split": "split into {pieces} pieces", "skip": "skipped"}[counted["policy"]]
    return (f"over-long: {counted['samples']} sample(s) above max_length {counted['max_length']} "
            f"{done.format(L=counted['max_length'], pieces=counted['pieces'])}, {counted['tokens_lost']} tokens lost "
            f"({counted['policy']})")


def overlong_counts(plan) -> dict:
    """stats.json ``overlong`` (the same in every epoch), or for a plan without an over-long policy
    the samples above overflow_max that its buckets skip, counted from the lengths of the rows it
    takes (those on its split's side)."""
    import numpy as np

    from ..batching.plans.overlong import default_overlong_counts

    if plan.config.overlong is not None:
        return plan.epochs[0].stats["overlong"]
    lengths = np.asarray(plan.lengths)
    return default_overlong_counts(lengths if plan.units is None else lengths[plan.units.rows],
                                   plan.config.overflow_max)


def split_line(meta) -> str | None:
    """The split side a plan takes and the units it plans (None for a plan of every sample)."""
    split = meta.config.split
    if split is None or meta.units is None:
        return None
    return (f"split {split.side} (validation_fraction {split.validation_fraction}, split seed {split.seed}): "
            f"{meta.units['samples']} of {meta.num_samples} samples, {meta.units['units']} planned units")


def run_build(args) -> int:
    from ..batching.plans.builder import BatchPlanBuilder
    from ..batching.plans.buckets import config_error
    from ..batching.plans.config import BatchingConfig, BatchingProfile
    from ..batching.lengths.cache import sidecar_path
    from ..batching.plans.io import check_output_dir, save_plan
    from ..batching.packing.config import PackingConfig
    from ._progress import Progress

    pack = None
    if args.pack:
        pack = PackingConfig(max_length=args.pack_max_len, mode=args.pack_mode, separator_len=args.pack_separator_len)
        args.bucket_edges = "" if args.bucket_edges is None else args.bucket_edges
        args.overflow_max = args.pack_max_len if args.overflow_max is None else args.overflow_max
    if args.overflow_max is None and args.max_length is not None:
        args.overflow_max = args.max_length
    for value, flag in ((args.bucket_edges, "--bucket-edges"), (args.overflow_max, "--overflow-max")):
        if value is None:
            raise config_error(f"{flag} is required (unless --pack)")
    try:
        edges = tuple(int(e) for e in args.bucket_edges.split(",")) if args.bucket_edges.strip() else ()
    except ValueError:
        raise config_error(f"--bucket-edges must be comma-separated integers, got {args.bucket_edges!r}") from None
    config = BatchingConfig(args.token_budget, edges, args.overflow_max, args.pad_policy, args.seed,
                            stage=MODE_ALIASES.get(args.sampling_mode, args.sampling_mode),
                            sampler_block_size=args.block_size, min_length=args.min_length,
                            profile=(BatchingProfile.PREDICTABLE if args.pad_policy == "pad_to_bucket"
                                     else BatchingProfile.THROUGHPUT),
                            pack=pack, order=args.order, **_selection(args))
    if args.mix is not None or args.num_samples is not None:
        return _build_mixed(args, config)
    if args.lengths is None:
        raise config_error("--lengths is required (unless --mix)")
    inputs = (args.lengths,) if names_token_source(args.lengths) else (args.lengths, sidecar_path(args.lengths))
    if args.window is not None:
        return _build_windowed(args, config, inputs)
    check_output_dir(args.output, args.force, inputs)  # fail before the work
    started = time.perf_counter()
    cache = load_lengths(args.lengths)
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
    print(overlong_line(plan))
    split = split_line(plan.meta)
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


def _build_windowed(args, config, inputs) -> int:
    """``plan build --window W``: a windowed plan (batching/plans/windows/) over a length cache's sidecar,
    checked and mapped by ``open_length_cache`` in bounded memory (against the JSONL when ``--lengths`` names
    it, against its own SHA-256 when it names the ``.u32``); the plan binds it by its count and SHA-256."""
    from ..batching.plans.windows import WindowDefinition, WindowedPlan, save_windowed_plan
    from ..batching.plans.windows.io import WINDOWED_PLAN
    from ..batching.plans.windows.sources import open_length_cache
    from ..files.writer import check_output_folder
    from ._progress import Progress

    definition_check = WindowDefinition(config, 1, args.window)  # refuses what windows do not plan, before any read
    del definition_check
    check_output_folder(args.output, WINDOWED_PLAN, force=args.force, inputs=inputs,
                        operator=errors.BATCH_PLAN_OPERATOR)
    started = time.perf_counter()
    if names_token_source(args.lengths):  # a Megatron prefix or a token store: its lengths read by rows
        source, lengths_path = _mapped_token_lengths(args.lengths), os.path.abspath(args.lengths)
    else:
        source = open_length_cache(args.lengths)
        lengths_path = os.path.abspath(source.path)
    definition = WindowDefinition(config, source.count, args.window)
    total = args.epochs * definition.num_windows
    progress = Progress(total, f"plan {args.output}", enabled=not args.quiet)
    plan = WindowedPlan.build(definition, source, args.epochs, progress=lambda done, _: progress.update(done))
    save_windowed_plan(plan, args.output, lengths_path=lengths_path, force=args.force, inputs=inputs)
    progress.close()
    seconds = time.perf_counter() - started
    counts = plan.epoch_counts(0)
    print(f"windowed plan {args.output}: {plan.num_epochs} epoch(s) of {definition.num_windows} windows of "
          f"{definition.window}, {sum(plan.epoch_microbatches(e) for e in range(plan.num_epochs))} microbatches, "
          f"{counts['samples']} samples per epoch, {counts['skipped']} skipped")
    print(f"fingerprint {plan.fingerprint}")
    print(f"built in {seconds:.2f} s ({source.count * plan.num_epochs / max(seconds, 1e-9):,.0f} samples/s)")
    return 0


def run_cut(args) -> int:
    """``plan cut``: pretraining sequences (batching/plans/windows/cut.py) over a token source."""
    from ..batching.plans.windows import CutDefinition, PretrainingSequences, save_sequences
    from ..batching.plans.windows.sequences_io import SEQUENCES
    from ..files.writer import check_output_folder

    if args.mix is not None or args.num_samples is not None:
        return _cut_mixed(args)
    if args.tokens is None:
        from ..batching.plans.buckets import config_error

        raise config_error("--tokens is required (unless --mix)")
    check_output_folder(args.output, SEQUENCES, force=args.force, inputs=(args.tokens,),
                        operator=errors.BATCH_PLAN_OPERATOR)
    started = time.perf_counter()
    source = cut_source(args.tokens)
    definition = CutDefinition(len(source), args.sequence_length, args.window, args.seed,
                               MODE_ALIASES.get(args.sampling_mode, args.sampling_mode), args.order, args.block_size,
                               args.eos, args.tail)
    plan = PretrainingSequences.build(definition, source, args.epochs)
    save_sequences(plan, args.output, tokens_path=args.tokens, force=args.force)
    seconds = time.perf_counter() - started
    print(f"pretraining sequences {args.output}: {plan.num_epochs} epoch(s) of {definition.num_documents} "
          f"documents, {plan.epoch_tokens(0)} tokens and {plan.epoch_samples(0)} samples of "
          f"{definition.sequence_length} + 1 tokens per epoch ({definition.tail} tail), "
          f"{definition.num_windows} windows of {definition.window}")
    print(f"fingerprint {plan.fingerprint}")
    print(f"built in {seconds:.2f} s")
    if args.show is not None:
        sample = plan.sample(0, args.show)
        print(json.dumps({key: (value if isinstance(value, list) else value.tolist())
                          for key, value in sample.items()}))
    return 0


def _cut_mixed(args) -> int:
    """``plan cut --mix A:0.7 B:0.3 --num-samples N``: a mixture of pretraining sequences
    (batching/plans/windows/sequence_mixture.py), each dataset cut as ``plan cut --tokens`` cuts it (with its own
    seed), blended per window of ``--window`` samples (its cuts use windows of ``--window`` documents too)."""
    from ..batching.plans.buckets import config_error
    from ..batching.plans.windows import CutDefinition, SequenceMixture, save_mixed_sequences
    from ..batching.plans.windows.sequences_io import MIXED_SEQUENCES
    from ..files.writer import check_output_folder

    if args.mix is None or args.tokens is not None or args.epochs != 1:
        raise config_error("--mix takes no --tokens or --epochs (caps and --num-samples decide its length); "
                           "--num-samples needs --mix")
    entries = parse_mix(args.mix, args.seed)
    paths = [path for path, *_ in entries]
    check_output_folder(args.output, MIXED_SEQUENCES, force=args.force, inputs=paths,
                        operator=errors.BATCH_PLAN_OPERATOR)
    started = time.perf_counter()
    stage = MODE_ALIASES.get(args.sampling_mode, args.sampling_mode)
    parts = []
    for (path, weight, cap, seed), name in zip(entries, mix_names(paths)):
        source = cut_source(path)
        definition = CutDefinition(len(source), args.sequence_length, args.window, seed, stage, args.order,
                                   args.block_size, args.eos, args.tail)
        parts.append((definition, source, weight, cap, name))
    mixture = SequenceMixture.build(parts, args.window, args.num_samples, args.seed)
    save_mixed_sequences(mixture, args.output, tokens_paths=paths, force=args.force, inputs=paths)
    seconds = time.perf_counter() - started
    quotas = ", ".join(f"{c.name} {q}" for c, q in zip(mixture.components, mixture.blend.quotas(0)))
    epochs = ", ".join(f"{c.name} {c.sequences.num_epochs}" for c in mixture.components)
    print(f"mixed pretraining sequences {args.output}: {mixture.total} samples of {args.sequence_length} + 1 tokens "
          f"from {len(parts)} datasets in {mixture.num_windows} windows of {mixture.window} (window 0: {quotas}); "
          f"epochs read: {epochs}")
    print(f"fingerprint {mixture.fingerprint}")
    print(f"built in {seconds:.2f} s")
    if args.show is not None:
        print(json.dumps(sample_json(mixture.sample(args.show))))
    return 0


def cut_source(path: str):
    """The token source ``plan cut`` reads at ``path`` (a token store, a sharded store, a Megatron prefix): one
    opener for ``--tokens``, every ``--mix`` entry and ``plan verify``'s reopening. Read by rows
    (:func:`_mapped_token_lengths`: nothing O(N) in memory, bound as the lengths held would be); a Megatron
    prefix's every size and pointer checked first, in pieces, as ``MegatronDataset.open`` checks them, so
    every document of the sequences can be read."""
    from ..batching.tokens.pretraining import MappedMegatron

    source = _mapped_token_lengths(path)
    if isinstance(source, MappedMegatron):
        source.check_rows()
    return source


def sample_json(sample: dict) -> dict:
    """A collated sample as JSON values (arrays as lists)."""
    return {key: value.tolist() if hasattr(value, "tolist") else value for key, value in sample.items()}


def mix_names(paths: list[str]) -> list[str]:
    """Each ``--mix`` entry's name: its file or folder name without extension (and without a sidecar's ``.u32``),
    numbered by its place when two are the same."""
    from ..batching.lengths.cache import SIDECAR_SUFFIX

    names = [os.path.splitext(os.path.basename(os.path.normpath(path)).removesuffix(SIDECAR_SUFFIX))[0]
             for path in paths]
    return [name if names.count(name) == 1 else f"{name}{place}" for place, name in enumerate(names)]


def parse_mix(items: list[str], seed: int) -> list[tuple[str, float, int | None, int]]:
    """``--mix`` entries ``PATH:WEIGHT[:CAP[:SEED]]`` as ``(path, weight, cap, seed)`` (a path holding ':' is
    not taken); BATCHING_CONFIG_INVALID for anything else."""
    from ..batching.plans.buckets import config_error

    parsed = []
    for place, item in enumerate(items):
        path, *numbers = item.split(":")
        if not path or not 1 <= len(numbers) <= 3:
            raise config_error(f"--mix takes LENGTHS.jsonl:WEIGHT[:CAP[:SEED]], got {item!r}")
        try:
            weight = float(numbers[0])
            cap = None if len(numbers) < 2 or numbers[1] == "-" else int(numbers[1])
            own = (seed + 1 + place) % (1 << 64) if len(numbers) < 3 else int(numbers[2])
        except ValueError:
            raise config_error(f"--mix takes LENGTHS.jsonl:WEIGHT[:CAP[:SEED]], got {item!r}") from None
        parsed.append((path, weight, cap, own))
    return parsed


def _build_mixed(args, config) -> int:
    """``plan build --window W --mix A:0.7 B:0.3``: a mixed plan (batching/plans/windows/mixture.py) over
    token sources and length caches' sidecars, each checked in bounded memory (``open_length_cache``), then
    memory-mapped."""
    from ..batching.lengths.cache import SIDECAR_SUFFIX, sidecar_path
    from ..batching.plans.buckets import config_error
    from ..batching.plans.windows import Component, MixedPlan, MixtureDefinition
    from ..batching.plans.windows.sources import open_length_cache
    from ..batching.plans.windows.io import MIXED_PLAN, save_mixed_plan
    from ..batching.plans.windows.window import check_windowed_config
    from ..files.writer import check_output_folder
    from ._progress import Progress

    if args.mix is None or args.window is None or args.lengths is not None or args.epochs != 1:
        raise config_error("--mix needs --window and takes no --lengths or --epochs (caps and --num-samples "
                           "decide its length); --num-samples needs --mix")
    entries = parse_mix(args.mix, args.seed)
    inputs = [name for path, *_ in entries for name in ((path,) if names_token_source(path) or
                                                        path.endswith(SIDECAR_SUFFIX) else (path, sidecar_path(path)))]
    names = mix_names([path for path, *_ in entries])
    check_windowed_config(config)  # refuses what windows do not plan, before any read
    check_output_folder(args.output, MIXED_PLAN, force=args.force, inputs=inputs, operator=errors.BATCH_PLAN_OPERATOR)
    started = time.perf_counter()
    components = []
    lengths_paths = []
    for (path, weight, cap, seed), name in zip(entries, names):
        if names_token_source(path):  # a store, a sharded store or a Megatron prefix: its lengths read by rows
            source, lengths_path = _mapped_token_lengths(path), os.path.abspath(path)
        else:
            source = open_length_cache(path)
            lengths_path = os.path.abspath(source.path)
        components.append(Component(source, weight, seed, cap, name))
        lengths_paths.append(lengths_path)
    definition = MixtureDefinition(config, tuple(components), args.window, args.num_samples)
    progress = Progress(definition.num_windows, f"plan {args.output}", enabled=not args.quiet)
    plan = MixedPlan.build(definition, progress=lambda done, _: progress.update(done))
    save_mixed_plan(plan, args.output, lengths_paths=lengths_paths, force=args.force, inputs=inputs)
    progress.close()
    seconds = time.perf_counter() - started
    counts = plan.counts()
    quotas = ", ".join(f"{c.name} {q}" for c, q in zip(components, definition.quotas(0)))
    print(f"mixed plan {args.output}: {definition.total} samples of {len(components)} datasets in "
          f"{definition.num_windows} windows of {definition.window} (window 0: {quotas}), "
          f"{counts['microbatches']} microbatches, {counts['skipped']} skipped")
    print(f"fingerprint {plan.fingerprint}")
    print(f"built in {seconds:.2f} s ({definition.total / max(seconds, 1e-9):,.0f} samples/s)")
    return 0


def names_token_source(path: str) -> bool:
    """Whether a ``--mix`` entry names a token store or a Megatron prefix rather than a length cache."""
    from ..batching.tokens.sources import names_token_source as names

    return names(path)


def _mapped_token_lengths(path: str):
    """A token source's lengths (a store's offsets, a sharded store's, a Megatron dataset's ``.idx`` sizes),
    memory-mapped and read by rows (tokens/pretraining.py ``open_mapped``: nothing O(N) in memory, bound
    as an ``ArrayLengths`` of the same lengths); a token source too (``arrays``), for ``plan cut``. Plans
    may not import tokens, so the command opens it."""
    from ..batching.tokens.pretraining import open_mapped

    return open_mapped(path)


def windowed_lengths(directory: str):
    """The lengths of a windowed plan for load/verify when its meta.json's ``lengths_path`` names a token
    source, read by rows; None otherwise (the plans layer maps a .u32 sidecar itself)."""
    from ..batching.tokens.pretraining import recorded_lengths

    lengths = recorded_lengths(directory)
    return None if isinstance(lengths, list) else lengths


def mixed_lengths(directory: str):
    """The lengths of a mixed plan's components for load/verify: each token source (a store, a sharded store,
    a Megatron prefix) read by rows, the other entries as recorded (the plans layer maps .u32 sidecars); None
    when meta.json names only sidecars or cannot be read (the plan's loader then reports it)."""
    from ..batching.tokens.pretraining import recorded_lengths

    lengths = recorded_lengths(directory)
    return lengths if isinstance(lengths, list) else None


def load_lengths(path: str, read_ids: bool = True):
    """The length cache at ``path``, or the length cache of the token store folder ``path`` (a sharded store
    has no single ``lengths.jsonl``: its cache is its shards', in order, under its logical dataset hash)."""
    from ..batching.lengths.cache import LengthCache

    if os.path.isdir(path):
        from ..batching.tokens.sources import open_token_source

        return open_token_source(path).length_cache()
    return LengthCache.load(path, read_ids=read_ids)  # a plan stores them: one read of the JSONL


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


def _info_mixed(args) -> int:
    """``plan info`` of a mixed plan folder: the definition, its segments and the index's totals (no window
    planned); with ``--world-size``, each rank's microbatches under the resume rule (resume.py: global
    microbatch ``k`` to rank ``k mod R``), as for a windowed plan."""
    from ..batching.plans.buckets import config_error
    from ..batching.plans.sharding import MAX_SHARE_RANKS, check_rank
    from ..batching.plans.windows.io import load_mixed_plan
    from ..batching.plans.windows.resume import rank_indices

    if args.rank is not None and args.world_size is None:
        raise config_error("--rank needs --world-size")
    if args.world_size is not None:
        check_rank(args.rank or 0, args.world_size)
        if args.rank is None and args.world_size > MAX_SHARE_RANKS:  # as a windowed plan's report
            raise config_error(f"per-rank shares are listed for at most {MAX_SHARE_RANKS} ranks, got world_size "
                               f"{args.world_size}")
    plan = load_mixed_plan(args.plan, lengths=mixed_lengths(args.plan))
    d = plan.definition
    pack = d.config.pack
    report = {"plan": args.plan, "fingerprint": plan.fingerprint, "config": d.config.to_dict(),
              "pack_config": None if pack is None else pack.to_dict(), "window": d.window, "samples": d.total,
              "windows": d.num_windows,
              "components": [{"name": c.name, "weight": c.weight, "seed": c.seed, "max_epochs": c.max_epochs,
                              "count": c.source.count} for c in d.components],
              "segments": [{"first": s.first, "windows": s.windows, "size": s.size, "quotas": list(s.quotas)}
                           for s in d.segments],
              "counts": plan.counts()}
    if args.world_size is not None:
        ranks = range(args.world_size) if args.rank is None else [args.rank]
        report["ranks"] = [{"rank": r, "microbatches": len(rank_indices(0, plan.num_microbatches, r,
                                                                        args.world_size))} for r in ranks]
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"mixed plan {args.plan}: {d.total} samples in {d.num_windows} windows of {d.window}, "
          f"fingerprint {plan.fingerprint}")
    if pack is not None:
        packing = report["pack_config"]
        print(f"  packed: {packing['mode']}, rows of {packing['max_length']} tokens, separator "
              f"{packing['separator_len']}")
    for c in report["components"]:
        cap = "no cap" if c["max_epochs"] is None else f"at most {c['max_epochs']} epoch(s)"
        print(f"  {c['name']}: weight {c['weight']}, seed {c['seed']}, {c['count']} samples, {cap}")
    for seg in report["segments"]:
        print(f"  windows {seg['first']} to {seg['first'] + seg['windows'] - 1}: {seg['size']} positions, "
              f"quotas {seg['quotas']}")
    counts = report["counts"]
    print(f"  {counts['microbatches']} microbatches, {counts['samples']} samples, {counts['skipped']} skipped, "
          f"{counts['tokens']} tokens, {counts['padded_tokens']} padded tokens")
    for row in report.get("ranks", []):
        print(f"    rank {row['rank']}: {row['microbatches']} microbatches")
    return 0


def _info_mixed_sequences(args) -> int:
    """``plan info`` of a mixture of pretraining sequences: the definition, each dataset's cut and the epochs
    of it read, the segments (from meta.json and the indices: no window merged); with ``--world-size``, each
    rank's samples under the resume rule (global sample ``k`` to rank ``k mod R``)."""
    from ..batching.plans.buckets import config_error
    from ..batching.plans.sharding import MAX_SHARE_RANKS, check_rank
    from ..batching.plans.windows.resume import rank_indices
    from ..batching.tokens.pretraining import load_mixed_pretraining

    if args.rank is not None and args.world_size is None:
        raise config_error("--rank needs --world-size")
    if args.world_size is not None:
        check_rank(args.rank or 0, args.world_size)
        if args.rank is None and args.world_size > MAX_SHARE_RANKS:
            raise config_error(f"per-rank shares are listed for at most {MAX_SHARE_RANKS} ranks, got world_size "
                               f"{args.world_size}")
    mixture = load_mixed_pretraining(args.plan)
    ends = mixture.blend.stream_ends()
    report = {"plan": args.plan, "kind": "mixed pretraining sequences", "fingerprint": mixture.fingerprint,
              "window": mixture.window, "samples": mixture.total, "windows": mixture.num_windows,
              "seed": mixture.seed,
              "components": [{"name": c.name, "weight": c.weight, "max_epochs": c.max_epochs,
                              "definition": c.sequences.definition.to_dict(), "documents": c.sequences.lengths.count,
                              "epoch_tokens": c.sequences.epoch_tokens(0), "epoch_samples": mixture.per_epoch[i],
                              "epochs_read": c.sequences.num_epochs, "samples_read": ends[i],
                              "fingerprint": c.sequences.fingerprint}
                             for i, c in enumerate(mixture.components)],
              "segments": [{"first": s.first, "windows": s.windows, "size": s.size, "quotas": list(s.quotas)}
                           for s in mixture.blend.segments]}
    if args.world_size is not None:
        ranks = range(args.world_size) if args.rank is None else [args.rank]
        report["ranks"] = [{"rank": r, "samples": len(rank_indices(0, mixture.total, r, args.world_size))}
                           for r in ranks]
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"mixed pretraining sequences {args.plan}: {mixture.total} samples in {mixture.num_windows} windows of "
          f"{mixture.window}, seed {mixture.seed}, fingerprint {mixture.fingerprint}")
    for c in report["components"]:
        cap = "no cap" if c["max_epochs"] is None else f"at most {c['max_epochs']} epoch(s)"
        d = c["definition"]
        print(f"  {c['name']}: weight {c['weight']}, seed {d['seed']}, {c['documents']} documents, "
              f"{c['epoch_tokens']} tokens and {c['epoch_samples']} samples of {d['sequence_length']} + 1 an epoch "
              f"({d['tail']} tail), {cap}; {c['samples_read']} samples read over {c['epochs_read']} epoch(s)")
    for seg in report["segments"]:
        print(f"  windows {seg['first']} to {seg['first'] + seg['windows'] - 1}: {seg['size']} samples, "
              f"quotas {seg['quotas']}")
    for row in report.get("ranks", []):
        print(f"    rank {row['rank']}: {row['samples']} samples")
    return 0


def run_info(args) -> int:
    from ..batching.plans.io import load_plan
    from ..batching.plans.sharding import check_rank, rank_shares
    from ..batching.plans.windows.io import is_mixed_plan, is_windowed_plan
    from ..batching.plans.windows.sequences_io import is_mixed_sequences

    if is_mixed_plan(args.plan):
        return _info_mixed(args)
    if is_mixed_sequences(args.plan):
        return _info_mixed_sequences(args)
    windowed = is_windowed_plan(args.plan)
    plan = None if windowed else load_plan(args.plan)
    if args.rank is not None and args.world_size is None:
        from ..batching.plans.buckets import config_error

        raise config_error("--rank needs --world-size")
    if args.world_size is not None:
        check_rank(args.rank or 0, args.world_size)
    if windowed:
        return _info_windowed(args)
    assert plan is not None
    meta = plan.meta
    pack = meta.config.pack
    report = {"plan": args.plan, "fingerprint": meta.fingerprint, "config": meta.config.to_dict(),
              "pack_config": None if pack is None else pack.to_dict(), "num_samples": meta.num_samples,
              "shard": meta.shard, "units": meta.units, "overlong": overlong_counts(plan),
              "epochs": []}
    for epoch in plan.epochs:
        stats = {k: v for k, v in epoch.stats.items() if k != "skipped"}
        if args.world_size is not None:
            shares = rank_shares(plan, epoch.epoch, args.world_size)
            stats["ranks"] = shares if args.rank is None else [shares[args.rank]]
        report["epochs"].append(stats)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    config = meta.config
    print(f"plan {args.plan}")
    print(f"  fingerprint {meta.fingerprint}")
    print(f"  {meta.num_samples} samples, {plan.num_epochs} epoch(s), budget {config.token_budget}, "
          f"{config.pad_policy.value}, edges {list(config.bucket_edges)} + overflow {config.overflow_max}, "
          f"seed {config.seed}, {config.stage}")
    if config.group_size > 1:
        print(f"  preference pairs: {meta.num_samples // config.group_size} pairs, rows 2p and 2p + 1 in one "
              "microbatch")
    if pack is not None:
        print(f"  packed: {pack.mode.value}, rows of {pack.max_length} tokens, {config.rows_per_microbatch} rows per "
              f"microbatch, separator {pack.separator_len}")
    print("  " + overlong_line(plan))
    split = split_line(meta)
    if split is not None:
        print("  " + split)
    if meta.shard:
        print(f"  shard {meta.shard['rank']} of {meta.shard['world_size']} (source {meta.shard['source_fingerprint']})")
    for stats in report["epochs"]:
        print(f"  epoch {stats['epoch']}: {stats['microbatches']} microbatches, {stats['samples']} samples, "
              f"{stats['skipped_samples']} skipped, {stats['tokens']} tokens, padding_waste "
              f"{stats['padding_waste']:.4f}, "
              f"bucket_mix_drift {stats['bucket_mix_drift']:.4f}")
        if "packing" in stats:
            print("    " + packing_line(stats["packing"]))
        for row in stats.get("ranks", []):
            print(f"    rank {row['rank']}: {row['microbatches']} microbatches, {row['samples']} samples, "
                  f"{row['tokens']} tokens, {row['padded_tokens']} padded tokens")
    return 0


def _info_windowed(args) -> int:
    """``plan info`` of a windowed plan folder (batching/plans/windows/info.py): from meta.json and the index."""
    from ..batching.plans.windows import load_windowed_plan
    from ..batching.plans.windows.info import report_lines, windowed_report

    plan = load_windowed_plan(args.plan, lengths=windowed_lengths(args.plan))
    report = windowed_report(plan, args.plan, world_size=args.world_size, rank=args.rank)
    print(json.dumps(report, indent=2) if args.json else "\n".join(report_lines(report)))
    return 0


def packing_line(packing: dict) -> str:
    """One line of a packed epoch's PackingMetrics (stats.json ``packing``)."""
    return (f"packing: {packing['rows']} rows (lower bound {packing['lower_bound_rows']}), packing_efficiency "
            f"{packing['packing_efficiency']:.4f}, {packing['segments_per_row']:.2f} segments per row")


def run_verify(args) -> int:
    from ..batching.plans.verify import verify_plan
    from ..batching.plans.windows.io import is_mixed_plan, is_windowed_plan
    from ..batching.plans.windows.sequences_io import is_mixed_sequences, is_sequences

    if is_sequences(args.plan) or is_mixed_sequences(args.plan):
        return _verify_sequences(args)
    if is_windowed_plan(args.plan) or is_mixed_plan(args.plan):
        return _verify_windowed(args)
    if args.windows is not None:
        raise UmlosError(errors.BATCHING_CONFIG_INVALID, f"--windows replans windows of a windowed plan; {args.plan} "
                         "is a batch plan (plan verify checks all of it)", operator=errors.BATCH_PLAN_OPERATOR)
    lengths = load_lengths(args.lengths, read_ids=False) if args.lengths else None
    report = verify_plan(args.plan, expected_fingerprint=args.expected_fingerprint, lengths=lengths,
                         reproduce=not args.no_rebuild)
    for check in report["checks"]:
        print(f"ok  {check}")
    print(f"plan {args.plan} verified: fingerprint {report['fingerprint']}")
    return 0


def _verify_windowed(args) -> int:
    """``plan verify`` of a windowed plan folder (batching/plans/windows/verify.py): ``--lengths`` names
    the length cache whose ``.u32`` sidecar it maps, or a token source read by rows (default: what
    meta.json's ``lengths_path`` names)."""
    from ..batching.lengths.cache import SIDECAR_SUFFIX, sidecar_path
    from ..batching.plans.windows.io import is_mixed_plan
    from ..batching.plans.windows.verify import verify_mixed_plan, verify_windowed_plan

    mixed = is_mixed_plan(args.plan)
    if mixed and args.lengths is not None:
        raise UmlosError(errors.BATCHING_CONFIG_INVALID, f"{args.plan} is a mixed plan: it maps the sidecars its "
                         "meta.json names (--lengths takes one cache)", operator=errors.BATCH_PLAN_OPERATOR)
    verify = verify_mixed_plan if mixed else verify_windowed_plan
    lengths = args.lengths
    if mixed:
        lengths = mixed_lengths(args.plan)
    elif lengths is None:
        lengths = windowed_lengths(args.plan)
    elif names_token_source(lengths):  # a Megatron prefix or a token store: read by rows, as the build read it
        lengths = _mapped_token_lengths(lengths)
    elif not lengths.endswith(SIDECAR_SUFFIX):
        lengths = sidecar_path(lengths)
    report = verify(args.plan, windows=args.windows, seed=args.seed, lengths=lengths,
                    expected_fingerprint=args.expected_fingerprint)
    for check in report["checks"]:
        print(f"ok  {check}")
    print(f"{'mixed' if mixed else 'windowed'} plan {args.plan} verified: fingerprint {report['fingerprint']}")
    return 0


def _verify_sequences(args) -> int:
    """``plan verify`` of a pretraining sequences folder or a mixture of them: the tokens opened from meta.json's
    ``tokens_path`` (each of its ``tokens_paths``)."""
    from ..batching.plans.windows.sequences_io import is_mixed_sequences
    from ..batching.plans.windows.verify import verify_mixed_sequences, verify_sequences

    if args.lengths is not None:
        raise UmlosError(errors.BATCHING_CONFIG_INVALID, f"{args.plan} holds pretraining sequences: it reads the "
                         "tokens its meta.json names (no --lengths)", operator=errors.BATCH_PLAN_OPERATOR)
    mixed = is_mixed_sequences(args.plan)
    verify = verify_mixed_sequences if mixed else verify_sequences
    report = verify(args.plan, windows=args.windows, seed=args.seed, open_tokens=cut_source,
                    expected_fingerprint=args.expected_fingerprint)
    for check in report["checks"]:
        print(f"ok  {check}")
    print(f"{'mixed ' if mixed else ''}pretraining sequences {args.plan} verified: fingerprint {report['fingerprint']}")
    return 0


def run_shard(args) -> int:
    from ..batching.plans.io import check_shards_dir, load_plan, save_shards
    from ..batching.plans.sharding import check_shard_count

    check_shard_count(args.world_size)
    check_shards_dir(args.output, args.force, (args.plan,))  # fail before the work
    plan = load_plan(args.plan, verify=not args.no_verify)
    rows = save_shards(plan, args.world_size, args.output, jsonl=args.jsonl, force=args.force, inputs=(args.plan,))
    for row in rows:
        print(f"rank {row['rank']}: {row['microbatches']} microbatches, fingerprint {row['fingerprint']}")
    print(f"wrote {args.world_size} shard(s) of {plan.fingerprint} to {args.output}")
    return 0
