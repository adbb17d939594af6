"""Hostile inputs of the classes ``tamper/`` and ``user/`` (issue 20), each in a fenced subprocess.

``tamper/``: a plan, a token store, a length cache sidecar, a Megatron file
or a puzzle-server answer changed behind the back of the program that wrote
it. The commands that derive something from a plan or a store (``plan
shard``, ``batch generate``, ``batch check``) must notice it by default
(``--no-verify`` opts out), every plan load checks the structure it relies
on, and a reader of a server or a file checks the JSON types it uses.

``user/``: what a new user met: two ``gym run``s of the documented
``--port 0`` recipe must give the same windows, the documentation's Python
must build what its command builds, a dataset given where a length cache is
expected is explained, a trailing blank line or a byte-order mark does not
fail a build and bad lines can be skipped and counted, a loader with workers
and a plan past its last epoch warn, progress says its rate and time left,
and the curriculum plot labels whole windows.

Every case builds its input from the module's workspace (made once, through
the API), runs one command or reader under tests/hostile_support.py's limits,
and checks the verdict and that nothing outside its own folder changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil

import numpy as np
import pytest

import hostile_support as hs
from token_cases import write_megatron

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
#: An 11-token vocabulary: what the tampered store's token 65535 is checked against.
WORDS = ("a", "b", "c", "d", "e", "f", "g", "h", "i")


# ---------------------------------------------------------------------- the workspace
def _tokenizer(path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "</s>": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    path.mkdir()
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))


def _dataset(path, count: int = 120) -> None:
    rng = np.random.default_rng(3)
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(count):
            words = rng.choice(WORDS, size=int(rng.integers(1, 14)))
            handle.write(json.dumps({"id": f"rec_{i:03d}", "text": " ".join(words)}) + "\n")


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """model/ (11 tokens), train.jsonl, store/, plan/ (from the store's cache), batches/, megatron prefixes,
    split-plan/ (the store's train side, samples split into pieces of 8 tokens), batches-mixed/ (a mixed plan of
    two components over the store, components 'a' and 'b')."""
    from umlos_cuda.batching import BatchingConfig, BatchPlanBuilder, LengthCache, save_plan, shard_plan
    from umlos_cuda.batching.batches.writer import write_batches
    from umlos_cuda.batching.tokens.writer import tokenize_dataset

    root = tmp_path_factory.mktemp("hostile-tamper")
    _tokenizer(root / "model")
    _dataset(root / "train.jsonl")
    store = tokenize_dataset(root / "train.jsonl", root / "model", root / "store")
    cache = LengthCache.load(root / "store" / "lengths.jsonl")
    config = BatchingConfig.predictable(64, (4, 8), 16, seed=7)
    plan = BatchPlanBuilder(cache, config).build(2)
    save_plan(plan, root / "plan")
    write_batches(root / "plan", root / "batches", store, workers=1)
    save_plan(shard_plan(plan, 1, 3), root / "shard")
    from umlos_cuda.batching.plans.overlong import OverlongConfig
    from umlos_cuda.batching.plans.splits import SplitConfig

    pieces = BatchingConfig.predictable(64, (4,), 8, seed=7, overlong=OverlongConfig(8, "split"),
                                        split=SplitConfig("train", 0.25, 1))
    save_plan(BatchPlanBuilder(cache, pieces).build(1), root / "split-plan")
    from umlos_cuda.batching.plans.windows import Component, MixedPlan, MixtureDefinition
    from umlos_cuda.batching.sources import open_source

    parts = [Component(open_source(str(root / "store"), tokens=True), 0.5, seed, None, name)
             for seed, name in ((1, "a"), (2, "b"))]
    mixed = MixedPlan.build(MixtureDefinition(config, tuple(parts), 16, 80))
    write_batches(mixed, root / "batches-mixed", [root / "store"] * 2, workers=1)
    for dtype in (np.int8, np.int16, np.int32):
        name = np.dtype(dtype).name
        prefix = root / f"mega_{name}"
        write_megatron(prefix, [[3, -2, 5], [4, 4], [7, 1, 2, 2]], dtype=dtype)
        LengthCache.from_arrays(None, [3, 2, 4], "unknown").write(root / f"mega_{name}.lengths.jsonl")
        mcfg = BatchingConfig.predictable(16, (4,), 8, seed=1)
        save_plan(BatchPlanBuilder(LengthCache.load(root / f"mega_{name}.lengths.jsonl"), mcfg).build(1),
                  root / f"mega_{name}.plan")
    return root


def read_doc(name: str) -> str:
    with open(os.path.join(ROOT, "docs", name), encoding="utf-8") as handle:
        return handle.read()


def copy(ws, tmp_path, *names) -> None:
    for name in names:
        source = ws / name
        if source.is_dir():
            shutil.copytree(source, tmp_path / name)
        else:
            shutil.copy2(source, tmp_path / name)


def run_cli(tmp_path, *args, owned=(), **limits) -> hs.Outcome:
    """The command in a fenced child; asserts that only ``owned`` paths (relative to tmp_path) changed."""
    before = hs.tree_state(tmp_path)
    outcome = hs.cli(*map(str, args), cwd=tmp_path, **limits)
    hs.assert_untouched(before, hs.tree_state(tmp_path), owned=owned)
    return outcome


def run_api(tmp_path, code: str, *, owned=(), **limits) -> hs.Outcome:
    before = hs.tree_state(tmp_path)
    outcome = hs.python(hs.API_PRELUDE + code, cwd=tmp_path, **limits)
    hs.assert_untouched(before, hs.tree_state(tmp_path), owned=owned)
    return outcome


def save_npy(path, array) -> None:
    with open(path, "wb") as handle:
        np.save(handle, array, allow_pickle=False)


def rehash_store(store) -> None:
    """Recompute the store's meta.json digests after a tamper (an attacker who knows the format)."""
    meta = json.loads((store / "meta.json").read_text())
    for name in ("tokens", "loss_mask", "offsets"):
        array = np.load(store / f"{name}.npy")
        meta[f"{name}_sha256"] = hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()
    (store / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


def swap_two_samples(plan) -> None:
    """Swap two rows of epoch 0 of the same bucket: every structural check still passes."""
    samples = np.load(plan / "epoch_0" / "samples.npy")
    offsets = np.load(plan / "epoch_0" / "offsets.npy")
    buckets = np.load(plan / "epoch_0" / "bucket_ids.npy")
    first = int(np.flatnonzero(np.diff(offsets) > 1)[0])
    second = next(j for j in range(first + 1, len(buckets)) if buckets[j] == buckets[first])
    a, b = int(offsets[first]), int(offsets[second])
    samples[a], samples[b] = samples[b], samples[a]
    save_npy(plan / "epoch_0" / "samples.npy", samples)


# ---------------------------------------------------------------------- tamper/: plans
def tamper_plan_shard_after_swap(ws, tmp_path):
    copy(ws, tmp_path, "plan")
    swap_two_samples(tmp_path / "plan")
    outcome = run_cli(tmp_path, "plan", "shard", "plan", "--world-size", "2", "--output", "shards")
    hs.assert_refused(outcome, "PLAN_FINGERPRINT_MISMATCH", names=tmp_path / "plan")
    assert "--no-verify" in outcome.stderr


def tamper_plan_shard_no_verify(ws, tmp_path):
    copy(ws, tmp_path, "plan")
    swap_two_samples(tmp_path / "plan")
    hs.assert_ok(run_cli(tmp_path, "plan", "shard", "plan", "--world-size", "2", "--output", "shards", "--no-verify",
                         owned=["shards"]))


def tamper_edited_plan_parent_after_swap(ws, tmp_path):
    """An edited plan verifies its parent as the parent's own kind does: two samples swapped in the parent (every
    structural check passes) are refused by the parent's verification, naming it."""
    copy(ws, tmp_path, "plan")
    hs.assert_ok(run_cli(tmp_path, "plan", "edit", "plan", "--skip-steps", "1:2", "--output", "edited",
                         owned=["edited"]))
    hs.assert_ok(run_cli(tmp_path, "plan", "verify", "edited"))
    swap_two_samples(tmp_path / "plan")
    hs.assert_refused(run_cli(tmp_path, "plan", "verify", "edited"),
                      ("PLAN_JSONL_MISMATCH", "PLAN_FINGERPRINT_MISMATCH"), names=tmp_path / "plan")


def tamper_edited_plan_units_rewritten(ws, tmp_path):
    """An edited plan whose meta.json lists other units after the edit (its fingerprint left as it was) is refused
    by every reader, a sampler included."""
    copy(ws, tmp_path, "plan")
    hs.assert_ok(run_cli(tmp_path, "plan", "edit", "plan", "--skip-steps", "1:2", "--output", "edited",
                         owned=["edited"]))
    meta = json.loads((tmp_path / "edited" / "meta.json").read_text())
    meta["units"][0] += 1
    (tmp_path / "edited" / "meta.json").write_text(json.dumps(meta))
    hs.assert_refused(run_cli(tmp_path, "plan", "explain", "edited", "--step", "0"), "PLAN_FINGERPRINT_MISMATCH",
                      names=tmp_path / "edited")
    outcome = run_api(tmp_path, "from umlos_cuda.torch import PlanBatchSampler\n"
                                "guarded(lambda: PlanBatchSampler('edited', 0, 1))\n")
    hs.assert_refused(outcome, "PLAN_FINGERPRINT_MISMATCH", names="edited")


def tamper_plan_generate_after_swap(ws, tmp_path):
    copy(ws, tmp_path, "plan", "store")
    swap_two_samples(tmp_path / "plan")
    outcome = run_cli(tmp_path, "batch", "generate", "--plan", "plan", "--store", "store", "--output", "out",
                      "--quiet", owned=["out"])
    hs.assert_refused(outcome, "PLAN_FINGERPRINT_MISMATCH", names=tmp_path / "plan")
    assert not (tmp_path / "out").exists()


def tamper_plan_check_after_swap(ws, tmp_path):
    copy(ws, tmp_path, "batches")
    swap_two_samples(tmp_path / "batches" / "plan")
    hs.assert_refused(run_cli(tmp_path, "batch", "check", "batches"), "PLAN_FINGERPRINT_MISMATCH",
                      names=tmp_path / "batches" / "plan")


def tamper_plan_meta_field(ws, tmp_path):
    copy(ws, tmp_path, "plan", "store")
    meta = json.loads((tmp_path / "plan" / "meta.json").read_text())
    meta["token_budget"] = 4096
    (tmp_path / "plan" / "meta.json").write_text(json.dumps(meta, indent=2))
    outcome = run_cli(tmp_path, "batch", "generate", "--plan", "plan", "--store", "store", "--output", "out",
                      "--quiet", owned=["out"])
    hs.assert_refused(outcome, "PLAN_FINGERPRINT_MISMATCH", names=tmp_path / "plan")


def tamper_plan_lengths(ws, tmp_path):
    copy(ws, tmp_path, "plan")
    lengths = np.load(tmp_path / "plan" / "lengths.npy")
    lengths[[0, 1]] = lengths[[1, 0]] + 0
    lengths[0] += 1
    save_npy(tmp_path / "plan" / "lengths.npy", lengths)
    outcome = run_cli(tmp_path, "plan", "shard", "plan", "--world-size", "2", "--output", "shards")
    hs.assert_refused(outcome, ("PLAN_LENGTHS_MISMATCH", "PLAN_FINGERPRINT_MISMATCH"), names=tmp_path / "plan")


def tamper_plan_sample_ids(ws, tmp_path):
    copy(ws, tmp_path, "plan", "store")
    path = tmp_path / "plan" / "sample_ids.jsonl"
    lines = path.read_text().splitlines()
    lines[0], lines[1] = lines[1], lines[0]
    path.write_text("\n".join(lines) + "\n")
    outcome = run_cli(tmp_path, "batch", "generate", "--plan", "plan", "--store", "store", "--output", "out",
                      "--quiet", owned=["out"])
    hs.assert_refused(outcome, ("PLAN_LENGTHS_MISMATCH", "PLAN_FINGERPRINT_MISMATCH"), names=tmp_path / "plan")


def _bump_middle_offset(plan) -> None:
    """Offsets still start at 0 and end at S, but one step goes backwards: a microbatch of -k rows."""
    offsets = np.load(plan / "epoch_0" / "offsets.npy")
    middle = len(offsets) // 2
    offsets[middle] = offsets[middle + 1] + 3
    save_npy(plan / "epoch_0" / "offsets.npy", offsets)


def tamper_plan_offsets_not_monotone_info(ws, tmp_path):
    copy(ws, tmp_path, "plan")
    _bump_middle_offset(tmp_path / "plan")
    hs.assert_refused(run_cli(tmp_path, "plan", "info", "plan"), "PLAN_FORMAT_INVALID", names=tmp_path / "plan")


def tamper_plan_offsets_not_monotone_explain(ws, tmp_path):
    """``plan explain`` reads a plan as every load does: a microbatch of -k rows is refused, never described."""
    copy(ws, tmp_path, "plan")
    _bump_middle_offset(tmp_path / "plan")
    hs.assert_refused(run_cli(tmp_path, "plan", "explain", "plan", "--step", "0", "--world-size", "2"),
                      "PLAN_FORMAT_INVALID", names=tmp_path / "plan")


def tamper_plan_offsets_not_monotone_sampler(ws, tmp_path):
    copy(ws, tmp_path, "plan")
    _bump_middle_offset(tmp_path / "plan")
    outcome = run_api(tmp_path, "from umlos_cuda.torch import PlanBatchSampler\n"
                                "guarded(lambda: print(sum(len(b) for b in PlanBatchSampler('plan'))))\n")
    hs.assert_refused(outcome, "PLAN_FORMAT_INVALID", names="plan")


def tamper_plan_row_out_of_range(ws, tmp_path):
    copy(ws, tmp_path, "plan")
    samples = np.load(tmp_path / "plan" / "epoch_1" / "samples.npy")
    samples[5] = 10_000
    save_npy(tmp_path / "plan" / "epoch_1" / "samples.npy", samples)
    outcome = run_api(tmp_path, "from umlos_cuda.batching import load_plan\n"
                                "guarded(lambda: list(load_plan('plan').iter_epoch(1)))\n")
    hs.assert_refused(outcome, "PLAN_SAMPLES_INVALID", names="plan")


def tamper_plan_piece_out_of_range(ws, tmp_path):
    """A piece number no sample has: loading hands out no token range for it."""
    copy(ws, tmp_path, "split-plan")
    pieces = np.load(tmp_path / "split-plan" / "epoch_0" / "pieces.npy")
    pieces[3] = 10_000
    save_npy(tmp_path / "split-plan" / "epoch_0" / "pieces.npy", pieces)
    outcome = run_api(tmp_path, "from umlos_cuda.batching import load_plan\n"
                                "guarded(lambda: list(load_plan('split-plan').iter_epoch(0)))\n")
    hs.assert_refused(outcome, "PLAN_SAMPLES_INVALID", names="split-plan")


def tamper_plan_pieces_cut_short(ws, tmp_path):
    copy(ws, tmp_path, "split-plan", "store")
    pieces = np.load(tmp_path / "split-plan" / "epoch_0" / "pieces.npy")
    save_npy(tmp_path / "split-plan" / "epoch_0" / "pieces.npy", pieces[:-1])
    outcome = run_cli(tmp_path, "batch", "generate", "--plan", "split-plan", "--store", "store", "--output", "out",
                      "--quiet", owned=["out"])
    hs.assert_refused(outcome, "PLAN_FORMAT_INVALID", names=tmp_path / "split-plan")


def tamper_plan_split_fraction_edited(ws, tmp_path):
    """Another validation fraction in meta.json: another split, which the load or the digests see."""
    copy(ws, tmp_path, "split-plan", "store")
    meta = json.loads((tmp_path / "split-plan" / "meta.json").read_text())
    meta["split"]["validation_fraction"] = 0.5
    (tmp_path / "split-plan" / "meta.json").write_text(json.dumps(meta, indent=2))
    outcome = run_cli(tmp_path, "batch", "generate", "--plan", "split-plan", "--store", "store", "--output", "out",
                      "--quiet", owned=["out"])
    # the rows of another split are not the plan's (every load), or its digests differ (deriving commands)
    hs.assert_refused(outcome, ("PLAN_SAMPLES_INVALID", "PLAN_FINGERPRINT_MISMATCH"), names=tmp_path / "split-plan")


def tamper_plan_stats_make_len_lie(ws, tmp_path):
    copy(ws, tmp_path, "plan")
    stats_path = tmp_path / "plan" / "epoch_0" / "stats.json"
    stats = json.loads(stats_path.read_text())
    true_count = stats["microbatches"]
    stats["microbatches"] = true_count + 50
    stats_path.write_text(json.dumps(stats))
    outcome = run_api(tmp_path, "from umlos_cuda.torch import PlanBatchSampler\n"
                                "def count():\n"
                                "    sampler = PlanBatchSampler('plan')\n"
                                "    print('len', len(sampler), 'yielded', len(list(sampler)))\n"
                                "guarded(count)\n")
    if outcome.returncode == 0:  # deriving the count is as good as refusing the lie
        assert f"len {true_count} yielded {true_count}" in outcome.stdout, outcome.describe()
    else:
        hs.assert_refused(outcome, "PLAN_STATS_MISMATCH", names="plan")


def tamper_shard_global_count(ws, tmp_path):
    copy(ws, tmp_path, "shard")
    stats_path = tmp_path / "shard" / "epoch_0" / "stats.json"
    stats = json.loads(stats_path.read_text())
    stats["global_microbatches"] += 30
    stats_path.write_text(json.dumps(stats))
    outcome = run_api(tmp_path, "from umlos_cuda.torch import PlanBatchSampler\n"
                                "sampler = lambda: PlanBatchSampler('shard', rank=1, world_size=3)\n"
                                "guarded(lambda: print(sampler().steps_remaining))\n")
    hs.assert_refused(outcome, "PLAN_STATS_MISMATCH", names="shard")


def tamper_plan_bucket_id_out_of_range(ws, tmp_path):
    copy(ws, tmp_path, "plan")
    buckets = np.load(tmp_path / "plan" / "epoch_0" / "bucket_ids.npy")
    buckets[2] = 99
    save_npy(tmp_path / "plan" / "epoch_0" / "bucket_ids.npy", buckets)
    hs.assert_refused(run_cli(tmp_path, "plan", "info", "plan", "--world-size", "2"), "PLAN_BUCKET_MISMATCH",
                      names=tmp_path / "plan")


# ---------------------------------------------------------------------- tamper/: token stores
def tamper_store_token_flipped(ws, tmp_path):
    copy(ws, tmp_path, "plan", "store")
    tokens = np.load(tmp_path / "store" / "tokens.npy")
    tokens[3] = (int(tokens[3]) + 1) % 11
    save_npy(tmp_path / "store" / "tokens.npy", tokens)
    outcome = run_cli(tmp_path, "batch", "generate", "--plan", "plan", "--store", "store", "--output", "out",
                      "--quiet", owned=["out"])
    hs.assert_refused(outcome, "TOKEN_STORE_INVALID", names=tmp_path / "store" / "tokens.npy")


def _out_of_vocabulary(store) -> None:
    tokens = np.load(store / "tokens.npy")
    save_npy(store / "tokens.npy", np.full_like(tokens, 65535))
    rehash_store(store)


def tamper_store_out_of_vocabulary_generate(ws, tmp_path):
    copy(ws, tmp_path, "plan", "store")
    _out_of_vocabulary(tmp_path / "store")
    outcome = run_cli(tmp_path, "batch", "generate", "--plan", "plan", "--store", "store", "--output", "out",
                      "--quiet", owned=["out"])
    hs.assert_refused(outcome, "TOKEN_STORE_INVALID", names=tmp_path / "store")
    assert "vocabulary" in outcome.stderr


def tamper_store_out_of_vocabulary_check(ws, tmp_path):
    copy(ws, tmp_path, "batches", "store")
    _out_of_vocabulary(tmp_path / "store")
    outcome = run_cli(tmp_path, "batch", "check", "batches", "--store", "store")
    hs.assert_refused(outcome, "TOKEN_STORE_INVALID", names=tmp_path / "store")


def _mixed_check_with_tampered_b(ws, tmp_path, tamper) -> hs.Outcome:
    """``batch check`` of the mixed plan's batch folder with component 'b''s store a copy tampered by ``tamper``."""
    copy(ws, tmp_path, "batches-mixed")
    shutil.copytree(ws / "store", tmp_path / "store-b")
    tamper(tmp_path / "store-b")
    return run_cli(tmp_path, "batch", "check", "batches-mixed", "--source", ws / "store", "store-b")


def _retokenized(store) -> None:
    """Token ids 2 and 3 swapped everywhere and the digests rehashed: the same lengths, a valid store, other ids."""
    tokens = np.load(store / "tokens.npy")
    save_npy(store / "tokens.npy", np.where(tokens == 2, 3, np.where(tokens == 3, 2, tokens)).astype(tokens.dtype))
    rehash_store(store)


def tamper_mixed_component_store_retokenized(ws, tmp_path):
    outcome = _mixed_check_with_tampered_b(ws, tmp_path, _retokenized)
    hs.assert_refused(outcome, "BATCH_STORE_MISMATCH", names=tmp_path / "store-b")
    assert "component 1 ('b')" in outcome.stderr and "tokens_sha256" in outcome.stderr


def tamper_mixed_component_store_token_flipped(ws, tmp_path):
    def flip(store):
        tokens = np.load(store / "tokens.npy")
        tokens[3] = (int(tokens[3]) + 1) % 11
        save_npy(store / "tokens.npy", tokens)

    outcome = _mixed_check_with_tampered_b(ws, tmp_path, flip)
    hs.assert_refused(outcome, "TOKEN_STORE_INVALID", names=tmp_path / "store-b" / "tokens.npy")


def tamper_store_loss_mask_two(ws, tmp_path):
    copy(ws, tmp_path, "plan", "store")
    mask = np.load(tmp_path / "store" / "loss_mask.npy")
    mask[0] = 2
    save_npy(tmp_path / "store" / "loss_mask.npy", mask)
    rehash_store(tmp_path / "store")
    outcome = run_cli(tmp_path, "batch", "generate", "--plan", "plan", "--store", "store", "--output", "out",
                      "--quiet", owned=["out"])
    hs.assert_refused(outcome, ("TOKEN_STORE_INVALID", "COLLATE_INPUT_INVALID"), names=tmp_path / "store")


def tamper_sharded_store_shard_copied_over_another(ws, tmp_path):
    """Shard 1 replaced by a copy of shard 0 and the index rewritten to agree (every hash checks): ``plan build``
    refuses the repeated ids naming the store and both shards (it named neither)."""
    from token_cases import copy_shard_rehashed
    from umlos_cuda.batching.tokens.sharded import tokenize_sharded

    lines = (ws / "train.jsonl").read_text().splitlines(keepends=True)
    parts = [tmp_path / "part-0.jsonl", tmp_path / "part-1.jsonl"]
    parts[0].write_text("".join(lines[:60]))
    parts[1].write_text("".join(lines[60:]))
    tokenize_sharded([str(p) for p in parts], ws / "model", tmp_path / "sharded")
    copy_shard_rehashed(tmp_path / "sharded", 0, 1)
    outcome = run_cli(tmp_path, "plan", "build", "--source", "sharded", "--bucket-edges", "4,8", "--overflow-max", "16",
                      "--token-budget", "64", "--output", "out", "--quiet", owned=["out"])
    hs.assert_refused(outcome, "SHARDED_STORE_INVALID", names="sharded")
    assert os.path.join("sharded", "shards", "00000") in outcome.stderr
    assert os.path.join("sharded", "shards", "00001") in outcome.stderr


def tamper_store_verify_api(ws, tmp_path):
    copy(ws, tmp_path, "store")
    _out_of_vocabulary(tmp_path / "store")
    outcome = run_api(tmp_path, "from umlos_cuda.batching.tokens.store import TokenStore\n"
                                "guarded(lambda: TokenStore.open('store').verify())\n")
    hs.assert_refused(outcome, "TOKEN_STORE_INVALID", names="store")


def _set_parts(meta_path, value, indent: int = 2) -> None:
    """``tokenizer_parts`` (the last key, outside every digest) of the meta.json at ``meta_path`` set to ``value``."""
    meta = json.loads(meta_path.read_text())
    meta["tokenizer_parts"] = value
    meta_path.write_text(json.dumps(meta, indent=indent) + "\n")


def tamper_store_tokenizer_parts_not_hex(ws, tmp_path):
    """A store's parts that are not SHA-256 hex digests: refused when the store opens, naming it."""
    copy(ws, tmp_path, "plan", "store")
    _set_parts(tmp_path / "store" / "meta.json", {"model": "../../etc/passwd", "normalizer": 7})
    outcome = run_cli(tmp_path, "batch", "generate", "--plan", "plan", "--store", "store", "--output", "out",
                      "--quiet", owned=["out"])
    hs.assert_refused(outcome, "TOKEN_STORE_INVALID", names="store")


def tamper_plan_tokenizer_parts_a_list(ws, tmp_path):
    """A plan's parts that are a list, not a dict: refused as the plan's format (they are outside its
    fingerprint, so its digests still check)."""
    copy(ws, tmp_path, "plan", "store")
    _set_parts(tmp_path / "plan" / "meta.json", ["model", "normalizer"])
    outcome = run_cli(tmp_path, "batch", "generate", "--plan", "plan", "--store", "store", "--output", "out",
                      "--quiet", owned=["out"])
    hs.assert_refused(outcome, "PLAN_FORMAT_INVALID", names="plan")
    assert "tokenizer_parts" in outcome.stderr


def tamper_sharded_index_tokenizer_parts_not_hex(ws, tmp_path):
    """A sharded store's index whose parts hold a value that is not a hex digest: refused naming the index."""
    from umlos_cuda.batching.tokens.sharded import tokenize_sharded

    tokenize_sharded([str(ws / "train.jsonl")], ws / "model", tmp_path / "sharded")
    _set_parts(tmp_path / "sharded" / "meta.json", {"model": "A" * 64}, indent=1)
    outcome = run_cli(tmp_path, "plan", "build", "--source", "sharded", "--bucket-edges", "4,8", "--overflow-max", "16",
                      "--token-budget", "64", "--output", "out", "--quiet", owned=["out"])
    hs.assert_refused(outcome, "SHARDED_STORE_INVALID", names="sharded")
    assert "tokenizer_parts" in outcome.stderr


# ---------------------------------------------------------------------- tamper/: length cache sidecars
def _forge_sidecar(path, *, lengths=None, tokenizer_hash=None, sample_ids=None) -> None:
    """Rewrite ``path``.u32 with forged fields and a recomputed header, keeping the JSONL's size and SHA-256."""
    from umlos_cuda.batching.lengths.cache import SIDECAR_ALIGN, SIDECAR_MAGIC, read_sidecar_header

    side = str(path) + ".u32"
    header, offset = read_sidecar_header(side)
    data = np.fromfile(side, dtype="<u4", offset=offset) if lengths is None else np.asarray(lengths, dtype="<u4")
    header.update({"lengths_sha256": hashlib.sha256(data.tobytes()).hexdigest()})
    if tokenizer_hash is not None:
        header["tokenizer_hash"] = tokenizer_hash
    if sample_ids is not None:
        header["sample_ids"] = sample_ids
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("ascii")
    prefix = SIDECAR_MAGIC + len(text).to_bytes(4, "little") + text
    prefix += b"\0" * (-len(prefix) % SIDECAR_ALIGN)
    with open(side, "wb") as handle:
        handle.write(prefix + data.tobytes())


def tamper_sidecar_forged_lengths_require(ws, tmp_path):
    shutil.copy2(ws / "store" / "lengths.jsonl", tmp_path / "lengths.jsonl")
    shutil.copy2(ws / "store" / "lengths.jsonl.u32", tmp_path / "lengths.jsonl.u32")
    lengths = np.fromfile(tmp_path / "lengths.jsonl.u32", dtype="<u4")[-120:].copy()
    _forge_sidecar(tmp_path / "lengths.jsonl", lengths=np.full_like(lengths, 1))
    outcome = run_api(tmp_path, "from umlos_cuda.batching import LengthCache\n"
                                "guarded(lambda: LengthCache.load('lengths.jsonl', sidecar='require'))\n")
    hs.assert_refused(outcome, "LENGTHS_SIDECAR_MISMATCH", names="lengths.jsonl.u32")


def tamper_sidecar_forged_lengths_plan_build(ws, tmp_path):
    """Under the default ``sidecar="auto"`` a forged sidecar is reported and the JSONL's lengths are used."""
    shutil.copy2(ws / "store" / "lengths.jsonl", tmp_path / "lengths.jsonl")
    shutil.copy2(ws / "store" / "lengths.jsonl.u32", tmp_path / "lengths.jsonl.u32")
    lengths = np.fromfile(tmp_path / "lengths.jsonl.u32", dtype="<u4")[-120:].copy()
    _forge_sidecar(tmp_path / "lengths.jsonl", lengths=np.full_like(lengths, 1))
    args = ("plan", "build", "--lengths", "lengths.jsonl", "--bucket-edges", "4,8", "--overflow-max", "16",
            "--token-budget", "64", "--epochs", "2", "--seed", "7")
    forged = run_cli(tmp_path, *args, "--output", "p1", "--quiet", owned=["p1"])
    hs.assert_ok(forged)
    assert "lengths.jsonl.u32" in forged.stderr, forged.describe()
    os.unlink(tmp_path / "lengths.jsonl.u32")
    honest = run_cli(tmp_path, *args, "--output", "p2", "--quiet", owned=["p2", "lengths.jsonl.u32"])
    hs.assert_ok(honest)
    fingerprint = re.compile(r"fingerprint ([0-9a-f]{64})")
    assert fingerprint.search(forged.stdout).group(1) == fingerprint.search(honest.stdout).group(1)


def tamper_sidecar_forged_tokenizer_hash(ws, tmp_path):
    shutil.copy2(ws / "store" / "lengths.jsonl", tmp_path / "lengths.jsonl")
    shutil.copy2(ws / "store" / "lengths.jsonl.u32", tmp_path / "lengths.jsonl.u32")
    _forge_sidecar(tmp_path / "lengths.jsonl", tokenizer_hash="f" * 64)
    outcome = run_api(tmp_path, "from umlos_cuda.batching import LengthCache\n"
                                "guarded(lambda: LengthCache.load('lengths.jsonl', sidecar='require'))\n")
    hs.assert_refused(outcome, "LENGTHS_SIDECAR_MISMATCH", names="lengths.jsonl.u32")


def tamper_sidecar_forged_line_numbers(ws, tmp_path):
    shutil.copy2(ws / "store" / "lengths.jsonl", tmp_path / "lengths.jsonl")
    shutil.copy2(ws / "store" / "lengths.jsonl.u32", tmp_path / "lengths.jsonl.u32")
    _forge_sidecar(tmp_path / "lengths.jsonl", sample_ids="line_numbers")
    outcome = run_api(tmp_path, "from umlos_cuda.batching import LengthCache\n"
                                "guarded(lambda: LengthCache.load('lengths.jsonl', sidecar='require'))\n")
    hs.assert_refused(outcome, "LENGTHS_SIDECAR_MISMATCH", names="lengths.jsonl.u32")


# ---------------------------------------------------------------------- tamper/: Megatron files
def _megatron_generate(ws, tmp_path, dtype: str) -> hs.Outcome:
    for suffix in (".idx", ".bin", ".plan"):
        copy(ws, tmp_path, f"mega_{dtype}{suffix}")
    return run_cli(tmp_path, "batch", "generate", "--plan", f"mega_{dtype}.plan", "--store", f"mega_{dtype}",
                   "--output", "out", "--quiet", owned=["out"])


def tamper_megatron_negative_int8(ws, tmp_path):
    hs.assert_refused(_megatron_generate(ws, tmp_path, "int8"), ("COLLATE_INPUT_INVALID", "MEGATRON_INDEX_INVALID"),
                      names="mega_int8")


def tamper_megatron_negative_int16(ws, tmp_path):
    hs.assert_refused(_megatron_generate(ws, tmp_path, "int16"), ("COLLATE_INPUT_INVALID", "MEGATRON_INDEX_INVALID"),
                      names="mega_int16")


def tamper_megatron_negative_int32(ws, tmp_path):
    hs.assert_refused(_megatron_generate(ws, tmp_path, "int32"), ("COLLATE_INPUT_INVALID", "MEGATRON_INDEX_INVALID"),
                      names="mega_int32")


# ---------------------------------------------------------------------- tamper/: puzzle-server answers
GAME = {"1 ?": b"Invalid difficulty. Choose from: easy, hard\r\nSeed: 9\r\n", "menu": b"\r\n",
        "1 easy 5": b"SUDOKU - EASY MODE\r\nSeed: 5\r\nrules\r\n", "mode json": b'{"type":"mode"}\r\n'}
OBSERVATION = {"type": "observation", "game": "Sudoku", "difficulty": "easy", "seed": 5, "moves": 0,
               "is_complete": False, "grid_display": "1 2\n3 4", "hints_remaining": 3}


def _server_case(tmp_path, replies: dict, code: str) -> hs.Outcome:
    from streams_support import TcpServer, scripted

    with TcpServer(scripted({**GAME, **replies})) as server:
        return run_api(tmp_path, "from umlos_cuda.streams import TelnetGymClient\n"
                                 "def play():\n"
                                 f"    with TelnetGymClient(host='127.0.0.1', port={server.port}, timeout=10) as c:\n"
                                 "        o = c.start('sudoku', 'easy', 5)\n"
                                 "        r = c.step('place 1 1 1')\n"
                                 "        print('complete', o.is_complete, 'accepted', r.accepted,\n"
                                 "              'solved', r.solved)\n"
                                 "guarded(play)\n")


def _observation(**fields) -> bytes:
    return json.dumps({**OBSERVATION, **fields}).encode() + b"\r\n"


def tamper_gym_is_complete_string(ws, tmp_path):
    outcome = _server_case(tmp_path, {"show": _observation(is_complete="false")}, "GYM_PROTOCOL_ERROR")
    hs.assert_refused(outcome, "GYM_PROTOCOL_ERROR")
    assert "is_complete" in outcome.stderr


def tamper_gym_moves_string(ws, tmp_path):
    hs.assert_refused(_server_case(tmp_path, {"show": _observation(moves="0")}, "GYM_PROTOCOL_ERROR"),
                      "GYM_PROTOCOL_ERROR")


def tamper_gym_grid_display_number(ws, tmp_path):
    hs.assert_refused(_server_case(tmp_path, {"show": _observation(grid_display=12)}, "GYM_PROTOCOL_ERROR"),
                      "GYM_PROTOCOL_ERROR")


def tamper_gym_result_success_string(ws, tmp_path):
    result = json.dumps({"type": "result", "success": "false", "code": "X", "message": "no"}).encode() + b"\r\n"
    hs.assert_refused(_server_case(tmp_path, {"show": _observation(), "place 1 1 1": result}, "GYM_PROTOCOL_ERROR"),
                      "GYM_PROTOCOL_ERROR")


def tamper_gym_result_state_string(ws, tmp_path):
    result = json.dumps({"type": "result", "success": True, "code": "OK", "message": "ok",
                         "state": {"is_complete": "false"}}).encode() + b"\r\n"
    hs.assert_refused(_server_case(tmp_path, {"show": _observation(), "place 1 1 1": result}, "GYM_PROTOCOL_ERROR"),
                      "GYM_PROTOCOL_ERROR")


# ---------------------------------------------------------------------- user/
def user_gym_runs_on_two_ports_agree(ws, tmp_path):
    from streams_support import puzzle_server

    shutil.copytree(ws / "model", tmp_path / "model")
    logs, ports = [], []
    for run in ("a", "b"):
        with puzzle_server(tmp_path) as (host, port):
            ports.append(port)
            outcome = run_cli(tmp_path, "gym", "run", "--host", host, "--port", port, "--game", "sudoku,lights",
                              "--difficulty", "easy,medium", "--episodes", "4", "--tokenizer", "model",
                              "--eos-token", "</s>", "--buffer-size", "4", "--window-mbs", "2", "--window-every", "2",
                              "--output", run, "--quiet", owned=[run] + [p.name for p in tmp_path.glob("server-*")])
            hs.assert_ok(outcome)
        lines = (tmp_path / run / "windows.jsonl").read_text().splitlines()[1:]
        logs.append([json.loads(line) for line in lines])
    for name in ("snapshot_fingerprint", "plan_fingerprint", "window_fingerprint"):
        assert [w[name] for w in logs[0]] == [w[name] for w in logs[1]], name
    ids = [e["sample"]["meta"]["sample_id"] for w in logs[0] for e in w["added"]]
    sources = {e["sample"]["source"] for w in logs[0] for e in w["added"]}
    assert len(ids) == 4 and not any(str(p) in i for i in ids for p in ports), ids
    assert not any(str(p) in s for s in sources for p in ports), sources


def user_docs_python_plan_is_the_cli_plan(ws, tmp_path):
    """docs/batching.md: "The same in Python" builds the plan its `plan build` command builds."""
    text = read_doc("batching.md")
    command = re.search(r"```sh\n(umlos-cuda plan build --source lengths\.jsonl.*?)```", text, re.S).group(1)
    snippet = re.search(r"The same in Python[^\n]*\n(?:[^\n]+\n)*\n```python\n(.*?)```", text, re.S).group(1)
    from umlos_cuda.batching import LengthCache

    lengths = np.clip(np.random.default_rng(1).lognormal(5, 1, 400), 1, 1024).astype(np.uint32)
    LengthCache.from_arrays(None, lengths, "t" * 64).write(tmp_path / "lengths.jsonl")
    args = command.replace("\\\n", " ").split()[1:]
    cli_run = run_cli(tmp_path, *args, "--quiet", owned=["plan"])
    hs.assert_ok(cli_run)
    python_run = run_api(tmp_path, snippet + "\nprint('python', plan.fingerprint)\n", owned=["plan"])
    hs.assert_ok(python_run)
    cli_fingerprint = re.search(r"fingerprint ([0-9a-f]{64})", cli_run.stdout).group(1)
    assert f"python {cli_fingerprint}" in python_run.stdout, (cli_run.stdout, python_run.stdout)


def user_docs_collate_comment_agrees(ws, tmp_path):
    """The comment beside the labels assert of docs/batching.md says what the assert checks."""
    text = read_doc("batching.md")
    line = next(line for line in text.splitlines() if line.startswith("assert batch.labels.tolist() == [[6, 7,"))
    comment = line.split("#", 1)[1]
    assert "ignored" not in comment or "5 -> 6" not in comment, line
    outcome = run_api(tmp_path, "from umlos_cuda.batching import default_collate\n"
                                "b = default_collate([([5, 6, 7], [0, 1, 1]), ([8, 9], [1, 1])], 4, 'pad_to_bucket')\n"
                                "print(b.labels.tolist()[0][0])\n")
    hs.assert_ok(outcome)
    assert outcome.stdout.strip() == "6" and "6" in comment  # position 0 predicts 6, the first trained token


def user_plan_build_from_a_dataset(ws, tmp_path):
    copy(ws, tmp_path, "train.jsonl")
    outcome = run_cli(tmp_path, "plan", "build", "--lengths", "train.jsonl", "--bucket-edges", "4,8",
                      "--overflow-max", "16", "--token-budget", "64", "--output", "plan", "--quiet")
    hs.assert_refused(outcome, "LENGTHS_INVALID", names="train.jsonl")
    assert "data lengths build" in outcome.stderr and '"sample_id"' in outcome.stderr, outcome.describe()


def user_plan_build_split_and_overlong_refused(ws, tmp_path):
    """A fraction outside (0, 1) and a max_length above overflow_max are refused before the cache is read."""
    copy(ws, tmp_path, "store")
    common = ("plan", "build", "--lengths", "store/lengths.jsonl", "--bucket-edges", "4,8", "--overflow-max", "16",
              "--token-budget", "64", "--output", "plan", "--quiet")
    for extra, mention in ((("--split", "train", "--validation-fraction", "1.5"), "(0, 1)"),
                           (("--split", "validation", "--validation-fraction", "nan"), "(0, 1)"),
                           (("--max-length", "17", "--overlong", "split"), "above overflow_max 16")):
        outcome = run_cli(tmp_path, *common, *extra, owned=["plan"])
        hs.assert_refused(outcome, "BATCHING_CONFIG_INVALID")
        assert mention in outcome.stderr, outcome.describe()
    outcome = run_cli(tmp_path, *common, "--max-length", "0", owned=["plan"])
    assert outcome.returncode == 2 and "max length must be a positive integer" in outcome.stderr, outcome.describe()
    assert not (tmp_path / "plan").exists()


def _lengths_build(tmp_path, dataset: bytes, *extra) -> hs.Outcome:
    (tmp_path / "ds.jsonl").write_bytes(dataset)
    return run_cli(tmp_path, "data", "lengths", "build", "--dataset", "ds.jsonl", "--tokenizer", "model",
                   "--output", "l.jsonl", "--quiet", *extra, owned=["l.jsonl", "l.jsonl.u32"])


def user_jsonl_trailing_blank_line(ws, tmp_path):
    copy(ws, tmp_path, "model")
    outcome = _lengths_build(tmp_path, b'{"text": "a b"}\n{"text": "c"}\n\n')
    hs.assert_ok(outcome)
    assert "2 samples" in outcome.stdout


def user_jsonl_byte_order_mark(ws, tmp_path):
    copy(ws, tmp_path, "model")
    outcome = _lengths_build(tmp_path, b'\xef\xbb\xbf{"text": "a b", "id": "x"}\n{"text": "c", "id": "y"}\n')
    hs.assert_ok(outcome)
    assert (tmp_path / "l.jsonl").read_text().splitlines()[0].startswith('{"sample_id": "x"')


def user_jsonl_skip_bad_lines(ws, tmp_path):
    copy(ws, tmp_path, "model")
    data = b'{"text": "a"}\nnot json\n{"text": 5}\n{"text": "b c"}\n'
    refused = _lengths_build(tmp_path, data)
    hs.assert_refused(refused, "DATASET_RECORD_INVALID", names="ds.jsonl")
    assert "--skip-bad-lines" in refused.stderr, refused.describe()
    skipped = _lengths_build(tmp_path, data, "--skip-bad-lines")
    hs.assert_ok(skipped)
    assert "skipped 2 bad lines" in skipped.stdout + skipped.stderr, skipped.describe()
    assert "2 samples" in skipped.stdout


def user_jsonl_blank_line_inside_still_refused(ws, tmp_path):
    copy(ws, tmp_path, "model")
    hs.assert_refused(_lengths_build(tmp_path, b'{"text": "a"}\n\n{"text": "b"}\n'), "DATASET_RECORD_INVALID",
                      names="ds.jsonl")


TORCH_LOADER = (
    "import warnings\n"
    "import numpy as np, torch\n"
    "from torch.utils.data import DataLoader, TensorDataset\n"
    "from umlos_cuda.batching import load_plan\n"
    "from umlos_cuda.torch import PlanBatchSampler\n"
    "plan = load_plan('plan')\n"
    "data = TensorDataset(torch.arange(plan.meta.num_samples))\n"
)


def user_workers_state_dict_is_exact(ws, tmp_path):
    """With workers prefetching, a plain state_dict() counts what the loop received (one microbatch here),
    not what the workers were handed, and says nothing; an explicit count still agrees."""
    copy(ws, tmp_path, "plan")
    outcome = run_api(tmp_path, TORCH_LOADER +
                      "sampler = PlanBatchSampler(plan)\n"
                      "loader = DataLoader(data, batch_sampler=sampler, num_workers=2)\n"
                      "it = iter(loader); next(it)\n"
                      "with warnings.catch_warnings(record=True) as seen:\n"
                      "    warnings.simplefilter('always')\n"
                      "    state = sampler.state_dict()\n"
                      "    exact = sampler.state_dict(batches_consumed=1)\n"
                      "print('warnings', len(seen), 'index', state['microbatch_index'], exact['microbatch_index'])\n"
                      "del it\n")
    hs.assert_ok(outcome)
    assert "warnings 0 index 1 1" in outcome.stdout, outcome.describe()


#: Reads every row of the plan's pass through a planned cache over the store as a ``file://`` object store, its
#: disk tier in ``cache/``, each row checked against the store on disk; prints what the disk tier did.
BLOCK_CACHE_READ = (
    "import os\n"
    "import numpy as np\n"
    "from umlos_cuda.batching import load_plan\n"
    "from umlos_cuda.batching.tokens.store import TokenStore\n"
    "from umlos_cuda.remote import PlannedTokenSource\n"
    "from umlos_cuda.torch import PlanBatchSampler\n"
    "def read():\n"
    "    store, plan = TokenStore.open('store'), load_plan('plan')\n"
    "    source = PlannedTokenSource('file://' + os.path.abspath('store'), PlanBatchSampler(plan),\n"
    "                                cache_bytes=2048, block_bytes=1024, cache_dir='cache', disk_bytes=1 << 20)\n"
    "    for keys in PlanBatchSampler(plan):\n"
    "        for key in keys:\n"
    "            ids, mask = source.arrays(int(key))\n"
    "            assert np.array_equal(ids, store.input_ids(int(key))), key\n"
    "            assert np.array_equal(mask, store.loss_mask(int(key))), key\n"
    "    source.close()\n"
    "    print('fetched', source.blocks.fetched_blocks, 'dropped', source.blocks.dropped_files)\n"
    "guarded(read)\n"
)


#: The same read a microbatch at a time (``arrays_many``: what ``TokenDataset.__getitems__`` asks for).
BLOCK_CACHE_READ_MANY = BLOCK_CACHE_READ.replace(
    "        for key in keys:\n"
    "            ids, mask = source.arrays(int(key))\n",
    "        for key, (ids, mask) in zip(keys, source.arrays_many([int(key) for key in keys])):\n")
assert BLOCK_CACHE_READ_MANY != BLOCK_CACHE_READ


#: The same read of a sharded store at ``store/`` (two shards), its plan built from its lengths.
BLOCK_CACHE_READ_SHARDED = BLOCK_CACHE_READ.replace(
    "from umlos_cuda.batching.tokens.store import TokenStore\n",
    "from umlos_cuda.batching import BatchingConfig\n"
    "from umlos_cuda.batching.plans.windows import ArrayLengths, WindowDefinition, WindowedPlan\n"
    "from umlos_cuda.batching.tokens.logical import ShardedTokenStore\n").replace(
    "    store, plan = TokenStore.open('store'), load_plan('plan')\n",
    "    store = ShardedTokenStore.open('store')\n"
    "    config = BatchingConfig.predictable(64, (4, 8), 16, seed=7)\n"
    "    plan = WindowedPlan.build(WindowDefinition(config, len(store), 64), ArrayLengths(store.lengths), 1)\n")
assert "ShardedTokenStore.open('store')" in BLOCK_CACHE_READ_SHARDED


def _block_cache_tampered(ws, tmp_path, tamper, read: str = BLOCK_CACHE_READ) -> None:
    """A block cache filled by one reader, one of its block files changed by ``tamper(path)``, then read again
    (by ``read``): every row as on disk, the bad file dropped and fetched again (never served), nothing outside
    ``cache/`` touched (a planted link's target included), and every block file left verifying."""
    from umlos_cuda.remote.blockfiles import HEADER_BYTES, decode

    fill = BLOCK_CACHE_READ
    if read == BLOCK_CACHE_READ_SHARDED:
        _two_shards(ws, tmp_path / "store")
        fill = read
    else:
        copy(ws, tmp_path, "plan", "store")
    hs.assert_ok(run_api(tmp_path, fill, owned=("cache",)))
    blocks = sorted((tmp_path / "cache").glob("*.block"))
    assert len(blocks) > 2
    tamper(blocks[1])
    outcome = run_api(tmp_path, read, owned=("cache",))
    hs.assert_ok(outcome)
    assert "fetched 1 dropped 1" in outcome.stdout, outcome.describe()
    for path in sorted((tmp_path / "cache").iterdir()):
        if path.name.endswith(".block"):
            data = path.read_bytes()
            assert not path.is_symlink() and decode(path.name, data, len(data) - HEADER_BYTES) is not None


def tamper_block_cache_planted_symlink(ws, tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_bytes(b"not a block")

    def plant(path):
        path.unlink()
        path.symlink_to(outside)

    _block_cache_tampered(ws, tmp_path, plant)
    assert outside.read_bytes() == b"not a block"


def tamper_block_cache_truncated_block(ws, tmp_path):
    _block_cache_tampered(ws, tmp_path, lambda path: path.write_bytes(path.read_bytes()[:-100]))


def tamper_block_cache_wrong_size(ws, tmp_path):
    _block_cache_tampered(ws, tmp_path, lambda path: path.write_bytes(path.read_bytes() + b"\0" * 64))


def tamper_block_cache_bytes_changed(ws, tmp_path):
    def flip(path):
        data = bytearray(path.read_bytes())
        data[-1] ^= 1  # same size, other bytes: the digest no longer matches
        path.write_bytes(bytes(data))

    _block_cache_tampered(ws, tmp_path, flip)


def tamper_block_cache_bytes_changed_read_by_microbatch(ws, tmp_path):
    def flip(path):
        data = bytearray(path.read_bytes())
        data[-1] ^= 1
        path.write_bytes(bytes(data))

    _block_cache_tampered(ws, tmp_path, flip, BLOCK_CACHE_READ_MANY)


def _two_shards(ws, folder) -> None:
    """A sharded store of two shards of 200 records each at ``folder`` (the workspace's tokenizer)."""
    from umlos_cuda.batching.tokens.sharded import tokenize_sharded

    _dataset(folder.parent / "all.jsonl", 400)
    lines = (folder.parent / "all.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    parts = [folder.parent / f"part-{i}.jsonl" for i in range(2)]
    for i, part in enumerate(parts):
        part.write_text("".join(lines[200 * i:200 * (i + 1)]), encoding="utf-8")
    tokenize_sharded([str(part) for part in parts], ws / "model", folder)


def tamper_block_cache_block_under_the_other_shards_name(ws, tmp_path):
    """Shard 1's first tokens block replaced by shard 0's file (a whole, verified file of the same length, under
    another block's name): its digest binds its name, so it is dropped and fetched again, never served."""
    from umlos_cuda.remote import RemoteShardedStore
    from umlos_cuda.remote.blockfiles import block_name

    def swap(path):
        table = RemoteShardedStore.open(f"file://{tmp_path / 'store'}").object_table()
        first, other = (path.parent / block_name(table[number], 1024, 0) for number in (0, 2))
        assert first.stat().st_size == other.stat().st_size  # only the digest tells them apart
        other.write_bytes(first.read_bytes())

    _block_cache_tampered(ws, tmp_path, swap, BLOCK_CACHE_READ_SHARDED)


def tamper_block_cache_folder_is_a_link(ws, tmp_path):
    copy(ws, tmp_path, "plan", "store")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "cache").symlink_to(tmp_path / "elsewhere")
    hs.assert_refused(run_api(tmp_path, BLOCK_CACHE_READ), "OUTPUT_PATH_INVALID", names="cache")
    assert os.listdir(tmp_path / "elsewhere") == []


def tamper_rows_mode_store_rewritten_after_opening(ws, tmp_path):
    """Rows mode (block_bytes=0): tokens.npy rewritten in place (same size, other bytes) after the reader opened
    the store and before it reads: the first range is refused, naming the object, and nothing of it is served."""
    copy(ws, tmp_path, "plan", "store")
    outcome = run_api(tmp_path,
                      "import os\n"
                      "from umlos_cuda.batching import load_plan\n"
                      "from umlos_cuda.remote import PlannedTokenSource\n"
                      "from umlos_cuda.torch import PlanBatchSampler\n"
                      "plan = load_plan('plan')\n"
                      "source = PlannedTokenSource('file://' + os.path.abspath('store'), PlanBatchSampler(plan),\n"
                      "                            cache_bytes=1 << 20, block_bytes=0)\n"
                      "data = bytearray(open('store/tokens.npy', 'rb').read())\n"
                      "data[-64:] = bytes(255 - b for b in data[-64:])\n"
                      "open('store/tokens.npy', 'wb').write(bytes(data))\n"
                      "os.utime('store/tokens.npy', ns=(1, 1))\n"
                      "keys = next(iter(PlanBatchSampler(plan)))\n"
                      "guarded(lambda: print(source.arrays_many([int(key) for key in keys])))\n",
                      owned=("store",))
    hs.assert_refused(outcome, "REMOTE_OBJECT_CHANGED", names="tokens.npy")


def _trainer_cursor(ws, tmp_path, make_cursor) -> hs.Outcome:
    """PlanTrainerData.load over a checkpoint folder whose plan_cursor.json ``make_cursor(path)`` made."""
    copy(ws, tmp_path, "plan", "store")
    (tmp_path / "checkpoint-1").mkdir()
    make_cursor(tmp_path / "checkpoint-1" / "plan_cursor.json")
    return run_api(tmp_path, "from umlos_cuda.torch.trainer import PlanTrainerData\n"
                   "data = PlanTrainerData('plan', 'store', rank=0, world_size=1)\n"
                   "guarded(lambda: data.load('checkpoint-1'))\n")


def hang_trainer_cursor_fifo(ws, tmp_path):
    outcome = _trainer_cursor(ws, tmp_path, os.mkfifo)
    hs.assert_refused(outcome, "PLAN_CURSOR_INVALID", names="plan_cursor.json")


def traceback_trainer_cursor_deep_json(ws, tmp_path):
    outcome = _trainer_cursor(ws, tmp_path, lambda path: path.write_text("[" * 100_000 + "]" * 100_000))
    hs.assert_refused(outcome, "PLAN_CURSOR_INVALID", names="plan_cursor.json")


def traceback_trainer_cursor_not_an_object(ws, tmp_path):
    outcome = _trainer_cursor(ws, tmp_path, lambda path: path.write_text('["epoch", 0]\n'))
    hs.assert_refused(outcome, "PLAN_CURSOR_INVALID", names="plan_cursor.json")


def traceback_trainer_cursor_huge(ws, tmp_path):
    outcome = _trainer_cursor(ws, tmp_path, lambda path: path.write_bytes(b" " * (64 << 20) + b"{}"))
    hs.assert_refused(outcome, "PLAN_CURSOR_INVALID", names="plan_cursor.json")


def user_no_workers_state_dict_is_quiet(ws, tmp_path):
    copy(ws, tmp_path, "plan")
    outcome = run_api(tmp_path, TORCH_LOADER +
                      "sampler = PlanBatchSampler(plan)\n"
                      "it = iter(DataLoader(data, batch_sampler=sampler)); next(it)\n"
                      "with warnings.catch_warnings(record=True) as seen:\n"
                      "    warnings.simplefilter('always')\n"
                      "    state = sampler.state_dict()\n"
                      "print('warnings', len(seen), 'index', state['microbatch_index'])\n")
    hs.assert_ok(outcome)
    assert "warnings 0 index 1" in outcome.stdout, outcome.describe()


def user_past_the_last_epoch_warns(ws, tmp_path):
    copy(ws, tmp_path, "plan")
    outcome = run_api(tmp_path, TORCH_LOADER +
                      "sampler = PlanBatchSampler(plan)\n"
                      "loader = DataLoader(data, batch_sampler=sampler)\n"
                      "counts = []\n"
                      "with warnings.catch_warnings(record=True) as seen:\n"
                      "    warnings.simplefilter('always')\n"
                      "    for epoch in range(3):\n"
                      "        counts.append(sum(1 for _ in loader))\n"
                      "print('counts', counts, 'warnings', len(seen))\n"
                      "print(seen[0].message if seen else '')\n")
    hs.assert_ok(outcome)
    assert "counts [20, 20, 0] warnings 1" in outcome.stdout, outcome.describe()  # warned once, at the third pass
    assert "last epoch (1) is done" in outcome.stdout, outcome.describe()


def user_torchdata_set_vital_is_quiet(ws, tmp_path):
    """Neither torchdata's set_vital deprecation nor the prefetch warning (torchdata snapshots exactly)."""
    copy(ws, tmp_path, "plan")
    outcome = run_api(tmp_path, TORCH_LOADER +
                      "import torchdata.stateful_dataloader as tdl\n"
                      "loader = tdl.StatefulDataLoader(data, batch_sampler=PlanBatchSampler(plan), num_workers=2)\n"
                      "it = iter(loader); next(it); state = loader.state_dict(); del it\n"
                      "print(sum(1 for _ in loader))\n")
    hs.assert_ok(outcome)
    assert "set_vital" not in outcome.stderr and "Warning" not in outcome.stderr, outcome.describe()


def user_progress_has_rate_and_time_left(ws, tmp_path):
    outcome = run_api(tmp_path, "import io\n"
                                "from umlos_cuda.commands._progress import Progress\n"
                                "clock = iter([0.0, 0.5, 1.5, 2.0, 30.0, 31.0, 60.0]).__next__\n"
                                "out = io.StringIO()\n"
                                "p = Progress(1000, 'work', stream=out, clock=clock)\n"
                                "for done in (10, 100, 150, 600, 700, 1000):\n"
                                "    p.update(done)\n"
                                "p.close()\n"
                                "print(out.getvalue())\n")
    hs.assert_ok(outcome)
    lines = outcome.stdout.strip().splitlines()
    assert lines[0].startswith("work: 10%") and "/s" in lines[0] and "left" in lines[0], lines
    assert lines[-1].startswith("work: 100%"), lines


def user_curriculum_plot_ticks(ws, tmp_path):
    """`gym replay --plot`'s figure: whole windows on the x axis, and equal shares both visible."""
    outcome = run_api(tmp_path, "import matplotlib\nmatplotlib.use('Agg')\n"
                                "from matplotlib.figure import Figure\n"
                                "from umlos_cuda.batching import BatchingConfig\n"
                                "from umlos_cuda.streams import (MockGymStream, ReplayBuffer, RollingBatchPlanWindow,\n"
                                "                                plot_curriculum)\n"
                                "batching = BatchingConfig.throughput(8192, (512, 1024), 2048)\n"
                                "window = RollingBatchPlanWindow(ReplayBuffer(8, 'fifo', seed=1), 2,\n"
                                "                                log='windows.jsonl', batching=batching)\n"
                                "for i, s in enumerate(MockGymStream(6, seed=3, max_length=200,\n"
                                "                                    difficulties=('easy', 'medium'))):\n"
                                "    window.add(s)\n"
                                "    if i % 2 == 1:\n"
                                "        window.next_window()\n"
                                "save = Figure.savefig\n"
                                "def spy(figure, *args, **kwargs):\n"
                                "    axis = figure.axes[0]\n"
                                "    figure.canvas.draw()\n"
                                "    low, high = axis.get_xlim()\n"
                                "    print('ticks', [t.get_text() for t in axis.get_xticklabels() "
                                "if low <= t.get_position()[0] <= high])\n"
                                "    print('series', len(axis.containers) + len(axis.lines))\n"
                                "    return save(figure, *args, **kwargs)\n"
                                "Figure.savefig = spy\n"
                                "plot_curriculum('windows.jsonl', 'plot.png')\n", owned=["windows.jsonl", "plot.png"])
    hs.assert_ok(outcome)
    ticks = json.loads(re.search(r"ticks (\[.*\])", outcome.stdout).group(1).replace("'", '"'))
    assert [t for t in ticks if t] == ["0", "1", "2"], ticks  # whole windows only
    assert "series 2" in outcome.stdout  # one series per difficulty


CASES = [
    pytest.param(tamper_plan_shard_after_swap, id="tamper/plan-shard-after-swapped-samples"),
    pytest.param(tamper_plan_shard_no_verify, id="tamper/plan-shard-no-verify-opts-out"),
    pytest.param(tamper_plan_generate_after_swap, id="tamper/batch-generate-after-swapped-samples"),
    pytest.param(tamper_plan_check_after_swap, id="tamper/batch-check-after-swapped-samples"),
    pytest.param(tamper_plan_meta_field, id="tamper/plan-meta-field-edited"),
    pytest.param(tamper_plan_lengths, id="tamper/plan-lengths-edited"),
    pytest.param(tamper_plan_sample_ids, id="tamper/plan-sample-ids-swapped"),
    pytest.param(tamper_plan_offsets_not_monotone_info, id="tamper/plan-offsets-not-monotone-info"),
    pytest.param(tamper_plan_offsets_not_monotone_explain, id="tamper/plan-offsets-not-monotone-explain"),
    pytest.param(tamper_plan_offsets_not_monotone_sampler, id="tamper/plan-offsets-not-monotone-sampler"),
    pytest.param(tamper_plan_row_out_of_range, id="tamper/plan-row-out-of-range"),
    pytest.param(tamper_plan_stats_make_len_lie, id="tamper/plan-stats-make-len-lie"),
    pytest.param(tamper_plan_piece_out_of_range, id="tamper/plan-piece-out-of-range"),
    pytest.param(tamper_plan_pieces_cut_short, id="tamper/plan-pieces-cut-short"),
    pytest.param(tamper_plan_split_fraction_edited, id="tamper/plan-split-fraction-edited"),
    pytest.param(tamper_shard_global_count, id="tamper/shard-global-microbatches-inflated"),
    pytest.param(tamper_plan_bucket_id_out_of_range, id="tamper/plan-bucket-id-out-of-range"),
    pytest.param(tamper_store_token_flipped, id="tamper/store-token-changed"),
    pytest.param(tamper_store_out_of_vocabulary_generate, id="tamper/store-out-of-vocabulary-generate"),
    pytest.param(tamper_store_out_of_vocabulary_check, id="tamper/store-out-of-vocabulary-check"),
    pytest.param(tamper_store_loss_mask_two, id="tamper/store-loss-mask-two"),
    pytest.param(tamper_mixed_component_store_retokenized, id="tamper/batch-check-mixed-component-store-retokenized"),
    pytest.param(tamper_mixed_component_store_token_flipped,
                 id="tamper/batch-check-mixed-component-store-token-changed"),
    pytest.param(tamper_store_verify_api, id="tamper/store-verify-out-of-vocabulary"),
    pytest.param(tamper_store_tokenizer_parts_not_hex, id="tamper/store-tokenizer-parts-not-hex"),
    pytest.param(tamper_plan_tokenizer_parts_a_list, id="tamper/plan-tokenizer-parts-a-list"),
    pytest.param(tamper_sharded_index_tokenizer_parts_not_hex, id="tamper/sharded-index-tokenizer-parts-not-hex"),
    pytest.param(tamper_sidecar_forged_lengths_require, id="tamper/sidecar-forged-lengths-require"),
    pytest.param(tamper_sidecar_forged_lengths_plan_build, id="tamper/sidecar-forged-lengths-plan-build"),
    pytest.param(tamper_sidecar_forged_tokenizer_hash, id="tamper/sidecar-forged-tokenizer-hash"),
    pytest.param(tamper_sidecar_forged_line_numbers, id="tamper/sidecar-forged-line-numbers"),
    pytest.param(tamper_megatron_negative_int8, id="tamper/megatron-negative-int8"),
    pytest.param(tamper_megatron_negative_int16, id="tamper/megatron-negative-int16"),
    pytest.param(tamper_megatron_negative_int32, id="tamper/megatron-negative-int32"),
    pytest.param(tamper_gym_is_complete_string, id="tamper/gym-is-complete-string"),
    pytest.param(tamper_gym_moves_string, id="tamper/gym-moves-string"),
    pytest.param(tamper_gym_grid_display_number, id="tamper/gym-grid-display-number"),
    pytest.param(tamper_gym_result_success_string, id="tamper/gym-result-success-string"),
    pytest.param(tamper_gym_result_state_string, id="tamper/gym-result-state-is-complete-string"),
    pytest.param(user_gym_runs_on_two_ports_agree, id="user/gym-runs-on-two-ports-agree"),
    pytest.param(user_docs_python_plan_is_the_cli_plan, id="user/docs-python-plan-is-the-cli-plan"),
    pytest.param(user_docs_collate_comment_agrees, id="user/docs-collate-comment-agrees"),
    pytest.param(user_plan_build_from_a_dataset, id="user/plan-build-from-a-dataset"),
    pytest.param(user_plan_build_split_and_overlong_refused, id="user/plan-build-split-and-overlong-refused"),
    pytest.param(user_jsonl_trailing_blank_line, id="user/jsonl-trailing-blank-line"),
    pytest.param(user_jsonl_byte_order_mark, id="user/jsonl-byte-order-mark"),
    pytest.param(user_jsonl_skip_bad_lines, id="user/jsonl-skip-bad-lines"),
    pytest.param(user_jsonl_blank_line_inside_still_refused, id="user/jsonl-blank-line-inside-refused"),
    pytest.param(user_workers_state_dict_is_exact, id="user/workers-state-dict-exact"),
    pytest.param(hang_trainer_cursor_fifo, id="hang/trainer-plan-cursor-fifo"),
    pytest.param(traceback_trainer_cursor_deep_json, id="traceback/trainer-plan-cursor-deep-json"),
    pytest.param(traceback_trainer_cursor_not_an_object, id="traceback/trainer-plan-cursor-not-an-object"),
    pytest.param(traceback_trainer_cursor_huge, id="traceback/trainer-plan-cursor-huge"),
    pytest.param(user_no_workers_state_dict_is_quiet, id="user/no-workers-state-dict-quiet"),
    pytest.param(user_past_the_last_epoch_warns, id="user/past-the-last-epoch-warns"),
    pytest.param(user_torchdata_set_vital_is_quiet, id="user/torchdata-set-vital-quiet"),
    pytest.param(user_progress_has_rate_and_time_left, id="user/progress-rate-and-time-left"),
    pytest.param(user_curriculum_plot_ticks, id="user/curriculum-plot-integer-ticks"),
    pytest.param(tamper_sharded_store_shard_copied_over_another, id="tamper/plan-build-shard-copied-over-another"),
    pytest.param(tamper_edited_plan_parent_after_swap, id="tamper/edited-plan-parent-after-swap"),
    pytest.param(tamper_edited_plan_units_rewritten, id="tamper/edited-plan-units-rewritten-sampler"),
    pytest.param(tamper_block_cache_planted_symlink, id="tamper/block-cache-planted-symlink"),
    pytest.param(tamper_block_cache_truncated_block, id="tamper/block-cache-truncated-block"),
    pytest.param(tamper_block_cache_wrong_size, id="tamper/block-cache-wrong-size"),
    pytest.param(tamper_block_cache_bytes_changed, id="tamper/block-cache-bytes-changed"),
    pytest.param(tamper_block_cache_bytes_changed_read_by_microbatch, id="tamper/block-cache-bytes-changed-microbatch"),
    pytest.param(tamper_block_cache_folder_is_a_link, id="tamper/block-cache-folder-is-a-link"),
    pytest.param(tamper_block_cache_block_under_the_other_shards_name,
                 id="tamper/block-cache-block-under-the-other-shards-name"),
    pytest.param(tamper_rows_mode_store_rewritten_after_opening, id="tamper/rows-mode-store-rewritten-after-opening"),
]


@pytest.mark.parametrize("case", CASES)
def test_hostile(case, ws, tmp_path):
    if case.__name__.startswith("user_gym"):
        pytest.importorskip("chuk_puzzles_gym", reason="chuk-puzzles-gym is not installed (the optional 'gym' extra)")
    if "torch" in case.__name__ or "workers" in case.__name__ or "epoch" in case.__name__ \
            or "trainer" in case.__name__ or "sampler" in case.__name__ or "stats_make" in case.__name__ \
            or "global_count" in case.__name__:
        pytest.importorskip("torch")
    if "plot" in case.__name__:
        pytest.importorskip("matplotlib")
    if "block_cache" in case.__name__ or "rows_mode" in case.__name__:
        pytest.importorskip("torch")
        pytest.importorskip("obstore", reason="obstore is not installed (the 'remote' extra)")
    case(ws, tmp_path)
