"""Preference data and TRL's own tokenization of it, for the tests of conversational preference records.

Template families (small local templates, no download): ``chatml`` (content a
string or text parts), ``generation`` (``{% generation %}`` markers, text
parts), ``zephyr`` (HuggingFaceH4's, strings only) and ``thinking`` (a
generation prompt that opens an empty thought block the finished turn does
not have, so the prompt alone is no prefix of prompt + completion and TRL's
common-prefix rule decides where the completion starts).

``records(form, count, seed, parts)`` generates records of each form TRL
takes: ``pairs`` (prompt, chosen, rejected), ``implicit`` (chosen and
rejected conversations sharing their first messages) and ``unpaired``
(prompt, completion, label). ``trl_rows(form, records, hf)`` runs TRL's
``DPOTrainer._prepare_dataset`` / ``KTOTrainer._prepare_dataset`` and its
collator on them and returns each row's ``(input_ids, completion_mask)``,
in the store's row order (a pair's chosen row, then its rejected row).
``equality(...)`` compares a token store with them, row by row.
"""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

from batching_cases import WORDS, train_tokenizer, write_model_dir

CONTENT = ("{% macro text(c) %}{% if c is string %}{{ c }}{% else %}{% for p in c %}{% if p['type'] == 'text' %}"
           "{{ p['text'] }}{% endif %}{% endfor %}{% endif %}{% endmacro %}")
CHATML = (CONTENT + "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
          "{{ text(message['content']) }}{{ '<|im_end|>\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
GENERATION = (CONTENT + "{% for message in messages %}{% if message['role'] == 'assistant' %}"
              "{{ '<|assistant|>\\n' }}{% generation %}{{ text(message['content']) + eos_token }}{% endgeneration %}"
              "{{ '\\n' }}{% else %}"
              "{{ '<|' + message['role'] + '|>\\n' + text(message['content']) + eos_token + '\\n' }}{% endif %}"
              "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")
ZEPHYR = ("{% for message in messages %}\n{% if message['role'] == 'user' %}\n"
          "{{ '<|user|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n"
          "{{ '<|system|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n"
          "{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n"
          "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}")
THINKING = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] }}"
            "{{ '<|im_end|>\\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}{% endif %}")

CHATML_TOKENS = (["<|im_start|>", "<|im_end|>", "<|endoftext|>"], {"eos_token": "<|im_end|>",
                                                                    "pad_token": "<|endoftext|>"})
ZEPHYR_TOKENS = (["<|system|>", "<|user|>", "<|assistant|>"], {"eos_token": "</s>", "unk_token": "<unk>"})
#: family -> (template, special tokens added, tokenizer_config.json tokens, whether it reads text parts)
FAMILIES = {"chatml": (CHATML, *CHATML_TOKENS, True), "generation": (GENERATION, *ZEPHYR_TOKENS, True),
            "zephyr": (ZEPHYR, *ZEPHYR_TOKENS, False), "thinking": (THINKING, *CHATML_TOKENS, False)}
FORMS = ("pairs", "implicit", "unpaired")
#: The fields of each form in the records below, as tokenize_dataset takes them.
FIELDS = {"pairs": {"prompt_field": "prompt", "chosen_field": "chosen", "rejected_field": "rejected"},
          "implicit": {"chosen_field": "chosen", "rejected_field": "rejected"},
          "unpaired": {"prompt_field": "prompt", "completion_field": "completion", "label_field": "label"}}
PHRASES = [*WORDS, "<think>", "\n", "  ", "Hello!", "2 + 2 = 4", "what?"]


def write_family(folder, family: str):
    """A model folder: a byte-level BPE trained here, the family's special tokens and its template."""
    template, specials, tokens, _parts = FAMILIES[family]
    tokenizer = train_tokenizer(vocab_size=600)
    tokenizer.add_special_tokens(specials)
    return write_model_dir(folder, tokenizer, {"tokenizer_class": "PreTrainedTokenizerFast",
                                               "chat_template": template, **tokens})


def family_models(root) -> dict:
    """Each family's model folder under ``root`` and its ``transformers`` tokenizer: family -> (folder, hf)."""
    import transformers

    return {family: (write_family(root / family, family),
                     transformers.AutoTokenizer.from_pretrained(str(root / family), local_files_only=True))
            for family in FAMILIES}


