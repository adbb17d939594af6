"""Chat records against Hugging Face ``transformers``: the rendered text, the token ids and the
assistant masks of three template families (ChatML, Llama-3 style, a template with
``{% generation %}`` markers), on tokenizers trained here and loaded from local folders (no network).

Where a template has markers, the mask must equal ``return_assistant_tokens_mask``; where it has
none, it must equal the generation-prompt difference (docs/batching.md, "Chat records") computed
from transformers' own renders, and, on known answers, cover exactly the assistant's content and
end-of-turn text.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batching_cases import expect
from umlos_cuda import errors
from umlos_cuda.batching import LengthCache, TokenStore, build_lengths, encode_chat, tokenizer_fingerprint
from umlos_cuda.batching.chat.limits import MAX_RENDER_STEPS
from umlos_cuda.batching.chat import masks
from umlos_cuda.batching.chat.masks import chunk_masks, token_mask
from umlos_cuda.batching.records.chunk import SkippedLines
from umlos_cuda.batching.tokens.writer import tokenize_dataset
from umlos_cuda.cli import main

transformers = pytest.importorskip("transformers")

SENTENCES = ["hello there how are you today", "I am fine thank you very much", "the quick brown fox jumps",
             "what is the capital of france", "paris is the capital", "you are a helpful assistant",
             "tell me a joke about cats", "why did the cat sit on the computer"]

CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
          "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA3 = ("{{ bos_token }}{% for message in messages %}"
          "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' "
          "+ message['content'] | trim + '<|eot_id|>' %}{{ content }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
GENERATION = ("{% for message in messages %}"
              "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
              "{{ raise_exception('unknown role ' + message['role']) }}{% endif %}"
              "{% if message['role'] == 'assistant' %}{{ '<|assistant|>\\n' }}"
              "{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}{{ '\\n' }}"
              "{% else %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}{% endif %}"
              "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")

FAMILIES = {
    "chatml": (CHATML, ["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
               {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    "llama3": (LLAMA3, ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
               {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    "generation": (GENERATION, ["<|system|>", "<|user|>", "<|assistant|>", "</s>", "<unk>"],
                   {"eos_token": "</s>", "unk_token": "<unk>"}),
}
#: What each family closes an assistant turn with (the known answers of the difference rule).
TURN_END = {"chatml": "<|im_end|>\n", "llama3": "<|eot_id|>"}


def write_family(folder, family: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    template, specials, tokens = FAMILIES[family]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(SENTENCES * 4, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template, **tokens}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat-models")
    found = {}
    for family in FAMILIES:
        folder = write_family(root / family, family)
        found[family] = (folder, transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True))
    return found


def difference_spans(hf, messages, add_generation_prompt):
    """The generation-prompt difference, from transformers' own renders (the plain definition)."""
    whole = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    spans = []
    for k, message in enumerate(messages):
        if message["role"] == "assistant":
            before = hf.apply_chat_template(messages[:k], tokenize=False, add_generation_prompt=True) if k else ""
            after = hf.apply_chat_template(messages[:k + 1], tokenize=False)
            assert after.startswith(before) and whole.startswith(after)
            spans.append((len(before), len(after)))
    return spans


def expected_mask(hf, family, messages, add_generation_prompt):
    """transformers' assistant mask (markers), or the overlap rule over the difference spans."""
    out = hf.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, return_dict=True,
                                 return_assistant_tokens_mask=family == "generation")
    if family == "generation":
        return out["input_ids"], out["assistant_masks"]
    text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    offsets = hf(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    spans = difference_spans(hf, messages, add_generation_prompt)
    mask = [int(any(end > s and start < e for s, e in spans)) for start, end in offsets]
    return out["input_ids"], mask


def check_equal(models, family, messages, add_generation_prompt):
    folder, hf = models[family]
    ours = encode_chat(folder, messages, add_generation_prompt=add_generation_prompt)
    assert ours.text == hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    ids, mask = expected_mask(hf, family, messages, add_generation_prompt)
    assert ours.input_ids == ids
    assert ours.assistant_mask.tolist() == mask
    return ours


CONVERSATIONS = [
    [{"role": "user", "content": "hello there"}],
    [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "I am fine"}],
    [{"role": "system", "content": "you are a helpful assistant"}, {"role": "user", "content": "tell me a joke"},
     {"role": "assistant", "content": "why did the cat sit on the computer"}, {"role": "user", "content": "why"},
     {"role": "assistant", "content": "to keep an eye on the mouse"}],
    [{"role": "user", "content": "what is the capital of france"}, {"role": "assistant", "content": "paris"},
     {"role": "user", "content": "thank you"}],
]


@pytest.mark.parametrize("add_generation_prompt", [False, True])
@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_text_ids_and_masks_equal_transformers(models, family, conversation, add_generation_prompt):
    check_equal(models, family, CONVERSATIONS[conversation], add_generation_prompt)


@pytest.mark.parametrize("family", ["chatml", "llama3"])
def test_the_difference_rule_masks_each_assistant_turn_and_its_end(models, family):
    """Known answers: the masked tokens decode to each assistant content and the family's end of turn."""
    folder, hf = models[family]
    messages = CONVERSATIONS[2]
    ours = encode_chat(folder, messages)
    ids = np.asarray(ours.input_ids)
    runs = np.split(ids, np.flatnonzero(np.diff(ours.assistant_mask.astype(int)) != 0) + 1)
    firsts = np.concatenate([[0], np.flatnonzero(np.diff(ours.assistant_mask.astype(int)) != 0) + 1])
    masked = [hf.decode(run.tolist()) for run, first in zip(runs, firsts) if ours.assistant_mask[first]]
    assert masked == [m["content"] + TURN_END[family] for m in messages if m["role"] == "assistant"]


