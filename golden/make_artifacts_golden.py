"""Generate golden/artifacts_308cbf1/: every folder kind as release 308cbf1 wrote it, byte for byte.

Run from the repository root::

    python golden/make_artifacts_golden.py                  # writes golden/artifacts_308cbf1/artifacts.json
    python golden/make_artifacts_golden.py --keep DIR       # ... and keeps the artifacts in DIR to look at
    python golden/make_artifacts_golden.py --new-inputs DIR # a fresh pair of inputs (once, by hand)

``artifacts.json`` lists the SHA-256 of every file the commands below write
from the checked-in inputs (``golden/artifacts_308cbf1/inputs/``). It was
written by this script run with the code of release 308cbf1 first on the path::

    git worktree add /tmp/release 308cbf1
    PYTHONPATH=/tmp/release python golden/make_artifacts_golden.py

so that a restructuring is compared with what users' folders hold, not with
the tree being changed. ``tests/test_artifacts_golden.py`` runs the same
commands with today's code on the same inputs and compares every file.
Regenerate only for a deliberate format change, and say so in the commit.

What it holds, each written by the command line from the two inputs (a small
BPE tokenizer and 300 JSONL records) in one folder, every path relative:

* a length cache (JSONL and its ``.u32`` sidecar);
* two token stores, a sharded token store of three shards, a Megatron pair;
* a whole plan, a packed plan, its shard set, a windowed plan, a windowed
  packed plan, a mixed plan, pretraining sequences and a mixture of them;
* compact and npz batch folders of the whole plan.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import random
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "artifacts_308cbf1")
INPUTS = os.path.join(GOLDEN, "inputs")
#: The release whose code wrote the checked-in artifacts.
RELEASE = "308cbf1"
#: The file of every artifact's SHA-256 (a listing: path -> digest).
LISTING = "artifacts.json"

#: The commands, in order, each ``umlos-cuda`` argv run in the output folder.
COMMANDS = [
    ["data", "lengths", "build", "--dataset", "train.jsonl", "--tokenizer", "tokenizer.json",
     "--output", "lengths.jsonl", "--quiet"],
    ["data", "tokenize", "--dataset", "train.jsonl", "--tokenizer", "tokenizer.json", "--output", "store", "--quiet"],
    ["data", "tokenize", "--dataset", "half-a.jsonl", "--tokenizer", "tokenizer.json", "--output", "store-a",
     "--quiet"],
    ["data", "tokenize", "--dataset", "part-0.jsonl", "part-1.jsonl", "part-2.jsonl", "--tokenizer",
     "tokenizer.json", "--output", "sharded", "--sharded", "--quiet"],
    ["data", "megatron-export", "store", "--output", "corpus"],
    ["plan", "build", "--lengths", "lengths.jsonl", "--bucket-edges", "32,64,128", "--overflow-max", "256",
     "--token-budget", "512", "--epochs", "2", "--seed", "7", "--output", "plan", "--quiet"],
    ["plan", "build", "--lengths", "lengths.jsonl", "--pack", "--pack-mode", "best_fit", "--pack-max-len", "256",
     "--token-budget", "1024", "--output", "packed-plan", "--quiet"],
    ["plan", "shard", "plan", "--world-size", "3", "--output", "plan-shards"],
    ["plan", "build", "--window", "64", "--lengths", "lengths.jsonl", "--bucket-edges", "32,64,128",
     "--overflow-max", "256", "--token-budget", "512", "--epochs", "2", "--output", "windowed", "--quiet"],
    ["plan", "build", "--window", "64", "--lengths", "lengths.jsonl", "--pack", "--pack-max-len", "256",
     "--token-budget", "1024", "--output", "windowed-packed", "--quiet"],
    ["plan", "build", "--window", "64", "--mix", "lengths.jsonl:0.7", "lengths.jsonl:0.3:100:3",
     "--bucket-edges", "32,64,128", "--overflow-max", "256", "--token-budget", "512", "--num-samples", "400",
     "--output", "mixed", "--quiet"],
    ["plan", "cut", "--tokens", "store", "--sequence-length", "64", "--window", "32", "--eos", "2", "--epochs", "2",
     "--output", "sequences"],
    ["plan", "cut", "--mix", "store:0.7", "store-a:0.3:2", "--num-samples", "200", "--sequence-length", "64",
     "--window", "32", "--eos", "2", "--output", "mixed-sequences"],
    ["batch", "generate", "--plan", "plan", "--store", "store", "--output", "batches-compact", "--layout", "compact",
     "--workers", "1", "--quiet"],
    ["batch", "generate", "--plan", "plan", "--store", "store", "--output", "batches-npz", "--layout", "npz",
     "--workers", "1", "--quiet"],
]
#: The input files, copied into the output folder before the commands run.
INPUT_FILES = ["tokenizer.json", "train.jsonl"]
#: Files cut from train.jsonl's lines before the commands run: name -> (first line, end line).
DERIVED_FILES = {"half-a.jsonl": (0, 150), "part-0.jsonl": (0, 100), "part-1.jsonl": (100, 200),
                 "part-2.jsonl": (200, 300)}
#: What an absolute path of the output folder reads as in the listing (windowed kinds record their sources).
ROOT_PLACEHOLDER = b"$ROOT"
#: meta.json keys written since the release, each appended last (so the file without it is the release's bytes):
#: file -> keys. Issue 33: pretraining sequences record their token source's hashes, to refuse a store
#: re-tokenized in place with equal lengths.
#: Issue 34: token stores (a sharded store's shards and index too) record their tokenizer's parts, so that a
#: tokenizer mismatch names the parts that differ.
ADDED_SINCE_RELEASE = {"sequences/meta.json": ("tokens_identity",),
                       "mixed-sequences/meta.json": ("tokens_identities",),
                       "store/meta.json": ("tokenizer_parts",), "store-a/meta.json": ("tokenizer_parts",),
                       **{f"sharded/shards/{shard:05d}/meta.json": ("tokenizer_parts",) for shard in range(3)},
                       "sharded/meta.json": ("tokenizer_parts",)}
#: Indexes that bind each shard's meta.json by its SHA-256 (``meta_sha256``): index -> its shards' folder. The
#: release's index bound the release's bytes of each shard's meta.json, which are today's without the keys above.
SHARD_INDEXES = {"sharded/meta.json": "sharded/shards"}


def write_inputs(folder: str) -> None:
    """A byte-level BPE tokenizer of 300 tokens and 300 records of 3 to 120 words."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    os.makedirs(folder, exist_ok=True)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "gravity", "explains",
             "why", "python", "is", "what", "it", "is"]
    rng = random.Random(20261206)
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 120))) for _ in range(300)]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "train.jsonl"), "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps({"id": f"doc-{i:03d}", "text": text}) + "\n" for i, text in enumerate(texts))


