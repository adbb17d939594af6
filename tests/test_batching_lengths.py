"""Length caches (docs/batching.md, "Lengths"): the files, the builder, the
statistics, and every failure code of the batching block of errors.py.

* LengthCache: JSONL rows (docs/batching.md) plus a uint32 sidecar bound to
  the JSONL; load uses the sidecar only when it matches; writes are atomic.
* build_lengths: lengths equal the tokenizer's counts (or the instruction
  template's), byte-identical files whatever the chunk size, every bad record
  refused with its line, nothing left behind on failure.
* optimal bucket edges equal brute force on small histograms.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from batching_cases import corpus, expect, train_tokenizer, write_model_dir
from umlos_cuda import errors
from umlos_cuda.batching import LengthCache, SampleMeta, build_lengths, dataset_fingerprint, sft_sample
from umlos_cuda.batching.lengths import stats as length_stats, cache as lengths_module
from umlos_cuda.batching.lengths.cache import LengthCacheWriter, read_sidecar_header, sidecar_path
from umlos_cuda.batching.records import SkippedLines
from umlos_cuda.batching.templates import sft_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HASH = "ab" * 32


def listing(folder) -> list[str]:
    return sorted(os.listdir(folder))


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer()


@pytest.fixture(scope="module")
def model_dir(tokenizer, tmp_path_factory):
    return write_model_dir(tmp_path_factory.mktemp("model"), tokenizer, {"eos_token": "</s>"})


def write_jsonl(path, records) -> str:
    with open(path, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
    return str(path)


# ====================================================================== LengthCache files
def test_rows_are_the_seeds_layout(tmp_path):
    LengthCache.from_arrays(["train_00001", "train_00002"], [247, 512], "abc123").write(tmp_path / "l.jsonl")
    assert (tmp_path / "l.jsonl").read_text() == (
        '{"sample_id": "train_00001", "tokenizer_hash": "abc123", "length": 247}\n'
        '{"sample_id": "train_00002", "tokenizer_hash": "abc123", "length": 512}\n')


def test_sidecar_layout(tmp_path):
    path = tmp_path / "l.jsonl"
    LengthCache.from_arrays(["a", "b", "c"], [3, 0, 2**32 - 1], HASH).write(path)
    raw = (tmp_path / "l.jsonl.u32").read_bytes()
    assert raw[:8] == b"UMLOSLEN"
    (size,) = struct.unpack("<I", raw[8:12])
    header = json.loads(raw[12:12 + size])
    offset = 12 + size + (-(12 + size) % 16)
    assert set(raw[12 + size:offset]) <= {0}
    assert np.frombuffer(raw[offset:], dtype="<u4").tolist() == [3, 0, 2**32 - 1]
    jsonl = path.read_bytes()
    import hashlib
    assert header == {"format_version": 1, "count": 3, "tokenizer_hash": HASH, "dataset_hash": None,
                      "jsonl_size": len(jsonl), "jsonl_sha256": hashlib.sha256(jsonl).hexdigest(),
                      "lengths_sha256": hashlib.sha256(raw[offset:]).hexdigest(), "sample_ids": "jsonl"}
    assert read_sidecar_header(str(tmp_path / "l.jsonl.u32")) == (header, offset)


@pytest.mark.parametrize("ids", [["x", "y", "z", "w"], None, ["0", "1", "2", "3"]])
@pytest.mark.parametrize("mode", ["auto", "require", "ignore"])
def test_round_trip(tmp_path, ids, mode):
    path = tmp_path / "l.jsonl"
    LengthCache.from_arrays(ids, np.array([5, 1, 9, 4], dtype=np.int64), HASH, dataset_hash="cd" * 32).write(path)
    cache = LengthCache.load(path, sidecar=mode)
    assert cache.lengths.dtype == np.uint32 and cache.lengths.tolist() == [5, 1, 9, 4]
    assert not cache.lengths.flags.writeable
    assert cache.sample_ids == (ids or ["0", "1", "2", "3"]) and len(cache) == 4
    assert cache.tokenizer_hash == HASH
    assert cache.ids_are_line_numbers == (ids != ["x", "y", "z", "w"])
    assert cache.dataset_hash == (None if mode == "ignore" else "cd" * 32)  # the JSONL rows do not carry it


def test_sidecar_load_reads_no_ids_until_asked(tmp_path, monkeypatch):
    path = tmp_path / "l.jsonl"
    LengthCache.from_arrays(["x", "y"], [5, 1], HASH).write(path)
    parsed = []
    original = lengths_module._parse_jsonl
    monkeypatch.setattr(lengths_module, "_parse_jsonl", lambda p: parsed.append(p) or original(p))
    cache = LengthCache.load(path)
    assert cache.lengths.tolist() == [5, 1] and parsed == []
    assert cache.sample_ids == ["x", "y"] and len(parsed) == 1
    assert LengthCache.load(path, sidecar="ignore").sample_ids == ["x", "y"] and len(parsed) == 2
    line_numbers = tmp_path / "n.jsonl"
    LengthCache.from_arrays(None, [5, 1], HASH).write(line_numbers)
    assert LengthCache.load(line_numbers).sample_ids == ["0", "1"] and len(parsed) == 2


def test_ids_read_later_must_still_match(tmp_path):
    path = tmp_path / "l.jsonl"
    LengthCache.from_arrays(["x", "y"], [5, 1], HASH).write(path)
    cache = LengthCache.load(path)
    LengthCache.from_arrays(["x", "y"], [5, 2], HASH).write(path, force=True)
    expect(errors.LENGTHS_SIDECAR_MISMATCH, lambda: cache.sample_ids, mention="changed after")


def test_write_is_refused_over_existing_files_and_force_replaces(tmp_path):
    path = tmp_path / "l.jsonl"
    LengthCache.from_arrays(["x"], [5], HASH).write(path)
    expect(errors.OUTPUT_EXISTS, LengthCache.from_arrays(["y"], [6], HASH).write, path)
    assert LengthCache.load(path).sample_ids == ["x"]
    LengthCache.from_arrays(["y"], [6], HASH).write(path, force=True)
    assert LengthCache.load(path, sidecar="require").sample_ids == ["y"]
    assert listing(tmp_path) == ["l.jsonl", "l.jsonl.u32"]


def test_a_stray_sidecar_is_refused_before_anything_is_written(tmp_path):
    (tmp_path / "l.jsonl.u32").write_bytes(b"old")
    expect(errors.OUTPUT_EXISTS, LengthCache.from_arrays(["x"], [5], HASH).write, tmp_path / "l.jsonl",
           mention="l.jsonl.u32")
    assert listing(tmp_path) == ["l.jsonl.u32"]


def test_a_failed_write_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError), LengthCacheWriter(tmp_path / "l.jsonl", HASH) as writer:
        writer.add(["a"], [1])
        raise RuntimeError("interrupted")
    expect(errors.LENGTHS_INVALID, LengthCacheWriter(tmp_path / "l.jsonl", HASH).__enter__().__exit__, None, None, None,
           mention="no rows")
    assert listing(tmp_path) == []


def test_a_failed_replacement_keeps_the_old_pair(tmp_path, monkeypatch):
    """Both files are written before either is published: a failure while
    making the sidecar leaves the old JSONL and its own sidecar as they were."""
    path = tmp_path / "l.jsonl"
    LengthCache.from_arrays(["x"], [5], HASH).write(path)
    monkeypatch.setattr(lengths_module, "_sidecar_bytes", lambda *a, **k: (_ for _ in ()).throw(OSError("disk")))
    with pytest.raises(OSError):
        LengthCache.from_arrays(["y"], [6], HASH).write(path, force=True)
    assert listing(tmp_path) == ["l.jsonl", "l.jsonl.u32"]
    assert LengthCache.load(path, sidecar="require").sample_ids == ["x"]


def test_a_sidecar_that_cannot_be_published_takes_its_jsonl_with_it(tmp_path, monkeypatch):
    """A failure between publishing the JSONL and the sidecar leaves neither
    the new JSONL (a failed command leaves nothing new) nor the stale sidecar."""
    from umlos_cuda.files import atomic

    path = tmp_path / "l.jsonl"
    LengthCache.from_arrays(["x"], [5], HASH).write(path)
    publish, calls = atomic.PendingFile.publish, []

    def second_fails(self):
        calls.append(self.path)
        if len(calls) == 2:
            raise OSError(5, "Input/output error")
        publish(self)

    monkeypatch.setattr(atomic.PendingFile, "publish", second_fails)
    with pytest.raises(OSError):
        LengthCache.from_arrays(["y"], [6], HASH).write(path, force=True)
    assert calls == [str(path), str(path) + ".u32"] and listing(tmp_path) == []


@pytest.mark.parametrize("args,mention", [
    ((["a", "b"], [1], HASH), "2 sample ids but 1 lengths"),
    ((["a", 2], [1, 2], HASH), "strings"),
    ((["a", "a"], [1, 2], HASH), "'a' appears at #0 and #1"),
    ((["a"], [-1], HASH), "[0, 2^32 - 1]"),
    ((["a"], [2**32], HASH), "[0, 2^32 - 1]"),
    ((["a"], [1.5], HASH), "integers"),
    ((["a"], np.array([True]), HASH), "integers"),
    ((["a"], [[1]], HASH), "one-dimensional"),
    (([], [], HASH), "at least one sample"),
    ((["a"], [1], ""), "tokenizer_hash"),
    ((["a"], [1], None), "tokenizer_hash"),
])
def test_from_arrays_invalid(args, mention):
    expect(errors.LENGTHS_INVALID, LengthCache.from_arrays, *args, mention=mention)


GOOD_ROW = {"sample_id": "a", "tokenizer_hash": HASH, "length": 3}


@pytest.mark.parametrize("content,mention", [
    (b"", "no rows"),
    (b'{"sample_id": "a", ', "line 1 is not JSON"),
    (b"[1, 2]\n", "JSON objects"),
    (b"\n", "line 1 is empty"),
    (b'{"sample_id": "\xff", "tokenizer_hash": "h", "length": 1}\n', "not UTF-8"),
    (json.dumps({**GOOD_ROW, "sample_id": 7}).encode(), "sample_id must be a string"),
    (json.dumps({k: v for k, v in GOOD_ROW.items() if k != "tokenizer_hash"}).encode(), "tokenizer_hash"),
    (json.dumps({**GOOD_ROW, "length": -1}).encode(), "length must be"),
    (json.dumps({**GOOD_ROW, "length": 2**32}).encode(), "length must be"),
    (json.dumps({**GOOD_ROW, "length": True}).encode(), "length must be"),
    (json.dumps({**GOOD_ROW, "length": 3.0}).encode(), "length must be"),
    ((json.dumps(GOOD_ROW) + "\n" + json.dumps({**GOOD_ROW, "sample_id": "b", "tokenizer_hash": "cd"})).encode(),
     "line 2 has tokenizer_hash"),
    ((json.dumps(GOOD_ROW) + "\n" + json.dumps(GOOD_ROW)).encode(), "'a' appears at #0 and #1"),
])
def test_load_refuses_bad_jsonl(tmp_path, content, mention):
    path = tmp_path / "l.jsonl"
    path.write_bytes(content)
    expect(errors.LENGTHS_INVALID, LengthCache.load, path, mention=mention)


def test_load_errors(tmp_path):
    expect(errors.LENGTHS_INVALID, LengthCache.load, tmp_path / "none.jsonl", mention="does not exist")
    expect(errors.LENGTHS_INVALID, LengthCache.load, tmp_path, mention="not a regular file")
    LengthCache.from_arrays(["a"], [1], HASH).write(tmp_path / "l.jsonl")
    expect(errors.LENGTHS_INVALID, LengthCache.load, tmp_path / "l.jsonl", sidecar="always", mention="auto")


def _corrupt_sidecar(path, how):
    side = sidecar_path(path)
    raw = bytearray(Path(side).read_bytes())
    if how == "magic":
        raw[0:8] = b"NOTMAGIC"
    elif how == "truncated":
        raw = raw[:-2]
    elif how == "length byte":
        raw[-1] ^= 1
    elif how == "header":
        raw[12:20] = b"xxxxxxxx"
    elif how == "version":
        raw = bytearray(bytes(raw).replace(b'"format_version":1', b'"format_version":9'))
    elif how == "count":
        raw = bytearray(bytes(raw).replace(b'"count":3', b'"count":2'))
    elif how == "short file":
        raw = raw[:10]
    Path(side).write_bytes(bytes(raw))


def _edit_jsonl(path, how):
    text = Path(path).read_text()
    if how == "jsonl edited":  # same size, other content
        text = text.replace('"length": 7', '"length": 8')
    elif how == "jsonl grown":
        text += json.dumps({"sample_id": "d", "tokenizer_hash": HASH, "length": 1}) + "\n"
    Path(path).write_text(text)


@pytest.mark.parametrize("how", ["magic", "truncated", "length byte", "header", "version", "count", "short file",
                                 "jsonl edited", "jsonl grown"])
def test_a_mismatched_sidecar(tmp_path, how):
    """require: LENGTHS_SIDECAR_MISMATCH; auto: a warning and the JSONL's lengths."""
    path = str(tmp_path / "l.jsonl")
    LengthCache.from_arrays(["a", "b", "c"], [7, 5, 3], HASH).write(path)
    if how.startswith("jsonl"):
        _edit_jsonl(path, how)
    else:
        _corrupt_sidecar(path, how)
    expect(errors.LENGTHS_SIDECAR_MISMATCH, LengthCache.load, path, sidecar="require")
    with pytest.warns(UserWarning, match="reading the lengths from"):
        cache = LengthCache.load(path)
    expected = {"jsonl edited": [8, 5, 3], "jsonl grown": [7, 5, 3, 1]}.get(how, [7, 5, 3])
    assert cache.lengths.tolist() == expected


