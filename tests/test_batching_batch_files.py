"""Batch files and batch fingerprints (docs/batching.md, "Batch files", "Fingerprints").

* store -> plan -> batch files -> reader: every file is its microbatch
  collated from the store, files are byte-identical whatever the number of
  writer threads, the reader's fingerprint is the plan's and the store's;
* the reader: random access, epochs, a rank's shard, verification that
  finds every kind of damage;
* a writer killed mid-run (SIGKILL, in a child process) leaves finished
  files only; the next run keeps them (verified byte for byte), removes the
  temp files, rewrites a damaged one and ends with the uninterrupted files;
* fingerprints: the documented canonical bytes, save/load, a mismatch names
  the first differing microbatch; every failure code of the block.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from batching_cases import expect
from token_cases import make_store
from umlos_cuda import errors
from umlos_cuda.batching import BatchingConfig, BatchPlanBuilder, save_plan, shard_plan
from umlos_cuda.batching.batches.npz import batch_file_name, npz_bytes, read_batch_file
from umlos_cuda.batching.batches.fingerprint import (BatchFingerprint, batch_fingerprint, compute_batch_fingerprint,
                                                   fingerprint_plan_batches, microbatch_digest,
                                                   verify_batch_fingerprint)
from umlos_cuda.batching.batches.reader import BatchReader
from umlos_cuda.batching.batches.writer import BatchWriter, write_batches
from umlos_cuda.batching.collate import FIELDS, collate_microbatch
from umlos_cuda.batching.tokens.writer import NPY_HEADER_BYTES
from umlos_cuda.cli import main
from umlos_cuda.files.artifacts import MARKER

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = BatchingConfig.predictable(token_budget=1024, bucket_edges=(32, 64, 128), overflow_max=256, seed=7)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A token store, a 2-epoch plan over it (saved), and its batch files."""
    root = tmp_path_factory.mktemp("batches")
    store = make_store(root, 240, seed=4)
    plan = BatchPlanBuilder(store.length_cache(), CONFIG).build(2)
    save_plan(plan, root / "plan")
    report = BatchWriter(root / "plan", root / "out", root / "store", workers=3, layout="npz").write_all()
    return root, store, plan, report


def npz_files(folder) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.endswith(".npz") and not name.startswith("."))


# ====================================================================== round trip
def test_store_plan_files_reader_round_trip(world):
    root, store, plan, report = world
    assert report.files == plan.total_microbatches == report.written and report.kept == report.rewritten == 0
    reader = BatchReader(root / "out")
    assert len(reader) == plan.total_microbatches and reader.num_epochs == 2
    sequence = []
    for epoch in range(2):
        microbatches = list(plan.iter_epoch(epoch))
        files = list(reader.iter_epoch(epoch))
        assert len(files) == len(microbatches)
        for mb, arrays in zip(microbatches, files):
            batch = collate_microbatch(store, mb)
            for name in FIELDS:
                assert np.array_equal(arrays[name], getattr(batch, name)), name
            assert arrays["sample_ids"].tolist() == list(mb.samples) and arrays["rows"].tolist() == mb.rows.tolist()
            assert (int(arrays["epoch"]), int(arrays["index"]), int(arrays["bucket_id"]), int(arrays["max_len"])) == \
                (epoch, mb.index, mb.bucket_id, mb.max_len)
            assert arrays["fingerprint"].item() == microbatch_digest(batch.input_ids, batch.loss_mask)
            assert arrays["plan_fingerprint"].item() == plan.fingerprint
            sequence.append(batch)
    expected = fingerprint_plan_batches(plan, store)
    assert reader.fingerprint == report.fingerprint == expected
    assert compute_batch_fingerprint(reader) == compute_batch_fingerprint(sequence) == expected.fingerprint
    assert expected.positions[:3] == ((0, 0), (0, 1), (0, 2)) and expected.n_batches == 100
    assert len(expected.digests) == min(100, plan.total_microbatches)  # the plan has fewer
    assert expected.positions[len(plan.epochs[0])] == (1, 0)  # the sequence runs on into epoch 1
    assert fingerprint_plan_batches(plan, store, 5).digests == expected.digests[:5]
    assert npz_files(root / "out")[0] == "epoch_0_batch_0000.npz" and batch_file_name(1, 12345) == \
        "epoch_1_batch_12345.npz"
    assert sorted(os.listdir(root / "out")) == sorted(["batches.json", "plan", MARKER] + npz_files(root / "out"))
    assert reader.verify(root / "store")["files"] == len(reader)


def test_files_are_byte_identical_whatever_the_threads(world, tmp_path):
    root, _, plan, _ = world
    report = write_batches(plan, tmp_path / "one", root / "store", workers=1, layout="npz")
    assert report.fingerprint == world[3].fingerprint
    for name in npz_files(root / "out"):
        assert (tmp_path / "one" / name).read_bytes() == (root / "out" / name).read_bytes(), name
    assert (tmp_path / "one" / "batches.json").read_bytes() == (root / "out" / "batches.json").read_bytes()


