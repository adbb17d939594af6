"""Every record read whole, every columnar row checked as a JSONL line is (umlos_cuda/batching/records/).

A file cut short is refused, never read as a shorter dataset: an Arrow IPC
stream (plain or a ``save_to_disk`` file) without its end-of-stream marker, a
zstd frame without its last block, a gzip member without its trailer, a
compressed file of no bytes; a ``save_to_disk`` folder whose ``state.json``
lost a file, or whose file is a link out of it, is refused too. Columnar rows
are held to JSONL's rules: a string that is not UTF-8, a record over the line
cap, a null, an empty id are bad rows, named, skipped and counted with
``--skip-bad-lines`` while the rows around them keep their numbers; two
columns of one name are refused; a dictionary-encoded string column reads as
its plain twin. A JSONL string holding a lone surrogate is a bad line (it
used to fail the whole chunk in the tokenizer).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil

import pytest

from batching_cases import expect, train_tokenizer, write_model_dir
from umlos_cuda import errors

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
zstandard = pytest.importorskip("zstandard")
datasets = pytest.importorskip("datasets")
datasets.disable_progress_bars()

from umlos_cuda.batching import build_lengths, dataset_fingerprint  # noqa: E402
from umlos_cuda.batching.records import Field, Records, SkippedLines  # noqa: E402
from umlos_cuda.batching.records import columns  # noqa: E402
from umlos_cuda.batching.tokens.store import TokenStore  # noqa: E402

ROWS = [{"id": f"r{i:02d}", "text": f"the fox {i} jumps over a lazy dog"} for i in range(40)]
TEXT = (Field("text"),)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_model_dir(tmp_path_factory.mktemp("model") / "model", train_tokenizer(), {"eos_token": "</s>"})


def read(dataset, fields=TEXT, skipped=None, **options) -> tuple[list[str], list]:
    """Every sample id and every value of the first field read from ``dataset``."""
    ids, values = [], []
    for chunk in Records(dataset, fields, skipped=skipped, **options).chunks(chunk_size=7):
        ids += list(chunk.sample_ids)
        values += list(chunk.values[0])
    return ids, values


def jsonl_bytes(rows) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def arrow_stream(table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=10)
    return sink.getvalue().to_pybytes()


def zstd_by_blocks(data: bytes, lines_per_block: int = 10) -> tuple[bytes, list[int]]:
    """``data`` as one zstd frame written block by block (a flush after every few lines, as a streaming
    exporter does); the frame and the positions where its blocks end."""
    out = io.BytesIO()
    writer = zstandard.ZstdCompressor().stream_writer(out, closefd=False)
    ends = []
    lines = data.splitlines(keepends=True)
    for start in range(0, len(lines), lines_per_block):
        writer.write(b"".join(lines[start:start + lines_per_block]))
        writer.flush(zstandard.FLUSH_BLOCK)
        ends.append(out.tell())
    writer.close()
    return out.getvalue(), ends


# ---------------------------------------------------------------------- truncated files
def test_a_whole_arrow_stream_reads_every_row_and_one_cut_between_batches_is_refused(tmp_path):
    data = arrow_stream(pa.Table.from_pylist(ROWS))
    assert data.endswith(b"\xff\xff\xff\xff\x00\x00\x00\x00")
    (tmp_path / "whole.arrow").write_bytes(data)
    assert read(tmp_path / "whole.arrow")[0] == [row["id"] for row in ROWS]
    for name, cut in (("end.arrow", data[:-8]), ("half-marker.arrow", data[:-4])):
        (tmp_path / name).write_bytes(cut)
        expect(errors.DATASET_UNREADABLE, read, tmp_path / name, mention=f"{name} is truncated")
    schema_only = pa.ipc.open_stream(data).schema.serialize().to_pybytes()
    (tmp_path / "schema.arrow").write_bytes(schema_only)  # cut before the first batch
    expect(errors.DATASET_UNREADABLE, read, tmp_path / "schema.arrow", mention="truncated")
    (tmp_path / "empty-stream.arrow").write_bytes(schema_only + b"\xff\xff\xff\xff\x00\x00\x00\x00")
    expect(errors.DATASET_EMPTY, read, tmp_path / "empty-stream.arrow")  # whole, and empty: not truncated


def test_two_arrow_streams_joined_are_refused_not_read_as_the_first(tmp_path):
    first, second = arrow_stream(pa.Table.from_pylist(ROWS[:20])), arrow_stream(pa.Table.from_pylist(ROWS[20:]))
    (tmp_path / "joined.arrow").write_bytes(first + second)
    expect(errors.DATASET_UNREADABLE, read, tmp_path / "joined.arrow", mention="goes on after the end-of-stream")


def test_a_save_to_disk_file_cut_between_batches_is_refused(tmp_path):
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "ds"), max_shard_size="1KB")
    files = sorted((tmp_path / "ds").glob("data-*.arrow"))
    assert len(files) > 1 and read(tmp_path / "ds")[0] == [row["id"] for row in ROWS]
    files[1].write_bytes(files[1].read_bytes()[:-8])
    expect(errors.DATASET_UNREADABLE, read, tmp_path / "ds", mention=f"{files[1].name} is truncated")


def test_a_save_to_disk_state_that_lost_a_file_is_refused(tmp_path):
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "ds"), max_shard_size="1KB")
    state = json.loads((tmp_path / "ds" / "state.json").read_text())
    count = len(state["_data_files"])
    del state["_data_files"][count // 2]
    (tmp_path / "ds" / "state.json").write_text(json.dumps(state))
    expect(errors.DATASET_UNREADABLE, read, tmp_path / "ds", mention=f"data-{count // 2:05d}-of-{count:05d}.arrow "
           "is not listed")


def test_a_save_to_disk_filtered_keeps_its_parents_count_and_is_read(tmp_path):
    """datasets keeps the split's row count of the parent in dataset_info.json: not a truncation."""
    datasets.Dataset.from_list(ROWS).select(range(5)).save_to_disk(str(tmp_path / "ds"))
    assert read(tmp_path / "ds")[0] == [row["id"] for row in ROWS[:5]]