def test_a_missing_sidecar(tmp_path, recwarn):
    path = tmp_path / "l.jsonl"
    LengthCache.from_arrays(["a"], [7], HASH).write(path)
    os.unlink(sidecar_path(path))
    expect(errors.LENGTHS_SIDECAR_MISMATCH, LengthCache.load, path, sidecar="require", mention="does not exist")
    assert LengthCache.load(path).lengths.tolist() == [7] and not recwarn.list  # absent is not stale


def _forge(path, lengths=None, **fields):
    """Rewrite the sidecar of ``path`` with other lengths or header fields and a recomputed header (a forgery)."""
    import hashlib

    side = sidecar_path(path)
    header, offset = read_sidecar_header(side)
    data = np.fromfile(side, dtype="<u4", offset=offset) if lengths is None else np.asarray(lengths, dtype="<u4")
    header.update(fields, lengths_sha256=hashlib.sha256(data.tobytes()).hexdigest())
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("ascii")
    prefix = lengths_module.SIDECAR_MAGIC + struct.pack("<I", len(text)) + text
    Path(side).write_bytes(prefix + b"\0" * (-len(prefix) % lengths_module.SIDECAR_ALIGN) + data.tobytes())


ODD_IDS = ['a"b', "back\\slash", "naïve ☃", "", "x, \"tokenizer_hash\": \"h\", \"length\": 9", "0", "007", "\n"]


