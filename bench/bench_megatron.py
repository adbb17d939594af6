"""megatron-core's index building (GPTDataset, BlendedDataset) on synthetic document lengths: the ground for issue 25.

Megatron-LM plans pretraining by building, on rank 0 before training starts,
three arrays per ``GPTDataset`` (the document index: every document of every
epoch, shuffled; the sample index: where each ``sequence_length + 1``-token
sample starts, built by the C++ helper ``build_sample_idx``; the shuffle
index: a permutation of the samples) and, for a mixture, two more per
``BlendedDataset`` (which dataset and which of its samples, by the C++
helper ``build_blending_indices``), all saved as ``.npy`` files in a cache
folder and memory-mapped by every rank. This bench times that, measured as a
pretraining run meets it, for ``--documents`` documents at
``--sequence-length`` (default 2048):

* ``build s``: ``BlendedMegatronDatasetBuilder(...).build()`` from an empty
  cache (opening the ``IndexedDataset`` included, saving the ``.npy`` files
  included);
* ``peak RSS``: the child process's peak resident memory (``VmHWM``), and
  ``+MB`` its rise over the resident memory just before the build (after
  importing torch and megatron-core, which cost the same to every engine);
* ``cache MB``: the bytes of the ``.npy`` cache the build wrote;
* ``first ms``: ``dataset[0]`` right after the build;
* ``reopen s`` / ``k ms``: a fresh process, as a restarted job does: the
  builder again, now finding its cache (``.npy`` memory-mapped), then
  ``dataset[k]`` for random ``k`` (median of ``--k-samples`` draws): time to
  sample k on resume, which is mostly the first touch of the sample's pages
  of the ``.bin`` (page faults); ``k again µs``: the same ``k`` read again,
  pages resident: the index lookups and the sample's assembly alone.

Rows: ``GPTDataset`` over one dataset (``--samples``: the samples asked
for, default one epoch), and ``BlendedDataset`` over three datasets of the
same size (weights 0.5, 0.3, 0.2, as many samples as documents). Each
measurement runs in its own subprocess (``--child``), so one's memory does
not count in another's peak. ``to first sample s``: from an empty cache to
``dataset[0]`` (Megatron: the build, then the sample). The row ``windowed
plan`` is this project's pretraining sequences on the same documents
(:func:`windowed_plan`; ``--project-python`` names an interpreter that
imports umlos_cuda, ``--no-megatron`` leaves Megatron's rows out), and the
row ``mixed plan x3`` this project's weighted mixture of the three datasets
beside ``BlendedDataset`` (:func:`mixed_plan`: whole-document token-budget
microbatches, not 2048-token cuts; its ``first ms`` / ``k ms`` are a
microbatch's plan, no tokens read), and the row ``mixed sequences x3`` this
project's mixture of pretraining sequences beside it, the same work
(:func:`mixed_sequences`: 2048-token cuts of each dataset, blended).

The datasets are written here, seeded: one sequence per document, lengths
lognormal (median e^6.6, about 735 tokens; mean about 970) clipped to [16,
16384], uint16. Index building reads only the ``.idx`` (20 bytes a
document); the ``.bin`` is a sparse file of the right size (all token ids 0,
no disk used), which ``dataset[k]`` reads like any other. megatron-core
needs no tokenizer to build indices: :class:`LengthsOnlyTokenizer` gives the
few attributes ``GPTDatasetConfig`` reads (``vocab_size``, ``eod``, and a
``unique_identifiers`` dict for the cache's description hash). Runs under the
bench venv (bench/megatron/setup.sh):

    bench/.venv-megatron/bin/python bench/bench_megatron.py [--documents 1000000,10000000] [--folder DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

WEIGHTS = (0.5, 0.3, 0.2)


class LengthsOnlyTokenizer:
    """What megatron-core's GPTDatasetConfig and GPTDataset read from a tokenizer, and no more.

    ``vocab_size`` picks the token dtype code (8: uint16), ``eod`` is the end-of-document id the
    sample masks look for, ``unique_identifiers`` goes into the JSON description whose MD5 names the
    cache files. No ``pad``: megatron-core then pads with its own id (-1)."""

    def __init__(self, vocab_size: int = 32000, eod: int = 0) -> None:
        self.vocab_size = vocab_size
        self.eod = eod
        self.unique_identifiers = {"class": type(self).__name__, "vocab_size": vocab_size, "eod": eod}


def write_dataset(prefix: str, documents: int, seed: int) -> int:
    """A Megatron pair of ``documents`` one-sequence documents (module docstring); returns its tokens."""
    rng = np.random.default_rng(seed)
    sizes = np.clip(rng.lognormal(6.6, 0.75, documents), 16, 16384).astype(np.int32)
    pointers = np.zeros(documents, dtype=np.int64)
    np.cumsum(sizes[:-1], dtype=np.int64, out=pointers[1:])
    tokens = int(pointers[-1]) + int(sizes[-1])
    pointers *= 2
    with open(prefix + ".idx", "wb") as handle:
        handle.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, documents, documents + 1))
        handle.write(sizes.tobytes())
        handle.write(pointers.tobytes())
        handle.write(np.arange(documents + 1, dtype=np.int64).tobytes())
    with open(prefix + ".bin", "wb") as handle:
        handle.truncate(tokens * 2)  # sparse: index building never reads it
    return tokens


def _rss_mb() -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _peak_mb() -> float:
    """This process's own peak (VmHWM of its address space). Not ``ru_maxrss``: Linux carries that across
    exec from the forked copy of the parent, so a small child reported the bench parent's size."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(folder) for name in names)