def test_generation_markers_mask_what_the_markers_enclose(models):
    folder, hf = models["generation"]
    ours = encode_chat(folder, CONVERSATIONS[1])
    assert hf.decode([i for i, m in zip(ours.input_ids, ours.assistant_mask) if m]) == "I am fine</s>"


words = st.sampled_from(["hello", "there", "fine", "cat", "paris", "é", "naïve", "  ", "\n", "<|im_end|>", "42",
                         "the quick", "you"])
contents = st.lists(words, min_size=0, max_size=8).map(" ".join)


@st.composite
def conversations(draw):
    messages = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(contents)})
    for turn in range(draw(st.integers(1, 4))):
        messages.append({"role": "user", "content": draw(contents)})
        if turn or draw(st.booleans()):
            messages.append({"role": "assistant", "content": draw(contents)})
    if draw(st.booleans()) and messages[-1]["role"] == "user":
        messages.append({"role": "assistant", "content": draw(contents)})
    return messages


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=conversations(), add_generation_prompt=st.booleans(), family=st.sampled_from(list(FAMILIES)))
def test_random_conversations_equal_transformers(models, messages, add_generation_prompt, family):
    check_equal(models, family, messages, add_generation_prompt)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(tokens=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 5)), max_size=20),
       spans=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 8)), max_size=4))
def test_token_mask_is_transformers_loop(tokens, spans):
    """Offsets and spans in any order: the mask is transformers' pointer loop, written out here."""
    offsets = [(s, s + w) for s, w in tokens]
    spans = [(s, s + w) for s, w in spans]
    expected = [0] * len(offsets)
    index = 0
    for token, (start, end) in enumerate(offsets):
        while index < len(spans) and start >= spans[index][1]:
            index += 1
        if index == len(spans):
            break
        if end > spans[index][0]:
            expected[token] = 1
    assert token_mask(offsets, spans).tolist() == expected


_PAIRS = st.lists(st.tuples(st.integers(0, 30), st.integers(0, 5)), max_size=12)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(records=st.lists(st.tuples(_PAIRS, _PAIRS), max_size=6), rising=st.booleans())
def test_chunk_masks_are_the_masks_of_each_encoding(records, rising):
    """A chunk's masks at once are each encoding's token_mask, concatenated: when every encoding's token starts
    and span ends rise (sorted here half the time) by one search, in which a token never takes another
    encoding's span; otherwise encoding by encoding."""
    offsets, spans = [], []
    for tokens, marked in records:
        offsets.append(sorted((s, s + w) for s, w in tokens) if rising else [(s, s + w) for s, w in tokens])
        spans.append(sorted(((s, s + w) for s, w in marked), key=lambda span: span[1]) if rising else
                     [(s, s + w) for s, w in marked])
    expected = [bit for o, s in zip(offsets, spans) for bit in token_mask(o, s).tolist()]
    with mock.patch.object(masks, "token_mask", side_effect=AssertionError("searched encoding by encoding")) \
            if rising else contextlib.nullcontext():
        got = chunk_masks(offsets, spans)
    assert got.dtype == np.uint8 and got.tolist() == expected


def test_variables_and_globals_are_transformers(models, tmp_path):
    """tools and documents are defined (None), the special tokens are variables, tojson does not escape HTML,
    namespace and loop controls work."""
    template = ("{{ tools is defined }}|{{ tools is none }}|{{ documents is none }}|{{ eos_token }}|{{ pad_token }}|"
                "{{ bos_token is defined }}|{{ messages | tojson }}|{% set ns = namespace(n=0) %}"
                "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{% set ns.n = ns.n + 1 %}"
                "{% endfor %}{{ ns.n }}|{{ dict(a=1) | tojson(sort_keys=true) }}")
    (tmp_path / "t.jinja").write_text(template)
    folder, hf = models["chatml"]
    messages = [{"role": "user", "content": "<b>é</b>", "name": None}, {"role": "user", "content": "x"}]
    ours = encode_chat(folder, messages, chat_template=tmp_path / "t.jinja")
    assert ours.text == hf.apply_chat_template(messages, tokenize=False, chat_template=template)
    assert ours.text.startswith("True|True|True|<|im_end|>|<|endoftext|>|False|")
    assert '"<b>é</b>"' in ours.text and '"name"' not in ours.text  # null keys dropped, as transformers does


def test_reasoning_fields_are_aliased_as_transformers(models, tmp_path):
    template = "{% for m in messages %}{{ m | tojson }}{% endfor %}"
    (tmp_path / "t.jinja").write_text(template)
    folder, hf = models["chatml"]
    messages = [{"role": "user", "content": "a", "reasoning": "because"}]
    ours = encode_chat(folder, messages, chat_template=tmp_path / "t.jinja")
    assert ours.text == hf.apply_chat_template(messages, tokenize=False, chat_template=template)


def test_named_templates_and_jinja_file_are_found_as_transformers(models, tmp_path):
    folder = write_family(tmp_path / "m", "chatml")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "default", "template": LLAMA3}, {"name": "other", "template": CHATML}]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    hf = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    messages = CONVERSATIONS[1]
    assert encode_chat(folder, messages).text == hf.apply_chat_template(messages, tokenize=False)
    (folder / "chat_template.jinja").write_text(GENERATION)  # the file replaces the config's templates
    hf = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    assert encode_chat(folder, messages).text == hf.apply_chat_template(messages, tokenize=False)
    (folder / "additional_chat_templates").mkdir()
    (folder / "additional_chat_templates" / "tool_use.jinja").write_text(CHATML)
    hf = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    assert isinstance(hf.chat_template, dict)
    assert encode_chat(folder, messages).text == hf.apply_chat_template(messages, tokenize=False)


