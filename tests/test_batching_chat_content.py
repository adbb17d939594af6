"""Chat content parts (``[{"type": "text", "text": ...}]``, the OpenAI and Hugging Face form) against
``transformers``: text parts reach the template as the list they are, so the text, the ids and the
assistant masks are ``apply_chat_template``'s; a part that is not text is CHAT_CONTENT_UNSUPPORTED,
a malformed part DATASET_RECORD_INVALID, in ``encode_chat``, the length cache and the token store alike,
from JSONL and Parquet, skipped and counted with ``--skip-bad-lines``.
"""

from __future__ import annotations

import numpy as np
import pytest

from batching_cases import expect
from preference_cases import FAMILIES, family_models, records, write_jsonl
from umlos_cuda import errors
from umlos_cuda.batching import TokenStore, build_lengths, encode_chat
from umlos_cuda.batching.records.chunk import SkippedLines
from umlos_cuda.batching.tokens.writer import tokenize_dataset
from umlos_cuda.cli import main

transformers = pytest.importorskip("transformers")

#: The families whose templates read text parts.
PART_FAMILIES = [family for family, spec in FAMILIES.items() if spec[3]]
USER = {"role": "user", "content": [{"type": "text", "text": "what is in"}, {"type": "text", "text": " the box"}]}
MEDIA = [{"type": "image", "image": "cat.png"}, {"type": "image_url", "image_url": {"url": "http://x/cat.png"}},
         {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return family_models(tmp_path_factory.mktemp("content-models"))


def conversations(count: int, seed: int) -> list[list[dict]]:
    """Conversations of text parts, each ending with an assistant turn (tests/preference_cases.py)."""
    return [row["chosen"] for row in records("implicit", count, seed=seed, parts=True)]


@pytest.mark.parametrize("family", PART_FAMILIES)
def test_text_parts_render_and_encode_as_transformers(models, family):
    folder, hf = models[family]
    for messages in conversations(25, seed=len(family)):
        ours = encode_chat(folder, messages)
        assert ours.text == hf.apply_chat_template(messages, tokenize=False)
        assert ours.input_ids == hf.apply_chat_template(messages, return_dict=True)["input_ids"]
        if family == "generation":  # markers: transformers' assistant mask
            out = hf.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True)
            assert ours.assistant_mask.tolist() == out["assistant_masks"]
        else:  # ChatML, no markers: the masked tokens are each assistant turn's text and its end of turn
            ids, mask = np.asarray(ours.input_ids), ours.assistant_mask
            starts = np.flatnonzero(np.diff(np.concatenate([[0], mask])) == 1)
            ends = np.flatnonzero(np.diff(np.concatenate([mask, [0]])) == -1) + 1
            turns = [hf.decode(ids[a:b].tolist()) for a, b in zip(starts, ends)]
            answers = ["".join(part["text"] for part in m["content"]) + "<|im_end|>\n" for m in messages
                       if m["role"] == "assistant"]
            assert "".join(turns) == "".join(answers)


def test_a_template_that_reads_text_treats_a_list_as_transformers_does(models, tmp_path):
    folder, hf = models["chatml"]
    joined = tmp_path / "joined.jinja"  # '+' of a string and a list: both refuse
    joined.write_text("{% for m in messages %}{{ m['role'] + ': ' + m['content'] }}{% endfor %}", encoding="utf-8")
    printed = tmp_path / "printed.jinja"  # the list printed: both print it the same
    printed.write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}", encoding="utf-8")
    with pytest.raises(TypeError):
        hf.apply_chat_template([USER], tokenize=False, chat_template=joined.read_text())
    expect(errors.DATASET_RECORD_INVALID, encode_chat, folder, [USER], chat_template=joined)
    ours = encode_chat(folder, [USER], chat_template=printed)
    assert ours.text == hf.apply_chat_template([USER], tokenize=False, chat_template=printed.read_text())
    assert "'type': 'text'" in ours.text