def test_a_save_to_disk_file_linked_from_outside_is_refused_and_one_inside_is_read(tmp_path):
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "ds"), max_shard_size="1KB")
    victim = sorted((tmp_path / "ds").glob("data-*.arrow"))[0]
    (tmp_path / "ds" / "kept").mkdir()
    shutil.move(victim, tmp_path / "ds" / "kept" / victim.name)
    os.symlink(tmp_path / "ds" / "kept" / victim.name, victim)
    assert read(tmp_path / "ds")[0] == [row["id"] for row in ROWS]
    shutil.move(tmp_path / "ds" / "kept" / victim.name, tmp_path / "elsewhere.arrow")
    victim.unlink()
    os.symlink(tmp_path / "elsewhere.arrow", victim)
    expect(errors.DATASET_UNREADABLE, read, tmp_path / "ds", mention="outside the folder")
    state = tmp_path / "ds" / "state.json"
    shutil.move(state, tmp_path / "state.json")
    os.symlink(tmp_path / "state.json", state)
    expect(errors.DATASET_UNREADABLE, read, tmp_path / "ds", mention="state.json is a link")


def test_a_zstd_frame_without_its_last_block_is_refused(tmp_path):
    data = jsonl_bytes(ROWS)
    frame, ends = zstd_by_blocks(data)
    (tmp_path / "whole.jsonl.zst").write_bytes(frame)
    assert read(tmp_path / "whole.jsonl.zst")[0] == [row["id"] for row in ROWS]
    one_shot = zstandard.ZstdCompressor().compress(data)
    for name, cut in (("after-a-block.jsonl.zst", frame[:ends[1]]), ("in-a-block.jsonl.zst", one_shot[:-9]),
                      ("in-the-magic.jsonl.zst", one_shot[:3]), ("no-bytes.jsonl.zst", b"")):
        (tmp_path / name).write_bytes(cut)
        expect(errors.DATASET_UNREADABLE, read, tmp_path / name, mention=f"{name} is truncated")


