"""Chat records: records/s of ``data tokenize --messages-field`` (or ``--conversational`` pairs) for two
checkouts, side by side.

One run, one dataset and one model folder for every row of the table: N
conversations (1 to 4 user/assistant turns, a system message in a third of
them, Zipf-like words: bench/bench_records.py) written as JSONL, a byte-level
BPE trained here (bench/bench_lengths.py) and a ChatML template without
``{% generation %}`` markers (the generation-prompt difference: one render of
the conversation and two per assistant turn, the common and the costly case).
Each checkout given with ``--checkout`` (default: this one) tokenizes it with
``tokenize_dataset(..., messages_field="messages", workers=W)`` for each W
asked, in a child process that runs in that checkout with it as its
``PYTHONPATH`` (``python -c`` puts its working folder first on ``sys.path``:
a child run from another checkout would import that one, which the child
checks), so two versions of the package run on the same machine in the same
run (``--checkout /path/to/main --checkout .`` compares a change with main).
The child times the call alone (not the interpreter's start nor its imports)
and reports the CPU seconds it and its workers used. ``--pairs`` makes each conversation a
conversational preference pair instead (TRL's form: the prompt is the
conversation up to its last assistant turn, chosen that turn, rejected the
last assistant turn of the next conversation), tokenized with
``conversational=True`` and the prompt, chosen and rejected fields: three
renders a record (the prompt with the generation prompt, prompt + each
completion), two rows. The runs are interleaved (round r runs
every row once, so load from other jobs falls on all alike); each row keeps
its best round. Every store is compared byte for byte with the first before
any time is printed: a change that is faster and different is not faster.

    python bench/bench_chat_tokenize.py [--conversations 20000] [--workers 1 2] [--repeat 3] [--pairs] \\
        [--checkout /work/main --checkout .] [--chunk-size N]
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

from bench_lengths import train_tokenizer  # bench/ is on sys.path when a script in it runs
from bench_records import make_texts, table

CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
          "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

#: What the child runs: time tokenize_dataset alone, print wall and CPU seconds (its own and its workers').
CHILD = """
import json, os, resource, sys, time
import umlos_cuda
from umlos_cuda.batching.tokens.writer import tokenize_dataset
assert os.path.samefile(os.path.dirname(os.path.dirname(umlos_cuda.__file__)), os.getcwd()), umlos_cuda.__file__
dataset, model, output, workers, chunk, options = *sys.argv[1:4], int(sys.argv[4]), *sys.argv[5:7]
def used():
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
if __name__ == "__main__":
    cpu, start = used(), time.perf_counter()
    chunks = {} if chunk == "default" else {"chunk_size": int(chunk)}
    store = tokenize_dataset(dataset, model, output, workers=workers, **chunks, **json.loads(options))
    print(json.dumps({"seconds": time.perf_counter() - start, "cpu": used() - cpu, "samples": store.num_samples}))