def test_a_finished_folder_is_kept_on_a_second_run(world, tmp_path):
    root, _, plan, _ = world
    shutil.copytree(root / "out", tmp_path / "out")
    calls = []
    writer = BatchWriter(plan, tmp_path / "out", root / "store", layout="npz")
    report = writer.write_all(lambda d, t: calls.append((d, t)))
    assert (report.written, report.kept, report.rewritten) == (0, plan.total_microbatches, 0)
    assert calls[-1] == (plan.total_microbatches, plan.total_microbatches)


def test_random_access_and_shards(world):
    root, _, plan, _ = world
    reader = BatchReader(root / "out")
    mb = plan.microbatch(1, 5)
    assert reader.load(1, mb.index)["rows"].tolist() == mb.rows.tolist()
    assert int(reader[0, 3]["index"]) == 3 and reader.path(0, 3).endswith("epoch_0_batch_0003.npz")
    for world_size in (2, 3):
        shards = [reader.shard(rank, world_size) for rank in range(world_size)]
        dealt = sorted((int(a["index"]), a["rows"].tolist()) for shard in shards for a in shard.iter_epoch(1))
        assert dealt == [(m.index, m.rows.tolist()) for m in plan.iter_epoch(1)]
        assert all(int(a["index"]) % world_size == r for r, s in enumerate(shards) for a in s.iter_epoch(0))
    assert shards[1].verify()["files"] == len(shards[1])
    for shard, epoch, index in ((reader, 0, len(plan.epochs[0])), (reader, 2, 0), (reader.shard(1, 2), 0, 0)):
        with pytest.raises(errors.UmlosError) as info:  # the plan's own code (and operator)
            shard.load(epoch, index)
        assert info.value.code == errors.PLAN_CURSOR_INVALID


def test_a_pre_sharded_plan_writes_and_reads_its_own_files(world, tmp_path):
    root, store, plan, _ = world
    shard = shard_plan(plan, 1, 3)
    report = write_batches(shard, tmp_path / "rank_1", store, layout="npz")
    reader = BatchReader(tmp_path / "rank_1")
    assert report.files == len(reader) == shard.total_microbatches
    assert npz_files(tmp_path / "rank_1") == [n for n in npz_files(root / "out") if int(n[:-4].split("_")[-1]) % 3 == 1]
    for name in npz_files(tmp_path / "rank_1"):
        assert np.array_equal(read_batch_file(str(tmp_path / "rank_1" / name))["input_ids"],
                              read_batch_file(str(root / "out" / name))["input_ids"])
    assert reader.verify(store)["files"] == shard.total_microbatches


# ====================================================================== damage
def rewrite(path, **changes):
    arrays = read_batch_file(str(path))
    arrays.update(changes)
    os.unlink(path)
    with open(path, "wb") as handle:
        handle.write(npz_bytes(arrays))


def edit_index(folder, change):
    index = json.loads((folder / "batches.json").read_text())
    change(index)
    (folder / "batches.json").write_text(json.dumps(index))


def damaged(world, tmp_path, damage):
    root = world[0]
    shutil.copytree(root / "out", tmp_path / "out")
    damage(tmp_path / "out")
    return BatchReader(tmp_path / "out")


def edited_tokens(folder):
    path = folder / "epoch_1_batch_0004.npz"
    ids = read_batch_file(str(path))["input_ids"].copy()
    ids[0, 0] += 1
    rewrite(path, input_ids=ids)


def consistently_edited_tokens(folder):
    """A token changed with every digest updated: only the store can tell."""
    path = folder / "epoch_0_batch_0002.npz"
    arrays = read_batch_file(str(path))
    ids = arrays["input_ids"].copy()
    ids[0, 1] += 1
    labels = arrays["labels"].copy()
    if arrays["loss_mask"][0, 1] == 1:
        labels[0, 0] = ids[0, 1]
    digest = microbatch_digest(ids, arrays["loss_mask"])
    rewrite(path, input_ids=ids, labels=labels, fingerprint=np.array(digest))
    edit_index(folder, lambda index: replace_digest(index, 0, 2, digest))


def replace_digest(index: dict, epoch: int, position: int, digest: str) -> None:
    """Change one file's digest in batches.json, and in its batch fingerprint when it is there."""
    from umlos_cuda.batching.batches.fingerprint import combine_digests

    index["epochs"][epoch]["digests"][position] = digest
    fingerprint = index["batch_fingerprint"]
    for k, (e, i) in enumerate(fingerprint["positions"]):
        if (e, i) == (epoch, index["epochs"][epoch]["indices"][position]):
            fingerprint["digests"][k] = digest
    fingerprint["fingerprint"] = combine_digests(fingerprint["digests"])


