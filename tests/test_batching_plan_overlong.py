"""Over-long samples and train/validation splits in plans (docs/batching.md,
"Over-long samples and splits"): the token ranges a plan's batches cover are
exactly those of a plain definition of truncation, split and skip, on the rows
of a plain definition of the keyed-hash split; counts, files, fingerprints,
verify, shards, collation and ``plan build``/``plan info``."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import umlos_cuda as uc
from umlos_cuda import errors
from umlos_cuda.batching import (BatchingConfig, BatchPlanBuilder, LengthCache, PackingConfig, collate_microbatch,
                                 load_plan, save_plan, shard_plan, verify_plan)
from umlos_cuda.batching.plans.overlong import OverlongConfig
from umlos_cuda.batching.plans.splits import SplitConfig
from umlos_cuda.cli import main

POLICIES = ("truncate_right", "truncate_left", "split", "skip")


def expect(code, function, *args, **kwargs):
    with pytest.raises(uc.UmlosError) as info:
        function(*args, **kwargs)
    assert info.value.code == code, info.value.message
    return info.value


# ------------------------------------------------------------- the plain definitions
def in_validation(sample_id: str, fraction: float, seed: int) -> bool:
    digest = hashlib.blake2b(sample_id.encode(), digest_size=8, key=seed.to_bytes(8, "little"),
                             person=b"umlos-split-v1").digest()
    return int.from_bytes(digest, "little") < int(fraction * 2 ** 64)


def expected_ranges(lengths, ids, max_length, policy, split) -> list[tuple[int, int, int]]:
    """(row, start, stop) of every token range the plan takes, by the words of the docs."""
    out = []
    for row, n in enumerate(int(x) for x in lengths):
        if split is not None and in_validation(ids[row], split[1], split[2]) != (split[0] == "validation"):
            continue
        if max_length is None or n <= max_length:
            out.append((row, 0, n))
        elif policy == "truncate_right":
            out.append((row, 0, max_length))
        elif policy == "truncate_left":
            out.append((row, n - max_length, n))
        elif policy == "split":
            out += [(row, k * max_length, min((k + 1) * max_length, n)) for k in range(math.ceil(n / max_length))]
    return out


def expected_counts(lengths, ids, max_length, policy, split) -> dict:
    rows = [r for r in range(len(lengths))
            if split is None or in_validation(ids[r], split[1], split[2]) == (split[0] == "validation")]
    over = [int(lengths[r]) for r in rows if int(lengths[r]) > max_length]
    pieces = {"split": sum(math.ceil(n / max_length) for n in over), "skip": 0}.get(policy, len(over))
    lost = {"split": 0, "skip": sum(over)}.get(policy, sum(n - max_length for n in over))
    return {"policy": policy, "max_length": max_length, "samples": len(over), "pieces": pieces, "tokens_lost": lost}


class Tokens:
    """A token source whose token ids name their row and position (row * 1000 + t)."""

    def __init__(self, lengths):
        self.lengths = np.asarray(lengths, dtype=np.uint32)

    def arrays(self, row):
        n = int(self.lengths[row])
        return np.arange(n, dtype=np.int64) + 1000 * row, (np.arange(n) % 3 != 0).astype(np.uint8)


def covered(plan, source=None, separator=()) -> list[list[tuple[int, int, int]]]:
    """Per epoch, the (row, start, stop) of every planned sample, from the microbatches (and,
    given a source, checked against the collated tokens and loss masks)."""
    epochs = []
    for e in range(plan.num_epochs):
        seen = []
        for mb in plan.iter_epoch(e):
            spans = mb.spans if mb.spans is not None else np.stack(
                (np.zeros(len(mb.rows), np.int64), np.asarray(plan.lengths)[mb.rows]), axis=1)
            ranges = [(int(r), int(a), int(b)) for r, (a, b) in zip(mb.rows, spans)]
            seen += ranges
            if source is not None:
                check_collated(collate_microbatch(source, mb, separator_ids=separator), mb, ranges, source)
        epochs.append(seen)
    return epochs


def check_collated(batch, mb, ranges, source) -> None:
    """The collated rows hold exactly each range's tokens and loss mask, in order."""
    tokens, masks = [], []
    for row in range(batch.input_ids.shape[0]):
        real = batch.attention_mask[row] == 1
        tokens += batch.input_ids[row][real].tolist()
        masks += batch.loss_mask[row][real].tolist()
    want_tokens, want_masks = [], []
    for r, a, b in ranges:
        ids, mask = source.arrays(r)
        want_tokens += ids[a:b].tolist()
        want_masks += mask[a:b].tolist()
    if mb.packs is None:
        assert (tokens, masks) == (want_tokens, want_masks)
    else:  # no separators in these plans: the rows' tokens, row after row, are the samples'
        assert tokens == want_tokens and masks == want_masks


