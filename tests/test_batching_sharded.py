"""Sharded token stores and several Megatron prefixes (docs/batching.md, "Sharded token stores").

* Equality: 3 shards plus 1 appended give, byte for byte, the store that
  tokenizing the 4 files at once gives, and the same length cache (ids,
  lengths, logical dataset hash), plan fingerprint and batch fingerprint as
  the same rows adopted as ONE shard (the store ``tokenize_dataset`` writes
  from the whole dataset); each shard is byte for byte the store
  ``tokenize_shard`` writes alone.
* Global rows: any cut of the same rows into shards reads back as their
  concatenation and keeps the logical dataset hash (hypothesis).
* Refusals with their codes: another tokenizer, dtype or loss-mask rule, a
  repeated id, a tampered shard, index or digest file, a missing or
  symlinked shard.
* Crash safety: an append interrupted before the index is replaced (an
  exception; a SIGKILL of the process) leaves the old store valid and
  unchanged, and the orphan a SIGKILL leaves is adopted in place.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batching_cases import expect, train_tokenizer, write_model_dir
from token_cases import random_sequences, records, write_megatron
from umlos_cuda import errors
from umlos_cuda.batching import BatchingConfig, BatchPlanBuilder
from umlos_cuda.batching.batches.fingerprint import fingerprint_plan_batches
from umlos_cuda.batching.batches.reader import BatchReader
from umlos_cuda.hashing import sha256_array
from umlos_cuda.batching.tokens import adopt
from umlos_cuda.batching.tokens.concat import ConcatenatedSource
from umlos_cuda.batching.tokens.megatron import MegatronDataset, MegatronDatasetList
from umlos_cuda.batching.tokens.sharded import (SHARDED_FORMAT, ShardedTokenStore, append_shards, tokenize_shard,
                                                tokenize_sharded)
from umlos_cuda.batching.tokens.sources import open_token_source
from umlos_cuda.batching.tokens.store import TokenStore
from umlos_cuda.batching.tokens.writer import tokenize_dataset
from umlos_cuda.cli import main

SFT = {"prompt_field": "prompt", "response_field": "response"}
CUTS = ((0, 40), (40, 100), (100, 130), (130, 180))
CONFIG = BatchingConfig.throughput(1024, (32, 64), 128)


def write_jsonl(path, rows, *, ids: bool = False) -> str:
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row if ids else {k: v for k, v in row.items() if k != "id"}) + "\n")
    return str(path)


def tree(folder) -> dict[str, str]:
    """Every file under ``folder`` (relative path -> SHA-256 of its bytes); a link is named as such."""
    out = {}
    for base, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(base, name)
            key = os.path.relpath(path, folder)
            if os.path.islink(path):
                out[key] = "link -> " + os.readlink(path)
            elif os.path.isfile(path):
                out[key] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded")
    write_model_dir(root / "model", train_tokenizer(), {"eos_token": "</s>"})
    write_model_dir(root / "other", train_tokenizer(280), {"eos_token": "</s>"})
    rows = records(180, seed=4)
    files = [write_jsonl(root / f"train-{i:05d}-of-00004.jsonl", rows[a:b]) for i, (a, b) in enumerate(CUTS)]
    return root, rows, files


@pytest.fixture(scope="module")
def stores(work):
    """(3 shards + 1 appended, the 4 files at once, the whole dataset adopted as one shard)."""
    root, _, files = work
    three = tokenize_sharded(files[:3], root / "model", root / "three", chunk_size=16, **SFT)
    assert three.num_parts == 3 and len(three) == 130
    plus = tokenize_sharded(files[3:], root / "model", root / "three", append=True, chunk_size=16, **SFT)
    at_once = tokenize_sharded(files, root / "model", root / "at-once", **SFT)
    tokenize_dataset(files, root / "model", root / "whole", **SFT)
    one = append_shards(root / "one", [root / "whole"], create=True)
    return plus, at_once, one


def test_append_onto_a_classic_store_says_what_to_do_instead(work, tmp_path, capsys):
    """--append onto a classic store said only that its format was another one."""
    root, rows, files = work
    numbered = str(tmp_path / "numbered")
    assert main(["data", "tokenize", "--dataset", files[0], "--tokenizer", str(root / "model"), "--output", numbered,
                 "--quiet", *("--prompt-field", "prompt", "--response-field", "response")]) == 0
    extra = ["--tokenizer", str(root / "model"), "--quiet", "--prompt-field", "prompt", "--response-field", "response"]
    assert main(["data", "tokenize", "--dataset", files[1], "--output", numbered, "--append", *extra]) == 2
    said = capsys.readouterr().err
    assert "error SHARDED_STORE_INVALID:" in said and "is a token store, not a sharded one" in said
    assert "named by row number" in said and "in a new folder (--sharded" in said  # it takes no second shard
    with_ids = write_jsonl(tmp_path / "ids.jsonl", rows[:40], ids=True)
    named = str(tmp_path / "named")
    assert main(["data", "tokenize", "--dataset", with_ids, "--output", named, *extra]) == 0
    capsys.readouterr()
    more = write_jsonl(tmp_path / "more.jsonl", rows[40:60], ids=True)
    assert main(["data", "tokenize", "--dataset", more, "--output", named, "--append", *extra]) == 2
    said = capsys.readouterr().err
    command = f"umlos-cuda data append --create NEW {named}"
    assert command in said and "then --append the new files to NEW" in said
    # what it says works: the store becomes the first shard, the new file is appended
    assert main(["data", "append", "--create", str(tmp_path / "NEW"), named]) == 0
    assert main(["data", "tokenize", "--dataset", more, "--output", str(tmp_path / "NEW"), "--append", *extra]) == 0
    assert len(ShardedTokenStore.open(tmp_path / "NEW")) == 60
    expect(errors.SHARDED_STORE_INVALID, tokenize_sharded, more, root / "model", tmp_path / "numbered", append=True,
           mention="is a token store, not a sharded one", **SFT)


def plan_and_batches(source):
    plan = BatchPlanBuilder(source.length_cache(), CONFIG).build(2)
    return plan, fingerprint_plan_batches(plan, source, 50)


# ====================================================================== equality
def test_three_plus_one_is_byte_for_byte_the_four_at_once(stores):
    plus, at_once, _ = stores
    assert tree(plus.root) == tree(at_once.root)
    assert sorted(os.listdir(plus.root)) == ["digests", "meta.json", "shards", "umlos-artifact.json"]
    assert sorted(os.listdir(os.path.join(plus.root, "shards"))) == ["00000", "00001", "00002", "00003"]
    assert not [name for name in os.listdir(os.path.dirname(plus.root)) if name.startswith(".tmp-")]


def test_each_shard_is_the_store_tokenize_shard_writes_alone(work, stores, tmp_path):
    root, _, files = work
    plus = stores[0]
    for index in range(4):
        alone = tokenize_shard(files, index, root / "model", tmp_path / f"s{index}", **SFT)
        assert tree(alone.root) == tree(plus.shard_path(index))
        assert TokenStore.open(plus.shard_path(index)).verify()["samples"] == CUTS[index][1] - CUTS[index][0]


def test_three_plus_one_equals_the_rows_adopted_as_one_shard(stores, tmp_path, capsys):
    plus, _, one = stores
    assert one.num_parts == 1 and plus.num_parts == 4
    a, b = plus.length_cache(), one.length_cache()
    assert a.sample_ids == b.sample_ids and len(set(a.sample_ids)) == 180
    assert a.sample_ids[40] == b.sample_ids[40] and a.sample_ids[40].endswith(":0")  # content-hash ids
    assert np.array_equal(a.lengths, b.lengths) and a.tokenizer_hash == b.tokenizer_hash
    assert a.dataset_hash == b.dataset_hash == plus.dataset_hash == one.dataset_hash
    assert plus.meta["dataset_hash"] == json.loads(Path(one.root, "meta.json").read_text())["dataset_hash"]
    for row in (0, 39, 40, 99, 100, 179):
        for x, y in zip(plus.arrays(row), one.arrays(row)):
            assert np.array_equal(x, y)
        assert plus.sample_id(row) == one.sample_id(row)
    (plan_a, batches_a), (plan_b, batches_b) = plan_and_batches(plus), plan_and_batches(one)
    assert plan_a.fingerprint == plan_b.fingerprint and batches_a.fingerprint == batches_b.fingerprint
    # the same through the commands: plan build --source DIR, batch generate --source DIR
    out = {}
    for name, store in (("plus", plus), ("one", one)):
        assert main(["plan", "build", "--lengths", store.root, "--bucket-edges", "32,64", "--overflow-max", "128",
                     "--token-budget", "1024", "--epochs", "2", "--output", str(tmp_path / f"plan-{name}"),
                     "--quiet"]) == 0
        assert main(["batch", "generate", "--plan", str(tmp_path / f"plan-{name}"), "--store", store.root,
                     "--output", str(tmp_path / f"batches-{name}"), "--quiet"]) == 0
        assert main(["batch", "check", str(tmp_path / f"batches-{name}"), "--store", store.root]) == 0
        out[name] = capsys.readouterr().out
    reader_a, reader_b = BatchReader(tmp_path / "batches-plus"), BatchReader(tmp_path / "batches-one")
    assert reader_a.plan_fingerprint == reader_b.plan_fingerprint
    assert reader_a.index["batch_fingerprint"] == reader_b.index["batch_fingerprint"]
    assert [line for line in out["plus"].splitlines() if "fingerprint" in line] == \
        [line for line in out["one"].splitlines() if "fingerprint" in line]


def test_verify_pickle_and_open_token_source(stores):
    plus = stores[0]
    report = plus.verify()
    assert report == {"samples": 180, "tokens": plus.num_tokens, "tokenizer_hash": plus.tokenizer_hash, "shards": 4}
    again = pickle.loads(pickle.dumps(plus))
    assert isinstance(again, ShardedTokenStore) and again.root == plus.root
    assert np.array_equal(again.arrays(150)[0], plus.arrays(150)[0])
    opened = open_token_source(plus.root)
    assert isinstance(opened, ShardedTokenStore) and len(opened) == 180
    assert plus.meta["format"] == SHARDED_FORMAT and plus.num_tokens == int(plus.lengths.sum())


def test_global_rows_read_the_shards_rows(stores):
    """The fast read path (plain views of each shard's maps) gives what each shard's own reader gives."""
    plus = ShardedTokenStore.open(stores[0].root)
    row = 0
    for index, (a, b) in enumerate(CUTS):
        shard = TokenStore.open(plus.shard_path(index))
        for local in range(b - a):
            for x, y in zip(plus.arrays(row), shard.arrays(local)):
                assert np.array_equal(x, y) and not x.flags.writeable
            assert plus.sample_id(row) == shard.sample_id(local) and plus.locate(row) == (index, local)
            row += 1
    assert [x.tolist() for x in plus.arrays(np.int64(41))] == [x.tolist() for x in plus.arrays(41)]
    for bad in (-1, 180, 1.5, True, "3"):
        expect(errors.SHARDED_STORE_INVALID, plus.arrays, bad, mention="rows are 0 to 179")


def test_shards_open_lazily(stores):
    store = ShardedTokenStore.open(stores[0].root)
    assert len(store) == 180 and store._parts == [None] * 4
    store.arrays(45)
    assert [part is not None for part in store._parts] == [False, True, False, False]


# ====================================================================== global rows
def fake_part(sizes, seed):
    rng = np.random.default_rng(seed)

    class Part:
        def __init__(self):
            self.rows = [rng.integers(0, 1000, int(n), dtype=np.uint16) for n in sizes]
            self.lengths = np.array(sizes, dtype=np.uint32)

        def arrays(self, row):
            return self.rows[row], np.ones(len(self.rows[row]), dtype=np.uint8)

        def sample_id(self, row):
            return f"{seed}-{row}"

    return Part()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=7), min_size=1, max_size=6))
def test_global_rows_are_the_concatenation(parts_sizes):
    parts = [fake_part(sizes, seed) for seed, sizes in enumerate(parts_sizes)]
    source = ConcatenatedSource([len(p.lengths) for p in parts], parts.__getitem__, tokenizer_hash="t",
                                ids_are_line_numbers=False, dataset_hash=None, fail=ValueError, where="x")
    flat = [(p, r) for p in parts for r in range(len(p.lengths))]
    assert len(source) == len(flat)
    assert np.array_equal(source.lengths, np.concatenate([p.lengths for p in parts]))
    for row, (part, local) in enumerate(flat):
        assert np.array_equal(source.arrays(row)[0], part.arrays(local)[0])
        assert source.sample_id(row) == part.sample_id(local)
    for bad in (-1, len(flat), 1.5, True):
        with pytest.raises(ValueError):
            source.arrays(bad)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(1, 30), min_size=1, max_size=4))
def test_any_cut_into_shards_reads_back_the_same_rows_and_hash(work, stores, tmp_path_factory, sizes):
    """Rows with ids (so the ids do not depend on the cut): every cut gives the one-shard store's rows,
    ids and logical dataset hash."""
    root, rows, _ = work
    folder = tmp_path_factory.mktemp("cut")
    rows = rows[:sum(sizes)]
    files, start = [], 0
    for i, size in enumerate(sizes):
        files.append(write_jsonl(folder / f"part-{i}.jsonl", rows[start:start + size], ids=True))
        start += size
    cut = tokenize_sharded(files, root / "model", folder / "cut", **SFT)
    whole = write_jsonl(folder / "whole.jsonl", rows, ids=True)
    tokenize_dataset(whole, root / "model", folder / "classic", **SFT)
    one = append_shards(folder / "one", [folder / "classic"], create=True)
    assert cut.num_parts == len(sizes) and cut.dataset_hash == one.dataset_hash
    assert cut.length_cache().sample_ids == [row["id"] for row in rows]
    for row in range(len(rows)):
        for x, y in zip(cut.arrays(row), one.arrays(row)):
            assert np.array_equal(x, y)
    cut.verify()


# ====================================================================== refusals
@pytest.fixture
def small(work, tmp_path):
    """A store of the first two files, and a staged store of the third (tmp_path/staged)."""
    root, _, files = work
    store = tokenize_sharded(files[:2], root / "model", tmp_path / "store", **SFT)
    tokenize_shard(files, 2, root / "model", tmp_path / "staged", **SFT)
    return store, tmp_path / "staged"


def rewrite_tokens_as_uint32(folder) -> None:
    """Rewrite a store's tokens as uint32, consistently (digest and dtype in meta.json)."""
    tokens = np.load(folder / "tokens.npy").astype("<u4")
    os.remove(folder / "tokens.npy")
    np.save(folder / "tokens.npy", tokens)
    meta = json.loads((folder / "meta.json").read_text())
    meta.update(token_dtype="<u4", tokens_sha256=sha256_array(tokens))
    (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


def test_a_store_of_another_tokenizer_dtype_or_mask_rule_is_refused(work, small, tmp_path):
    root, _, files = work
    store, _ = small
    before = tree(store.root)
    tokenize_shard(files, 2, root / "other", tmp_path / "tok", **SFT)
    expect(errors.SHARDED_STORE_MISMATCH, append_shards, store.root, [tmp_path / "tok"], mention="tokenizer_hash")
    tokenize_shard(files, 2, root / "model", tmp_path / "mask")  # text records: loss_mask "all"
    expect(errors.SHARDED_STORE_MISMATCH, append_shards, store.root, [tmp_path / "mask"], mention="loss_mask")
    tokenize_shard(files, 2, root / "model", tmp_path / "wide", **SFT)
    rewrite_tokens_as_uint32(tmp_path / "wide")
    assert TokenStore.open(tmp_path / "wide").verify()
    expect(errors.SHARDED_STORE_MISMATCH, append_shards, store.root, [tmp_path / "wide"], mention="token_dtype")
    assert tree(store.root) == before and os.path.isdir(tmp_path / "tok")


def test_a_repeated_id_is_refused(work, small, tmp_path):
    root, _, files = work
    store, staged = small
    tokenize_shard(files, 1, root / "model", tmp_path / "again", **SFT)  # shard 1 a second time
    expect(errors.SHARDED_STORE_MISMATCH, append_shards, store.root, [staged, tmp_path / "again"],
           mention="is already in")
    expect(errors.SHARDED_STORE_MISMATCH, append_shards, store.root, [staged, staged], mention="named twice")
    assert ShardedTokenStore.open(store.root).num_parts == 2


def test_row_number_ids_make_a_one_shard_store(work, tmp_path):
    root, _, files = work
    single = tokenize_sharded(files[0], root / "model", tmp_path / "single", **SFT)
    assert single.ids_are_line_numbers and single.sample_id(7) == "7"
    tokenize_shard(files[1], 0, root / "model", tmp_path / "next", **SFT)
    expect(errors.SHARDED_STORE_MISMATCH, append_shards, single.root, [tmp_path / "next"], mention="row number")
    tokenize_shard(files, 1, root / "model", tmp_path / "content", **SFT)
    expect(errors.SHARDED_STORE_MISMATCH, append_shards, single.root, [tmp_path / "content"],
           mention="sample_ids")


def test_a_shard_copied_over_another_and_rehashed_is_named_by_every_reader(small, tmp_path, capsys):
    """Every hash of the index agrees (it was rewritten); the repeated sample ids give it away, and the refusal
    names the store and both shards wherever the ids are read: a plan build, verify, a length cache."""
    from token_cases import copy_shard_rehashed

    store, _ = small
    shutil.copytree(store.root, tmp_path / "copied")
    copy_shard_rehashed(tmp_path / "copied", 0, 1)
    root = str(tmp_path / "copied")
    named = [root, os.path.join(root, "shards", "00000"), os.path.join(root, "shards", "00001")]
    for call in (ShardedTokenStore.open(root).verify, ShardedTokenStore.open(root).length_cache):
        error = expect(errors.SHARDED_STORE_INVALID, call, mention="the ids of the parts read as one must differ")
        assert all(name in error.message for name in named), error.message
    assert main(["plan", "build", "--source", root, "--bucket-edges", "64,128", "--overflow-max", "256",
                 "--token-budget", "512", "--output", str(tmp_path / "plan"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error {errors.SHARDED_STORE_INVALID}: {root}: sample id ") and named[2] in err


def test_a_tampered_shard_is_found(small):
    store, _ = small
    path = os.path.join(store.shard_path(1), "tokens.npy")
    data = bytearray(Path(path).read_bytes())
    data[-1] ^= 1
    Path(path).write_bytes(bytes(data))
    expect(errors.TOKEN_STORE_INVALID, ShardedTokenStore.open(store.root).verify, mention="tokens.npy")
    expect(errors.TOKEN_STORE_INVALID, TokenStore.open(store.shard_path(1)).verify)  # verifiable on its own


def test_a_shard_swapped_for_another_store_is_found(small):
    store, staged = small
    shard = store.shard_path(1)
    shutil.rmtree(shard)
    shutil.copytree(staged, shard)
    expect(errors.SHARDED_STORE_INVALID, ShardedTokenStore.open(store.root).arrays, 45, mention="meta_sha256")


@pytest.mark.parametrize("edit, mention", [
    (lambda meta: meta.update(dataset_hash="0" * 64), "dataset_hash is not the hash"),
    (lambda meta: meta["shards"][1].update(row_digests_sha256="0" * 64), "row_digests_sha256"),
])
def test_a_tampered_index_is_found_by_verify(small, edit, mention):
    store, _ = small
    path = os.path.join(store.root, "meta.json")
    meta = json.loads(Path(path).read_text())
    edit(meta)
    Path(path).write_text(json.dumps(meta))
    expect(errors.SHARDED_STORE_INVALID, ShardedTokenStore.open(store.root).verify, mention=mention)


@pytest.mark.parametrize("edit, mention", [
    (lambda meta: meta.update(num_samples=meta["num_samples"] + 1), "not the sums"),
    (lambda meta: meta["shards"][1].update(name="../../x"), "is not '00001'"),
    (lambda meta: meta.update(format="umlos_cuda.token_store/1"), "format"),
    (lambda meta: meta.update(shards=[]), "non-empty list"),
    (lambda meta: meta.update(extra=1), "unknown extra"),
    (lambda meta: meta["shards"][0].update(num_samples=0), "positive"),
    (lambda meta: meta.update(sample_ids="line_numbers"), "one shard"),
    (lambda meta: meta.update(token_dtype="<f4"), "token_dtype"),
])
def test_a_malformed_index_is_refused_on_open(small, edit, mention):
    store, _ = small
    path = os.path.join(store.root, "meta.json")
    meta = json.loads(Path(path).read_text())
    edit(meta)
    Path(path).write_text(json.dumps(meta))
    expect(errors.SHARDED_STORE_INVALID, ShardedTokenStore.open, store.root, mention=mention)


@pytest.mark.parametrize("which, field", [("digests_path", "row_digests_sha256"),
                                          ("id_hashes_path", "id_hashes_sha256")])
def test_a_tampered_digest_file_is_found(small, which, field):
    store, staged = small
    path = getattr(store, which)(0)
    data = bytearray(Path(path).read_bytes())
    data[-1] ^= 1
    Path(path).write_bytes(bytes(data))
    expect(errors.SHARDED_STORE_INVALID, ShardedTokenStore.open(store.root).verify, mention=field)
    expect(errors.SHARDED_STORE_INVALID, append_shards, store.root, [staged], mention=field)
    assert os.path.isdir(staged)


def test_a_missing_or_symlinked_shard_is_refused(small, tmp_path):
    store, staged = small
    shard = store.shard_path(1)
    shutil.copytree(shard, tmp_path / "copy")
    shutil.rmtree(shard)
    expect(errors.SHARDED_STORE_INVALID, ShardedTokenStore.open(store.root).arrays, 50, mention="is missing")
    assert ShardedTokenStore.open(store.root).arrays(0)  # the other shard still reads
    os.symlink(tmp_path / "copy", shard)
    expect(errors.SHARDED_STORE_INVALID, ShardedTokenStore.open(store.root).arrays, 50, mention="symbolic link")
    os.symlink(staged, tmp_path / "link")
    expect(errors.SHARDED_STORE_INVALID, append_shards, store.root, [tmp_path / "link"], mention="symbolic link")


def test_create_rules(work, small, tmp_path):
    root, _, files = work
    store, staged = small
    expect(errors.OUTPUT_EXISTS, append_shards, store.root, [staged], create=True)
    os.makedirs(tmp_path / "plain")
    (tmp_path / "plain" / "x").write_text("x")
    expect(errors.OUTPUT_PATH_INVALID, append_shards, tmp_path / "plain", [staged], create=True, force=True)
    expect(errors.TOKEN_STORE_NOT_FOUND, append_shards, tmp_path / "nothing", [staged])
    expect(errors.INVALID_ARGUMENT, append_shards, store.root, [])
    expect(errors.INVALID_ARGUMENT, tokenize_shard, files, 4, root / "model", tmp_path / "x")
    tokenize_shard(files, 1, root / "model", tmp_path / "again", **SFT)
    tokenize_shard(files, 1, root / "model", tmp_path / "twice", **SFT)
    before = tree(store.root)
    expect(errors.SHARDED_STORE_MISMATCH, append_shards, store.root, [tmp_path / "again", tmp_path / "twice"],
           create=True, force=True, mention="is already in")  # refused before the old store is replaced
    expect(errors.SHARDED_STORE_MISMATCH, append_shards, tmp_path / "new", [tmp_path / "again", tmp_path / "twice"],
           create=True, mention="is already in")
    assert tree(store.root) == before and not os.path.exists(tmp_path / "new")
    assert os.path.isdir(tmp_path / "again") and os.path.isdir(tmp_path / "twice")
    replaced = append_shards(store.root, [staged], create=True, force=True)
    assert replaced.num_parts == 1 and not os.path.exists(staged)


def test_empty_files_have_no_shard(work, tmp_path):
    root, _, files = work
    empty = tmp_path / "train-00001-empty.jsonl"
    empty.write_text("")
    store = tokenize_sharded([files[0], str(empty), files[1]], root / "model", tmp_path / "s", **SFT)
    assert store.num_parts == 2 and len(store) == 100
    expect(errors.DATASET_EMPTY, tokenize_shard, [files[0], str(empty)], 1, root / "model", tmp_path / "e")


# ====================================================================== crash safety
def test_an_append_interrupted_before_the_index_leaves_the_store_unchanged(small, monkeypatch):
    store, staged = small
    before, staged_before = tree(store.root), tree(staged)
    cache_before = store.length_cache()

    def interrupted(folder, data):
        raise KeyboardInterrupt

    monkeypatch.setattr(adopt, "_replace_index", interrupted)
    with pytest.raises(KeyboardInterrupt):
        append_shards(store.root, [staged])
    assert tree(store.root) == before and tree(staged) == staged_before  # moved back, digests removed
    again = ShardedTokenStore.open(store.root)
    assert again.verify()["shards"] == 2 and again.length_cache().sample_ids == cache_before.sample_ids
    monkeypatch.undo()
    assert append_shards(store.root, [staged]).num_parts == 3


def test_an_append_killed_before_the_index_leaves_the_store_valid(work, small, tmp_path):
    root, _, files = work
    store, staged = small
    index_before = Path(store.root, "meta.json").read_bytes()
    old_tree = tree(store.root)
    script = textwrap.dedent(f"""
        import os, signal
        from umlos_cuda.batching.tokens import adopt
        adopt._replace_index = lambda folder, data: os.kill(os.getpid(), signal.SIGKILL)
        adopt.append_shards({store.root!r}, [{str(staged)!r}])
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
    result = subprocess.run([sys.executable, "-c", script], env=env, timeout=120, capture_output=True)
    assert result.returncode == -9, result.stderr.decode()
    assert Path(store.root, "meta.json").read_bytes() == index_before
    for name, digest in old_tree.items():  # every file the store had is unchanged
        assert tree(store.root)[name] == digest
    reopened = ShardedTokenStore.open(store.root)
    assert reopened.verify()["shards"] == 2 and len(reopened) == 100
    orphan = os.path.join(store.root, "shards", "00002")
    assert os.path.isdir(orphan) and not os.path.exists(staged)  # moved, never listed
    assert os.path.isfile(os.path.join(store.root, ".lock"))  # left, unlocked: the kernel dropped the lock
    adopt_it = f"`umlos-cuda data append {store.root} {orphan}`"
    # the same command again: its folder is gone, and the refusal names where it went and how to adopt it
    expect(errors.SHARDED_STORE_INVALID, append_shards, store.root, [staged], mention=adopt_it)
    tokenize_shard(files, 2, root / "model", tmp_path / "restaged", **SFT)
    expect(errors.SHARDED_STORE_INVALID, append_shards, store.root, [tmp_path / "restaged"],
           mention=adopt_it)  # the orphan is never overwritten
    assert os.path.isdir(tmp_path / "restaged") and tree(store.root).keys() >= old_tree.keys()
    assert main(adopt_it.strip("`").split()[1:]) == 0  # the command the message gives adopts it in place
    adopted = ShardedTokenStore.open(store.root)
    assert adopted.num_parts == 3 and adopted.verify()["samples"] == 130
    assert not os.path.lexists(os.path.join(store.root, ".lock"))  # the killed append's lock file taken over, removed


# ====================================================================== commands
def test_the_commands(work, tmp_path, capsys):
    root, _, files = work
    model = str(root / "model")
    assert main(["data", "tokenize", "--dataset", *files[:3], "--tokenizer", model, "--output",
                 str(tmp_path / "s"), "--sharded", "--quiet", "--prompt-field", "prompt", "--response-field",
                 "response"]) == 0
    assert "wrote 3 shards (130 samples) as sharded token store" in capsys.readouterr().out
    assert main(["data", "tokenize", "--dataset", files[3], "--tokenizer", model, "--output", str(tmp_path / "s"),
                 "--append", "--quiet", "--prompt-field", "prompt", "--response-field", "response"]) == 0
    out = capsys.readouterr().out
    assert "appended 1 shard (50 samples) to sharded token store" in out and "180 samples in 4 shards" in out
    assert main(["data", "verify", str(tmp_path / "s")]) == 0
    assert "180 samples in 4 shards" in capsys.readouterr().out
    tokenize_dataset(files, model, tmp_path / "whole", **SFT)
    assert main(["data", "append", str(tmp_path / "one"), str(tmp_path / "whole"), "--create"]) == 0
    assert ShardedTokenStore.open(tmp_path / "one").dataset_hash == ShardedTokenStore.open(tmp_path / "s").dataset_hash
    capsys.readouterr()
    assert main(["data", "append", str(tmp_path / "one"), str(tmp_path / "s"), "--force"]) == 2
    assert "error INVALID_ARGUMENT" in capsys.readouterr().err
    assert main(["data", "tokenize", "--dataset", files[3], "--tokenizer", model, "--output", str(tmp_path / "s"),
                 "--append", "--quiet", "--prompt-field", "prompt", "--response-field", "response"]) == 2
    assert "error SHARDED_STORE_MISMATCH" in capsys.readouterr().err
    assert main(["data", "verify", str(tmp_path / "none")]) == 2
    assert "error TOKEN_STORE_NOT_FOUND" in capsys.readouterr().err


# ====================================================================== several Megatron prefixes
def test_several_megatron_prefixes_are_one_dataset(tmp_path, capsys):
    parts = [random_sequences(n, seed=s, vocab=3000, high=120) for n, s in ((70, 1), (1, 2), (50, 3))]
    prefixes = [write_megatron(tmp_path / f"m{i}", seqs, dtype)
                for i, (seqs, dtype) in enumerate(zip(parts, (np.uint16, np.int32, np.uint16)))]
    flat = [seq for seqs in parts for seq in seqs]
    listed = open_token_source(prefixes)
    assert isinstance(listed, MegatronDatasetList) and len(listed) == 121
    for row, seq in enumerate(flat):
        ids, mask = listed.arrays(row)
        assert ids.tolist() == seq and mask.all() and listed.sample_id(row) == str(row)
    assert listed.length_cache().lengths.tolist() == [len(s) for s in flat]
    assert pickle.loads(pickle.dumps(listed)).arrays(70)[0].tolist() == flat[70]
    assert listed.verify()["samples"] == 121 and isinstance(open_token_source(prefixes[:1]), MegatronDataset)
    expect(errors.MEGATRON_INDEX_INVALID, MegatronDatasetList.open, [prefixes[0], prefixes[0]], mention="named twice")
    lengths = tmp_path / "lengths.jsonl"
    assert main(["data", "megatron", *prefixes, "--output", str(lengths)]) == 0
    assert "121 sequences (121 documents)" in capsys.readouterr().out
    assert main(["plan", "build", "--lengths", str(lengths), "--bucket-edges", "64", "--overflow-max", "128",
                 "--token-budget", "1024", "--output", str(tmp_path / "plan"), "--quiet"]) == 0
    assert main(["batch", "generate", "--plan", str(tmp_path / "plan"), "--store", *prefixes,
                 "--output", str(tmp_path / "out"), "--quiet"]) == 0
    assert main(["batch", "check", str(tmp_path / "out"), "--store", *prefixes]) == 0
    assert main(["batch", "generate", "--plan", str(tmp_path / "plan"), "--store", prefixes[0],
                 "--output", str(tmp_path / "out2"), "--quiet"]) == 2
    assert "error BATCH_STORE_MISMATCH" in capsys.readouterr().err
    seen = 0
    for batch in BatchReader(tmp_path / "out").iter_epoch(0):
        for b, row in enumerate(batch["rows"].tolist()):
            assert batch["input_ids"][b, :len(flat[row])].tolist() == flat[row]
            seen += 1
    assert seen == 121


def test_a_torch_dataloader_reads_a_sharded_store_in_workers(stores):
    """A worker process gets the store by pickle (its path) and reads global rows from its shards."""
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from umlos_cuda.torch import TokenDataset

    plus = stores[0]
    dataset = TokenDataset(plus.root)
    assert isinstance(dataset.source, ShardedTokenStore) and len(dataset) == 180
    rows = [0, 39, 40, 129, 130, 179]
    loader = DataLoader(dataset, batch_size=None, sampler=rows, num_workers=1, collate_fn=lambda item: item)
    for row, (got, ids, mask) in zip(rows, loader):
        assert got == row and np.array_equal(ids, plus.arrays(row)[0]) and np.array_equal(mask, plus.arrays(row)[1])
