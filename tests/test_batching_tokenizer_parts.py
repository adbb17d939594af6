"""A tokenizer mismatch names the parts that differ (issue 34).

Token stores (a sharded store's shards and index too) and the plans built from them record their tokenizer's
parts hashed alone (``tokenizer_parts``, the last key of meta.json); when a store's tokenizer is not the one a
plan or a sharded store names, the message says which parts differ and which are equal. Covered:
* a swapped vocabulary, a changed normalizer and a changed chat template, each named, for a store against a
  plan (saved and loaded again) and for a store appended to a sharded store of another tokenizer;
* an artifact written before parts were recorded (meta.json without the key) still gets the advice to compare
  ``tokenizer_parts`` of the two tokenizer folders;
* what the parts say, and that each store, index and plan writes them last.
(A parts value that is not a dict of hex digests: tests/test_hostile_tampered.py.)
"""

from __future__ import annotations

import copy
import json

import pytest

from batching_cases import expect, from_json, tokenizer_json, train_tokenizer, write_model_dir
from umlos_cuda import errors
from umlos_cuda.batching import BatchingConfig, BatchPlanBuilder
from umlos_cuda.batching.lengths.fingerprints import (DIFFERENT_TOKENIZER, PARTS_KEY, tokenizer_difference,
                                                      tokenizer_parts)
from umlos_cuda.batching.plans.integrity import check_rows_match_plan
from umlos_cuda.batching.plans.io import load_plan, save_plan
from umlos_cuda.batching.tokens.sharded import ShardedTokenStore, append_shards, tokenize_sharded
from umlos_cuda.batching.tokens.store import TokenStore
from umlos_cuda.batching.tokens.writer import tokenize_dataset

CONFIG = BatchingConfig.throughput(1024, (32, 64), 128)
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
#: Each variant of the base tokenizer folder and the one part it changes.
VARIANTS = {"vocabulary": "model", "normalizer": "normalizer", "template": "chat_template"}
WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "gravity", "explains", "why",
         "python", "is", "what", "it", "is")