@pytest.mark.parametrize("damage, mention", [
    (edited_tokens, "hash to"),
    (lambda f: rewrite(f / "epoch_0_batch_0001.npz", labels=np.zeros_like(read_batch_file(
        str(f / "epoch_0_batch_0001.npz"))["labels"])), "labels is not consistent"),
    (lambda f: rewrite(f / "epoch_0_batch_0001.npz", bucket_id=np.array(9, dtype=np.int64)), "bucket_id is 9"),
    (lambda f: rewrite(f / "epoch_0_batch_0001.npz", sample_ids=np.array(["x"] * len(read_batch_file(
        str(f / "epoch_0_batch_0001.npz"))["sample_ids"]))), "other samples"),
    (lambda f: rewrite(f / "epoch_0_batch_0001.npz", attention_mask=read_batch_file(
        str(f / "epoch_0_batch_0001.npz"))["attention_mask"].astype(np.int64)), "expected int32"),
    (lambda f: os.replace(f / "epoch_0_batch_0001.npz", f / "epoch_0_batch_0002.npz"), "missing"),
    (lambda f: (f / "epoch_1_batch_0000.npz").write_bytes(b"PK\x03\x04 broken"), "not a readable .npz"),
    (lambda f: edit_index(f, lambda index: replace_digest(index, 1, 3, "0" * 64)), "and batches.json"),
])
def test_verify_finds_damage(world, tmp_path, damage, mention):
    reader = damaged(world, tmp_path, damage)
    expect(errors.BATCH_FILE_INVALID, reader.verify, mention=mention)


def test_only_the_store_finds_a_consistent_edit(world, tmp_path):
    reader = damaged(world, tmp_path, consistently_edited_tokens)
    assert reader.verify()["files"] == len(reader)
    expect(errors.BATCH_FILE_INVALID, reader.verify, world[0] / "store", mention="differs from what the token store")


def test_reading_a_misnamed_file_is_refused(world, tmp_path):
    def swap(folder):
        os.replace(folder / "epoch_0_batch_0001.npz", folder / "tmp")
        os.replace(folder / "epoch_0_batch_0002.npz", folder / "epoch_0_batch_0001.npz")
        os.replace(folder / "tmp", folder / "epoch_0_batch_0002.npz")
    reader = damaged(world, tmp_path, swap)
    expect(errors.BATCH_FILE_INVALID, reader.load, 0, 1, mention="not epoch 0 microbatch 1")


def test_a_second_run_rewrites_a_damaged_file(world, tmp_path):
    root, _, plan, _ = world
    damaged(world, tmp_path, edited_tokens)
    report = BatchWriter(plan, tmp_path / "out", root / "store", layout="npz").write_all()
    assert (report.rewritten, report.kept) == (1, plan.total_microbatches - 1)
    assert BatchReader(tmp_path / "out").verify(root / "store")["files"] == plan.total_microbatches


# ====================================================================== crash and resume
KILLER = """
import os, signal, sys
from umlos_cuda.batching.batches import writer as batch_writer
from umlos_cuda.batching.batches.writer import BatchWriter

calls = 0
collate = batch_writer.collate_microbatch

def dying_collate(source, microbatch, **kwargs):
    global calls
    calls += 1
    if calls == int(sys.argv[4]):
        os.kill(os.getpid(), signal.SIGKILL)  # no clean-up of any kind
    return collate(source, microbatch, **kwargs)

batch_writer.collate_microbatch = dying_collate
BatchWriter(sys.argv[1], sys.argv[2], sys.argv[3], workers=int(sys.argv[5]), layout="npz").write_all()
"""


@pytest.mark.parametrize("workers, kill_at", [(1, 25), (3, 40)])
def test_a_killed_writer_resumes(world, tmp_path, capsys, workers, kill_at):
    root, _, plan, _ = world
    out = tmp_path / "out"
    child = subprocess.run([sys.executable, "-c", KILLER, str(root / "plan"), str(out), str(root / "store"),
                            str(kill_at), str(workers)], capture_output=True, text=True, timeout=300)
    assert child.returncode == -9, child.stderr
    finished = npz_files(out)
    assert 0 < len(finished) < kill_at <= plan.total_microbatches
    if workers == 1:
        assert finished == [batch_file_name(0, i) for i in range(kill_at - 1)]  # the files before the kill
    for name in finished:  # every file there is whole: the uninterrupted run's bytes
        assert (out / name).read_bytes() == (root / "out" / name).read_bytes()
    expect(errors.BATCH_FILES_NOT_FOUND, BatchReader, out, mention="unfinished")
    stale = out / ".tmp-0badc0de-epoch_0_batch_0007.npz"  # what a kill during a write leaves
    stale.write_bytes(b"half a file")
    (out / finished[0]).write_bytes(b"damaged after the crash")
    assert main(["batch", "generate", "--plan", str(root / "plan"), "--store", str(root / "store"),
                 "--output", str(out), "--quiet", "--layout", "npz"]) == 0
    line = capsys.readouterr().out
    kept = len(finished) - 1
    assert f"({plan.total_microbatches - kept - 1} written, {kept} kept, 1 rewritten)" in line
    assert not stale.exists() and not [n for n in os.listdir(out) if n.startswith(".")]
    for name in npz_files(root / "out"):
        assert (out / name).read_bytes() == (root / "out" / name).read_bytes(), name
    assert BatchReader(out).fingerprint == world[3].fingerprint


