"""``umlos-cuda data lengths build|stats``: the length cache of a dataset (any format of umlos_cuda/batching/records/).

``build`` counts every record's tokens with a local Hugging Face tokenizer
and writes ``lengths.jsonl`` (one ``{"sample_id", "tokenizer_hash",
"length"}`` row per record, in dataset order) and its binary sidecar
``lengths.jsonl.u32``. ``stats`` prints the histogram, percentiles and, for
1 to K buckets, the edges that minimise padding. Exit status 0 on success,
2 on a usage error or any failure code (docs/batching.md, "Failure codes").
"""

from __future__ import annotations

import json
from typing import Any

from ._args import positive_int
from ._dataset_args import DATASET_FORMATS, add_dataset_arguments, run_with_progress


def register(subparsers) -> None:
    data = subparsers.add_parser(
        "data",
        help=f"prepare a dataset ({DATASET_FORMATS}) for token-budget batching: token stores, length caches",
        description=f"Prepare a dataset ({DATASET_FORMATS}) for token-budget batching. 'data lengths build' writes "
        "its length "
        "cache; 'data lengths stats' summarises one and suggests bucket edges; 'data tokenize' writes its token "
        "store (for batch files); 'data megatron' writes the length cache of a Megatron-LM indexed dataset.",
    )
    actions = data.add_subparsers(dest="data_action", metavar="ACTION")
    lengths = actions.add_parser(
        "lengths", help="build or summarise a length cache",
        description="Build a length cache (lengths.jsonl and its .u32 sidecar) or summarise one.",
    )
    steps = lengths.add_subparsers(dest="lengths_action", metavar="ACTION")

    build = steps.add_parser(
        "build", help="count every record's tokens and write lengths.jsonl and lengths.jsonl.u32",
        description=f"Count the tokens of every record of a dataset ({DATASET_FORMATS}) with a local tokenizer (a "
        "tokenizer.json "
        "file or a directory holding one; nothing is downloaded) and write the length cache: OUTPUT (JSONL rows "
        "sample_id, tokenizer_hash, length, in dataset order) and OUTPUT.u32 (the same lengths as uint32, for "
        "fast loading). A record's sample_id is its id field, else its 0-based row number.",
    )
    add_dataset_arguments(build, output_metavar="LENGTHS.jsonl", output_help="the cache to write", verb="count",
                          force_help="replace existing output files", required_tokenizer=False)
    build.add_argument("--length-field", metavar="F",
                       help="read each record's length from the integer field F (a token-count column) instead of "
                       "tokenizing; --tokenizer is then optional (its fingerprint is recorded; default 'unknown')")
    build.set_defaults(func=lambda args: run_build(args, build))

    stats = steps.add_parser(
        "stats", help="histogram, percentiles and the bucket edges with the least padding",
        description="Summarise a length cache: sample and token counts, a power-of-two histogram, percentiles, and "
        "for 1 to K buckets the edges that minimise padding when every sample is padded to its bucket's edge "
        "(exact; edges are inclusive upper bounds), with the padding each choice gives.",
    )
    stats.add_argument("lengths", metavar="LENGTHS.jsonl", help="a length cache")
    stats.add_argument("--buckets", type=positive_int("buckets"), default=4, metavar="K",
                       help="suggest edges for 1 to K buckets (default 4)")
    stats.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    stats.set_defaults(func=run_stats)

    from ._tokenize import register_actions

    register_actions(actions)  # data tokenize, data megatron

    for parser in (data, lengths):
        parser.set_defaults(func=lambda args, parser=parser: (parser.print_help(), 1)[1])


def run_build(args, parser) -> int:
    from ..batching.lengths.builder import build_lengths

    cache, elapsed = run_with_progress(args, parser, f"lengths {args.output}", build_lengths)
    lengths = cache.lengths
    print(f"wrote {args.output} and {args.output}.u32: {len(cache)} samples, {int(lengths.sum(dtype='u8'))} tokens "
          f"(min {int(lengths.min())}, mean {float(lengths.mean()):.1f}, max {int(lengths.max())})")
    print(f"tokenizer_hash {cache.tokenizer_hash}")
    print(f"dataset_hash {cache.dataset_hash}")
    print(f"{len(cache) / max(elapsed, 1e-9):.0f} samples/s ({elapsed:.2f} s)")
    return 0


def run_stats(args) -> int:
    from ..batching.lengths.stats import optimal_bucket_choices, percentiles, power_of_two_histogram
    from ..batching.lengths.cache import LengthCache

    cache = LengthCache.load(args.lengths)
    lengths = cache.lengths
    histogram = power_of_two_histogram(lengths)
    points = percentiles(lengths)
    choices = optimal_bucket_choices(lengths, args.buckets)
    summary: dict[str, Any] = {
        "samples": len(cache),
        "tokens": int(lengths.sum(dtype="u8")),
        "tokenizer_hash": cache.tokenizer_hash,
        "min": int(lengths.min()),
        "mean": float(lengths.mean()),
        "max": int(lengths.max()),
        "percentiles": {f"p{p:g}": value for p, value in points.items()},
        "histogram": [{"low": low, "high": high, "count": count} for low, high, count in histogram],
        "bucket_edges": [choice.to_dict() for choice in choices],
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"{args.lengths}: {summary['samples']} samples, {summary['tokens']} tokens, "
          f"tokenizer_hash {cache.tokenizer_hash[:16]}...")
    print(f"length: min {summary['min']}, mean {summary['mean']:.1f}, max {summary['max']}")
    print("percentiles: " + ", ".join(f"{name} {value}" for name, value in summary["percentiles"].items()))
    print("histogram (tokens per sample):")
    widest = max(count for _, _, count in histogram)
    for low, high, count in histogram:
        bar = "#" * (round(40 * count / widest) if count else 0)
        print(f"  [{low:>6}, {high:>6})  {count:>10}  {100 * count / len(cache):5.1f}%  {bar}")
    print("bucket edges with the least padding (each sample padded to its bucket's edge):")
    for choice in choices:
        edges = ",".join(map(str, choice.edges))
        print(f"  {choice.buckets} bucket{'s' if choice.buckets > 1 else ' '}  edges {edges:<32}  padding "
              f"{choice.padding_tokens} tokens ({100 * choice.padding_waste:.1f}% of padded tokens)")
    return 0
