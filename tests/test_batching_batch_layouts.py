"""Batch file layouts (docs/batching.md, "Batch file layouts"): compact, compact + zstd, npz.

* every layout reads back as exactly the dict the npz layout gives (keys,
  dtypes, values), and every layout has the same batch fingerprint;
* the npz layout is the seed's, byte for byte (its batches.json has no
  layout field); compact files hold uint16 tokens for a small vocabulary;
* `batch check` and `batch verify` work on every layout and catch tampering
  in each (an edited token, a consistent edit only the store sees, a
  truncated file, a member of the wrong type, a corrupt zstd frame);
* resume keeps a finished compact folder, another layout is another job;
* hypothesis: for random stores and plans (packed with separators too),
  every layout's files decode to exactly the npz layout's arrays.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from batching_cases import expect
from token_cases import make_store, write_megatron
from umlos_cuda import errors
from umlos_cuda.batching import BatchingConfig, BatchPlanBuilder, PackingConfig, save_plan
from umlos_cuda.batching.batches import compact
from umlos_cuda.batching.batches.fingerprint import combine_digests, fingerprint_plan_batches, microbatch_digest
from umlos_cuda.batching.batches.layouts import Layout
from umlos_cuda.batching.batches.npz import npz_bytes
from umlos_cuda.batching.batches.reader import BatchReader
from umlos_cuda.batching.batches.writer import BatchWriter, write_batches
from umlos_cuda.batching.collate import collate_microbatch
from umlos_cuda.batching.tokens.megatron import MegatronDataset
from umlos_cuda.cli import main

CONFIG = BatchingConfig.predictable(token_budget=1024, bucket_edges=(32, 64, 128), overflow_max=256, seed=7)
#: (label, layout, compression): every layout a folder can have.
LAYOUTS = [("npz", "npz", None), ("compact", "compact", None), ("zstd", "compact", "zstd")]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A token store, a 2-epoch plan over it, and its batch files in every layout."""
    root = tmp_path_factory.mktemp("layouts")
    store = make_store(root, 200, seed=5)
    plan = BatchPlanBuilder(store.length_cache(), CONFIG).build(2)
    save_plan(plan, root / "plan")
    reports = {label: BatchWriter(root / "plan", root / label, root / "store", workers=2, layout=layout,
                                  compression=compression).write_all()
               for label, layout, compression in LAYOUTS}
    return root, store, plan, reports


def batch_files(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.startswith("epoch_"))


def test_every_layout_reads_back_as_the_npz_layout(world):
    root, store, plan, reports = world
    expected = fingerprint_plan_batches(plan, store)
    assert {r.fingerprint for r in reports.values()} == {expected}
    seed = list(BatchReader(root / "npz"))
    for label in ("compact", "zstd"):
        reader = BatchReader(root / label)
        assert reader.fingerprint == expected
        got = list(reader)
        assert len(got) == len(seed) == plan.total_microbatches
        for a, b in zip(seed, got):
            assert list(a) == list(b)
            for name in a:
                assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, (label, name)
                assert np.array_equal(a[name], b[name]), (label, name)
        assert [int(b["index"]) for b in reader.shard(1, 3).iter_epoch(1)] == \
            [mb.index for mb in plan.iter_epoch(1) if mb.index % 3 == 1]
        assert int(reader.load(1, 4)["index"]) == 4


def test_files_and_index_of_each_layout(world):
    root, _, plan, _ = world
    names = batch_files(root / "npz")
    assert names[0] == "epoch_0_batch_0000.npz" and len(names) == plan.total_microbatches
    assert batch_files(root / "compact") == names
    assert batch_files(root / "zstd") == [n + ".zst" for n in names]
    seed = json.loads((root / "npz" / "batches.json").read_text())
    assert seed["format"] == "umlos_cuda.batch_files/1" and "layout" not in seed
    for label, compression in (("compact", None), ("zstd", "zstd")):
        index = json.loads((root / label / "batches.json").read_text())
        assert (index["format"], index["layout"], index["compression"], index["token_dtype"]) == \
            ("umlos_cuda.batch_files/2", "compact", compression, "<u2")  # a 300-id vocabulary
        assert index["epochs"] == seed["epochs"] and index["batch_fingerprint"] == seed["batch_fingerprint"]
    with np.load(root / "compact" / names[3]) as archive:
        members = dict(archive)
    assert tuple(members) == compact.MEMBERS and members["input_ids"].dtype == np.uint16
    sizes = {label: sum(os.path.getsize(root / label / n) for n in batch_files(root / label)) for label, *_ in LAYOUTS}
    assert sizes["zstd"] < sizes["compact"] < sizes["npz"] / 4