# ------------------------------------------------------------- exactness (hypothesis)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(0, 90), min_size=1, max_size=50), max_length=st.integers(1, 40),
       policy=st.sampled_from(POLICIES), packed=st.booleans(),
       split=st.one_of(st.none(), st.tuples(st.sampled_from(("train", "validation")),
                                            st.floats(0.05, 0.95), st.integers(0, 2 ** 64 - 1))),
       seed=st.integers(0, 2 ** 64 - 1))
def test_plan_covers_exactly_the_definitions_ranges(lengths, max_length, policy, packed, split, seed):
    lengths = np.asarray(lengths, dtype=np.uint32)
    ids = [f"id-{i}" for i in range(len(lengths))]
    want = expected_ranges(lengths, ids, max_length, policy, split)
    pack = PackingConfig(max_length, "first_fit") if packed else None
    edges = () if packed else tuple(e for e in (4, 16) if e < max_length)
    config = BatchingConfig(4 * max_length, edges, max_length, "pad_to_max", seed, pack=pack,
                            overlong=OverlongConfig(max_length, policy),
                            split=None if split is None else SplitConfig(*split))
    builder = BatchPlanBuilder(lengths, config, tokenizer_hash="t" * 64, sample_ids=ids)
    if not want:
        expect(errors.BATCHING_CONFIG_INVALID, builder.build, 2)
        return
    plan = builder.build(2)
    planned = sorted(r for r in want if r[2] > r[1])  # empty ranges are skipped (min_length 1) and listed
    for epoch, seen in zip(plan.epochs, covered(plan, Tokens(lengths))):
        assert sorted(seen) == planned  # each range exactly once
        assert epoch.stats["overlong"] == expected_counts(lengths, ids, max_length, policy, split)
        assert epoch.stats["skipped_samples"] == len(want) - len(planned)
        assert epoch.stats["tokens"] == sum(b - a for _, a, b in planned)
    split_ids = policy == "split"
    assert (plan.epochs[0].pieces is not None) == split_ids
    on_side = sum(split is None or in_validation(i, split[1], split[2]) == (split[0] == "validation") for i in ids)
    assert plan.meta.units == {"samples": on_side, "units": len(want)}


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 200), fraction=st.floats(0.01, 0.99), seed=st.integers(0, 2 ** 64 - 1),
       appended=st.integers(1, 100), named=st.booleans())
def test_split_is_stable_when_rows_are_appended(n, fraction, seed, appended, named):
    from umlos_cuda.batching.plans.splits import selected_rows

    ids = [f"rec/{i * 7919 % 100003}" for i in range(n + appended)] if named else None
    sides = {}
    for side in ("train", "validation"):
        before = selected_rows(None if ids is None else ids[:n], n, SplitConfig(side, fraction, seed))
        after = selected_rows(ids, n + appended, SplitConfig(side, fraction, seed))
        assert after[after < n].tolist() == before.tolist()  # no existing sample changes side
        sides[side] = set(after.tolist())
        names = [str(r) for r in range(n + appended)] if ids is None else ids
        assert sides[side] == {r for r in range(n + appended)
                               if in_validation(names[r], fraction, seed) == (side == "validation")}
    assert not sides["train"] & sides["validation"]
    assert sides["train"] | sides["validation"] == set(range(n + appended))


