"""Preference pairs end to end: records as two rows, plans that keep each pair in one microbatch
(every epoch, every shard, packed or not), the order over pairs, DPO collation against a plain
definition, save/load, the CLI on a small JSONL of preference records, and the user errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import umlos_cuda as uc
from batching_cases import corpus, train_tokenizer, write_model_dir
from umlos_cuda import errors
from umlos_cuda.batching import (BatchPlanBuilder, BatchReader, BatchingConfig, CollatedBatch, LengthCache,
                                 PackingConfig, PreferenceSample, SampleMeta, TokenStore, collate_preference,
                                 collate_preference_microbatch, load_plan, save_plan, sft_sample, shard_plan,
                                 split_pairs, verify_plan)
from umlos_cuda.batching.collate import IGNORE_INDEX
from umlos_cuda.batching.lengths.pairs import holds_pairs, pair_ids
from umlos_cuda.batching.plans.groups import group_lengths, unit_config
from umlos_cuda.batching.plans.planner import PLAN_DATASET_KEY, plan_manifest
from umlos_cuda.cli import main


def expect(code, function, *args, **kwargs):
    with pytest.raises(uc.UmlosError) as info:
        function(*args, **kwargs)
    assert info.value.code == code, info.value.message
    return info.value


def pair_names(pairs: int) -> list[str]:
    return [sample_id for p in range(pairs) for sample_id in pair_ids(f"rec{p}")]


def random_lengths(pairs: int, seed: int, high: int = 600) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(1, high, size=2 * pairs).astype(np.uint32)


def check_pairs_plan(plan, lengths: np.ndarray, config: BatchingConfig) -> None:
    """The plain definition: each microbatch holds whole pairs (rows 2p, 2p + 1, side by side, in
    one packed row when packed); each pair not skipped exactly once an epoch; a pair is skipped
    when its shorter row is under min_length or its length over overflow_max; budgets hold."""
    spec = config.bucket_spec
    n = lengths.shape[0]
    chosen, rejected = lengths[0::2].astype(np.int64), lengths[1::2].astype(np.int64)
    pair_length = (np.maximum(chosen, rejected) if config.pack is None
                   else chosen + rejected + config.pack.separator_len)
    skipped = (np.minimum(chosen, rejected) < spec.min_length) | (pair_length > spec.overflow_max)
    for epoch in plan.epochs:
        seen = np.zeros(n // 2, dtype=np.int64)
        for j in range(len(epoch)):
            rows = epoch.rows(j).astype(np.int64)
            assert rows.size % 2 == 0
            assert (rows[0::2] % 2 == 0).all() and (rows[1::2] == rows[0::2] + 1).all()
            pairs = rows[0::2] // 2
            np.add.at(seen, pairs, 1)
            bucket = int(epoch.bucket_ids[j])
            assert (spec.bucket_ids(pair_length[pairs].astype(np.uint32)) == bucket).all()
            max_len = int(epoch.max_len[j])
            if config.pack is None:
                assert rows.size * max_len <= config.token_budget
                assert int(lengths[rows].max()) <= max_len
            else:
                bounds = np.asarray(epoch.row_offsets[int(epoch.pack_rows[j]):int(epoch.pack_rows[j + 1]) + 1])
                assert (bounds % 2 == 0).all()  # no packed row cuts a pair
                assert (len(bounds) - 1) * config.pack.max_length <= config.token_budget
        if plan.meta.shard is None:
            assert (seen[~skipped] == 1).all() and (seen[skipped] == 0).all()
            assert epoch.stats["skipped_samples"] == 2 * int(skipped.sum())
        else:
            assert seen.max(initial=0) <= 1


CONFIGS = {
    "bucket": lambda **kw: BatchingConfig.predictable(2048, (64, 128, 256), 512, group_size=2, **kw),
    "max": lambda **kw: BatchingConfig.throughput(1500, (100, 300), 600, group_size=2, **kw),
    "packed": lambda **kw: BatchingConfig.throughput(
        4096, (), 1024, group_size=2, pack=PackingConfig(max_length=1024, separator_len=1), **kw),
}


# --------------------------------------------------------------- plans
@settings(max_examples=60, deadline=None)
@given(st.integers(1, 80), st.integers(0, 2**32), st.sampled_from(sorted(CONFIGS)), st.integers(0, 3),
       st.integers(1, 3), st.integers(0, 40))
def test_every_pair_is_in_one_microbatch_once_an_epoch(pairs, seed, kind, min_length, epochs, short):
    lengths = random_lengths(pairs, seed % 1000, high=700)
    lengths[:short] = np.arange(lengths[:short].size) % 3  # rows of 0, 1, 2 tokens: min_length skips their pairs
    config = CONFIGS[kind](seed=seed, min_length=min_length)
    plan = BatchPlanBuilder(lengths, config, sample_ids=pair_names(pairs)).build(epochs)
    check_pairs_plan(plan, lengths, config)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_the_order_is_the_engines_over_pairs(kind):
    """A plan of pairs is the plan of its pairs as units (pair lengths, half the budget unpacked) laid
    out as rows; with one bucket and fixed chunks its pairs follow the engine's epoch order itself."""
    pairs = 300
    lengths = random_lengths(pairs, 3, high=500)
    config = CONFIGS[kind]()
    plan = BatchPlanBuilder(lengths, config).build(2)
    units = BatchPlanBuilder(group_lengths(lengths, config), unit_config(config)).build(2)
    assert plan_manifest(config, 2 * pairs).hash == plan_manifest(unit_config(config), pairs).hash
    for mine, theirs in zip(plan.epochs, units.epochs):
        assert np.array_equal(np.asarray(mine.samples)[0::2] // 2, theirs.samples)
        assert np.array_equal(mine.offsets, 2 * np.asarray(theirs.offsets))
        assert np.array_equal(mine.max_len, theirs.max_len) and np.array_equal(mine.bucket_ids, theirs.bucket_ids)
    one_bucket = BatchingConfig.predictable(1024, (), 256, group_size=2, seed=9)
    plan = BatchPlanBuilder(np.minimum(lengths, 256), one_bucket).build(3)
    manifest = plan_manifest(one_bucket, 2 * pairs)
    for epoch in plan.epochs:
        engine = uc.epoch_indices(manifest, PLAN_DATASET_KEY, epoch.epoch, 0, pairs, backend="numpy")
        assert np.array_equal(np.asarray(epoch.samples)[0::2] // 2, engine)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_shards_keep_pairs_together(kind, world_size):
    lengths = random_lengths(150, 5)
    config = CONFIGS[kind]()
    plan = BatchPlanBuilder(lengths, config, sample_ids=pair_names(150)).build(2)
    shards = [shard_plan(plan, rank, world_size) for rank in range(world_size)]
    for shard in shards:
        check_pairs_plan(shard, lengths, config)
    for e in range(plan.num_epochs):
        dealt = {mb.index: mb.samples for shard in shards for mb in shard.iter_epoch(e)}
        assert dealt == {mb.index: mb.samples for mb in plan.iter_epoch(e)}  # the one global sequence, dealt out


def test_plans_of_pairs_save_load_and_verify(tmp_path):
    lengths = random_lengths(120, 7)
    ids = pair_names(120)
    for kind in sorted(CONFIGS):
        config = CONFIGS[kind]()
        plan = BatchPlanBuilder(lengths, config, sample_ids=ids).build(2)
        assert plan.config.to_dict()["group_size"] == 2
        save_plan(plan, tmp_path / kind, jsonl="always")
        loaded = load_plan(tmp_path / kind, verify=True)
        assert loaded.fingerprint == plan.fingerprint and loaded.config == config
        assert verify_plan(tmp_path / kind)["fingerprint"] == plan.fingerprint
        meta = json.loads((tmp_path / kind / "meta.json").read_text())
        assert meta["group_size"] == 2
    plain = BatchingConfig.predictable(2048, (64, 128), 256)
    assert "group_size" not in plain.to_dict()  # other plans keep their bytes and fingerprints


def test_verify_refuses_a_split_pair(tmp_path):
    lengths = random_lengths(40, 8, high=120)
    config = BatchingConfig.predictable(1024, (64,), 128, group_size=2)
    plan = BatchPlanBuilder(lengths, config).build(1)
    save_plan(plan, tmp_path / "plan")
    samples = np.load(tmp_path / "plan" / "epoch_0" / "samples.npy")
    samples[[1, 2]] = samples[[2, 1]]  # the rejected row of the first pair swaps with the next chosen row
    np.save(tmp_path / "plan" / "epoch_0" / "samples.npy", samples)
    error = expect(errors.PLAN_SAMPLES_INVALID, verify_plan, tmp_path / "plan")
    assert "pair" in error.message


def test_configuration_errors():
    lengths = random_lengths(10, 1, high=100)
    expect(errors.BATCHING_CONFIG_INVALID, BatchingConfig.predictable, 1000, (64,), 600, group_size=2)  # 2 x 600
    for group in (0, 3, "2", 2.0):
        expect(errors.BATCHING_CONFIG_INVALID, BatchingConfig, group_size=group)
    pairs_config = BatchingConfig.predictable(1024, (64,), 128, group_size=2)
    expect(errors.BATCHING_CONFIG_INVALID, BatchPlanBuilder, lengths[:-1], pairs_config)  # an odd row count
    error = expect(errors.BATCHING_CONFIG_INVALID, BatchPlanBuilder, lengths,
                   BatchingConfig.predictable(1024, (64,), 128), sample_ids=pair_names(10))
    assert "group_size=2" in error.message  # the ids name pairs: a plan of rows would split them
    expect(errors.BATCHING_CONFIG_INVALID, BatchPlanBuilder, lengths, pairs_config,
           sample_ids=[f"s{i}" for i in range(20)])  # group_size 2 over ids that are not pairs
    expect(errors.LENGTHS_INVALID, holds_pairs, pair_names(3)[:-1])  # odd
    expect(errors.LENGTHS_INVALID, holds_pairs, ["a/chosen", "b/rejected"])  # out of place
    assert holds_pairs(pair_names(2)) and not holds_pairs(["a", "b"]) and not holds_pairs([])


# --------------------------------------------------------------- collation
def plain_side(prompt: list[int], completion: list[int], width: int, pad_id: int) -> dict[str, list[int]]:
    ids = prompt + completion
    n = len(ids)
    mask = [0] * len(prompt) + [1] * len(completion)
    return {
        "input_ids": ids + [pad_id] * (width - n),
        "labels": [ids[t + 1] if t + 1 < n and mask[t + 1] else IGNORE_INDEX for t in range(width)],
        "loss_mask": mask + [0] * (width - n),
        "attention_mask": [1] * n + [0] * (width - n),
        "segment_ids": [0] * n + [-1] * (width - n),
        "position_ids": list(range(n)) + [0] * (width - n),
    }


token_lists = st.lists(st.integers(0, 50_000), min_size=1, max_size=12)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 50_000), max_size=8), token_lists, token_lists)
                .filter(lambda t: t[1] != t[2]), min_size=1, max_size=6),
       st.integers(0, 9), st.booleans())