def megatron_build(spec: dict) -> dict:
    """One child's measurement of megatron-core (module docstring): build or reopen, then samples."""
    import logging
    import warnings

    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed", "Could not determine rank"
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    prefixes, weights = spec["prefixes"], spec["weights"]
    config = GPTDatasetConfig(random_seed=1234, sequence_length=spec["sequence_length"],
                              blend=(prefixes, weights), split="1,0,0", path_to_cache=spec["cache"],
                              tokenizer=LengthsOnlyTokenizer(), reset_position_ids=False,
                              reset_attention_mask=False, eod_mask_loss=False)
    before = _rss_mb()
    start = time.perf_counter()
    # a mixture's weights need a size for every split: 0 for the empty valid and test splits
    sizes = [spec["samples"], None, None] if weights is None else [spec["samples"], 0, 0]
    dataset = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()[0]
    built = time.perf_counter() - start
    result = {"build_s": built, "samples": len(dataset), "rss_before_mb": before}
    start = time.perf_counter()
    first = dataset[0]
    result["first_ms"] = (time.perf_counter() - start) * 1e3
    assert first["tokens"].shape[0] == spec["sequence_length"]
    # first touch of each sample's .bin pages, then the same k again
    result.update(_time_draws(lambda k: dataset[k], len(dataset), spec["draws"]))
    result["peak_mb"] = _peak_mb()
    result["cache_bytes"] = _folder_bytes(spec["cache"])
    return result


def windowed_plan(spec: dict) -> dict | None:
    """This project's pretraining sequences (``plan cut``, docs/batching.md "Pretraining sequences") on the
    same documents, in a child like Megatron's, under ``spec["python"]`` (the project's venv).

    Concatenate-and-cut at ``spec["sequence_length"]``, documents as stored (no EOS added: Megatron adds
    none either), the tail dropped (Megatron's count for one epoch), windows of ``spec["window"]`` documents
    of the engine's order, seed 1234. Built when ``spec["cache"]`` holds no folder yet (``build_s``: opening
    the Megatron pair, the index pass and writing the folder), else reopened (``build_s`` is then the
    reopening: meta.json, index.npy, the pair and the lengths' hash). ``first_ms``: sample 0 collated from
    the ``.bin`` right after; ``cold_first_s``: before the build, from nothing to sample 0 with a lazy plan
    (``build(..., lazy=True)``: the pair opened, one chunk of windows counted, one sample collated), what a
    job that starts training at once waits; ``k_ms`` / ``k_warm_ms``: random ``k`` (one window read each). The pair is
    read by :class:`~umlos_cuda.batching.tokens.mapped.MappedMegatron` (sizes and tokens
    per row, memory-mapped), not ``MegatronDataset`` (which checks and copies every pointer). One epoch:
    ``spec["samples"]`` must be None."""
    if spec["samples"] is not None:
        raise SystemExit("the windowed row plans one epoch; run without --samples")
    from umlos_cuda.batching.plans.windows import CutDefinition, PretrainingSequences, load_sequences, save_sequences
    from umlos_cuda.batching.tokens.mapped import MappedMegatron

    prefix, cache = spec["prefixes"][0], spec["cache"]
    before = _rss_mb()
    start = time.perf_counter()
    cold, command_s = None, 0.0
    if not os.path.exists(os.path.join(cache, "meta.json")) and spec.get("cli"):  # as a user runs it
        import contextlib
        import io

        from umlos_cuda.cli import main as command

        with contextlib.redirect_stdout(io.StringIO()):
            status = command(["plan", "cut", "--tokens", prefix, "--sequence-length", str(spec["sequence_length"]),
                              "--window", str(spec["window"]), "--seed", "1234", "--output", cache])
        assert status == 0, "plan cut failed"
        command_s = time.perf_counter() - start  # the build is the command, then the folder opened as a job would
    if not os.path.exists(os.path.join(cache, "meta.json")):  # a job that starts training at once: lazy
        lazy = MappedMegatron(prefix)
        definition = CutDefinition(lazy.count, spec["sequence_length"], window=spec["window"], seed=1234)
        PretrainingSequences.build(definition, lazy, lazy=True).sample(0, 0)
        cold = time.perf_counter() - start
        del lazy
    start = time.perf_counter()
    source = MappedMegatron(prefix)  # sizes and tokens read per row: nothing O(N) in memory
    if os.path.exists(os.path.join(cache, "meta.json")):
        plan = load_sequences(cache, tokens=source)
    else:
        definition = CutDefinition(source.count, spec["sequence_length"], window=spec["window"], seed=1234)
        plan = PretrainingSequences.build(definition, source)
        save_sequences(plan, cache, tokens_path=prefix)
    built = command_s + time.perf_counter() - start
    samples = plan.epoch_samples(0)
    result = {"build_s": built, "samples": samples, "rss_before_mb": before, "cold_first_s": cold}
    start = time.perf_counter()
    first = plan.sample(0, 0)
    result["first_ms"] = (time.perf_counter() - start) * 1e3
    assert first["input_ids"].shape[0] == spec["sequence_length"]
    result.update(_time_draws(lambda k: plan.sample(0, k), samples, spec["draws"]))
    result["peak_mb"] = _peak_mb()
    result["cache_bytes"] = _folder_bytes(cache)
    return result


