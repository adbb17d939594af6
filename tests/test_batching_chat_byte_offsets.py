"""Chat records' token offsets from their ids alone (umlos_cuda/batching/chat/byte_offsets.py): where the shortcut
is taken they are the tokenizer's own offsets, on random texts; where it cannot be shown to be, it is not taken,
and says why; and a token store is the same bytes either way, through the assistant masks."""

from __future__ import annotations

import json
from itertools import chain

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, processors

from batching_cases import train_tokenizer, write_model_dir
from umlos_cuda.batching.chat.byte_offsets import ByteOffsets, why_not
from umlos_cuda.batching.chat.turns import ChatText
from umlos_cuda.batching.lengths.encoder import ChunkEncoder
from umlos_cuda.batching.records.chunk import RecordChunk, RowIds, SkippedLines
from umlos_cuda.batching.tokens.writer import encode_chunk, tokenize_dataset

CHATML = ("{% for message in messages %}"
          "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
#: Generation blocks around the content alone: span edges inside the text between two added tokens.
GENERATION = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
              "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] }}{% endgeneration %}"
              "{% else %}{{ message['content'] }}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}")
#: Qwen2's and Llama 3's split ahead of a ByteLevel step without its own regex.
SPLIT = Regex(r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def byte_level(variant: str = "plain") -> Tokenizer:
    """A byte-level BPE without a normalizer, with ChatML's special tokens and a non-ASCII added word, set up as
    ``variant`` says."""
    tokenizer = train_tokenizer()
    tokenizer.normalizer = None
    tokenizer.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    tokenizer.add_tokens(["wörld ok"])
    if variant == "split":
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(SPLIT, "isolated"),
                                                           pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                    use_regex=False)])
    elif variant == "processors":  # Llama 3's: offsets kept, special tokens only when asked for
        tokenizer.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])])
    return tokenizer


PIECES = st.sampled_from(["hello", " there", "héllo", "wörld", "wörld ok", "😀", "日本語", "a\u0301", "\r\n", "\n\n",
                          "\t", "  ", " ", "<|im_start|>", "<|im_end|>", "<s>", "42", "1234", "?!", "\ufeff", "\x00"])
TEXTS = st.lists(st.one_of(PIECES, st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)),
                 max_size=10).map("".join)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(variant=st.sampled_from(["plain", "split", "processors"]), texts=st.lists(TEXTS, min_size=1, max_size=5))
def test_offsets_from_the_ids_are_the_tokenizers(variant, texts):
    """ASCII and not, characters that byte-level BPE cuts in two, added tokens, whitespace runs, empty texts."""
    tokenizer = byte_level(variant)
    assert why_not(tokenizer) is None
    encodings = tokenizer.encode_batch(texts, add_special_tokens=False)
    fast = tokenizer.encode_batch_fast(texts, add_special_tokens=False)
    assert [e.ids for e in fast] == [e.ids for e in encodings]
    ids = np.fromiter(chain.from_iterable(e.ids for e in fast), dtype=np.int64)
    counts = np.array([len(e) for e in fast], dtype=np.int64)
    offsets = ByteOffsets.of(tokenizer).offsets(ids, counts, texts)
    assert offsets is not None
    assert offsets.tolist() == [list(pair) for e in encodings for pair in e.offsets]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(normalizer=st.sampled_from(["NFC", "NFD", "NFKC", "NFKD", "sequence"]),
       texts=st.lists(st.lists(st.one_of(PIECES, st.text(st.characters(max_codepoint=127), max_size=12)),
                               max_size=10).map("".join), min_size=1, max_size=5))
def test_behind_a_unicode_normal_form_only_ascii_texts_take_the_offsets_from_the_ids(normalizer, texts):
    """Qwen2's NFC, say: ASCII is left as it is, so its offsets follow from the ids; any other text keeps the
    tokenizer's own (covers says no)."""
    tokenizer = byte_level("split")
    forms = {"NFC": normalizers.NFC, "NFD": normalizers.NFD, "NFKC": normalizers.NFKC, "NFKD": normalizers.NFKD}
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.NFKD()]) if normalizer == "sequence" \
        else forms[normalizer]()
    assert why_not(tokenizer) is None
    from_ids = ByteOffsets.of(tokenizer)
    assert from_ids.covers(texts) == all(text.isascii() for text in texts)
    ascii_texts = [text for text in texts if text.isascii()]
    assert from_ids.covers(ascii_texts)
    encodings = tokenizer.encode_batch(ascii_texts, add_special_tokens=False)
    ids = np.fromiter(chain.from_iterable(e.ids for e in encodings), dtype=np.int64)
    offsets = from_ids.offsets(ids, np.array([len(e) for e in encodings], dtype=np.int64), ascii_texts)
    assert offsets is not None
    assert offsets.tolist() == [list(pair) for e in encodings for pair in e.offsets]


