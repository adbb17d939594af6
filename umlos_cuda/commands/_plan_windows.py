"""The windowed kinds of ``umlos-cuda plan``: ``build --window`` and ``--mix``, ``cut`` (pretraining
sequences and their mixtures), and ``info`` / ``verify`` of those folders.

``plan.py`` registers the commands and keeps the whole (non-windowed) plans; what a windowed plan,
a mixed plan, pretraining sequences or a mixture of them needs at the command layer lives here:
opening their inputs in bounded memory (``umlos_cuda.batching.sources.open_source``: a length cache's
sidecar, a token source by rows), parsing ``--mix``, and printing their reports.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from .. import errors
from ..errors import UmlosError
from ._args import MODE_ALIASES


def build_windowed(args, config, inputs) -> int:
    """``plan build --window W``: a windowed plan (batching/plans/windows/) over any source (``open_source``: a
    length cache's sidecar checked against the JSONL, or against its own SHA-256 when ``--lengths`` names the
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
    source = open_source(os.path.abspath(args.lengths))
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
        print(json.dumps(sample_json(plan.sample(0, args.show))))
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
    """The token source ``plan cut`` reads at ``path`` (a token store, a sharded store, a Megatron prefix), for
    ``--tokens`` and every ``--mix`` entry: read by rows (``open_source``: nothing O(N) in memory, bound as the
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


def build_mixed(args, config) -> int:
    """``plan build --window W --mix A:0.7 B:0.3``: a mixed plan (batching/plans/windows/mixture.py) over
    any sources (``open_source``: token sources and length caches' sidecars, each checked in bounded memory,
    then memory-mapped)."""
    from ..batching.lengths.cache import sidecar_path
    from ..batching.plans.buckets import config_error
    from ..batching.plans.windows import Component, MixedPlan, MixtureDefinition
    from ..batching.plans.windows.io import MIXED_PLAN, save_mixed_plan
    from ..batching.sources import open_source, source_kind
    from ..batching.sources.builtin import LENGTH_CACHE
    from ..batching.plans.windows.window import check_windowed_config
    from ..files.writer import check_output_folder
    from ._progress import Progress

    if args.mix is None or args.window is None or args.lengths is not None or args.epochs != 1:
        raise config_error("--mix needs --window and takes no --lengths or --epochs (caps and --num-samples "
                           "decide its length); --num-samples needs --mix")
    entries = parse_mix(args.mix, args.seed)
    inputs = [name for path, *_ in entries for name in ((path, sidecar_path(path)) if source_kind(path) is LENGTH_CACHE
                                                        else (path,))]
    names = mix_names([path for path, *_ in entries])
    check_windowed_config(config)  # refuses what windows do not plan, before any read
    check_output_folder(args.output, MIXED_PLAN, force=args.force, inputs=inputs, operator=errors.BATCH_PLAN_OPERATOR)
    started = time.perf_counter()
    components = [Component(open_source(os.path.abspath(path)), weight, seed, cap, name)
                  for (path, weight, cap, seed), name in zip(entries, names)]
    definition = MixtureDefinition(config, tuple(components), args.window, args.num_samples)
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


def info_mixed(args) -> int:
    """``plan info`` of a mixed plan folder: the definition, its segments and the index's totals (no window
    planned); with ``--world-size``, each rank's microbatches under the resume rule (resume.py: global
    microbatch ``k`` to rank ``k mod R``), as for a windowed plan."""
    from ..batching.plans.windows.io import load_mixed_plan
    from ..batching.plans.windows.resume import rank_indices

    check_rank_arguments(args)
    plan = load_mixed_plan(args.plan)
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


def info_mixed_sequences(args) -> int:
    """``plan info`` of a mixture of pretraining sequences: the definition, each dataset's cut and the epochs
    of it read, the segments (from meta.json and the indices: no window merged); with ``--world-size``, each
    rank's samples under the resume rule (global sample ``k`` to rank ``k mod R``)."""
    from ..batching.plans.windows import load_mixed_sequences
    from ..batching.plans.windows.resume import rank_indices

    check_rank_arguments(args)
    mixture = load_mixed_sequences(args.plan)
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


def check_rank_arguments(args) -> None:
    """``plan info``'s ``--rank`` needs ``--world-size``, a rank of it, and a list of every rank's share stops at
    ``MAX_SHARE_RANKS`` ranks (as a whole plan's report): BATCHING_CONFIG_INVALID or INVALID_RANK before any read."""
    from ..batching.plans.buckets import config_error
    from ..batching.plans.sharding import MAX_SHARE_RANKS, check_rank

    if args.rank is not None and args.world_size is None:
        raise config_error("--rank needs --world-size")
    if args.world_size is not None:
        check_rank(args.rank or 0, args.world_size)
        if args.rank is None and args.world_size > MAX_SHARE_RANKS:
            raise config_error(f"per-rank shares are listed for at most {MAX_SHARE_RANKS} ranks, got world_size "
                               f"{args.world_size}")