@pytest.mark.parametrize("part", MEDIA, ids=[part["type"] for part in MEDIA])
def test_a_part_that_is_not_text_is_unsupported(models, part):
    folder = models["chatml"][0]
    messages = [{"role": "user", "content": [USER["content"][0], part]}]
    error = expect(errors.CHAT_CONTENT_UNSUPPORTED, encode_chat, folder, messages)
    assert repr(part["type"]) in error.message and "only text parts" in error.message


@pytest.mark.parametrize("content, mention", [
    (["plain text"], "content part 0 is of type string"),
    ([{"text": "no type"}], "lacks 'type'"),
    ([{"type": "text", "text": 7}], "has a non-string (number) 'text'"),
    ([{"type": "text"}], "lacks 'text'"),
    ([{"type": 3, "text": "x"}], "has a non-string (number) 'type'"),
    (7, "'content' that is a string or a list of text parts"),
])
def test_malformed_parts_are_bad_records(models, content, mention):
    folder = models["chatml"][0]
    expect(errors.DATASET_RECORD_INVALID, encode_chat, folder, [{"role": "user", "content": content}],
           mention=mention)


def test_the_store_and_the_cache_skip_media_records_alike(models, tmp_path):
    folder, hf = models["generation"]
    chats = conversations(6, seed=9)
    with_image = [{"role": "user", "content": [MEDIA[0], USER["content"][0]]}, chats[0][-1]]
    rows = [{"id": f"c{i}", "messages": m} for i, m in enumerate([chats[0], with_image, *chats[1:]])]
    write_jsonl(tmp_path / "chat.jsonl", rows)
    error = expect(errors.CHAT_CONTENT_UNSUPPORTED, tokenize_dataset, tmp_path / "chat.jsonl", folder,
                   tmp_path / "store", messages_field="messages")
    assert "line 2" in error.message and "--skip-bad-lines" in error.message
    skipped = SkippedLines()
    store = tokenize_dataset(tmp_path / "chat.jsonl", folder, tmp_path / "store", messages_field="messages",
                             skipped=skipped)
    cache = build_lengths(tmp_path / "chat.jsonl", folder, tmp_path / "lengths.jsonl", messages_field="messages",
                          skipped=SkippedLines())
    assert skipped.count == 1 and "line 2" in skipped.first[0] and len(store) == len(chats)
    assert np.array_equal(cache.lengths, store.lengths)
    for row, messages in enumerate(chats):
        out = hf.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True)
        ids, mask = store.arrays(row)
        assert ids.tolist() == out["input_ids"] and mask.tolist() == out["assistant_masks"]


def test_parquet_parts_with_null_keys_render_as_transformers_renders_the_dataset(models, tmp_path, capsys):
    """A Parquet column of parts carries every part key, null where a part lacks it (what ``datasets`` shows
    a template too); text parts with a null ``image`` key are text, an ``image`` part is refused."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    from datasets import Dataset

    folder, hf = models["chatml"]
    chats = conversations(8, seed=4)
    rows = [{"id": f"c{i}", "messages": [{**m, "content": [{**p, "image": None} for p in m["content"]]}
                                         for m in chat]} for i, chat in enumerate(chats)]
    rows.insert(3, {"id": "img", "messages": [{"role": "user", "content": [{"type": "image", "text": None,
                                                                            "image": "cat.png"}]}]})
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "chat.parquet")
    code = main(["data", "tokenize", "--dataset", str(tmp_path / "chat.parquet"), "--tokenizer", str(folder),
                 "--output", str(tmp_path / "store"), "--messages-field", "messages", "--quiet", "--skip-bad-lines",
                 "--workers", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "skipped 1 bad line" in out and "row 3" in out and "'image'" in out
    store = TokenStore.open(tmp_path / "store")
    seen = [row for row in Dataset.from_parquet(str(tmp_path / "chat.parquet")) if row["id"] != "img"]
    assert len(store) == len(seen) == len(chats)
    for row, record in enumerate(seen):
        assert record["messages"][0]["content"][0]["image"] is None  # what a template sees in transformers
        ids, _mask = store.arrays(row)
        assert ids.tolist() == hf.apply_chat_template(record["messages"], return_dict=True)["input_ids"]
