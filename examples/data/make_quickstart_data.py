"""Make the small inputs of docs/quickstart.md, so that it needs nothing downloaded.

Run from the repository root (it replaces the files it makes)::

    python examples/data/make_quickstart_data.py                  # into examples/data/
    python examples/data/make_quickstart_data.py --output DIR     # anywhere else

Everything comes from a few seeded ``random.Random`` draws over the tiny
vocabularies below, so every run writes the same rows; a team's own data
takes their place in the quickstart's commands. What it writes, each in the
form the quickstart reads:

* ``chat-train.parquet`` (400 conversations) and ``chat-validation.parquet``
  (60): an assistant's chat data, one row a conversation: ``id`` and
  ``messages``, a list of ``{role, content}`` structs (``system``, ``user``,
  ``assistant``; some conversations have two turns). Capitals, reversing and
  sorting short lists, counting words, greetings: answers a 2-layer model
  learns in a few dozen steps, so that the validation loss visibly falls.
* ``math-train.parquet`` (240 conversations): a second chat dataset of the
  same schema (small sums, differences and products), for the quickstart's
  two-dataset mixture.
* ``preferences.parquet`` (200 records): ``id``, ``prompt``, ``chosen``,
  ``rejected`` in TRL's conversational form, each a list of ``{role,
  content}`` structs: the prompt one user message, chosen and rejected one
  assistant message each; ``data tokenize --conversational --prompt-field
  prompt --chosen-field chosen --rejected-field rejected`` reads it (the
  rejected answer names a wrong capital, a wrong number or a rude reply).
* ``corpus.jsonl`` (400 documents): ``id`` and ``text``, plain sentences of a
  tiny grammar, for pretraining.
* ``tokenizer/``: a byte-level BPE tokenizer of 512 ids trained on all of the
  above (``tokenizer.json``) and its ``tokenizer_config.json``: a ChatML chat
  template, ``eos_token`` ``<|im_end|>`` (id 2), ``pad_token``
  ``<|endoftext|>`` (id 0), and ``PreTrainedTokenizerFast`` as its class, so
  ``transformers.AutoTokenizer`` loads the folder too.
* ``generated-with.json``: the versions of pyarrow and tokenizers that wrote
  these bytes (a Parquet file names its writer's version inside it).

``tests/test_quickstart.py`` runs this script into a temporary folder and
compares what it makes with the files here: byte for byte under the versions
``generated-with.json`` names, the rows and the tokenizer's model under any
other. Every file is written through the project's atomic writer.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import sys

from umlos_cuda.files.writer import atomic_output

HERE = os.path.dirname(os.path.abspath(__file__))

#: ChatML, as Qwen's and many other chat models' templates write it.
CHATML = ("{% for message in messages %}"
          "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 512

CAPITALS = {"France": "Paris", "Spain": "Madrid", "Italy": "Rome", "Germany": "Berlin", "Japan": "Tokyo",
            "Egypt": "Cairo", "Canada": "Ottawa", "Peru": "Lima", "Kenya": "Nairobi", "Norway": "Oslo",
            "Chile": "Santiago", "Greece": "Athens", "Poland": "Warsaw", "Portugal": "Lisbon",
            "Ireland": "Dublin", "Austria": "Vienna", "Cuba": "Havana", "Thailand": "Bangkok"}
WORDS = ["red", "green", "blue", "apple", "pear", "plum", "cat", "dog", "fox", "river", "hill", "tree", "stone",
         "cloud", "rain", "sun"]
SYSTEM = ["You are a helpful assistant.", "Answer briefly."]
GREETINGS = [("Hello!", "Hello! How can I help you today?"), ("Hi there.", "Hi! What can I do for you?"),
             ("Thank you!", "You are welcome."), ("Good morning.", "Good morning! How can I help?")]


def capital(rng: random.Random) -> tuple[str, str]:
    country = rng.choice(sorted(CAPITALS))
    ask = rng.choice(["What is the capital of {}?", "Which city is the capital of {}?", "Capital of {}?"])
    return ask.format(country), f"The capital of {country} is {CAPITALS[country]}."


def reverse(rng: random.Random) -> tuple[str, str]:
    words = rng.sample(WORDS, rng.randint(2, 5))
    return f"Reverse these words: {' '.join(words)}", " ".join(reversed(words))


def sort_numbers(rng: random.Random) -> tuple[str, str]:
    numbers = [rng.randint(0, 99) for _ in range(rng.randint(2, 6))]
    return f"Sort these numbers: {' '.join(map(str, numbers))}", " ".join(map(str, sorted(numbers)))


def count_words(rng: random.Random) -> tuple[str, str]:
    words = [rng.choice(WORDS) for _ in range(rng.randint(1, 7))]
    return f"How many words are in: {' '.join(words)}?", "There is 1 word." if len(words) == 1 else \
        f"There are {len(words)} words."


def greeting(rng: random.Random) -> tuple[str, str]:
    return rng.choice(GREETINGS)


def arithmetic(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(0, 20), rng.randint(0, 20)
    op = rng.choice(["plus", "minus", "times"])
    if op == "minus" and b > a:
        a, b = b, a
    value = {"plus": a + b, "minus": a - b, "times": a * b}[op]
    return f"What is {a} {op} {b}?", f"{a} {op} {b} is {value}."


def conversation(rng: random.Random, tasks: list) -> list[dict[str, str]]:
    """One to two user/assistant turns, a system message one time in three."""
    messages = [{"role": "system", "content": rng.choice(SYSTEM)}] if rng.random() < 1 / 3 else []
    for _ in range(1 if rng.random() < 0.7 else 2):
        question, answer = rng.choice(tasks)(rng)
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return messages


def chats(prefix: str, count: int, seed: int, tasks: list) -> list[dict]:
    rng = random.Random(seed)
    return [{"id": f"{prefix}-{i:04d}", "messages": conversation(rng, tasks)} for i in range(count)]


def preferences(count: int, seed: int) -> list[dict]:
    """A question, the right answer and a wrong (or rude) one, as strings (:func:`conversational` makes the
    bundled rows of them; the tokenizer trains on the strings)."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        kind = rng.choice(["capital", "arithmetic", "greeting"])
        if kind == "capital":
            prompt, chosen = capital(rng)
            country = prompt.split()[-1].rstrip("?")
            wrong = rng.choice(sorted(set(CAPITALS.values()) - {CAPITALS[country]}))
            rejected = f"The capital of {country} is {wrong}."
        elif kind == "arithmetic":
            prompt, chosen = arithmetic(rng)
            head, value = chosen[:-1].rsplit(" is ", 1)
            rejected = f"{head} is {int(value) + rng.choice([-3, -2, -1, 1, 2, 3])}."
        else:
            prompt, chosen = greeting(rng)
            rejected = rng.choice(["Whatever.", "Go away.", "I do not care."])
        rows.append({"id": f"pref-{i:04d}", "prompt": prompt, "chosen": chosen, "rejected": rejected})
    return rows