@pytest.mark.parametrize("block", [7, 64, 1 << 20])
@pytest.mark.parametrize("ids", [None, ODD_IDS])
def test_the_sidecar_is_checked_row_by_row_against_its_jsonl(tmp_path, monkeypatch, block, ids):
    """A forged sidecar (its header recomputed) is refused at the first row that disagrees, whatever
    the ids hold and wherever the rows cross a read block."""
    from umlos_cuda.batching.lengths import rows as rows_module

    monkeypatch.setattr(rows_module, "_BLOCK", block)
    lengths = [0, 1, 10, 4294967295, 99, 5, 1000000, 7][:len(ids) if ids else 8]
    path = str(tmp_path / "l.jsonl")
    LengthCache.from_arrays(ids, lengths, HASH).write(path)
    assert LengthCache.load(path, sidecar="require").lengths.tolist() == lengths
    for row in (0, 3, len(lengths) - 1):
        forged = list(lengths)
        forged[row] = (forged[row] + 1) % (1 << 32)
        _forge(path, forged)
        expect(errors.LENGTHS_SIDECAR_MISMATCH, LengthCache.load, path, sidecar="require", mention=f"at row {row + 1}")
        with pytest.warns(UserWarning, match="reading the lengths from"):
            assert LengthCache.load(path).lengths.tolist() == lengths  # auto: the JSONL wins
    _forge(path, lengths, tokenizer_hash="f" * 64)
    expect(errors.LENGTHS_SIDECAR_MISMATCH, LengthCache.load, path, sidecar="require", mention="at row 1")
    _forge(path, lengths, tokenizer_hash=HASH, sample_ids="jsonl" if ids is None else "line_numbers")
    if ids is None:  # calling line numbers "jsonl" only costs a parse of the ids: they still read true
        assert LengthCache.load(path, sidecar="require").sample_ids == [str(i) for i in range(8)]
    else:
        expect(errors.LENGTHS_SIDECAR_MISMATCH, LengthCache.load, path, sidecar="require", mention="at row 1")
    _forge(path, lengths + [3], count=len(lengths) + 1, sample_ids="line_numbers" if ids is None else "jsonl")
    expect(errors.LENGTHS_SIDECAR_MISMATCH, LengthCache.load, path, sidecar="require")


