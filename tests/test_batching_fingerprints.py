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
from umlos_cuda.batching.lengths.fingerprints import canonical_tokenizer, tokenizer_parts
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
        {"name": "default", "template": "{{ messages }}"}, {"name": "tools", "template": "{{ tools }}"}]}))
    only_default = write_model_dir(tmp_path / "d", base, {"chat_template": [
        {"name": "default", "template": "{{ messages }}"}]})
    jinja = write_model_dir(tmp_path / "j", base, {"chat_template": "{{ messages }}"}, chat_template_file="{{ x }}")
    eos = tokenizer_fingerprint(write_model_dir(tmp_path / "e", base, {"eos_token": "</s>"}))
    eos_object = write_model_dir(tmp_path / "o", base, {"eos_token": {"content": "</s>", "lstrip": False}})
    other_eos = tokenizer_fingerprint(write_model_dir(tmp_path / "s", base, {"eos_token": "<s>"}))
    assert plain == base_hash
    found = [template_a, template_b, named, tokenizer_fingerprint(jinja), eos, other_eos]
    assert len(set(found + [base_hash])) == len(found) + 1
    assert tokenizer_fingerprint(eos_object) == eos  # the two spellings of a special token
    assert tokenizer_fingerprint(only_default) == template_a  # what save_pretrained writes of it: the template
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


# --------------------------------------------------------------- what save_pretrained rewrites
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}")
GENERATION = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% generation %}{{ m['content'] }}"
              "{% endgeneration %}<|im_end|>\n{% endfor %}")


def _chatml_tokenizer(base_json):
    """The base tokenizer with ChatML's tokens added as plain (not special) tokens, as ``add_tokens`` adds them."""
    def change(data):
        for token in ("<|im_start|>", "<|im_end|>", "<tool>"):
            data["added_tokens"].append({"id": len(data["model"]["vocab"]) + len(data["added_tokens"]) - 3,
                                         "content": token, "single_word": False, "lstrip": False, "rstrip": False,
                                         "normalized": True, "special": False})
    return variant(base_json, change)


def _resaved(folder, out):
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    tokenizer.save_pretrained(str(out))
    return tokenizer, out


SAVED_CONFIGS = {
    "roles and one template": {"eos_token": "<|im_end|>", "pad_token": "</s>", "unk_token": "<unk>",
                               "chat_template": CHATML},
    "additional special tokens": {"eos_token": "<|im_end|>", "additional_special_tokens": ["<tool>"],
                                  "chat_template": CHATML},
    "named templates": {"eos_token": "<|im_end|>", "chat_template": [{"name": "default", "template": CHATML},
                                                                     {"name": "generation", "template": GENERATION}]},
}


@pytest.mark.parametrize("name", sorted(SAVED_CONFIGS))
def test_a_save_pretrained_round_trip_keeps_it(base_json, tmp_path, name):
    """transformers 5 writes a bare TemplateProcessing, marks the role tokens special, renames
    additional_special_tokens and moves templates into .jinja files: no id changes, nor the fingerprint."""
    raw = write_model_dir(tmp_path / "raw", _chatml_tokenizer(base_json), SAVED_CONFIGS[name])
    tokenizer, saved = _resaved(raw, tmp_path / "saved")
    again = _resaved(saved, tmp_path / "again")[0]
    text = "<|im_start|>user\nthe quick fox<|im_end|> <tool>"
    assert tokenizer(text)["input_ids"] == again(text)["input_ids"]  # every id equal
    assert json.loads((saved / "tokenizer.json").read_text())["post_processor"]["type"] == "TemplateProcessing"
    assert tokenizer_fingerprint(saved) == tokenizer_fingerprint(raw)
    assert tokenizer_fingerprint(tmp_path / "again") == tokenizer_fingerprint(raw)