def test_collate_preference_matches_a_plain_definition(records, pad_id, bucket):
    samples = [PreferenceSample(tuple(p), tuple(c), tuple(r), SampleMeta(f"r{i}", "prefs"))
               for i, (p, c, r) in enumerate(records)]
    longest = max(len(p) + max(len(c), len(r)) for p, c, r in records)
    width = longest + 3 if bucket else longest
    batch = collate_preference(samples, width if bucket else None, "pad_to_bucket" if bucket else "pad_to_max",
                               pad_id=pad_id)
    arrays = batch.as_dict()
    assert batch.num_pairs == len(records)
    for i, (prompt, chosen, rejected) in enumerate(records):
        for side, completion in (("chosen", chosen), ("rejected", rejected)):
            for name, row in plain_side(prompt, completion, width, pad_id).items():
                assert arrays[f"{side}_{name}"][i].tolist() == row, (side, name)
    assert all(a.dtype == np.int32 for a in arrays.values())
    together = batch.concatenated()
    assert np.array_equal(together.input_ids,
                          np.concatenate([arrays["chosen_input_ids"], arrays["rejected_input_ids"]]))
    as_rows = collate_preference([(s.chosen(), s.rejected()) for s in samples], width if bucket else None,
                                 "pad_to_bucket" if bucket else "pad_to_max", pad_id=pad_id)
    assert all(np.array_equal(a, as_rows.as_dict()[k]) for k, a in arrays.items())