def test_template_failures_are_documented(models, tmp_path):
    folder, _ = models["generation"]
    expect(errors.DATASET_RECORD_INVALID, encode_chat, folder, [{"role": "tool", "content": "x"}],
           mention="unknown role tool")
    for bad in ([], "hello", [{"role": "user"}], [{"role": "user", "content": 5}], [["user", "x"]]):
        expect(errors.DATASET_RECORD_INVALID, encode_chat, folder, bad)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "tokenizer.json").write_text((folder / "tokenizer.json").read_text())
    expect(errors.CHAT_TEMPLATE_INVALID, encode_chat, bare, CONVERSATIONS[0], mention="no chat template")
    (tmp_path / "broken.jinja").write_text("{% for m in messages %}")
    expect(errors.CHAT_TEMPLATE_INVALID, encode_chat, folder, CONVERSATIONS[0],
           chat_template=tmp_path / "broken.jinja", mention="does not compile")
    expect(errors.CHAT_TEMPLATE_INVALID, encode_chat, folder, CONVERSATIONS[0],
           chat_template=tmp_path / "missing.jinja", mention="does not exist")


SQUARED = "{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}{{ ns.x }}"


@pytest.mark.parametrize("template, mention", [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "steps"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
    ("{{ 'x' * 1000000000 }}", "multiplies"),
    ("{{ 2 ** 1000000000 }}", "bits"),
    ("{% set ns = namespace(s='x' * 1000000) %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
     "joins"),
    # one step of template code, hours of work in C or in a filter: refused before it runs (chat/guards.py)
    (SQUARED, "multiplies integers of 51,937 and 51,937 bits"),
    ("{{ (2 ** 30000) * (2 ** 30000) * (2 ** 30000) }}", "multiplies integers of 60,001 and 30,001 bits"),
    ("{{ [1]|slice(1000000000)|list|length }}", "asks |slice for 1,000,000,000"),
    ("{{ [1]|batch(1000000000, 0)|list|length }}", "asks |batch for 1,000,000,000"),
    ("{{ ('x ' * 30000000)|wordwrap(1)|length }}", "60,000,000 characters at width 1"),
    ("{{ 'x'|center(1000000000000) }}", "asks |center for"),
    ("{{ 'a\nb'|indent(1000000000) }}", "|indent would write"),
    ("{{ messages|tojson(indent=1000000000) }}", "tojson's indent"),
    ("{{ messages|tojson(indent='x' * 100000) }}", "tojson's indent"),
    ("{{ '%1000000000d' % 1 }}", "'%1000000000'"),
    ("{{ '%*d' % (1000000000, 1) }}", "'%*'"),
    ("{{ '%.1000000000f'|format(1.5) }}", "'%.1000000000'"),
    ("{{ '{:>1000000000}'.format(1) }}", "'>1000000000'"),
    ("{{ '{:{w}}'.format(1, w=1000000000) }}", "comes from the arguments"),
    ("{{ '{a:>1000000000}'.format_map({'a': 1}) }}", "'>1000000000'"),
    ("{{ strftime_now('%1000000000Y') }}", "'%1000000000'"),
    ("{{ 1|round(1000000000, 'floor') }}", "asks |round for"),
    ("{{ ('ab' * 1000)|replace('', 'x' * 100000) }}", "|replace would write"),
    ("{{ 'x'.ljust(10000000000) }}", "str.ljust"),
    ("{{ 'x'.zfill(10000000000) }}", "str.zfill"),
    ("{{ ('\\t' * 1000).expandtabs(1000000000) }}", "str.expandtabs"),
    ("{{ ('ab' * 1000).replace('', 'x' * 100000) }}", "str.replace"),
])
def test_runaway_templates_stop_at_the_render_limits(models, tmp_path, template, mention):
    (tmp_path / "t.jinja").write_text(template)
    folder, _ = models["chatml"]
    expect(errors.CHAT_RENDER_BUDGET_EXCEEDED, encode_chat, folder, CONVERSATIONS[0],
           chat_template=tmp_path / "t.jinja", mention=mention)
    assert MAX_RENDER_STEPS < 100000 * 100000