def test_a_sidecar_beside_a_jsonl_of_another_shape_is_not_trusted(tmp_path):
    """Rows with other spacing or key order parse to the same lengths but were not written with the
    sidecar: the sidecar is stale (the JSONL is then parsed)."""
    path = str(tmp_path / "l.jsonl")
    LengthCache.from_arrays(None, [3, 4], HASH).write(path)
    text = Path(path).read_text().replace('", "length": ', '","length": ')
    Path(path).write_text(text)
    import hashlib

    _forge(path, jsonl_size=len(text), jsonl_sha256=hashlib.sha256(text.encode()).hexdigest())
    expect(errors.LENGTHS_SIDECAR_MISMATCH, LengthCache.load, path, sidecar="require", mention="at row 1")


# ====================================================================== build_lengths
@pytest.fixture
def texts():
    return corpus(300, seed=3)


def test_build_counts_the_tokenizers_tokens(tmp_path, tokenizer, texts):
    dataset = write_jsonl(tmp_path / "train.jsonl", [{"text": t, "other": 1} for t in texts])
    calls = []
    cache = build_lengths(dataset, tokenizer, tmp_path / "l.jsonl", chunk_size=64,
                          progress=lambda done, total: calls.append((done, total)))
    assert cache.lengths.tolist() == [len(tokenizer.encode(t).ids) for t in texts]
    assert cache.sample_ids == [str(i) for i in range(len(texts))] and cache.ids_are_line_numbers
    assert cache.dataset_hash == dataset_fingerprint(dataset, cache.tokenizer_hash)
    size = os.path.getsize(dataset)
    assert len(calls) == 5 and calls[-1] == (size, size) and [c[0] for c in calls] == sorted(c[0] for c in calls)
    loaded = LengthCache.load(tmp_path / "l.jsonl", sidecar="require")
    assert loaded.lengths.tolist() == cache.lengths.tolist() and loaded.dataset_hash == cache.dataset_hash