# ====================================================================== writer failures
def test_a_store_that_is_not_the_plans_is_refused(world, tmp_path):
    _, store, _, _ = world
    lengths = np.asarray(store.lengths)
    ids = store.sample_ids
    cases = [
        (BatchPlanBuilder(lengths[:100], CONFIG, tokenizer_hash=store.tokenizer_hash, sample_ids=ids[:100]),
         "holds 240 samples"),
        (BatchPlanBuilder(lengths, CONFIG, tokenizer_hash="other", sample_ids=ids),
         f"tokenized by the tokenizer of fingerprint {store.tokenizer_hash}; the plan's lengths were counted by other"),
        (BatchPlanBuilder(lengths + 1, CONFIG, tokenizer_hash=store.tokenizer_hash, sample_ids=ids), "lengths"),
        (BatchPlanBuilder(lengths, CONFIG, tokenizer_hash=store.tokenizer_hash), "by id"),
        (BatchPlanBuilder(lengths, CONFIG, tokenizer_hash=store.tokenizer_hash, sample_ids=[i + "x" for i in ids]),
         "sample ids"),
    ]
    for builder, mention in cases:
        expect(errors.BATCH_STORE_MISMATCH, BatchWriter, builder.build(1), tmp_path / "o", store, mention=mention)
    assert not (tmp_path / "o").exists()
    # the tokenizer message says what the two hashes are and how to find the part that differs
    error = expect(errors.BATCH_STORE_MISMATCH, BatchWriter, cases[1][0].build(1), tmp_path / "o", store)
    assert "tokenizer_parts(A) and tokenizer_parts(B)" in error.message and "Tokenize the data again" in error.message


def test_output_folder_rules(world, tmp_path):
    _, store, plan, _ = world
    other = BatchPlanBuilder(store.length_cache(), BatchingConfig.throughput(1024, (64, 128), 256, seed=1)).build(1)
    write_batches(other, tmp_path / "out", store, layout="npz")
    expect(errors.BATCH_OUTPUT_MISMATCH, write_batches, plan, tmp_path / "out", store, mention="plan_fingerprint")
    expect(errors.BATCH_OUTPUT_MISMATCH, write_batches, other, tmp_path / "out", store, pad_id=3, mention="pad_id")
    (tmp_path / "out" / "notes.txt").write_text("mine")
    report = write_batches(plan, tmp_path / "out", store, force=True, layout="npz")
    assert report.written == plan.total_microbatches and (tmp_path / "out" / "notes.txt").read_text() == "mine"
    assert len(npz_files(tmp_path / "out")) == plan.total_microbatches  # the other plan's files are gone
    assert BatchReader(tmp_path / "out").plan_fingerprint == plan.fingerprint
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "data.bin").write_text("x")
    expect(errors.BATCH_OUTPUT_MISMATCH, write_batches, plan, tmp_path / "foreign", store, force=True,
           mention="not a batch folder")
    assert os.listdir(tmp_path / "foreign") == ["data.bin"]
    (tmp_path / "file").write_text("x")
    expect(errors.OUTPUT_PATH_INVALID, write_batches, plan, tmp_path / "file", store)
    expect(errors.OUTPUT_PATH_INVALID, write_batches, plan, tmp_path / "no" / "out", store)
    expect(errors.BATCHING_CONFIG_INVALID, BatchWriter, plan, tmp_path / "w", store, workers=-1)


def test_reader_failures(world, tmp_path):
    root = world[0]
    expect(errors.BATCH_FILES_NOT_FOUND, BatchReader, tmp_path, mention="batch generate")
    shutil.copytree(root / "out", tmp_path / "out")
    index = tmp_path / "out" / "batches.json"
    good = index.read_text()
    index.write_text("{")
    expect(errors.BATCH_FILE_INVALID, BatchReader, tmp_path / "out", mention="not valid JSON")
    index.write_text(json.dumps({**json.loads(good), "format": "other"}))
    expect(errors.BATCH_FILE_INVALID, BatchReader, tmp_path / "out", mention="format")
    index.write_text(json.dumps({**json.loads(good), "epochs": None}))
    expect(errors.BATCH_FILE_INVALID, BatchReader, tmp_path / "out", mention="per-epoch digests")
    index.write_text(json.dumps({**json.loads(good), "plan_fingerprint": "0" * 64}))
    expect(errors.BATCH_FILE_INVALID, BatchReader, tmp_path / "out", mention="was written for plan")
    stale = json.loads(good)
    stale["epochs"][0]["digests"][0] = "0" * 64
    index.write_text(json.dumps(stale))
    expect(errors.BATCH_FILE_INVALID, BatchReader, tmp_path / "out", mention="disagrees with its file digests")