"""


def conversations(count: int, seed: int = 5) -> list[list[dict]]:
    rng = random.Random(seed)
    texts = make_texts(4 * count, seed=seed)
    out = []
    for i in range(count):
        messages = [{"role": "system", "content": "you answer briefly"}] if i % 3 == 0 else []
        for turn in range(rng.randint(1, 4)):
            messages.append({"role": "user", "content": texts[(8 * i + 2 * turn) % len(texts)][:400]})
            messages.append({"role": "assistant", "content": texts[(8 * i + 2 * turn + 1) % len(texts)][:600]})
        out.append(messages)
    return out


#: The tokenize_dataset options of each kind of record: chat records, or conversational pairs (--pairs).
OPTIONS = {"chat": {"messages_field": "messages"},
           "pairs": {"conversational": True, "prompt_field": "prompt", "chosen_field": "chosen",
                     "rejected_field": "rejected"}}


def records(chats: list[list[dict]], pairs: bool) -> list[dict]:
    """The JSONL records: each conversation as a chat record, or (``pairs``) as a conversational pair."""
    if not pairs:
        return [{"id": f"chat-{i}", "messages": chat} for i, chat in enumerate(chats)]
    return [{"id": f"pair-{i}", "prompt": chat[:-1], "chosen": chat[-1:], "rejected": chats[(i + 1) % len(chats)][-1:]}
            for i, chat in enumerate(chats)]


def run_child(checkout: str, dataset: str, model: str, output: str, workers: int, chunk_size: int | None = None,
              kind: str = "chat") -> dict:
    """``tokenize_dataset`` timed in a child that imports ``checkout``'s package: run in that folder, since
    ``python -c`` puts its working folder before ``PYTHONPATH`` on ``sys.path``."""
    checkout = os.path.abspath(checkout)
    env = dict(os.environ, PYTHONPATH=checkout)
    shutil.rmtree(output, ignore_errors=True)
    done = subprocess.run([sys.executable, "-c", CHILD, *map(os.path.abspath, (dataset, model, output)),
                           str(workers), str(chunk_size or "default"), json.dumps(OPTIONS[kind])],
                          env=env, cwd=checkout, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{checkout} workers={workers} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def same_store(a: str, b: str) -> bool:
    names = sorted(os.listdir(a))
    return names == sorted(os.listdir(b)) and all(filecmp.cmp(os.path.join(a, n), os.path.join(b, n), shallow=False)
                                                  for n in names if os.path.isfile(os.path.join(a, n)))


def chat_options(description: str, prefix: str) -> argparse.Namespace:
    """The options of the chat benches (this one, bench_chat_peers.py); ``checkout`` defaults to this checkout,
    ``folder`` to a new temporary folder named ``prefix``..., removed at the end (``keep`` False)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--conversations", type=int, default=20_000)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--checkout", action="append", default=None,
                        help="a checkout whose umlos_cuda to time (repeatable; default: this one)")
    parser.add_argument("--chunk-size", type=int, default=None, help="records a chunk (default: data tokenize's)")
    parser.add_argument("--folder", default=None)
    parser.add_argument("--pairs", action="store_true", help="conversational preference pairs instead of chat records")
    args = parser.parse_args()
    args.checkout = args.checkout or [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    args.keep = args.folder is not None
    args.folder = args.folder or tempfile.mkdtemp(prefix=prefix)
    return args


def chat_files(folder: str, count: int, vocab: int, templates: dict[str, str]) -> tuple[list, dict[str, str], str]:
    """:func:`conversations` as ``chat.jsonl`` in ``folder``, and a byte-level BPE trained on them in one model
    folder per chat template: ``(conversations, {name: model folder}, dataset path)``."""
    chats = conversations(count)
    tokenizer = train_tokenizer([m["content"] for chat in chats[:3000] for m in chat], vocab)
    tokenizer.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    models = {}
    for name, template in templates.items():
        models[name] = os.path.join(folder, name.replace(" ", "-"))
        os.makedirs(models[name], exist_ok=True)
        tokenizer.save(os.path.join(models[name], "tokenizer.json"))
        with open(os.path.join(models[name], "tokenizer_config.json"), "w", encoding="utf-8") as handle:
            json.dump({"chat_template": template, "eos_token": "<|im_end|>",
                       "tokenizer_class": "PreTrainedTokenizerFast"}, handle)
    dataset = os.path.join(folder, "chat.jsonl")
    with open(dataset, "w", encoding="utf-8") as handle:
        for i, chat in enumerate(chats):
            handle.write(json.dumps({"id": f"chat-{i}", "messages": chat}) + "\n")
    return chats, models, dataset


def main() -> None:
    args = chat_options(__doc__.split("\n\n")[0], "bench-chat-")
    checkouts, folder = args.checkout, args.folder
    try:
        chats, models, dataset = chat_files(folder, args.conversations, args.vocab, {"model": CHATML})
        model = models["model"]
        if args.pairs:
            dataset = os.path.join(folder, "pairs.jsonl")
            with open(dataset, "w", encoding="utf-8") as handle:
                for record in records(chats, True):
                    handle.write(json.dumps(record) + "\n")
        turns = sum(sum(m["role"] == "assistant" for m in chat) for chat in chats)
        rows = [(checkout, workers) for checkout in checkouts for workers in args.workers]
        best: dict[tuple[str, int], dict] = {}
        first_store = None
        for _ in range(args.repeat):
            for checkout, workers in rows:
                output = os.path.join(folder, f"store-{rows.index((checkout, workers))}")
                got = run_child(checkout, dataset, model, output, workers, args.chunk_size,
                                "pairs" if args.pairs else "chat")
                if first_store is None:
                    first_store = output + "-first"
                    shutil.copytree(output, first_store)
                elif not same_store(first_store, output):
                    raise SystemExit(f"{checkout} workers={workers} wrote another store than {rows[0]}")
                if (checkout, workers) not in best or got["seconds"] < best[(checkout, workers)]["seconds"]:
                    best[(checkout, workers)] = got
        what = f"{args.conversations:,} conversational pairs" if args.pairs else \
            f"{args.conversations:,} conversations ({turns:,} assistant turns)"
        print(f"{what}, ChatML without markers, {os.cpu_count()} cores; best of {args.repeat} interleaved rounds; "
              "every store identical")
        command = "data tokenize --conversational (prompt, chosen, rejected)" if args.pairs else \
            "data tokenize --messages-field messages"
        table(command, ("checkout", "workers", "seconds", "records/s", "CPU s"),
              [(checkout, workers, f"{best[(checkout, workers)]['seconds']:.2f}",
                f"{args.conversations / best[(checkout, workers)]['seconds']:,.0f}",
                f"{best[(checkout, workers)]['cpu']:.2f}") for checkout, workers in rows])
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