def test_build_files_do_not_depend_on_the_chunk_size(tmp_path, tokenizer, texts):
    dataset = write_jsonl(tmp_path / "train.jsonl", [{"id": f"s{i}", "text": t} for i, t in enumerate(texts)])
    outputs = []
    for chunk in (1, 7, 300, 4096):
        out = tmp_path / f"l{chunk}.jsonl"
        build_lengths(dataset, tokenizer, out, chunk_size=chunk)
        outputs.append((out.read_bytes(), (tmp_path / f"l{chunk}.jsonl.u32").read_bytes()))
    assert all(output == outputs[0] for output in outputs)


def test_build_ids(tmp_path, tokenizer):
    dataset = write_jsonl(tmp_path / "train.jsonl", [{"id": "alpha", "text": "the fox"}, {"text": "a dog"},
                                                     {"id": 17, "text": "gravity"}, {"key": "k", "text": "café"}])
    cache = build_lengths(dataset, tokenizer, tmp_path / "l.jsonl")
    assert cache.sample_ids == ["alpha", "1", "17", "3"] and not cache.ids_are_line_numbers
    # a named id field must be in every record: line 1 lacks 'key' (before, rows were numbered without a word)
    expect(errors.DATASET_RECORD_INVALID, build_lengths, dataset, tokenizer, tmp_path / "k.jsonl", id_field="key",
           mention="line 1 lacks the id field 'key'")
    skipped = SkippedLines()
    other = build_lengths(dataset, tokenizer, tmp_path / "k.jsonl", id_field="key", skipped=skipped)
    assert other.sample_ids == ["k"] and skipped.count == 3


def test_build_with_a_text_field_and_a_tokenizer_directory(tmp_path, tokenizer, model_dir):
    dataset = write_jsonl(tmp_path / "train.jsonl", [{"body": "the quick fox"}, {"body": "naïve café"}])
    cache = build_lengths(dataset, model_dir, tmp_path / "l.jsonl", text_field="body")
    assert cache.lengths.tolist() == [len(tokenizer.encode("the quick fox")), len(tokenizer.encode("naïve café"))]


def test_build_prompt_response_matches_the_sft_samples(tmp_path, tokenizer, model_dir, texts):
    records = [{"id": f"s{i}", "instruction": t[:30], "response": t[30:]} for i, t in enumerate(texts[:50])]
    dataset = write_jsonl(tmp_path / "sft.jsonl", records)
    cache = build_lengths(dataset, model_dir, tmp_path / "l.jsonl", prompt_field="instruction",
                          response_field="response")
    for record, length in zip(records, cache.lengths.tolist()):
        sample = sft_sample(model_dir, record["instruction"], record["response"], SampleMeta(record["id"], "sft"))
        assert sample.length == length == len(tokenizer.encode(sft_text(record["instruction"],
                                                                         record["response"]))) + 1
        assert sample.input_ids[-1] == tokenizer.token_to_id("</s>")
        prompt = len(tokenizer.encode(f"### Instruction:\n{record['instruction']}\n\n### Response:\n"))
        assert sample.loss_mask == (0,) * prompt + (1,) * (length - prompt)
    with_override = build_lengths(dataset, tokenizer, tmp_path / "o.jsonl", prompt_field="instruction",
                                  response_field="response", eos_token="</s>")
    assert with_override.lengths.tolist() == cache.lengths.tolist()