def test_train_and_validation_plans_partition_the_rows():
    lengths = np.arange(1, 401, dtype=np.uint32) % 97 + 1
    rows = {}
    for side in ("train", "validation"):
        config = BatchingConfig(1024, (32,), 128, split=SplitConfig(side, 0.25, 9))
        plan = BatchPlanBuilder(lengths, config).build(1)
        rows[side] = sorted(np.asarray(plan.epochs[0].samples).tolist())
        assert plan.meta.units == {"samples": len(rows[side]), "units": len(rows[side])}
    assert sorted(rows["train"] + rows["validation"]) == list(range(400))
    assert 60 < len(rows["validation"]) < 140  # about a quarter


# ------------------------------------------------------------- files, fingerprints, verify
TRAIN = SplitConfig("train", 0.2, 3)


def build(policy="split", split=TRAIN, pack=None, n=300, max_length=64):
    lengths = (np.random.default_rng(5).lognormal(3.5, 0.8, n)).astype(np.uint32)
    ids = [f"s{i}" for i in range(n)]
    overlong = None if policy is None else OverlongConfig(max_length, policy)
    config = BatchingConfig(512, () if pack else (16, 32), max_length, pack=pack, overlong=overlong, split=split)
    return BatchPlanBuilder(lengths, config, tokenizer_hash="t" * 64, sample_ids=ids).build(2)


@pytest.mark.parametrize("policy", POLICIES + (None,))
def test_round_trip_verify_and_shards(tmp_path, policy):
    plan = build(policy, pack=PackingConfig(64) if policy == "truncate_left" else None)
    folder = str(tmp_path / "plan")
    save_plan(plan, folder, jsonl="always")
    loaded = load_plan(folder)
    assert loaded.config == plan.config and loaded.meta == plan.meta and loaded.fingerprint == plan.fingerprint
    assert os.path.exists(os.path.join(folder, "epoch_0", "pieces.npy")) == (policy == "split")
    meta = json.loads(Path(folder, "meta.json").read_text())
    assert meta["split"] == {"side": "train", "validation_fraction": 0.2, "seed": 3}
    assert ("overlong" in meta) == (policy is not None) and meta["units"]["units"] == plan.meta.units["units"]
    assert covered(loaded) == covered(plan)
    assert verify_plan(folder)["fingerprint"] == plan.fingerprint
    line = json.loads(Path(folder, "epoch_0", "microbatches.jsonl").read_text().splitlines()[0])
    assert ("pieces" in line) == (policy == "split")
    shards = [shard_plan(loaded, r, 3) for r in range(3)]
    assert sorted(r for s in shards for r in covered(s)[0]) == sorted(covered(plan)[0])
    assert sum(s.epochs[0].stats["tokens"] for s in shards) == plan.epochs[0].stats["tokens"]
    save_plan(shards[1], str(tmp_path / "shard"))
    verify_plan(str(tmp_path / "shard"))
    for e in range(2):  # the JSONL alone (the interchange form) loads the same plan
        for name in os.listdir(os.path.join(folder, f"epoch_{e}")):
            if name.endswith(".npy"):
                os.remove(os.path.join(folder, f"epoch_{e}", name))
    assert load_plan(folder).fingerprint == plan.fingerprint and covered(load_plan(folder)) == covered(plan)


def test_fingerprints_change_with_the_policy_and_split():
    prints = {build(p, s).fingerprint for p in POLICIES + (None,)
              for s in (None, SplitConfig("train", 0.2, 3), SplitConfig("validation", 0.2, 3),
                        SplitConfig("train", 0.2, 4), SplitConfig("train", 0.3, 3))}
    assert len(prints) == 25
    assert build("truncate_right", None, max_length=64).fingerprint != build("truncate_right", None,
                                                                             max_length=63).fingerprint


def test_default_keeps_the_plan_bytes():
    """No policy and no split: the config, meta and arrays of the plans built before they existed."""
    lengths = np.arange(1, 300, dtype=np.uint32)
    config = BatchingConfig(1024, (64,), 128)
    plan = BatchPlanBuilder(lengths, config).build(1)
    assert "overlong" not in config.to_dict() and "split" not in config.to_dict()
    assert "units" not in plan.meta.header() and "overlong" not in plan.epochs[0].stats
    assert plan.epochs[0].pieces is None and plan.microbatch(0, 0).spans is None
    assert plan.epochs[0].stats["skipped_samples"] == int((lengths > 128).sum())


