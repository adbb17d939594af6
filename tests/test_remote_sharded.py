"""Sharded token stores in an object store (umlos_cuda/remote/sharded.py), against a real S3-compatible server.

A sharded store of three shards is written on disk by ``tokenize_sharded``, copied into a bucket as it is
(``object_store``: moto behind the counting proxy of tests/objstore_support.py), and read back through the
source layer: every row and length equal to the local store's, the same binding and identity (so a plan built
from one opens with the other), a shard read only when one of its rows is, and the index's and shards' checks
the local reader's (a missing shard, a replaced shard, an index over its cap, an object changed after opening).
"""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from batching_cases import train_tokenizer, write_model_dir
from token_cases import records
from objstore_support import refused
from umlos_cuda import errors
from umlos_cuda.batching.sources import open_source, source_kind
from umlos_cuda.batching.tokens.offsets import ShardedLengths
from umlos_cuda.batching.tokens.sharded import ShardedTokenStore, tokenize_sharded
from umlos_cuda.remote import RemoteShardedStore, RemoteTokenStore, RetryBudget, open_remote_store

FAST = RetryBudget(attempts=3, first_delay_s=0.01, max_delay_s=0.05, timeout_s=10.0)
SFT = {"prompt_field": "prompt", "response_field": "response"}


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """A sharded store of three shards on disk (records with ids: loss masks with zeros)."""
    root = tmp_path_factory.mktemp("remote-sharded")
    write_model_dir(root / "model", train_tokenizer(), {"eos_token": "</s>"})
    rows = records(90, seed=5)
    files = []
    for number, (a, b) in enumerate(((0, 25), (25, 60), (60, 90))):
        path = root / f"part-{number}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows[a:b]), encoding="utf-8")
        files.append(str(path))
    store = tokenize_sharded(files, root / "model", root / "sharded", **SFT)
    assert store.num_parts == 3
    return store


@pytest.fixture
def remote(local, object_store):
    """The local sharded store copied into a fresh bucket: ``(url, bucket)``."""
    bucket = object_store.bucket()
    return object_store.upload_folder(local.root, bucket, "corpus/sharded"), bucket


def test_every_row_length_and_binding_reads_as_on_disk(local, remote):
    url, _ = remote
    assert source_kind(url).name == "remote token store"
    source = open_source(url, tokens=True)
    assert isinstance(source, ShardedLengths) and isinstance(source.store, RemoteShardedStore)
    opened = source.store
    assert len(opened) == len(local) and opened.num_parts == 3 and opened.num_tokens == local.num_tokens
    assert opened.identity() == local.identity() and opened.tokenizer_parts == local.tokenizer_parts
    assert source.binding() == ShardedLengths(local).binding()  # a plan built from either opens with the other
    assert np.array_equal(source.take(np.arange(len(local))), local.lengths)
    for row in range(len(local)):
        ids, mask = source.arrays(row)
        want_ids, want_mask = local.arrays(row)
        assert ids.dtype == want_ids.dtype and np.array_equal(ids, want_ids) and np.array_equal(mask, want_mask)
    again = pickle.loads(pickle.dumps(opened))  # a DataLoader worker opens it again from its URL
    assert isinstance(again, RemoteShardedStore) and np.array_equal(again.arrays(70)[0], local.arrays(70)[0])


def test_a_shard_is_read_only_when_one_of_its_rows_is(local, remote, object_store):
    url, _ = remote
    object_store.proxy.reset()
    opened = open_remote_store(url, budget=FAST)
    assert isinstance(opened, RemoteShardedStore)
    assert not [r for r in object_store.proxy.requests if "/shards/" in r.key]  # the index only
    ids, _ = opened.arrays(30)  # row 5 of shard 00001
    assert np.array_equal(ids, local.arrays(30)[0])
    touched = {r.key.split("/shards/")[1].split("/")[0] for r in object_store.proxy.requests if "/shards/" in r.key}
    assert touched == {"00001"}


def test_a_flat_store_at_the_url_still_opens_as_one(local, object_store):
    shard = local.shard(0)
    bucket = object_store.bucket()
    url = object_store.upload_folder(shard.root, bucket, "flat")
    opened = open_remote_store(url, budget=FAST)
    assert isinstance(opened, RemoteTokenStore) and len(opened) == len(shard)




def test_a_missing_shard_is_sharded_store_invalid_naming_it(remote, object_store):
    url, bucket = remote
    object_store.delete(bucket, "corpus/sharded/shards/00002/meta.json")
    opened = RemoteShardedStore.open(url, budget=FAST)
    assert np.asarray(opened.arrays(0)[0]).size  # the other shards read
    refused(lambda: opened.arrays(80), errors.SHARDED_STORE_INVALID, f"{url}/shards/00002", "index lists it")


