"""Packed plans (docs/batching.md, "Packed plans"): the rows are exactly what
pack_lengths gives on each bucket's samples in the engine's epoch order, cut
every token_budget // max_length rows; files, JSONL packs, stats, shards,
verify and its failure codes, and ``plan build --pack``."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import umlos_cuda as uc
from packing_reference import reference_pack_lengths
from umlos_cuda import errors
from umlos_cuda.batching import (BatchingConfig, BatchPlan, BatchPlanBuilder, LengthCache, PackingConfig, load_plan,
                                save_plan, shard_plan)
from umlos_cuda.batching.plans.plan import EpochPlan
from umlos_cuda.batching.plans.fingerprint import finish_meta
from umlos_cuda.batching.plans.verify import verify_plan
from umlos_cuda.batching.plans.planner import epoch_order, plan_manifest
from umlos_cuda.cli import main


def expect(code, function, *args, **kwargs):
    with pytest.raises(uc.UmlosError) as info:
        function(*args, **kwargs)
    assert info.value.code == code, info.value.message
    return info.value


def lengths_of(n=1500, seed=0, top=3000):
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(5.0, 1.0, n), 0, top).astype(np.uint32)


def packed_config(mode="first_fit", edges=(), budget=8192, max_length=2048, separator=0, overflow=None, **kwargs):
    return BatchingConfig(budget, edges, max_length if overflow is None else overflow, seed=7,
                          pack=PackingConfig(max_length, mode, separator_len=separator), **kwargs)


def expected_rows(lengths, config, epoch):
    """Per bucket, the rows (lists of dataset rows) by the definition: the
    bucket's samples in the engine's epoch order, packed by the reference."""
    n = lengths.shape[0]
    order = np.concatenate(list(epoch_order(config, plan_manifest(config, n), n, epoch)))
    buckets = config.bucket_spec.bucket_ids(lengths[order])
    out = {}
    for k in range(config.bucket_spec.num_buckets):
        rows_k = order[buckets == k]
        row_of = reference_pack_lengths(lengths[rows_k], config.pack.max_length, config.pack.mode.value,
                                        config.pack.separator_len)
        out[k] = [[int(r) for r, b in zip(rows_k, row_of) if b == row] for row in range(max(row_of, default=-1) + 1)]
    return out


def plan_rows(plan, epoch):
    """Per bucket, the plan's rows in plan order."""
    out = {}
    for mb in plan.iter_epoch(epoch):
        out.setdefault(mb.bucket_id, []).extend(r.tolist() for r in mb.packed_rows())
    return out


def check_plan(plan, lengths, config):
    rows_per_microbatch = config.token_budget // config.pack.max_length
    for e in range(plan.num_epochs):
        expected = expected_rows(lengths, config, e)
        assert plan_rows(plan, e) == {k: v for k, v in expected.items() if v}
        for mb in plan.iter_epoch(e):
            assert mb.max_len == config.pack.max_length and 1 <= len(mb.packs) <= rows_per_microbatch
            assert [s for p in mb.packs for s in p] == list(mb.samples)
            for row in mb.packed_rows():
                assert lengths[row].sum() + config.pack.separator_len * (len(row) - 1) <= config.pack.max_length
        per_bucket = [mb.bucket_id for mb in plan.iter_epoch(e)]
        for k, rows in expected.items():  # only a bucket's last microbatch may be short
            sizes = [len(mb.packs) for mb in plan.iter_epoch(e) if mb.bucket_id == k]
            assert sum(sizes) == len(rows) and all(s == rows_per_microbatch for s in sizes[:-1])
        assert len(per_bucket) == len(plan.epochs[e])


@pytest.mark.parametrize("mode", ["first_fit", "best_fit", "greedy"])
@pytest.mark.parametrize("edges", [(), (256, 1024)])
def test_packed_plans_follow_the_definition(mode, edges):
    lengths = lengths_of(1200, seed=3)
    config = packed_config(mode, edges, budget=6144, separator=1)
    plan = BatchPlanBuilder(lengths, config, tokenizer_hash="tok").build(2)
    check_plan(plan, lengths, config)
    stats = plan.epochs[0].stats
    packing = stats["packing"]
    assert packing["rows"] == int(plan.epochs[0].pack_rows[-1]) and packing["segments"] == stats["samples"]
    assert packing["rows"] >= packing["lower_bound_rows"] and packing["separator_tokens"] > 0
    assert stats["padded_tokens"] == packing["rows"] * 2048
    assert packing["packing_efficiency"] == pytest.approx((stats["tokens"] + packing["separator_tokens"])
                                                          / (packing["rows"] * 2048), abs=1e-9)