def mixed_plan(spec: dict) -> dict | None:
    """This project's weighted mixture (docs/batching.md "Weighted mixtures") of the same three datasets, the
    row beside ``BlendedDataset``, in a child under ``spec["python"]``: weights :data:`WEIGHTS`, ``samples``
    documents in all (Megatron's row asks for as many samples), windows of ``spec["window"]``, token-budget
    microbatches of whole documents (budget 65536, buckets 512/1024/2048/4096, documents up to 16384), each
    component its own seed. The work differs: Megatron's samples are 2048-token cuts of a concatenated
    stream, its ``dataset[k]`` reads the sample's tokens; here a sample is a whole document and
    ``microbatch(k)`` is the plan's answer (which documents, of which dataset), no tokens read. Lengths come
    from each ``.idx`` read by rows (``open_source``: ``MappedMegatron``, as ``plan build --mix PREFIX`` does);
    built when ``spec["cache"]`` has no folder yet, else reopened (the lengths read and hashed again)."""
    from umlos_cuda.batching.plans.config import BatchingConfig
    from umlos_cuda.batching.plans.windows import Component, MixedPlan, MixtureDefinition
    from umlos_cuda.batching.plans.windows.io import load_mixed_plan, save_mixed_plan
    from umlos_cuda.batching.sources import open_source

    cache = spec["cache"]
    before = _rss_mb()
    start = time.perf_counter()
    lengths = [open_source(p) for p in spec["prefixes"]]
    if os.path.exists(os.path.join(cache, "meta.json")):
        plan = load_mixed_plan(cache, lengths=lengths)
    else:
        config = BatchingConfig.throughput(token_budget=65536, bucket_edges=(512, 1024, 2048, 4096),
                                           overflow_max=16384, seed=1234)
        components = tuple(Component(source, weight, 1235 + i, None, f"d{i}")
                           for i, (source, weight) in enumerate(zip(lengths, spec["weights"])))
        plan = MixedPlan.build(MixtureDefinition(config, components, spec["window"], spec["samples"]))
        save_mixed_plan(plan, cache, lengths_paths=[None] * len(lengths))
    result = {"build_s": time.perf_counter() - start, "samples": plan.definition.total, "rss_before_mb": before}
    start = time.perf_counter()
    first = plan.microbatch(0)
    result["first_ms"] = (time.perf_counter() - start) * 1e3
    assert first.samples
    # k_warm: the same k again (its window is then the one kept)
    result.update(_time_draws(lambda k: plan.microbatch(k), plan.num_microbatches, spec["draws"]))
    result["peak_mb"] = _peak_mb()
    result["cache_bytes"] = _folder_bytes(cache)
    return result