# ====================================================================== fingerprints
def test_the_canonical_bytes(world):
    """docs/batching.md, "Fingerprints", written out with hashlib."""
    ids = np.array([[1, 2, 3], [4, 5, 0]], dtype=np.int32)
    mask = np.array([[0, 1, 1], [1, 1, 0]], dtype=np.int32)
    expected = hashlib.sha256(b"umlos_batch_microbatch_v1\0" + struct.pack("<II", 2, 3) +
                              ids.astype("<i4").tobytes() + mask.astype("u1").tobytes()).hexdigest()
    assert microbatch_digest(ids, mask) == expected
    second = microbatch_digest(ids[:1], mask[:1])
    overall = hashlib.sha256(b"umlos_batch_fingerprint_v1\0" + struct.pack("<Q", 2) + bytes.fromhex(expected) +
                             bytes.fromhex(second)).hexdigest()
    batches = [{"input_ids": ids, "loss_mask": mask}, {"input_ids": ids[:1], "loss_mask": mask[:1]}]
    assert compute_batch_fingerprint(batches) == overall
    assert compute_batch_fingerprint(batches, n_batches=1) != overall
    assert microbatch_digest(ids, mask) != microbatch_digest(np.pad(ids, ((0, 0), (0, 1))),
                                                             np.pad(mask, ((0, 0), (0, 1))))


def test_save_load_and_verify(world, tmp_path):
    root, store, plan, _ = world
    fingerprint = fingerprint_plan_batches(plan, store, 30)
    fingerprint.save(tmp_path / "fp.json")
    loaded = BatchFingerprint.load(tmp_path / "fp.json")
    assert loaded == fingerprint and loaded.n_batches == 30 and loaded.plan_fingerprint == plan.fingerprint
    reader = BatchReader(root / "out")
    assert verify_batch_fingerprint(reader, loaded).fingerprint == fingerprint.fingerprint
    assert verify_batch_fingerprint(reader, fingerprint.fingerprint, 30).fingerprint == fingerprint.fingerprint
    batches = [collate_microbatch(store, mb) for mb in plan.iter_epoch(0)][:30]
    batches[17] = batches[16]
    error = expect(errors.BATCH_FINGERPRINT_MISMATCH, verify_batch_fingerprint, batches, loaded,
                   mention="the first that differs is epoch 0 microbatch 17 (position 17)")
    assert error.record["diagnostics"]["first_mismatch"] == 17
    expect(errors.BATCH_FINGERPRINT_MISMATCH, verify_batch_fingerprint, batches, loaded.fingerprint, 30,
           mention="saved fingerprint file")
    clean = [collate_microbatch(store, mb) for mb in plan.iter_epoch(0)][:20]
    expect(errors.BATCH_FINGERPRINT_MISMATCH, verify_batch_fingerprint, clean, loaded,
           mention="20 microbatches were hashed, the expected fingerprint has 30")
    short = batch_fingerprint(batches, 1000)
    assert len(short.digests) == 30 and short.n_batches == 1000


@pytest.mark.parametrize("edit, mention", [
    (lambda d: d.update(format="x"), "format"),
    (lambda d: d.update(extra=1), "exactly the fields"),
    (lambda d: d.update(fingerprint="0" * 64), "not the one its digests give"),
    (lambda d: d.update(digests=[]), "non-empty list"),
    (lambda d: d.update(digests="ab"), "must be a list"),
    (lambda d: d.update(positions=[[0]] * len(d["digests"])), "positions"),
    (lambda d: d.update(positions=[[0, 0]]), "positions for"),
    (lambda d: d.update(n_batches=1), "n_batches is 1"),
    (lambda d: d.update(n_batches=0), "positive integer"),
    (lambda d: d.update(plan_fingerprint="zz"), "plan_fingerprint"),
])
def test_malformed_saved_fingerprints(world, tmp_path, edit, mention):
    data = fingerprint_plan_batches(world[2], world[1], 5).to_json()
    edit(data)
    (tmp_path / "fp.json").write_text(json.dumps(data))
    expect(errors.BATCH_FINGERPRINT_INVALID, BatchFingerprint.load, tmp_path / "fp.json", mention=mention)