def test_padding_a_call_left_behind_is_not_hashed(base_json, tmp_path):
    """transformers 5 saves the padding of the last call into tokenizer.json; every encoder here drops it."""
    raw = write_model_dir(tmp_path / "raw", _chatml_tokenizer(base_json), {"eos_token": "<|im_end|>",
                                                                           "pad_token": "</s>"})
    tokenizer = _resaved(raw, tmp_path / "saved")[0]
    tokenizer(["the fox", "the quick brown fox jumps"], padding=True)
    tokenizer.save_pretrained(str(tmp_path / "padded"))
    assert json.loads((tmp_path / "padded" / "tokenizer.json").read_text())["padding"] is not None
    assert tokenizer_fingerprint(tmp_path / "padded") == tokenizer_fingerprint(raw)


def test_a_save_that_adds_a_token_changes_it(base_json, tmp_path):
    """An eos_token missing from the vocabulary is added by save_pretrained: a new id, a new fingerprint."""
    raw = write_model_dir(tmp_path / "raw", _chatml_tokenizer(base_json), {"eos_token": "<|eot|>"})
    _resaved(raw, tmp_path / "saved")
    assert tokenizer_fingerprint(tmp_path / "saved") != tokenizer_fingerprint(raw)
    assert [part for part, digest in tokenizer_parts(tmp_path / "saved").items()
            if tokenizer_parts(raw)[part] != digest] == ["added_tokens"]


def test_what_is_written_in_one_form(base_json, base_hash, tmp_path):
    bare = {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {}}
    assert tokenizer_fingerprint(variant(base_json, lambda d: d.update(post_processor=bare))) == base_hash
    adding = copy.deepcopy(bare)
    adding["single"] = [{"SpecialToken": {"id": "<s>", "type_id": 0}}, *bare["single"]]
    adding["special_tokens"] = {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}
    assert tokenizer_fingerprint(variant(base_json, lambda d: d.update(post_processor=adding))) != base_hash
    padding = {"strategy": "BatchLongest", "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
               "pad_type_id": 0, "pad_token": "<unk>"}
    assert tokenizer_fingerprint(variant(base_json, lambda d: d.update(padding=padding))) == base_hash
    # the special flag counts, unless a role names the token (save_pretrained then sets it)
    eos = tokenizer_fingerprint(write_model_dir(tmp_path / "eos", from_json(base_json), {"eos_token": "</s>"}))
    unspecial = variant(base_json, _unspecial)
    assert tokenizer_fingerprint(unspecial) != base_hash
    assert tokenizer_fingerprint(write_model_dir(tmp_path / "u", unspecial, {"eos_token": "<unk>"})) == \
        tokenizer_fingerprint(write_model_dir(tmp_path / "s", from_json(base_json), {"eos_token": "<unk>"}))
    # additional special tokens under either name
    older = write_model_dir(tmp_path / "older", from_json(base_json), {"eos_token": "</s>",
                                                                      "additional_special_tokens": ["<s>"]})
    newer = write_model_dir(tmp_path / "newer", from_json(base_json), {"eos_token": "</s>",
                                                                      "extra_special_tokens": ["<s>"]})
    assert tokenizer_fingerprint(older) == tokenizer_fingerprint(newer) != eos
    assert load_tokenizer(newer).special_tokens["additional_special_tokens"] == ["<s>"]
    named = write_model_dir(tmp_path / "named", from_json(base_json), {"extra_special_tokens": {"image_token": "<s>"}})
    assert load_tokenizer(named).special_tokens == {"extra_special_tokens": {"image_token": "<s>"}}
    assert tokenizer_fingerprint(named) != base_hash


def test_parts_name_what_differs(base_json, base_hash, tmp_path):
    base = tokenizer_parts(from_json(base_json))
    assert set(base) == set(canonical_tokenizer(from_json(base_json))) - {"fingerprint_version"}
    templated = tokenizer_parts(write_model_dir(tmp_path / "t", from_json(base_json), {"chat_template": CHATML}))
    assert [part for part in base if base[part] != templated[part]] == ["chat_template"]
    swapped = tokenizer_parts(variant(base_json, _swap_two_tokens))
    assert [part for part in base if base[part] != swapped[part]] == ["model"]


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