def test_build_ignores_the_tokenizers_padding(tmp_path, tokenizer):
    from tokenizers import Tokenizer

    padded = Tokenizer.from_str(tokenizer.to_str())
    padded.enable_padding(pad_id=0, pad_token="<unk>")
    dataset = write_jsonl(tmp_path / "train.jsonl", [{"text": "the"}, {"text": "the quick brown fox jumps"}])
    cache = build_lengths(dataset, padded, tmp_path / "l.jsonl")
    assert cache.lengths.tolist() == [len(tokenizer.encode("the")), len(tokenizer.encode("the quick brown fox jumps"))]
    assert padded.padding is not None  # the caller's tokenizer is left as it was


def test_a_tokenizer_that_fails_to_encode(tmp_path, tokenizer):
    """A tokenizer.json whose truncation stride exceeds its length makes the Rust
    library panic on encoding: TOKENIZER_INVALID naming the lines, no files."""
    data = json.loads(tokenizer.to_str())
    data["truncation"] = {"direction": "Right", "max_length": 2, "strategy": "LongestFirst", "stride": 5}
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    dataset = write_jsonl(tmp_path / "train.jsonl", [{"text": "the quick brown fox"}] * 3)
    expect(errors.TOKENIZER_INVALID, build_lengths, dataset, tmp_path / "tokenizer.json", tmp_path / "l.jsonl",
           chunk_size=2, mention="failed on lines 1-2")
    assert listing(tmp_path) == ["tokenizer.json", "train.jsonl"]


BAD_RECORDS = [
    ([b'{"text": "a"}', b'{"text": "b"'], "line 2 is not JSON"),
    ([b'{"text": "a"}', b'["text"]'], "line 2 holds a JSON list"),
    ([b'{"text": "a"}', b'{"body": "b"}'], "line 2 lacks the field 'text' (its fields: body)"),
    ([b'{"text": 5}'], "line 1 has 'text' of type int"),
    ([b'{"text": "a"}', b'{"text": "\xc3\x28"}'], "line 2 is not UTF-8"),
    ([b'{"text": "a"}', b'', b'{"text": "c"}'], "line 2 is empty"),
    ([b'{"text": "a", "id": ""}'], "an id is a non-empty string"),
    ([b'{"text": "a", "id": 1.5}'], "an id is a non-empty string"),
    ([b'{"text": "a", "id": true}'], "an id is a non-empty string"),
    ([b'{"text": "a", "id": "x"}', b'{"text": "b"}', b'{"text": "c", "id": "x"}'],
     "line 3 repeats the id 'x' of line 1"),
    ([b'{"text": "a"}', b'{"text": "b", "id": "0"}'], "line 2 repeats the id '0' of line 1"),
]


@pytest.mark.parametrize("lines,mention", BAD_RECORDS)
def test_build_refuses_bad_records_and_leaves_nothing(tmp_path, tokenizer, lines, mention):
    dataset = tmp_path / "train.jsonl"
    dataset.write_bytes(b"\n".join(lines) + b"\n")
    expect(errors.DATASET_RECORD_INVALID, build_lengths, dataset, tokenizer, tmp_path / "l.jsonl", chunk_size=1,
           mention=mention)
    assert listing(tmp_path) == ["train.jsonl"]


def test_a_byte_order_mark_and_trailing_blank_lines_are_not_errors(tmp_path, tokenizer):
    dataset = tmp_path / "train.jsonl"
    dataset.write_bytes(b'\xef\xbb\xbf{"text": "a b"}\n{"text": "c", "id": "x"}\n\n  \n')
    cache = build_lengths(dataset, tokenizer, tmp_path / "l.jsonl")
    assert list(cache.sample_ids) == ["0", "x"]
    assert cache.dataset_hash == dataset_fingerprint(dataset, cache.tokenizer_hash)  # every byte, BOM included