def test_zstd_frames_one_after_another_are_one_stream(tmp_path):
    """Several whole frames (and a skippable frame) are a whole file, read to the end."""
    compressor = zstandard.ZstdCompressor()
    skippable = b"\x50\x2a\x4d\x18" + (3).to_bytes(4, "little") + b"abc"
    parts = [compressor.compress(jsonl_bytes(ROWS[i:i + 15])) for i in range(0, len(ROWS), 15)]
    (tmp_path / "frames.jsonl.zst").write_bytes(parts[0] + skippable + b"".join(parts[1:]))
    assert read(tmp_path / "frames.jsonl.zst")[0] == [row["id"] for row in ROWS]


def test_a_gzip_stream_cut_short_or_of_no_bytes_is_refused(tmp_path):
    data = gzip.compress(jsonl_bytes(ROWS))
    for name, cut in (("cut.jsonl.gz", data[:-5]), ("no-bytes.jsonl.gz", b"")):
        (tmp_path / name).write_bytes(cut)
        expect(errors.DATASET_UNREADABLE, read, tmp_path / name, mention=f"{name} is truncated")


# ---------------------------------------------------------------------- columnar rows, checked like JSONL lines
def not_utf8(values: list[bytes]):
    """A string array holding ``values`` as they are, valid UTF-8 or not (pyarrow's writers check nothing)."""
    offsets = [0]
    for value in values:
        offsets.append(offsets[-1] + len(value))
    return pa.Array.from_buffers(pa.string(), len(values), [None, pa.array(offsets, pa.int32()).buffers()[1],
                                                             pa.py_buffer(b"".join(values))])


def test_a_columnar_string_not_utf8_is_a_bad_row_skipped_and_counted(tmp_path):
    texts = [b"the fox", b"\xed\xa0\xbd cut", b"a lazy dog", b"caf\xe9", b"over"]
    table = pa.table({"text": not_utf8(texts)})
    pq.write_table(table, tmp_path / "t.parquet")
    with pa.ipc.new_file(tmp_path / "t.arrow", table.schema) as writer:
        writer.write_table(table)
    for name in ("t.parquet", "t.arrow"):
        expect(errors.DATASET_RECORD_INVALID, read, tmp_path / name,
               mention=f"{name} row 1 has 'text' that is not UTF-8")
        skipped = SkippedLines()
        ids, values = read(tmp_path / name, skipped=skipped)
        assert (ids, values) == (["0", "2", "4"], ["the fox", "a lazy dog", "over"])  # the rows keep their numbers
        assert skipped.count == 2 and skipped.first[1].endswith("row 3 has 'text' that is not UTF-8 text (a "
                                                                "character cut in two, or bytes of another encoding)")


def test_columnar_bad_rows_of_every_kind_are_skipped_and_the_rest_fingerprint_as_jsonl(tmp_path):
    ids = pa.array(["a", "", "c", None, "e", "f"])
    texts = not_utf8([b"one", b"two", b"three", b"four", b"\xff", b"six"])
    counts = pa.array([1, 2, -3, 4, 5, 1 << 33])
    pq.write_table(pa.table({"id": ids, "text": texts, "n": counts}), tmp_path / "t.parquet")
    fields = (Field("text"), Field("n", "integer"))
    skipped = SkippedLines()
    opened = Records(tmp_path / "t.parquet", fields, skipped=skipped)
    got = [(i, t, int(n)) for chunk in opened.chunks(chunk_size=4)
           for i, t, n in zip(chunk.sample_ids, chunk.values[0], chunk.values[1])]
    assert got == [("a", "one", 1)] and skipped.count == 5
    reasons = "\n".join(skipped.first)
    for row, problem in ((1, "'id' = ''"), (2, "'n' = -3"), (3, "'id' null"), (4, "'text' that is not UTF-8"),
                         (5, "'n' = 8589934592")):
        assert f"row {row} has {problem}" in reasons
    (tmp_path / "same.jsonl").write_bytes(jsonl_bytes([{"id": "a", "text": "one", "n": 1}]))
    plain = Records(tmp_path / "same.jsonl", fields)
    list(plain.chunks())
    assert opened.fingerprint("h") == plain.fingerprint("h")