@pytest.mark.parametrize("template, expected", [
    ("{{ (3 * 4) ~ '|' ~ (2 ** 10) ~ '|' ~ ((2 ** 30) * (2 ** 30)) }}", "12|1024|1152921504606846976"),
    ("{{ [1, 2, 3]|slice(2)|list }}|{{ [1, 2, 3]|batch(2, 0)|list }}", "[[1, 2], [3]]|[[1, 2], [3, 0]]"),
    ("{{ 'aa bb cc'|wordwrap(5) }}|{{ 'ab'|center(6) }}|{{ 'a\nb'|indent(2) }}", "aa bb\ncc|  ab  |a\n  b"),
    ("{{ {'a': [1]}|tojson(indent=2) }}", '{\n  "a": [\n    1\n  ]\n}'),
    ("{{ '%5d|%-3s|%.2f' % (7, 'x', 1.005) }}|{{ '%03d'|format(7) }}|{{ '{:>4}'.format('x') }}",
     "    7|x  |1.00|007|   x"),
    ("{{ 3.14159|round(2) }}|{{ 'a-b'|replace('-', '+') }}|{{ 'x'.ljust(3) }}|", "3.14|a+b|x  |"),
    # the shortcuts of chat/environment.py: strings joined, loop counters, the globals as one dict
    ("{{ 'a' + 'b' }}|{{ 1 + 2 }}|{{ [1] + [2] }}|{{ 1.5 + 1 }}", "ab|3|[1, 2]|2.5"),
    ("{% for m in messages + messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
     "{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.depth }}{{ loop.depth0 }}{{ loop.previtem is defined }}"
     "{{ loop.cycle('a', 'b') }}{{ loop.changed(m) }}|{% endfor %}",
     "1021TrueFalse210FalseaTrue|2110FalseTrue210TruebFalse|"),
    ("{{ range(3)|list }}|{% set ns = namespace(x=1) %}{{ ns.x }}|{{ dict(a=1) }}|{{ cycler is defined }}",
     "[0, 1, 2]|1|{'a': 1}|True"),
])
def test_the_guards_leave_what_a_template_needs_as_transformers_renders_it(models, tmp_path, template, expected):
    """The capped filters, methods and operators render what they render in transformers below their caps."""
    folder, hf = models["chatml"]
    (tmp_path / "t.jinja").write_text(template)
    assert encode_chat(folder, CONVERSATIONS[0], chat_template=tmp_path / "t.jinja").text == expected
    assert hf.apply_chat_template(CONVERSATIONS[0], chat_template=template, tokenize=False) == expected


def test_lipsum_is_not_a_global(models, tmp_path):
    """One ``lipsum`` call writes what it is asked for (a million paragraphs): chat templates do not get it."""
    (tmp_path / "t.jinja").write_text("{{ lipsum(1000000, false, 100000, 100001) }}")
    folder, _ = models["chatml"]
    expect(errors.DATASET_RECORD_INVALID, encode_chat, folder, CONVERSATIONS[0], chat_template=tmp_path / "t.jinja",
           mention="'lipsum' is undefined")


def test_a_template_over_a_mebibyte_is_refused_wherever_it_comes_from(models, tmp_path):
    """``chat_template.jinja``, ``tokenizer_config.json``'s ``chat_template`` and ``--chat-template``: each is
    refused over 1 MiB before Jinja compiles it (a 28 MB template compiles for minutes)."""
    folder, _ = models["chatml"]
    big = "{{ messages[0]['content'] }}" + " " * (1 << 20)
    jinja_file = tmp_path / "jinja"
    shutil.copytree(folder, jinja_file)
    (jinja_file / "chat_template.jinja").write_text(big)
    config = tmp_path / "config"
    shutil.copytree(folder, config)
    data = json.loads((config / "tokenizer_config.json").read_text())
    (config / "tokenizer_config.json").write_text(json.dumps({**data, "chat_template": big}))
    (tmp_path / "t.jinja").write_text(big)
    for model, option in ((jinja_file, None), (config, None), (folder, tmp_path / "t.jinja")):
        expect(errors.CHAT_TEMPLATE_INVALID, encode_chat, model, CONVERSATIONS[0], chat_template=option,
               mention="1,048,576")
    (jinja_file / "chat_template.jinja").write_text(big[:1 << 20])  # at the cap: taken
    assert encode_chat(jinja_file, CONVERSATIONS[0]).text.startswith(CONVERSATIONS[0][0]["content"])


def test_a_template_that_rewrites_earlier_turns_needs_markers(models, tmp_path):
    """Without markers, the difference rule refuses a template whose renders do not extend one another."""
    (tmp_path / "t.jinja").write_text("{% for m in messages %}{% if loop.last %}{{ m['content'] }}{% else %}"
                                      "[{{ m['role'] }}]{% endif %}{% endfor %}")
    folder, _ = models["chatml"]
    expect(errors.DATASET_RECORD_INVALID, encode_chat, folder, CONVERSATIONS[2], chat_template=tmp_path / "t.jinja",
           mention="generation")


# ------------------------------------------------------------------ datasets: lengths, token stores, commands
def write_chats(path, rows):
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def chat_rows():
    """Records of the conversations with an assistant turn (one without has nothing to train on: refused)."""
    trained = [messages for messages in CONVERSATIONS if any(m["role"] == "assistant" for m in messages)]
    return [{"id": f"c{i}", "messages": trained[i % len(trained)]} for i in range(9)]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_tokenize_command_masks_equal_transformers(models, family, tmp_path, capsys):
    folder, hf = models[family]
    rows = chat_rows()
    write_chats(tmp_path / "chat.jsonl", rows)
    code = main(["data", "tokenize", "--dataset", str(tmp_path / "chat.jsonl"), "--tokenizer", str(folder),
                 "--output", str(tmp_path / "store"), "--messages-field", "messages", "--quiet", "--chunk-size", "4"])
    assert code == 0, capsys.readouterr().err
    code = main(["data", "lengths", "build", "--dataset", str(tmp_path / "chat.jsonl"), "--tokenizer", str(folder),
                 "--output", str(tmp_path / "lengths.jsonl"), "--messages-field", "messages", "--quiet"])
    assert code == 0, capsys.readouterr().err
    store = TokenStore.open(tmp_path / "store")
    store.verify()
    assert json.loads((tmp_path / "store" / "meta.json").read_text())["loss_mask"] == "assistant"
    for row, record in enumerate(rows):
        ids, mask = store.arrays(row)
        expected_ids, expected = expected_mask(hf, family, record["messages"], False)
        assert ids.tolist() == expected_ids and mask.tolist() == expected
    cache = LengthCache.load(tmp_path / "lengths.jsonl")
    assert np.array_equal(cache.lengths, store.lengths) and cache.sample_ids == store.length_cache().sample_ids