def test_bad_lines_are_skipped_and_counted_when_asked(tmp_path, tokenizer):
    from umlos_cuda.batching.records.chunk import SkippedLines

    dataset = tmp_path / "train.jsonl"
    dataset.write_bytes(b'{"text": "a"}\n\n{"text": 5}\nnot json\n{"text": "b c", "id": "y"}\n{"body": "d"}\n')
    error = expect(errors.DATASET_RECORD_INVALID, build_lengths, dataset, tokenizer, tmp_path / "l.jsonl",
                   mention="line 2 is empty")
    assert "--skip-bad-lines" in error.message
    skipped = SkippedLines()
    cache = build_lengths(dataset, tokenizer, tmp_path / "l.jsonl", skipped=skipped)
    assert skipped.count == 4 and list(cache.sample_ids) == ["0", "y"]  # ids stay the records' own
    assert [m.split(" line ")[1][:1] for m in skipped.first] == ["2", "3", "4", "6"]
    dataset.write_bytes(b"nope\n\n")
    expect(errors.DATASET_EMPTY, build_lengths, dataset, tokenizer, tmp_path / "m.jsonl", skipped=SkippedLines(),
           mention="blank or was skipped")


def test_build_dataset_errors(tmp_path, tokenizer):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    expect(errors.DATASET_EMPTY, build_lengths, tmp_path / "empty.jsonl", tokenizer, tmp_path / "l.jsonl")
    expect(errors.DATASET_UNREADABLE, build_lengths, tmp_path / "none.jsonl", tokenizer, tmp_path / "l.jsonl")
    expect(errors.DATASET_UNREADABLE, build_lengths, tmp_path, tokenizer, tmp_path / "l.jsonl")
    assert listing(tmp_path) == ["empty.jsonl"]


def test_build_checks_arguments_before_reading(tmp_path, tokenizer):
    dataset = write_jsonl(tmp_path / "train.jsonl", [{"text": "a", "p": "q", "r": "s"}])
    (tmp_path / "l.jsonl").write_text("keep")
    expect(errors.OUTPUT_EXISTS, build_lengths, dataset, tokenizer, tmp_path / "l.jsonl")
    expect(errors.OUTPUT_PATH_INVALID, build_lengths, dataset, tokenizer, tmp_path / "no" / "l.jsonl")
    expect(errors.TOKENIZER_INVALID, build_lengths, dataset, tmp_path / "none", tmp_path / "m.jsonl")
    expect(errors.TOKENIZER_INVALID, build_lengths, dataset, tokenizer, tmp_path / "m.jsonl", prompt_field="p",
           response_field="r", mention="--eos ")
    for fields in ({"prompt_field": "p"}, {"response_field": "r"}, {"text_field": "text", "prompt_field": "p",
                                                                     "response_field": "r"}):
        expect(errors.LENGTHS_INVALID, build_lengths, dataset, tokenizer, tmp_path / "m.jsonl", mention="together",
               **fields)
    assert (tmp_path / "l.jsonl").read_text() == "keep" and listing(tmp_path) == ["l.jsonl", "train.jsonl"]


# ====================================================================== statistics
def brute_force(lengths: list[int], buckets: int) -> int:
    values = sorted(set(lengths))
    best = None
    for cuts in itertools.combinations(values[:-1], min(buckets, len(values)) - 1):
        edges = list(cuts) + [values[-1]]
        padding = sum(min(e for e in edges if e >= x) - x for x in lengths)
        best = padding if best is None else min(best, padding)
    return best


def padding_of(lengths, edges) -> int:
    array = np.asarray(lengths, dtype=np.int64)
    edge_array = np.asarray(edges, dtype=np.int64)
    return int((edge_array[np.searchsorted(edge_array, array, side="left")] - array).sum())


@settings(max_examples=300)
@given(st.lists(st.integers(0, 60), min_size=1, max_size=40), st.integers(1, 6))
def test_optimal_edges_equal_brute_force(lengths, buckets):
    choices = length_stats.optimal_bucket_choices(np.array(lengths), buckets)
    distinct = len(set(lengths))
    assert len(choices) == min(buckets, distinct)
    for count, choice in enumerate(choices, 1):
        assert choice.buckets == count
        assert list(choice.edges) == sorted(set(choice.edges)) and choice.edges[-1] == max(lengths)
        assert set(choice.edges) <= set(lengths)
        assert choice.padding_tokens == padding_of(lengths, choice.edges) == brute_force(lengths, count)
        assert choice.tokens == sum(lengths)
    paddings = [choice.padding_tokens for choice in choices]
    assert paddings == sorted(paddings, reverse=True)
    assert length_stats.optimal_bucket_edges(np.array(lengths), buckets) == choices[-1]