def _swap_two_tokens(data: dict) -> None:
    vocab = data["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[-2:]
    vocab[a], vocab[b] = vocab[b], vocab[a]


def _write_rows(path, first: int, count: int) -> str:
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(first, first + count):
            text = " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(3 + i % 17))
            handle.write(json.dumps({"id": f"doc-{i:03d}", "text": text}) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A base tokenizer folder and its three variants; two files of rows; a store of the first file by each."""
    root = tmp_path_factory.mktemp("parts")
    base = train_tokenizer()
    folders = {"base": write_model_dir(root / "base", base)}
    swapped = copy.deepcopy(tokenizer_json(base))
    _swap_two_tokens(swapped)
    folders["vocabulary"] = write_model_dir(root / "vocabulary", from_json(swapped))
    folders["normalizer"] = write_model_dir(root / "normalizer", train_tokenizer(normalizer="nfc"))
    folders["template"] = write_model_dir(root / "template", base, {"chat_template": CHATML})
    files = [_write_rows(root / "a.jsonl", 0, 60), _write_rows(root / "b.jsonl", 60, 40)]
    stores = {name: tokenize_dataset(files[0], folder, root / f"store-{name}") for name, folder in folders.items()}
    return root, folders, files, stores


def _differ_in(part: str) -> str:
    """The start of the message naming ``part`` alone."""
    return f"tokenizers differ in: {part} ("


def test_each_variant_differs_in_its_part_alone(world):
    _, folders, _, stores = world
    base = tokenizer_parts(folders["base"])
    for name, part in VARIANTS.items():
        other = tokenizer_parts(folders[name])
        assert [p for p in base if base[p] != other[p]] == [part], name
        assert stores[name].tokenizer_parts == other and stores[name].tokenizer_hash != stores["base"].tokenizer_hash


def test_the_difference_names_the_parts_that_differ_and_those_equal():
    one = {"model": "a" * 64, "normalizer": "b" * 64, "chat_template": "c" * 64}
    other = {"model": "a" * 64, "normalizer": "d" * 64, "chat_template": "e" * 64}
    assert tokenizer_difference(one, other) == "tokenizers differ in: normalizer, chat_template (model equal)"
    assert tokenizer_difference(one, {**one, "added_tokens": "f" * 64}) == \
        "tokenizers differ in: added_tokens (model, normalizer, chat_template equal)"
    # an artifact without parts, or parts all equal (another fingerprint version): today's advice
    assert tokenizer_difference(None, other) == tokenizer_difference(one, None) == DIFFERENT_TOKENIZER
    assert tokenizer_difference(one, dict(one)) == DIFFERENT_TOKENIZER


def test_stores_and_plans_write_the_parts_last(world, tmp_path):
    root, folders, _, stores = world
    meta = json.loads((root / "store-base" / "meta.json").read_text(encoding="ascii"))
    assert list(meta)[-1] == PARTS_KEY and meta[PARTS_KEY] == tokenizer_parts(folders["base"])
    plan = BatchPlanBuilder(stores["base"].length_cache(), CONFIG).build(1)
    save_plan(plan, tmp_path / "plan")
    written = json.loads((tmp_path / "plan" / "meta.json").read_text(encoding="ascii"))
    assert list(written)[-1] == PARTS_KEY and written[PARTS_KEY] == meta[PARTS_KEY]
    assert load_plan(tmp_path / "plan").meta.tokenizer_parts == meta[PARTS_KEY]
    # the parts are outside the fingerprint: the same plan of lengths without them has the same one
    bare = BatchPlanBuilder(stores["base"].lengths, CONFIG, tokenizer_hash=stores["base"].tokenizer_hash,
                            sample_ids=stores["base"].sample_ids, dataset_hash=stores["base"].dataset_hash).build(1)
    assert bare.meta.tokenizer_parts is None and bare.meta.fingerprint == plan.meta.fingerprint


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_store_against_a_plan_names_the_part(world, tmp_path, name):
    _, _, _, stores = world
    save_plan(BatchPlanBuilder(stores["base"].length_cache(), CONFIG).build(1), tmp_path / "plan")
    plan = load_plan(tmp_path / "plan")
    error = expect(errors.BATCH_STORE_MISMATCH, check_rows_match_plan, stores[name], plan,
                   mention=_differ_in(VARIANTS[name]))
    assert "tokenizer_parts(A)" not in error.message and "Tokenize the data again" in error.message


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_store_appended_to_a_sharded_store_names_the_part(world, tmp_path, name):
    _, folders, files, _ = world
    sharded = tokenize_sharded(files, folders["base"], tmp_path / "sharded")
    assert sharded.tokenizer_parts == tokenizer_parts(folders["base"])
    index = json.loads((tmp_path / "sharded" / "meta.json").read_text(encoding="ascii"))
    assert list(index)[-1] == PARTS_KEY
    staged = tokenize_dataset(files[1], folders[name], tmp_path / "staged", sharded=True)
    error = expect(errors.SHARDED_STORE_MISMATCH, append_shards, sharded.root, [staged.root],
                   mention=_differ_in(VARIANTS[name]))
    assert "tokenizer_hash" in error.message
    assert len(ShardedTokenStore.open(tmp_path / "sharded")) == len(sharded)  # nothing appended


def _without_parts(folder) -> None:
    """``folder``'s meta.json as a store written before parts were recorded wrote it."""
    meta = json.loads((folder / "meta.json").read_text(encoding="ascii"))
    del meta[PARTS_KEY]
    (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="ascii")


def test_an_older_store_keeps_todays_advice(world, tmp_path):
    root, _, _, stores = world
    plan = BatchPlanBuilder(stores["base"].length_cache(), CONFIG).build(1)
    older = tmp_path / "older"
    older.mkdir()
    for path in (root / "store-normalizer").iterdir():
        (older / path.name).write_bytes(path.read_bytes())
    _without_parts(older)
    store = TokenStore.open(older)
    assert store.tokenizer_parts is None and store.verify()
    error = expect(errors.BATCH_STORE_MISMATCH, check_rows_match_plan, store, plan,
                   mention="tokenizer_parts(A) and tokenizer_parts(B)")
    assert "tokenizers differ in" not in error.message
    # and a plan of lengths that came without parts, against a store with them
    bare = BatchPlanBuilder(stores["base"].lengths, CONFIG, tokenizer_hash=stores["base"].tokenizer_hash,
                            sample_ids=stores["base"].sample_ids).build(1)
    expect(errors.BATCH_STORE_MISMATCH, check_rows_match_plan, stores["normalizer"], bare,
           mention="tokenizer_parts(A) and tokenizer_parts(B)")


def test_an_older_sharded_store_keeps_todays_advice(world, tmp_path):
    _, folders, files, _ = world
    tokenize_sharded(files[:1], folders["base"], tmp_path / "sharded")
    index = json.loads((tmp_path / "sharded" / "meta.json").read_text(encoding="ascii"))
    del index[PARTS_KEY]
    (tmp_path / "sharded" / "meta.json").write_text(json.dumps(index, indent=1) + "\n", encoding="ascii")
    assert ShardedTokenStore.open(tmp_path / "sharded").tokenizer_parts is None
    staged = tokenize_dataset(files[1], folders["normalizer"], tmp_path / "staged", sharded=True)
    error = expect(errors.SHARDED_STORE_MISMATCH, append_shards, tmp_path / "sharded", [staged.root],
                   mention="tokenizer_parts(A) and tokenizer_parts(B)")
    assert "tokenizers differ in" not in error.message
