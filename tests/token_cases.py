"""Helpers of the token store, collation and batch file tests.

``write_dataset`` writes a JSONL dataset of deterministic records with a
text field and a prompt/response pair, ``make_store`` its token store, ``swapped_vocabulary`` a tokenizer that
gives it the same lengths and other ids (to tokenize a store again in place); ``write_megatron`` writes a
Megatron-LM indexed dataset exactly as Megatron-LM's ``_IndexWriter`` and
``IndexedDatasetBuilder`` lay it out (megatron/core/datasets/indexed_dataset.py:
``MMIDIDX\\x00\\x00``, version 1, the dtype code, the sequence and document
counts, int32 sizes, int64 byte pointers, int64 document indices, and int8
modes for a multimodal dataset), written here from that description so the
reader is checked against the format rather than against itself.
"""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path

import numpy as np

from batching_cases import WORDS, train_tokenizer, write_model_dir

#: Megatron-LM's DType codes.
MEGATRON_CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5, np.float64: 6, np.float32: 7,
                  np.uint16: 8}


def records(count: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 60)))
        words = text.split()
        cut = max(1, len(words) // 3)
        out.append({"id": f"rec_{i:04d}", "text": text, "prompt": " ".join(words[:cut]),
                    "response": " ".join(words[cut:]) or "ok"})
    return out


def write_dataset(path, count: int = 300, seed: int = 0, *, ids: bool = True) -> list[dict]:
    rows = records(count, seed)
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row if ids else {k: v for k, v in row.items() if k != "id"}) + "\n")
    return rows


def make_store(root, count: int, seed: int):
    """A model directory, a dataset of ``count`` records and its token store
    (prompt/response records: loss masks with zeros), all under ``root``."""
    from umlos_cuda.batching.tokens.writer import tokenize_dataset

    write_model_dir(root / "model", train_tokenizer(), {"eos_token": "</s>"})
    write_dataset(root / "train.jsonl", count, seed=seed)
    return tokenize_dataset(root / "train.jsonl", root / "model", root / "store", prompt_field="prompt",
                            response_field="response")


def swapped_vocabulary(model: Path, out: Path) -> Path:
    """Another tokenizer that gives every text the same number of tokens: ``model``'s, with the ids of two
    frequent byte-level tokens swapped (so the store's lengths stay, its token ids do not)."""
    data = json.loads((model / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    a, b = "e", "t"
    vocab[a], vocab[b] = vocab[b], vocab[a]
    out.mkdir()
    (out / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    for name in ("tokenizer_config.json",):
        if (model / name).exists():
            (out / name).write_bytes((model / name).read_bytes())
    return out


def write_megatron(prefix, sequences, dtype=np.uint16, document_ends=None, modes=None) -> str:
    """Write ``prefix.bin`` and ``prefix.idx``; ``document_ends`` are the
    sequence indices ending each document (default: one document per sequence)."""
    prefix = str(prefix)
    arrays = [np.asarray(s, dtype=dtype) for s in sequences]
    with open(prefix + ".bin", "wb") as handle:
        for array in arrays:
            handle.write(array.tobytes(order="C"))
    sizes = [a.size for a in arrays]
    itemsize = np.dtype(dtype).itemsize
    pointers, current = [], 0
    for size in sizes:
        pointers.append(current)
        current += size * itemsize
    documents = [0] + (list(range(1, len(arrays) + 1)) if document_ends is None else list(document_ends))
    with open(prefix + ".idx", "wb") as handle:
        handle.write(b"MMIDIDX\x00\x00")
        handle.write(struct.pack("<Q", 1))
        handle.write(struct.pack("<B", MEGATRON_CODES[dtype]))
        handle.write(struct.pack("<Q", len(sizes)))
        handle.write(struct.pack("<Q", len(documents)))
        handle.write(np.array(sizes, dtype=np.int32).tobytes(order="C"))
        handle.write(np.array(pointers, dtype=np.int64).tobytes(order="C"))
        handle.write(np.array(documents, dtype=np.int64).tobytes(order="C"))
        if modes is not None:
            handle.write(np.array(modes, dtype=np.int8).tobytes(order="C"))
    return prefix


def random_sequences(count: int, seed: int = 0, vocab: int = 500, low: int = 1, high: int = 300) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(low, high))] for _ in range(count)]


def copy_shard_rehashed(root, source: int, target: int) -> None:
    """Replace shard ``target`` of the sharded store at ``root`` by a copy of shard ``source`` and rewrite its
    index to agree (the shard's entry, the counts, the dataset hash over the row digests): the store's own
    hashes all check, and only the repeated sample ids tell that one shard is there twice."""
    import shutil

    from umlos_cuda.batching.tokens.rows import logical_hash

    with open(f"{root}/meta.json", encoding="utf-8") as handle:
        meta = json.load(handle)
    names = [entry["name"] for entry in meta["shards"]]
    shutil.rmtree(f"{root}/shards/{names[target]}")
    shutil.copytree(f"{root}/shards/{names[source]}", f"{root}/shards/{names[target]}")
    for suffix in (".npy", ".ids.npy"):
        shutil.copyfile(f"{root}/digests/{names[source]}{suffix}", f"{root}/digests/{names[target]}{suffix}")
    meta["shards"][target] = {**meta["shards"][source], "name": names[target]}
    meta["num_samples"] = sum(entry["num_samples"] for entry in meta["shards"])
    meta["num_tokens"] = sum(entry["num_tokens"] for entry in meta["shards"])
    digests = [np.load(f"{root}/digests/{name}.npy") for name in names]
    meta["dataset_hash"] = logical_hash(digests, meta["num_samples"], meta["tokenizer_hash"], meta["loss_mask"],
                                        meta["sample_ids"])
    with open(f"{root}/meta.json", "w", encoding="utf-8") as handle:
        handle.write(json.dumps(meta, indent=2) + "\n")


def write_two_shards(root, first: int, count: int):
    """Under ``root``: a tokenizer folder (``model``) and a sharded store (``sharded``) of ``count`` prompt/response
    records, rows ``0 .. first - 1`` in one shard and the rest in another (one input file each)."""
    from umlos_cuda.batching.tokens.sharded import tokenize_sharded

    write_model_dir(root / "model", train_tokenizer(), {"eos_token": "</s>"})
    files = []
    for i, (a, b) in enumerate(((0, first), (first, count))):
        files.append(str(root / f"part-{i}.jsonl"))
        with open(files[-1], "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps({"prompt": r["prompt"], "response": r["response"]}) + "\n"
                              for r in records(count, seed=2)[a:b])
    return tokenize_sharded(files, root / "model", root / "sharded", prompt_field="prompt", response_field="response")


def write_token_sources(root) -> dict[str, str]:
    """Under ``root``: a Megatron prefix (two documents), a token store and a sharded store of two shards, each a
    token source of its own rows; their paths by kind (``megatron``, ``store``, ``sharded``)."""
    store = make_store(root / "s", 90, seed=1)
    sharded = write_two_shards(root, 25, 60)
    prefix = write_megatron(root / "meg", random_sequences(130, seed=3, high=200), np.int32, document_ends=[60, 130])
    return {"megatron": prefix, "store": str(store.root), "sharded": str(sharded.root)}
