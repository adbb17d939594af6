"""The windowed builds of ``umlos-cuda plan``: ``build --window`` and ``--mix``, ``cut`` (pretraining
sequences and their mixtures).

``plan.py`` registers the commands and keeps the whole (non-windowed) plans; what building a windowed plan,
a mixed plan, pretraining sequences or a mixture of them needs at the command layer lives here: opening
their inputs in bounded memory (``umlos_cuda.batching.sources.open_source``: a length cache's sidecar, a
token source by rows) and parsing ``--mix``. ``plan info`` and ``plan verify`` reach every kind through
the plan-kind registry (``umlos_cuda.batching.plans.kinds``).
"""

from __future__ import annotations

import json
import os
import time
from fractions import Fraction
from .. import errors
from ..remote.urls import absolute
from ._args import resolve_order


def build_windowed(args, config, inputs) -> int:
    """``plan build --window W``: a windowed plan (batching/plans/windows/) over any source (``open_source``: a
    length cache's sidecar checked against the JSONL, or against its own SHA-256 when ``--source`` names the
    ``.u32``; a token source by rows); the plan binds its lengths by their count and SHA-256 and records where
    they were read."""
    from ..batching.plans.windows import WindowDefinition, WindowedPlan, save_windowed_plan
    from ..batching.plans.windows.io import WINDOWED_PLAN
    from ..batching.sources import open_source
    from ..files.writer import check_output_folder
    from ._progress import Progress

    definition_check = WindowDefinition(config, 1, args.window)  # refuses what windows do not plan, before any read
    del definition_check
    check_output_folder(args.output, WINDOWED_PLAN, force=args.force, inputs=inputs,
                        operator=errors.BATCH_PLAN_OPERATOR)
    started = time.perf_counter()
    source = open_source(absolute(args.lengths))
    definition = WindowDefinition(config, source.count, args.window)
    total = args.epochs * definition.num_windows
    progress = Progress(total, f"plan {args.output}", enabled=not args.quiet)
    plan = WindowedPlan.build(definition, source, args.epochs, progress=lambda done, _: progress.update(done))
    save_windowed_plan(plan, args.output, force=args.force, inputs=inputs)
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
    from ._progress import Progress

    if args.mix is not None or args.num_samples is not None or args.mix_schedule is not None \
            or args.mix_unit is not None:
        return _cut_mixed(args)
    if args.tokens is None:
        from ..batching.plans.buckets import config_error

        raise config_error("--source is required (unless --mix)")
    check_output_folder(args.output, SEQUENCES, force=args.force, inputs=(args.tokens,),
                        operator=errors.BATCH_PLAN_OPERATOR)
    started = time.perf_counter()
    source = cut_source(args.tokens)
    definition = CutDefinition(len(source), args.sequence_length, args.window, args.seed, *resolve_order(args),
                               args.block_size, args.eos, args.tail)
    progress = Progress(args.epochs * definition.num_windows, f"cut {args.output}", enabled=not args.quiet)
    plan = PretrainingSequences.build(definition, source, args.epochs,
                                      progress=lambda done, _: progress.update(done))
    save_sequences(plan, args.output, tokens_path=args.tokens, force=args.force)
    progress.close()
    seconds = time.perf_counter() - started
    print(f"pretraining sequences {args.output}: {plan.num_epochs} epoch(s) of {definition.num_documents} "
          f"documents, {plan.epoch_tokens(0)} tokens and {plan.epoch_samples(0)} samples of "
          f"{definition.sequence_length} + 1 tokens per epoch ({definition.tail} tail), "
          f"{definition.num_windows} windows of {definition.window}")
    print(f"fingerprint {plan.fingerprint}")
    print(f"built in {seconds:.2f} s")
    if args.show is not None:
        print(json.dumps(sample_json(plan.sample(0, args.show))))
    return 0


