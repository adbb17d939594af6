"""``plan build --window`` and ``plan verify`` over object-store URLs of every kind read there (umlos_cuda/remote/).

A flat token store, a sharded store, a Megatron prefix and a length cache's ``.u32`` sidecar are written on disk,
copied into a bucket (``object_store``: moto behind the counting proxy of tests/objstore_support.py), and a windowed
plan is built by the CLI from each URL: the same windows and fingerprint as from the local path, the URL recorded
as it is (never made a local path), and ``plan verify`` reopens it from that URL. A length cache's JSONL URL is
refused saying to give its sidecar.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from token_cases import write_token_sources
from umlos_cuda import errors
from umlos_cuda.batching.sources import open_source, source_kind
from umlos_cuda.cli import main
from umlos_cuda.errors import UmlosError
from umlos_cuda.remote.lengths import RemoteSidecar

KINDS = ("store", "sharded", "megatron", "sidecar")
BUILD = ("plan", "build", "--window", "16", "--bucket-edges", "64,128", "--overflow-max", "1024",
         "--token-budget", "2048", "--epochs", "2", "--quiet", "--lengths")


@pytest.fixture(scope="module")
def local(tmp_path_factory) -> dict[str, str]:
    """Each kind on disk (tests/token_cases.py), and the store's length sidecar."""
    sources = write_token_sources(tmp_path_factory.mktemp("remote-plans"))
    return {**sources, "sidecar": os.path.join(sources["store"], "lengths.jsonl.u32")}


@pytest.fixture(scope="module")
def remote(local, object_store) -> dict[str, str]:
    """The URL of each kind in one bucket."""
    bucket = object_store.bucket()
    for suffix in (".idx", ".bin"):
        with open(local["megatron"] + suffix, "rb") as handle:
            object_store.put(bucket, f"meg/web{suffix}", handle.read())
    return {"store": object_store.upload_folder(local["store"], bucket, "store"),
            "sharded": object_store.upload_folder(local["sharded"], bucket, "sharded"),
            "megatron": f"s3://{bucket}/meg/web", "sidecar": f"s3://{bucket}/store/lengths.jsonl.u32"}


@pytest.mark.parametrize("kind", KINDS)
def test_a_windowed_plan_of_a_url_is_the_plan_of_the_local_path(local, remote, kind, tmp_path, capsys):
    here, there = tmp_path / "here", tmp_path / "there"
    assert main([*BUILD, local[kind], "--output", str(here)]) == 0
    assert main([*BUILD, remote[kind], "--output", str(there)]) == 0
    mine, theirs = (json.loads((folder / "meta.json").read_text()) for folder in (here, there))
    assert theirs["lengths_path"] == remote[kind]  # recorded as given: reopened from the URL
    assert theirs["fingerprint"] == mine["fingerprint"] and theirs["lengths"] == mine["lengths"]
    assert (there / "index.npy").read_bytes() == (here / "index.npy").read_bytes()
    capsys.readouterr()
    assert main(["plan", "verify", str(there)]) == 0
    printed = capsys.readouterr().out
    assert theirs["fingerprint"] in printed and "lengths hash to their binding" in printed


def test_a_sidecar_url_is_its_own_kind_read_once(remote, object_store):
    url = remote["sidecar"]
    assert source_kind(url).name == "remote length sidecar"
    object_store.proxy.reset()
    source = open_source(url)
    assert isinstance(source, RemoteSidecar) and source.count == 90
    source.take(np.arange(90))
    gets = [r.span for r in object_store.proxy.gets("lengths.jsonl.u32")]
    assert gets[:2] == [(0, 12), (12, 12 + gets[1][1] - 12)]  # the preamble, then the header alone
    assert len(gets) == 3  # then the length bytes, once (hashed at opening, kept)


def test_a_length_cache_jsonl_url_is_refused_naming_its_sidecar(remote):
    url = remote["sidecar"].removesuffix(".u32")
    with pytest.raises(UmlosError) as info:
        open_source(url)
    assert info.value.code == errors.REMOTE_UNAVAILABLE and f"{url}.u32" in info.value.message