def mixed_sequences(spec: dict) -> dict | None:
    """This project's mixture of pretraining sequences (``plan cut --mix``, docs/batching.md "Mixtures of
    pretraining sequences") of the same three datasets, the row beside ``BlendedDataset`` with the same work: each
    dataset cut as :func:`windowed_plan` cuts one (sequence length ``spec["sequence_length"]``, documents as stored,
    tail dropped, windows of ``spec["window"]`` documents, its own seed 1235 + i), blended with weights
    :data:`WEIGHTS` in windows of ``spec["window"]`` samples, ``samples`` samples in all (Megatron's row asks for as
    many), no cap (a dataset read past an epoch goes on in a new order). Each pair read by ``MappedMegatron``.
    Built when ``spec["cache"]`` has no folder yet (``build_s``: the pairs opened, each dataset's tokens summed, the
    index pass of every epoch read, the folder written), else reopened (meta.json, index.npy, the lengths' hashes);
    ``first_ms``: sample 0 collated; ``k_ms`` / ``k_warm_ms``: random ``k`` (a mixed window merged and one window of
    that dataset's cut read, plus its ``.bin`` pages)."""
    from umlos_cuda.batching.plans.windows import CutDefinition, SequenceMixture, load_mixed_sequences
    from umlos_cuda.batching.plans.windows import save_mixed_sequences
    from umlos_cuda.batching.tokens.mapped import MappedMegatron

    cache = spec["cache"]
    before = _rss_mb()
    start = time.perf_counter()
    sources = [MappedMegatron(p) for p in spec["prefixes"]]
    if os.path.exists(os.path.join(cache, "meta.json")):
        mixture = load_mixed_sequences(cache, tokens=sources)
    else:
        parts = [(CutDefinition(source.count, spec["sequence_length"], window=spec["window"], seed=1235 + i),
                  source, weight, None, f"d{i}") for i, (source, weight) in enumerate(zip(sources, spec["weights"]))]
        mixture = SequenceMixture.build(parts, spec["window"], spec["samples"], 1234)
        save_mixed_sequences(mixture, cache, tokens_paths=spec["prefixes"])
    result = {"build_s": time.perf_counter() - start, "samples": mixture.total, "rss_before_mb": before,
              "epochs": [c.sequences.num_epochs for c in mixture.components]}
    start = time.perf_counter()
    first = mixture.sample(0)
    result["first_ms"] = (time.perf_counter() - start) * 1e3
    assert first["input_ids"].shape[0] == spec["sequence_length"]
    # k_warm: the same k again (its .bin pages resident)
    result.update(_time_draws(lambda k: mixture.sample(k), mixture.total, spec["draws"]))
    result["peak_mb"] = _peak_mb()
    result["cache_bytes"] = _folder_bytes(cache)
    return result


def _time_draws(read, total: int, draws: int) -> dict:
    """``k_ms``: the median time of ``read(k)`` over ``draws`` random ``k`` below ``total`` (seed 7, the same ``k``
    for every engine); ``k_warm_ms``: the same ``k`` again. Nothing when ``draws`` is 0."""
    if not draws:
        return {}
    ks = np.random.default_rng(7).integers(0, total, draws).tolist()
    result = {}
    for key in ("k_ms", "k_warm_ms"):
        times = []
        for k in ks:
            start = time.perf_counter()
            read(k)
            times.append(time.perf_counter() - start)
        result[key] = statistics.median(times) * 1e3
    return result


ENGINES = {"megatron": megatron_build, "windowed": windowed_plan,
           "plan_cut": lambda spec: windowed_plan(spec | {"cli": True}), "mixed": mixed_plan,
           "mixed_sequences": mixed_sequences}


