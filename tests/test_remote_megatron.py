"""Megatron-LM pairs in an object store (umlos_cuda/remote/megatron.py), against a real S3-compatible server.

A pair is written on disk (tests/token_cases.py ``write_megatron``), copied into a bucket
(``object_store``: moto behind the counting proxy of tests/objstore_support.py) and read back through the source
layer: the lengths, binding and rows of the local pair, a row one ranged GET of exactly its bytes, and the local
reader's refusals (a header that does not fit the object's size, refused before the index's body is fetched; a
pointer outside the ``.bin``; a missing object; a negative token id), a changed ``.bin`` refused.
"""

from __future__ import annotations

import pickle
import struct

import numpy as np
import pytest

from token_cases import random_sequences, write_megatron
from objstore_support import refused
from umlos_cuda import errors
from umlos_cuda.batching.sources import open_source
from umlos_cuda.batching.tokens.mapped import MappedMegatron
from umlos_cuda.batching.tokens.megatron import MegatronDataset
from umlos_cuda.batching.tokens.sources import open_token_source
from umlos_cuda.remote import RemoteMegatron, RetryBudget, open_remote_store

FAST = RetryBudget(attempts=3, first_delay_s=0.01, max_delay_s=0.05, timeout_s=10.0)


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    root = tmp_path_factory.mktemp("remote-megatron")
    return write_megatron(root / "web_text_document", random_sequences(60, seed=8), document_ends=[20, 45, 60])


@pytest.fixture
def remote(local, object_store):
    """The pair copied into a fresh bucket: ``(url of the prefix, bucket)``."""
    bucket = object_store.bucket()
    for suffix in (".idx", ".bin"):
        with open(local + suffix, "rb") as handle:
            object_store.put(bucket, f"data/web_text_document{suffix}", handle.read())
    return f"s3://{bucket}/data/web_text_document", bucket




def test_lengths_binding_and_rows_read_as_on_disk(local, remote):
    url, _ = remote
    source = open_source(url, tokens=True)
    assert isinstance(source, RemoteMegatron) and source.origin == url
    mapped, whole = MappedMegatron(local), MegatronDataset.open(local)
    assert source.binding() == mapped.binding()  # a plan built from the local pair opens with this one
    assert np.array_equal(source.take(np.arange(len(whole))), whole.lengths)
    assert np.array_equal(source.document_indices, whole.document_indices)
    assert source.length_cache().lengths.tolist() == whole.length_cache().lengths.tolist()
    for row in range(len(whole)):
        ids, mask = source.arrays(row)
        assert ids.dtype == whole.dtype and np.array_equal(ids, whole.input_ids(row))
        assert mask.tolist() == [1] * ids.shape[0]
    for named in (url + ".idx", url + ".bin"):  # either object names the pair, as on disk
        assert open_token_source(named).binding() == mapped.binding()
    again = pickle.loads(pickle.dumps(source))
    assert np.array_equal(again.arrays(7)[0], whole.input_ids(7))
    assert source.verify()["samples"] == len(whole)


def test_a_row_is_one_ranged_get_of_exactly_its_bytes(local, remote, object_store):
    url, _ = remote
    source = open_remote_store(url, budget=FAST)
    whole = MegatronDataset.open(local)
    object_store.proxy.reset()
    source.arrays(33)
    gets = object_store.proxy.gets()
    start = int(whole.pointers[33])
    assert [(r.key.rsplit("/", 1)[1], r.span) for r in gets] == \
        [("web_text_document.bin", (start, start + 2 * int(whole.sizes[33])))]


def test_an_index_whose_size_does_not_fit_its_counts_is_refused_before_its_body_is_fetched(local, remote,
                                                                                         object_store):
    url, bucket = remote
    with open(local + ".idx", "rb") as handle:
        index = handle.read()
    object_store.put(bucket, "data/web_text_document.idx", index[:-8])
    object_store.proxy.reset()
    refused(lambda: open_remote_store(url, budget=FAST), errors.MEGATRON_INDEX_INVALID, f"{url}.idx",
             "document indices need")
    assert [r.span for r in object_store.proxy.gets(".idx")] == [(0, 34)]  # the header, nothing after it


def test_counts_past_the_cap_are_refused_before_the_body_is_fetched(remote, object_store, monkeypatch):
    from umlos_cuda.remote import megatron

    url, _ = remote
    monkeypatch.setattr(megatron, "MAX_SEQUENCES", 59)
    object_store.proxy.reset()
    refused(lambda: RemoteMegatron.open(url, budget=FAST), errors.MEGATRON_INDEX_INVALID, f"{url}.idx",
             "read it from disk")
    assert [r.span for r in object_store.proxy.gets(".idx")] == [(0, 34)]


def test_a_pointer_outside_the_bin_is_refused_at_opening(local, remote, object_store):
    url, bucket = remote
    with open(local + ".idx", "rb") as handle:
        index = bytearray(handle.read())
    pointers_at = 34 + 4 * 60
    index[pointers_at + 8 * 5:pointers_at + 8 * 6] = struct.pack("<q", 1 << 62)
    object_store.put(bucket, "data/web_text_document.idx", bytes(index))
    refused(lambda: open_source(url, tokens=True), errors.MEGATRON_INDEX_INVALID, f"{url}.idx", "sequence 5",
             f"{url}.bin")


def test_a_missing_bin_and_a_prefix_of_nothing_are_refused_naming_what_is_not_there(remote, object_store):
    url, bucket = remote
    object_store.delete(bucket, "data/web_text_document.bin")
    refused(lambda: open_remote_store(url, budget=FAST), errors.MEGATRON_INDEX_INVALID, f"{url}.bin does not exist")
    nothing = f"s3://{bucket}/data/nothing"
    refused(lambda: open_remote_store(nothing, budget=FAST), errors.TOKEN_STORE_NOT_FOUND, f"{nothing}/meta.json",
             f"{nothing}.idx does not exist either")


def test_a_bin_changed_after_opening_is_refused(local, remote, object_store):
    url, bucket = remote
    source = open_remote_store(url, budget=FAST)
    with open(local + ".bin", "rb") as handle:
        data = bytearray(handle.read())
    data[0] ^= 1
    object_store.put(bucket, "data/web_text_document.bin", bytes(data))
    refused(lambda: source.arrays(0), errors.REMOTE_OBJECT_CHANGED, f"{url}.bin")


def test_verify_finds_a_negative_token_id_as_on_disk(tmp_path, object_store):
    sequences = random_sequences(12, seed=2)
    sequences[7][3] = -5
    prefix = write_megatron(tmp_path / "signed", sequences, dtype=np.int32)
    bucket = object_store.bucket()
    url = object_store.upload_folder(tmp_path, bucket, "x") + "/signed"
    local_error = refused(lambda: MegatronDataset.open(prefix).verify(), errors.MEGATRON_INDEX_INVALID)
    remote_error = refused(lambda: RemoteMegatron.open(url, budget=FAST).verify(), errors.MEGATRON_INDEX_INVALID,
                            f"{url}.bin", "sequence 7 holds token id -5")
    assert remote_error.message == local_error.message.replace(prefix, url)


def test_data_verify_checks_a_megatron_url(local, remote, capsys):
    from umlos_cuda.cli import main

    url, _ = remote
    assert main(["data", "verify", url]) == 0
    assert f"ok  {url}: 60 samples" in capsys.readouterr().out