def test_collation_errors():
    expect(errors.COLLATE_INPUT_INVALID, collate_preference, [])
    expect(errors.COLLATE_INPUT_INVALID, collate_preference, [([1, 2], [1, 1])])  # a row, not a pair
    odd = CollatedBatch.from_dict({name: np.zeros((3, 4), np.int32) for name in
                                   ("input_ids", "labels", "loss_mask", "attention_mask", "segment_ids",
                                    "position_ids")})
    expect(errors.COLLATE_INPUT_INVALID, split_pairs, odd)
    packed = CollatedBatch(*(np.asarray([[0, 0, 1, 1]], np.int32) for _ in range(6)))
    expect(errors.COLLATE_INPUT_INVALID, split_pairs, CollatedBatch(*(np.concatenate([a, a]) for a in (
        packed.input_ids, packed.labels, packed.loss_mask, packed.attention_mask, packed.segment_ids,
        packed.position_ids))))


# --------------------------------------------------------------- the command line
@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    path = tmp_path_factory.mktemp("prefs")
    tokenizer = train_tokenizer()
    write_model_dir(path / "model", tokenizer, {"eos_token": "</s>"})
    texts = corpus(90, seed=4)
    with open(path / "prefs.jsonl", "w", encoding="utf-8") as handle:
        for i in range(30):
            prompt, chosen, rejected = texts[3 * i][:40], texts[3 * i + 1], texts[3 * i + 2]
            if chosen == rejected:
                rejected += " no"
            handle.write(json.dumps({"id": f"q{i:02d}", "question": prompt, "good": chosen, "bad": rejected}) + "\n")
    return path