def test_a_record_over_the_cap_is_a_bad_row_measured_before_it_is_read(tmp_path, monkeypatch):
    """The cap is the JSONL line cap (64 MiB); lowered here so that the file stays small."""
    monkeypatch.setattr(columns, "MAX_RECORD_BYTES", 100)
    rows = [{"id": "a", "text": "x" * 60}, {"id": "b", "text": "y" * 100}, {"id": "c", "text": "z"}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet")
    expect(errors.DATASET_RECORD_INVALID, read, tmp_path / "t.parquet",
           mention="row 1 is 101 bytes, over the 100 a record")
    skipped = SkippedLines()
    assert read(tmp_path / "t.parquet", skipped=skipped) == (["a", "c"], ["x" * 60, "z"]) and skipped.count == 1
    dictionary = pa.DictionaryArray.from_arrays(pa.array([0, 1, 0, 0], pa.int8()), pa.array(["w" * 101, "v"]))
    pq.write_table(pa.table({"text": dictionary}), tmp_path / "d.parquet")
    assert read(tmp_path / "d.parquet", skipped=SkippedLines()) == (["1"], ["v"])


def test_a_dictionary_encoded_string_column_reads_as_its_plain_twin(tmp_path, model):
    import pandas as pd

    texts = [ROWS[i % 3]["text"] for i in range(30)]
    pd.DataFrame({"text": pd.Categorical(texts)}).to_parquet(tmp_path / "cat.parquet")
    assert pa.types.is_dictionary(pq.read_schema(tmp_path / "cat.parquet").field("text").type)
    pq.write_table(pa.table({"text": texts}), tmp_path / "plain.parquet")
    table = pa.table({"text": pa.array(texts).dictionary_encode()})
    with pa.ipc.new_file(tmp_path / "dict.arrow", table.schema) as writer:
        writer.write_table(table)
    assert read(tmp_path / "cat.parquet") == read(tmp_path / "dict.arrow") == read(tmp_path / "plain.parquet")
    names = ("cat.parquet", "dict.arrow", "plain.parquet")
    hashes = {name: dataset_fingerprint(tmp_path / name, "h") for name in names}
    assert len(set(hashes.values())) == 1, hashes
    a = build_lengths(tmp_path / "cat.parquet", model, tmp_path / "a.jsonl")
    build_lengths(tmp_path / "plain.parquet", model, tmp_path / "b.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes() and a.lengths.min() > 0


def test_two_columns_of_one_name_are_refused(tmp_path):
    table = pa.Table.from_arrays([pa.array(["first"]), pa.array(["second"])], names=["text", "text"])
    pq.write_table(table, tmp_path / "t.parquet")
    with pa.ipc.new_file(tmp_path / "t.arrow", table.schema) as writer:
        writer.write_table(table)
    for name in ("t.parquet", "t.arrow"):
        expect(errors.DATASET_RECORD_INVALID, read, tmp_path / name,
               mention="has 2 columns named 'text' (columns 0, 1)")
    other = pa.Table.from_arrays([pa.array(["kept"]), pa.array([1]), pa.array([2])], names=["text", "x", "x"])
    pq.write_table(other, tmp_path / "o.parquet")
    assert read(tmp_path / "o.parquet")[1] == ["kept"]  # a name read once; the twins are not read


def test_a_messages_column_holding_a_null_is_a_bad_row(tmp_path):
    rows = [{"messages": [{"role": "user", "content": "hi"}]}, {"messages": [None, {"role": "user", "content": "x"}]},
            {"messages": [{"role": "user", "content": "there"}]}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "m.parquet")
    field = (Field("messages", "json"),)
    expect(errors.DATASET_RECORD_INVALID, read, tmp_path / "m.parquet", field, mention="row 1 has 'messages' holding "
           "a null")
    assert read(tmp_path / "m.parquet", field, SkippedLines())[0] == ["0", "2"]
    pq.write_table(pa.table({"messages": ["[]"]}), tmp_path / "s.parquet")
    expect(errors.DATASET_RECORD_INVALID, read, tmp_path / "s.parquet", field, mention="must be a list of objects")


# ---------------------------------------------------------------------- JSONL: lone surrogates
def test_a_jsonl_lone_surrogate_is_a_bad_line_and_a_whole_pair_is_text(tmp_path, model):
    (tmp_path / "t.jsonl").write_text('{"text": "an emoji \\ud83d\\ude00"}\n{"text": "cut \\ud83d"}\n'
                                      '{"text": "a lazy dog \\uD800x"}\n{"text": "escaped \\\\ud83d is text"}\n')
    expect(errors.DATASET_RECORD_INVALID, read, tmp_path / "t.jsonl", mention="line 2 has 'text' holding a lone "
           "surrogate (\\ud83d without its other half")
    skipped = SkippedLines()
    assert read(tmp_path / "t.jsonl", skipped=skipped)[1] == ["an emoji \U0001f600", "escaped \\ud83d is text"]
    assert skipped.count == 2 and "line 3" in skipped.first[1] and "\\ud800" in skipped.first[1]
    cache = build_lengths(tmp_path / "t.jsonl", model, tmp_path / "l.jsonl", skipped=SkippedLines())
    assert cache.sample_ids == ["0", "3"]
    (tmp_path / "m.jsonl").write_text('{"messages": [{"role": "user", "content": "x\\udc00"}]}\n')
    expect(errors.DATASET_RECORD_INVALID, read, tmp_path / "m.jsonl", (Field("messages", "json"),),
           mention="line 1 has 'messages' holding a lone surrogate (\\udc00")


def test_the_command_counts_skipped_rows_as_it_counts_skipped_lines(tmp_path, model, capsys):
    from umlos_cuda.cli import main

    pq.write_table(pa.table({"text": not_utf8([b"the fox", b"\xff", b"a lazy dog", b"\xc3"])}), tmp_path / "t.parquet")
    argv = ["data", "tokenize", "--dataset", str(tmp_path / "t.parquet"), "--tokenizer", str(model), "--quiet"]
    assert main([*argv, "--output", str(tmp_path / "refused")]) != 0
    assert "row 1 has 'text' that is not UTF-8" in capsys.readouterr().err and not (tmp_path / "refused").exists()
    assert main([*argv, "--output", str(tmp_path / "store"), "--skip-bad-lines"]) == 0
    out = capsys.readouterr().out
    assert "2 samples" in out and "skipped 2 bad lines" in out and "row 3 has 'text'" in out


def test_skip_bad_lines_skips_the_rows_of_a_datasets_folder_and_object(tmp_path, model, capsys):
    """Issue 34 said --skip-bad-lines skipped JSONL lines only; rows of a save_to_disk folder (read by the
    command) and of a datasets.Dataset (read by the API) are skipped and counted alike."""
    from umlos_cuda.batching.tokens.writer import tokenize_dataset
    from umlos_cuda.cli import main

    rows = [{"id": f"r{i}", "text": None if i in (2, 5) else f"the fox {i}"} for i in range(8)]
    dataset = datasets.Dataset.from_list(rows)
    dataset.save_to_disk(str(tmp_path / "ds"), max_shard_size="1KB")
    argv = ["data", "tokenize", "--dataset", str(tmp_path / "ds"), "--tokenizer", str(model), "--quiet"]
    assert main([*argv, "--output", str(tmp_path / "refused")]) == 2
    assert "row 2 has 'text' null" in capsys.readouterr().err
    assert main([*argv, "--output", str(tmp_path / "folder"), "--skip-bad-lines"]) == 0
    said = capsys.readouterr().out
    assert "skipped 2 bad lines" in said and "6 samples" in said
    skipped = SkippedLines()
    store = tokenize_dataset(dataset, model, tmp_path / "object", skipped=skipped)
    kept = [row["id"] for row in rows if row["text"] is not None]
    assert skipped.count == 2 and store.length_cache().sample_ids == kept
    assert TokenStore.open(tmp_path / "folder").length_cache().sample_ids == kept