def test_bad_chat_records_name_their_line_or_are_skipped_alike(models, tmp_path):
    folder, _ = models["generation"]
    rows = chat_rows()
    rows[2] = {"id": "c2", "messages": [{"role": "tool", "content": "x"}]}
    rows[5] = {"id": "c5", "messages": "not a list"}
    write_chats(tmp_path / "chat.jsonl", rows)
    expect(errors.DATASET_RECORD_INVALID, build_lengths, tmp_path / "chat.jsonl", folder, tmp_path / "l.jsonl",
           messages_field="messages", mention="line 3 has 'messages' that does not render")
    expect(errors.DATASET_RECORD_INVALID, tokenize_dataset, tmp_path / "chat.jsonl", folder, tmp_path / "s",
           messages_field="messages", mention="line 3")
    skipped, skipped_store = SkippedLines(), SkippedLines()
    cache = build_lengths(tmp_path / "chat.jsonl", folder, tmp_path / "l.jsonl", messages_field="messages",
                          skipped=skipped)
    store = tokenize_dataset(tmp_path / "chat.jsonl", folder, tmp_path / "s", messages_field="messages",
                             skipped=skipped_store)
    assert skipped.count == skipped_store.count == 2 and "line 6 has 'messages' that is of type string" in \
        skipped.first[1]
    kept = [r["id"] for i, r in enumerate(rows) if i not in (2, 5)]
    assert cache.sample_ids == store.length_cache().sample_ids == kept
    assert np.array_equal(cache.lengths, store.lengths)


#: ChatML that refuses an unknown role, and spends hours in one C call on a message "boom": two lists doubled
#: 40 times, 40 steps of template code, compared with == (2^40 leaves): only the render budget stops it.
BOOM = ("{% set ns = namespace(a=[0], b=[0]) %}{% for m in messages %}"
        "{% if m['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('unknown role ' + m['role']) }}"
        "{% endif %}{% if m['content'] == 'boom' %}{% for i in range(40) %}{% set ns.a = [ns.a, ns.a] %}"
        "{% set ns.b = [ns.b, ns.b] %}{% endfor %}{{ ns.a == ns.b }}{% endif %}"
        "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}")


def boom_lines(kinds: str) -> list[str]:
    """One JSONL line per letter: ``o`` a conversation that renders, ``b`` one that spends hours (BOOM), ``t`` one
    the template refuses (role tool), ``s`` messages that are a string, ``j`` a line that is not JSON, ``_`` blank."""
    trained = CONVERSATIONS[1:]  # each with an assistant turn: one without is a bad record of its own
    made = {"o": lambda i: {"id": f"c{i}", "messages": trained[i % len(trained)]},
            "b": lambda i: {"id": f"c{i}", "messages": [{"role": "user", "content": "boom"}]},
            "t": lambda i: {"id": f"c{i}", "messages": [{"role": "tool", "content": "x"}]},
            "s": lambda i: {"id": f"c{i}", "messages": "not a list"}}
    return [json.dumps(made[kind](i)) if kind in made else "{not json" if kind == "j" else ""
            for i, kind in enumerate(kinds)]


