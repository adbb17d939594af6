"""Chat records beside the peers: ``data tokenize --messages-field``, ``datasets.map(apply_chat_template)`` and
TRL's SFT preparation at the same worker count, in one run, their ids and masks compared on every record.

One dataset for every row: N conversations (bench/bench_chat_tokenize.py's:
1 to 4 user/assistant turns, a system message in a third of them) as JSONL,
and one byte-level BPE trained here, in two model folders that differ only in
their chat template:

* ChatML without markers, which ``data tokenize`` masks by the
  generation-prompt difference (one render of the conversation and two per
  assistant turn: docs/batching.md, "Chat records");
* the same ChatML with ``{% generation %}`` around each assistant turn's
  content and its ``<|im_end|>\\n``, the template both peers need for
  assistant masks (transformers 5 masks only generation blocks; TRL's
  ``assistant_only_loss`` takes a template with markers as it is). It renders
  the same text, and its blocks cover the characters the difference rule
  finds, so every row must give the same ids and masks.

Rows, each at every worker count W asked (default 1 and 2):

* ``umlos-cuda``: ``tokenize_dataset(..., messages_field="messages",
  workers=W)`` (what ``data tokenize --messages-field messages --workers W``
  runs), from the JSONL to a token store, once per template and per
  ``--checkout`` (bench/bench_chat_tokenize.py's child: the call alone timed);
* ``datasets.map``: ``Dataset.map(lambda r: tokenizer.apply_chat_template(
  r["messages"], tokenize=True, return_dict=True,
  return_assistant_tokens_mask=True), num_proc=W)`` on the dataset
  ``load_dataset("json")`` made of the same JSONL;
* ``TRL SFT``: ``SFTTrainer._prepare_dataset`` of that dataset, as
  ``SFTTrainer`` runs it on its ``train_dataset``, with
  ``SFTConfig(assistant_only_loss=True, dataset_num_proc=W, max_length=None)``
  (no truncation, so that every token can be compared), on a trainer built
  beforehand with a one-layer Llama and eight records.

For the peers only the map (or the preparation) is timed: the JSON to Arrow
conversion of ``load_dataset`` before it is left out (and printed), which
favours them. Each row runs in a child process, which reports wall-clock
seconds and the CPU seconds of itself and its workers; every child runs with
``TOKENIZERS_PARALLELISM=false``, so W workers encode on at most W cores
(``data tokenize`` with one worker otherwise lets it encode on every core).
The runs are interleaved (round r runs every row once: load from other jobs
falls on all alike) and each row keeps its best round. Before anything is
printed, each ``umlos-cuda`` store is compared byte for byte with the first
of its template, and every row's ids and masks (TRL's: its ``labels`` not
-100) with the first store's, record by record.

``--chunk-size`` is passed to ``tokenize_dataset`` (default: its own, 4,096
records, which 20,000 records cut in five chunks that two workers share
three to two).

    python bench/bench_chat_peers.py [--conversations 20000] [--workers 1 2] [--repeat 3] [--checkout .] \\
        [--chunk-size N]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np

from bench_chat_tokenize import CHATML, chat_files, chat_options, run_child, same_store  # bench/ is on sys.path
from bench_records import table

#: bench_chat_tokenize's ChatML, each assistant turn's content and end in a generation block: the same text.
GENERATION = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
              "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
              "{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\\n' }}"
              "{% generation %}{{ message['content'] + '<|im_end|>' + '\\n' }}{% endgeneration %}"
              "{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
              "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

#: What a peer's child runs: load the JSONL, time the map (or TRL's preparation) alone, save ids and masks.
PEER_CHILD = """
import json, os, resource, sys, time
import numpy as np, pyarrow.compute as pc, datasets, transformers
kind, dataset, model, out, scratch, workers = *sys.argv[1:6], int(sys.argv[6])
datasets.disable_progress_bars()
transformers.logging.set_verbosity_error()
def used():
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
def flat(done, name):
    column = done.data.column(name).combine_chunks()
    return column.flatten().to_numpy(zero_copy_only=False), pc.list_value_length(column).to_numpy()
if __name__ == "__main__":
    tokenizer = transformers.AutoTokenizer.from_pretrained(model)
    start = time.perf_counter()
    data = datasets.load_dataset("json", data_files=dataset, split="train", cache_dir=scratch)
    loaded = time.perf_counter() - start
    if kind == "map":
        cpu, start = used(), time.perf_counter()
        done = data.map(lambda r: tokenizer.apply_chat_template(r["messages"], tokenize=True, return_dict=True,
                                                                return_assistant_tokens_mask=True), num_proc=workers)
        seconds, cpu = time.perf_counter() - start, used() - cpu
        (ids, lengths), (mask, _) = flat(done, "input_ids"), flat(done, "assistant_masks")
    else:
        from trl import SFTConfig, SFTTrainer
        config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)
        args = SFTConfig(output_dir=os.path.join(scratch, "trainer"), assistant_only_loss=True,
                         dataset_num_proc=workers, max_length=None, report_to="none", bf16=False, use_cpu=True)
        trainer = SFTTrainer(model=transformers.LlamaForCausalLM(config), args=args,
                             train_dataset=data.select(range(8)), processing_class=tokenizer)
        cpu, start = used(), time.perf_counter()
        done = trainer._prepare_dataset(data, tokenizer, args, args.packing, None, "train")
        seconds, cpu = time.perf_counter() - start, used() - cpu
        (ids, lengths), (labels, _) = flat(done, "input_ids"), flat(done, "labels")
        mask = labels != -100
    np.save(os.path.join(out, "ids.npy"), ids)
    np.save(os.path.join(out, "mask.npy"), np.asarray(mask, dtype=np.uint8))
    np.save(os.path.join(out, "lengths.npy"), lengths)
    print(json.dumps({"seconds": seconds, "cpu": cpu, "samples": int(lengths.shape[0]), "load": loaded}))
