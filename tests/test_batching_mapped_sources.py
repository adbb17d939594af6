"""Token sources read by rows (``umlos_cuda.batching.sources.open_source``: tokens/mapped.py, tokens/offsets.py): the
same lengths,
binding and fingerprints as the copying readers, the same folders from the CLI as before, and one header
parser for both Megatron readers."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from batching_cases import expect
from token_cases import random_sequences, write_megatron, write_token_sources

from umlos_cuda import errors
from umlos_cuda.batching.plans.windows import ArrayLengths
from umlos_cuda.batching.tokens.megatron import MegatronDataset
from umlos_cuda.batching.tokens.offsets import ShardedLengths, StoreLengths
from umlos_cuda.batching.sources import open_source
from umlos_cuda.batching.tokens.mapped import MappedMegatron
from umlos_cuda.batching.tokens.sources import open_token_source
from umlos_cuda.cli import main

KINDS = ("megatron", "store", "sharded")


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, str]:
    """A Megatron prefix, a token store and a sharded store of two shards."""
    return write_token_sources(tmp_path_factory.mktemp("mapped"))


@pytest.mark.parametrize("kind", KINDS)
def test_mapped_sources_read_and_bind_like_the_copying_readers(sources, kind):
    mapped, whole = open_source(sources[kind]), open_token_source(sources[kind])
    assert type(mapped) is {"megatron": MappedMegatron, "store": StoreLengths, "sharded": ShardedLengths}[kind]
    lengths = np.asarray(whole.lengths, dtype=np.uint32)
    assert mapped.count == len(whole) == lengths.shape[0]
    rows = np.random.default_rng(5).permutation(lengths.shape[0])
    for order in (rows, np.sort(rows[:7]), rows[:1], rows[:0], rows.astype(np.uint64)):
        taken = mapped.take(order)
        assert taken.dtype == np.uint32 and np.array_equal(taken, lengths[order.astype(np.int64)])
    assert mapped.binding() == ArrayLengths(lengths).binding()
    for row in (0, int(rows[3]), lengths.shape[0] - 1):
        for got, want in zip(mapped.arrays(row), whole.arrays(row)):
            assert np.array_equal(got, want)
    mapped.release()
    assert np.array_equal(mapped.take(rows), lengths[rows])  # pages dropped are read again


def test_hashing_in_pieces_binds_as_one_piece(sources, monkeypatch):
    """The piecewise SHA-256 over the mapped offsets crosses pieces and shards exactly as one hash would."""
    from umlos_cuda.batching.tokens import offsets, store

    monkeypatch.setattr(offsets, "OFFSETS_PIECE", 7)
    monkeypatch.setattr(store, "OFFSETS_PIECE", 7)
    for kind in ("store", "sharded"):
        whole = open_token_source(sources[kind])
        assert open_source(sources[kind]).binding() == ArrayLengths(whole.lengths).binding()


def test_a_token_store_opens_without_copying_its_lengths(sources):
    from umlos_cuda.batching.tokens.store import TokenStore, rises

    store = TokenStore.open(sources["store"])
    assert store._lengths is None  # computed on first use only
    assert np.array_equal(store.lengths, np.diff(store.offsets)) and not store.lengths.flags.writeable
    assert rises(np.asarray([0, 0, 3, 9])) and not rises(np.asarray([0, 4, 3, 9])) and rises(np.asarray([0]))


def _copy_megatron(prefix: str, here: Path) -> str:
    target = str(here / "m")
    for suffix in (".idx", ".bin"):
        Path(target + suffix).write_bytes(Path(prefix + suffix).read_bytes())
    return target


def _patch(prefix: str, offset: int, data: bytes) -> None:
    raw = bytearray(Path(prefix + ".idx").read_bytes())
    raw[offset:offset + len(data)] = data
    Path(prefix + ".idx").write_bytes(bytes(raw))


HEADER_EDITS = {
    "magic": lambda p: _patch(p, 0, b"NOTMEGA\x00\x00"),
    "version": lambda p: _patch(p, 9, struct.pack("<Q", 2)),
    "float-dtype": lambda p: _patch(p, 17, bytes([6])),
    "unknown-dtype": lambda p: _patch(p, 17, bytes([9])),
    "count": lambda p: _patch(p, 18, struct.pack("<Q", 11)),
    "truncated": lambda p: os.truncate(p + ".idx", os.path.getsize(p + ".idx") - 3),
    "header-only": lambda p: Path(p + ".idx").write_bytes(b"MMIDIDX"),
    "no-idx": lambda p: os.unlink(p + ".idx"),
    "no-bin": lambda p: os.unlink(p + ".bin"),
}


@pytest.mark.parametrize("edit", HEADER_EDITS, ids=list(HEADER_EDITS))
def test_both_megatron_readers_refuse_a_header_alike(sources, tmp_path, edit):
    """One header parser (megatron.py ``read_idx_header``): the same code and message from either reader."""
    prefix = _copy_megatron(sources["megatron"], tmp_path)
    HEADER_EDITS[edit](prefix)
    whole = expect(errors.MEGATRON_INDEX_INVALID, MegatronDataset.open, prefix)
    mapped = expect(errors.MEGATRON_INDEX_INVALID, MappedMegatron, prefix)
    assert whole.message == mapped.message


def test_an_empty_index_is_refused_by_both_readers(tmp_path):
    prefix = write_megatron(tmp_path / "e", [], np.int32, document_ends=[])
    expect(errors.MEGATRON_INDEX_INVALID, MegatronDataset.open, prefix, mention="no sequence")
    expect(errors.MEGATRON_INDEX_INVALID, MappedMegatron, prefix, mention="no sequence")


@pytest.mark.parametrize("offset, data, mention", [
    (34 + 4 * 77, struct.pack("<i", -1), "sequence 77 has a negative length"),
    (34 + 4 * 130 + 8 * 129, struct.pack("<q", 10 ** 9), "sequence 129 points at bytes 1000000000"),
    (34 + 4 * 130 + 8 * 5, struct.pack("<q", 2), "not aligned to 4 bytes"),
    (34 + 4 * 130 + 8 * 5, struct.pack("<q", (1 << 63) - 4), "sequence 5 points at"),
])
def test_check_rows_refuses_in_pieces_what_opening_a_dataset_refuses(sources, tmp_path, monkeypatch, offset, data,
                                                                      mention):
    from umlos_cuda.batching.tokens import mapped

    monkeypatch.setattr(mapped, "_HASH_PIECE", 16)  # the bad row lies in a later piece
    prefix = _copy_megatron(sources["megatron"], tmp_path)
    _patch(prefix, offset, data)
    whole = expect(errors.MEGATRON_INDEX_INVALID, MegatronDataset.open, prefix, mention=mention)
    mapped = expect(errors.MEGATRON_INDEX_INVALID, MappedMegatron(prefix).check_rows, mention=mention)
    assert whole.message == mapped.message


# ---------------------------------------------------------------------- the CLI: the same folders as before
def _cli(*argv: str) -> int:
    return main(list(argv))


def _copying(path, **_):
    """What the commands opened before reading by rows: the whole source, its lengths held in memory."""
    copied = _Copied(open_token_source(path))
    copied.origin = path
    return copied


class _Copied(ArrayLengths):
    """The old path: ``ArrayLengths(open_token_source(path).lengths)``, tokens from the whole source."""

    def __init__(self, source) -> None:
        super().__init__(np.asarray(source.lengths, dtype=np.uint32))
        self.arrays = source.arrays

    def __len__(self) -> int:
        return self.count


def _same_folders(a: Path, b: Path, names=("meta.json", "index.npy")) -> None:
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.parametrize("kind", KINDS)
def test_plan_cut_writes_the_folder_the_copying_reader_wrote(sources, tmp_path, monkeypatch, capsys, kind):
    argv = ("plan", "cut", "--tokens", sources[kind], "--sequence-length", "64", "--window", "8", "--eos", "2",
            "--epochs", "2", "--show", "3")
    assert _cli(*argv, "--output", str(tmp_path / "mapped")) == 0
    shown = capsys.readouterr().out.splitlines()[-1]
    with monkeypatch.context() as patch:
        from umlos_cuda.commands import _plan_windows as command

        patch.setattr(command, "cut_source", open_token_source)  # what plan cut opened before
        assert _cli(*argv, "--output", str(tmp_path / "copied")) == 0
    assert capsys.readouterr().out.splitlines()[-1] == shown
    _same_folders(tmp_path / "mapped", tmp_path / "copied")
    assert _cli("plan", "verify", str(tmp_path / "mapped")) == 0
    from umlos_cuda.batching.plans.windows import load_sequences

    reopened = load_sequences(tmp_path / "mapped")
    assert json.loads(shown)["input_ids"] == reopened.sample(0, 3)["input_ids"].tolist()


def test_plan_cut_mix_writes_the_folder_the_copying_reader_wrote(sources, tmp_path, monkeypatch, capsys):
    argv = ("plan", "cut", "--mix", f"{sources['store']}:0.5", f"{sources['sharded']}:0.3:2",
            f"{sources['megatron']}:0.2:1", "--num-samples", "60", "--sequence-length", "32", "--window", "8",
            "--eos", "2", "--show", "5")
    assert _cli(*argv, "--output", str(tmp_path / "mapped")) == 0
    shown = capsys.readouterr().out.splitlines()[-1]
    with monkeypatch.context() as patch:
        from umlos_cuda.commands import _plan_windows as command

        patch.setattr(command, "cut_source", open_token_source)
        assert _cli(*argv, "--output", str(tmp_path / "copied")) == 0
    assert capsys.readouterr().out.splitlines()[-1] == shown
    _same_folders(tmp_path / "mapped", tmp_path / "copied")
    assert _cli("plan", "verify", str(tmp_path / "mapped")) == 0


def test_plan_cut_refuses_a_pointer_outside_the_bin_before_writing(sources, tmp_path, capsys):
    prefix = _copy_megatron(sources["megatron"], tmp_path)
    _patch(prefix, 34 + 4 * 130 + 8 * 100, struct.pack("<q", 10 ** 9))
    assert _cli("plan", "cut", "--tokens", prefix, "--sequence-length", "64", "--output", str(tmp_path / "out")) == 2
    err = capsys.readouterr().err
    assert errors.MEGATRON_INDEX_INVALID in err and "sequence 100 points at" in err
    assert not (tmp_path / "out").exists()


def test_plan_build_mix_writes_the_folder_the_copying_reader_wrote(sources, tmp_path, monkeypatch, capsys):
    argv = ("plan", "build", "--window", "16", "--bucket-edges", "64,128", "--overflow-max", "1024",
            "--token-budget", "2048", "--quiet", "--mix", f"{sources['store']}:0.5:2", f"{sources['sharded']}:0.3:2",
            f"{sources['megatron']}:0.2:1")
    assert _cli(*argv, "--output", str(tmp_path / "mapped")) == 0
    with monkeypatch.context() as patch:
        from umlos_cuda.batching import sources as opener

        patch.setattr(opener, "open_source", _copying)
        assert _cli(*argv, "--output", str(tmp_path / "copied")) == 0
    _same_folders(tmp_path / "mapped", tmp_path / "copied")
    capsys.readouterr()
    assert _cli("plan", "verify", str(tmp_path / "mapped"), "--windows", "3") == 0
    assert _cli("plan", "info", str(tmp_path / "mapped")) == 0
    assert "meg: weight 0.2" in capsys.readouterr().out


@pytest.mark.parametrize("kind", KINDS)
def test_plan_build_window_takes_a_token_source_as_lengths(sources, tmp_path, monkeypatch, capsys, kind):
    """``--window --lengths PREFIX|STORE``: the lengths read by rows, the path recorded; the plan is the one built
    from the same lengths held in memory (and, for a store, from its own length cache), and plan info/verify
    reopen it from meta.json's ``lengths_path``."""
    argv = ("plan", "build", "--window", "16", "--bucket-edges", "64,128", "--overflow-max", "1024",
            "--token-budget", "2048", "--epochs", "2", "--quiet", "--lengths")
    out = tmp_path / "mapped"
    assert _cli(*argv, sources[kind], "--output", str(out)) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["lengths_path"] == os.path.abspath(sources[kind])
    assert meta["lengths"] == ArrayLengths(open_token_source(sources[kind]).lengths).binding()
    with monkeypatch.context() as patch:
        from umlos_cuda.batching import sources as opener

        patch.setattr(opener, "open_source", _copying)
        assert _cli(*argv, sources[kind], "--output", str(tmp_path / "copied")) == 0
    _same_folders(out, tmp_path / "copied")
    if kind == "store":  # the store's own length cache: the same plan, another lengths_path
        assert _cli(*argv, os.path.join(sources[kind], "lengths.jsonl"), "--output", str(tmp_path / "cache")) == 0
        assert (tmp_path / "cache" / "index.npy").read_bytes() == (out / "index.npy").read_bytes()
        assert json.loads((tmp_path / "cache" / "meta.json").read_text())["fingerprint"] == meta["fingerprint"]
    capsys.readouterr()
    assert _cli("plan", "verify", str(out)) == 0
    printed = capsys.readouterr().out
    assert meta["fingerprint"] in printed and "the lengths hash to their binding" in printed
    assert _cli("plan", "verify", str(out), "--lengths", sources[kind], "--windows", "2") == 0
    capsys.readouterr()
    assert _cli("plan", "info", str(out), "--json") == 0
    assert json.loads(capsys.readouterr().out)["fingerprint"] == meta["fingerprint"]