@pytest.fixture
def small_budget(monkeypatch):
    """One CPU second a record, the limit these tests trip and name. The wall clock is far above what one CPU
    second takes on a crowded machine (a worker given a sliver of a core while the suite's other process and a
    parallel run share two cores), so that it is always the CPU limit that ends the record, never the clock."""
    monkeypatch.setenv("UMLOS_CHAT_RENDER_CPU_S", "1")
    monkeypatch.setenv("UMLOS_CHAT_RENDER_WALL_S", "180")
    monkeypatch.setenv("UMLOS_CHAT_RENDER_MEMORY_MIB", "512")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_record_past_the_render_budget_fails_naming_its_line_and_the_limit(models, tmp_path, small_budget,
                                                                              workers):
    """The worker rendering line 3 ends at 1 CPU second; the command fails there with the budget's code, the
    setting that raises it and how to skip such lines, whatever the number of workers; nothing is written."""
    folder, _ = models["chatml"]
    (tmp_path / "boom.jinja").write_text(BOOM)
    (tmp_path / "chat.jsonl").write_text("\n".join(boom_lines("oobooooo")) + "\n")
    for build, out in ((tokenize_dataset, "s"), (build_lengths, "l.jsonl")):
        error = expect(errors.CHAT_RENDER_BUDGET_EXCEEDED, build, tmp_path / "chat.jsonl", folder, tmp_path / out,
                       messages_field="messages", chat_template=tmp_path / "boom.jinja", workers=workers,
                       chunk_size=2)
        assert error.message == (f"{tmp_path / 'chat.jsonl'} line 3 has 'messages' that does not render with "
                                 f"{tmp_path / 'boom.jinja'}: it used more than 1 CPU seconds "
                                 "(UMLOS_CHAT_RENDER_CPU_S=1) (--skip-bad-lines skips such records and counts them)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["boom.jinja", "chat.jsonl"]


def test_records_past_the_budget_are_skipped_like_lines_the_reader_refuses(models, tmp_path, small_budget):
    """With --skip-bad-lines, a record past the budget and one the template refuses are skipped as a line that is
    not JSON is: the store (ids, tokens, dataset fingerprint) is the same byte for byte."""
    folder, _ = models["chatml"]
    (tmp_path / "boom.jinja").write_text(BOOM)
    (tmp_path / "boom.jsonl").write_text("\n".join(boom_lines("obootob")) + "\n")
    (tmp_path / "json.jsonl").write_text("\n".join(boom_lines("ojoojoj")) + "\n")
    stores = {}
    for name in ("boom", "json"):
        skipped = SkippedLines()
        tokenize_dataset(tmp_path / f"{name}.jsonl", folder, tmp_path / f"store-{name}", messages_field="messages",
                         chat_template=tmp_path / "boom.jinja", skipped=skipped, workers=2, chunk_size=3)
        assert skipped.count == 3
        stores[name] = {p.name: p.read_bytes() for p in (tmp_path / f"store-{name}").iterdir()}
    assert stores["boom"] == stores["json"]


@pytest.mark.parametrize("workers", [1, 2])
def test_bad_lines_are_skipped_and_raised_in_line_order_whoever_finds_them(models, tmp_path, small_budget, workers):
    """The reader refuses some lines as it reads them, the workers others after: the first error and the first
    five skipped lines are still in line order, within a chunk and across chunks."""
    folder, _ = models["chatml"]
    (tmp_path / "boom.jinja").write_text(BOOM)
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(boom_lines("otjob_osojtoo")) + "\n")
    skipped = SkippedLines()
    tokenize_dataset(path, folder, tmp_path / "s", messages_field="messages", chat_template=tmp_path / "boom.jinja",
                     skipped=skipped, workers=workers, chunk_size=4)
    assert skipped.count == 7
    assert [message.split(" has ")[0].split(" is ")[0] for message in skipped.first] == \
        [f"{path} line {n}" for n in (2, 3, 5, 6, 8)]
    assert "not JSON" in skipped.first[1] and "CPU seconds" in skipped.first[2] and "is empty" in skipped.first[3]
    for kinds, line, code in (("otj", 2, errors.DATASET_RECORD_INVALID), ("obj", 2, errors.CHAT_RENDER_BUDGET_EXCEEDED),
                              ("oooooj_bt", 6, errors.DATASET_RECORD_INVALID), ("oooooob", 7, None)):
        path.write_text("\n".join(boom_lines(kinds)) + "\n")
        want = errors.CHAT_RENDER_BUDGET_EXCEEDED if code is None else code
        error = expect(want, tokenize_dataset, path, folder, tmp_path / "s2", messages_field="messages",
                       chat_template=tmp_path / "boom.jinja", workers=workers, chunk_size=4)
        assert error.message.startswith(f"{path} line {line} "), (kinds, error.message)