"""

PEERS = {"map": "datasets.map", "trl": "TRL SFT"}


def run_peer(kind: str, dataset: str, model: str, output: str, workers: int) -> dict:
    """One peer row in a child process (its Hugging Face caches under ``output``, made afresh)."""
    shutil.rmtree(output, ignore_errors=True)
    scratch = os.path.join(output, "scratch")
    os.makedirs(scratch)
    env = dict(os.environ, HF_DATASETS_CACHE=scratch, HF_HOME=scratch, HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-c", PEER_CHILD, kind, dataset, model, output, scratch, str(workers)],
                          env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{PEERS[kind]} workers={workers} failed:\n{done.stderr[-3000:]}")
    shutil.rmtree(scratch, ignore_errors=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def store_arrays(folder: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A token store's ids, loss mask and record lengths."""
    from umlos_cuda.batching import TokenStore

    store = TokenStore.open(folder)
    return np.asarray(store.tokens), np.asarray(store.loss_mask_array), np.diff(np.asarray(store.offsets))


def differing(reference: tuple, got: tuple) -> tuple[int, int]:
    """``(records whose ids differ, records whose masks differ)`` between two ``(ids, mask, lengths)``."""
    ids, mask, lengths = reference
    other_ids, other_mask, other_lengths = got
    if lengths.shape != other_lengths.shape:
        return len(lengths), len(lengths)
    if np.array_equal(lengths, other_lengths) and np.array_equal(ids, other_ids) and \
            np.array_equal(mask, other_mask):
        return 0, 0
    bad_ids = bad_masks = 0
    starts, other_starts = np.cumsum(lengths) - lengths, np.cumsum(other_lengths) - other_lengths
    for start, length, other, other_length in zip(starts, lengths, other_starts, other_lengths):
        here, there = slice(start, start + length), slice(other, other + other_length)
        bad_ids += not np.array_equal(ids[here], other_ids[there])
        bad_masks += not np.array_equal(mask[here], other_mask[there])
    return bad_ids, bad_masks


def main() -> None:
    args = chat_options(__doc__.split("\n\n")[0], "bench-chat-peers-")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # every child: W workers, W cores at most
    checkouts, folder = args.checkout, args.folder
    try:
        chats, models, dataset = chat_files(folder, args.conversations, args.vocab,
                                            {"no markers": CHATML, "generation": GENERATION})
        turns = sum(sum(m["role"] == "assistant" for m in chat) for chat in chats)
        rows = [("umlos-cuda", checkout, template, workers) for checkout in checkouts for template in models
                for workers in args.workers]
        rows += [(PEERS[kind], kind, "generation", workers) for kind in PEERS for workers in args.workers]
        best: dict[tuple, dict] = {}
        first_stores: dict[str, str] = {}
        reference = None
        equal: dict[tuple, tuple[int, int]] = {}
        for _ in range(args.repeat):
            for row in rows:
                system, where, template, workers = row
                output = os.path.join(folder, f"out-{rows.index(row)}")
                if system == "umlos-cuda":
                    got = run_child(where, dataset, models[template], output, workers, args.chunk_size)
                    if template not in first_stores:
                        first_stores[template] = output + "-first"
                        shutil.copytree(output, first_stores[template])
                    elif not same_store(first_stores[template], output):
                        raise SystemExit(f"{where} {template} workers={workers} wrote another store than the first")
                    arrays = store_arrays(output)
                else:
                    got = run_peer(where, dataset, models[template], output, workers)
                    arrays = tuple(np.load(os.path.join(output, f"{name}.npy")) for name in ("ids", "mask", "lengths"))
                reference = reference or arrays
                equal[row] = differing(reference, arrays)
                if row not in best or got["seconds"] < best[row]["seconds"]:
                    best[row] = got
        fastest_peer = {w: min(best[r]["seconds"] for r in rows if r[0] != "umlos-cuda" and r[3] == w)
                        for w in args.workers}
        print(f"{args.conversations:,} conversations ({turns:,} assistant turns), {os.cpu_count()} cores, "
              f"TOKENIZERS_PARALLELISM=false; best of {args.repeat} interleaved rounds; load average "
              f"{', '.join(f'{x:.2f}' for x in os.getloadavg())} at the end; the peers' load_dataset (not timed): "
              f"{min(best[r].get('load', 0) for r in rows if r[0] != 'umlos-cuda'):.2f} s at best")
        table("chat records to ids and assistant masks",
              ("path", "template", "workers", "seconds", "records/s", "CPU s", "faster peer / this",
               "records whose ids, masks differ from the first row's"),
              [(system if system != "umlos-cuda" or len(checkouts) == 1 else f"umlos-cuda {where}", template,
                workers, f"{best[row]['seconds']:.2f}", f"{args.conversations / best[row]['seconds']:,.0f}",
                f"{best[row]['cpu']:.2f}", f"{fastest_peer[workers] / best[row]['seconds']:.2f}x",
                f"{equal[row][0]}, {equal[row][1]}") for row in rows for system, where, template, workers in [row]])
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