def test_the_default_layout_is_compact_and_the_vocabulary_picks_the_token_type(world, tmp_path):
    _, store, plan, _ = world
    assert BatchWriter(plan, tmp_path / "a", store).layout == Layout("compact", None, "<u2")

    class Wide:  # a source whose vocabulary does not fit uint16
        vocab_size = 70_000

    class Narrow:
        tokens = np.zeros(3, dtype=np.uint16)

    assert compact.token_dtype_for(Wide()) == "<u4" and compact.token_dtype_for(Narrow()) == "<u2"
    assert compact.token_dtype_for(Narrow(), (70_000,)) == "<u4" and compact.token_dtype_for(object()) == "<u4"
    for dtype, expected in ((np.uint16, "<u2"), (np.int16, "<u4"), (np.int32, "<u4")):
        prefix = write_megatron(tmp_path / f"mega-{np.dtype(dtype).name}", [[1, 2, 3], [4, 5]], dtype)
        assert compact.token_dtype_for(MegatronDataset.open(prefix)) == expected
    wide = write_batches(plan, tmp_path / "wide", store, layout=Layout("compact", None, "<u4"))
    assert wide.fingerprint == world[3]["npz"].fingerprint
    assert BatchReader(tmp_path / "wide").verify(store)["files"] == plan.total_microbatches
    expect(errors.BATCHING_CONFIG_INVALID, BatchWriter, plan, tmp_path / "b", store, layout="npz",
           compression="zstd", mention="compact layout")
    expect(errors.BATCHING_CONFIG_INVALID, BatchWriter, plan, tmp_path / "b", store, layout="dense",
           mention="compact, npz")


@pytest.mark.parametrize("label", [label for label, *_ in LAYOUTS])
def test_check_and_verify_commands_on_every_layout(world, tmp_path, capsys, label):
    root, _, plan, reports = world
    layout = {"npz": ["--layout", "npz"], "compact": [], "zstd": ["--compress", "zstd"]}[label]
    out = tmp_path / "out"
    assert main(["batch", "generate", "--plan", str(root / "plan"), "--store", str(root / "store"), "--output",
                 str(out), "--quiet", *layout]) == 0
    assert capsys.readouterr().out.count(reports[label].fingerprint.fingerprint) == 1
    assert batch_files(out) == batch_files(root / label)
    for name in batch_files(out):
        assert (out / name).read_bytes() == (root / label / name).read_bytes(), name
    assert main(["batch", "check", str(out), "--store", str(root / "store")]) == 0
    assert f"ok  {plan.total_microbatches} batch files" in capsys.readouterr().out
    assert main(["batch", "fingerprint", "--plan", str(out / "plan"), "--store", str(root / "store"), "--output",
                 str(tmp_path / "fp.json")]) == 0
    assert main(["batch", "verify", "--plan", str(out / "plan"), "--store", str(root / "store"),
                 "--expected-fingerprint", str(tmp_path / "fp.json")]) == 0
    assert json.loads((tmp_path / "fp.json").read_text())["fingerprint"] == \
        json.loads((out / "batches.json").read_text())["batch_fingerprint"]["fingerprint"]


# ====================================================================== tampering, in every layout
def read_members(path, layout: Layout) -> dict:
    return layout.read(str(path))


def write_members(path, layout: Layout, members: dict) -> None:
    data = npz_bytes(members)
    if layout.compression == "zstd":
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    os.unlink(path)
    Path(path).write_bytes(data)


def copy_folder(world, tmp_path, label):
    shutil.copytree(world[0] / label, tmp_path / "out")
    reader = BatchReader(tmp_path / "out")
    return reader, reader.layout


def edit_token(members: dict, layout: Layout) -> dict:
    ids = members["input_ids"].copy()
    ids[1] += 1
    if layout.name == "npz":
        ids = members["input_ids"].copy()
        ids[0, 1] += 1
    return {**members, "input_ids": ids}