def test_a_parquet_row_past_the_budget_is_named_by_its_row_and_skipped_keeping_the_row_numbers(models, tmp_path,
                                                                                            small_budget):
    """A Parquet row the template cannot render fails naming its row, or is skipped like any bad row; the rows
    after it keep their numbers as ids (an input without an id column)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder, _ = models["chatml"]
    (tmp_path / "boom.jinja").write_text(BOOM)
    rows = [json.loads(line) for line in boom_lines("oobo")]
    pq.write_table(pa.table({"messages": [r["messages"] for r in rows]}), tmp_path / "chat.parquet")
    expect(errors.CHAT_RENDER_BUDGET_EXCEEDED, tokenize_dataset, tmp_path / "chat.parquet", folder, tmp_path / "s",
           messages_field="messages", chat_template=tmp_path / "boom.jinja",
           mention=f"{tmp_path / 'chat.parquet'} row 2 has 'messages' that does not render")
    skipped = SkippedLines()
    store = tokenize_dataset(tmp_path / "chat.parquet", folder, tmp_path / "s", messages_field="messages",
                             chat_template=tmp_path / "boom.jinja", skipped=skipped)
    assert skipped.count == 1 and "row 2 has 'messages'" in skipped.first[0]
    assert store.length_cache().sample_ids == ["0", "1", "3"]


def test_a_shard_whose_ids_hang_on_its_content_keeps_the_records_that_render(models, tmp_path, small_budget):
    """Rows without ids in a sharded dataset are named by their shard's content (records/ids.py), which takes the
    rows kept: a record the template refuses is left out of it as a line that is not JSON is."""
    folder, _ = models["chatml"]
    (tmp_path / "boom.jinja").write_text(BOOM)
    stores = {}
    for name, kinds in (("refused", "otoob"), ("not-json", "ojooj")):
        parts = []
        for shard, shard_kinds in enumerate((kinds, "oooo")):
            part = tmp_path / f"{name}-{shard}.jsonl"
            lines = [json.dumps({"messages": json.loads(line)["messages"]}) if line.startswith("{\"") else line
                     for line in boom_lines(shard_kinds)]
            part.write_text("\n".join(lines) + "\n")
            parts.append(str(part))
        store = tokenize_dataset(parts, folder, tmp_path / f"store-{name}", messages_field="messages",
                                 chat_template=tmp_path / "boom.jinja", skipped=SkippedLines())
        stores[name] = ({p.name: p.read_bytes() for p in (tmp_path / f"store-{name}").iterdir()},
                        store.length_cache().sample_ids)
    assert stores["refused"] == stores["not-json"]
    assert len(stores["refused"][1]) == 7 and all(":" in sample_id for sample_id in stores["refused"][1])


#: The fields of each form of conversational preference record in preference_lines.
PREFERENCE_FIELDS = {"pairs": {"prompt_field": "prompt", "chosen_field": "chosen", "rejected_field": "rejected"},
                     "implicit": {"chosen_field": "chosen", "rejected_field": "rejected"},
                     "unpaired": {"prompt_field": "prompt", "completion_field": "completion", "label_field": "label"}}


def preference_lines(kinds: str, form: str) -> list[str]:
    """One conversational preference record of ``form`` a letter, as boom_lines: ``o`` one that renders, ``b`` one
    whose chosen completion (an unpaired record's completion) spends hours under BOOM, ``t`` one the template
    refuses (a chosen turn of role tool), ``j`` a line that is not JSON."""
    def made(index: int, kind: str) -> dict:
        prompt = [{"role": "user", "content": SENTENCES[index % len(SENTENCES)]}]
        chosen = [{"role": {"t": "tool"}.get(kind, "assistant"), "content": "boom" if kind == "b" else "paris"}]
        rejected = [{"role": "assistant", "content": "london"}]
        if form == "unpaired":
            return {"id": f"p{index}", "prompt": prompt, "completion": chosen, "label": index % 2 == 0}
        if form == "implicit":
            return {"id": f"p{index}", "chosen": prompt + chosen, "rejected": prompt + rejected}
        return {"id": f"p{index}", "prompt": prompt, "chosen": chosen, "rejected": rejected}
    return ["{not json" if kind == "j" else json.dumps(made(index, kind)) for index, kind in enumerate(kinds)]


@pytest.mark.parametrize("form, workers", [("pairs", 1), ("implicit", 2), ("unpaired", 2)])
def test_a_preference_record_past_the_render_budget_fails_as_a_chat_record_does(models, tmp_path, small_budget,
                                                                                 form, workers):
    """Conversational preference records render in the same budgeted workers as chat records: the worker
    rendering line 3's completion ends at 1 CPU second, and the command fails there with the budget's code,
    naming the line, the template, the limit and its setting; nothing is written."""
    folder, _ = models["chatml"]
    (tmp_path / "boom.jinja").write_text(BOOM)
    path = tmp_path / "prefs.jsonl"
    path.write_text("\n".join(preference_lines("oobooo", form)) + "\n")
    for build, out in ((tokenize_dataset, "s"), (build_lengths, "l.jsonl")):
        error = expect(errors.CHAT_RENDER_BUDGET_EXCEEDED, build, path, folder, tmp_path / out, conversational=True,
                       chat_template=tmp_path / "boom.jinja", workers=workers, chunk_size=2,
                       **PREFERENCE_FIELDS[form])
        assert error.message == (f"{path} line 3 does not render with {tmp_path / 'boom.jinja'}: it used more than "
                                 "1 CPU seconds (UMLOS_CHAT_RENDER_CPU_S=1) (--skip-bad-lines skips such records "
                                 "and counts them)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["boom.jinja", "prefs.jsonl"]


@pytest.mark.parametrize("form", ["pairs", "unpaired"])
def test_preference_records_past_the_budget_are_skipped_in_line_order_like_lines_the_reader_refuses(
        models, tmp_path, small_budget, form):
    """With --skip-bad-lines, a preference record past the budget and one the template refuses are skipped and
    listed in line order among the lines the reader refuses; the store (ids, tokens, masks, fingerprint) is the
    one of the same file with those records not JSON."""
    folder, _ = models["chatml"]
    (tmp_path / "boom.jinja").write_text(BOOM)
    stores = {}
    for name, kinds in (("boom", "objotoo"), ("json", "ojjojoo")):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("\n".join(preference_lines(kinds, form)) + "\n")
        skipped = SkippedLines()
        store = tokenize_dataset(path, folder, tmp_path / f"store-{name}", conversational=True,
                                 chat_template=tmp_path / "boom.jinja", skipped=skipped, workers=2, chunk_size=2,
                                 **PREFERENCE_FIELDS[form])
        assert skipped.count == 3
        assert [message.split(" ", 3)[:3] for message in skipped.first] == [[str(path), "line", str(n)]
                                                                            for n in (2, 3, 5)]
        if name == "boom":
            assert "CPU seconds" in skipped.first[0] and "not JSON" in skipped.first[1]
            assert "unknown role tool" in skipped.first[2]
        stores[name] = {p.name: p.read_bytes() for p in (tmp_path / f"store-{name}").iterdir()}
        kept = ["p0", "p3", "p5", "p6"]
        rows = [f"{record}/{side}" for record in kept for side in ("chosen", "rejected")] if form == "pairs" else \
            [f"{record}/{'desirable' if int(record[1:]) % 2 == 0 else 'undesirable'}" for record in kept]
        assert store.length_cache().sample_ids == rows
    assert stores["boom"] == stores["json"]


def test_a_preference_shard_whose_ids_hang_on_its_content_keeps_the_records_that_render(models, tmp_path):
    """Pairs without ids in a sharded dataset are named by their shard's content, which a budgeted worker screens
    for the records that render (records/ids.py): a pair the template refuses is left out of it as a line that is
    not JSON is, and its rows keep the ids of the records around it."""
    folder, _ = models["chatml"]
    (tmp_path / "boom.jinja").write_text(BOOM)
    stores = {}
    for name, kinds in (("refused", "otoo"), ("not-json", "ojoo")):
        parts = []
        for shard, shard_kinds in enumerate((kinds, "ooo")):
            part = tmp_path / f"{name}-{shard}.jsonl"
            lines = [json.dumps({key: value for key, value in json.loads(line).items() if key != "id"})
                     if line.startswith("{\"") else line for line in preference_lines(shard_kinds, "pairs")]
            part.write_text("\n".join(lines) + "\n")
            parts.append(str(part))
        store = tokenize_dataset(parts, folder, tmp_path / f"store-{name}", conversational=True,
                                 chat_template=tmp_path / "boom.jinja", skipped=SkippedLines(),
                                 **PREFERENCE_FIELDS["pairs"])
        stores[name] = ({p.name: p.read_bytes() for p in (tmp_path / f"store-{name}").iterdir()},
                        store.length_cache().sample_ids)
    assert stores["refused"] == stores["not-json"]
    ids = stores["refused"][1]
    assert len(ids) == 12 and all(":" in row and row.endswith(("/chosen", "/rejected")) for row in ids)


@pytest.mark.parametrize("family", ["chatml", "generation"])
def test_records_with_nothing_to_train_on_are_refused_or_counted(models, family, tmp_path, capsys):
    """No assistant turn, or a role the template does not mark ("bot"): an all-zero loss mask, which was
    trained on silently as nothing; now a bad record, refused or skipped and counted alike in both files."""
    folder, _ = models[family]
    rows = chat_rows()
    rows[1] = {"id": "c1", "messages": CONVERSATIONS[0]}  # only a user turn
    rows[4] = {"id": "c4", "messages": [{"role": "user", "content": "hi"}, {"role": "bot", "content": "hello"}]}
    write_chats(tmp_path / "chat.jsonl", rows)
    error = expect(errors.DATASET_RECORD_INVALID, tokenize_dataset, tmp_path / "chat.jsonl", folder, tmp_path / "s",
                   messages_field="messages", mention="line 2 has 'messages' that has no assistant turn to train on "
                                                      "(its roles: 'user')")
    assert "rename the role, or drop the record" in error.message
    assert main(["data", "tokenize", "--dataset", str(tmp_path / "chat.jsonl"), "--tokenizer", str(folder),
                 "--output", str(tmp_path / "store"), "--messages-field", "messages", "--skip-bad-lines"]) == 0
    captured = capsys.readouterr()
    said = captured.out + captured.err
    assert "skipped 2 bad lines" in said and "(its roles: 'user')" in said
    # a role the template does not mark: trained on as nothing (ChatML), or refused by the template itself
    assert "(its roles: 'user', 'bot')" in said if family == "chatml" else "unknown role bot" in said
    skipped = SkippedLines()
    cache = build_lengths(tmp_path / "chat.jsonl", folder, tmp_path / "l.jsonl", messages_field="messages",
                          skipped=skipped)
    store = TokenStore.open(tmp_path / "store")
    assert skipped.count == 2 and cache.sample_ids == store.length_cache().sample_ids == \
        [r["id"] for i, r in enumerate(rows) if i not in (1, 4)]
    assert all(store.arrays(row)[1].any() for row in range(len(store)))  # every record kept trains on something


def test_messages_field_is_exclusive_and_chat_template_needs_it(models, tmp_path, capsys):
    folder, _ = models["chatml"]
    write_chats(tmp_path / "chat.jsonl", chat_rows())
    base = ["data", "lengths", "build", "--dataset", str(tmp_path / "chat.jsonl"), "--tokenizer", str(folder),
            "--output", str(tmp_path / "l.jsonl")]
    with pytest.raises(SystemExit):
        main(base + ["--messages-field", "messages", "--text-field", "text"])
    with pytest.raises(SystemExit):
        main(base + ["--chat-template", str(tmp_path / "t.jinja")])
    expect(errors.LENGTHS_INVALID, build_lengths, tmp_path / "chat.jsonl", folder, tmp_path / "l.jsonl",
           messages_field="messages", text_field="text")
    expect(errors.LENGTHS_INVALID, tokenize_dataset, tmp_path / "chat.jsonl", folder, tmp_path / "s",
           chat_template=tmp_path / "t.jinja")


def test_chat_template_option_overrides_the_tokenizers(models, tmp_path):
    folder, hf = models["chatml"]
    (tmp_path / "llama.jinja").write_text(LLAMA3)
    write_chats(tmp_path / "chat.jsonl", chat_rows())
    store = tokenize_dataset(tmp_path / "chat.jsonl", folder, tmp_path / "s", messages_field="messages",
                             chat_template=tmp_path / "llama.jinja")
    expected = hf.apply_chat_template(CONVERSATIONS[1], chat_template=LLAMA3)["input_ids"]
    assert store.arrays(0)[0].tolist() == expected  # row 0: the first conversation with an assistant turn
    # the store names the template it was rendered with: the tokenizer with that file as its chat_template.jinja
    shutil.copytree(folder, tmp_path / "with-llama")
    (tmp_path / "with-llama" / "chat_template.jinja").write_text(LLAMA3)
    assert store.tokenizer_hash == tokenizer_fingerprint(tmp_path / "with-llama") != tokenizer_fingerprint(folder)


def test_named_template_files_are_fingerprinted(models, tmp_path):
    folder, _ = models["chatml"]
    shutil.copytree(folder, tmp_path / "m")
    before = tokenizer_fingerprint(tmp_path / "m")
    (tmp_path / "m" / "additional_chat_templates").mkdir()
    (tmp_path / "m" / "additional_chat_templates" / "default.jinja").write_text(CHATML)
    assert tokenizer_fingerprint(tmp_path / "m") == before  # the same one template, spelled as a named one
    (tmp_path / "m" / "additional_chat_templates" / "tools.jinja").write_text(LLAMA3)
    assert tokenizer_fingerprint(tmp_path / "m") != before
    assert encode_chat(tmp_path / "m", CONVERSATIONS[1]).text == encode_chat(folder, CONVERSATIONS[1]).text