def test_tampered_pieces_are_refused(tmp_path):
    plan = build("split")
    folder = str(tmp_path / "plan")
    save_plan(plan, folder, jsonl="never")
    path = os.path.join(folder, "epoch_0", "pieces.npy")
    pieces = np.load(path)
    pieces[0] += 50  # no sample has 51 pieces
    np.save(path, pieces)
    expect(errors.PLAN_SAMPLES_INVALID, verify_plan, folder)
    with pytest.raises(uc.UmlosError):
        list(load_plan(folder).iter_epoch(0))
    np.save(path, pieces[:-1])
    expect(errors.PLAN_FORMAT_INVALID, load_plan, folder)
    os.remove(path)
    expect(errors.PLAN_FORMAT_INVALID, load_plan, folder)


def test_tampered_units_count_is_refused(tmp_path):
    plan = build("truncate_right")
    folder = str(tmp_path / "plan")
    save_plan(plan, folder)
    meta_path = os.path.join(folder, "meta.json")
    meta = json.loads(Path(meta_path).read_text())
    meta["units"] = {"samples": 1, "units": 1, "extra": 2}
    Path(meta_path).write_text(json.dumps(meta))
    expect(errors.PLAN_FORMAT_INVALID, load_plan, folder)
    del meta["units"]
    Path(meta_path).write_text(json.dumps(meta))
    expect(errors.PLAN_FORMAT_INVALID, load_plan, folder)


# ------------------------------------------------------------- user errors
@pytest.mark.parametrize("make, mention", [
    (lambda: OverlongConfig(0), "max_length"),
    (lambda: OverlongConfig(-3, "skip"), "max_length"),
    (lambda: OverlongConfig(8, "truncate"), "overlong policy must be one of truncate_right, truncate_left, split"),
    (lambda: SplitConfig("train", 0.0), "(0, 1)"),
    (lambda: SplitConfig("train", 1.0), "(0, 1)"),
    (lambda: SplitConfig("train", 1.5), "(0, 1)"),
    (lambda: SplitConfig("train", float("nan")), "(0, 1)"),
    (lambda: SplitConfig("train", "0.5"), "(0, 1)"),
    (lambda: SplitConfig("test", 0.5), "split side must be one of train, validation"),
    (lambda: SplitConfig("train", 0.5, -1), "split seed"),
    (lambda: BatchingConfig(1024, (64,), 128, overlong=OverlongConfig(129)), "above overflow_max 128"),
    (lambda: BatchingConfig(1024, (64,), 128, overlong={"max_length": 8}), "OverlongConfig"),
    (lambda: BatchingConfig(1024, (64,), 128, split=0.5), "SplitConfig"),
    (lambda: BatchingConfig.from_dict({"overlong": {"max_length": 8}}), "{max_length, policy}"),
    (lambda: BatchingConfig(1024, (64,), 128, group_size=2, overlong=OverlongConfig(64)), "preference pairs"),
    (lambda: BatchingConfig(1024, (64,), 128, group_size=2, split=TRAIN), "preference pairs"),
])
def test_config_errors(make, mention):
    error = expect(errors.BATCHING_CONFIG_INVALID, make)
    assert mention in error.message, error.message


def test_config_round_trip():
    config = BatchingConfig(1024, (64,), 128, overlong=OverlongConfig(100, "split"),
                            split=SplitConfig("validation", 0.125, 2 ** 64 - 1))
    assert BatchingConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


# ------------------------------------------------------------- command line
@pytest.fixture
def cache(tmp_path):
    lengths = (np.random.default_rng(2).lognormal(5.0, 1.0, 500)).astype(np.uint32)
    path = str(tmp_path / "lengths.jsonl")
    LengthCache.from_arrays([f"r{i}" for i in range(500)], lengths, "t" * 64).write(path)
    return path, lengths