def decoded(members: dict, layout: Layout):
    if layout.name == "npz":
        return members["input_ids"], members["loss_mask"]
    batch = compact.decode(members, 0, "test")
    return batch.input_ids, batch.loss_mask


@pytest.mark.parametrize("label", [label for label, *_ in LAYOUTS])
def test_an_edited_token_is_caught(world, tmp_path, label):
    reader, layout = copy_folder(world, tmp_path, label)
    path = reader.path(1, 4)
    write_members(path, layout, edit_token(read_members(path, layout), layout))
    expect(errors.BATCH_FILE_INVALID, reader.verify, mention="hash to")
    assert main(["batch", "check", str(tmp_path / "out")]) == 2


@pytest.mark.parametrize("label", ["compact", "zstd"])
def test_only_the_store_finds_a_consistent_edit(world, tmp_path, label):
    reader, layout = copy_folder(world, tmp_path, label)
    path = reader.path(0, 2)
    members = edit_token(read_members(path, layout), layout)
    digest = microbatch_digest(*decoded(members, layout))
    members["fingerprint"] = np.array(digest)
    write_members(path, layout, members)
    index = json.loads((tmp_path / "out" / "batches.json").read_text())
    position = index["epochs"][0]["indices"].index(2)
    index["epochs"][0]["digests"][position] = digest
    fingerprint = index["batch_fingerprint"]
    fingerprint["digests"][fingerprint["positions"].index([0, 2])] = digest
    fingerprint["fingerprint"] = combine_digests(fingerprint["digests"])
    (tmp_path / "out" / "batches.json").write_text(json.dumps(index))
    reader = BatchReader(tmp_path / "out")
    assert reader.verify()["files"] == len(reader)
    expect(errors.BATCH_FILE_INVALID, reader.verify, world[0] / "store", mention="differs from what the token store")