def _say(rng: random.Random, low: int = 1, high: int = 12) -> str:
    text = " ".join(rng.choice(PHRASES) for _ in range(rng.randint(low, high)))
    return text if rng.random() < 0.8 else " " + text  # a leading space: a token boundary that may merge


def _content(rng: random.Random, parts: bool):
    if not parts:
        return _say(rng)
    return [{"type": "text", "text": _say(rng)} for _ in range(rng.randint(1, 3))]


def _prompt(rng: random.Random, parts: bool) -> list[dict]:
    messages = [{"role": "system", "content": _content(rng, parts)}] if rng.random() < 0.3 else []
    for _ in range(rng.randint(0, 2)):
        messages += [{"role": "user", "content": _content(rng, parts)},
                     {"role": "assistant", "content": _content(rng, parts)}]
    return messages + [{"role": "user", "content": _content(rng, parts)}]


def _completion(rng: random.Random, parts: bool) -> list[dict]:
    turns = [{"role": "assistant", "content": _content(rng, parts)}]
    if rng.random() < 0.15:  # a completion of several turns
        turns += [{"role": "user", "content": _content(rng, parts)},
                  {"role": "assistant", "content": _content(rng, parts)}]
    return turns


def records(form: str, count: int, seed: int, parts: bool = False) -> list[dict]:
    """``count`` records of ``form`` (module docstring), ids ``r0``, ``r1``, ..."""
    rng = random.Random(seed)
    out = []
    for index in range(count):
        prompt = _prompt(rng, parts)
        if form == "unpaired":
            record = {"prompt": prompt, "completion": _completion(rng, parts), "label": rng.random() < 0.5}
        else:
            chosen, rejected = _completion(rng, parts), _completion(rng, parts)
            if rng.random() < 0.05:  # the same completion twice: extract_prompt's cut one message earlier
                rejected = chosen
            record = {"prompt": prompt, "chosen": chosen, "rejected": rejected}
            if form == "implicit":
                record = {"chosen": prompt + chosen, "rejected": prompt + rejected}
        out.append({"id": f"r{index}", **record})
    return out


def write_jsonl(path, rows: list[dict]):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def trl_rows(form: str, rows: list[dict], hf) -> list[tuple[list[int], list[int]]]:
    """TRL's ``(input_ids, completion_mask)`` of each row: ``_prepare_dataset`` of its trainer, then its collator."""
    from datasets import Dataset
    from trl.trainer.dpo_trainer import DataCollatorForPreference, DPOTrainer
    from trl.trainer.kto_trainer import DataCollatorForUnpairedPreference, KTOTrainer

    trainer = SimpleNamespace(_tokenizer=hf, calculate_KL=False, desirable_weight=1.0, undesirable_weight=1.0)
    args = SimpleNamespace(dataset_num_proc=None, max_length=None, truncation_mode="keep_start",
                           per_device_train_batch_size=8)
    dataset = Dataset.from_list([{key: value for key, value in row.items() if key != "id"} for row in rows])
    out: list[tuple[list[int], list[int]]] = []
    if form == "unpaired":
        prepared = KTOTrainer._prepare_dataset(trainer, dataset, hf, args, "eval")
        collate = DataCollatorForUnpairedPreference(pad_token_id=0)
        keys = ("prompt_ids", "completion_ids", "label")
    else:
        prepared = DPOTrainer._prepare_dataset(trainer, dataset, hf, args, "eval")
        collate = DataCollatorForPreference(pad_token_id=0)
        keys = ("prompt_ids", "chosen_ids", "rejected_ids")
    for example in prepared:
        batch = collate([{key: example[key] for key in keys}])
        for side in range(batch["input_ids"].shape[0]):  # DPO: chosen then rejected
            width = int(batch["attention_mask"][side].sum())
            out.append((batch["input_ids"][side][:width].tolist(), batch["completion_mask"][side][:width].tolist()))
    return out


def equality(store, expected: list[tuple[list[int], list[int]]]) -> tuple[int, int]:
    """``(rows compared, rows equal)``: each store row's ids and loss mask against TRL's, in order."""
    equal = 0
    for row, (ids, mask) in enumerate(expected):
        ours_ids, ours_mask = store.arrays(row)
        equal += ours_ids.tolist() == ids and ours_mask.tolist() == mask
    return max(len(expected), len(store)), equal
