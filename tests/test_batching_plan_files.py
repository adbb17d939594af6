"""Plan folders: the documented layout, byte-identical files, atomic writes, loading,
``plan verify`` and every failure code, and the ``umlos-cuda plan`` commands."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import umlos_cuda as uc
from umlos_cuda import errors
from umlos_cuda.batching.plans import io as plan_io
from umlos_cuda.batching.plans.builder import BatchPlanBuilder
from umlos_cuda.batching.plans.config import BatchingConfig
from umlos_cuda.batching.lengths.cache import LengthCache
from umlos_cuda.batching import load_plan, save_plan, shard_plan
from umlos_cuda.batching.plans.plan import BatchPlan, EpochPlan
from umlos_cuda.batching.plans.fingerprint import finish_meta
from umlos_cuda.batching.plans.verify import verify_plan
from umlos_cuda.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAN_CODES = [errors.BATCHING_CONFIG_INVALID] + [v for k, v in vars(errors).items() if k.startswith("PLAN_")]


def expect(code, function, *args, **kwargs):
    with pytest.raises(uc.UmlosError) as info:
        function(*args, **kwargs)
    assert info.value.code == code, info.value.message
    return info.value


def lengths_of(n=1500, seed=0):
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(5.0, 1.0, n), 0, 3000).astype(np.uint32)


def build(n=1500, ids=True, epochs=2, config=None):
    lengths = lengths_of(n)
    config = config or BatchingConfig.predictable(8192, (128, 256, 512, 1024), 2048, seed=11)
    names = [f"s{i:05d}" for i in range(n)] if ids else None
    return BatchPlanBuilder(lengths, config, sample_ids=names, tokenizer_hash="tok").build(epochs)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plans") / "plan"
    save_plan(build(), folder)
    return str(folder)


def copy(saved, tmp_path):
    target = str(tmp_path / "plan")
    shutil.copytree(saved, target)
    return target


# --------------------------------------------------------------- layout
def test_the_documented_layout(saved):
    assert sorted(os.listdir(saved)) == ["epoch_0", "epoch_1", "lengths.npy", "meta.json", "sample_ids.jsonl",
                                         "umlos-artifact.json"]
    assert sorted(os.listdir(os.path.join(saved, "epoch_0"))) == [
        "bucket_ids.npy", "max_len.npy", "microbatches.jsonl", "offsets.npy", "samples.npy", "stats.json"]
    meta = json.loads(Path(os.path.join(saved, "meta.json")).read_text())
    for field in ("dataset_hash", "tokenizer_hash", "bucket_edges", "token_budget", "pack_config", "pad_policy",
                  "version", "seed", "sampling_mode", "sampler_config_hash", "fingerprint", "num_epochs"):
        assert field in meta
    assert meta["pad_policy"] == "pad_to_bucket" and meta["pack_config"] is None and meta["seed"] == 11
    plan = load_plan(saved)
    with open(os.path.join(saved, "epoch_1", "microbatches.jsonl")) as handle:
        lines = handle.read().splitlines()
    assert len(lines) == len(plan.epochs[1])
    for j, line in enumerate(lines):
        item = json.loads(line)
        assert list(item) == ["index", "samples", "bucket_id", "max_len", "packs"]
        assert item["index"] == j and item["packs"] is None
        assert item == plan.microbatch(1, j).to_json()
    stats = json.loads(Path(os.path.join(saved, "epoch_0", "stats.json")).read_text())
    assert stats["samples"] + stats["skipped_samples"] == 1500
    assert stats["padding_tokens"] == stats["padded_tokens"] - stats["tokens"]
    assert stats["padding_waste"] == pytest.approx(stats["padding_tokens"] / stats["padded_tokens"])
    assert sum(b["samples"] for b in stats["bucket_histogram"]) == stats["samples"]
    assert stats["skipped"] and all(re.fullmatch(r"s\d{5}", s) for s in stats["skipped"])


def test_files_are_byte_identical(tmp_path, saved):
    save_plan(build(), tmp_path / "again")
    for folder, _, files in os.walk(saved):
        for name in files:
            other = os.path.join(tmp_path / "again", os.path.relpath(os.path.join(folder, name), saved))
            assert Path(os.path.join(folder, name)).read_bytes() == Path(other).read_bytes(), name


def test_jsonl_modes_and_jsonl_only_folders(tmp_path, saved):
    plan = load_plan(saved)
    save_plan(plan, tmp_path / "never", jsonl="never")
    assert not os.path.exists(tmp_path / "never" / "epoch_0" / "microbatches.jsonl")
    assert load_plan(tmp_path / "never").fingerprint == plan.fingerprint
    only = copy(saved, tmp_path)
    for e in range(2):
        for name in ("offsets", "samples", "bucket_ids", "max_len"):
            os.unlink(os.path.join(only, f"epoch_{e}", f"{name}.npy"))
    assert verify_plan(only)["fingerprint"] == plan.fingerprint  # the JSONL carries the whole plan
    expect(errors.BATCHING_CONFIG_INVALID, save_plan, plan, tmp_path / "x", jsonl="sometimes")


def test_row_number_ids_store_no_id_file(tmp_path):
    plan = build(300, ids=False, epochs=1)
    save_plan(plan, tmp_path / "p")
    assert "sample_ids.jsonl" not in os.listdir(tmp_path / "p")
    assert next(load_plan(tmp_path / "p").iter_epoch(0)).samples == tuple(str(r) for r in next(plan.iter_epoch(0)).rows)


# --------------------------------------------------------------- atomic writes
def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    plan = build(400, epochs=2)
    calls = []

    def failing(folder, name, array):
        calls.append(name)
        if len(calls) == 6:
            raise OSError(28, "No space left on device")
        original(folder, name, array)

    original = plan_io._write_npy
    monkeypatch.setattr(plan_io, "_write_npy", failing)
    expect(errors.OUTPUT_WRITE_FAILED, save_plan, plan, tmp_path / "plan")
    assert os.listdir(tmp_path) == []  # neither the plan nor its temp folder


def test_existing_outputs(tmp_path):
    plan = build(200, epochs=1)
    save_plan(plan, tmp_path / "plan")
    expect(errors.OUTPUT_EXISTS, save_plan, plan, tmp_path / "plan")
    other = build(200, epochs=2)
    save_plan(other, tmp_path / "plan", force=True)
    assert load_plan(tmp_path / "plan").fingerprint == other.fingerprint
    assert sorted(os.listdir(tmp_path)) == ["plan"]
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    expect(errors.OUTPUT_PATH_INVALID, save_plan, plan, tmp_path / "notes", force=True)
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine"
    (tmp_path / "file").write_text("")
    expect(errors.OUTPUT_PATH_INVALID, save_plan, plan, tmp_path / "file", force=True)
    expect(errors.OUTPUT_PATH_INVALID, save_plan, plan, tmp_path / "missing" / "plan")


def test_a_half_written_folder_does_not_load(tmp_path, saved):
    folder = copy(saved, tmp_path)
    os.unlink(os.path.join(folder, "meta.json"))  # meta.json is written last
    expect(errors.PLAN_NOT_FOUND, load_plan, folder)
    expect(errors.PLAN_NOT_FOUND, load_plan, tmp_path / "nothing")


# --------------------------------------------------------------- load and verify failures
def edit_json(path, change):
    value = json.loads(Path(path).read_text())
    change(value)
    with open(path, "w") as handle:
        json.dump(value, handle, indent=2)


def edit_npy(path, change):
    array = np.load(path).copy()
    change(array)
    np.save(path, array)


def test_verify_passes(saved):
    report = verify_plan(saved, expected_fingerprint=load_plan(saved).fingerprint)
    assert len(report["checks"]) == 5


def tamper_cases():
    def meta(change):
        return lambda d: edit_json(os.path.join(d, "meta.json"), change)

    def npy(name, change, epoch=0):
        return lambda d: edit_npy(os.path.join(d, f"epoch_{epoch}", f"{name}.npy"), change)

    def jsonl_line(d):
        path = os.path.join(d, "epoch_0", "microbatches.jsonl")
        lines = Path(path).read_text().splitlines()
        item = json.loads(lines[0])
        item["samples"] = item["samples"][::-1]
        lines[0] = json.dumps(item)
        Path(path).write_text("\n".join(lines) + "\n")

    def swap_microbatches(d):
        plan = load_plan(d, mmap=False)
        epoch = plan.epochs[0]
        sizes, ids = epoch.sizes(), np.asarray(epoch.bucket_ids)
        a = 0
        b = next(j for j in range(1, len(epoch)) if ids[j] == ids[a] and sizes[j] == sizes[a])
        samples = np.asarray(epoch.samples).copy()
        lo_a, lo_b, size = int(epoch.offsets[a]), int(epoch.offsets[b]), int(sizes[a])
        samples[lo_a:lo_a + size], samples[lo_b:lo_b + size] = \
            epoch.samples[lo_b:lo_b + size], epoch.samples[lo_a:lo_a + size]
        swapped = EpochPlan(0, epoch.offsets, samples, epoch.bucket_ids, epoch.max_len, epoch.stats)
        epochs = [swapped] + plan.epochs[1:]
        forged = BatchPlan(finish_meta(plan.meta, epochs), epochs, plan.lengths, plan.sample_ids)
        save_plan(forged, d, force=True)

    return [
        ("PLAN_NOT_FOUND", lambda d: os.unlink(os.path.join(d, "meta.json"))),
        ("PLAN_FORMAT_INVALID", meta(lambda m: m.update(format="other/9"))),
        ("PLAN_FORMAT_INVALID", meta(lambda m: m.pop("lengths_sha256"))),
        ("PLAN_FORMAT_INVALID", meta(lambda m: m.update(colour="blue"))),
        ("PLAN_FORMAT_INVALID", meta(lambda m: m.update(token_budget=100))),  # below overflow_max
        ("PLAN_FORMAT_INVALID", lambda d: Path(os.path.join(d, "meta.json")).write_text("{")),
        ("PLAN_FORMAT_INVALID", lambda d: np.save(os.path.join(d, "epoch_0", "offsets.npy"), np.zeros(3, np.int32))),
        ("PLAN_FORMAT_INVALID", lambda d: os.unlink(os.path.join(d, "epoch_1", "stats.json"))),
        ("PLAN_FORMAT_INVALID", npy("offsets", lambda a: a.__setitem__(2, a[1]))),  # an empty microbatch
        ("PLAN_LENGTHS_MISMATCH",
         lambda d: edit_npy(os.path.join(d, "lengths.npy"), lambda a: a.__setitem__(0, a[0] + 1))),
        ("PLAN_SAMPLES_INVALID", npy("samples", lambda a: a.__setitem__(1, a[0]))),
        ("PLAN_SAMPLES_INVALID", npy("samples", lambda a: a.__setitem__(0, 10**6))),
        ("PLAN_BUCKET_MISMATCH", npy("bucket_ids", lambda a: a.__setitem__(0, (a[0] + 1) % 5))),
        ("PLAN_BUCKET_MISMATCH", npy("max_len", lambda a: a.__setitem__(0, a[0] + 1))),
        ("PLAN_BUDGET_EXCEEDED", meta(lambda m: m.update(token_budget=4096))),  # built with 8192
        ("PLAN_STATS_MISMATCH", lambda d: edit_json(os.path.join(d, "epoch_1", "stats.json"),
                                                    lambda s: s.update(tokens=s["tokens"] + 1))),
        ("PLAN_JSONL_MISMATCH", jsonl_line),
        ("PLAN_FINGERPRINT_MISMATCH", meta(lambda m: m.update(fingerprint="0" * 64))),
        ("PLAN_FINGERPRINT_MISMATCH", meta(lambda m: m.update(tokenizer_hash="another"))),
        ("PLAN_NOT_REPRODUCIBLE", swap_microbatches),
        ("PLAN_NOT_REPRODUCIBLE", meta(lambda m: (m.update(sampler_config_hash="ab" * 32)))),
    ]


@pytest.mark.parametrize("code,damage", tamper_cases(), ids=[f"{c}-{i}" for i, (c, _) in enumerate(tamper_cases())])
def test_verify_names_what_is_wrong(tmp_path, saved, code, damage, capsys):
    folder = copy(saved, tmp_path)
    damage(folder)
    if code == "PLAN_NOT_REPRODUCIBLE" \
            and json.loads(Path(os.path.join(folder, "meta.json")).read_text())["sampler_config_hash"] == "ab" * 32:
        # an edited meta field changes the fingerprint: re-seal it so that only the rebuild can tell
        plan = load_plan(folder, mmap=False)
        resealed = BatchPlan(finish_meta(plan.meta, plan.epochs), plan.epochs, plan.lengths, plan.sample_ids)
        save_plan(resealed, folder, force=True)
    expect(getattr(errors, code), verify_plan, folder)
    assert main(["plan", "verify", folder]) == 2
    assert f"error {code}:" in capsys.readouterr().err


def test_verify_against_an_expected_fingerprint_and_a_length_cache(tmp_path, saved):
    expect(errors.PLAN_FINGERPRINT_MISMATCH, verify_plan, saved, expected_fingerprint="f" * 64)
    plan = load_plan(saved)
    same = LengthCache.from_arrays(plan.sample_ids, np.asarray(plan.lengths), "tok")
    assert verify_plan(saved, lengths=same, reproduce=False)["fingerprint"] == plan.fingerprint
    for cache in (LengthCache.from_arrays(plan.sample_ids, np.asarray(plan.lengths), "other-tokenizer"),
                  LengthCache.from_arrays(plan.sample_ids, np.asarray(plan.lengths) + 1, "tok"),
                  LengthCache.from_arrays(None, np.asarray(plan.lengths), "tok")):
        expect(errors.PLAN_LENGTHS_MISMATCH, verify_plan, saved, lengths=cache, reproduce=False)


def test_verify_checks_shards(tmp_path, saved):
    plan = load_plan(saved)
    save_plan(shard_plan(plan, 1, 3), tmp_path / "shard")
    assert verify_plan(tmp_path / "shard")["fingerprint"] == shard_plan(plan, 1, 3).fingerprint
    save_plan(shard_plan(plan, 1, 3), tmp_path / "binary", jsonl="never")
    for folder, code in ((tmp_path / "shard", errors.PLAN_JSONL_MISMATCH),  # its JSONL indices say rank 1
                         (tmp_path / "binary", errors.PLAN_FINGERPRINT_MISMATCH)):
        # rank 0 holds as many microbatches as rank 1 (loading checks the count against stats.json)
        edit_json(folder / "meta.json", lambda m: m["shard"].update(rank=0))
        expect(code, verify_plan, folder)


# --------------------------------------------------------------- the command line
def test_cli_pipeline(tmp_path, capsys):
    lengths = lengths_of(800, 3)
    LengthCache.from_arrays([f"id{i}" for i in range(800)], lengths, "tok").write(tmp_path / "lengths.jsonl")
    out = str(tmp_path / "plan")
    args = ["plan", "build", "--lengths", str(tmp_path / "lengths.jsonl"), "--bucket-edges", "128,256,512,1024",
            "--overflow-max", "2048", "--token-budget", "4096", "--epochs", "2", "--seed", "42", "--quiet",
            "--pad-policy", "pad_to_max", "--sampling-mode", "sequential", "--output", out]
    assert main(args) == 0
    printed = capsys.readouterr().out
    fingerprint = re.search(r"fingerprint ([0-9a-f]{64})", printed).group(1)
    plan = load_plan(out)
    assert plan.fingerprint == fingerprint and plan.config.stage == "SEQUENTIAL_V1"
    assert main(["plan", "verify", out, "--expected-fingerprint", fingerprint,
                 "--lengths", str(tmp_path / "lengths.jsonl")]) == 0
    capsys.readouterr()
    assert main(["plan", "info", out, "--world-size", "3", "--rank", "2", "--json"]) == 0
    assert [r["rank"] for r in json.loads(capsys.readouterr().out)["epochs"][1]["ranks"]] == [2]
    assert main(["plan", "info", out, "--world-size", "3", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    ranks = report["epochs"][0]["ranks"]
    assert sum(r["microbatches"] for r in ranks) == report["epochs"][0]["microbatches"]
    assert sum(r["samples"] for r in ranks) == report["epochs"][0]["samples"]
    assert main(["plan", "shard", out, "--world-size", "3", "--output", str(tmp_path / "shards")]) == 0
    index = json.loads(Path(tmp_path / "shards" / "shards.json").read_text())
    assert index["source_fingerprint"] == fingerprint and len(index["shards"]) == 3
    for row in index["shards"]:
        shard = load_plan(tmp_path / "shards" / f"rank_{row['rank']}")
        assert shard.fingerprint == row["fingerprint"] == shard_plan(plan, row["rank"], 3).fingerprint
    assert main(["plan", "verify", str(tmp_path / "shards" / "rank_2"), "--no-rebuild"]) == 0
    capsys.readouterr()
    assert main(args) == 2 and "error OUTPUT_EXISTS" in capsys.readouterr().err
    assert main(args[:5] + ["128,x"] + args[6:-1] + [out + "2"]) == 2
    assert "error BATCHING_CONFIG_INVALID" in capsys.readouterr().err
    assert main(["plan", "info", out, "--world-size", "2", "--rank", "2"]) == 2
    assert "error INVALID_RANK" in capsys.readouterr().err


def test_every_plan_code_is_documented():
    doc = Path(os.path.join(ROOT, "docs", "batching.md")).read_text()
    section = doc.split("## Failure codes", 1)[1]
    for code in PLAN_CODES:
        assert re.search(rf"^\| `{code}` \|", section, re.M), code


@pytest.mark.parametrize("order", uc.modes.mode_names())
@pytest.mark.parametrize("stage", [uc.nextbatch.MODE_SHUFFLE, uc.nextbatch.MODE_SEQUENTIAL, uc.presets.MODE_STREAMING])
def test_a_loaded_plan_names_the_engine_mode_it_was_built_with(tmp_path, order, stage):
    """meta.sampling_mode is the engine's metadata at build time, and the same after save and load
    (a loaded Feistel plan once said BLOCK_AFFINE, the stage's spelling)."""
    config = BatchingConfig(token_budget=4096, bucket_edges=(128,), overflow_max=1024, order=order, stage=stage)
    built = BatchPlanBuilder(np.arange(1, 100), config, tokenizer_hash="ab" * 32).build(1)
    save_plan(built, tmp_path / "plan")
    assert built.meta.sampling_mode == config.sampling_mode == load_plan(tmp_path / "plan").meta.sampling_mode
    assert (order in config.sampling_mode.lower()) or stage == uc.nextbatch.MODE_SEQUENTIAL