def truncated(path, layout):
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[:len(data) // 2])


def wrong_token_type(path, layout):
    members = read_members(path, layout)
    write_members(path, layout, {**members, "input_ids": members["input_ids"].astype(np.int32)})


def wrong_mask_type(path, layout):
    members = read_members(path, layout)
    write_members(path, layout, {**members, "loss_mask": members["loss_mask"].astype(np.uint16)})


def stray_mask_bit(path, layout):
    members = read_members(path, layout)
    bits = members["loss_mask"].copy()
    bits[-1] |= 0x80  # past the last token unless the count is a multiple of 8
    write_members(path, layout, {**members, "loss_mask": bits})


def other_rows(path, layout):
    members = read_members(path, layout)
    sizes = members["row_sizes"].copy()
    sizes[0] += 1
    write_members(path, layout, {**members, "row_sizes": sizes})


def epoch_text(path, layout):
    write_members(path, layout, {**read_members(path, layout), "epoch": np.array("zero")})


def extra_member(path, layout):
    write_members(path, layout, {**read_members(path, layout), "labels": np.zeros(3, dtype=np.int32)})


@pytest.mark.parametrize("label", ["compact", "zstd"])
@pytest.mark.parametrize("damage, mention", [
    (truncated, "not a readable"),
    (wrong_token_type, "input_ids is <i4"),
    (wrong_mask_type, "loss_mask is <u2"),
    (other_rows, "other rows"),
    (extra_member, "members this format does not have: labels.npy"),
    (epoch_text, "epoch is 'zero'"),
])
def test_damaged_compact_files_are_refused(world, tmp_path, label, damage, mention):
    reader, layout = copy_folder(world, tmp_path, label)
    damage(reader.path(0, 3), layout)
    expect(errors.BATCH_FILE_INVALID, reader.verify, mention=mention)
    expect(errors.BATCH_FILE_INVALID, lambda: list(reader.iter_epoch(0)))
    expect(errors.BATCH_FILE_INVALID, reader.load, 0, 3)


def test_a_stray_mask_bit_is_refused(world, tmp_path):
    reader, layout = copy_folder(world, tmp_path, "compact")
    for mb in world[2].iter_epoch(0):
        members = read_members(reader.path(0, mb.index), layout)
        if members["input_ids"].size % 8:
            stray_mask_bit(reader.path(0, mb.index), layout)
            expect(errors.BATCH_FILE_INVALID, reader.load, 0, mb.index, mention="bits set past")
            return
    pytest.fail("no microbatch with a token count that is not a multiple of 8")


def test_a_corrupt_zstd_frame_is_refused(world, tmp_path):
    reader, _ = copy_folder(world, tmp_path, "zstd")
    path = Path(reader.path(0, 1))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    expect(errors.BATCH_FILE_INVALID, reader.load, 0, 1, mention="zstd")
    path.write_bytes(bytes(data[:4]))
    expect(errors.BATCH_FILE_INVALID, reader.load, 0, 1, mention="zstd frame")


# ====================================================================== resume, another layout
def test_resume_keeps_a_compact_folder_and_another_layout_is_another_job(world, tmp_path):
    root, store, plan, _ = world
    shutil.copytree(root / "compact", tmp_path / "out")
    report = write_batches(plan, tmp_path / "out", store)
    assert (report.written, report.kept, report.rewritten) == (0, plan.total_microbatches, 0)
    expect(errors.BATCH_OUTPUT_MISMATCH, write_batches, plan, tmp_path / "out", store, layout="npz",
           mention="format, layout, token_dtype")
    expect(errors.BATCH_OUTPUT_MISMATCH, write_batches, plan, tmp_path / "out", store, compression="zstd",
           mention="compression")
    report = write_batches(plan, tmp_path / "out", store, compression="zstd", force=True)
    assert report.written == plan.total_microbatches
    assert batch_files(tmp_path / "out") == batch_files(root / "zstd")  # the compact files are gone


def test_packed_plans_with_separators_in_every_layout(world, tmp_path):
    _, store, _, _ = world
    config = BatchingConfig(1024, (), 256, "pad_to_bucket", 11, pack=PackingConfig(256, "first_fit",
                                                                                    separator_len=2))
    plan = BatchPlanBuilder(store.length_cache(), config).build(1)
    seed = None
    for label, layout, compression in LAYOUTS:
        report = write_batches(plan, tmp_path / label, store, separator_ids=(2, 1), layout=layout,
                               compression=compression)
        reader = BatchReader(tmp_path / label)
        assert reader.verify(store)["files"] == plan.total_microbatches
        got = list(reader)
        seed = seed or (report.fingerprint, got)
        assert report.fingerprint == seed[0]
        for a, b in zip(seed[1], got):
            assert all(np.array_equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)


# ====================================================================== hypothesis: any store, any plan
class ArraySource:
    """A token source in memory (the protocol of tokens/sources.py that collation uses)."""

    def __init__(self, sequences, masks):
        self.sequences, self.masks = sequences, masks
        self.lengths = np.array([len(s) for s in sequences], dtype=np.uint32)

    def __len__(self):
        return len(self.sequences)

    def arrays(self, row):
        return self.sequences[row], self.masks[row]


@st.composite
def stores_and_plans(draw):
    count = draw(st.integers(1, 40))
    lengths = draw(st.lists(st.integers(1, 96), min_size=count, max_size=count))
    wide = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    high = (1 << 31) - 1 if wide else 1 << 16
    sequences = [rng.integers(0, high, n, dtype=np.int64).astype("<u4") for n in lengths]
    masks = [(rng.random(n) < draw(st.sampled_from([0.0, 0.5, 1.0]))).astype(np.uint8) for n in lengths]
    separators = ()
    if draw(st.booleans()):
        separators = tuple(draw(st.lists(st.integers(0, high - 1), max_size=2)))
        config = BatchingConfig(256, (), 128, "pad_to_bucket", draw(st.integers(0, 99)),
                                pack=PackingConfig(128, draw(st.sampled_from(["first_fit", "best_fit"])),
                                                   separator_len=len(separators)))
    else:
        edges = sorted(set(draw(st.lists(st.integers(1, 95), min_size=1, max_size=3))))
        policy = draw(st.sampled_from(["predictable", "throughput"]))
        config = getattr(BatchingConfig, policy)(token_budget=384, bucket_edges=tuple(edges), overflow_max=96,
                                                 seed=draw(st.integers(0, 99)))
    plan = BatchPlanBuilder(np.array(lengths, dtype=np.uint32), config, tokenizer_hash="t").build(1)
    return ArraySource(sequences, masks), plan, separators, wide, draw(st.integers(0, 7))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=stores_and_plans())