def test_fingerprint_argument_checks(world, tmp_path):
    for n in (0, -1, True, "5", 2.0):
        expect(errors.BATCH_FINGERPRINT_INVALID, compute_batch_fingerprint, [], n, mention="positive integer")
    expect(errors.BATCH_FINGERPRINT_INVALID, compute_batch_fingerprint, [], mention="no microbatches")
    expect(errors.BATCH_FINGERPRINT_INVALID, compute_batch_fingerprint, [object()], mention="no input_ids")
    expect(errors.BATCH_FINGERPRINT_INVALID, microbatch_digest, np.zeros(3), np.zeros(3), mention="[rows, width]")
    expect(errors.BATCH_FINGERPRINT_INVALID, verify_batch_fingerprint, [], "abc", mention="hex digest")
    expect(errors.BATCH_FINGERPRINT_INVALID, BatchFingerprint.load, tmp_path / "none.json", mention="cannot read")
    (tmp_path / "bad.json").write_text("[")
    expect(errors.BATCH_FINGERPRINT_INVALID, BatchFingerprint.load, tmp_path / "bad.json", mention="not valid JSON")


# ====================================================================== commands
def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_batch_commands(world, tmp_path, capsys):
    root, _, plan, _ = world
    code, out, err = run(capsys, "batch", "generate", "--plan", root / "plan", "--store", root / "store",
                         "--output", tmp_path / "out", "--workers", "2", "--layout", "npz")
    assert code == 0 and f"{plan.total_microbatches} files ({plan.total_microbatches} written" in out
    assert "100%" in err and world[3].fingerprint.fingerprint in out
    code, out, _ = run(capsys, "batch", "check", tmp_path / "out", "--store", root / "store")
    assert code == 0 and f"ok  {plan.total_microbatches} batch files match plan {plan.fingerprint}" in out
    code, out, _ = run(capsys, "batch", "check", tmp_path / "out", "--rank", "1", "--world-size", "2")
    assert code == 0 and f"ok  {len(BatchReader(tmp_path / 'out').shard(1, 2))} batch files" in out
    assert run(capsys, "batch", "check", tmp_path / "out", "--rank", "1")[0] == 2
    code, out, _ = run(capsys, "batch", "fingerprint", "--plan", root / "plan", "--store", root / "store",
                       "--output", tmp_path / "fp.json")
    assert code == 0 and world[3].fingerprint.fingerprint in out
    assert BatchFingerprint.load(tmp_path / "fp.json") == world[3].fingerprint
    for expected in (tmp_path / "fp.json", world[3].fingerprint.fingerprint):
        code, out, _ = run(capsys, "batch", "verify", "--plan", root / "plan", "--store", root / "store",
                           "--expected-fingerprint", expected)
        assert code == 0 and "as expected" in out
    (tmp_path / "out" / "epoch_0_batch_0000.npz").write_bytes(b"x")
    code, _, err = run(capsys, "batch", "check", tmp_path / "out")
    assert code == 2 and "error BATCH_FILE_INVALID" in err and "epoch_0_batch_0000.npz" in err


def test_verify_names_the_first_differing_microbatch(world, tmp_path, capsys):
    root, store, plan, _ = world
    assert run(capsys, "batch", "fingerprint", "--plan", root / "plan", "--store", root / "store",
               "--output", tmp_path / "fp.json")[0] == 0
    # another seed: another plan over the same store differs from its first microbatch
    reseeded = BatchPlanBuilder(store.length_cache(), BatchingConfig.predictable(1024, (32, 64, 128), 256, seed=8))
    save_plan(reseeded.build(2), tmp_path / "plan8")
    code, _, err = run(capsys, "batch", "verify", "--plan", tmp_path / "plan8", "--store", root / "store",
                       "--expected-fingerprint", tmp_path / "fp.json")
    assert code == 2 and "error BATCH_FINGERPRINT_MISMATCH" in err and "epoch 0 microbatch 0 (position 0)" in err
    # one token of a sample of microbatch 13 changed in a copy of the store
    target = plan.microbatch(0, 13)
    shutil.copytree(root / "store", tmp_path / "store")
    position = int(store.offsets[int(target.rows[0])])
    data = bytearray((tmp_path / "store" / "tokens.npy").read_bytes())
    data[NPY_HEADER_BYTES + 2 * position] ^= 1
    (tmp_path / "store" / "tokens.npy").write_bytes(bytes(data))
    assert all(int(target.rows[0]) not in plan.microbatch(0, j).rows for j in range(13))
    code, _, err = run(capsys, "batch", "verify", "--plan", root / "plan", "--store", tmp_path / "store",
                       "--expected-fingerprint", tmp_path / "fp.json")
    assert code == 2 and "epoch 0 microbatch 13 (position 13)" in err
    code, _, err = run(capsys, "batch", "verify", "--plan", root / "plan", "--store", tmp_path / "store",
                       "--expected-fingerprint", world[3].fingerprint.fingerprint)
    assert code == 2 and "error BATCH_FINGERPRINT_MISMATCH" in err
    code, _, err = run(capsys, "batch", "verify", "--plan", root / "plan", "--store", root / "store",
                       "--expected-fingerprint", "nothing")
    assert code == 2 and "error BATCH_FINGERPRINT_INVALID" in err
    code, _, err = run(capsys, "batch", "generate", "--plan", tmp_path / "plan8", "--store", tmp_path / "none",
                       "--output", tmp_path / "o")
    assert code == 2 and "error TOKEN_STORE_NOT_FOUND" in err