def info_sequences(args) -> int:
    """``plan info`` of pretraining sequences (``plan cut``): the definition and each epoch's tokens and samples,
    from meta.json and the index (no window cut, no token read); with ``--world-size``, each rank's samples of
    each epoch under the resume rule (global sample ``k`` to rank ``k mod R``)."""
    from ..batching.plans.windows import load_sequences
    from ..batching.plans.windows.resume import rank_indices

    check_rank_arguments(args)
    plan = load_sequences(args.plan)
    d = plan.definition
    report = {"plan": args.plan, "kind": "pretraining sequences", "fingerprint": plan.fingerprint,
              "definition": d.to_dict(), "windows": d.num_windows, "epochs": []}
    for e in range(plan.num_epochs):
        entry: dict[str, Any] = {"epoch": e, "tokens": plan.epoch_tokens(e), "samples": plan.epoch_samples(e)}
        if args.world_size is not None:
            ranks = range(args.world_size) if args.rank is None else [args.rank]
            entry["ranks"] = [{"rank": r, "samples": len(rank_indices(0, entry["samples"], r, args.world_size))}
                              for r in ranks]
        report["epochs"].append(entry)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"pretraining sequences {args.plan}: {d.num_documents} documents, samples of {d.sequence_length} + 1 "
          f"tokens ({d.tail} tail, eos {d.eos}), {d.num_windows} windows of {d.window}, {d.order} order, seed "
          f"{d.seed}, fingerprint {plan.fingerprint}")
    for entry in report["epochs"]:
        print(f"  epoch {entry['epoch']}: {entry['tokens']} tokens, {entry['samples']} samples")
        for row in entry.get("ranks", []):
            print(f"    rank {row['rank']}: {row['samples']} samples")
    return 0


def info_windowed(args) -> int:
    """``plan info`` of a windowed plan folder (batching/plans/windows/info.py): from meta.json and the index."""
    from ..batching.plans.windows import load_windowed_plan
    from ..batching.plans.windows.info import report_lines, windowed_report

    plan = load_windowed_plan(args.plan)
    report = windowed_report(plan, args.plan, world_size=args.world_size, rank=args.rank)
    print(json.dumps(report, indent=2) if args.json else "\n".join(report_lines(report)))
    return 0


def verify_windowed(args) -> int:
    """``plan verify`` of a windowed plan folder (batching/plans/windows/verify.py): ``--lengths`` names any
    source (``open_source``: a length cache, its sidecar, a token source read by rows; default: what
    meta.json's ``lengths_path`` names)."""
    from ..batching.plans.windows.io import is_mixed_plan
    from ..batching.plans.windows.verify import verify_mixed_plan, verify_windowed_plan

    mixed = is_mixed_plan(args.plan)
    if mixed and args.lengths is not None:
        raise UmlosError(errors.BATCHING_CONFIG_INVALID, f"{args.plan} is a mixed plan: it maps the sidecars its "
                         "meta.json names (--lengths takes one cache)", operator=errors.BATCH_PLAN_OPERATOR)
    verify = verify_mixed_plan if mixed else verify_windowed_plan
    report = verify(args.plan, windows=args.windows, seed=args.seed, lengths=args.lengths,
                    expected_fingerprint=args.expected_fingerprint)
    for check in report["checks"]:
        print(f"ok  {check}")
    print(f"{'mixed' if mixed else 'windowed'} plan {args.plan} verified: fingerprint {report['fingerprint']}")
    return 0


def verify_sequences(args) -> int:
    """``plan verify`` of a pretraining sequences folder or a mixture of them: the tokens opened from meta.json's
    ``tokens_path`` (each of its ``tokens_paths``)."""
    from ..batching.plans.windows.sequences_io import is_mixed_sequences
    from ..batching.plans.windows.verify import verify_mixed_sequences, verify_sequences

    if args.lengths is not None:
        raise UmlosError(errors.BATCHING_CONFIG_INVALID, f"{args.plan} holds pretraining sequences: it reads the "
                         "tokens its meta.json names (no --lengths)", operator=errors.BATCH_PLAN_OPERATOR)
    mixed = is_mixed_sequences(args.plan)
    verify = verify_mixed_sequences if mixed else verify_sequences
    report = verify(args.plan, windows=args.windows, seed=args.seed, expected_fingerprint=args.expected_fingerprint)
    for check in report["checks"]:
        print(f"ok  {check}")
    print(f"{'mixed ' if mixed else ''}pretraining sequences {args.plan} verified: fingerprint {report['fingerprint']}")
    return 0