def test_every_layout_decodes_to_the_npz_arrays(case):
    source, plan, separators, wide, pad_id = case
    layouts = [Layout("npz"), Layout("compact", None, "<u4"), Layout("compact", "zstd", "<u4")]
    if not wide:
        layouts += [Layout("compact", None, "<u2"), Layout("compact", "zstd", "<u2")]
    with tempfile.TemporaryDirectory() as folder:
        for epoch, _, mb in plan.iter_from(0, 0):
            batch = collate_microbatch(source, mb, pad_id=pad_id, separator_ids=separators)
            seen = []
            for k, layout in enumerate(layouts):
                data, digest = layout.file_bytes(epoch, mb, batch, plan.fingerprint, pad_id)
                path = os.path.join(folder, f"{k}{layout.suffix}")
                with open(path, "wb") as handle:
                    handle.write(data)
                members = layout.read(path)
                layout.check(path, members, epoch, mb, plan.fingerprint, digest, pad_id)
                seen.append(layout.arrays(members, epoch, mb, plan.fingerprint, pad_id, path))
            for other in seen[1:]:
                assert list(other) == list(seen[0])
                for name in seen[0]:
                    assert other[name].dtype == seen[0][name].dtype and np.array_equal(other[name], seen[0][name])


# ====================================================================== batch verify --batches
@pytest.mark.parametrize("label", [label for label, *_ in LAYOUTS])
def test_verify_a_batch_folder_against_a_saved_fingerprint(world, tmp_path, capsys, label):
    """`batch verify --batches` hashes what the files decode to: a consistent edit (file and recorded
    digests changed together), which `batch check` without the store passes, is caught."""
    root, _, _, reports = world
    saved = tmp_path / "fp.json"
    assert main(["batch", "fingerprint", "--batches", str(root / label), "--n-batches", "20", "--output",
                 str(saved)]) == 0
    assert json.loads(saved.read_text())["fingerprint"] == \
        fingerprint_plan_batches(world[2], world[1], 20).fingerprint
    assert reports[label].fingerprint.digests[:20] == tuple(json.loads(saved.read_text())["digests"])
    assert main(["batch", "verify", "--batches", str(root / label), "--expected-fingerprint", str(saved)]) == 0
    reader, layout = copy_folder(world, tmp_path, label)
    path = reader.path(0, 2)
    members = edit_token(read_members(path, layout), layout)
    digest = microbatch_digest(*decoded(members, layout))
    if layout.name == "npz":
        members["labels"] = members["labels"].copy()
        members["labels"][0, 0] = members["input_ids"][0, 1] if members["loss_mask"][0, 1] else -100
    members["fingerprint"] = np.array(digest)
    write_members(path, layout, members)
    index = json.loads((tmp_path / "out" / "batches.json").read_text())
    index["epochs"][0]["digests"][index["epochs"][0]["indices"].index(2)] = digest
    fingerprint = index["batch_fingerprint"]
    fingerprint["digests"][fingerprint["positions"].index([0, 2])] = digest
    fingerprint["fingerprint"] = combine_digests(fingerprint["digests"])
    (tmp_path / "out" / "batches.json").write_text(json.dumps(index))
    capsys.readouterr()
    assert main(["batch", "check", str(tmp_path / "out")]) == 0
    assert main(["batch", "verify", "--batches", str(tmp_path / "out"), "--expected-fingerprint", str(saved)]) == 2
    err = capsys.readouterr().err
    assert "BATCH_FINGERPRINT_MISMATCH" in err and "epoch 0 microbatch 2" in err
    assert main(["batch", "verify", "--batches", str(tmp_path / "out"), "--plan", str(root / "plan"),
                 "--expected-fingerprint", str(saved)]) == 2
    assert "BATCHING_CONFIG_INVALID" in capsys.readouterr().err


def test_zstd_without_the_zstandard_package_names_the_extra(world, tmp_path, monkeypatch):
    root, store, plan, _ = world
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import zstandard raises ImportError
    expect(errors.BATCHING_CONFIG_INVALID, BatchWriter, plan, tmp_path / "z", store, compression="zstd",
           mention="pip install 'umlos-cuda[data]'")
    assert not (tmp_path / "z").exists()
    reader = BatchReader(root / "zstd")
    expect(errors.BATCH_FILE_INVALID, reader.load, 0, 0, mention="pip install 'umlos-cuda[data]'")
    assert int(BatchReader(root / "compact").load(0, 0)["index"]) == 0  # the default layout never needs it


