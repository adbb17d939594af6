"""Training records in every format (umlos_cuda/batching/records/): the same rows give the same bytes.

The same small dataset is written as JSONL, gzip JSONL, zstd JSONL, Parquet,
Arrow IPC (file and stream), a ``save_to_disk`` folder and a
``datasets.Dataset``, and each of them split into 3 shards; every one must
give byte-identical length caches and token stores, and identical plan and
batch fingerprints. The fingerprint is checked against its plain definition
(hypothesis: any chunking, any strings), ids of sharded rows without one
against their documented rule, and the field options and refusals of every
format.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from batching_cases import expect, train_tokenizer, write_model_dir
from token_cases import records
from umlos_cuda import errors

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
zstandard = pytest.importorskip("zstandard")
datasets = pytest.importorskip("datasets")
datasets.disable_progress_bars()

from hypothesis import given, settings, strategies as st  # noqa: E402

from umlos_cuda.batching import BatchingConfig, BatchPlanBuilder, build_lengths, dataset_fingerprint  # noqa: E402
from umlos_cuda.batching.batches.fingerprint import fingerprint_plan_batches  # noqa: E402
from umlos_cuda.batching.records import Field, Records  # noqa: E402
from umlos_cuda.batching.records.fingerprint import RowDigest  # noqa: E402
from umlos_cuda.batching.records.ids import shard_row_id  # noqa: E402
from umlos_cuda.batching.tokens.writer import tokenize_dataset  # noqa: E402

COUNT = 120
FORMATS = ("jsonl", "jsonl.gz", "jsonl.zst", "parquet", "arrow-file", "arrow-stream", "hf-folder", "hf-object")


def write(rows: list[dict], folder: Path, kind: str, name: str = "train"):
    """``rows`` written as ``kind`` under ``folder``; returns what to give as the dataset."""
    folder.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    if kind == "jsonl":
        (folder / f"{name}.jsonl").write_bytes(data)
        return folder / f"{name}.jsonl"
    if kind == "jsonl.gz":
        (folder / f"{name}.jsonl.gz").write_bytes(gzip.compress(data))
        return folder / f"{name}.jsonl.gz"
    if kind == "jsonl.zst":
        (folder / f"{name}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
        return folder / f"{name}.jsonl.zst"
    table = pa.Table.from_pylist(rows)
    if kind == "parquet":
        pq.write_table(table, folder / f"{name}.parquet", row_group_size=37)
        return folder / f"{name}.parquet"
    if kind == "arrow-file":
        with pa.ipc.new_file(folder / f"{name}.arrow", table.schema) as writer:
            writer.write_table(table, max_chunksize=29)
        return folder / f"{name}.arrow"
    if kind == "arrow-stream":
        with pa.ipc.new_stream(folder / f"{name}.arrow", table.schema) as writer:
            writer.write_table(table, max_chunksize=31)
        return folder / f"{name}.arrow"
    dataset = datasets.Dataset.from_list(rows)
    if kind == "hf-object":
        return dataset
    dataset.save_to_disk(str(folder / name), max_shard_size="4KB")  # several Arrow files in one folder
    return folder / name


def sharded(rows: list[dict], folder: Path, kind: str, shards: int = 3):
    """``rows`` cut into ``shards`` consecutive files of ``kind``; the glob that names them, in order."""
    size = -(-len(rows) // shards)
    for i in range(shards):
        write(rows[i * size:(i + 1) * size], folder, kind, f"part-{i:02d}")
    if kind == "hf-folder":
        return [str(folder / f"part-{i:02d}") for i in range(shards)]
    suffix = {"arrow-file": "arrow", "arrow-stream": "arrow"}.get(kind, kind)
    return str(folder / f"part-*.{suffix}")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_model_dir(tmp_path_factory.mktemp("model") / "model", train_tokenizer(), {"eos_token": "</s>"})


@pytest.fixture(scope="module")
def rows():
    return [{**row, "n": len(row["text"])} for row in records(COUNT, seed=5)]


def outputs(dataset, model, out: Path, **fields) -> dict:
    """The bytes of the length cache and token store, and the plan and batch fingerprints, of ``dataset``."""
    out.mkdir()
    cache = build_lengths(dataset, model, out / "lengths.jsonl", chunk_size=16, **fields)
    store = tokenize_dataset(dataset, model, out / "store", chunk_size=16, **fields)
    config = BatchingConfig.predictable(token_budget=256, bucket_edges=(16, 32, 64), overflow_max=128, seed=3)
    if "chosen_field" in fields:  # preference pairs stay together in a microbatch
        config = dataclasses.replace(config, group_size=2)
    plan = BatchPlanBuilder(cache, config).build(1)
    files = {name: (out / name).read_bytes() for name in ("lengths.jsonl", "lengths.jsonl.u32")}
    files |= {f"store/{p.name}": p.read_bytes() for p in sorted((out / "store").iterdir())}
    return {"files": files, "plan": plan.meta.fingerprint,
            "batches": fingerprint_plan_batches(plan, store, 3).fingerprint}


@pytest.mark.parametrize("mode", [{}, {"prompt_field": "prompt", "response_field": "response"}],
                         ids=["text", "prompt-response"])
def test_every_format_and_sharding_gives_the_same_bytes(rows, model, tmp_path, mode):
    reference = outputs(write(rows, tmp_path / "ref", "jsonl"), model, tmp_path / "ref-out", **mode)
    for kind in FORMATS:
        single = outputs(write(rows, tmp_path / kind, kind), model, tmp_path / f"{kind}-out", **mode)
        assert single == reference, kind
        if kind == "hf-object":
            continue  # shards are files; a Dataset object is one input
        shards = outputs(sharded(rows, tmp_path / f"{kind}-shards", kind), model, tmp_path / f"{kind}-s-out", **mode)
        assert shards == reference, f"{kind} in 3 shards"


def test_the_fingerprint_changes_when_one_row_changes(rows, tmp_path):
    base = {kind: dataset_fingerprint(write(rows, tmp_path / kind, kind), "h") for kind in ("jsonl", "parquet")}
    assert base["jsonl"] == base["parquet"]
    changed = [dict(row) for row in rows]
    changed[77]["text"] += "!"
    for kind in ("jsonl", "parquet"):
        assert dataset_fingerprint(write(changed, tmp_path / f"c-{kind}", kind), "h") != base[kind]
    swapped = rows[:]
    swapped[3], swapped[4] = swapped[4], swapped[3]
    assert dataset_fingerprint(write(swapped, tmp_path / "swap", "parquet"), "h") != base["parquet"]
    assert dataset_fingerprint(write(rows, tmp_path / "t", "parquet"), "other") != base["parquet"]


def plain_fingerprint(tokenizer_hash: str, columns: list[tuple[str, str, list]]) -> str:
    """The documented definition, written out row by row."""
    def prefixed(text: str) -> bytes:
        return len(text.encode()).to_bytes(8, "little") + text.encode()

    body = len(columns[0][2]).to_bytes(8, "little")
    for role, kind, values in columns:
        if kind == "integer":
            data, sizes = b"".join(int(v).to_bytes(8, "little", signed=True) for v in values), b""
        else:
            encoded = [(v if kind == "string" else json.dumps(v, sort_keys=True, ensure_ascii=False,
                                                                separators=(",", ":"))).encode() for v in values]
            data, sizes = b"".join(encoded), b"".join(len(e).to_bytes(8, "little") for e in encoded)
        body += prefixed(role) + prefixed(kind) + hashlib.sha256(data).digest() + hashlib.sha256(sizes).digest()
    return hashlib.sha256(b"umlos-cuda dataset fingerprint v2\0" + prefixed(tokenizer_hash) + body).hexdigest()


@settings(max_examples=60, deadline=None)
@given(texts=st.lists(st.text(st.characters(exclude_categories=("Cs",))), min_size=1, max_size=40),
       cut=st.integers(1, 41), large=st.booleans())
def test_the_vectorised_fingerprint_is_the_plain_definition(texts, cut, large):
    fields = (Field("t", "string", "text"), Field("n", "integer", "length"))
    counts = list(range(len(texts)))
    ids = [f"id{i}" for i in range(len(texts))]
    expected = plain_fingerprint("h", [("sample_id", "string", ids), ("text", "string", texts),
                                       ("length", "integer", counts)])
    kind = pa.large_string() if large else pa.string()
    table = pa.table({"i": pa.array(ids, kind), "t": pa.array(texts, kind), "n": pa.array(counts, pa.int64())})
    for source in ("arrow", "lists"):
        digest = RowDigest(fields)
        for start in range(0, len(texts), cut):
            piece = table.slice(start, cut)  # slices: offsets that do not start at 0
            if source == "arrow":
                digest.add(piece["i"].chunk(0), [piece["t"].chunk(0), piece["n"].chunk(0)], piece.num_rows)
            else:
                digest.add(piece["i"].to_pylist(), [piece["t"].to_pylist(), np.asarray(piece["n"])], piece.num_rows)
        assert digest.hexdigest("h") == expected, source


def test_messages_pass_through_as_json_values(tmp_path):
    rows = [{"messages": [{"role": "user", "content": f"q{i} é"}, {"role": "assistant", "content": "a"}]}
            for i in range(5)]
    field = (Field("messages", "json"),)
    chunks = {kind: list(Records(write(rows, tmp_path / kind, kind), field).chunks())
              for kind in ("jsonl", "parquet", "hf-object")}
    for kind, read in chunks.items():
        assert [m for chunk in read for m in chunk.values[0]] == [row["messages"] for row in rows], kind
    fingerprints = set()
    for kind in ("jsonl", "parquet", "hf-object"):
        opened = Records(write(rows, tmp_path / f"f-{kind}", kind), field)
        list(opened.chunks())
        fingerprints.add(opened.fingerprint("h"))
    assert len(fingerprints) == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "x"}, "text"]}\n')
    expect(errors.DATASET_RECORD_INVALID, lambda: list(Records(bad, field).chunks()), mention="list of objects")


# ---------------------------------------------------------------------- ids of rows without one
def test_sharded_rows_without_ids_are_named_by_content_not_by_file_name(rows, model, tmp_path):
    plain = [{k: v for k, v in row.items() if k != "id"} for row in rows]
    glob_a = sharded(plain, tmp_path / "a", "jsonl")
    glob_b = sharded(plain, tmp_path / "b", "parquet")
    a = build_lengths(glob_a, model, tmp_path / "a.jsonl")
    b = build_lengths(glob_b, model, tmp_path / "b.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert a.dataset_hash == b.dataset_hash and not a.ids_are_line_numbers
    # the documented rule: the shard's content hash, a colon, the row within the shard
    first = Records(tmp_path / "a" / "part-00.jsonl", (Field("text", "string", "text"),))
    from umlos_cuda.batching.records.fingerprint import RowDigest as Digest

    digest = Digest(first.fields, ids=False)
    for chunk in first.chunks():
        digest.add(None, chunk.values, len(chunk.sample_ids))
    assert a.sample_ids[:2] == [shard_row_id(digest.content_hash(), 0), shard_row_id(digest.content_hash(), 1)]
    # other names, another folder: the same ids
    for i, path in enumerate(sorted((tmp_path / "a").glob("part-*.jsonl"))):
        path.rename(tmp_path / "a" / f"zz-{i}.jsonl")
    moved = build_lengths(str(tmp_path / "a" / "zz-*.jsonl"), model, tmp_path / "c.jsonl")
    assert moved.sample_ids == a.sample_ids and moved.dataset_hash == a.dataset_hash
    # one row changed: its shard's ids change, the others' do not
    changed = [dict(row) for row in plain]
    changed[-1]["text"] += " more"
    c = build_lengths(sharded(changed, tmp_path / "d", "parquet"), model, tmp_path / "d.jsonl")
    third = len(plain) // 3
    assert c.sample_ids[:2 * third] == a.sample_ids[:2 * third]
    assert c.sample_ids[2 * third:] != a.sample_ids[2 * third:] and c.dataset_hash != a.dataset_hash


def test_a_single_input_keeps_line_numbers_as_ids(rows, model, tmp_path):
    plain = [{k: v for k, v in row.items() if k != "id"} for row in rows]
    hashes = set()
    for kind in ("jsonl", "parquet", "hf-folder", "hf-object"):
        cache = build_lengths(write(plain, tmp_path / kind, kind), model, tmp_path / f"{kind}.jsonl", chunk_size=7)
        assert cache.ids_are_line_numbers and cache.sample_ids[:3] == ["0", "1", "2"], kind
        hashes.add(cache.dataset_hash)
    assert len(hashes) == 1  # row-number ids made by Arrow's cast hash as the JSONL reader's strings


def test_two_shards_with_the_same_content_are_refused(rows, model, tmp_path):
    plain = [{"text": row["text"]} for row in rows[:10]]
    write(plain, tmp_path, "jsonl", "part-0")
    write(plain, tmp_path, "parquet", "part-1")
    expect(errors.DATASET_RECORD_INVALID, build_lengths, [tmp_path / "part-0.jsonl", tmp_path / "part-1.parquet"],
           model, tmp_path / "l.jsonl", mention="repeats the id")


def test_shard_order_is_sorted_for_a_glob_and_given_for_a_list(rows, tmp_path):
    for i in (2, 0, 1, 10):
        write(rows[i:i + 1], tmp_path, "jsonl", f"part-{i}")
    glob_ids = [i for c in Records(str(tmp_path / "part-*.jsonl"), ("text",)).chunks() for i in c.sample_ids]
    assert glob_ids == [rows[i]["id"] for i in (0, 1, 10, 2)]  # string order of the paths
    listed = [tmp_path / "part-10.jsonl", str(tmp_path / "part-[01].jsonl")]
    list_ids = [i for c in Records(listed, ("text",)).chunks() for i in c.sample_ids]
    assert list_ids == [rows[i]["id"] for i in (10, 0, 1)]
    os.symlink(tmp_path / "part-0.jsonl", tmp_path / "part-9.jsonl")
    expect(errors.DATASET_UNREADABLE, Records, str(tmp_path / "part-*.jsonl"), ("text",), mention="same file")


# ---------------------------------------------------------------------- field options
def test_length_field_reads_token_counts_without_a_tokenizer(rows, model, tmp_path, capsys):
    from umlos_cuda.cli import main
    from umlos_cuda.batching import LengthCache, tokenizer_fingerprint

    dataset = write(rows, tmp_path, "parquet")
    cache = build_lengths(dataset, None, tmp_path / "l.jsonl", length_field="n")
    assert cache.lengths.tolist() == [row["n"] for row in rows] and cache.tokenizer_hash == "unknown"
    assert cache.sample_ids[:2] == [rows[0]["id"], rows[1]["id"]]
    assert cache.dataset_hash == dataset_fingerprint(dataset, "unknown", length_field="n")
    assert main(["data", "lengths", "build", "--dataset", str(dataset), "--length-field", "n", "--tokenizer",
                 str(model), "--output", str(tmp_path / "m.jsonl"), "--quiet"]) == 0
    assert LengthCache.load(tmp_path / "m.jsonl").tokenizer_hash == tokenizer_fingerprint(model)
    assert "dataset_hash" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["data", "lengths", "build", "--dataset", str(dataset), "--output", str(tmp_path / "x.jsonl")])
    expect(errors.LENGTHS_INVALID, build_lengths, dataset, None, tmp_path / "y.jsonl", length_field="n",
           text_field="text", mention="length field")
    jsonl = write([{"n": 3}, {"n": 2.5}], tmp_path / "j", "jsonl")
    expect(errors.DATASET_RECORD_INVALID, build_lengths, jsonl, None, tmp_path / "z.jsonl", length_field="n",
           mention="line 2")


def test_cli_reads_globs_formats_and_field_names(rows, model, tmp_path, capsys):
    from umlos_cuda.cli import main

    renamed = [{"key": row["id"], "body": row["text"]} for row in rows]
    pattern = sharded(renamed, tmp_path / "s", "parquet")
    write(rows, tmp_path / "ref", "jsonl")
    assert main(["data", "lengths", "build", "--dataset", pattern, "--tokenizer", str(model), "--text-field", "body",
                 "--id-field", "key", "--output", str(tmp_path / "a.jsonl"), "--quiet"]) == 0
    assert main(["data", "lengths", "build", "--dataset", str(tmp_path / "ref" / "train.jsonl"), "--tokenizer",
                 str(model), "--output", str(tmp_path / "b.jsonl"), "--quiet"]) == 0
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    disguised = tmp_path / "data.bin"
    disguised.write_bytes((tmp_path / "s" / "part-00.parquet").read_bytes())
    assert main(["data", "tokenize", "--dataset", str(disguised), "--format", "parquet", "--tokenizer", str(model),
                 "--text-field", "body", "--id-field", "key", "--output", str(tmp_path / "store"), "--quiet"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("kind", ["parquet", "hf-object"])
def test_columnar_values_are_checked(kind, model, tmp_path):
    cases = [([{"text": "a"}, {"text": None}], "null"), ([{"text": "a", "id": ""}], "non-empty"),
             ([{"body": "a"}], "lacks the column"), ([{"text": 5}], "string column")]
    for i, (rows, mention) in enumerate(cases):
        dataset = write(rows, tmp_path / f"{kind}{i}", kind)
        expect(errors.DATASET_RECORD_INVALID, build_lengths, dataset, model, tmp_path / f"{kind}{i}.jsonl",
               mention=mention)


@pytest.mark.parametrize("kind", FORMATS)
def test_a_named_id_field_that_is_missing_is_refused(kind, rows, model, tmp_path):
    """--id-field uid on rows without 'uid' named them by row number before, without a word."""
    dataset = write(rows[:20], tmp_path / kind, kind)
    error = expect(errors.DATASET_RECORD_INVALID, build_lengths, dataset, model, tmp_path / "a.jsonl", id_field="uid",
                   mention="'uid'")
    assert "--id-field names the field holding each record's id" in error.message
    assert "leave --id-field out to number the records" in error.message
    keyed = write([{**row, "uid": f"u{i}"} for i, row in enumerate(rows[:20])], tmp_path / f"{kind}-uid", kind)
    assert build_lengths(keyed, model, tmp_path / "b.jsonl", id_field="uid").sample_ids == [f"u{i}" for i in range(20)]
    # the default id field may be missing: its rows are numbered, as documented
    plain = write([{"text": row["text"]} for row in rows[:20]], tmp_path / f"{kind}-plain", kind)
    assert build_lengths(plain, model, tmp_path / "c.jsonl").ids_are_line_numbers


@pytest.mark.parametrize("kind", FORMATS)
def test_a_missing_field_names_the_options_data_tokenize_takes(kind, model, tmp_path):
    chats = [{"id": f"c{i}", "messages": [{"role": "user", "content": "hi"},
                                         {"role": "assistant", "content": f"hello {i}"}]} for i in range(4)]
    dataset = write(chats, tmp_path / kind, kind)
    error = expect(errors.DATASET_RECORD_INVALID, tokenize_dataset, dataset, model, tmp_path / "store",
                   mention="lacks the ")
    assert "--messages-field" in error.message and "'messages' holds conversations: --messages-field messages" \
        in error.message
    assert "for data lengths build, a token count with --length-field" in error.message


def test_unreadable_inputs_name_the_path_and_what_to_do(model, tmp_path):
    (tmp_path / "x.parquet").write_bytes(b"PAR1 not really")
    expect(errors.DATASET_UNREADABLE, build_lengths, tmp_path / "x.parquet", model, tmp_path / "a.jsonl",
           mention="x.parquet is not a readable Parquet file")
    (tmp_path / "y.jsonl.gz").write_bytes(b'{"text": "not gzip"}\n')
    expect(errors.DATASET_UNREADABLE, build_lengths, tmp_path / "y.jsonl.gz", model, tmp_path / "b.jsonl",
           mention="not a readable gzip stream")
    (tmp_path / "dict").mkdir()
    (tmp_path / "dict" / "dataset_dict.json").write_text('{"splits": ["train"]}')
    expect(errors.DATASET_UNREADABLE, build_lengths, tmp_path / "dict", model, tmp_path / "c.jsonl",
           mention="DatasetDict")
    expect(errors.DATASET_UNREADABLE, build_lengths, tmp_path / "z.jsonl", model, tmp_path / "d.jsonl",
           format="csv", mention="not one of")
    expect(errors.DATASET_UNREADABLE, build_lengths, [], model, tmp_path / "e.jsonl", mention="empty list")
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "empty.parquet")
    expect(errors.DATASET_EMPTY, build_lengths, tmp_path / "empty.parquet", model, tmp_path / "f.jsonl")


def test_an_output_is_never_a_shard(rows, model, tmp_path):
    pattern = sharded(rows, tmp_path, "jsonl")
    expect(errors.OUTPUT_IS_INPUT, build_lengths, pattern, model, tmp_path / "part-01.jsonl", force=True)
    assert (tmp_path / "part-01.jsonl").read_bytes().startswith(b'{"id"')


def test_a_fresh_process_reads_parquet_ids(rows, model, tmp_path):
    """Nothing but umlos_cuda imports pyarrow's modules here (the other tests import datasets, which imports them)."""
    import subprocess
    import sys

    dataset = write(rows, tmp_path, "parquet")
    code = ("from umlos_cuda.batching import build_lengths\n"
            f"cache = build_lengths({str(dataset)!r}, {str(model)!r}, {str(tmp_path / 'l.jsonl')!r})\n"
            "print(cache.sample_ids[0])\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == rows[0]["id"], result.stderr


@pytest.mark.parametrize("pairs", [False, True], ids=["chat", "preference-pairs"])
def test_chat_records_and_preference_pairs_read_the_same_from_every_format(tmp_path, pairs):
    """The chat converter and the pair rows work on every format: the same bytes from JSONL, Parquet, shards."""
    from test_batching_chat import write_family

    model = write_family(tmp_path / "model", "chatml")
    if pairs:
        rows = [{"id": f"p{i}", "prompt": f"what is {i}", "chosen": "paris", "rejected": f"no {i}"} for i in range(9)]
        fields = {"prompt_field": "prompt", "chosen_field": "chosen", "rejected_field": "rejected"}
    else:
        rows = [{"id": f"c{i}", "messages": [{"role": "user", "content": f"hello there {i}"},
                                             {"role": "assistant", "content": "I am fine"}]} for i in range(9)]
        fields = {"messages_field": "messages"}
    reference = outputs(write(rows, tmp_path / "ref", "jsonl"), model, tmp_path / "ref-out", **fields)
    for kind in ("jsonl.gz", "parquet", "hf-object"):
        assert outputs(write(rows, tmp_path / kind, kind), model, tmp_path / f"{kind}-out", **fields) == reference
    assert outputs(sharded(rows, tmp_path / "shards", "parquet"), model, tmp_path / "s-out", **fields) == reference


def test_a_skipped_line_ends_its_chunk_so_later_lines_keep_their_numbers(model, tmp_path):
    """JSONL chunks hold consecutive lines, as columnar chunks hold consecutive rows: a record after a
    skipped line is named by its own line (here the repeated id on line 4, not line 3)."""
    from umlos_cuda.batching.records.chunk import SkippedLines

    path = tmp_path / "d.jsonl"
    path.write_text('{"id": "a", "text": "x"}\nnot json\n{"id": "b", "text": "y"}\n{"id": "a", "text": "z"}\n')
    records = Records(path, ("text",), skipped=SkippedLines())
    chunks = list(records.chunks(chunk_size=10))
    assert [(chunk.first_line, list(chunk.sample_ids)) for chunk in chunks] == [(0, ["a"]), (2, ["b", "a"])]
    expect(errors.DATASET_RECORD_INVALID, build_lengths, path, model, tmp_path / "l.jsonl", skipped=SkippedLines(),
           mention="line 4 repeats the id 'a' of line 1")
