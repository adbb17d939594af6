"""NextBatch_v1 (docs/spec/nextbatch-v1.md): the golden traces on
every backend, a bijection per epoch, strided shards, the pinned order, one
``misc`` draw, failures, and the ``next-batch-v1`` command."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest

import umlos_cuda as uc
from nbcases import raw_manifest
from umlos_cuda import errors
from umlos_cuda.cli import main
from umlos_cuda.rng.nextbatch_v1 import derived_manifest, next_batch_v1, shard_size
from umlos_cuda.rng.streams import RngStreams, consumes, draws_at
from umlos_cuda.rng.state_fingerprint import order_hash

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "golden", "nextbatch_v1.json")
RAW = raw_manifest(1000, 64, 48, seed=8)


def load_golden() -> dict:
    with open(GOLDEN, encoding="utf-8") as handle:
        return json.load(handle)


def test_golden_traces(backend):
    data = load_golden()
    assert data["format"] == "umlos-cuda/nextbatch-v1-golden"
    cases = [case for case in data["cases"] if case["kind"] == "shard"]
    assert len(cases) == 3 * 3 * len(data["manifests"])
    for case in cases:
        given = case["input"]
        raw = data["manifests"][given["manifest"]]
        for rank, expected in enumerate(case["expected"]["ranks"]):
            batch = next_batch_v1(raw, given["dataset"], given["world_size"], rank, given["epoch"], backend=backend)
            values = batch.indices.tolist()
            got = {"count": len(values), "sha256": hashlib.sha256(batch.indices.astype("<u8").tobytes()).hexdigest(),
                   "first_8": values[:8], "last_8": values[-8:]}
            assert got == expected, f"{case['id']} rank {rank}"
            assert batch.order_hash.hex() == case["expected"]["order_hash"]


@pytest.mark.parametrize("n,block_size,world_size", [(1, 8, 1), (2, 1, 3), (30, 8, 3), (1000, 64, 7), (1000, 1000, 8),
                                                     (1025, 1024, 4), (100, 7, 128)])
def test_shards_partition_the_epoch_and_are_strided(n, block_size, world_size):
    raw = raw_manifest(n, block_size, 48, seed=n)
    whole = next_batch_v1(raw, "train", 1, 0, 3, backend="numpy").indices
    assert sorted(whole.tolist()) == list(range(n))
    for rank in range(world_size):
        shard = next_batch_v1(raw, "train", world_size, rank, 3, backend="numpy").indices
        assert shard.tolist() == whole[rank::world_size].tolist()
        assert shard.size == shard_size(n, world_size, rank)


def test_strides_longer_than_a_chunk(monkeypatch):
    from umlos_cuda.rng import nextbatch_v1

    whole = next_batch_v1(RAW, "train", 1, 0, 0, backend="numpy").indices
    monkeypatch.setattr(nextbatch_v1, "CHUNK", 10)
    for world_size, rank in ((3, 2), (32, 5), (999, 998)):
        assert next_batch_v1(RAW, "train", world_size, rank, 0, backend="numpy").indices.tolist() == \
            whole[rank::world_size].tolist()


def test_the_order_is_v2s_train_order_of_the_derived_manifest():
    derived = derived_manifest(RAW, "train")
    assert derived.canonical["extra"] == {"derived_for": "UML_OS.Data.NextBatch_v1",
                                          "manifest_hash": uc.Manifest.from_dict(RAW).hash.hex()}
    assert (derived.seed, derived.drop_last, derived.sampler_block_size) == (0, False, 64)
    for epoch in (0, 5):
        v1 = next_batch_v1(RAW, "train", 1, 0, epoch, backend="numpy")
        assert v1.indices.tolist() == uc.epoch_indices(derived, "train", epoch=epoch, backend="numpy").tolist()
        assert v1.order_hash == order_hash(derived, "train", epoch)
        assert v1.indices.tolist() != uc.epoch_indices(RAW, "train", epoch=epoch, backend="numpy").tolist()


def test_the_order_depends_on_the_manifest_hash_and_the_epoch_only():
    base = next_batch_v1(RAW, "train", 1, 0, 0, backend="numpy").indices.tolist()
    assert next_batch_v1(RAW, "train", 1, 0, 1, backend="numpy").indices.tolist() != base
    assert next_batch_v1(raw_manifest(1000, 64, 48, seed=9), "train", 1, 0, 0, backend="numpy").indices.tolist() != base
    # Any change of the manifest changes its hash, hence the order, even one that v2's train order ignores.
    assert next_batch_v1(raw_manifest(1000, 64, 96, seed=8), "train", 1, 0, 0, backend="numpy").indices.tolist() != base
    # drop_last never drops a sample in v1.
    dropped = next_batch_v1(raw_manifest(1000, 64, 48, seed=8, drop_last=True), "train", 1, 0, 0, backend="numpy")
    assert sorted(dropped.indices.tolist()) == list(range(1000))


def test_exactly_one_misc_draw_with_streams_and_none_without():
    streams = RngStreams.from_manifest(RAW)
    streams.draw("misc", 5)
    batch = next_batch_v1(RAW, "train", 2, 1, 0, streams=streams, backend="numpy")
    assert streams.offsets == {"init": 0, "cluster": 0, "misc": 6}
    assert batch.misc_draw == int(draws_at(streams.master_seed, "misc", 5, 1)[0])
    assert (batch.metadata["misc_offset_before"], batch.metadata["misc_offset_after"]) == (5, 6)
    table = {d.operator: (d.stream, d.draws) for d in streams.accountant.declarations()}
    assert table == {"UML_OS.Data.NextBatch_v1": ("misc", 1)}
    assert streams.accountant.cursor == (0, 0, batch.order_hash)
    plain = next_batch_v1(RAW, "train", 2, 1, 0, backend="numpy")
    assert plain.misc_draw is None and plain.indices.tolist() == batch.indices.tolist()


def test_inside_an_operator_that_declares_it_the_draw_is_counted():
    streams = RngStreams.from_manifest(RAW)
    with consumes(streams, "misc", 2, operator="test.TwoEpochs_v1"):
        next_batch_v1(RAW, "train", 1, 0, 0, streams=streams, backend="numpy")
        next_batch_v1(RAW, "train", 1, 0, 1, streams=streams, backend="numpy")
    with pytest.raises(uc.UmlosError) as info, consumes(streams, operator="test.ClaimsNone_v1"):
        next_batch_v1(RAW, "train", 1, 0, 2, streams=streams, backend="numpy")
    assert info.value.code == errors.RNG_CONSUMPTION_VIOLATION
    assert info.value.record["failure_operator"] == "test.ClaimsNone_v1"


@pytest.mark.parametrize("code,raw,key,world_size,rank,epoch", [
    (errors.INVALID_DATASET_KEY, RAW, "val", 1, 0, 0),
    (errors.CARDINALITY_MISMATCH, raw_manifest(0, 64, 48), "train", 1, 0, 0),
    (errors.BATCH_SIZE_INCONSISTENT, raw_manifest(10, 0, 48), "train", 1, 0, 0),
    (errors.INVALID_MANIFEST, RAW, "train", 1, 0, -1),
    (errors.INVALID_MANIFEST, RAW, "train", 1.0, 0, 0),
    (errors.INVALID_RANK, RAW, "train", 0, 0, 0),
    (errors.INVALID_RANK, RAW, "train", 4, 4, 0),
    (errors.INVALID_RANK, RAW, "train", 2**32, 0, 0),
    (errors.INVALID_MANIFEST, {**RAW, "seed": -1}, "train", 1, 0, 0),
])
def test_failures_name_v1_and_draw_nothing(code, raw, key, world_size, rank, epoch):
    streams = RngStreams.from_manifest(raw_manifest(5, 1, 1))
    with pytest.raises(uc.UmlosError) as info:
        next_batch_v1(raw, key, world_size, rank, epoch, streams=streams, backend="numpy", t=12)
    assert info.value.code == code
    assert info.value.record["failure_operator"] == errors.NEXTBATCH_V1_OPERATOR
    assert info.value.record["t"] == 12
    assert streams.offsets["misc"] == 0 and streams.accountant.open_operators() == []


def test_a_shard_too_large_is_refused_before_anything_is_computed(monkeypatch):
    monkeypatch.setenv("UMLOS_MAX_INDICES", "100")
    with pytest.raises(uc.UmlosError) as info:
        next_batch_v1(RAW, "train", 2, 0, 0, backend="numpy")
    assert info.value.code == errors.REQUEST_TOO_LARGE
    assert next_batch_v1(RAW, "train", 10, 0, 0, backend="numpy").indices.size == 100


def test_public_entry_point():
    assert uc.next_batch_v1 is next_batch_v1


# ---------------------------------------------------------------- CLI
def write_manifest(tmp_path) -> str:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(RAW))
    return str(path)


def test_cli_json_matches_the_api(tmp_path, capsys):
    path = write_manifest(tmp_path)
    assert main(["next-batch-v1", path, "--dataset", "train", "--world-size", "3", "--rank", "2", "--epoch", "4",
                 "--misc-offset", "9", "--backend", "numpy", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    streams = RngStreams.from_manifest(RAW)
    assert out["indices"] == next_batch_v1(RAW, "train", 3, 2, 4, backend="numpy").indices.tolist()
    assert out["misc_draw"] == int(draws_at(streams.master_seed, "misc", 9, 1)[0])
    assert out["metadata"]["misc_offset_after"] == 10 and out["metadata"]["operator"] == "UML_OS.Data.NextBatch_v1"


def test_cli_npy_and_summary(tmp_path, capsys):
    path = write_manifest(tmp_path)
    target = tmp_path / "shard.npy"
    assert main(["next-batch-v1", path, "--dataset", "train", "--world-size", "4", "--rank", "1",
                 "--backend", "numpy", "--out", str(target)]) == 0
    assert np.load(target).tolist() == next_batch_v1(RAW, "train", 4, 1, 0, backend="numpy").indices.tolist()
    assert main(["next-batch-v1", path, "--dataset", "train", "--backend", "numpy"]) == 0
    out = capsys.readouterr().out
    assert "(1000 in all)" in out and "order_hash" in out and "misc draw" not in out


def test_cli_errors_exit_2(tmp_path, capsys):
    path = write_manifest(tmp_path)
    assert main(["next-batch-v1", path, "--dataset", "nope"]) == 2
    assert capsys.readouterr().err.startswith("error INVALID_DATASET_KEY:")
    assert main(["next-batch-v1", path, "--dataset", "train", "--world-size", "2", "--rank", "2"]) == 2
    assert "INVALID_RANK" in capsys.readouterr().err


def test_cli_help_is_plain_words_with_defaults():
    import argparse

    from umlos_cuda.cli import build_parser

    root = build_parser()
    parser = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction)).choices["next-batch-v1"]
    text = " ".join(parser.format_help().split())
    assert "``" not in text and "§" not in text and parser.description.endswith(".")
    assert all(action.help for action in parser._actions if action.option_strings)
    for phrase in ("any W >= 1 (default 1)", "0 to W-1 (default 0)", "(default: no draw)", "(default auto)"):
        assert phrase in text
