"""``data tokenize`` and ``data lengths build`` reading their dataset from object-store URLs (remote/inputs.py).

Each format the records layer reads (JSONL plain, gzip, zstd; Parquet; a ``datasets`` ``save_to_disk`` folder) is
written on disk, put into a bucket (``object_store``: moto behind the counting proxy of tests/objstore_support.py)
and tokenized from its URL by the CLI: the store is byte for byte the one tokenized from the local file, the
private copy is gone afterwards, a bad record is refused naming the URL (not the copy), and the copy's own
refusals (too many objects, too large for the disk, a key that is not a plain path, nothing there) come before a
byte of data is fetched.
"""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path

import pytest

from batching_cases import train_tokenizer, write_model_dir
from token_cases import records
from objstore_support import refused
from umlos_cuda import errors
from umlos_cuda.cli import main

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
zstandard = pytest.importorskip("zstandard")
datasets = pytest.importorskip("datasets")

KINDS = ("jsonl", "jsonl.gz", "jsonl.zst", "parquet", "hf-folder")
FIELDS = ("--prompt-field", "prompt", "--response-field", "response")


def write(rows: list[dict], folder: Path, kind: str) -> Path:
    """``rows`` as one dataset of ``kind`` in ``folder``; its path."""
    text = "".join(json.dumps(row) + "\n" for row in rows).encode()
    if kind == "jsonl":
        (folder / "train.jsonl").write_bytes(text)
    elif kind == "jsonl.gz":
        (folder / "train.jsonl.gz").write_bytes(gzip.compress(text))
    elif kind == "jsonl.zst":
        (folder / "train.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(text))
    elif kind == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), folder / "train.parquet", row_group_size=37)
    else:
        datasets.Dataset.from_list(rows).save_to_disk(str(folder / "train"), max_shard_size="4KB")
        return folder / "train"
    return folder / f"train.{kind}"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_model_dir(tmp_path_factory.mktemp("model") / "model", train_tokenizer(), {"eos_token": "</s>"})


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """The temporary folder the copies go into, watched."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _upload(object_store, path: Path) -> str:
    bucket = object_store.bucket()
    if path.is_dir():
        return object_store.upload_folder(path, bucket, f"data/{path.name}")
    object_store.put(bucket, f"data/{path.name}", path.read_bytes())
    return f"s3://{bucket}/data/{path.name}"


def _store_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("kind", KINDS)
def test_a_dataset_url_tokenizes_to_the_store_of_the_local_file(kind, model, tmp_path, private_tmp, object_store,
                                                                 capsys):
    (tmp_path / "in").mkdir()
    path = write(records(80, seed=4), tmp_path / "in", kind)
    url = _upload(object_store, path)
    argv = ("data", "tokenize", "--tokenizer", str(model), "--quiet", *FIELDS, "--dataset")
    assert main([*argv, str(path), "--output", str(tmp_path / "here")]) == 0
    assert main([*argv, url, "--output", str(tmp_path / "there")]) == 0
    assert _store_files(tmp_path / "there") == _store_files(tmp_path / "here")
    assert list(private_tmp.iterdir()) == []  # the copy is gone
    lengths = ("data", "lengths", "build", "--tokenizer", str(model), "--quiet", *FIELDS, "--dataset")
    assert main([*lengths, url, "--output", str(tmp_path / "lengths.jsonl")]) == 0
    assert (tmp_path / "lengths.jsonl").read_bytes() == (tmp_path / "here" / "lengths.jsonl").read_bytes()
    capsys.readouterr()


def test_several_urls_and_paths_are_one_dataset_in_the_order_given(model, tmp_path, private_tmp, object_store):
    rows = records(60, seed=6)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = write(rows[:30], tmp_path / "a", "jsonl"), write(rows[30:], tmp_path / "b", "parquet")
    url = _upload(object_store, second)
    argv = ("data", "tokenize", "--tokenizer", str(model), "--quiet", *FIELDS, "--dataset")
    assert main([*argv, str(first), str(second), "--output", str(tmp_path / "here")]) == 0
    assert main([*argv, str(first), url, "--output", str(tmp_path / "there")]) == 0
    assert _store_files(tmp_path / "there") == _store_files(tmp_path / "here")


def test_a_bad_record_is_refused_naming_the_url(model, tmp_path, private_tmp, object_store, capsys):
    bucket = object_store.bucket()
    object_store.put(bucket, "bad.jsonl", b'{"prompt": "a", "response": "b"}\n{"prompt": 3, "response": "c"}\n')
    url = f"s3://{bucket}/bad.jsonl"
    assert main(["data", "tokenize", "--tokenizer", str(model), "--quiet", *FIELDS, "--dataset", url, "--output",
                 str(tmp_path / "out")]) == 2
    said = capsys.readouterr().err
    assert "error DATASET_RECORD_INVALID:" in said and url in said and str(private_tmp) not in said
    assert list(private_tmp.iterdir()) == []


def _staged(url: str):
    from umlos_cuda.remote.inputs import staged_dataset

    with staged_dataset(url) as local:
        return local




def test_the_copy_s_refusals_come_before_any_data_is_fetched(tmp_path, private_tmp, object_store, monkeypatch):
    from umlos_cuda.remote import inputs

    bucket = object_store.bucket()
    for name in ("a.arrow", "b.arrow", "state.json"):
        object_store.put(bucket, f"ds/{name}", b"x" * 1000)
    object_store.proxy.reset()
    with monkeypatch.context() as patch:
        patch.setattr(inputs, "MAX_OBJECTS", 2)
        refused(lambda: _staged(f"s3://{bucket}/ds"), errors.DATASET_UNREADABLE, f"s3://{bucket}/ds",
                 "more than 2 objects")
    with monkeypatch.context() as patch:
        patch.setattr(inputs, "FREE_MARGIN", 1 << 62)
        refused(lambda: _staged(f"s3://{bucket}/ds"), errors.DATASET_UNREADABLE, "3,000 bytes", "TMPDIR")
    refused(lambda: _staged(f"s3://{bucket}/nothing"), errors.DATASET_UNREADABLE, f"s3://{bucket}/nothing does not "
             "exist")
    assert object_store.proxy.gets("arrow") == [] and object_store.proxy.gets("json") == []
    assert list(private_tmp.iterdir()) == []
    copied = _staged(f"s3://{bucket}/ds")  # within the caps: the folder, its files under their own names
    assert copied.endswith("/ds") and not Path(copied).exists()  # removed when the block ended


def test_an_object_changed_during_the_copy_is_refused(tmp_path, private_tmp, object_store, monkeypatch):
    from umlos_cuda.remote import client, inputs

    bucket = object_store.bucket()
    object_store.put(bucket, "big.jsonl", b"{}\n" * 4000)
    monkeypatch.setattr(inputs, "PIECE", 4096)
    reads = []
    original = client.RemoteObject.read

    def read(self, start, stop):
        reads.append(start)
        if len(reads) == 2:  # between the first range and the second, the object is rewritten
            object_store.put(bucket, "big.jsonl", b"[]\n" * 4000)
        return original(self, start, stop)

    monkeypatch.setattr(client.RemoteObject, "read", read)
    refused(lambda: _staged(f"s3://{bucket}/big.jsonl"), errors.REMOTE_OBJECT_CHANGED, f"s3://{bucket}/big.jsonl")
    assert list(private_tmp.iterdir()) == []


def test_a_key_that_is_not_a_plain_path_is_refused_not_retried(private_tmp, object_store):
    import http.client

    bucket = object_store.bucket()
    object_store.put(bucket, "ds/ok.arrow", b"x")
    connection = http.client.HTTPConnection("127.0.0.1", object_store.server.port, timeout=30)
    try:  # a key with an empty part, which the client library refuses to name (put straight into the server)
        connection.request("PUT", f"/{bucket}/ds/a//b.arrow", body=b"z", headers={"Content-Length": "1"})
        assert connection.getresponse().status == 200
    finally:
        connection.close()
    object_store.proxy.reset()
    refused(lambda: _staged(f"s3://{bucket}/ds"), errors.DATASET_UNREADABLE, f"s3://{bucket}/ds", "not a plain path")
    assert len([r for r in object_store.proxy.requests if r.query.startswith("list")]) == 1
    assert list(private_tmp.iterdir()) == []