def run(capsys, *argv):
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


PAIR_FIELDS = ("--prompt-field", "question", "--chosen-field", "good", "--rejected-field", "bad")


def test_cli_end_to_end(workspace, capsys, tmp_path):
    records = [json.loads(line) for line in (workspace / "prefs.jsonl").read_text().splitlines()]
    code, out, err = run(capsys, "data", "lengths", "build", "--dataset", workspace / "prefs.jsonl", "--tokenizer",
                         workspace / "model", "--output", tmp_path / "lengths.jsonl", "--quiet", *PAIR_FIELDS)
    assert code == 0, err
    cache = LengthCache.load(tmp_path / "lengths.jsonl", sidecar="require")
    assert cache.sample_ids == [i for r in records for i in (f"{r['id']}/chosen", f"{r['id']}/rejected")]
    samples = [sft_sample(workspace / "model", r["question"], r[field], SampleMeta(f"{r['id']}/{side}", "p"))
               for r in records for field, side in (("good", "chosen"), ("bad", "rejected"))]
    assert cache.lengths.tolist() == [s.length for s in samples]

    code, out, err = run(capsys, "data", "tokenize", "--dataset", workspace / "prefs.jsonl", "--tokenizer",
                         workspace / "model", "--output", tmp_path / "store", "--quiet", *PAIR_FIELDS)
    assert code == 0, err
    store = TokenStore.open(tmp_path / "store")
    assert store.meta["loss_mask"] == "template" and store.sample_ids == cache.sample_ids
    for row, sample in enumerate(samples):  # each row is the template sample of its side, prompt masked
        ids, mask = store.arrays(row)
        assert ids.tolist() == list(sample.input_ids) and mask.tolist() == list(sample.loss_mask)

    code, out, err = run(capsys, "plan", "build", "--lengths", tmp_path / "store" / "lengths.jsonl",
                         "--bucket-edges", "64,128", "--overflow-max", "256", "--token-budget", "1024",
                         "--epochs", "2", "--output", tmp_path / "plan", "--quiet")
    assert code == 0, err
    assert "preference pairs: 30 pairs" in out
    plan = load_plan(tmp_path / "plan")
    assert plan.config.group_size == 2
    check_pairs_plan(plan, np.asarray(cache.lengths), plan.config)
    code, out, err = run(capsys, "plan", "verify", tmp_path / "plan", "--lengths", tmp_path / "lengths.jsonl")
    assert code == 0, err
    code, out, err = run(capsys, "plan", "info", tmp_path / "plan")
    assert code == 0 and "preference pairs: 30 pairs" in out
    code, out, err = run(capsys, "plan", "shard", tmp_path / "plan", "--world-size", "3", "--output",
                         tmp_path / "shards")
    assert code == 0, err
    for rank in range(3):
        check_pairs_plan(load_plan(tmp_path / "shards" / f"rank_{rank}"), np.asarray(cache.lengths), plan.config)

    code, out, err = run(capsys, "batch", "generate", "--plan", tmp_path / "plan", "--store", tmp_path / "store",
                         "--output", tmp_path / "batches", "--quiet")
    assert code == 0, err
    files = sorted((tmp_path / "batches").glob("epoch_0_batch_*.npz"))
    assert len(files) == len(plan.epochs[0])
    for j, data in enumerate(BatchReader(tmp_path / "batches").iter_epoch(0)):  # any layout: the six arrays
        microbatch = plan.microbatch(0, j)
        from_file = split_pairs(CollatedBatch.from_dict(data)).as_dict()
        direct = collate_preference_microbatch(store, microbatch)
        assert all(np.array_equal(direct.as_dict()[k], v) for k, v in from_file.items())
        by_id = {s.meta.sample_id: s for s in samples}
        pairs = [(by_id[a], by_id[b]) for a, b in zip(microbatch.samples[0::2], microbatch.samples[1::2])]
        plain = collate_preference(pairs, microbatch.max_len, "pad_to_bucket")
        assert all(np.array_equal(plain.as_dict()[k], v) for k, v in from_file.items())