def test_a_windowed_plan_refuses_another_token_source(sources, tmp_path, capsys):
    out = tmp_path / "plan"
    assert _cli("plan", "build", "--window", "16", "--bucket-edges", "64,128", "--overflow-max", "1024",
                "--token-budget", "2048", "--quiet", "--lengths", sources["megatron"], "--output", str(out)) == 0
    other = write_megatron(tmp_path / "other", random_sequences(130, seed=9, high=200), np.int32)
    capsys.readouterr()
    assert _cli("plan", "verify", str(out), "--lengths", other) == 2
    assert errors.PLAN_LENGTHS_MISMATCH in capsys.readouterr().err
    _patch(_copy_megatron(sources["megatron"], tmp_path), 34, struct.pack("<i", -1))
    assert _cli("plan", "build", "--window", "16", "--bucket-edges", "64,128", "--overflow-max", "1024",
                "--token-budget", "2048", "--quiet", "--lengths", str(tmp_path / "m"), "--output",
                str(tmp_path / "neg")) == 2
    assert "a sequence has a negative length" in capsys.readouterr().err and not (tmp_path / "neg").exists()


@pytest.mark.parametrize("kind", KINDS)
def test_a_mapped_source_pickles_as_its_path(sources, kind):
    import pickle

    mapped = open_source(sources[kind])
    data = pickle.dumps(mapped)
    assert len(data) < 4096  # no map copied
    again = pickle.loads(data)
    assert type(again) is type(mapped) and again.binding() == mapped.binding()
    assert np.array_equal(again.take(np.arange(mapped.count)), mapped.take(np.arange(mapped.count)))