def test_a_replaced_shard_is_refused_before_its_arrays_are_read(local, remote, object_store):
    url, bucket = remote
    other = json.loads(Path(local.shard_path(0), "meta.json").read_text(encoding="utf-8"))
    other["dataset_hash"] = "0" * 64  # another store's meta.json: it no longer hashes to the index entry
    object_store.put(bucket, "corpus/sharded/shards/00000/meta.json", json.dumps(other).encode())
    object_store.proxy.reset()
    opened = RemoteShardedStore.open(url, budget=FAST)
    refused(lambda: opened.arrays(0), errors.SHARDED_STORE_INVALID, f"{url}/shards/00000/meta.json",
             "does not hash to the index's meta_sha256")
    assert not object_store.proxy.gets(".npy")


def test_a_shard_whose_counts_are_not_the_index_s_is_refused(local, remote, object_store):
    url, bucket = remote
    index = json.loads(Path(local.root, "meta.json").read_text(encoding="utf-8"))
    index["shards"][0]["num_samples"] += 1
    index["shards"][1]["num_samples"] -= 1
    object_store.put(bucket, "corpus/sharded/meta.json", json.dumps(index).encode())
    opened = RemoteShardedStore.open(url, budget=FAST)
    refused(lambda: opened.arrays(0), errors.SHARDED_STORE_INVALID, f"{url}/shards/00000", "the index says")


def test_an_index_over_its_cap_is_refused_before_its_body_is_fetched(remote, object_store, monkeypatch):
    from umlos_cuda.remote import sharded

    url, _ = remote
    monkeypatch.setattr(sharded, "MAX_INDEX_BYTES", 64)
    object_store.proxy.reset()
    refused(lambda: RemoteShardedStore.open(url, budget=FAST), errors.SHARDED_STORE_INVALID, f"{url}/meta.json",
             "sharded store index")
    assert object_store.proxy.gets("sharded/meta.json") == []


def test_an_index_that_is_not_a_sharded_store_s_is_refused_by_the_local_check(local, remote, object_store):
    url, bucket = remote
    index = json.loads(Path(local.root, "meta.json").read_text(encoding="utf-8"))
    index["shards"][1]["name"] = "../../elsewhere"
    object_store.put(bucket, "corpus/sharded/meta.json", json.dumps(index).encode())
    refused(lambda: open_source(url, tokens=True), errors.SHARDED_STORE_INVALID, f"{url}/meta.json",
             "shards[1]", "numbered in order")


def test_a_shard_changed_after_it_was_opened_is_refused(local, remote, object_store):
    url, bucket = remote
    opened = RemoteShardedStore.open(url, budget=FAST)
    opened.arrays(0)
    buffer = io.BytesIO()
    tokens = np.load(f"{local.shard_path(0)}/tokens.npy")
    np.save(buffer, tokens[::-1].copy())  # same size, other bytes: another ETag
    object_store.put(bucket, "corpus/sharded/shards/00000/tokens.npy", buffer.getvalue())
    refused(lambda: opened.arrays(1), errors.REMOTE_OBJECT_CHANGED, f"{url}/shards/00000/tokens.npy")


def test_no_index_at_the_url_is_token_store_not_found(object_store):
    bucket = object_store.bucket()
    refused(lambda: RemoteShardedStore.open(f"s3://{bucket}/nothing", budget=FAST), errors.TOKEN_STORE_NOT_FOUND,
             f"s3://{bucket}/nothing/meta.json")


def test_the_sharded_store_on_disk_is_what_the_remote_one_is_compared_with(local):
    """The local reader's own view, against which the tests above compare (a guard on the fixture)."""
    again = ShardedTokenStore.open(local.root)
    assert len(again) == 90 and [len(again.shard(i)) for i in range(3)] == [25, 35, 30]


def test_data_append_create_and_data_verify_on_a_url_say_what_is_not_built(local, remote, object_store, capsys):
    from umlos_cuda.cli import main

    url, _ = remote
    object_store.proxy.reset()
    assert main(["data", "append", url, local.shard_path(0), "--create"]) == 2
    said = capsys.readouterr().err
    assert "error REMOTE_UNAVAILABLE:" in said and "creating one in an object store (--create)" in said
    assert [r for r in object_store.proxy.requests if r.method in ("PUT", "POST", "DELETE")] == []
    assert main(["data", "verify", url]) == 2
    said = capsys.readouterr().err
    assert "error REMOTE_UNAVAILABLE:" in said and url in said and "verify the store on disk" in said