def _alphabet_bpe(**options) -> Tokenizer:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tokenizer = Tokenizer(models.BPE({c: i for i, c in enumerate(sorted(alphabet))}, [], **options))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return tokenizer


def _set(name: str, value):
    def change(tokenizer):
        setattr(tokenizer, name, value)
        return tokenizer
    return change


def _lstrip(tokenizer):
    tokenizer.add_special_tokens([AddedToken("<|tool|>", lstrip=True, special=True)])
    return tokenizer


def _truncating(tokenizer):
    tokenizer.enable_truncation(64)
    return tokenizer


def _no_alphabet(_tokenizer):
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return tokenizer


@pytest.mark.parametrize("change, why", [
    (_set("normalizer", normalizers.Lowercase()), "Lowercase normalizer"),
    (_set("normalizer", normalizers.Sequence([normalizers.NFC(), normalizers.Replace("a", "b")])), "Replace"),
    (_set("pre_tokenizer", pre_tokenizers.ByteLevel(add_prefix_space=True)), "prefix space"),
    (_set("pre_tokenizer", pre_tokenizers.Sequence([pre_tokenizers.Split(" ", "removed"),
                                                    pre_tokenizers.ByteLevel(add_prefix_space=False)])), "drop"),
    (_set("pre_tokenizer", pre_tokenizers.Sequence([pre_tokenizers.ByteLevel(add_prefix_space=False),
                                                    pre_tokenizers.ByteLevel(add_prefix_space=False)])), "one Byte"),
    (_set("pre_tokenizer", pre_tokenizers.Whitespace()), "one ByteLevel"),
    (_set("post_processor", processors.ByteLevel(trim_offsets=True)), "post-processor"),
    (_set("post_processor", processors.RobertaProcessing(("</s>", 2), ("<s>", 1))), "post-processor"),
    (_lstrip, "strips"),
    (_truncating, "truncates"),
    (_no_alphabet, "alphabet"),
    (lambda _: _alphabet_bpe(continuing_subword_prefix="##"), "subword prefix"),
    (lambda _: _alphabet_bpe(end_of_word_suffix="</w>"), "word suffix"),
])
def test_a_tokenizer_whose_offsets_may_not_follow_from_its_ids_keeps_its_own(change, why):
    tokenizer = change(byte_level())
    assert why in why_not(tokenizer)
    assert ByteOffsets.of(tokenizer) is None
    assert ChunkEncoder(tokenizer, "chat").byte_offsets is None