def test_optimal_edges_at_scale_match_their_padding():
    rng = np.random.default_rng(7)
    lengths = np.minimum(rng.lognormal(5.5, 0.8, 200_000).astype(np.int64) + 1, 8192)
    choices = length_stats.optimal_bucket_choices(lengths, 6)
    for choice in choices:
        assert choice.padding_tokens == padding_of(lengths, choice.edges)
    # no single edge moved to a neighbouring distinct length does better
    values = np.unique(lengths)
    best = choices[-1]
    for position in range(len(best.edges) - 1):
        index = int(np.searchsorted(values, best.edges[position]))
        for neighbour in (index - 1, index + 1):
            edges = list(best.edges)
            edges[position] = int(values[neighbour])
            if edges == sorted(set(edges)):
                assert padding_of(lengths, edges) >= best.padding_tokens


def test_waste_and_single_length():
    choice = length_stats.optimal_bucket_edges(np.array([4, 4, 4]), 3)
    assert choice.edges == (4,) and choice.padding_tokens == 0 and choice.padding_waste == 0.0
    zeros = length_stats.optimal_bucket_edges(np.array([0, 0]), 1)
    assert zeros.padding_waste == 0.0
    two = length_stats.optimal_bucket_edges(np.array([1, 3]), 1)
    assert two.padding_tokens == 2 and two.padding_waste == pytest.approx(2 / 6)
    assert two.to_dict() == {"buckets": 1, "edges": [3], "padding_tokens": 2, "padding_waste": pytest.approx(1 / 3)}


def test_percentiles_are_nearest_rank():
    lengths = np.arange(1, 101)
    assert length_stats.percentiles(lengths) == {50.0: 50, 90.0: 90, 95.0: 95, 99.0: 99, 99.9: 100}
    assert length_stats.percentiles(np.array([7])) == {p: 7 for p in length_stats.PERCENTILES}


def test_power_of_two_histogram():
    lengths = np.array([0, 1, 2, 3, 4, 7, 8, 1000, 1023, 1024, 2**32 - 1], dtype=np.uint32)
    bins = length_stats.power_of_two_histogram(lengths)
    assert sum(count for _, _, count in bins) == len(lengths)
    assert bins[:5] == [(0, 1, 1), (1, 2, 1), (2, 4, 2), (4, 8, 2), (8, 16, 1)]
    assert bins[10] == (512, 1024, 2) and bins[11] == (1024, 2048, 1) and bins[-1] == (2**31, 2**32, 1)
    assert length_stats.power_of_two_histogram(np.array([5, 6]))== [(4, 8, 2)]


@pytest.mark.parametrize("lengths,buckets,mention", [
    (np.array([]), 2, "non-empty"),
    (np.array([1.5]), 2, "integer"),
    (np.array([[1]]), 2, "one-dimensional"),
    (np.array([-1, 2]), 2, "non-negative"),
    (np.array([1, 2]), 0, "positive integer"),
    (np.array([1, 2]), True, "positive integer"),
    (np.array([2**61, 2**61, 1], dtype=np.int64), 2, "2^62"),
])
def test_statistics_errors(lengths, buckets, mention):
    expect(errors.LENGTHS_INVALID, length_stats.optimal_bucket_choices, lengths, buckets, mention=mention)


# ====================================================================== failure codes
def batching_codes() -> set[str]:
    """The codes of errors.py's batching block (from its header comment to the next blank line)."""
    source = Path(os.path.join(ROOT, "umlos_cuda", "errors.py")).read_text(encoding="utf-8")
    block = source.split("#: LLM batching (umlos_cuda.batching)", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r'^([A-Z_]+) = "\1"', block, re.M))


def test_every_batching_code_is_documented():
    """Every code of the block is in the table of docs/batching.md (which
    also lists the plan codes), and the table names only real codes."""
    codes = batching_codes()
    assert {errors.SAMPLE_INVALID, errors.TOKENIZER_INVALID, errors.DATASET_RECORD_INVALID,
            errors.LENGTHS_SIDECAR_MISMATCH} <= codes
    doc = Path(os.path.join(ROOT, "docs", "batching.md")).read_text(encoding="utf-8")
    table = doc.split("## Failure codes", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([A-Z_]+)` \|", table, re.M))
    assert codes <= documented, sorted(codes - documented)
    defined = {value for name, value in vars(errors).items() if name.isupper() and isinstance(value, str)}
    assert documented <= defined, sorted(documented - defined)  # the table names no code that does not exist