# ====================================================================== index-only folders
def test_an_index_only_folder_collates_from_the_store(world, tmp_path, capsys):
    root, store, plan, reports = world
    out = tmp_path / "index"
    assert main(["batch", "generate", "--plan", str(root / "plan"), "--store", str(root / "store"), "--output",
                 str(out), "--layout", "index", "--quiet"]) == 0
    assert "index-only" in capsys.readouterr().out
    assert sorted(os.listdir(out)) == ["batches.json", "plan", "umlos-artifact.json"]  # no batch files
    index = json.loads((out / "batches.json").read_text())
    assert (index["format"], index["layout"], index["compression"], index["token_dtype"]) == \
        ("umlos_cuda.batch_files/2", "index", None, None)
    expect(errors.BATCH_STORE_MISMATCH, BatchReader, out, mention="index-only")
    reader = BatchReader(out, store=root / "store")
    assert reader.fingerprint == reports["npz"].fingerprint
    for a, b in zip(BatchReader(root / "npz"), reader):
        assert list(a) == list(b) and all(np.array_equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
    assert reader.verify()["files"] == reader.shard(0, 2).verify()["files"] + reader.shard(1, 2).verify()["files"]
    assert main(["batch", "check", str(out), "--store", str(root / "store")]) == 0
    assert f"ok  {plan.total_microbatches} microbatches of an index-only folder" in capsys.readouterr().out
    assert main(["batch", "check", str(out)]) == 2
    assert "BATCH_STORE_MISMATCH" in capsys.readouterr().err
    saved = tmp_path / "fp.json"
    assert main(["batch", "fingerprint", "--batches", str(out), "--store", str(root / "store"), "--output",
                 str(saved)]) == 0
    assert json.loads(saved.read_text())["fingerprint"] == reports["npz"].fingerprint.fingerprint
    expect(errors.BATCHING_CONFIG_INVALID, BatchWriter, plan, tmp_path / "x", store, layout="index",
           compression="zstd", mention="not index")


def test_an_index_only_folder_refuses_a_store_that_collates_otherwise(world, tmp_path):
    root, store, _, _ = world
    write_batches(world[2], tmp_path / "index", store, layout="index")
    shutil.copytree(root / "store", tmp_path / "store")
    tokens = np.load(tmp_path / "store" / "tokens.npy")
    tokens[:] = (tokens + 1) % store.vocab_size  # same lengths, ids and tokenizer: other tokens
    header = (tmp_path / "store" / "tokens.npy").read_bytes()[:-tokens.nbytes]
    (tmp_path / "store" / "tokens.npy").write_bytes(header + tokens.tobytes())
    reader = BatchReader(tmp_path / "index", store=tmp_path / "store")
    expect(errors.BATCH_FILE_INVALID, reader.load, 0, 0, mention="records")
    expect(errors.TOKEN_STORE_INVALID, reader.verify)  # the store's own digests first
    expect(errors.BATCH_FILE_INVALID, reader.verify, digests=False, mention="collates epoch 0 microbatch 0")


def test_a_sharded_store_writes_compact_files_like_one_store(world, tmp_path):
    """The source protocol (tokens/sources.py): a sharded store's vocabulary picks uint16 and its files
    read back as the npz layout's, in every layout."""
    from token_cases import write_dataset
    from umlos_cuda.batching.tokens.sharded import tokenize_sharded

    root = world[0]
    parts = [str(tmp_path / f"part-{i}.jsonl") for i in range(3)]
    for i, part in enumerate(parts):
        write_dataset(part, 30 + i, seed=20 + i, ids=False)
    sharded = tokenize_sharded(parts, root / "model", tmp_path / "sharded")
    plan = BatchPlanBuilder(sharded.length_cache(), CONFIG).build(1)
    readers = []
    for label, layout, compression in LAYOUTS + [("index", "index", None)]:
        write_batches(plan, tmp_path / label, tmp_path / "sharded", layout=layout, compression=compression)
        readers.append(BatchReader(tmp_path / label, store=tmp_path / "sharded"))
        assert readers[-1].verify(tmp_path / "sharded")["files"] == plan.total_microbatches
    assert readers[1].layout.token_dtype == "<u2"
    assert len({r.fingerprint for r in readers}) == 1
    for first, *others in zip(*readers):
        assert all(np.array_equal(first[k], o[k]) and first[k].dtype == o[k].dtype for o in others for k in first)