def test_plan_build_and_info_print_the_counts(tmp_path, capsys, cache):
    path, lengths = cache
    ids = [f"r{i}" for i in range(500)]
    common = ["plan", "build", "--lengths", path, "--bucket-edges", "128,256", "--token-budget", "4096", "--quiet"]
    assert main(common + ["--overflow-max", "512", "--output", str(tmp_path / "p0")]) == 0
    over = lengths[lengths > 512]
    assert (f"over-long: {over.size} sample(s) above overflow_max 512 skipped, {int(over.sum())} tokens lost "
            "(the default") in capsys.readouterr().out
    for policy in POLICIES:
        out = str(tmp_path / policy)
        assert main(common + ["--max-length", "512", "--overlong", policy, "--split", "validation",
                              "--validation-fraction", "0.3", "--split-seed", "11", "--output", out]) == 0
        printed = capsys.readouterr().out
        want = expected_counts(lengths, ids, 512, policy, ("validation", 0.3, 11))
        assert f"over-long: {want['samples']} sample(s) above max_length 512 " in printed
        assert f"{want['tokens_lost']} tokens lost ({policy})" in printed
        selected = sum(in_validation(i, 0.3, 11) for i in ids)
        assert f"split validation (validation_fraction 0.3, split seed 11): {selected} of 500 samples" in printed
        plan = load_plan(out)
        assert plan.config.overlong == OverlongConfig(512, policy) and plan.config.overflow_max == 512
        assert main(["plan", "info", out]) == 0
        assert f"{want['tokens_lost']} tokens lost ({policy})" in capsys.readouterr().out
        assert main(["plan", "info", out, "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["overlong"] == want and report["units"]["samples"] == selected
        assert main(["plan", "verify", out]) == 0
        capsys.readouterr()
    assert main(common + ["--overflow-max", "512", "--overlong", "split", "--output", str(tmp_path / "alone")]) == 0
    assert load_plan(str(tmp_path / "alone")).config.overlong == OverlongConfig(512, "split")
    assert main(common + ["--max-length", "300", "--output", str(tmp_path / "right")]) == 0
    assert load_plan(str(tmp_path / "right")).config.overlong == OverlongConfig(300, "truncate_right")


@pytest.mark.parametrize("extra, status, mention", [
    (["--max-length", "0"], 2, "max length must be a positive integer"),
    (["--max-length", "-5"], 2, "max length must be a positive integer"),
    (["--overlong", "truncate"], 2, "invalid choice"),
    (["--split", "test", "--validation-fraction", "0.1"], 2, "invalid choice"),
    (["--split", "train", "--validation-fraction", "1.5"], 2, "BATCHING_CONFIG_INVALID"),
    (["--split", "train", "--validation-fraction", "0"], 2, "BATCHING_CONFIG_INVALID"),
    (["--split", "train", "--validation-fraction", "half"], 2, "BATCHING_CONFIG_INVALID"),
    (["--split", "train"], 2, "--split needs --validation-fraction"),
    (["--validation-fraction", "0.1"], 2, "give --split train or --split validation too"),
    (["--max-length", "600"], 2, "above overflow_max 512"),
])
def test_plan_build_refuses(tmp_path, capsys, cache, extra, status, mention):
    args = ["plan", "build", "--lengths", cache[0], "--bucket-edges", "128,256", "--overflow-max", "512",
            "--token-budget", "4096", "--output", str(tmp_path / "p"), "--quiet"] + extra
    try:
        code = main(args)
    except SystemExit as exit_:  # argparse: usage and status 2
        code = exit_.code
    captured = capsys.readouterr()
    assert code == status and mention in captured.err + captured.out, captured
    assert not os.path.exists(tmp_path / "p")


@pytest.mark.parametrize("extra, flag, drop", [
    (["--bucket-edges", "128,512", "--max-length", "512"], "--max-length 512", "drop 512 from --bucket-edges"),
    (["--bucket-edges", "128,256,512", "--max-length", "256"], "--max-length 256", "drop 256, 512 from"),
    (["--bucket-edges", "128,512", "--pack", "--pack-max-len", "512"], "--pack-max-len 512", "drop 512 from"),
])
def test_a_default_overflow_max_names_the_option_that_set_it(tmp_path, capsys, cache, extra, flag, drop):
    """--max-length 512 with 512 as the last edge blamed overflow_max, which the user never set."""
    args = ["plan", "build", "--lengths", cache[0], "--token-budget", "4096", "--output", str(tmp_path / "p"),
            "--quiet", *extra]
    assert main(args) == 2
    said = capsys.readouterr().err
    assert f"error BATCHING_CONFIG_INVALID: {flag} is also the longest accepted length (--overflow-max)" in said
    assert drop in said and "overflow_max must exceed" not in said and not os.path.exists(tmp_path / "p")
    assert main(args[:-len(extra)] + ["--bucket-edges", "128", *extra[2:]]) == 0  # what the message says to do


def test_dataloader_collator_refuses_whole_rows_of_a_plan_that_cuts():
    """A plan that truncates or splits takes token ranges: PlanCollator cuts the ranges its items carry
    (tests/test_torch_plan_ranges.py) and refuses a whole row, which it could only collate uncut."""
    pytest.importorskip("torch")
    from umlos_cuda.torch import PlanCollator, PlanItem

    tokens = Tokens(build(None).lengths)
    row = int(np.argmax(tokens.lengths))
    for policy in ("truncate_right", "truncate_left", "split"):
        collator = PlanCollator(build(policy).config)
        error = expect(errors.COLLATE_INPUT_INVALID, collator, [(row, *tokens.arrays(row))])
        assert f"over-long policy {policy}" in error.message and "PlanKey" in error.message
        cut = collator([PlanItem(row, *tokens.arrays(row), span=(3, 9))])
        assert cut["input_ids"][0, :6].tolist() == list(range(1000 * row + 3, 1000 * row + 9))
    for policy in ("skip", None):  # whole samples: the DataLoader path collates them as they are
        whole = PlanCollator(build(policy).config)([(row, *tokens.arrays(row))])
        assert int(whole["attention_mask"].sum()) == int(tokens.lengths[row])


@pytest.mark.parametrize("policy, packed", [("truncate_left", False), ("split", True), ("split", False)])
def test_batch_files_from_a_token_store_hold_the_plans_ranges(tmp_path, policy, packed):
    """store -> plan with a policy and a split -> batch files: each file's tokens and loss mask are
    the ranges of its samples, the reader verifies them against the store, and the plan copy rebuilds."""
    from token_cases import make_store
    from umlos_cuda.batching import BatchReader, write_batches

    store = make_store(tmp_path, 120, seed=3)
    cache = store.length_cache()
    longest = int(np.asarray(cache.lengths).max())
    max_length = max(2, longest // 3)
    pack = PackingConfig(max_length) if packed else None
    config = BatchingConfig(4 * max_length, (), max_length, pack=pack, overlong=OverlongConfig(max_length, policy),
                            split=SplitConfig("train", 0.3, 5))
    plan = BatchPlanBuilder(cache, config).build(2)
    assert plan.epochs[0].stats["overlong"]["samples"] > 0
    save_plan(plan, tmp_path / "plan")
    write_batches(tmp_path / "plan", tmp_path / "batches", tmp_path / "store", workers=2)
    reader = BatchReader(tmp_path / "batches")
    for epoch in range(2):
        for mb, arrays in zip(plan.iter_epoch(epoch), reader.iter_epoch(epoch)):
            ranges = [(int(r), int(a), int(b)) for r, (a, b) in zip(mb.rows, mb.spans)]
            check_collated(type("B", (), {k: arrays[k] for k in ("input_ids", "loss_mask", "attention_mask")}),
                           mb, ranges, store)
            assert list(arrays["sample_ids"]) == list(mb.samples)
    reader.verify(tmp_path / "store")
    verify_plan(tmp_path / "batches" / "plan")


def test_default_count_is_over_the_split_side(tmp_path, capsys, cache):
    path, lengths = cache
    ids = [f"r{i}" for i in range(500)]
    out = str(tmp_path / "p")
    assert main(["plan", "build", "--lengths", path, "--bucket-edges", "128,256", "--overflow-max", "512",
                 "--token-budget", "4096", "--split", "train", "--validation-fraction", "0.5", "--output", out,
                 "--quiet"]) == 0
    side = [r for r in range(500) if not in_validation(ids[r], 0.5, 0)]
    over = [int(lengths[r]) for r in side if lengths[r] > 512]
    assert f"over-long: {len(over)} sample(s) above overflow_max 512 skipped, {sum(over)} tokens lost" \
        in capsys.readouterr().out
    assert load_plan(out).epochs[0].stats["skipped_samples"] == len(over) + sum(lengths[r] == 0 for r in side)