@settings(max_examples=40)
@given(lengths=st.lists(st.integers(0, 70), min_size=1, max_size=120), edges=st.sampled_from([(), (16,), (8, 32)]),
       mode=st.sampled_from(["first_fit", "best_fit", "greedy"]), separator=st.integers(0, 3),
       rows=st.integers(1, 4), seed=st.integers(0, 3))
def test_packed_plan_invariants(lengths, edges, mode, separator, rows, seed):
    lengths = np.asarray(lengths, dtype=np.uint32)
    config = BatchingConfig(64 * rows, edges, 64, seed=seed, min_length=0,
                            pack=PackingConfig(64, mode, separator_len=separator))
    plan = BatchPlanBuilder(lengths, config).build(1)
    check_plan(plan, lengths, config)
    planned = sorted(int(r) for mb in plan.iter_epoch(0) for r in mb.rows)
    assert planned == sorted(np.flatnonzero(lengths <= 64).tolist())


def test_files_round_trip_and_verify(tmp_path):
    lengths = lengths_of()
    config = packed_config("best_fit", (512,), separator=2)
    plan = BatchPlanBuilder(lengths, config, tokenizer_hash="tok").build(2)
    folder = str(tmp_path / "plan")
    save_plan(plan, folder)
    meta = json.loads(Path(os.path.join(folder, "meta.json")).read_text())
    assert meta["pack_config"] == {"mode": "best_fit", "max_length": 2048, "separator_len": 2}
    assert {"row_offsets.npy", "pack_rows.npy"} <= set(os.listdir(os.path.join(folder, "epoch_0")))
    loaded = load_plan(folder)
    assert loaded.fingerprint == plan.fingerprint and loaded.config == config
    with open(os.path.join(folder, "epoch_0", "microbatches.jsonl")) as handle:
        first = json.loads(handle.readline())
    assert first == plan.microbatch(0, 0).to_json() and first["packs"] and isinstance(first["packs"][0], list)
    assert verify_plan(folder)["fingerprint"] == plan.fingerprint
    # a folder holding only the JSONL loads to the same arrays
    jsonl_only = str(tmp_path / "jsonl")
    shutil.copytree(folder, jsonl_only)
    for e in range(2):
        for name in ("offsets", "samples", "bucket_ids", "max_len", "row_offsets", "pack_rows"):
            os.unlink(os.path.join(jsonl_only, f"epoch_{e}", f"{name}.npy"))
    again = load_plan(jsonl_only)
    for a, b in zip(again.epochs, plan.epochs):
        assert np.array_equal(a.row_offsets, b.row_offsets) and np.array_equal(a.pack_rows, b.pack_rows)
    assert verify_plan(jsonl_only)["fingerprint"] == plan.fingerprint
    # packing is part of the fingerprint
    unpacked = BatchPlanBuilder(lengths, BatchingConfig(8192, (512,), 2048, seed=7), tokenizer_hash="tok").build(2)
    greedy = BatchPlanBuilder(lengths, packed_config("greedy", (512,), separator=2), tokenizer_hash="tok").build(2)
    assert len({plan.fingerprint, unpacked.fingerprint, greedy.fingerprint}) == 3


def test_shards_deal_out_the_packed_rows(tmp_path):
    lengths = lengths_of()
    plan = BatchPlanBuilder(lengths, packed_config(), tokenizer_hash="tok").build(1)
    shards = [shard_plan(plan, r, 3) for r in range(3)]
    dealt = sorted((mb.index, mb.packs) for s in shards for mb in s.iter_epoch(0))
    assert dealt == [(mb.index, mb.packs) for mb in plan.iter_epoch(0)]
    assert sum(s.epochs[0].stats["packing"]["rows"] for s in shards) == plan.epochs[0].stats["packing"]["rows"]
    save_plan(shards[1], tmp_path / "rank_1")
    assert verify_plan(tmp_path / "rank_1")["fingerprint"] == shards[1].fingerprint


def test_packs_save_padding():
    """On the same lengths and budget, packing pads far less than padding each sample."""
    lengths = lengths_of(4000, top=2048)
    padded = BatchPlanBuilder(lengths, BatchingConfig.throughput(8192, (), 2048)).build(1).epochs[0].stats
    packed = BatchPlanBuilder(lengths, packed_config()).build(1).epochs[0].stats
    assert packed["tokens"] == padded["tokens"]
    assert packed["padding_waste"] < 0.02 < 0.3 < padded["padding_waste"]