def test_an_added_token_that_is_a_vocabulary_entry_of_another_length_keeps_the_tokenizers_offsets():
    tokenizer = _alphabet_bpe()
    tokenizer.add_special_tokens([AddedToken("<é>", special=True)])  # 4 bytes
    assert why_not(tokenizer) is None
    tokenizer = _alphabet_bpe()
    entry = tokenizer.id_to_token(0)  # one byte-level character, one byte
    tokenizer.add_special_tokens([AddedToken(entry + entry, special=True)])  # a new id: not the entry's
    assert why_not(tokenizer) is None
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["<x>"] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab, []))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.add_special_tokens([AddedToken("<x>", special=True)])  # the entry's id, the same 3 bytes
    assert tokenizer.token_to_id("<x>") == vocab["<x>"] and why_not(tokenizer) is None
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["Ã©"] = len(vocab)  # the entry spelling é, two bytes
    tokenizer = Tokenizer(models.BPE(vocab, [("Ã", "©")]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.add_special_tokens([AddedToken("Ã©", special=True)])  # its id, four bytes as text
    assert tokenizer.token_to_id("Ã©") == tokenizer.encode("é").ids[0]
    assert "another length" in why_not(tokenizer)


def test_only_chat_records_take_the_offsets_from_the_ids():
    tokenizer = byte_level()
    assert isinstance(ChunkEncoder(tokenizer, "chat").byte_offsets, ByteOffsets)
    assert ChunkEncoder(tokenizer, "text").byte_offsets is None
    assert ChunkEncoder(tokenizer, "completion").byte_offsets is None


def test_a_chunk_whose_ids_do_not_spell_its_texts_takes_the_tokenizers_offsets():
    """The tripwire: lengths one byte off for every token make no record add up, and the chunk's masks are
    those of the tokenizer's offsets (and a length not known, 0, the same)."""
    tokenizer = byte_level()
    texts = ["<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhéllo there<|im_end|>\n"]
    start = texts[0].index("assistant\n") + len("assistant\n")
    chunk = RecordChunk(RowIds(0, 1), [[ChatText(texts[0], ((start, len(texts[0])),))]], 0, 0)
    right = ChunkEncoder(tokenizer, "chat")
    expected = [array.tolist() for array in encode_chunk(right, chunk, np.dtype("<u2"))]
    assert 0 < sum(expected[2]) < len(expected[2])
    lengths = right.byte_offsets.lengths
    for wrong in (lengths + 1, np.zeros_like(lengths)):
        source = ChunkEncoder(tokenizer, "chat")
        source.__dict__["byte_offsets"] = ByteOffsets(wrong)
        ids = np.asarray(tokenizer.encode(texts[0], add_special_tokens=False).ids, dtype=np.int64)
        assert source.byte_offsets.offsets(ids, np.array([ids.shape[0]]), texts) is None
        assert [array.tolist() for array in encode_chunk(source, chunk, np.dtype("<u2"))] == expected


WORDS = st.sampled_from(["hello", "there", "héllo", "wörld", "wörld ok", "😀", "日本語", " ", "  ", "\n", "<|im_end|>",
                         "<|im_start|>", "42", "?", "fine", "you"])
ASCII_WORDS = st.sampled_from(["hello", "there", " ", "  ", "\n", "<|im_end|>", "42", "?", "fine", "you"])


@st.composite
def conversations(draw, words):
    messages = []
    for _ in range(draw(st.integers(1, 3))):
        for role in ("user", "assistant"):
            messages.append({"role": role, "content": "".join(draw(st.lists(words, max_size=6)))})
    return messages


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Per template, a model folder whose offsets follow from the ids, one behind NFC (from the ids for chunks
    of ASCII, its own for others) and one whose never do (a normalizer that changes none of these texts: the same
    ids and offsets, the tokenizer's own taken)."""
    root = tmp_path_factory.mktemp("byte-offsets")
    found = {}
    for name, template in (("chatml", CHATML), ("generation", GENERATION)):
        for kind, normalizer in (("ids", None), ("nfc", normalizers.NFC()), ("own", normalizers.Replace("~", "-"))):
            tokenizer = byte_level()
            tokenizer.normalizer = normalizer
            found[name, kind] = write_model_dir(root / f"{name}-{kind}", tokenizer,
                                                {"chat_template": template, "eos_token": "<|im_end|>"})
    return found


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), ascii_only=st.booleans(), template=st.sampled_from(["chatml", "generation"]))
def test_a_store_is_the_same_bytes_with_the_offsets_from_the_ids_or_the_tokenizers(folders, tmp_path_factory,
                                                                                   data, ascii_only, template):
    """Span edges at added tokens (ChatML's ends) and inside the text between them (its starts, and every edge
    of the generation blocks), contents that start or end with spaces and newlines, non-ASCII, empty ones."""
    chats = data.draw(st.lists(conversations(ASCII_WORDS if ascii_only else WORDS), min_size=1, max_size=12))
    folder = tmp_path_factory.mktemp("store")
    dataset = folder / "chat.jsonl"
    dataset.write_text("".join(json.dumps({"messages": chat}) + "\n" for chat in chats), encoding="utf-8")
    stores = {}
    for kind in ("ids", "nfc", "own"):
        model = folders[template, kind]
        assert (why_not(Tokenizer.from_file(str(model / "tokenizer.json"))) is None) == (kind != "own")
        tokenize_dataset(dataset, model, folder / kind, messages_field="messages", skipped=SkippedLines(),
                         chunk_size=4)
        stores[kind] = {name: (folder / kind / name).read_bytes()
                        for name in ("tokens.npy", "loss_mask.npy", "offsets.npy")}
    assert stores["ids"] == stores["nfc"] == stores["own"]