def test_cli_user_errors(workspace, capsys, tmp_path):
    base = ("data", "lengths", "build", "--dataset", workspace / "prefs.jsonl", "--tokenizer", workspace / "model",
            "--output", tmp_path / "l.jsonl", "--quiet")
    for argv in (("--prompt-field", "question", "--chosen-field", "good"),
                 ("--chosen-field", "good", "--rejected-field", "bad"),
                 (*PAIR_FIELDS, "--response-field", "good"),
                 ("--text-field", "good", "--chosen-field", "good", "--rejected-field", "bad")):
        with pytest.raises(SystemExit) as exit_info:
            run(capsys, *base, *argv)
        assert exit_info.value.code == 2
        message = capsys.readouterr().err
        assert any(words in message for words in ("go together", "not allowed with", "exclude each other",
                                                   "give conversational=True", "without a text, response")), message
        assert not (tmp_path / "l.jsonl").exists()
    code, _, err = run(capsys, *base, "--prompt-field", "question", "--chosen-field", "good",
                       "--rejected-field", "worse")
    assert code == 2 and err.startswith(f"error {errors.DATASET_RECORD_INVALID}:") and "'worse'" in err

    (tmp_path / "dup.jsonl").write_text('{"id": "a", "q": "x", "g": "y", "b": "z"}\n'
                                        '{"id": "a", "q": "x", "g": "y", "b": "w"}\n')
    code, _, err = run(capsys, "data", "lengths", "build", "--dataset", tmp_path / "dup.jsonl", "--tokenizer",
                       workspace / "model", "--output", tmp_path / "l.jsonl", "--quiet", "--prompt-field", "q",
                       "--chosen-field", "g", "--rejected-field", "b")
    assert code == 2 and err.startswith(f"error {errors.DATASET_RECORD_INVALID}:") and "repeats the id 'a'" in err

    odd = LengthCache.from_arrays(pair_names(3)[:-1], [5, 6, 7, 8, 9], "0" * 64)
    odd.write(tmp_path / "odd.jsonl")
    code, _, err = run(capsys, "plan", "build", "--lengths", tmp_path / "odd.jsonl", "--bucket-edges", "8",
                       "--overflow-max", "16", "--token-budget", "64", "--output", tmp_path / "plan", "--quiet")
    assert code == 2 and err.startswith(f"error {errors.LENGTHS_INVALID}:") and "odd" in err
    pairs = LengthCache.from_arrays(pair_names(3), [5, 6, 7, 8, 9, 10], "0" * 64)
    pairs.write(tmp_path / "pairs.jsonl")
    code, _, err = run(capsys, "plan", "build", "--lengths", tmp_path / "pairs.jsonl", "--bucket-edges", "8",
                       "--overflow-max", "16", "--token-budget", "16", "--output", tmp_path / "plan", "--quiet")
    assert code == 2 and err.startswith(f"error {errors.BATCHING_CONFIG_INVALID}:") and "group_size" in err