def _cut_mixed(args) -> int:
    """``plan cut --mix A:0.7 B:0.3 --num-samples N``: a mixture of pretraining sequences
    (batching/plans/windows/sequence_mixture.py), each dataset cut as ``plan cut --source`` cuts it (with its own
    seed), blended per window of ``--window`` samples (its cuts use windows of ``--window`` documents too)."""
    from ..batching.plans.buckets import config_error
    from ..batching.plans.windows import CutDefinition, SequenceMixture, save_mixed_sequences
    from ..batching.plans.windows.schedule import read_schedule
    from ..batching.plans.windows.sequences_io import MIXED_SEQUENCES
    from ..files.writer import check_output_folder

    if args.mix is None or args.tokens is not None or args.epochs != 1:
        raise config_error("--mix takes no --source or --epochs (caps and --num-samples decide its length); "
                           "--num-samples, --mix-schedule and --mix-unit need --mix")
    if args.mix_unit not in (None, "samples"):
        raise config_error(f"--mix-unit {args.mix_unit}: a mixture of pretraining sequences counts samples only; "
                           "every sequence holds sequence_length + 1 tokens, so its sample quotas are its token "
                           "quotas already (token quotas are for plan build --window --mix)")
    entries = parse_mix(args.mix, args.seed)
    paths = [path for path, *_ in entries]
    check_output_folder(args.output, MIXED_SEQUENCES, force=args.force,
                        inputs=paths + ([] if args.mix_schedule is None else [args.mix_schedule]),
                        operator=errors.BATCH_PLAN_OPERATOR)
    started = time.perf_counter()
    stage, order = resolve_order(args)
    parts = []
    for (path, weight, cap, seed), name in zip(entries, mix_names(paths)):
        source = cut_source(path)
        definition = CutDefinition(len(source), args.sequence_length, args.window, seed, stage, order,
                                   args.block_size, args.eos, args.tail)
        parts.append((definition, source, weight, cap, name))
    schedule = None if args.mix_schedule is None else \
        read_schedule(args.mix_schedule, mix_names(paths), [Fraction(weight) for _, weight, *_ in entries])
    mixture = SequenceMixture.build(parts, args.window, args.num_samples, args.seed, schedule=schedule)
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
    """The token source ``plan cut`` reads at ``path`` (a token store, a sharded store, a Megatron prefix), for
    ``--source`` and every ``--mix`` entry: read by rows (``open_source``: nothing O(N) in memory, bound as the
    lengths held would be); a Megatron prefix's every size and pointer checked first, in pieces, as
    ``MegatronDataset.open`` checks them, so every document of the sequences can be read."""
    from ..batching.sources import open_source

    source = open_source(path, tokens=True)
    if hasattr(source, "check_rows"):
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
    not taken); CAP and SEED are read by ``checks.integer_text`` (ASCII digits, a cap in [1, 2^32], a seed in
    [0, 2^64 - 1]); BATCHING_CONFIG_INVALID for anything else."""
    from .. import checks
    from ..batching.plans.buckets import config_error
    from ..batching.plans.windows.blend import MAX_CAP

    parsed = []
    for place, item in enumerate(items):
        path, *numbers = item.split(":")
        words = checks.literal(f"--mix takes LENGTHS.jsonl:WEIGHT[:CAP[:SEED]] (a CAP in [1, {MAX_CAP}] or '-', a "
                               f"SEED in [0, 2^64 - 1]), got {item[:checks.SHOWN_CHARS]!r}")
        if not path or not 1 <= len(numbers) <= 3:
            raise config_error(words)
        try:
            weight = float(numbers[0])
        except ValueError:
            raise config_error(words) from None
        cap = None if len(numbers) < 2 or numbers[1] == "-" else \
            checks.integer_text(numbers[1], "CAP", 1, MAX_CAP, fail=config_error, message=words)
        own = (seed + 1 + place) % (1 << 64) if len(numbers) < 3 else \
            checks.integer_text(numbers[2], "SEED", fail=config_error, message=words)
        parsed.append((path, weight, cap, own))
    return parsed


def build_mixed(args, config) -> int:
    """``plan build --window W --mix A:0.7 B:0.3``: a mixed plan (batching/plans/windows/mixture.py) over
    any sources (``open_source``: token sources and length caches' sidecars, each checked in bounded memory,
    then memory-mapped)."""
    from ..batching.lengths.cache import sidecar_path
    from ..batching.plans.buckets import config_error
    from ..batching.plans.windows import Component, MixedPlan, MixtureDefinition
    from ..batching.plans.windows.io import MIXED_PLAN, save_mixed_plan
    from ..batching.plans.windows.schedule import read_schedule
    from ..batching.sources import open_source, source_kind
    from ..batching.sources.builtin import LENGTH_CACHE
    from ..batching.plans.windows.window import check_windowed_config
    from ..files.writer import check_output_folder
    from ._progress import Progress

    for flag, value in (("--mix-schedule", args.mix_schedule), ("--mix-unit", args.mix_unit)):
        if value is not None and args.mix is None:
            raise config_error(f"{flag} needs --mix")
    if args.mix is None or args.window is None or args.lengths is not None or args.epochs != 1:
        raise config_error("--mix needs --window and takes no --source or --epochs (caps and --num-samples "
                           "decide its length); --num-samples needs --mix")
    entries = parse_mix(args.mix, args.seed)
    inputs = [name for path, *_ in entries for name in ((path, sidecar_path(path)) if source_kind(path) is LENGTH_CACHE
                                                        else (path,))]
    inputs += [] if args.mix_schedule is None else [args.mix_schedule]
    names = mix_names([path for path, *_ in entries])
    check_windowed_config(config)  # refuses what windows do not plan, before any read
    check_output_folder(args.output, MIXED_PLAN, force=args.force, inputs=inputs, operator=errors.BATCH_PLAN_OPERATOR)
    started = time.perf_counter()
    components = [Component(open_source(absolute(path)), weight, seed, cap, name)
                  for (path, weight, cap, seed), name in zip(entries, names)]
    schedule = None if args.mix_schedule is None else \
        read_schedule(args.mix_schedule, names, [Fraction(weight) for _, weight, *_ in entries])
    unit = (args.mix_unit or "samples").replace("-", "_")
    definition = MixtureDefinition(config, tuple(components), args.window, args.num_samples, schedule, unit)
    progress = Progress(definition.num_windows, f"plan {args.output}", enabled=not args.quiet)
    plan = MixedPlan.build(definition, progress=lambda done, _: progress.update(done))
    save_mixed_plan(plan, args.output, force=args.force, inputs=inputs)
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