def conversational(pair: dict) -> dict:
    """``pair`` in TRL's conversational preference form: the prompt a user message, each answer an assistant's."""
    return {"id": pair["id"], "prompt": [{"role": "user", "content": pair["prompt"]}],
            "chosen": [{"role": "assistant", "content": pair["chosen"]}],
            "rejected": [{"role": "assistant", "content": pair["rejected"]}]}


def corpus(count: int, seed: int) -> list[dict]:
    """Documents of 2 to 12 sentences of a tiny grammar."""
    rng = random.Random(seed)
    adjectives = ["small", "quick", "old", "red", "quiet", "bright"]
    nouns = ["fox", "dog", "cat", "bird", "river", "tree", "robot"]
    verbs = ["sees", "finds", "follows", "hears", "watches"]
    places = ["near the hill", "by the river", "under the tree", "at night"]

    def sentence() -> str:
        return (f"the {rng.choice(adjectives)} {rng.choice(nouns)} {rng.choice(verbs)} the {rng.choice(adjectives)} "
                f"{rng.choice(nouns)} {rng.choice(places)} .")

    return [{"id": f"doc-{i:04d}", "text": " ".join(sentence() for _ in range(rng.randint(2, 12)))}
            for i in range(count)]


def chatml(messages: list[dict[str, str]]) -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def tokenizer_json(texts: list[str]) -> str:
    """A byte-level BPE trained on ``texts`` (training is deterministic for the same texts in the same order)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return tokenizer.to_str(pretty=True)


def parquet_bytes(rows: list[dict], schema) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), sink)
    return sink.getvalue()


def json_bytes(value) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True) + "\n").encode()


def make(output: str) -> list[str]:
    """Write every file into ``output`` (made if missing); return their paths relative to it."""
    import pyarrow as pa
    import tokenizers

    chat_tasks = [capital, reverse, sort_numbers, count_words, greeting]
    data = {"chat-train": chats("chat", 400, 1, chat_tasks), "chat-validation": chats("chat-val", 60, 2, chat_tasks),
            "math-train": chats("math", 240, 3, [arithmetic])}
    pairs, documents = preferences(200, 4), corpus(400, 5)
    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    chat_schema = pa.schema([("id", pa.string()), ("messages", pa.list_(message))])
    pair_schema = pa.schema([("id", pa.string())] + [(name, pa.list_(message)) for name in ("prompt", "chosen",
                                                                                            "rejected")])
    texts = [chatml(row["messages"]) for rows in data.values() for row in rows]
    texts += [f"{p['prompt']} {p['chosen']} {p['rejected']}" for p in pairs] + [d["text"] for d in documents]
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHATML, "eos_token": "<|im_end|>",
              "pad_token": "<|endoftext|>", "model_max_length": 2048}
    files = {f"{name}.parquet": parquet_bytes(rows, chat_schema) for name, rows in data.items()}
    files["preferences.parquet"] = parquet_bytes([conversational(pair) for pair in pairs], pair_schema)
    files["corpus.jsonl"] = "".join(json.dumps(d) + "\n" for d in documents).encode()
    files["tokenizer/tokenizer.json"] = tokenizer_json(texts).encode()
    files["tokenizer/tokenizer_config.json"] = json_bytes(config)
    files["generated-with.json"] = json_bytes({"pyarrow": pa.__version__, "tokenizers": tokenizers.__version__})
    for name, payload in files.items():
        os.makedirs(os.path.join(output, os.path.dirname(name)), exist_ok=True)
        with atomic_output(os.path.join(output, name), force=True, size=len(payload)) as handle:
            handle.write(payload)
    return sorted(files)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default=HERE, help="the folder to write into (default: examples/data)")
    args = parser.parse_args(argv)
    for name in make(args.output):
        print(os.path.join(args.output, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