def build(out: str, inputs: str = INPUTS) -> dict[str, str]:
    """Run every command in ``out`` (created, empty) on copies of ``inputs``; the listing of what they wrote."""
    from umlos_cuda.cli import main

    os.makedirs(out)
    for name in INPUT_FILES:
        with open(os.path.join(inputs, name), "rb") as source, open(os.path.join(out, name), "wb") as target:
            target.write(source.read())
    with open(os.path.join(out, "train.jsonl"), "rb") as handle:
        lines = handle.readlines()
    for name, (start, end) in DERIVED_FILES.items():
        with open(os.path.join(out, name), "wb") as handle:
            handle.writelines(lines[start:end])
    here = os.getcwd()
    os.chdir(out)
    try:
        for argv in COMMANDS:
            with contextlib.redirect_stdout(io.StringIO()):
                code = main(argv)
            if code != 0:
                raise SystemExit(f"umlos-cuda {' '.join(argv)} exited {code}")
    finally:
        os.chdir(here)
    return listing(out)


def without_added_keys(data: bytes, keys: tuple[str, ...]) -> bytes:
    """A meta.json (indented ASCII JSON, as every folder writes it: its indent read from its second line) without
    ``keys``, which must be its last ones: the bytes the release wrote when today's code adds nothing else."""
    meta = json.loads(data)
    names = list(meta)
    if names[len(names) - len(keys):] != list(keys):
        raise SystemExit(f"the keys added since the release, {list(keys)}, are not the last of {names}")
    return release_json({name: meta[name] for name in names[:len(names) - len(keys)]}, data)


def release_json(meta: dict, data: bytes) -> bytes:
    """``meta`` written as ``data`` is (ASCII JSON indented as its second line is)."""
    second = data.split(b"\n", 2)[1]
    return (json.dumps(meta, indent=len(second) - len(second.lstrip(b" "))) + "\n").encode("ascii")


def with_release_shard_digests(data: bytes, folder: str, shards: str) -> bytes:
    """A sharded store's index whose entries' ``meta_sha256`` are those of the release's bytes of each shard's
    meta.json (its bytes without :data:`ADDED_SINCE_RELEASE`'s keys)."""
    index = json.loads(data)
    for entry in index["shards"]:
        relative = f"{shards}/{entry['name']}/meta.json"
        with open(os.path.join(folder, relative), "rb") as handle:
            shard = handle.read()
        if relative in ADDED_SINCE_RELEASE:
            shard = without_added_keys(shard, ADDED_SINCE_RELEASE[relative])
        entry["meta_sha256"] = hashlib.sha256(shard).hexdigest()
    return release_json(index, data)


def listing(folder: str) -> dict[str, str]:
    """Every file below ``folder`` but the inputs: relative path -> SHA-256 of its bytes, with
    ``folder``'s absolute path read as :data:`ROOT_PLACEHOLDER`, the keys of :data:`ADDED_SINCE_RELEASE` left
    out and the shard digests of :data:`SHARD_INDEXES` those of the shards without them."""
    roots = sorted({os.path.abspath(folder).encode(), os.path.realpath(folder).encode()}, key=len, reverse=True)
    found = {}
    for directory, subdirs, names in os.walk(folder):
        subdirs.sort()
        for name in sorted(names):
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, folder).replace(os.sep, "/")
            if relative in INPUT_FILES or relative in DERIVED_FILES or relative == LISTING:
                continue
            with open(path, "rb") as handle:
                data = handle.read()
            if relative in ADDED_SINCE_RELEASE:
                data = without_added_keys(data, ADDED_SINCE_RELEASE[relative])
            if relative in SHARD_INDEXES:
                data = with_release_shard_digests(data, folder, SHARD_INDEXES[relative])
            for root in roots:
                data = data.replace(root, ROOT_PLACEHOLDER)
            found[relative] = hashlib.sha256(data).hexdigest()
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", metavar="DIR", help="build in DIR (must not exist) and keep the artifacts there")
    parser.add_argument("--new-inputs", metavar="DIR", help="only write a fresh pair of inputs into DIR")
    args = parser.parse_args(argv)
    if args.new_inputs:
        write_inputs(args.new_inputs)
        return 0
    import umlos_cuda

    with tempfile.TemporaryDirectory() as scratch:
        found = build(args.keep or os.path.join(scratch, "artifacts"))
    with open(os.path.join(GOLDEN, LISTING), "w", encoding="utf-8") as handle:
        json.dump({"release": RELEASE, "commands": COMMANDS, "files": found}, handle, indent=1, sort_keys=True)
        handle.write("\n")
    print(f"{len(found)} files listed in {os.path.join(GOLDEN, LISTING)}, written by {umlos_cuda.__file__}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
