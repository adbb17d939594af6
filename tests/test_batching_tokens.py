"""Token stores and Megatron-LM indexed datasets (docs/batching.md, "Token store").

* tokenize: every sample's tokens are the tokenizer's (or ``sft_sample``'s,
  loss mask included), the length cache is byte for byte ``data lengths
  build``'s, files do not depend on the chunk size, the folder appears whole
  or not at all, and every malformed store file is refused with its code.
* Megatron: a dataset written by tests/token_cases.py in Megatron-LM's
  layout reads back exactly (dtypes, documents, modes), every malformed
  index is refused with MEGATRON_INDEX_INVALID, and ``data megatron`` plus
  ``batch generate --store PREFIX`` collate its sequences without re-tokenizing.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from batching_cases import expect, train_tokenizer, write_model_dir
from token_cases import make_store, random_sequences, write_dataset, write_megatron
from umlos_cuda import errors
from umlos_cuda.batching import BatchingConfig, BatchPlanBuilder, LengthCache, SampleMeta, build_lengths, sft_sample
from umlos_cuda.batching.batches.reader import BatchReader
from umlos_cuda.batching.tokens.megatron import MegatronDataset
from umlos_cuda.batching.tokens.sources import open_token_source
from umlos_cuda.batching.tokens.writer import NPY_HEADER_BYTES, tokenize_dataset
from umlos_cuda.batching.tokens.store import TokenStore
from umlos_cuda.cli import main


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer()


@pytest.fixture(scope="module")
def workspace(tokenizer, tmp_path_factory):
    root = tmp_path_factory.mktemp("tokens")
    write_model_dir(root / "model", tokenizer, {"eos_token": "</s>"})
    rows = write_dataset(root / "train.jsonl", 300)
    write_dataset(root / "noid.jsonl", 40, seed=3, ids=False)
    return root, rows


@pytest.fixture(scope="module")
def store(workspace):
    root, _ = workspace
    return tokenize_dataset(root / "train.jsonl", root / "model", root / "store", chunk_size=37)


def listing(folder) -> list[str]:
    return sorted(os.listdir(folder))


# ====================================================================== tokenize
def test_text_records_are_the_tokenizers_ids(workspace, store, tokenizer):
    root, rows = workspace
    assert len(store) == 300 and store.meta["token_dtype"] == "<u2" and store.meta["loss_mask"] == "all"
    for i, row in enumerate(rows):
        assert store.input_ids(i).tolist() == tokenizer.encode(row["text"]).ids
        assert store.loss_mask(i).dtype == np.uint8 and store.loss_mask(i).all()
    assert store.num_tokens == int(store.lengths.sum()) == store.tokens.shape[0]
    assert isinstance(store.tokens, np.memmap) and not store.tokens.flags.writeable
    assert store.sample_ids == [row["id"] for row in rows] and store.sample_id(5) == "rec_0005"
    direct = np.load(root / "store" / "tokens.npy", mmap_mode="r")  # a plain .npy for any reader
    assert np.array_equal(direct, store.tokens) and direct.offset == NPY_HEADER_BYTES
    assert store.verify() == {"samples": 300, "tokens": store.num_tokens, "tokenizer_hash": store.tokenizer_hash}
    sample = store.sample(3, "train")
    assert sample.meta.sample_id == "rec_0003" and list(sample.input_ids) == store.input_ids(3).tolist()
    assert listing(root / "store") == ["lengths.jsonl", "lengths.jsonl.u32", "loss_mask.npy", "meta.json",
                                       "offsets.npy", "tokens.npy", "umlos-artifact.json"]


def test_the_length_cache_is_data_lengths_builds(workspace, store, tmp_path):
    root, _ = workspace
    cache = build_lengths(root / "train.jsonl", root / "model", tmp_path / "lengths.jsonl")
    assert (root / "store" / "lengths.jsonl").read_bytes() == (tmp_path / "lengths.jsonl").read_bytes()
    assert (root / "store" / "lengths.jsonl.u32").read_bytes() == (tmp_path / "lengths.jsonl.u32").read_bytes()
    assert store.dataset_hash == cache.dataset_hash and store.tokenizer_hash == cache.tokenizer_hash
    assert np.array_equal(store.length_cache().lengths, store.lengths)


def test_prompt_response_records_follow_sft_sample(workspace, tmp_path):
    root, rows = workspace
    sft = tokenize_dataset(root / "train.jsonl", root / "model", tmp_path / "sft", prompt_field="prompt",
                           response_field="response", chunk_size=64)
    assert sft.meta["loss_mask"] == "template"
    for i, row in enumerate(rows):
        sample = sft_sample(root / "model", row["prompt"], row["response"], SampleMeta(row["id"], "t"))
        assert tuple(sft.input_ids(i).tolist()) == sample.input_ids
        assert tuple(sft.loss_mask(i).tolist()) == sample.loss_mask
    lengths = build_lengths(root / "train.jsonl", root / "model", tmp_path / "l.jsonl", prompt_field="prompt",
                            response_field="response")
    assert np.array_equal(lengths.lengths, sft.lengths)


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_files_do_not_depend_on_the_chunk_size(workspace, store, tmp_path, chunk):
    root, _ = workspace
    tokenize_dataset(root / "train.jsonl", root / "model", tmp_path / "s", chunk_size=chunk)
    for name in listing(root / "store"):
        assert (tmp_path / "s" / name).read_bytes() == (root / "store" / name).read_bytes(), name


def test_records_without_ids_are_numbered(workspace, tmp_path):
    root, _ = workspace
    store = tokenize_dataset(root / "noid.jsonl", root / "model", tmp_path / "s")
    assert store.meta["sample_ids"] == "line_numbers" and store.ids_are_line_numbers
    assert store.sample_id(7) == "7" and store.sample_ids[:2] == ["0", "1"]


def test_a_store_pickles_as_its_path(store):
    data = pickle.dumps(store)
    assert len(data) < 1000  # the arrays are reopened, not copied
    again = pickle.loads(data)
    assert np.array_equal(again.tokens, store.tokens) and isinstance(again.tokens, np.memmap)


def test_a_failed_tokenize_leaves_nothing(workspace, tmp_path):
    root, _ = workspace
    lines = (root / "train.jsonl").read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines[:200] + ['{"id": "x", "text": 5}'] + lines[200:]) + "\n")
    expect(errors.DATASET_RECORD_INVALID, tokenize_dataset, bad, root / "model", tmp_path / "out", chunk_size=16,
           mention="line 201")
    assert listing(tmp_path) == ["bad.jsonl"]  # no store, no temp folder


def test_output_rules(workspace, store, tmp_path):
    root, _ = workspace
    out = tmp_path / "out"
    tokenize_dataset(root / "noid.jsonl", root / "model", out)
    expect(errors.OUTPUT_EXISTS, tokenize_dataset, root / "noid.jsonl", root / "model", out)
    replaced = tokenize_dataset(root / "train.jsonl", root / "model", out, force=True)
    assert len(replaced) == 300 and listing(tmp_path) == ["out"]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("mine")
    expect(errors.OUTPUT_PATH_INVALID, tokenize_dataset, root / "noid.jsonl", root / "model", tmp_path / "other",
           force=True, mention="replaces only a token store")
    assert (tmp_path / "other" / "keep.txt").read_text() == "mine"
    expect(errors.OUTPUT_PATH_INVALID, tokenize_dataset, root / "noid.jsonl", root / "model", tmp_path / "no" / "s")
    (tmp_path / "file").write_text("x")
    expect(errors.OUTPUT_PATH_INVALID, tokenize_dataset, root / "noid.jsonl", root / "model", tmp_path / "file")
    expect(errors.TOKENIZER_INVALID, tokenize_dataset, root / "noid.jsonl", tmp_path / "none", tmp_path / "t")
    expect(errors.DATASET_UNREADABLE, tokenize_dataset, tmp_path / "none.jsonl", root / "model", tmp_path / "t")


# ====================================================================== store files
def broken_copy(store, tmp_path, edit) -> str:
    target = tmp_path / "copy"
    shutil.copytree(store.root, target)
    edit(target)
    return str(target)


def edit_meta(**changes):
    def edit(folder):
        meta = json.loads((folder / "meta.json").read_text())
        for key, value in changes.items():
            if value is KeyError:
                del meta[key]
            else:
                meta[key] = value
        (folder / "meta.json").write_text(json.dumps(meta))
    return edit


def rewrite_npy(name, array):
    def edit(folder):
        os.unlink(folder / f"{name}.npy")
        np.save(folder / f"{name}.npy", array)
    return edit


@pytest.mark.parametrize("edit, mention", [
    (lambda f: (f / "meta.json").write_text("{"), "not valid JSON"),
    (edit_meta(format="other/1"), "format"),
    (edit_meta(extra=1), "unknown ['extra']"),
    (edit_meta(num_tokens=KeyError), "missing ['num_tokens']"),
    (edit_meta(num_samples=0), "num_samples"),
    (edit_meta(token_dtype="<i8"), "token_dtype"),
    (edit_meta(loss_mask="some"), "loss_mask"),
    (edit_meta(sample_ids="rows"), "sample_ids"),
    (edit_meta(tokenizer_hash=""), "tokenizer_hash"),
    (lambda f: os.unlink(f / "tokens.npy"), "tokens.npy is missing"),
    (lambda f: (f / "loss_mask.npy").write_bytes(b"not npy"), "not a readable .npy"),
    (rewrite_npy("offsets", np.arange(301, dtype=np.int32)), "offsets.npy holds <i4"),
    (edit_meta(num_tokens=5), "tokens.npy holds"),
])
def test_malformed_store_files_are_refused(store, tmp_path, edit, mention):
    expect(errors.TOKEN_STORE_INVALID, TokenStore.open, broken_copy(store, tmp_path, edit), mention=mention)


def test_offsets_that_do_not_cut_the_tokens_are_refused(store, tmp_path):
    offsets = np.asarray(store.offsets).copy()
    offsets[[10, 11]] = offsets[[11, 10]]  # one step down
    path = broken_copy(store, tmp_path, rewrite_npy("offsets", offsets))
    expect(errors.TOKEN_STORE_INVALID, TokenStore.open, path, mention="rise from 0")


def test_verify_finds_changed_bytes_and_a_stale_length_cache(store, tmp_path):
    def flip(folder):
        data = bytearray((folder / "tokens.npy").read_bytes())
        data[NPY_HEADER_BYTES + 10] ^= 1
        (folder / "tokens.npy").write_bytes(bytes(data))
    changed = TokenStore.open(broken_copy(store, tmp_path, flip))  # opening does not hash
    expect(errors.TOKEN_STORE_INVALID, changed.verify, mention="tokens.npy does not hash")
    shutil.rmtree(tmp_path / "copy")

    def other_cache(folder):
        LengthCache.from_arrays(store.sample_ids, np.asarray(store.lengths) + 1, store.tokenizer_hash).write(
            folder / "lengths.jsonl", force=True)
    stale = TokenStore.open(broken_copy(store, tmp_path, other_cache))
    expect(errors.TOKEN_STORE_INVALID, stale.verify, mention="disagrees")


def test_missing_store_and_rows(store, tmp_path):
    expect(errors.TOKEN_STORE_NOT_FOUND, TokenStore.open, tmp_path / "none", mention="data tokenize")
    expect(errors.TOKEN_STORE_NOT_FOUND, open_token_source, tmp_path / "none", mention="neither")
    for row in (-1, 300, 2.0, True):
        expect(errors.TOKEN_STORE_INVALID, store.arrays, row, mention="not in the store")


def test_data_tokenize_command(workspace, tmp_path, capsys):
    root, _ = workspace
    argv = ["data", "tokenize", "--dataset", str(root / "train.jsonl"), "--tokenizer", str(root / "model"),
            "--output", str(tmp_path / "s"), "--prompt-field", "prompt", "--response-field", "response"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    store = TokenStore.open(tmp_path / "s")
    assert f"{len(store)} samples, {store.num_tokens} tokens" in out and "tokens/s" in out and "100%" in err
    assert main(argv) == 2 and "error OUTPUT_EXISTS" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(argv[:-2] + ["--force", "--quiet"])
    assert info.value.code == 2 and "go together" in capsys.readouterr().err


# ====================================================================== Megatron
@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.uint8, np.int64])
def test_megatron_dataset_reads_back(tmp_path, dtype):
    sequences = random_sequences(50, seed=1, vocab=250)
    prefix = write_megatron(tmp_path / "corpus_text_document", sequences, dtype, document_ends=[10, 30, 50])
    dataset = MegatronDataset.open(prefix)
    assert len(dataset) == 50 and dataset.dtype == np.dtype(dtype)
    assert dataset.lengths.tolist() == [len(s) for s in sequences] and dataset.lengths.dtype == np.uint32
    assert dataset.document_indices.tolist() == [0, 10, 30, 50] and dataset.modes is None
    for row, sequence in enumerate(sequences):
        ids, mask = dataset.arrays(row)
        assert ids.tolist() == sequence and mask.tolist() == [1] * len(sequence)
        # the hot path hands out plain read-only views, never np.memmap objects
        assert type(ids) is np.ndarray and not ids.flags.writeable
    assert dataset.input_ids(np.int64(3)).tolist() == sequences[3]
    assert dataset.num_tokens == sum(map(len, sequences))
    cache = dataset.length_cache()
    assert cache.ids_are_line_numbers and np.array_equal(cache.lengths, dataset.lengths)
    assert cache.tokenizer_hash == "unknown"
    again = pickle.loads(pickle.dumps(dataset))
    assert again.input_ids(7).tolist() == sequences[7]
    assert MegatronDataset.open(prefix + ".idx").prefix == prefix
    assert isinstance(open_token_source(prefix + ".bin"), MegatronDataset)


def test_megatron_sequences_out_of_order_and_with_gaps_read_back(tmp_path):
    """Pointers need not be back to back (the reader then keeps starts and ends apart)."""
    sequences = [[1, 2, 3], [40, 50], [7], [9, 9, 9, 9]]
    order = [2, 0, 3, 1]  # where each sequence lies in the .bin, with a 2-token gap before each
    data, pointers = [], [0] * len(sequences)
    for k in order:
        data += [65535, 65535]
        pointers[k] = 2 * len(data)
        data += sequences[k]
    prefix = str(tmp_path / "gaps")
    np.array(data, dtype="<u2").tofile(prefix + ".bin")
    count = len(sequences)
    with open(prefix + ".idx", "wb") as handle:
        handle.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, count, count + 1))
        handle.write(np.array([len(x) for x in sequences], "<i4").tobytes() + np.array(pointers, "<i8").tobytes())
        handle.write(np.arange(count + 1, dtype="<i8").tobytes())
    dataset = MegatronDataset.open(prefix)
    assert [dataset.input_ids(row).tolist() for row in range(count)] == sequences
    packed = MegatronDataset.open(write_megatron(tmp_path / "packed", sequences))
    assert [packed.input_ids(row).tolist() for row in range(count)] == sequences
    assert np.shares_memory(packed._starts, packed._ends)  # back to back: one bounds array, 8 bytes a sequence


def test_megatron_multimodal_modes(tmp_path):
    sequences = random_sequences(6, seed=2)
    prefix = write_megatron(tmp_path / "mm", sequences, np.int32, modes=[0, 1, 0, 1, 1, 0])
    dataset = MegatronDataset.open(prefix, tokenizer_hash="t" * 64)
    assert dataset.modes.tolist() == [0, 1, 0, 1, 1, 0] and dataset.tokenizer_hash == "t" * 64
    assert dataset.input_ids(5).tolist() == sequences[5]


@pytest.mark.parametrize("store_dtype, megatron_dtype, code", [("<u2", np.uint16, 8), ("<u4", np.int32, 4)])
def test_a_token_store_exports_as_megatron_and_reads_back(tmp_path, monkeypatch, store_dtype, megatron_dtype, code):
    from umlos_cuda.batching.tokens import writer
    from umlos_cuda.batching.tokens.export import export_megatron

    if store_dtype == "<u4":
        monkeypatch.setattr(writer, "UINT16_VOCAB", 1)  # the small test vocabulary, stored as uint32
    store = make_store(tmp_path, 60, seed=3)
    assert store.meta["token_dtype"] == store_dtype
    dataset = export_megatron(store, tmp_path / "mega")
    again = MegatronDataset.open(tmp_path / "mega", tokenizer_hash=store.tokenizer_hash)
    assert dataset.prefix == again.prefix and again.dtype == np.dtype(megatron_dtype) and len(again) == len(store)
    assert np.array_equal(again.lengths, store.lengths) and again.num_tokens == store.num_tokens
    for row in range(len(store)):
        assert np.array_equal(again.input_ids(row), store.input_ids(row))
    assert again.document_indices.tolist() == list(range(len(store) + 1))
    # the .idx byte for byte, built by hand from the layout (megatron-core's _IndexWriter)
    sizes = [int(n) for n in store.lengths]
    pointers, at = [], 0
    for size in sizes:
        pointers.append(at)
        at += size * np.dtype(megatron_dtype).itemsize
    expected = (b"MMIDIDX\x00\x00" + (1).to_bytes(8, "little") + bytes([code]) + len(sizes).to_bytes(8, "little")
                + (len(sizes) + 1).to_bytes(8, "little") + b"".join(n.to_bytes(4, "little") for n in sizes)
                + b"".join(p.to_bytes(8, "little") for p in pointers)
                + b"".join(d.to_bytes(8, "little") for d in range(len(sizes) + 1)))
    assert Path(tmp_path / "mega.idx").read_bytes() == expected
    assert Path(tmp_path / "mega.bin").read_bytes() == np.asarray(store.tokens).astype(megatron_dtype).tobytes()
    # a plan over the export is the plan over the store (same lengths, same tokenizer)
    assert np.array_equal(again.length_cache().lengths, store.length_cache().lengths)


def test_export_widens_ids_past_int32_and_the_cli_writes_the_pair(tmp_path, capsys):
    from types import SimpleNamespace

    from umlos_cuda.batching.tokens.export import export_dtype, index_bytes

    assert export_dtype(SimpleNamespace(tokens=np.array([1, 2 ** 31], dtype="<u4"))) == np.dtype("<i8")
    assert export_dtype(SimpleNamespace(tokens=np.array([1, 2 ** 31 - 1], dtype="<u4"))) == np.dtype("<i4")
    raw = index_bytes(np.array([3, 2], dtype=np.int64), np.dtype("<i8"))
    assert raw[17] == 5 and struct.unpack("<qq", raw[34 + 8:34 + 24]) == (0, 24)
    store = make_store(tmp_path, 20, seed=5)
    assert main(["data", "megatron-export", str(tmp_path / "store"), "--output", str(tmp_path / "m.idx")]) == 0
    out = capsys.readouterr().out
    assert f"{len(store)} sequences (one document each), {store.num_tokens} tokens (uint16)" in out
    assert "trained on by Megatron" in out  # prompt/response records: the store masks the prompts
    assert np.array_equal(MegatronDataset.open(tmp_path / "m").lengths, store.lengths)


def patch_idx(offset: int, data: bytes):
    def edit(prefix):
        raw = bytearray(Path(prefix + ".idx").read_bytes())
        raw[offset:offset + len(data)] = data
        Path(prefix + ".idx").write_bytes(bytes(raw))
    return edit


def append_idx(data: bytes):
    def edit(prefix):
        with open(prefix + ".idx", "ab") as handle:
            handle.write(data)
    return edit


@pytest.mark.parametrize("edit, mention", [
    (patch_idx(0, b"NOTMEGA\x00\x00"), "does not start with"),
    (patch_idx(9, struct.pack("<Q", 2)), "version 2"),
    (patch_idx(17, bytes([6])), "dtype code 6 (float64)"),
    (patch_idx(17, bytes([9])), "dtype code 9"),
    (patch_idx(18, struct.pack("<Q", 11)), "11 sequences"),
    (append_idx(b"\0" * 3), "bytes;"),
    (lambda p: Path(p + ".idx").write_bytes(b"MMIDIDX"), "the header alone"),
    (patch_idx(34, struct.pack("<i", -1)), "negative length"),
    (patch_idx(34 + 40 + 8, struct.pack("<q", 10 ** 9)), "outside"),
    (patch_idx(34 + 40 + 8, struct.pack("<q", 1)), "aligned"),
    (patch_idx(34 + 120 + 16, struct.pack("<q", 9)), "ascend from 0"),
    (patch_idx(34 + 120 + 8, struct.pack("<q", 11)), "ascend from 0"),
    (lambda p: os.truncate(p + ".bin", 10), "outside"),
    (lambda p: os.unlink(p + ".bin"), ".bin does not exist"),
    (lambda p: os.unlink(p + ".idx"), ".idx does not exist"),
])
def test_malformed_megatron_indexes_are_refused(tmp_path, edit, mention):
    prefix = write_megatron(tmp_path / "d", random_sequences(10, seed=4, low=3, high=20), np.int32,
                            document_ends=[4, 10])
    edit(prefix)
    expect(errors.MEGATRON_INDEX_INVALID, MegatronDataset.open, prefix, mention=mention)


def test_megatron_empty_and_row_checks(tmp_path):
    empty = write_megatron(tmp_path / "e", [], np.int32, document_ends=[])
    expect(errors.MEGATRON_INDEX_INVALID, MegatronDataset.open, empty, mention="no sequence")
    dataset = MegatronDataset.open(write_megatron(tmp_path / "d", [[1, 2]], np.int32))
    expect(errors.MEGATRON_INDEX_INVALID, dataset.arrays, 1, mention="rows are 0 to 0")
    expect(errors.MEGATRON_INDEX_INVALID, dataset.arrays, -1, mention="rows are 0 to 0")
    expect(errors.MEGATRON_INDEX_INVALID, dataset.arrays, True)
    expect(errors.MEGATRON_INDEX_INVALID, dataset.arrays, np.int64(1), mention="rows are 0 to 0")
    expect(errors.MEGATRON_INDEX_INVALID, MegatronDataset.open, tmp_path / "d", tokenizer_hash="")


def test_a_plan_and_batch_files_over_a_megatron_dataset(tmp_path, capsys):
    sequences = random_sequences(400, seed=5, vocab=30000, high=200)
    prefix = write_megatron(tmp_path / "corpus", sequences, np.uint16)
    lengths = tmp_path / "lengths.jsonl"
    assert main(["data", "megatron", prefix, "--output", str(lengths)]) == 0
    assert "400 sequences (400 documents)" in capsys.readouterr().out
    assert main(["plan", "build", "--lengths", str(lengths), "--bucket-edges", "64,128", "--overflow-max", "256",
                 "--token-budget", "1024", "--output", str(tmp_path / "plan"), "--quiet"]) == 0
    assert main(["batch", "generate", "--plan", str(tmp_path / "plan"), "--store", prefix,
                 "--output", str(tmp_path / "out"), "--quiet"]) == 0
    capsys.readouterr()
    reader = BatchReader(tmp_path / "out")
    seen = 0
    for batch in reader.iter_epoch(0):
        for b, row in enumerate(batch["rows"].tolist()):
            n = len(sequences[row])
            assert batch["input_ids"][b, :n].tolist() == sequences[row]
            assert batch["attention_mask"][b].sum() == n and batch["loss_mask"][b, :n].all()
            seen += 1
    assert seen == 400
    assert reader.verify(prefix)["files"] == len(reader)
    assert main(["data", "megatron", str(tmp_path / "none"), "--output", str(tmp_path / "x.jsonl")]) == 2
    assert "error MEGATRON_INDEX_INVALID" in capsys.readouterr().err


def test_a_megatron_plan_config(tmp_path):
    """BatchPlanBuilder takes the dataset's length cache directly."""
    sequences = random_sequences(100, seed=6, high=100)
    dataset = MegatronDataset.open(write_megatron(tmp_path / "c", sequences, np.int32))
    plan = BatchPlanBuilder(dataset.length_cache(), BatchingConfig.throughput(512, (32, 64), 128)).build(1)
    rows = np.sort(np.concatenate([mb.rows for mb in plan.iter_epoch(0)]))
    assert rows.tolist() == list(range(100))