def test_a_torch_sampler_reopens_a_windowed_plan_over_a_token_source(sources, tmp_path):
    """PlanBatchSampler and PlanCollator open a plan folder whose lengths_path is a Megatron prefix the way the
    commands do: the plan reopens the source it records (``open_source``), by rows."""
    pytest.importorskip("torch")
    from umlos_cuda.batching.plans.windows import load_windowed_plan
    from umlos_cuda.torch import PlanBatchSampler, PlanCollator

    out = tmp_path / "plan"
    assert _cli("plan", "build", "--window", "16", "--bucket-edges", "64,128", "--overflow-max", "1024",
                "--token-budget", "2048", "--quiet", "--lengths", sources["megatron"], "--output", str(out)) == 0
    assert isinstance(load_windowed_plan(out).source, MappedMegatron)
    held = load_windowed_plan(out, lengths=ArrayLengths(open_token_source(sources["megatron"]).lengths))
    sampler = PlanBatchSampler(str(out), rank=0, world_size=1)
    assert sampler.plan.fingerprint == held.fingerprint
    assert [list(batch) for batch in sampler] == [list(batch) for batch in PlanBatchSampler(held, rank=0,
                                                                                             world_size=1)]
    assert PlanCollator(str(out)).config == held.config
    assert _cli("plan", "build", "--window", "16", "--bucket-edges", "64,128", "--overflow-max", "1024",
                "--token-budget", "2048", "--quiet", "--lengths", os.path.join(sources["store"], "lengths.jsonl"),
                "--output", str(tmp_path / "sidecar")) == 0
    assert type(load_windowed_plan(tmp_path / "sidecar").source).__name__ == "MappedLengths"
    assert PlanBatchSampler(str(tmp_path / "sidecar"), rank=0, world_size=1).plan.num_epochs == 1
