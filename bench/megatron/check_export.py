"""A token store exported with ``umlos-cuda data megatron-export`` reads back identically in megatron-core.

Run under the bench venv (bench/megatron/setup.sh; megatron-core is never a
project dependency, so this is not part of ``make test`` and tests/ never
imports it):

    bench/.venv-megatron/bin/python bench/megatron/check_export.py [--records 20000] [--folder DIR]

For two stores written by the real commands, ``umlos-cuda data tokenize``
then ``umlos-cuda data megatron-export`` (subprocesses of this venv's
``umlos-cuda``), megatron-core's own ``IndexedDataset``
(``megatron.core.datasets.indexed_dataset``) opens the pair and must give:
the store's sample count as its sequence count, the store's lengths as
``sequence_lengths``, one document per sample (``document_indices`` 0..N),
the export's dtype (uint16 for a store of at most 65,536 ids; int32 for a
uint32 store, Megatron having no uint32 code), and every sequence's tokens
equal to the store's, read one by one (``dataset[i]``), through
``get(i, offset, length)`` and as one contiguous slice; then megatron-core's
training dataset, ``GPTDataset`` (sequence length 2048, one epoch), is built
over the export and each of its samples must be the store's tokens, rebuilt
independently from Megatron's document and sample indices. Cases:

* ``text, uint16``: a word-level tokenizer of 32,000 ids, text records;
* ``prompt/response, uint32``: 70,000 ids (the store is uint32, the export
  int32), prompt/response records whose prompts the store masks (Megatron
  has no loss mask: every token is trained on, the command says how many).

The tokenizers are built here from word lists (``tokenizers`` WordLevel),
the records from a seeded generator: nothing is downloaded. Prints one line
per case and fails with an AssertionError naming the first difference.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np


def megatron_indexed_dataset():
    logging.disable(logging.WARNING)  # torch's "No CUDA runtime is found" on a CPU machine
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed"
        from megatron.core.datasets.indexed_dataset import DType, IndexedDataset
    logging.disable(logging.NOTSET)
    warnings.filterwarnings("ignore", message="Could not determine rank", category=UserWarning)
    return DType, IndexedDataset


def write_tokenizer(folder: str, vocab_size: int) -> str:
    """A whitespace word-level tokenizer of ``vocab_size`` ids (``w0`` ... and ``<unk>``, ``</s>``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "</s>": 1} | {f"w{i}": i + 2 for i in range(vocab_size - 2)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    os.makedirs(folder, exist_ok=True)
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    return folder


def write_records(path: str, records: int, vocab_size: int, prompt_response: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(4.0, 0.9, records).astype(np.int64), 1, 1500)
    words = rng.integers(2, vocab_size, int(lengths.sum()))  # every id of the vocabulary is in reach
    with open(path, "w", encoding="utf-8") as handle:
        at = 0
        for length in lengths.tolist():
            text = " ".join(f"w{i - 2}" for i in words[at:at + length].tolist())
            at += length
            if prompt_response:
                cut = max(1, length // 3)
                parts = text.split(" ")
                record = {"prompt": " ".join(parts[:cut]), "response": " ".join(parts[cut:]) or "w0"}
            else:
                record = {"text": text}
            handle.write(json.dumps(record) + "\n")


def command(*arguments: str) -> str:
    cli = os.path.join(os.path.dirname(sys.executable), "umlos-cuda")
    done = subprocess.run([cli, *arguments], capture_output=True, text=True)
    assert done.returncode == 0, f"umlos-cuda {' '.join(arguments)}: {done.stderr.strip()}"
    return done.stdout.strip()


def check(name: str, folder: str, records: int, vocab_size: int, prompt_response: bool, expected_dtype) -> dict:
    from umlos_cuda.batching.tokens.store import TokenStore

    DType, IndexedDataset = megatron_indexed_dataset()
    model = write_tokenizer(os.path.join(folder, "model"), vocab_size)
    data = os.path.join(folder, "train.jsonl")
    write_records(data, records, vocab_size, prompt_response, seed=vocab_size)
    fields = ["--prompt-field", "prompt", "--response-field", "response", "--eos-token", "</s>"] \
        if prompt_response else ["--text-field", "text"]
    command("data", "tokenize", "--dataset", data, "--tokenizer", model, "--output", os.path.join(folder, "store"),
            *fields, "--quiet")
    said = command("data", "megatron-export", os.path.join(folder, "store"), "--output", os.path.join(folder, "mega"))
    store = TokenStore.open(os.path.join(folder, "store"))
    store.verify()
    prefix = os.path.join(folder, "mega")
    start = time.perf_counter()
    assert IndexedDataset.exists(prefix)
    core = IndexedDataset(prefix)
    count = len(store)
    assert len(core) == count and core.index.sequence_count == count, (len(core), count)
    assert core.index.dtype is expected_dtype, (core.index.dtype, expected_dtype)
    if expected_dtype is np.int32:  # ids past uint16's range really go through the int32 .bin
        assert int(np.asarray(store.tokens).max()) > np.iinfo(np.uint16).max
    assert DType.code_from_dtype(core.index.dtype) == {np.uint16: 8, np.int32: 4}[expected_dtype]
    assert np.array_equal(core.sequence_lengths, store.lengths), "sequence lengths differ"
    assert np.array_equal(core.document_indices, np.arange(count + 1)), "document indices are not one per sample"
    for row in range(count):
        theirs, ours = core[row], store.input_ids(row)
        assert theirs.dtype == expected_dtype and np.array_equal(theirs, ours), f"sequence {row} differs"
        if ours.shape[0] > 2:  # a part of the sequence, as GPTDataset reads one
            assert np.array_equal(core.get(row, offset=1, length=ours.shape[0] - 2), ours[1:-1]), f"get {row}"
    whole = core[0:count]
    assert len(whole) == count and all(np.array_equal(a, store.input_ids(i)) for i, a in enumerate(whole))
    if prompt_response:  # the store masks the prompts; the export trains on them (no loss mask in Megatron)
        assert int(store.loss_mask_array.sum(dtype="u8")) < store.num_tokens
    samples = gpt_samples_match(prefix, store, os.path.join(folder, "gpt-cache"), vocab_size)
    return {"gpt samples": samples, "case": name, "samples": count, "tokens": store.num_tokens,
            "store dtype": store.meta["token_dtype"],
            "megatron dtype": np.dtype(core.index.dtype).name,
            "max id": int(np.asarray(store.tokens).max()), "seconds": time.perf_counter() - start, "said": said}


def gpt_samples_match(prefix: str, store, cache: str, vocab_size: int, sequence_length: int = 2048) -> int:
    """megatron-core's training dataset over the export: every sample of one epoch is the store's tokens.

    ``GPTDataset`` (built as a training run builds it, tokenizer-free: bench/bench_megatron.py) joins
    the documents of its shuffled document index and cuts ``sequence_length + 1`` tokens a sample;
    here each sample's ``tokens`` and ``labels`` are rebuilt from the store's own sequences, placed
    in the order of Megatron's document index at the start its sample index gives, and compared."""
    import logging
    import warnings

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from bench_megatron import LengthsOnlyTokenizer

    logging.disable(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

        config = GPTDatasetConfig(random_seed=1234, sequence_length=sequence_length, blend=([prefix], None),
                                  split="1,0,0", path_to_cache=cache, tokenizer=LengthsOnlyTokenizer(vocab_size),
                                  reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False)
        dataset = BlendedMegatronDatasetBuilder(GPTDataset, [None, None, None], lambda: True, config).build()[0]
    logging.disable(logging.NOTSET)
    order = np.asarray(dataset.document_index)
    flat = np.concatenate([store.input_ids(int(d)) for d in order]).astype(np.int64)
    starts = np.concatenate(([0], np.cumsum(np.asarray(store.lengths, dtype=np.int64)[order])))
    for i in range(len(dataset)):
        row = int(dataset.shuffle_index[i])
        document, offset = (int(v) for v in dataset.sample_index[row])
        at = int(starts[document]) + offset
        text = flat[at:at + sequence_length + 1]
        sample = dataset[i]
        assert np.array_equal(sample["tokens"].numpy(), text[:-1]), f"GPTDataset sample {i}"
        assert np.array_equal(sample["labels"].numpy(), text[1:]), f"GPTDataset sample {i} labels"
    assert len(dataset) == (int(store.num_tokens) - 1) // sequence_length  # every whole sample of the epoch
    return len(dataset)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--folder", default=None)
    args = parser.parse_args()
    from importlib.metadata import version

    print(f"megatron-core {version('megatron-core')}, umlos-cuda {version('umlos-cuda')}, Python "
          f"{sys.version.split()[0]}, {args.records} records a case")
    with tempfile.TemporaryDirectory() as temporary:
        root = args.folder or temporary
        for name, vocab, prompt_response, dtype in (("text, uint16", 32_000, False, np.uint16),
                                                   ("prompt/response, uint32", 70_000, True, np.int32)):
            result = check(name, os.path.join(root, name.split(",")[0].replace("/", "-")), args.records, vocab,
                           prompt_response, dtype)
            r = result
            print(f"{r['case']}: {r['samples']} sequences, {r['tokens']} tokens, store {r['store dtype']} (ids up to "
                  f"{r['max id']}) -> megatron-core {r['megatron dtype']}: every sequence equal (dataset[i], "
                  f"get(i, 1, n - 2), one slice), lengths equal, document indices 0..{r['samples']}; GPTDataset "
                  f"(sequence length 2048): all {r['gpt samples']} samples of an epoch are the store's tokens "
                  f"({r['seconds']:.1f} s)")
            print(f"  megatron-export said: {result['said']}")
    print("OK: megatron-core's IndexedDataset and GPTDataset read every exported store back identically")


if __name__ == "__main__":
    main()
