"""Tokenizer and dataset fingerprints (docs/batching.md, "Fingerprints").

The tokenizer fingerprint changes when anything that changes token ids
changes (vocabulary, merges, normalizer, pre-tokenizer, post-processor, added
and special tokens, chat template) and stays when only the presentation does
(file formatting, key order, the older merge spelling, the decoder, the way
the tokenizer is passed). Tokenizers are trained here (tests/batching_cases.py).
"""

from __future__ import annotations

import copy
import hashlib
import json

import pytest

from batching_cases import expect, from_json, tokenizer_json, train_tokenizer, write_model_dir
from umlos_cuda import errors
from umlos_cuda.batching import dataset_fingerprint, load_tokenizer, tokenizer_fingerprint
from umlos_cuda.batching.lengths.fingerprints import canonical_tokenizer
from umlos_cuda.batching.records.fingerprint import DOMAIN as DATASET_DOMAIN


@pytest.fixture(scope="module")
def base():
    return train_tokenizer()


@pytest.fixture(scope="module")
def base_json(base):
    return tokenizer_json(base)


@pytest.fixture(scope="module")
def base_hash(base):
    return tokenizer_fingerprint(base)


def variant(base_json, change):
    data = copy.deepcopy(base_json)
    change(data)
    return from_json(data)


# --------------------------------------------------------------- stays the same
def test_is_a_sha256_hex_digest(base_hash):
    assert len(base_hash) == 64 and int(base_hash, 16) >= 0


def test_same_for_every_way_of_passing_the_tokenizer(base, base_hash, tmp_path):
    file = tmp_path / "tokenizer.json"
    base.save(str(file))
    bare_dir = write_model_dir(tmp_path / "bare", base)
    neutral_config = write_model_dir(tmp_path / "cfg", base,
                                     {"model_max_length": 2048, "clean_up_tokenization_spaces": False})
    for source in (base, str(file), file, bare_dir, neutral_config, load_tokenizer(file)):
        assert tokenizer_fingerprint(source) == base_hash, source


def test_same_for_a_retrained_tokenizer():
    assert tokenizer_fingerprint(train_tokenizer()) == tokenizer_fingerprint(train_tokenizer())


def test_same_whatever_the_file_layout(base_json, base_hash, tmp_path):
    """Key order, indentation and the older "a b" spelling of merges change no id."""
    data = copy.deepcopy(base_json)
    data["model"]["merges"] = [" ".join(pair) for pair in data["model"]["merges"]]
    data["added_tokens"] = list(reversed(data["added_tokens"]))
    reordered = {key: data[key] for key in reversed(list(data))}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(reordered, indent=7, sort_keys=True), encoding="utf-8")
    assert tokenizer_fingerprint(path) == base_hash


def test_same_when_only_the_decoder_changes(base_json, base_hash):
    assert tokenizer_fingerprint(variant(base_json, lambda d: d.update(decoder=None))) == base_hash