@pytest.mark.parametrize("kwargs, mention", [
    (dict(budget=1024, overflow=512), "above the token budget"),
    (dict(overflow=4096), "would fit no row"),
])
def test_packed_configs_are_refused(kwargs, mention):
    error = expect(errors.BATCHING_CONFIG_INVALID, packed_config, **kwargs)
    assert mention in error.message


def test_pack_config_is_checked():
    expect(errors.PACKING_CONFIG_INVALID, PackingConfig, mode="next_fit")
    expect(errors.PACKING_CONFIG_INVALID, PackingConfig, 0, "greedy")
    expect(errors.PACKING_CONFIG_INVALID, PackingConfig, 16, "greedy", separator_len=16)
    expect(errors.PACKING_CONFIG_INVALID, PackingConfig.from_dict, {"mode": "greedy"})
    expect(errors.BATCHING_CONFIG_INVALID, BatchingConfig, 4096, (), 2048, pack={"mode": "greedy"})
    pack = PackingConfig(16, "greedy", separator_len=1)
    assert pack.to_dict() == {"mode": "greedy", "max_length": 16, "separator_len": 1}  # meta.json's pack_config
    assert PackingConfig.from_dict(pack.to_dict()) == pack


@pytest.mark.parametrize("pack, mention", [
    (PackingConfig(2048, separator_ids=(2,)), "not its ids [2]"),
    (PackingConfig(2048, oversize="split"), "no oversize policy (split)"),
])
def test_a_plan_packs_lengths_only(pack, mention):
    """A plan records {mode, max_length, separator_len}: separator ids and an
    oversize policy, which it could not record, are refused, not dropped."""
    error = expect(errors.BATCHING_CONFIG_INVALID, BatchingConfig, 4096, (), 2048, pack=pack)
    assert mention in error.message


# --------------------------------------------------------------- verify failures
@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("packed") / "plan"
    save_plan(BatchPlanBuilder(lengths_of(), packed_config(), tokenizer_hash="tok").build(1), folder)
    return str(folder)


def edit_npy(path, change):
    array = np.load(path).copy()
    change(array)
    np.save(path, array)


def forge(folder, change):
    """Rewrite epoch 0 through ``change(epoch) -> EpochPlan`` and re-seal the fingerprint."""
    plan = load_plan(folder, mmap=False)
    epochs = [change(plan.epochs[0])]
    save_plan(BatchPlan(finish_meta(plan.meta, epochs), epochs, plan.lengths, plan.sample_ids), folder, force=True)


def merge_first_two(epoch):
    """Microbatches 0 and 1 become one of twice the rows."""
    keep = np.r_[0, 2:len(epoch) + 1]
    return EpochPlan(0, epoch.offsets[keep], epoch.samples, epoch.bucket_ids[1:], epoch.max_len[1:], epoch.stats,
                     row_offsets=epoch.row_offsets, pack_rows=epoch.pack_rows[keep])


def move_a_boundary(epoch):
    """A row gives its last sample to the next row of its microbatch, which
    still fits: valid rows, but not first-fit's."""
    lengths, bounds = lengths_of(), epoch.row_offsets
    used = np.add.reduceat(lengths[epoch.samples].astype(np.int64), bounds[:-1])
    starts = set(epoch.pack_rows.tolist())
    r = next(r for r in range(len(used) - 1) if r + 1 not in starts and bounds[r + 1] - bounds[r] > 1
             and used[r + 1] + lengths[epoch.samples[bounds[r + 1] - 1]] <= 2048)
    row_offsets = bounds.copy()
    row_offsets[r + 1] -= 1
    return EpochPlan(0, epoch.offsets, epoch.samples, epoch.bucket_ids, epoch.max_len, epoch.stats,
                     row_offsets=row_offsets, pack_rows=epoch.pack_rows)


def overfill_a_row(epoch):
    """Row 0 takes all of row 1."""
    row_offsets = np.delete(epoch.row_offsets, 1)
    pack_rows = epoch.pack_rows.copy()
    pack_rows[1:] -= 1
    return EpochPlan(0, epoch.offsets, epoch.samples, epoch.bucket_ids, epoch.max_len, epoch.stats,
                     row_offsets=row_offsets, pack_rows=pack_rows)


def restat(change):
    """``change`` then stats recomputed, so that only the row checks can tell."""
    def forged(epoch):
        from umlos_cuda.batching.plans.stats import epoch_stats

        epoch = change(epoch)
        plan_config = packed_config()
        stats = epoch_stats(0, epoch.offsets, epoch.samples, epoch.bucket_ids, epoch.max_len, lengths_of(),
                            plan_config.bucket_spec, epoch.stats["skipped"], row_offsets=epoch.row_offsets,
                            pack_rows=epoch.pack_rows, pack=plan_config.pack)
        return EpochPlan(0, epoch.offsets, epoch.samples, epoch.bucket_ids, epoch.max_len, stats,
                         row_offsets=epoch.row_offsets, pack_rows=epoch.pack_rows)
    return forged