def test_installed_command():
    command = os.path.join(os.path.dirname(sys.executable), "umlos-cuda")
    result = subprocess.run([command, "batch"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "generate" in result.stdout and "verify" in result.stdout


# ====================================================================== failure codes
def test_every_code_of_the_block_is_documented():
    source = Path(os.path.join(ROOT, "umlos_cuda", "errors.py")).read_text(encoding="utf-8")
    block = source.split("#: Token stores, collation, batch files and batch fingerprints", 1)[1].split("\n\n", 1)[0]
    codes = set(re.findall(r'^([A-Z_]+) = "\1"', block, re.M))
    assert {errors.TOKEN_STORE_INVALID, errors.MEGATRON_INDEX_INVALID, errors.BATCH_FINGERPRINT_MISMATCH} <= codes
    doc = Path(os.path.join(ROOT, "docs", "batching.md")).read_text(encoding="utf-8")
    table = doc.split("## Failure codes", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([A-Z_]+)` \|", table, re.M))
    assert codes <= documented, sorted(codes - documented)
    assert len(codes) == 14  # the sharded store (2 and its lock, 1) and the Ray job (1) added theirs to the block


# ====================================================================== packed plans
def packed_plan(store, separator_len: int):
    from umlos_cuda.batching import PackingConfig

    config = BatchingConfig(1024, (), 256, "pad_to_bucket", 11,
                            pack=PackingConfig(256, "first_fit", separator_len=separator_len))
    return BatchPlanBuilder(store.length_cache(), config).build(2)


@pytest.mark.parametrize("separators", [(), (2,), (2, 1)])
def test_packed_plans_collate_row_by_packed_row(world, tmp_path, separators):
    from umlos_cuda.batching.packing.rows import pack_rows

    _, store, _, _ = world
    plan = packed_plan(store, len(separators))
    report = write_batches(plan, tmp_path / "out", store, separator_ids=separators, workers=2, layout="npz")
    reader = BatchReader(tmp_path / "out")
    assert reader.verify(store)["files"] == plan.total_microbatches == report.written
    for mb, arrays in zip(plan.iter_epoch(1), reader.iter_epoch(1)):
        rows = pack_rows([[{"input_ids": store.input_ids(r), "loss_mask": store.loss_mask(r)} for r in row.tolist()]
                          for row in mb.packed_rows()], separators)
        assert arrays["input_ids"].shape == (len(mb.packs), 256) and arrays["row_sizes"].tolist() == list(mb.pack_sizes)
        for b, row in enumerate(rows):
            n = row.length
            assert arrays["input_ids"][b, :n].tolist() == row.input_ids.tolist()
            assert arrays["segment_ids"][b, :n].tolist() == row.segment_ids.tolist()
            assert arrays["position_ids"][b, :n].tolist() == row.position_ids.tolist()
            assert (arrays["segment_ids"][b, n:] == -1).all() and arrays["attention_mask"][b].sum() == n
            ends = row.cu_seqlens[1:] - 1  # the last token of each segment predicts nothing
            assert (arrays["labels"][b, ends] == -100).all()
    assert reader.fingerprint == fingerprint_plan_batches(plan, store, separator_ids=separators)
    if separators:
        expect(errors.COLLATE_INPUT_INVALID, BatchWriter, plan, tmp_path / "o", store, mention="exactly")
        expect(errors.COLLATE_INPUT_INVALID, fingerprint_plan_batches, plan, store, separator_ids=separators + (3,))
        expect(errors.BATCH_OUTPUT_MISMATCH, write_batches, plan, tmp_path / "out", store,
               separator_ids=separators[::-1] if len(separators) > 1 else (5,), layout="npz", mention="separator_ids")
    else:
        expect(errors.COLLATE_INPUT_INVALID, BatchWriter, plan, tmp_path / "o", store, separator_ids=(2,))


def test_a_separator_id_past_the_vocabulary_is_refused_before_any_batch(world, tmp_path, capsys):
    """``--separator-ids`` takes only ids the store holds (below its vocab_size): an id past it would put a
    token in the batches that the model's embedding does not have. The flag's text is read by the one integer
    parser (a Unicode digit is refused there)."""
    from umlos_cuda.cli import main

    root, store, _, _ = world
    save_plan(packed_plan(store, 1), tmp_path / "plan")
    top = store.vocab_size
    expect(errors.COLLATE_INPUT_INVALID, BatchWriter, tmp_path / "plan", tmp_path / "o", store, separator_ids=(top,),
           mention=f"separator id {top} is not a token id of {store.root}")
    expect(errors.COLLATE_INPUT_INVALID, fingerprint_plan_batches, packed_plan(store, 1), store, separator_ids=(top,),
           mention="its vocab_size")
    base = ["batch", "generate", "--plan", str(tmp_path / "plan"), "--source", str(root / "store"), "--quiet"]
    for ids in (str(top), "\u00b2", "1,", "9" * 50):
        assert main([*base, "--separator-ids", ids, "--output", str(tmp_path / "out")]) == 2
        assert capsys.readouterr().err.startswith(f"error {errors.COLLATE_INPUT_INVALID}: ")
    assert not (tmp_path / "out").exists()
    assert main([*base, "--separator-ids", str(top - 1), "--output", str(tmp_path / "out")]) == 0


def test_packed_plans_through_a_dataloader(world, tmp_path):
    from torch.utils.data import DataLoader

    from umlos_cuda.torch import PackedBatchSampler, PlanBatchSampler, PlanCollator, TokenDataset

    root, store, _, _ = world
    plan = packed_plan(store, 1)
    sampler = PackedBatchSampler(PlanBatchSampler(plan, 1, 2))
    loader = DataLoader(TokenDataset(root / "store"), batch_sampler=sampler,
                        collate_fn=PlanCollator(plan, separator_ids=[2]), num_workers=2)
    count = len(sampler)
    got = list(loader)
    expected = [mb for mb in plan.iter_epoch(0) if mb.index % 2 == 1]
    assert len(got) == len(expected) == count > 0
    for batch, mb in zip(got, expected):
        reference_batch = collate_microbatch(store, mb, separator_ids=[2])
        for name in FIELDS:
            assert np.array_equal(batch[name].numpy(), getattr(reference_batch, name)), name
    assert sampler.state_dict()["epoch"] == 1  # the wrapped sampler's cursor moved on
    unwrapped = DataLoader(TokenDataset(root / "store"), batch_sampler=PlanBatchSampler(plan, 0, 1),
                           collate_fn=PlanCollator(plan, separator_ids=[2]))
    with pytest.raises(errors.UmlosError) as info:
        next(iter(unwrapped))
    assert info.value.code == errors.COLLATE_INPUT_INVALID and "PackedBatchSampler" in info.value.message


def test_a_windowed_packed_plan_through_a_dataloader(world):
    """A windowed packed plan (windows of 64 of the 240 samples) feeds the same loader: each batch is its
    microbatch collated from the store, packed rows and all."""
    from torch.utils.data import DataLoader

    from umlos_cuda.batching.plans.windows import ArrayLengths, WindowDefinition, WindowedPlan
    from umlos_cuda.torch import PackedBatchSampler, PlanBatchSampler, PlanCollator, TokenDataset

    root, store, _, _ = world
    config = packed_plan(store, 1).config
    plan = WindowedPlan.build(WindowDefinition(config, len(store), 64), ArrayLengths(store.lengths), 1)
    sampler = PackedBatchSampler(PlanBatchSampler(plan, 0, 2))
    loader = DataLoader(TokenDataset(root / "store"), batch_sampler=sampler,
                        collate_fn=PlanCollator(plan, separator_ids=[2]), num_workers=2)
    got = list(loader)
    expected = [plan.microbatch(0, k) for k in range(0, plan.epoch_microbatches(0), 2)]
    assert len(got) == len(expected) > 2 and any(len(mb.pack_sizes) > 1 for mb in expected)
    for batch, mb in zip(got, expected):
        reference_batch = collate_microbatch(store, mb, separator_ids=[2])
        for name in FIELDS:
            assert np.array_equal(batch[name].numpy(), getattr(reference_batch, name)), name


def test_a_second_run_killed_leaves_the_folder_unfinished(world, tmp_path):
    """Rewriting a finished folder marks it unfinished until every file is checked again."""
    root, _, plan, _ = world
    shutil.copytree(root / "out", tmp_path / "out")
    child = subprocess.run([sys.executable, "-c", KILLER, str(root / "plan"), str(tmp_path / "out"),
                            str(root / "store"), "5", "1"], capture_output=True, text=True, timeout=300)
    assert child.returncode == -9, child.stderr
    expect(errors.BATCH_FILES_NOT_FOUND, BatchReader, tmp_path / "out", mention="unfinished")
    assert write_batches(plan, tmp_path / "out", root / "store", layout="npz").kept == plan.total_microbatches
    assert BatchReader(tmp_path / "out").fingerprint == world[3].fingerprint