def child(spec: dict) -> dict | None:
    """Run one measurement in a fresh interpreter; its last stdout line is the result as JSON."""
    python = spec.get("python") or sys.executable
    done = subprocess.run([python, os.path.abspath(__file__), "--child", json.dumps(spec)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"child {spec['engine']} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(engine: str, prefixes: list[str], weights, samples, args, cache: str) -> dict | None:
    spec = {"engine": engine, "prefixes": prefixes, "weights": weights, "samples": samples,
            "sequence_length": args.sequence_length, "cache": cache, "draws": 0, "window": args.window,
            "python": args.project_python if engine in ("windowed", "plan_cut", "mixed", "mixed_sequences") else None}
    shutil.rmtree(cache, ignore_errors=True)
    built = child(spec)
    if built is None:
        return None
    reopened = child(spec | {"draws": args.k_samples})  # the cache is there now: a restarted job
    return built | {"reopen_s": reopened["build_s"], "k_ms": reopened["k_ms"], "k_warm_ms": reopened["k_warm_ms"],
                    "reopen_first_ms": reopened["first_ms"]}


def row(name: str, documents: int, result: dict | None) -> str:
    if result is None:
        return f"| {name} | {documents:,} | not built yet (issue 25) | | | | | | | | |"
    rise = result["peak_mb"] - result["rss_before_mb"]
    cold = result.get("cold_first_s")
    to_first = result["build_s"] + result["first_ms"] / 1e3 if cold is None else cold
    return (f"| {name} | {documents:,} | {result['samples']:,} | {result['build_s']:.2f} | {to_first:.3f} | "
            f"{result['peak_mb']:.0f} (+{rise:.0f}) | {result['cache_bytes'] / 1e6:.1f} | {result['first_ms']:.1f} | "
            f"{result['reopen_s']:.2f} | {result['k_ms']:.2f} | {result['k_warm_ms'] * 1e3:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", default="1000000,10000000", help="comma-separated document counts")
    parser.add_argument("--sequence-length", type=int, default=2048)
    parser.add_argument("--samples", type=int, default=None, help="GPTDataset samples asked for (default one epoch)")
    parser.add_argument("--k-samples", type=int, default=100, help="random k drawn after reopening")
    parser.add_argument("--no-blend", action="store_true", help="skip the three-dataset BlendedDataset row")
    parser.add_argument("--folder", default=None)
    parser.add_argument("--window", type=int, default=1 << 12, help="documents per window of the windowed row")
    parser.add_argument("--project-python", default=None,
                        help="the interpreter of the windowed row (default this one; it must import umlos_cuda)")
    parser.add_argument("--no-megatron", action="store_true", help="skip the Megatron rows")
    parser.add_argument("--no-windowed", action="store_true", help="skip the one-dataset windowed plan row")
    parser.add_argument("--no-mixed-plan", action="store_true",
                        help="skip the mixed plan row (whole-document microbatches)")
    parser.add_argument("--cli", action="store_true",
                        help="also the windowed row through the command line (umlos-cuda plan cut, its build "
                        "timed from the command's start to its folder written, then reopened as the windowed row)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        spec = json.loads(args.child)
        print(json.dumps(ENGINES[spec["engine"]](spec)))
        return
    from importlib.metadata import version

    print(f"megatron-core {version('megatron-core')}, numpy {np.__version__}, Python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs; sequence length {args.sequence_length}")
    print("| engine | documents | samples | build s | to first sample s | peak RSS MB (+rise) | cache MB | first ms "
          "| reopen s | k ms | k again µs |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as temporary:
        folder = args.folder or temporary
        for documents in (int(n) for n in args.documents.split(",")):
            names = ["a", "b", "c"] if not args.no_blend else ["a"]
            prefixes = [os.path.join(folder, f"docs{documents}-{name}") for name in names]
            for seed, prefix in enumerate(prefixes):
                write_dataset(prefix, documents, seed)
            cache = os.path.join(folder, "cache")
            if not args.no_megatron:
                print(row("GPTDataset", documents,
                          measure("megatron", prefixes[:1], None, args.samples, args, cache)), flush=True)
            if not args.no_windowed:
                print(row("windowed plan", documents,
                          measure("windowed", prefixes[:1], None, args.samples, args, cache)), flush=True)
            if args.cli:
                print(row("plan cut (command line)", documents,
                          measure("plan_cut", prefixes[:1], None, args.samples, args, cache)), flush=True)
            if not args.no_blend and not args.no_megatron:
                print(row(f"BlendedDataset x3, {documents:,} samples", documents,
                          measure("megatron", prefixes, list(WEIGHTS), documents, args, cache)), flush=True)
            if not args.no_blend:
                print(row(f"mixed sequences x3, {documents:,} samples", documents,
                          measure("mixed_sequences", prefixes, list(WEIGHTS), documents, args, cache)), flush=True)
            if not args.no_blend and not args.no_mixed_plan:
                print(row(f"mixed plan x3, {documents:,} samples", documents,
                          measure("mixed", prefixes, list(WEIGHTS), documents, args, cache)), flush=True)
            for prefix in prefixes:
                os.unlink(prefix + ".idx")
                os.unlink(prefix + ".bin")
            shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