# --------------------------------------------------------------- changes
def _swap_two_tokens(data):
    vocab = data["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[-2:]
    vocab[a], vocab[b] = vocab[b], vocab[a]


def _drop_last_merge(data):
    data["model"]["merges"] = data["model"]["merges"][:-1]


def _swap_first_merges(data):
    merges = data["model"]["merges"]
    merges[0], merges[1] = merges[1], merges[0]


def _add_token(special):
    def change(data):
        next_id = len(data["model"]["vocab"])
        data["added_tokens"].append({"id": next_id, "content": "<|im_end|>", "single_word": False, "lstrip": False,
                                     "rstrip": False, "normalized": False, "special": special})
    return change


def _unspecial(data):
    data["added_tokens"][0]["special"] = False


CHANGES = {
    "vocabulary": _swap_two_tokens,
    "merges dropped": _drop_last_merge,
    "merge order": _swap_first_merges,
    "normalizer": lambda d: d.update(normalizer={"type": "NFC"}),
    "no normalizer": lambda d: d.update(normalizer=None),
    "pre-tokenizer": lambda d: d["pre_tokenizer"].update(add_prefix_space=True),
    "post-processor": lambda d: d.update(post_processor={"type": "ByteLevel", "add_prefix_space": True,
                                                         "trim_offsets": True, "use_regex": True}),
    "added token": _add_token(False),
    "added special token": _add_token(True),
    "special flag": _unspecial,
    "unk token": lambda d: d["model"].update(unk_token=None),
    "byte fallback": lambda d: d["model"].update(byte_fallback=True),
    "truncation": lambda d: d.update(truncation={"direction": "Right", "max_length": 8, "strategy": "LongestFirst",
                                                 "stride": 0}),
}


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_changes_with_what_changes_ids(base_json, base_hash, name):
    assert tokenizer_fingerprint(variant(base_json, CHANGES[name])) != base_hash


def test_every_change_gives_its_own_fingerprint(base_json):
    hashes = {name: tokenizer_fingerprint(variant(base_json, change)) for name, change in CHANGES.items()}
    assert len(set(hashes.values())) == len(hashes)


def test_a_retrained_vocabulary_or_normalizer_changes_it(base_hash):
    assert tokenizer_fingerprint(train_tokenizer(vocab_size=320)) != base_hash
    assert tokenizer_fingerprint(train_tokenizer(normalizer="lowercase")) != base_hash


def test_chat_template_and_special_tokens_of_the_directory(base, base_hash, tmp_path):
    plain = tokenizer_fingerprint(write_model_dir(tmp_path / "plain", base, {}))
    template_a = tokenizer_fingerprint(write_model_dir(tmp_path / "a", base, {"chat_template": "{{ messages }}"}))
    template_b = tokenizer_fingerprint(write_model_dir(tmp_path / "b", base, {"chat_template": "{{ message }}"}))
    named = tokenizer_fingerprint(write_model_dir(tmp_path / "n", base, {"chat_template": [
        {"name": "default", "template": "{{ messages }}"}]}))
    jinja = write_model_dir(tmp_path / "j", base, {"chat_template": "{{ messages }}"}, chat_template_file="{{ x }}")
    eos = tokenizer_fingerprint(write_model_dir(tmp_path / "e", base, {"eos_token": "</s>"}))
    eos_object = write_model_dir(tmp_path / "o", base, {"eos_token": {"content": "</s>", "lstrip": False}})
    other_eos = tokenizer_fingerprint(write_model_dir(tmp_path / "s", base, {"eos_token": "<s>"}))
    assert plain == base_hash
    found = [template_a, template_b, named, tokenizer_fingerprint(jinja), eos, other_eos]
    assert len(set(found + [base_hash])) == len(found) + 1
    assert tokenizer_fingerprint(eos_object) == eos  # the two spellings of a special token
    assert load_tokenizer(jinja).chat_template == "{{ x }}"  # the .jinja file wins, as in transformers
    # special_tokens_map.json is read when tokenizer_config.json does not name the token
    mapped = write_model_dir(tmp_path / "m", base)
    (mapped / "special_tokens_map.json").write_text(json.dumps({"eos_token": "</s>"}), encoding="utf-8")
    assert tokenizer_fingerprint(mapped) == eos


def test_canonical_form_lists_what_is_hashed(base):
    form = canonical_tokenizer(base)
    assert set(form) == {"model", "normalizer", "pre_tokenizer", "post_processor", "added_tokens", "truncation",
                         "padding", "chat_template", "special_tokens", "fingerprint_version"}
    assert all(isinstance(merge, list) for merge in form["model"]["merges"])


# --------------------------------------------------------------- tokenizer errors
def test_tokenizer_errors(base, tmp_path):
    expect(errors.TOKENIZER_INVALID, tokenizer_fingerprint, tmp_path / "missing.json", mention="no tokenizer")
    (tmp_path / "empty").mkdir()
    expect(errors.TOKENIZER_INVALID, tokenizer_fingerprint, tmp_path / "empty", mention="tokenizer.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"model": ', encoding="utf-8")
    expect(errors.TOKENIZER_INVALID, tokenizer_fingerprint, broken, mention="cannot load")
    expect(errors.TOKENIZER_INVALID, tokenizer_fingerprint, 42, mention="path")
    bad_config = write_model_dir(tmp_path / "bad", base)
    (bad_config / "tokenizer_config.json").write_text("[1]", encoding="utf-8")
    expect(errors.TOKENIZER_INVALID, tokenizer_fingerprint, bad_config, mention="JSON object")
    (bad_config / "tokenizer_config.json").write_text("{", encoding="utf-8")
    expect(errors.TOKENIZER_INVALID, tokenizer_fingerprint, bad_config, mention="not JSON")
    (bad_config / "tokenizer_config.json").write_text('{"chat_template": 3}', encoding="utf-8")
    expect(errors.TOKENIZER_INVALID, tokenizer_fingerprint, bad_config, mention="chat_template")
    (bad_config / "tokenizer_config.json").write_text('{"eos_token": 3}', encoding="utf-8")
    expect(errors.TOKENIZER_INVALID, tokenizer_fingerprint, bad_config, mention="eos_token")
    (bad_config / "tokenizer_config.json").write_bytes(b'{"eos_token": "\xff"}')
    expect(errors.TOKENIZER_INVALID, tokenizer_fingerprint, bad_config, mention="cannot read")


def test_eos_token_id(base, tmp_path):
    assert load_tokenizer(write_model_dir(tmp_path / "e", base, {"eos_token": "</s>"})).eos_token_id() == \
        base.token_to_id("</s>")
    assert load_tokenizer(base).eos_token_id("<s>") == base.token_to_id("<s>")
    expect(errors.TOKENIZER_INVALID, load_tokenizer(base).eos_token_id, mention="--eos ")
    expect(errors.TOKENIZER_INVALID, load_tokenizer(base).eos_token_id, "<|eot|>", mention="not in the vocabulary")


# --------------------------------------------------------------- dataset fingerprint
def _prefixed(text: str) -> bytes:
    return len(text.encode()).to_bytes(8, "little") + text.encode()


def test_dataset_fingerprint_is_the_documented_definition(tmp_path):
    """SHA-256 over the tag, the tokenizer hash, the row count and, per column (ids, then the text),
    its role, kind and the digests of its values and of their byte lengths (docs/batching.md)."""
    path = tmp_path / "train.jsonl"
    texts = [f"line {i} é" for i in range(50000)]
    path.write_bytes(b"".join(b'{"text": "line %d \\u00e9"}\n' % i for i in range(50000)))  # several chunks
    ids = [str(i) for i in range(50000)]

    def column(role: str, values: list[str]) -> bytes:
        encoded = [v.encode() for v in values]
        sizes = b"".join(len(v).to_bytes(8, "little") for v in encoded)
        return (_prefixed(role) + _prefixed("string") + hashlib.sha256(b"".join(encoded)).digest()
                + hashlib.sha256(sizes).digest())

    expected = hashlib.sha256(DATASET_DOMAIN + _prefixed("a" * 64) + (50000).to_bytes(8, "little")
                              + column("sample_id", ids) + column("text", texts)).hexdigest()
    assert dataset_fingerprint(path, "a" * 64) == expected


def test_dataset_fingerprint_changes_with_content_and_tokenizer(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(b'{"text": "a"}\n')
    first = dataset_fingerprint(path, "a" * 64)
    assert dataset_fingerprint(str(path), "a" * 64) == first
    assert dataset_fingerprint(path, "b" * 64) != first
    path.write_bytes(b'{"text": "b"}\n')
    assert dataset_fingerprint(path, "a" * 64) != first


def test_dataset_fingerprint_errors(tmp_path):
    expect(errors.DATASET_UNREADABLE, dataset_fingerprint, tmp_path / "none.jsonl", "a" * 64, mention="does not exist")
    expect(errors.DATASET_UNREADABLE, dataset_fingerprint, tmp_path, "a" * 64,
           mention="not a datasets save_to_disk folder")
    (tmp_path / "x.jsonl").write_bytes(b"{}\n")
    expect(errors.TOKENIZER_INVALID, dataset_fingerprint, tmp_path / "x.jsonl", "", mention="tokenizer_hash")