def jsonl_packs(folder):
    path = os.path.join(folder, "epoch_0", "microbatches.jsonl")
    lines = Path(path).read_text().splitlines()
    item = json.loads(lines[0])
    item["packs"] = [item["packs"][0][:1], item["packs"][0][1:]] + item["packs"][1:]
    lines[0] = json.dumps(item)
    Path(path).write_text("\n".join(lines) + "\n")


CASES = [
    ("PLAN_FORMAT_INVALID", lambda d: os.unlink(os.path.join(d, "epoch_0", "pack_rows.npy"))),
    ("PLAN_FORMAT_INVALID", lambda d: edit_npy(os.path.join(d, "epoch_0", "pack_rows.npy"),
                                               lambda a: a.__setitem__(-1, a[-1] - 1))),
    ("PLAN_PACKS_INVALID", lambda d: edit_npy(os.path.join(d, "epoch_0", "row_offsets.npy"),
                                              lambda a: a.__setitem__(1, a[2]))),  # an empty row
    ("PLAN_PACKS_INVALID", lambda d: edit_npy(os.path.join(d, "epoch_0", "max_len.npy"),
                                              lambda a: a.__setitem__(0, 1024))),
    ("PLAN_PACKS_INVALID", lambda d: forge(d, restat(overfill_a_row))),
    ("PLAN_BUDGET_EXCEEDED", lambda d: forge(d, restat(merge_first_two))),
    ("PLAN_JSONL_MISMATCH", jsonl_packs),
    ("PLAN_NOT_REPRODUCIBLE", lambda d: forge(d, restat(move_a_boundary))),
]


@pytest.mark.parametrize("code,damage", CASES, ids=[f"{c}-{i}" for i, (c, _) in enumerate(CASES)])
def test_verify_checks_the_rows(tmp_path, saved, code, damage, capsys):
    folder = str(tmp_path / "plan")
    shutil.copytree(saved, folder)
    damage(folder)
    expect(getattr(errors, code), verify_plan, folder)
    assert main(["plan", "verify", folder]) == 2
    assert f"error {code}:" in capsys.readouterr().err


def test_unpacked_plans_refuse_packs_in_their_jsonl(tmp_path):
    folder = str(tmp_path / "plan")
    save_plan(BatchPlanBuilder(lengths_of(300), BatchingConfig(8192, (512,), 2048)).build(1), folder)
    path = os.path.join(folder, "epoch_0", "microbatches.jsonl")
    lines = Path(path).read_text().splitlines()
    item = json.loads(lines[0])
    item["packs"] = [item["samples"]]
    Path(path).write_text("\n".join([json.dumps(item)] + lines[1:]) + "\n")
    expect(errors.PLAN_JSONL_MISMATCH, verify_plan, folder)


# --------------------------------------------------------------- command line
def test_plan_build_pack(tmp_path, capsys):
    lengths = lengths_of(2000)
    LengthCache.from_arrays(None, lengths, "t" * 64).write(str(tmp_path / "lengths.jsonl"))
    out = str(tmp_path / "plan")
    args = ["plan", "build", "--lengths", str(tmp_path / "lengths.jsonl"), "--pack", "--pack-mode", "first_fit",
            "--pack-max-len", "2048", "--token-budget", "8192", "--output", out, "--quiet"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "packing: " in printed and "lower bound" in printed
    plan = load_plan(out)
    assert plan.config.pack == PackingConfig(2048, "first_fit") and plan.config.bucket_edges == ()
    assert plan.config.overflow_max == 2048 and plan.epochs[0].stats["skipped_samples"] == int((lengths > 2048).sum())
    assert main(["plan", "info", out]) == 0
    assert "packed: first_fit, rows of 2048 tokens, 4 rows per microbatch" in capsys.readouterr().out
    assert main(["plan", "info", out, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["pack_config"]["mode"] == "first_fit" and report["epochs"][0]["packing"]["rows"] > 0
    assert main(["plan", "verify", out]) == 0
    capsys.readouterr()
    unpacked = ["plan", "build", "--lengths", str(tmp_path / "lengths.jsonl"), "--token-budget", "8192",
                "--output", out + "2"]
    assert main(unpacked) == 2 and "--bucket-edges is required (unless --pack)" in capsys.readouterr().err
    assert main(args[:-3] + ["--pack-max-len", "16384", "--output", out + "3"]) == 2
    assert "error BATCHING_CONFIG_INVALID" in capsys.readouterr().err
