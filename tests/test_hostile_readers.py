"""Hostile inputs for every reader of the LLM stack: hangs, unbounded memory, raw tracebacks.

The issue "Nothing lost, nothing trusted blindly" found that a FIFO in a plan
or batch folder hangs the commands that read it, that whole files and whole
lines are read into memory, that headers are trusted for sizes, that a
puzzle server can flood the client, and that deep JSON or YAML and wrong
field types escape as raw tracebacks. Each case here builds one such input
next to a copy of a real artifact and runs the command (or, for readers
without one, a Python snippet) in a fenced child (tests/hostile_support.py):
the verdict is a documented refusal naming the file, inside the memory,
CPU and time limits, with nothing outside the case's folder touched.

Case ids start with their class: ``hang/`` (the reader must stay bounded in
time and memory: FIFOs, sparse multi-gigabyte files, lines and headers that
ask for more than the file holds, giant world sizes, a flooding server) and
``traceback/`` (deep JSON in each JSON reader, deep YAML, wrong field types,
bad command-line values). The inputs are made here, in a temporary folder;
the only network use is 127.0.0.1 servers on free ports that stop
themselves.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import socket
import struct
import threading
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable

import numpy as np
import pytest

import hostile_support as hs
import streams_support
from umlos_cuda import errors

#: A hang case must finish well inside this (a bounded reader of these small files takes about a second).
WALL_S = 40
#: Sparse files: gigabytes of zeros that cost no disk, more than the children's address space.
SPARSE_BYTES = 4 << 30
DEEP = 100_000


# ---------------------------------------------------------------------- the artifacts copied by each case
@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    return build_world(tmp_path_factory.mktemp("hostile-world"))


def build_world(root: Path) -> Path:
    """Under ``root``: a model directory, a dataset, its length cache, its token store, a plan (with sample ids,
    binary and JSONL), its batch folder in each layout (compact, npz, compact + zstd, index), the batch folder
    of a mixed plan of two components over the store (batches-mixed: format 3), a saved batch fingerprint, a
    Megatron pair, pretraining sequences and their mixture, a sharded store (and a staged shard), a window log,
    a windowed plan and a mixed plan over the length cache's sidecar, all valid
    (tests/test_hostile_values.py walks the same artifacts)."""
    from batching_cases import train_tokenizer, write_model_dir
    from token_cases import random_sequences, write_dataset, write_megatron
    from umlos_cuda.batching import BatchingConfig, BatchPlanBuilder, save_plan
    from umlos_cuda.batching.batches.fingerprint import fingerprint_plan_batches
    from umlos_cuda.batching.batches.writer import BatchWriter
    from umlos_cuda.batching.tokens.writer import tokenize_dataset

    write_model_dir(root / "model", train_tokenizer(), {"eos_token": "</s>"})
    write_dataset(root / "train.jsonl", 60, seed=3)
    store = tokenize_dataset(root / "train.jsonl", root / "model", root / "store")
    store.length_cache().write(root / "lengths.jsonl")
    config = BatchingConfig.predictable(token_budget=512, bucket_edges=(32, 64, 128), overflow_max=256, seed=7)
    plan = BatchPlanBuilder(store.length_cache(), config).build(1)
    save_plan(plan, root / "plan", jsonl="always")
    BatchWriter(root / "plan", root / "batches", root / "store", workers=1).write_all()  # compact, the default
    BatchWriter(root / "plan", root / "batches-npz", root / "store", workers=1, layout="npz").write_all()
    BatchWriter(root / "plan", root / "batches-zstd", root / "store", workers=1, compression="zstd").write_all()
    BatchWriter(root / "plan", root / "batches-index", root / "store", workers=1, layout="index").write_all()
    fingerprint_plan_batches(plan, store, 2).save(root / "fingerprint.json")
    write_megatron(root / "mega", random_sequences(20, seed=2))
    from umlos_cuda.batching.tokens.sharded import tokenize_shard, tokenize_sharded

    parts = [str(root / f"part-{i}.jsonl") for i in range(3)]
    for i, part in enumerate(parts):
        write_dataset(part, 10 + i, seed=10 + i, ids=False)
    tokenize_sharded(parts[:2], root / "model", root / "sharded")  # a sharded store of two shards
    tokenize_shard(parts, 2, root / "model", root / "staged")  # the next shard, staged

    from umlos_cuda.batching.plans.windows import MappedLengths, WindowDefinition, WindowedPlan, save_windowed_plan

    mapped = MappedLengths(root / "lengths.jsonl.u32")
    save_windowed_plan(WindowedPlan.build(WindowDefinition(config, mapped.count, window=16), mapped, 2),
                       root / "windowed")
    from umlos_cuda.batching.plans.windows import CutDefinition, PretrainingSequences, save_sequences
    from umlos_cuda.batching.tokens.mapped import MappedMegatron

    save_sequences(PretrainingSequences.build(CutDefinition(20, 16, window=4, eos=1), MappedMegatron(root / "mega"),
                                              2), root / "sequences", tokens_path=root / "mega")
    from umlos_cuda.batching.plans.windows import SequenceMixture, save_mixed_sequences

    parts = [(CutDefinition(20, 16, window=4, seed=seed, eos=1), MappedMegatron(root / "mega"), weight, cap, name)
             for seed, weight, cap, name in ((1, 0.7, None, "a"), (2, 0.3, 2, "b"))]
    save_mixed_sequences(SequenceMixture.build(parts, 8, 60, 3), root / "mixed-sequences",
                         tokens_paths=[root / "mega"] * 2)
    from umlos_cuda.batching.plans.windows import Component, MixedPlan, MixtureDefinition
    from umlos_cuda.batching.plans.windows.io import save_mixed_plan

    mixture = MixtureDefinition(config, (Component(mapped, 0.7, 1, None, "a"), Component(mapped, 0.3, 2, 2, "b")),
                                16, 100)
    save_mixed_plan(MixedPlan.build(mixture), root / "mixed", lengths_paths=["lengths.jsonl.u32"] * 2)
    from umlos_cuda.batching.sources import open_source

    tokens = [open_source(str(root / "store"), tokens=True) for _ in range(2)]
    over_store = MixtureDefinition(config, (Component(tokens[0], 0.7, 1, None, "a"),
                                            Component(tokens[1], 0.3, 2, 2, "b")), 16, 100)
    BatchWriter(MixedPlan.build(over_store), root / "batches-mixed", [root / "store"] * 2, workers=1).write_all()
    streams_support.write_mock_run(root / "run")
    (root / "policy.yaml").write_text("policies:\n  - type: novelty\n    novelty_window: 10\n")
    (root / "manifest.yaml").write_text(
        "global_batch_size: 4\ndatasets:\n  train: {id: c, version: '1', hash: 'sha256:00', cardinality: 100}\n")
    return root


@dataclass
class Case:
    """One hostile input: ``make(world, here)`` builds it under ``here`` and returns the argv of the
    command (or ``("python", code)`` for an API snippet); the child must be refused with one of
    ``codes`` naming ``names`` (a path relative to ``here``), or finish with status 0 when codes is ()."""

    id: str
    make: Callable[[Path, Path], tuple]
    codes: tuple[str, ...]
    names: str | None = None
    server: Callable | None = None  # a handler for a hostile 127.0.0.1 server, port passed as {port}
    wall_s: float = WALL_S
    owned: tuple[str, ...] = field(default=("out",))
    env: dict[str, str] = field(default_factory=dict)  # set for the child (a small render budget)


def copy(world: Path, here: Path, *names: str) -> None:
    for name in names:
        source = world / name
        if source.is_dir():
            shutil.copytree(source, here / name, symlinks=True)
        else:
            for sibling in world.glob(name + "*"):  # a cache's sidecar, a prefix's .idx and .bin
                shutil.copy2(sibling, here / sibling.name)


def fifo(path: Path) -> None:
    if path.exists():
        path.unlink()
    os.mkfifo(path)


def sparse(path: Path, prefix: bytes = b"", size: int = SPARSE_BYTES) -> None:
    with open(path, "wb") as handle:
        handle.write(prefix)
        handle.truncate(size)


def deep_json(prefix: str = "", suffix: str = "") -> str:
    return prefix + "[" * DEEP + "]" * DEEP + suffix


def first_npz(folder: Path) -> Path:
    return sorted(p for p in folder.glob("epoch_*_batch_*.npz"))[0]


def write_json(path: Path, value) -> None:
    path.write_text(json.dumps(value))


def edit_json(path: Path, change: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    write_json(path, data)


def edit_first_line(path: Path, change: Callable[[dict], None]) -> None:
    lines = path.read_text().splitlines(keepends=True)
    data = json.loads(lines[0])
    change(data)
    lines[0] = json.dumps(data) + "\n"
    path.write_text("".join(lines))


def edit_window(path: Path, change: Callable[[dict], None]) -> None:
    lines = path.read_text().splitlines(keepends=True)
    data = json.loads(lines[1])
    change(data)
    lines[1] = json.dumps(data) + "\n"
    path.write_text("".join(lines))


def plan_info(here: Path) -> tuple:
    return ("plan", "info", str(here / "plan"))


def batch_check(here: Path) -> tuple:
    return ("batch", "check", str(here / "batches"))


def generate(here: Path, store: str = "store") -> tuple:
    return ("batch", "generate", "--plan", str(here / "plan"), "--store", str(here / store),
            "--output", str(here / "out"), "--quiet", "--workers", "1")


def lengths_build(here: Path, dataset: str = "train.jsonl", tokenizer: str = "model") -> tuple:
    return ("data", "lengths", "build", "--dataset", str(here / dataset), "--tokenizer", str(here / tokenizer),
            "--output", str(here / "out"), "--quiet")


def gym_run(here: Path, port: int | str = 9, *extra: str) -> tuple:
    return ("gym", "run", "--host", "127.0.0.1", "--port", str(port), "--game", "sudoku", "--episodes", "1",
            "--tokenizer", str(here / "model"), "--buffer-size", "4", "--window-mbs", "1",
            "--output", str(here / "out"), "--quiet", "--timeout", "5", *extra)


def api(code: str) -> tuple:
    return ("python", hs.API_PRELUDE + code)


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------------- hostile servers
def flood(line: bytes):
    """A server that answers nothing but ``line`` over and over, as fast as it can, until the client
    leaves or 60 s pass (it stops itself)."""
    def handler(conn, stop):
        block = line * max(1, (1 << 16) // len(line))
        deadline = threading.Event()
        timer = threading.Timer(60, deadline.set)
        timer.start()
        try:
            while not stop.is_set() and not deadline.is_set():
                conn.sendall(block)
        finally:
            timer.cancel()
    return handler


GAME = {"1 ?": b"Invalid difficulty. Choose from: easy\r\n", "menu": b"\r\n",
        "1 easy 5": b"SUDOKU - EASY MODE\r\nSeed: 5\r\nrules\r\n", "mode json": b'{"type":"mode"}\r\n'}
GREETING = b"\r\n  1) Sudoku          - Classic logic puzzle\r\n"


def scripted(replies: dict[str, bytes]):
    """streams_support's fake server (the real one's framing: greeting, echo, reply, prompt) with
    ``replies``, as a :class:`HostileServer` handler."""
    handler = streams_support.scripted(replies, greeting=GREETING)
    return lambda conn, stop: handler(conn, 0, stop)


def observation(**fields) -> bytes:
    value = {"type": "observation", "game": "sudoku", "difficulty": "easy", "seed": 5, "moves": 0,
             "is_complete": False, "grid_display": "..."}
    value.update(fields)
    return json.dumps(value).encode() + b"\r\n"


class HostileServer:
    """One thread on 127.0.0.1, a free port, ``handler(conn, stop)`` per connection; stops on close or
    after 90 s on its own."""

    def __init__(self, handler) -> None:
        self.handler, self.stop = handler, threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.threads: list[threading.Thread] = []
        self.timer = threading.Timer(90, self.stop.set)
        self.timer.start()
        self.accept = threading.Thread(target=self._loop, daemon=True)
        self.accept.start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _serve(self, conn) -> None:
        with conn, contextlib.suppress(OSError):
            self.handler(conn, self.stop)

    def close(self) -> None:
        self.stop.set()
        self.timer.cancel()
        self.accept.join(5)
        self.sock.close()
        for thread in self.threads:
            thread.join(5)


def client_start(port_expr: str = "{port}") -> tuple:
    return api("from umlos_cuda.streams import TelnetGymClient\n"
               f"client = TelnetGymClient(host='127.0.0.1', port={port_expr}, timeout=20)\n"
               "guarded(lambda: print(client.start('sudoku', 'easy', 5)))\n")


# ---------------------------------------------------------------------- the cases
P, B, S, T = errors.PLAN_FORMAT_INVALID, errors.BATCH_FILE_INVALID, errors.TOKEN_STORE_INVALID, errors.TOKENIZER_INVALID
L, LS = errors.LENGTHS_INVALID, errors.LENGTHS_SIDECAR_MISMATCH
M, W = errors.MEGATRON_INDEX_INVALID, errors.WINDOW_LOG_INVALID
D, G, GP = errors.DATASET_RECORD_INVALID, errors.GYM_CONFIG_INVALID, errors.GYM_PROTOCOL_ERROR
RB = errors.CHAT_RENDER_BUDGET_EXCEEDED


def _plan_fifo(name: str):
    def make(world, here):
        copy(world, here, "plan")
        fifo(here / "plan" / name)
        return plan_info(here)
    return make


def _jsonl_only_plan(world, here):
    """The plan copied into ``here`` keeps only its JSONL form (the seed's layout)."""
    for npy in (here / "plan" / "epoch_0").glob("*.npy"):
        npy.unlink()


def _batch_fifo(world, here):
    copy(world, here, "batches")
    fifo(first_npz(here / "batches"))
    return batch_check(here)


def _batch_index_fifo(world, here):
    copy(world, here, "batches")
    fifo(here / "batches" / "batches.json")
    return batch_check(here)


def _generate_resume_fifo(world, here):
    copy(world, here, "plan", "store", "batches")
    os.rename(here / "batches", here / "out")
    fifo(first_npz(here / "out"))
    return generate(here)


def _generate_resume_sparse(world, here):
    copy(world, here, "plan", "store", "batches")
    os.rename(here / "batches", here / "out")
    sparse(first_npz(here / "out"), size=8 << 30)
    return generate(here)


def _generate_store_fifo(world, here):
    copy(world, here, "plan", "store")
    fifo(here / "store" / "tokens.npy")
    return generate(here)


def _generate_store_meta_fifo(world, here):
    copy(world, here, "plan", "store")
    fifo(here / "store" / "meta.json")
    return generate(here)


def _megatron_fifo(suffix: str):
    def make(world, here):
        copy(world, here, "mega")
        fifo(here / f"mega{suffix}")
        return ("data", "megatron", str(here / "mega"), "--output", str(here / "out"))
    return make


def _lengths_sidecar_fifo(world, here):
    copy(world, here, "lengths.jsonl")
    fifo(here / "lengths.jsonl.u32")
    return ("data", "lengths", "stats", str(here / "lengths.jsonl"))


def _tokenizer_fifo(name: str):
    def make(world, here):
        copy(world, here, "model", "train.jsonl")
        fifo(here / "model" / name)
        return lengths_build(here)
    return make


def _tokenize_fifo_special_tokens(world, here):
    copy(world, here, "model", "train.jsonl")
    fifo(here / "model" / "special_tokens_map.json")
    return ("data", "tokenize", "--dataset", str(here / "train.jsonl"), "--tokenizer", str(here / "model"),
            "--output", str(here / "out"), "--quiet")


def _chat(template: str | None, command: str = "tokenize", messages=None, template_file=None):
    """A model whose tokenizer_config.json carries ``template`` and a one-record chat dataset, encoded with
    ``--messages-field messages`` (and ``--chat-template`` the file ``template_file`` makes under ``here``)."""
    def make(world, here):
        copy(world, here, "model")
        if template is not None:
            edit_json(here / "model" / "tokenizer_config.json", lambda c: c.__setitem__("chat_template", template))
        record = {"messages": messages if messages is not None else [{"role": "user", "content": "hi"}]}
        (here / "chat.jsonl").write_text(json.dumps(record) + "\n")
        extra = ("--chat-template", str(template_file(here))) if template_file is not None else ()
        verb = ("data", "tokenize") if command == "tokenize" else ("data", "lengths", "build")
        return (*verb, "--dataset", str(here / "chat.jsonl"), "--tokenizer", str(here / "model"), "--output",
                str(here / "out"), "--messages-field", "messages", "--quiet", *extra)
    return make


#: The render budget the chat cases run under (umlos_cuda/batching/chat/limits.py): one CPU second a record, ten
#: by the clock, 256 MiB a worker; each case is bounded by it, not by the harness's limits.
RENDER_BUDGET = {"UMLOS_CHAT_RENDER_CPU_S": "1", "UMLOS_CHAT_RENDER_WALL_S": "10",
                 "UMLOS_CHAT_RENDER_MEMORY_MIB": "256"}
#: Shared lists doubled 40 times in 40 steps of template code: 2^40 leaves, walked in C by ==, tojson, pprint...
SHARED = ("{% set ns = namespace(a=[0], b=[0]) %}{% for i in range(40) %}{% set ns.a = [ns.a, ns.a] %}"
          "{% set ns.b = [ns.b, ns.b] %}{% endfor %}")
#: A template of 28 MB (its tags are what Jinja's compiler spends time on).
HUGE_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}" + "{{ 'x' }}" * (28_000_000 // 9)


def _budgeted(template: str, command: str = "tokenize") -> Case:
    """A chat case whose template runs past the render budget on the record (CHAT_RENDER_BUDGET_EXCEEDED naming
    chat.jsonl), inside the small budget of the tests."""
    return Case(f"hang/data-{'tokenize' if command == 'tokenize' else 'lengths-build'}-chat-template-"
                f"{_slug(template)}", _chat(template, command), (RB,), "chat.jsonl", env=RENDER_BUDGET)


def _slug(template: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in template.replace(SHARED, "shared-"))[:60].strip("-")


def _huge_template(where: str):
    """A model whose chat template is :data:`HUGE_TEMPLATE`, in ``chat_template.jinja``, in
    ``tokenizer_config.json`` or in a ``--chat-template`` file."""
    def make(world, here):
        copy(world, here, "model")
        extra: tuple[str, ...] = ()
        if where == "jinja":
            (here / "model" / "chat_template.jinja").write_text(HUGE_TEMPLATE)
        elif where == "config":
            edit_json(here / "model" / "tokenizer_config.json",
                      lambda c: c.__setitem__("chat_template", HUGE_TEMPLATE))
        else:
            (here / "t.jinja").write_text(HUGE_TEMPLATE)
            extra = ("--chat-template", str(here / "t.jinja"))
        (here / "chat.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
        return ("data", "tokenize", "--dataset", str(here / "chat.jsonl"), "--tokenizer", str(here / "model"),
                "--output", str(here / "out"), "--messages-field", "messages", "--quiet", *extra)
    return make


PARTS_CHATML = ("{% for m in messages %}{{ '<|' + m['role'] + '|>' }}{% if m['content'] is string %}{{ m['content'] }}"
          "{% else %}{% for p in m['content'] %}{{ p['text'] }}{% endfor %}{% endif %}{{ '</s>' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")
ASK = [{"role": "user", "content": "hi"}]
GOOD, BAD = [{"role": "assistant", "content": "fine"}], [{"role": "assistant", "content": "go away"}]


def _preference(record: dict, *fields: str, command: str = "tokenize", template: str = PARTS_CHATML,
                parquet: bool = False):
    """A model with a chat template and a one-record preference dataset (JSONL, or Parquet), encoded with
    ``--conversational`` and ``fields`` (``--prompt-field prompt --chosen-field chosen ...``)."""
    def make(world, here):
        copy(world, here, "model")
        edit_json(here / "model" / "tokenizer_config.json", lambda c: c.__setitem__("chat_template", template))
        name = "prefs.parquet" if parquet else "prefs.jsonl"
        if parquet:
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.Table.from_pylist([record]), here / name)
        else:
            (here / name).write_text(json.dumps(record) + "\n")
        verb = ("data", "tokenize") if command == "tokenize" else ("data", "lengths", "build")
        return (*verb, "--dataset", str(here / name), "--tokenizer", str(here / "model"), "--output",
                str(here / "out"), "--quiet", "--conversational", *fields)
    return make


PAIRS = ("--prompt-field", "prompt", "--chosen-field", "chosen", "--rejected-field", "rejected")
UNPAIRED = ("--prompt-field", "prompt", "--completion-field", "completion", "--label-field", "label")


def _fifo_at(name: str):
    def make(here: Path) -> Path:
        fifo(here / name)
        return here / name
    return make


def _fingerprint_fifo_offsets(world, here):
    copy(world, here, "plan", "store")
    fifo(here / "store" / "offsets.npy")
    return ("batch", "fingerprint", "--plan", str(here / "plan"), "--store", str(here / "store"), "--n-batches", "2")


def _bare_tokenizer_fifo(world, here):
    copy(world, here, "train.jsonl")
    fifo(here / "tokenizer.json")
    return lengths_build(here, tokenizer="tokenizer.json")


def _window_log_fifo(world, here):
    fifo(here / "windows.jsonl")
    return ("gym", "replay", str(here / "windows.jsonl"))


def _policy_fifo(world, here):
    copy(world, here, "model")
    fifo(here / "policy.yaml")
    return gym_run(here, closed_port(), "--policy-yaml", str(here / "policy.yaml"))


def _manifest_fifo(command: str):
    def make(world, here):
        fifo(here / "m.yaml")
        if command == "demo":
            return ("demo", "--manifest", str(here / "m.yaml"), "--quiet")
        if command == "indices":
            return ("indices", str(here / "m.yaml"), "--dataset", "train", "--epoch", "0", "--out",
                    str(here / "out"))
        return (command, str(here / "m.yaml"), "--dataset", "train")
    return make


def _labels_fifo(world, here):
    fifo(here / "labels.npy")
    return ("quality", "--labels", str(here / "labels.npy"), "--no-plot", "--quiet")


def _golden_fifo(world, here):
    fifo(here / "golden.json")
    return ("golden", "verify", "--file", str(here / "golden.json"))


def _fingerprint_fifo(world, here):
    copy(world, here, "plan", "store")
    fifo(here / "expected.json")
    return ("batch", "verify", "--plan", str(here / "plan"), "--store", str(here / "store"),
            "--expected-fingerprint", str(here / "expected.json"))


def _checkpoint_fifo(action: str):
    def make(world, here):
        fifo(here / "store")
        return ("checkpoint", action, str(here / "store"), *(("--keep-last", "1") if action == "gc" else ()))
    return make


def _plan_verify_lengths_fifo(world, here):
    copy(world, here, "plan")
    fifo(here / "lengths.jsonl")
    return ("plan", "verify", str(here / "plan"), "--lengths", str(here / "lengths.jsonl"))


def _plan_build_lengths_sparse(world, here):
    sparse(here / "lengths.jsonl")
    return ("plan", "build", "--lengths", str(here / "lengths.jsonl"), "--bucket-edges", "64", "--overflow-max",
            "128", "--token-budget", "512", "--output", str(here / "out"), "--quiet")


def _sparse_in_plan(name: str, jsonl_only: bool = False):
    def make(world, here):
        copy(world, here, "plan")
        if jsonl_only:
            _jsonl_only_plan(world, here)
        sparse(here / "plan" / name)
        return plan_info(here)
    return make


def _sparse_store_meta(world, here):
    copy(world, here, "plan", "store")
    sparse(here / "store" / "meta.json", b'{"format": "')
    return generate(here)


def _sparse_batches_json(world, here):
    copy(world, here, "batches")
    sparse(here / "batches" / "batches.json", b'{"format": "')
    return batch_check(here)


def _sparse_dataset(world, here):
    copy(world, here, "model")
    sparse(here / "train.jsonl", b'{"text": "')
    return lengths_build(here)


def _sparse_lengths_cache(world, here):
    sparse(here / "lengths.jsonl", b'{"sample_id": "')
    return ("data", "lengths", "stats", str(here / "lengths.jsonl"))


def _sparse_sidecar(world, here):
    copy(world, here, "lengths.jsonl")
    sparse(here / "lengths.jsonl.u32", b"UMLOSLEN" + struct.pack("<I", 0xFFFFFFFF) + b'{"a": "')
    return require_sidecar(here)


def _sparse_window_log(world, here):
    sparse(here / "windows.jsonl", b'{"kind": "header", "x": "')
    return ("gym", "replay", str(here / "windows.jsonl"))


def _sparse_tokenizer_config(world, here):
    copy(world, here, "model", "train.jsonl")
    sparse(here / "model" / "tokenizer_config.json", b'{"eos_token": "')
    return lengths_build(here)


def _sparse_policy(world, here):
    copy(world, here, "model")
    sparse(here / "policy.yaml", b"policies: '")
    return gym_run(here, closed_port(), "--policy-yaml", str(here / "policy.yaml"))


def _npz_extra_deflated_member(world, here):
    copy(world, here, "batches")
    return _npz_extra_deflated_member_in_place(here)


def _npz_extra_deflated_member_in_place(here):
    path = first_npz(here / "batches")
    with zipfile.ZipFile(path, "a", zipfile.ZIP_DEFLATED) as archive, \
            archive.open(zipfile.ZipInfo("extra.npy"), "w", force_zip64=True) as member:
        header = {"descr": "|u1", "fortran_order": False, "shape": (2 << 30,)}
        np.lib.format.write_array_header_1_0(member, header)
        block = bytes(1 << 24)
        for _ in range(128):
            member.write(block)
    return batch_check(here)


def _npz_layout_deflated(world, here):
    """The extra deflated member of :func:`_npz_extra_deflated_member` in the seed's six-array layout."""
    copy(world, here, "batches-npz")
    os.rename(here / "batches-npz", here / "batches")
    return _npz_extra_deflated_member_in_place(here)


def _npz_giant_member_header(world, here):
    copy(world, here, "batches")
    path = first_npz(here / "batches")
    with zipfile.ZipFile(path) as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    header = {"descr": "<i4", "fortran_order": False, "shape": (1 << 19, 1 << 19)}  # 2^38 elements
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, header)
    members["input_ids.npy"] = buffer.getvalue() + b"\0" * 64
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return batch_check(here)


def _npy_giant_header(world, here):
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "<i8", "fortran_order": False, "shape": (1 << 38,)})
    (here / "labels.npy").write_bytes(buffer.getvalue() + b"\0" * 16)
    return api("from umlos_cuda.batching.plans.io import _format, read_npy\n"
               f"guarded(lambda: read_npy({str(here / 'labels.npy')!r}, '<i8', None, False, _format))\n")


def _store_tokens_giant_header(world, here):
    copy(world, here, "store")
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "<u2", "fortran_order": False, "shape": (1 << 38,)})
    (here / "store" / "tokens.npy").write_bytes(buffer.getvalue() + b"\0" * 16)
    return api("from umlos_cuda.batching.tokens.store import TokenStore\n"
               f"guarded(lambda: TokenStore.open({str(here / 'store')!r}, mmap=False))\n")


def _megatron_idx(count: int, documents: int, sizes, pointers, docs, bin_bytes: int, code: int = 4):
    def make(world, here):
        with open(here / "evil.idx", "wb") as handle:
            handle.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, count, documents))
            handle.write(np.asarray(sizes, "<i4").tobytes() + np.asarray(pointers, "<i8").tobytes()
                         + np.asarray(docs, "<i8").tobytes())
        (here / "evil.bin").write_bytes(bytes(bin_bytes))
        return ("data", "megatron", str(here / "evil"), "--output", str(here / "out"))
    return make


def _giant_world_shard(world, here):
    copy(world, here, "plan")
    return ("plan", "shard", str(here / "plan"), "--world-size", "4294967295", "--output", str(here / "out"))


def _giant_world_info(world, here):
    copy(world, here, "plan")
    return ("plan", "info", str(here / "plan"), "--world-size", "4294967295")


def _giant_world_info_windowed(world, here):
    """``plan info`` of a windowed plan lists at most 2^16 ranks, as a whole plan's does."""
    copy(world, here, "windowed", "lengths.jsonl")
    return ("plan", "info", str(here / "windowed"), "--world-size", "4294967295")


def _giant_world_check(world, here):
    copy(world, here, "batches")
    return ("batch", "check", str(here / "batches"), "--rank", "0", "--world-size", "4294967295")


def _window_header_giant_buffer(world, here):
    copy(world, here, "run")
    edit_first_line(here / "run" / "windows.jsonl", lambda h: h["buffer"].__setitem__("max_size", 1 << 26))
    return ("gym", "replay", str(here / "run"))


def _flood_info(world, here):
    return ("gym", "info", "--host", "127.0.0.1", "--port", "{port}", "--timeout", "60")


def _flood_run(world, here):
    copy(world, here, "model")
    return gym_run(here, "{port}")


# -- traceback: deep JSON in each JSON reader
def _deep_in_plan(name: str, jsonl_only: bool = False, line: bool = False):
    def make(world, here):
        copy(world, here, "plan")
        if jsonl_only:
            _jsonl_only_plan(world, here)
        path = here / "plan" / name
        if line:
            lines = path.read_text().splitlines(keepends=True)
            lines[0] = deep_json() + "\n"
            path.write_text("".join(lines))
        else:
            path.write_text(deep_json())
        return plan_info(here)
    return make


def _deep_store_meta(world, here):
    copy(world, here, "plan", "store")
    (here / "store" / "meta.json").write_text(deep_json('{"format": ', "}"))
    return generate(here)


def _deep_batches_json(world, here):
    copy(world, here, "batches")
    (here / "batches" / "batches.json").write_text(deep_json('{"format": ', "}"))
    return batch_check(here)


def _deep_lengths(world, here):
    (here / "lengths.jsonl").write_text(deep_json() + "\n")
    return ("data", "lengths", "stats", str(here / "lengths.jsonl"))


def require_sidecar(here: Path) -> tuple:
    """The length cache loaded with ``sidecar="require"``: a sidecar it cannot use is refused (the
    commands' default, ``auto``, sets it aside with a warning and parses the JSONL)."""
    return api("from umlos_cuda.batching import LengthCache\n"
               f"guarded(lambda: LengthCache.load({str(here / 'lengths.jsonl')!r}, sidecar='require'))\n")


def _deep_sidecar_header(world, here):
    copy(world, here, "lengths.jsonl")
    text = deep_json().encode()
    (here / "lengths.jsonl.u32").write_bytes(b"UMLOSLEN" + struct.pack("<I", len(text)) + text)
    return require_sidecar(here)


def _deep_dataset(world, here):
    copy(world, here, "model")
    (here / "train.jsonl").write_text('{"text": "a"}\n' + deep_json('{"text": "b", "x": ', "}") + "\n")
    return lengths_build(here)


def _deep_tokenizer_file(name: str):
    def make(world, here):
        copy(world, here, "model", "train.jsonl")
        (here / "model" / name).write_text(deep_json('{"eos_token": "</s>", "x": ', "}"))
        return lengths_build(here)
    return make


def _deep_window_log(line: int):
    def make(world, here):
        copy(world, here, "run")
        path = here / "run" / "windows.jsonl"
        lines = path.read_text().splitlines(keepends=True)
        lines[line] = deep_json('{"kind": "window", "x": ', "}") + "\n"
        path.write_text("".join(lines))
        return ("gym", "replay", str(here / "run"))
    return make


def _deep_fingerprint_file(world, here):
    copy(world, here, "plan", "store")
    (here / "expected.json").write_text(deep_json())
    return ("batch", "verify", "--plan", str(here / "plan"), "--store", str(here / "store"),
            "--expected-fingerprint", str(here / "expected.json"))


def _deep_golden(world, here):
    (here / "golden.json").write_text(deep_json('{"format": ', "}"))
    return ("golden", "verify", "--file", str(here / "golden.json"))


def _deep_manifest(suffix: str, text: str):
    def make(world, here):
        (here / f"m{suffix}").write_text(text)
        return ("next-batch", str(here / f"m{suffix}"), "--dataset", "train")
    return make


def _deep_policy(text: str):
    def make(world, here):
        copy(world, here, "model")
        (here / "policy.yaml").write_text(text)
        return gym_run(here, closed_port(), "--policy-yaml", str(here / "policy.yaml"))
    return make


def _block_nested_yaml(depth: int) -> str:
    return "policies:\n" + "".join(" " * (i + 1) + "a:\n" for i in range(depth)) + " " * (depth + 1) + "b\n"


# -- traceback: wrong field types
def _plan_meta(change: Callable[[dict], None]):
    def make(world, here):
        copy(world, here, "plan")
        edit_json(here / "plan" / "meta.json", change)
        return plan_info(here)
    return make


def _plan_stats(change: Callable[[dict], None]):
    def make(world, here):
        copy(world, here, "plan")
        edit_json(here / "plan" / "epoch_0" / "stats.json", change)
        return plan_info(here)
    return make


def _batches_index(change: Callable[[dict], None]):
    def make(world, here):
        copy(world, here, "batches")
        edit_json(here / "batches" / "batches.json", change)
        return batch_check(here)
    return make


def _store_meta(change: Callable[[dict], None]):
    def make(world, here):
        copy(world, here, "plan", "store")
        edit_json(here / "store" / "meta.json", change)
        return generate(here)
    return make


def _window_header(change: Callable[[dict], None]):
    def make(world, here):
        copy(world, here, "run")
        edit_first_line(here / "run" / "windows.jsonl", change)
        return ("gym", "replay", str(here / "run"))
    return make


def _window_record(change: Callable[[dict], None]):
    def make(world, here):
        copy(world, here, "run")
        edit_window(here / "run" / "windows.jsonl", change)
        return ("gym", "replay", str(here / "run"))
    return make


def _fingerprint_file(change: Callable[[dict], None]):
    def make(world, here):
        copy(world, here, "plan", "store", "fingerprint.json")
        edit_json(here / "fingerprint.json", change)
        return ("batch", "verify", "--plan", str(here / "plan"), "--store", str(here / "store"),
                "--expected-fingerprint", str(here / "fingerprint.json"))
    return make


def _sidecar_header(change: Callable[[dict], None], require: bool = False):
    def make(world, here):
        copy(world, here, "lengths.jsonl")
        data = (here / "lengths.jsonl.u32").read_bytes()
        (size,) = struct.unpack("<I", data[8:12])
        header = json.loads(data[12:12 + size])
        lengths = data[-4 * header["count"]:]
        change(header)
        text = json.dumps(header).encode()
        prefix = b"UMLOSLEN" + struct.pack("<I", len(text)) + text
        (here / "lengths.jsonl.u32").write_bytes(prefix + b"\0" * (-len(prefix) % 16) + lengths)
        return require_sidecar(here) if require else ("data", "lengths", "stats", str(here / "lengths.jsonl"), "--json")
    return make


def _observation(**fields):
    return dict(server=lambda: scripted({**GAME, "show": observation(**fields)}))


def _serve(*args: str):
    def make(world, here):
        return ("gym", "serve", *args)
    return make


def _cli(*args: str):
    def make(world, here):
        return args
    return make


def _shard(value):
    return lambda m: m.__setitem__("shard", value)


# ---------------------------------------------------------------------- sharded token stores (batching/tokens/)
SH = errors.SHARDED_STORE_INVALID


def _sharded(change: Callable[[Path], None], command: str = "verify"):
    """A copy of the sharded store (and the staged shard), ``change(store)``, then ``data verify`` or
    ``data append`` of the staged shard."""
    def make(world, here):
        copy(world, here, "sharded", "staged")
        change(here / "sharded")
        if command == "append":
            return ("data", "append", str(here / "sharded"), str(here / "staged"))
        return ("data", "verify", str(here / "sharded"))
    return make


def _sharded_meta(change: Callable[[dict], None], command: str = "verify"):
    return _sharded(lambda store: edit_json(store / "meta.json", change), command)


def _giant_npy(path: Path) -> None:
    """A ``.npy`` whose header claims 2^38 bytes over a file of 16."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "|u1", "fortran_order": False, "shape": (1 << 38,)})
    path.write_bytes(buffer.getvalue() + b"\0" * 16)


def _planted_orphan(store: Path) -> None:
    shutil.copytree(store / "shards" / "00001", store / "shards" / "00002")


# ---------------------------------------------------------------------- windowed plans (batching/plans/windows/)
def _windowed(change, lengths: str | None = None):
    """The windowed plan copied into ``here``, ``change(here)`` applied, then opened (with ``lengths``, a
    path relative to ``here``, when given)."""
    def make(world, here):
        copy(world, here, "windowed", "lengths.jsonl")
        change(here)
        given = "" if lengths is None else f", lengths={str(here / lengths)!r}"
        return api("from umlos_cuda.batching.plans.windows import load_windowed_plan\n"
                   f"guarded(lambda: load_windowed_plan({str(here / 'windowed')!r}{given}).microbatch(0, 0))\n")
    return make


def _window_build(change, *lengths: str, mix: bool = False):
    """``plan build --window`` (or ``--mix``, weight 1 each) over ``lengths`` (paths relative to ``here``), after
    ``change(here)``: the length cache and its sidecar are read by ``open_length_cache``, bounded."""
    def make(world, here):
        copy(world, here, "lengths.jsonl")
        change(here)
        given = (("--mix", *(f"{here / name}:1" for name in lengths), "--num-samples", "50") if mix else
                 ("--lengths", str(here / lengths[0])))
        return ("plan", "build", *given, "--window", "16", "--bucket-edges", "32,64,128", "--overflow-max", "256",
                "--token-budget", "512", "--quiet", "--output", str(here / "out"))
    return make


def _sidecar_claiming(count: int):
    """A sparse sidecar whose header claims ``count`` lengths (4 x count bytes of zeros follow)."""
    def change(here):
        from umlos_cuda.batching.lengths.cache import SIDECAR_MAGIC

        text = json.dumps({"count": count, "dataset_hash": None, "format_version": 1, "jsonl_sha256": "0" * 64,
                           "jsonl_size": 0, "lengths_sha256": "0" * 64, "sample_ids": "line_numbers",
                           "tokenizer_hash": "x"}, sort_keys=True, separators=(",", ":")).encode("ascii")
        prefix = SIDECAR_MAGIC + struct.pack("<I", len(text)) + text
        prefix += b"\0" * (-len(prefix) % 16)
        sparse(here / "big.u32", prefix, len(prefix) + 4 * count)
    return change


def _sequences(change):
    """The pretraining sequences folder copied into ``here``, ``change(here)`` applied, then opened (its
    tokens from the world's Megatron pair) and sample 0 collated."""
    def make(world, here):
        copy(world, here, "sequences")
        change(here)
        return api("from umlos_cuda.batching.plans.windows import load_sequences\n"
                   f"guarded(lambda: load_sequences({str(here / 'sequences')!r}).sample(0, 0))\n")
    return make


def _sequences_cli(change, action: str = "verify", *extra: str):
    """``plan ACTION`` of the pretraining sequences folder copied into ``here`` with ``change(here)`` applied."""
    def make(world, here):
        copy(world, here, "sequences")
        change(here)
        return ("plan", action, str(here / "sequences"), *extra)
    return make


def _plan_cut(change):
    """``plan cut`` over the Megatron pair copied into ``here`` with ``change(here)`` applied."""
    def make(world, here):
        copy(world, here, "mega")
        change(here)
        return ("plan", "cut", "--tokens", str(here / "mega"), "--sequence-length", "16", "--output",
                str(here / "out"))
    return make


def _plan_cut_mix(change):
    """``plan cut --mix`` of the Megatron pair copied into ``here`` (twice) with ``change(here)`` applied."""
    def make(world, here):
        copy(world, here, "mega")
        change(here)
        return ("plan", "cut", "--mix", f"{here / 'mega'}:0.5", f"{here / 'mega'}:0.5:1", "--num-samples", "10",
                "--sequence-length", "16", "--output", str(here / "out"))
    return make


def _mixed_sequences(change):
    """The mixture of pretraining sequences copied into ``here``, ``change(here)`` applied, then opened (its tokens
    from the world's Megatron pair, named in meta.json) and sample 0 collated."""
    def make(world, here):
        copy(world, here, "mixed-sequences")
        change(here / "mixed-sequences")
        return api("from umlos_cuda.batching.plans.windows import load_mixed_sequences\n"
                   f"guarded(lambda: load_mixed_sequences({str(here / 'mixed-sequences')!r}).sample(0))\n")
    return make


def _mixed_sequences_cli(action: str, change):
    """``plan ACTION`` of the mixture of pretraining sequences copied into ``here`` with ``change(here)`` applied."""
    def make(world, here):
        copy(world, here, "mixed-sequences")
        change(here / "mixed-sequences")
        return ("plan", action, str(here / "mixed-sequences"))
    return make


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])


def _link_to_fifo(path: Path) -> None:
    fifo(path.parent.parent / "pipe")
    path.unlink()
    os.symlink(path.parent.parent / "pipe", path)


def _marker(kind: str):
    return lambda d: edit_json(d / "umlos-artifact.json", lambda m: m.update(artifact=kind))


def _patch_idx(offset: int, data: bytes):
    """Overwrite bytes of the copied ``mega.idx`` (sizes from byte 34, int32; pointers after the 20 sizes)."""
    def change(here):
        raw = bytearray((here / "mega.idx").read_bytes())
        raw[offset:offset + len(data)] = data
        (here / "mega.idx").write_bytes(bytes(raw))
    return change


def _fifo_behind_link(name: str):
    """``name`` replaced by a symbolic link to a FIFO."""
    def change(here):
        (here / name).unlink()
        fifo(here / "pipe")
        os.symlink(here / "pipe", here / name)
    return change


def _truncated(name: str, by: int = 3):
    return lambda here: os.truncate(here / name, os.path.getsize(here / name) - by)


def _megatron_build(change, mix: bool = False):
    """``plan build --window --lengths PREFIX`` (or ``--mix PREFIX:1``) over the Megatron pair copied into
    ``here``, after ``change(here)``: the ``.idx`` sizes read by rows (MappedMegatron)."""
    def make(world, here):
        copy(world, here, "mega")
        change(here)
        given = ("--mix", f"{here / 'mega'}:1", "--num-samples", "50") if mix else ("--lengths", str(here / "mega"))
        return ("plan", "build", *given, "--window", "16", "--bucket-edges", "32,64,128", "--overflow-max", "256",
                "--token-budget", "512", "--quiet", "--output", str(here / "out"))
    return make


def _store_build(change):
    """``plan build --window --lengths STORE`` over the token store copied into ``here``, after ``change(here)``."""
    def make(world, here):
        copy(world, here, "store")
        change(here)
        return ("plan", "build", "--lengths", str(here / "store"), "--window", "16", "--bucket-edges", "32,64,128",
                "--overflow-max", "256", "--token-budget", "512", "--quiet", "--output", str(here / "out"))
    return make


def _megatron_plan_verify(change):
    """``plan verify`` of a windowed plan built over the Megatron pair copied into ``here`` (its meta.json's
    lengths_path), the pair changed by ``change(here)`` after the build."""
    def make(world, here):
        from umlos_cuda.cli import main

        copy(world, here, "mega")
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["plan", "build", "--lengths", str(here / "mega"), "--window", "8", "--bucket-edges", "32,64",
                         "--overflow-max", "256", "--token-budget", "512", "--quiet", "--output",
                         str(here / "plan")]) == 0
        change(here)
        return ("plan", "verify", str(here / "plan"))
    return make


MI = errors.MEGATRON_INDEX_INVALID
TOKEN_SOURCE_CASES = [
    Case("hang/plan-cut-symlinked-fifo-idx", _plan_cut(_fifo_behind_link("mega.idx")), (MI,), "mega.idx"),
    Case("traceback/plan-cut-truncated-idx", _plan_cut(_truncated("mega.idx")), (MI,), "mega.idx"),
    Case("traceback/plan-cut-negative-size", _plan_cut(_patch_idx(34 + 4 * 7, struct.pack("<i", -1))), (MI,),
         "mega.idx"),
    Case("traceback/plan-cut-pointer-outside-the-bin", _plan_cut(_patch_idx(34 + 80 + 8 * 5, struct.pack("<q", 10**9))),
         (MI,), "mega.idx"),
    Case("hang/plan-cut-fifo-bin", _plan_cut(lambda h: fifo(h / "mega.bin")), (MI,), "mega.bin"),
    Case("hang/windowed-plan-build-megatron-fifo-idx", _megatron_build(lambda h: fifo(h / "mega.idx")), (MI,),
         "mega.idx"),
    Case("hang/windowed-plan-build-megatron-symlinked-fifo-idx", _megatron_build(_fifo_behind_link("mega.idx")),
         (MI,), "mega.idx"),
    Case("hang/windowed-plan-build-megatron-sparse-idx", _megatron_build(lambda h: sparse(h / "mega.idx")), (MI,),
         "mega.idx"),
    Case("traceback/windowed-plan-build-megatron-truncated-idx", _megatron_build(_truncated("mega.idx")), (MI,),
         "mega.idx"),
    Case("traceback/windowed-plan-build-megatron-negative-size",
         _megatron_build(_patch_idx(34 + 4 * 19, struct.pack("<i", -5))), (MI,), "mega.idx"),
    Case("hang/mixed-plan-build-megatron-fifo-bin", _megatron_build(lambda h: fifo(h / "mega.bin"), mix=True),
         (MI,), "mega.bin"),
    Case("traceback/mixed-plan-build-megatron-truncated-idx", _megatron_build(_truncated("mega.idx"), mix=True),
         (MI,), "mega.idx"),
    Case("hang/windowed-plan-build-store-fifo-offsets", _store_build(lambda h: fifo(h / "store" / "offsets.npy")),
         (errors.TOKEN_STORE_INVALID,), "offsets.npy"),
    Case("hang/windowed-plan-verify-megatron-fifo-idx", _megatron_plan_verify(lambda h: fifo(h / "mega.idx")), (MI,),
         "mega.idx"),
    Case("traceback/windowed-plan-verify-megatron-negative-size",
         _megatron_plan_verify(_patch_idx(34 + 4 * 3, struct.pack("<i", -1))), (MI,), "mega.idx"),
]


WP = errors.PLAN_FORMAT_INVALID
MIXED_SEQUENCES_CASES = [
    Case("hang/mixed-sequences-fifo-meta-json", _mixed_sequences(lambda d: fifo(d / "meta.json")), (WP,),
         "meta.json"),
    Case("hang/mixed-sequences-sparse-index-npy", _mixed_sequences(lambda d: sparse(d / "index.npy")), (WP,),
         "index.npy"),
    Case("hang/mixed-sequences-meta-json-a-symlink-to-a-fifo",
         _mixed_sequences(lambda d: _link_to_fifo(d / "meta.json")), (WP,), "meta.json"),
    Case("hang/plan-verify-mixed-sequences-index-npy-a-symlink-to-a-fifo",
         _mixed_sequences_cli("verify", lambda d: _link_to_fifo(d / "index.npy")), (WP,), "index.npy"),
    Case("hang/plan-info-mixed-sequences-fifo-meta-json", _mixed_sequences_cli("info", lambda d: fifo(d / "meta.json")),
         (WP,), "meta.json"),
    Case("traceback/mixed-sequences-truncated-meta-json", _mixed_sequences(lambda d: _truncate(d / "meta.json")),
         (WP,), "meta.json"),
    Case("traceback/plan-verify-mixed-sequences-truncated-index-npy",
         _mixed_sequences_cli("verify", lambda d: _truncate(d / "index.npy")), (WP,), "index.npy"),
    Case("traceback/plan-verify-mixed-sequences-marked-as-pretraining-sequences",
         _mixed_sequences_cli("verify", _marker("pretraining sequences")), (WP,), "meta.json"),
    Case("traceback/plan-info-mixed-sequences-marked-as-a-mixed-plan",
         _mixed_sequences_cli("info", _marker("mixed plan")), (WP,), "meta.json"),
    Case("traceback/mixed-sequences-deep-meta-json", _mixed_sequences(lambda d: (d / "meta.json").write_text(
        deep_json())), (WP,), "meta.json"),
    Case("traceback/mixed-sequences-components-not-a-list",
         _mixed_sequences(lambda d: edit_json(d / "meta.json", lambda m: m.update(components={}))), (WP,),
         "meta.json"),
    Case("traceback/mixed-sequences-weight-not-a-pair",
         _mixed_sequences(lambda d: edit_json(d / "meta.json", lambda m: m["components"][0].update(weight=0.7))),
         (WP,), "meta.json"),
    Case("traceback/mixed-sequences-component-header-not-an-object",
         _mixed_sequences(lambda d: edit_json(d / "meta.json", lambda m: m["components"][1].update(sequences=[1]))),
         (WP,), "meta.json"),
    Case("traceback/mixed-sequences-window-a-string",
         _mixed_sequences(lambda d: edit_json(d / "meta.json", lambda m: m.update(window="8"))), (WP,), "meta.json"),
    Case("traceback/mixed-sequences-weight-changed",
         _mixed_sequences(lambda d: edit_json(d / "meta.json", lambda m: m["components"][0].update(weight=[3, 4]))),
         (errors.PLAN_FINGERPRINT_MISMATCH,)),
]
SEQUENCES_CASES = [
    Case("hang/pretraining-sequences-info-fifo-meta-json",
         _sequences_cli(lambda h: fifo(h / "sequences" / "meta.json"), "info"), (WP,), "meta.json"),
    Case("hang/pretraining-sequences-info-sparse-index-npy",
         _sequences_cli(lambda h: sparse(h / "sequences" / "index.npy"), "info"), (WP,), "index.npy"),
    Case("hang/pretraining-sequences-info-world-size-2^32-1",
         _sequences_cli(lambda h: None, "info", "--world-size", "4294967295"), (errors.BATCHING_CONFIG_INVALID,)),
    Case("hang/pretraining-sequences-verify-fifo-meta-json",
         _sequences_cli(lambda h: fifo(h / "sequences" / "meta.json")), (WP,), "meta.json"),
    Case("hang/pretraining-sequences-verify-sparse-index-npy",
         _sequences_cli(lambda h: sparse(h / "sequences" / "index.npy")), (WP,), "index.npy"),
    Case("hang/pretraining-sequences-fifo-meta-json", _sequences(lambda h: fifo(h / "sequences" / "meta.json")),
         (WP,), "meta.json"),
    Case("hang/pretraining-sequences-sparse-index-npy", _sequences(lambda h: sparse(h / "sequences" / "index.npy")),
         (WP,), "index.npy"),
    Case("traceback/pretraining-sequences-deep-meta-json",
         _sequences(lambda h: (h / "sequences" / "meta.json").write_text(deep_json())), (WP,), "meta.json"),
    Case("traceback/pretraining-sequences-definition-not-an-object",
         _sequences(lambda h: edit_json(h / "sequences" / "meta.json", lambda m: m.update(definition=[1]))), (WP,),
         "meta.json"),
    Case("traceback/pretraining-sequences-window-a-string",
         _sequences(lambda h: edit_json(h / "sequences" / "meta.json", lambda m: m["definition"].update(window="4"))),
         (WP,), "meta.json"),
    Case("hang/plan-cut-fifo-idx", _plan_cut(lambda h: (h / "mega.idx").unlink() or fifo(h / "mega.idx")),
         (errors.MEGATRON_INDEX_INVALID,), "mega.idx"),
    Case("hang/plan-cut-sparse-idx", _plan_cut(lambda h: sparse(h / "mega.idx")), (errors.MEGATRON_INDEX_INVALID,),
         "mega.idx"),
    Case("hang/plan-cut-mix-fifo-idx", _plan_cut_mix(lambda h: (h / "mega.idx").unlink() or fifo(h / "mega.idx")),
         (errors.MEGATRON_INDEX_INVALID,), "mega.idx"),
]
WINDOWED_CASES = [
    Case("hang/windowed-plan-fifo-meta-json", _windowed(lambda h: fifo(h / "windowed" / "meta.json")), (WP,),
         "meta.json"),
    Case("hang/windowed-plan-fifo-index-npy", _windowed(lambda h: fifo(h / "windowed" / "index.npy")), (WP,),
         "index.npy"),
    Case("hang/windowed-plan-sparse-index-npy", _windowed(lambda h: sparse(h / "windowed" / "index.npy")), (WP,),
         "index.npy"),
    Case("traceback/windowed-plan-deep-meta-json",
         _windowed(lambda h: (h / "windowed" / "meta.json").write_text(deep_json())), (WP,), "meta.json"),
    Case("traceback/windowed-plan-meta-window-not-a-number",
         _windowed(lambda h: edit_json(h / "windowed" / "meta.json", lambda m: m["window"].update(window="16"))),
         (WP,), "meta.json"),
    Case("traceback/windowed-plan-meta-config-not-an-object",
         _windowed(lambda h: edit_json(h / "windowed" / "meta.json", lambda m: m.update(config=[1]))), (WP,),
         "meta.json"),
    Case("hang/windowed-plan-fifo-lengths-sidecar", _windowed(lambda h: fifo(h / "side.u32"), "side.u32"),
         (errors.LENGTHS_SIDECAR_MISMATCH,), "side.u32"),
    Case("hang/windowed-plan-build-fifo-u32", _window_build(lambda h: fifo(h / "side.u32"), "side.u32"),
         (errors.LENGTHS_SIDECAR_MISMATCH,), "side.u32"),
    Case("hang/windowed-plan-build-fifo-sidecar-beside-its-jsonl",
         _window_build(lambda h: (h / "lengths.jsonl.u32").unlink() or fifo(h / "lengths.jsonl.u32"), "lengths.jsonl"),
         (errors.LENGTHS_SIDECAR_MISMATCH,), "lengths.jsonl.u32"),
    Case("hang/windowed-plan-build-sparse-u32-of-10^8-lengths", _window_build(_sidecar_claiming(10**8), "big.u32"),
         (errors.LENGTHS_SIDECAR_MISMATCH,), "big.u32"),
    Case("hang/mixed-plan-build-fifo-u32-entry",
         _window_build(lambda h: fifo(h / "side.u32"), "lengths.jsonl", "side.u32", mix=True),
         (errors.LENGTHS_SIDECAR_MISMATCH,), "side.u32"),
    Case("hang/windowed-plan-sparse-sidecar-of-a-billion-lengths", _windowed(_sidecar_claiming(10**9), "big.u32"),
         (errors.PLAN_LENGTHS_MISMATCH,)),
    Case("traceback/windowed-plan-meta-pack-config-not-an-object",
         _windowed(lambda h: edit_json(h / "windowed" / "meta.json", lambda m: m.update(pack_config=[1]))), (WP,),
         "meta.json"),
    Case("hang/windowed-plan-info-world-size-2^32-1", _giant_world_info_windowed, (errors.BATCHING_CONFIG_INVALID,)),
]


def _mixed(change):
    """The mixed plan (two components over the length cache's sidecar) copied into ``here``, ``change(here)``
    applied, then opened and microbatch 0 planned."""
    def make(world, here):
        copy(world, here, "mixed", "lengths.jsonl")
        shutil.copy2(world / "lengths.jsonl.u32", here / "lengths.jsonl.u32")
        change(here)
        return api("from umlos_cuda.batching.plans.windows.io import load_mixed_plan\n"
                   f"guarded(lambda: load_mixed_plan({str(here / 'mixed')!r}).microbatch(0))\n")
    return make


def _mixed_cli(action: str, change):
    """``plan ACTION`` of the mixed plan copied into ``here`` with ``change(here)`` applied."""
    def make(world, here):
        copy(world, here, "mixed", "lengths.jsonl")
        shutil.copy2(world / "lengths.jsonl.u32", here / "lengths.jsonl.u32")
        change(here)
        return ("plan", action, str(here / "mixed"))
    return make


def _mixed_batches(change: Callable[[Path], None], *argv: str):
    """The batch folder of the mixed plan over the token store copied into ``here`` with the store (its plan copy
    pointed at that store), ``change(here)`` applied, then ``batch check`` run on it with ``argv``."""
    def make(world, here):
        copy(world, here, "batches-mixed", "store")
        edit_json(here / "batches-mixed" / "plan" / "meta.json",
                  lambda m: m.__setitem__("lengths_paths", [str(here / "store")] * 2))
        change(here)
        return ("batch", "check", str(here / "batches-mixed"), *argv)
    return make


def _mixed_index(change: Callable[[dict], None], *argv: str):
    return _mixed_batches(lambda h: edit_json(h / "batches-mixed" / "batches.json", change), *argv)


MIXED_BATCH_CASES = [
    Case("hang/batch-check-mixed-fifo-plan-meta-json", _mixed_batches(lambda h: fifo(h / "batches-mixed" / "plan" /
                                                                                     "meta.json")),
         (WP,), "meta.json"),
    Case("hang/batch-check-mixed-fifo-plan-index-npy", _mixed_batches(lambda h: fifo(h / "batches-mixed" / "plan" /
                                                                                     "index.npy")),
         (WP,), "index.npy"),
    Case("hang/batch-check-mixed-fifo-component-store-offsets",
         _mixed_batches(lambda h: (h / "store" / "offsets.npy").unlink() or fifo(h / "store" / "offsets.npy")),
         (S,), "offsets.npy"),
    Case("traceback/batch-check-mixed-plan-kind-number", _mixed_index(lambda d: d.__setitem__("plan_kind", 5)),
         (B,), "batches.json"),
    Case("traceback/batch-check-mixed-plan-kind-of-another-copy",
         _mixed_index(lambda d: d.__setitem__("plan_kind", "windowed plan")), (B,), "batches-mixed/plan"),
    Case("traceback/batch-check-mixed-sources-string", _mixed_index(lambda d: d.__setitem__("sources", "x")), (B,),
         "batches.json"),
    Case("traceback/batch-check-mixed-source-lengths-string",
         _mixed_index(lambda d: d["sources"][0].__setitem__("lengths", "x")), (B,), "batches.json"),
    Case("traceback/batch-check-mixed-source-without-identity",
         _mixed_index(lambda d: d["sources"][1].pop("identity")), (B,), "batches.json"),
    Case("traceback/batch-check-mixed-source-identity-list",
         _mixed_index(lambda d: d["sources"][1].__setitem__("identity", [1])), (B,), "batches.json"),
    Case("traceback/batch-check-mixed-one-source-for-two-components",
         lambda world, here: _mixed_index(lambda d: d.__setitem__("sources", d["sources"][:1]), "--source",
                                          str(here / "store"), str(here / "store"))(world, here),
         (B,), "batches-mixed"),
    Case("traceback/batch-check-mixed-layout-npz-with-a-token-type",
         _mixed_index(lambda d: d.update(layout="npz", token_dtype="<u2")), (B,), "batches.json"),
]


def _scheduled_build(change: Callable[[Path], None]):
    """``plan build --window --mix`` of the length cache with ``--mix-schedule schedule.json``, the file made by
    ``change(here)``: read by the bounded reader, each field checked (BATCHING_CONFIG_INVALID naming it)."""
    def make(world, here):
        argv = _window_build(lambda h: None, "lengths.jsonl", mix=True)(world, here)
        change(here)
        return (*argv, "--mix-schedule", str(here / "schedule.json"))
    return make


def _scheduled_cut(change: Callable[[Path], None]):
    """``plan cut --mix`` of the Megatron pair with ``--mix-schedule schedule.json``, the file made by
    ``change(here)``."""
    def make(world, here):
        argv = _plan_cut_mix(lambda h: None)(world, here)
        change(here)
        return (*argv, "--mix-schedule", str(here / "schedule.json"))
    return make


def _schedule_file(value) -> Callable[[Path], None]:
    return lambda h: write_json(h / "schedule.json", value)


def _mixed_schedule(change: Callable[[dict], None]):
    """The mixed plan's meta.json given a schedule by ``change(schedule)`` (a held one to start from)."""
    def edit(meta: dict) -> None:
        meta["mixture"]["schedule"] = {"pieces": [{"at": 0, "weights": [[7, 10], [3, 10]], "ramp": False}]}
        change(meta["mixture"]["schedule"])
    return _mixed(lambda h: edit_json(h / "mixed" / "meta.json", edit))


BC = errors.BATCHING_CONFIG_INVALID
SCHEDULE_CASES = [
    Case("hang/mixed-plan-build-fifo-schedule", _scheduled_build(lambda h: fifo(h / "schedule.json")), (BC,),
         "schedule.json"),
    Case("hang/mixed-plan-build-sparse-schedule", _scheduled_build(lambda h: sparse(h / "schedule.json", b'{"a": "')),
         (BC,), "schedule.json"),
    Case("traceback/mixed-plan-build-deep-schedule",
         _scheduled_build(lambda h: (h / "schedule.json").write_text(deep_json('{"pieces": ', "}"))), (BC,),
         "schedule.json"),
    Case("traceback/mixed-plan-build-schedule-not-an-object", _scheduled_build(_schedule_file([1])), (BC,),
         "schedule.json"),
    Case("traceback/mixed-plan-build-schedule-pieces-not-a-list", _scheduled_build(_schedule_file({"pieces": 3})),
         (BC,), "schedule.json"),
    Case("traceback/mixed-plan-build-schedule-weight-a-string",
         _scheduled_build(_schedule_file({"pieces": [{"at": 0, "weights": {"lengths": "1"}}]})), (BC,),
         "schedule.json"),
    Case("traceback/mixed-plan-build-schedule-weights-a-list",
         _scheduled_build(_schedule_file({"pieces": [{"at": 0, "weights": [1]}]})), (BC,), "schedule.json"),
    Case("traceback/mixed-plan-build-schedule-at-a-huge-float",
         _scheduled_build(_schedule_file({"pieces": [{"at": 1e308, "weights": {}}]})), (BC,), "schedule.json"),
    Case("hang/mixed-plan-build-schedule-steps-of-2^64-samples",
         _scheduled_build(_schedule_file({"unit": "steps", "global_batch": 2**64, "pieces": [
             {"at": 0, "weights": {}, "ramp": True}, {"at": 2**64, "weights": {}}]})), (BC,), "schedule.json"),
    Case("traceback/mixed-plan-meta-schedule-not-an-object", _mixed(lambda h: edit_json(
        h / "mixed" / "meta.json", lambda m: m["mixture"].update(schedule=[1]))), (WP,), "meta.json"),
    Case("traceback/mixed-plan-meta-schedule-at-a-string",
         _mixed_schedule(lambda s: s["pieces"][0].update(at="0")), (WP,), "meta.json"),
    Case("traceback/mixed-plan-meta-schedule-weight-not-a-pair",
         _mixed_schedule(lambda s: s["pieces"][0].update(weights=[0.7, 0.3])), (WP,), "meta.json"),
    Case("traceback/mixed-plan-meta-schedule-ramp-not-a-bool",
         _mixed_schedule(lambda s: s["pieces"][0].update(ramp="no")), (WP,), "meta.json"),
    Case("traceback/mixed-plan-meta-schedule-added", _mixed_schedule(lambda s: None),
         (errors.PLAN_FINGERPRINT_MISMATCH,)),
    Case("hang/plan-cut-mix-fifo-schedule", _scheduled_cut(lambda h: fifo(h / "schedule.json")), (BC,),
         "schedule.json"),
    Case("traceback/plan-cut-mix-schedule-unknown-name",
         _scheduled_cut(_schedule_file({"pieces": [{"at": 0, "weights": {"web": 1}}]})), (BC,), "schedule.json"),
    Case("traceback/mixed-sequences-meta-schedule-not-an-object",
         _mixed_sequences(lambda d: edit_json(d / "meta.json", lambda m: m.update(schedule=[1]))), (WP,),
         "meta.json"),
]



def _with(make, *extra: str):
    """The argv ``make`` builds with ``extra`` options after it."""
    return lambda world, here: (*make(world, here), *extra)


def _mixed_unit(unit):
    """The mixed plan's meta.json given ``mixture.unit`` (a plan counted in samples records none)."""
    return _mixed(lambda h: edit_json(h / "mixed" / "meta.json", lambda m: m["mixture"].update(unit=unit)))


UNIT_CASES = [
    Case("traceback/mixed-plan-meta-unit-a-list", _mixed_unit([1]), (WP,), "meta.json"),
    Case("traceback/mixed-plan-meta-unit-samples-recorded", _mixed_unit("samples"), (WP,), "meta.json"),
    Case("traceback/mixed-plan-meta-unit-added", _mixed_unit("tokens"), (errors.PLAN_FINGERPRINT_MISMATCH,)),
    Case("traceback/mixed-plan-build-loss-tokens-over-a-length-cache",
         _with(_window_build(lambda h: None, "lengths.jsonl", mix=True), "--mix-unit", "loss-tokens"),
         (errors.TOKEN_STORE_NOT_FOUND,), "lengths.jsonl"),
    Case("traceback/plan-cut-mix-unit-tokens", _with(_plan_cut_mix(lambda h: None), "--mix-unit", "tokens"), (BC,)),
]

MIXED_CASES = [
    Case("hang/mixed-plan-info-fifo-meta-json", _mixed_cli("info", lambda h: fifo(h / "mixed" / "meta.json")),
         (WP,), "meta.json"),
    Case("hang/mixed-plan-verify-fifo-index-npy", _mixed_cli("verify", lambda h: fifo(h / "mixed" / "index.npy")),
         (WP,), "index.npy"),
    Case("hang/mixed-plan-fifo-meta-json", _mixed(lambda h: fifo(h / "mixed" / "meta.json")), (WP,), "meta.json"),
    Case("hang/mixed-plan-fifo-index-npy", _mixed(lambda h: fifo(h / "mixed" / "index.npy")), (WP,), "index.npy"),
    Case("hang/mixed-plan-sparse-index-npy", _mixed(lambda h: sparse(h / "mixed" / "index.npy")), (WP,),
         "index.npy"),
    Case("traceback/mixed-plan-deep-meta-json", _mixed(lambda h: (h / "mixed" / "meta.json").write_text(deep_json())),
         (WP,), "meta.json"),
    Case("traceback/mixed-plan-components-not-a-list",
         _mixed(lambda h: edit_json(h / "mixed" / "meta.json", lambda m: m["mixture"].update(components={}))),
         (WP,), "meta.json"),
    Case("traceback/mixed-plan-weight-not-a-pair",
         _mixed(lambda h: edit_json(h / "mixed" / "meta.json",
                                    lambda m: m["mixture"]["components"][0].update(weight=0.7))), (WP,), "meta.json"),
    Case("traceback/mixed-plan-cap-not-a-number",
         _mixed(lambda h: edit_json(h / "mixed" / "meta.json",
                                    lambda m: m["mixture"]["components"][1].update(max_epochs="2"))), (WP,),
         "meta.json"),
    Case("traceback/mixed-plan-weight-changed",
         _mixed(lambda h: edit_json(h / "mixed" / "meta.json",
                                    lambda m: m["mixture"]["components"][0].update(weight=[3, 4]))),
         (errors.PLAN_FINGERPRINT_MISMATCH,)),
    Case("hang/mixed-plan-fifo-lengths-sidecar",
         _mixed(lambda h: (h / "lengths.jsonl.u32").unlink() or fifo(h / "lengths.jsonl.u32")),
         (errors.LENGTHS_SIDECAR_MISMATCH,), "lengths.jsonl.u32"),
]


# ---------------------------------------------------------------------- datasets in other formats (batching/records/)
DU = errors.DATASET_UNREADABLE


def _parquet(world, here, name: str = "train.parquet") -> Path:
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    pq.write_table(pj.read_json(world / "train.jsonl"), here / name)
    return here / name


def _truncated_parquet(world, here):
    copy(world, here, "model")
    path = _parquet(world, here)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])  # a copy cut short: no footer
    return lengths_build(here, "train.parquet")


def _parquet_footer_past_the_file(world, here):
    copy(world, here, "model")
    path = _parquet(world, here)
    data = path.read_bytes()
    path.write_bytes(data[:-8] + struct.pack("<I", 0x7FFFFFF0) + b"PAR1")  # a footer of 2 GiB in a small file
    return lengths_build(here, "train.parquet")


def _parquet_named_jsonl(world, here):
    copy(world, here, "model")
    _parquet(world, here, "train.jsonl")
    return lengths_build(here)


def _parquet_text_of_integers(world, here):
    import pyarrow as pa
    import pyarrow.parquet as pq

    copy(world, here, "model")
    pq.write_table(pa.table({"text": pa.array([1, 2, 3], pa.int64())}), here / "train.parquet")
    return ("data", "tokenize", "--dataset", str(here / "train.parquet"), "--tokenizer", str(here / "model"),
            "--output", str(here / "out"), "--quiet")


def _parquet_negative_length(world, here):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"n": pa.array([3, -1], pa.int64())}), here / "train.parquet")
    return ("data", "lengths", "build", "--dataset", str(here / "train.parquet"), "--length-field", "n",
            "--output", str(here / "out"), "--quiet")


def _shards(world, here, count: int = 3) -> None:
    lines = (world / "train.jsonl").read_bytes().splitlines(keepends=True)
    for i in range(count):
        (here / f"shard-{i}.jsonl").write_bytes(b"".join(lines[i::count]))


def _shard_glob(here) -> tuple:
    return ("data", "lengths", "build", "--dataset", str(here / "shard-*.jsonl"), "--tokenizer", str(here / "model"),
            "--output", str(here / "out"), "--quiet")


def _symlinked_shard_fifo(world, here):
    copy(world, here, "model")
    _shards(world, here, 2)
    os.mkfifo(here / "pipe")
    os.symlink(here / "pipe", here / "shard-2.jsonl")
    return _shard_glob(here)


def _symlinked_shard_repeats(world, here):
    copy(world, here, "model")
    _shards(world, here, 2)
    os.symlink(here / "shard-0.jsonl", here / "shard-2.jsonl")
    return _shard_glob(here)


def _glob_matches_nothing(world, here):
    copy(world, here, "model")
    return _shard_glob(here)


def _folder_not_save_to_disk(world, here):
    copy(world, here, "model")
    (here / "data").mkdir()
    copy(world, here / "data", "train.jsonl")
    return lengths_build(here, "data")


def _deep_datasets_state(world, here):
    copy(world, here, "model")
    (here / "data").mkdir()
    (here / "data" / "state.json").write_text(deep_json('{"_data_files": ', "}"))
    return lengths_build(here, "data")


def _datasets_state_escapes(world, here):
    copy(world, here, "model")
    (here / "data").mkdir()
    write_json(here / "data" / "state.json", {"_data_files": [{"filename": "../train.jsonl"}]})
    return lengths_build(here, "data")


def _gzip_bomb(world, here):
    import gzip

    copy(world, here, "model")
    with gzip.open(here / "train.jsonl.gz", "wb", compresslevel=1) as handle:
        for _ in range(80):
            handle.write(b"\0" * (1 << 20))  # one line of 80 MiB: over the 64 MiB line cap
    return lengths_build(here, "train.jsonl.gz")


def _zstd_bomb(world, here):
    """1 GiB of 8 MiB bad lines, skipped as read (--skip-bad-lines), in 32 KiB: the decompression cap,
    not a bad line or the line cap, is what stops it, a few lines past the cap (a bomb of blank lines
    is stopped by the same cap, but reading 10^8 one-byte lines to it takes half a minute)."""
    import zstandard

    copy(world, here, "model")
    with open(here / "train.jsonl.zst", "wb") as raw, zstandard.ZstdCompressor(level=3).stream_writer(raw) as handle:
        handle.write((world / "train.jsonl").read_bytes())
        for _ in range(1 << 7):
            handle.write(b"x" * ((8 << 20) - 1) + b"\n")
    return (*lengths_build(here, "train.jsonl.zst"), "--skip-bad-lines")


def _zstd_not_zstd(world, here):
    copy(world, here, "model", "train.jsonl")
    os.rename(here / "train.jsonl", here / "train.jsonl.zst")
    return lengths_build(here, "train.jsonl.zst")


# ---------------------------------------------------------------------- truncation and columnar rows (issue 33)
def _tokenize(here, dataset: str, *extra: str) -> tuple:
    return ("data", "tokenize", "--dataset", str(here / dataset), "--tokenizer", str(here / "model"),
            "--output", str(here / "out"), "--quiet", *extra)


def _table(world):
    import pyarrow.json as pj

    return pj.read_json(world / "train.jsonl")


def _arrow_stream(table) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=20)
    return sink.getvalue().to_pybytes()


def _arrow_file(table, path: Path) -> None:
    import pyarrow as pa

    with pa.ipc.new_file(path, table.schema) as writer:
        writer.write_table(table)


def _arrow_stream_cut(world, here):
    """What an interrupted copy leaves: every record batch but the end-of-stream marker (8 bytes)."""
    copy(world, here, "model")
    (here / "train.arrow").write_bytes(_arrow_stream(_table(world))[:-8])
    return _tokenize(here, "train.arrow")


def _arrow_stream_cut_inside_a_batch(world, here):
    copy(world, here, "model")
    data = _arrow_stream(_table(world))
    (here / "train.arrow").write_bytes(data[:len(data) // 2])
    return lengths_build(here, "train.arrow")


def _arrow_streams_joined(world, here):
    copy(world, here, "model")
    table = _table(world)
    (here / "train.arrow").write_bytes(_arrow_stream(table.slice(0, 30)) + _arrow_stream(table.slice(30)))
    return _tokenize(here, "train.arrow")


def _save_to_disk(world, here) -> Path:
    import datasets

    datasets.disable_progress_bars()
    datasets.Dataset(_table(world)).save_to_disk(str(here / "data"), max_shard_size="8KB")
    return here / "data"


def _save_to_disk_file_cut(world, here):
    copy(world, here, "model")
    files = sorted(_save_to_disk(world, here).glob("data-*.arrow"))
    files[-1].write_bytes(files[-1].read_bytes()[:-8])
    return _tokenize(here, "data")


def _save_to_disk_state_lost_a_file(world, here):
    copy(world, here, "model")
    folder = _save_to_disk(world, here)
    edit_json(folder / "state.json", lambda state: state["_data_files"].pop(1))
    return _tokenize(here, "data")


def _save_to_disk_link_out(name: str):
    def make(world, here):
        copy(world, here, "model")
        folder = _save_to_disk(world, here)
        target = sorted(folder.glob("data-*.arrow"))[0] if name == "data" else folder / name
        shutil.move(target, here / "outside")
        os.symlink(here / "outside", target)
        return _tokenize(here, "data")

    return make


def _zstd_written_block_by_block_cut(world, here):
    """One frame written by a streaming exporter, a block flushed every 10 lines; cut after the second block."""
    import zstandard

    copy(world, here, "model")
    lines = (world / "train.jsonl").read_bytes().splitlines(keepends=True)
    out = io.BytesIO()
    writer = zstandard.ZstdCompressor().stream_writer(out, closefd=False)
    ends = []
    for start in range(0, len(lines), 10):
        writer.write(b"".join(lines[start:start + 10]))
        writer.flush(zstandard.FLUSH_BLOCK)
        ends.append(out.tell())
    writer.close()
    (here / "train.jsonl.zst").write_bytes(out.getvalue()[:ends[1]])
    return _tokenize(here, "train.jsonl.zst")


def _zstd_cut(keep: Callable[[int], int]):
    def make(world, here):
        import zstandard

        copy(world, here, "model")
        data = zstandard.ZstdCompressor().compress((world / "train.jsonl").read_bytes())
        (here / "train.jsonl.zst").write_bytes(data[:keep(len(data))])
        return _tokenize(here, "train.jsonl.zst")

    return make


def _gzip_cut(keep: Callable[[int], int]):
    def make(world, here):
        import gzip

        copy(world, here, "model")
        data = gzip.compress((world / "train.jsonl").read_bytes())
        (here / "train.jsonl.gz").write_bytes(data[:keep(len(data))])
        return _tokenize(here, "train.jsonl.gz")

    return make


def _parquet_value_of_200_mb(world, here):
    """200 MB of one repeated word in a file of about 19 KB."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    copy(world, here, "model")
    pq.write_table(pa.table({"text": ["a " * (100 << 20)]}), here / "train.parquet", compression="zstd")
    return _tokenize(here, "train.parquet")


def _parquet_dictionary_bomb(world, here):
    """A million rows naming one 64 KiB dictionary value: 64 GB from a file of a few kilobytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    copy(world, here, "model")
    column = pa.DictionaryArray.from_arrays(pa.array(np.zeros(1 << 20, dtype=np.int32)), pa.array(["a " * (1 << 15)]))
    pq.write_table(pa.table({"text": column}), here / "train.parquet", compression="zstd", store_schema=False)
    return _tokenize(here, "train.parquet")


def _arrow_ipc_compressed_bomb(world, here):
    """An Arrow IPC file whose buffers are zstd-compressed: 100 MB of one letter in a few kilobytes."""
    import pyarrow as pa

    copy(world, here, "model")
    table = pa.table({"text": ["b" * (100 << 20)]})
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_file(here / "train.arrow", table.schema, options=options) as writer:
        writer.write_table(table)
    return _tokenize(here, "train.arrow")


def _parquet_record_over_the_cap(*extra: str):
    """One row of 65 MiB of letters that do not compress (under the expansion cap, over the record cap)."""
    def make(world, here):
        import pyarrow as pa
        import pyarrow.parquet as pq

        copy(world, here, "model")
        letters = np.random.default_rng(5).integers(97, 123, size=(65 << 20) + 1, dtype=np.uint8).tobytes()
        pq.write_table(pa.table({"text": ["the fox", letters.decode(), "a lazy dog"]}), here / "train.parquet",
                       compression="none", use_dictionary=False)
        return _tokenize(here, "train.parquet", *extra)

    return make


def _not_utf8(values: list[bytes]):
    import pyarrow as pa

    offsets = np.cumsum([0] + [len(v) for v in values]).astype(np.int32)
    return pa.Array.from_buffers(pa.string(), len(values), [None, pa.py_buffer(offsets.tobytes()),
                                                             pa.py_buffer(b"".join(values))])


def _columnar_not_utf8(suffix: str, column: str = "text", *extra: str):
    def make(world, here):
        import pyarrow as pa
        import pyarrow.parquet as pq

        copy(world, here, "model")
        bad = _not_utf8([b"r0", b"r1", b"r\xff2"] if column == "id" else [b"the fox", b"caf\xe9", b"\xed\xa0\xbd"])
        good = pa.array(["r0", "r1", "r2"] if column == "text" else ["the fox", "a dog", "over"])
        table = pa.table({column: bad, "id" if column == "text" else "text": good})
        if suffix == "parquet":
            pq.write_table(table, here / "train.parquet")
        else:
            _arrow_file(table, here / f"train.{suffix}")
        return _tokenize(here, f"train.{suffix}", *extra)

    return make


def _two_columns_named_text(suffix: str):
    def make(world, here):
        import pyarrow as pa
        import pyarrow.parquet as pq

        copy(world, here, "model")
        table = pa.Table.from_arrays([pa.array(["the fox"]), pa.array(["a lazy dog"])], names=["text", "text"])
        if suffix == "parquet":
            pq.write_table(table, here / "train.parquet")
        else:
            _arrow_file(table, here / f"train.{suffix}")
        return _tokenize(here, f"train.{suffix}")

    return make


def _pandas_category_column(world, here):
    import pandas as pd

    copy(world, here, "model")
    pd.DataFrame({"text": pd.Categorical(["the fox", "a lazy dog", "the fox"])}).to_parquet(here / "train.parquet")
    return _tokenize(here, "train.parquet")


def _jsonl_lone_surrogate(*extra: str):
    def make(world, here):
        copy(world, here, "model")
        (here / "train.jsonl").write_text('{"text": "the fox"}\n{"text": "a cut emoji \\ud83d"}\n'
                                          '{"text": "a lazy dog"}\n')
        return _tokenize(here, "train.jsonl", *extra)

    return make


TRUNCATION_AND_ROW_CASES = [
    Case("loss/data-tokenize-arrow-stream-cut-between-record-batches", _arrow_stream_cut, (DU,), "train.arrow"),
    Case("loss/data-lengths-build-arrow-stream-cut-inside-a-record-batch", _arrow_stream_cut_inside_a_batch, (DU,),
         "train.arrow"),
    Case("loss/data-tokenize-two-arrow-streams-joined", _arrow_streams_joined, (DU,), "train.arrow"),
    Case("loss/data-tokenize-save-to-disk-file-cut-between-record-batches", _save_to_disk_file_cut, (DU,),
         "data-0000"),
    Case("loss/data-tokenize-save-to-disk-state-lost-a-file", _save_to_disk_state_lost_a_file, (DU,), "state.json"),
    Case("loss/data-tokenize-zstd-written-block-by-block-cut-after-a-block", _zstd_written_block_by_block_cut, (DU,),
         "train.jsonl.zst"),
    Case("loss/data-tokenize-zstd-one-shot-cut-inside-its-block", _zstd_cut(lambda n: n // 2), (DU,),
         "train.jsonl.zst"),
    Case("loss/data-tokenize-zstd-cut-inside-its-magic", _zstd_cut(lambda n: 3), (DU,), "train.jsonl.zst"),
    Case("loss/data-tokenize-zstd-of-no-bytes", _zstd_cut(lambda n: 0), (DU,), "train.jsonl.zst"),
    Case("loss/data-tokenize-gzip-cut-before-its-trailer", _gzip_cut(lambda n: n - 4), (DU,), "train.jsonl.gz"),
    Case("loss/data-tokenize-gzip-of-no-bytes", _gzip_cut(lambda n: 0), (DU,), "train.jsonl.gz"),
    Case("hang/data-tokenize-parquet-value-of-200-mb-from-19-kb", _parquet_value_of_200_mb, (DU,), "train.parquet"),
    Case("hang/data-tokenize-parquet-dictionary-bomb", _parquet_dictionary_bomb, (DU,), "train.parquet"),
    Case("hang/data-tokenize-arrow-ipc-compressed-bomb", _arrow_ipc_compressed_bomb, (DU,), "train.arrow"),
    Case("hang/data-tokenize-parquet-record-over-the-cap", _parquet_record_over_the_cap(), (D,), "row 1"),
    Case("user/data-tokenize-parquet-record-over-the-cap-skipped", _parquet_record_over_the_cap("--skip-bad-lines"),
         ()),
    Case("traceback/data-tokenize-parquet-text-not-utf-8", _columnar_not_utf8("parquet"), (D,), "row 1"),
    Case("traceback/data-tokenize-arrow-text-not-utf-8", _columnar_not_utf8("arrow"), (D,), "row 1"),
    Case("traceback/data-tokenize-parquet-id-not-utf-8", _columnar_not_utf8("parquet", "id"), (D,), "row 2"),
    Case("user/data-tokenize-parquet-text-not-utf-8-skipped", _columnar_not_utf8("parquet", "text",
                                                                                   "--skip-bad-lines"), ()),
    Case("user/data-tokenize-parquet-two-columns-named-text", _two_columns_named_text("parquet"), (D,),
         "train.parquet"),
    Case("user/data-tokenize-arrow-two-columns-named-text", _two_columns_named_text("arrow"), (D,), "train.arrow"),
    Case("user/data-tokenize-parquet-pandas-category-column", _pandas_category_column, ()),
    Case("traceback/data-tokenize-jsonl-lone-surrogate", _jsonl_lone_surrogate(), (D,), "line 2"),
    Case("user/data-tokenize-jsonl-lone-surrogate-skipped", _jsonl_lone_surrogate("--skip-bad-lines"), ()),
    Case("tamper/data-tokenize-save-to-disk-file-links-outside", _save_to_disk_link_out("data"), (DU,),
         "outside"),
    Case("tamper/data-tokenize-save-to-disk-state-links-outside", _save_to_disk_link_out("state.json"), (DU,),
         "outside"),
]


# ---------------------------------------------------------------------- silent acceptances (issue 34)
def _id_field_missing(suffix: str):
    """``--id-field uid`` over rows without it: numbered by row before, without a word."""
    def make(world, here):
        copy(world, here, "model", "train.jsonl")
        if suffix == "parquet":
            _parquet(world, here)
        return _tokenize(here, f"train.{suffix}", "--id-field", "uid")
    return make


CHATML = ("{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + '</s>' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")


def _chat_without_an_assistant_turn(*extra: str):
    """A user-only record and a "bot" one beside one that trains: all-zero loss masks trained on as nothing."""
    def make(world, here):
        copy(world, here, "model")
        edit_json(here / "model" / "tokenizer_config.json", lambda c: c.__setitem__("chat_template", CHATML))
        records = [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
                   [{"role": "user", "content": "hi"}], [{"role": "user", "content": "hi"}, {"role": "bot",
                                                                                            "content": "yo"}]]
        (here / "chat.jsonl").write_text("".join(json.dumps({"messages": m}) + "\n" for m in records))
        return _tokenize(here, "chat.jsonl", "--messages-field", "messages", *extra)
    return make


def _plan_cut_length_cache_of_a_store(*fifos: str):
    """``plan cut --source store/lengths.jsonl``: the message names the store's folder, read from its marker
    (or its meta.json), which ``fifos`` replace with FIFOs: read without blocking, or not at all."""
    def make(world, here):
        copy(world, here, "store")
        for name in fifos:
            fifo(here / "store" / name)
        return ("plan", "cut", "--source", str(here / "store" / "lengths.jsonl"), "--sequence-length", "16",
                "--output", str(here / "out"))
    return make


def _append_onto_a_classic_store(*fifos: str):
    """``data tokenize --append`` naming a classic token store (its marker, its meta.json FIFOs with ``fifos``)."""
    def make(world, here):
        copy(world, here, "store", "model", "train.jsonl")
        for name in fifos:
            fifo(here / "store" / name)
        return ("data", "tokenize", "--dataset", str(here / "train.jsonl"), "--tokenizer", str(here / "model"),
                "--output", str(here / "store"), "--quiet", "--append")
    return make


SILENT_ACCEPTANCE_CASES = [
    Case("user/data-tokenize-append-onto-a-classic-store", _append_onto_a_classic_store(),
         (errors.SHARDED_STORE_INVALID,), "is a token store, not a sharded one"),
    Case("hang/data-tokenize-append-onto-a-store-fifo-marker-and-meta",
         _append_onto_a_classic_store("umlos-artifact.json", "meta.json"), (SH, errors.TOKEN_STORE_NOT_FOUND),
         "meta.json"),
    Case("user/plan-cut-length-cache-of-a-store", _plan_cut_length_cache_of_a_store(),
         (errors.TOKEN_STORE_NOT_FOUND,), "give the folder"),
    Case("hang/plan-cut-length-cache-of-a-store-fifo-marker-and-meta",
         _plan_cut_length_cache_of_a_store("umlos-artifact.json", "meta.json"), (errors.TOKEN_STORE_NOT_FOUND,),
         "lengths.jsonl"),
    Case("user/data-tokenize-jsonl-id-field-missing", _id_field_missing("jsonl"), (D,), "train.jsonl"),
    Case("user/data-tokenize-parquet-id-field-missing", _id_field_missing("parquet"), (D,), "train.parquet"),
    Case("user/data-tokenize-chat-record-without-an-assistant-turn", _chat_without_an_assistant_turn(), (D,),
         "chat.jsonl"),
    Case("user/data-tokenize-chat-records-without-an-assistant-turn-skipped",
         _chat_without_an_assistant_turn("--skip-bad-lines"), ()),
]


# ---------------------------------------------------------------------- batch file layouts (batches/layouts.py)
def first_batch_file(folder: Path) -> Path:
    return sorted(p for p in folder.glob("epoch_*_batch_*.npz*"))[0]


def _layout_fifo(folder: str):
    def make(world, here):
        copy(world, here, folder)
        fifo(first_batch_file(here / folder))
        return ("batch", "check", str(here / folder))
    return make


def _layout_symlink_to_fifo(folder: str):
    """The file is a symbolic link (followed, like every input) to a FIFO beside the folder."""
    def make(world, here):
        copy(world, here, folder)
        os.mkfifo(here / "pipe")
        path = first_batch_file(here / folder)
        path.unlink()
        os.symlink(here / "pipe", path)
        return ("batch", "check", str(here / folder))
    return make


def _layout_symlink_to_sparse(world, here):
    copy(world, here, "batches-zstd")
    sparse(here / "huge.zst", size=8 << 30)
    path = first_batch_file(here / "batches-zstd")
    path.unlink()
    os.symlink(here / "huge.zst", path)
    return ("batch", "check", str(here / "batches-zstd"))


def _layout_truncated(folder: str):
    def make(world, here):
        copy(world, here, folder)
        path = first_batch_file(here / folder)
        path.write_bytes(path.read_bytes()[:100])
        return ("batch", "check", str(here / folder))
    return make


def _compact_member(folder: str, name: str, array_or_header):
    """The first file of ``folder`` with member ``name`` replaced (an array, or raw .npy bytes)."""
    def make(world, here):
        import zstandard

        copy(world, here, folder)
        path = first_batch_file(here / folder)
        data = path.read_bytes()
        if path.suffix == ".zst":
            data = zstandard.ZstdDecompressor().decompress(data)
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = {info.filename: archive.read(info) for info in archive.infolist()}
        if isinstance(array_or_header, bytes):
            members[f"{name}.npy"] = array_or_header
        else:
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, array_or_header)
            members[f"{name}.npy"] = buffer.getvalue()
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
            for member, raw in members.items():
                archive.writestr(member, raw)
        data = buffer.getvalue()
        if path.suffix == ".zst":
            data = zstandard.ZstdCompressor().compress(data)
        path.write_bytes(data)
        return ("batch", "check", str(here / folder))
    return make


def _verify_batches_fifo(folder: str, action: str):
    """`batch fingerprint|verify --batches`: the files are read (and decoded) to hash them."""
    def make(world, here):
        copy(world, here, folder, "fingerprint.json")
        fifo(first_batch_file(here / folder))
        extra = ("--expected-fingerprint", str(here / "fingerprint.json")) if action == "verify" else ()
        return ("batch", action, "--batches", str(here / folder), *extra)
    return make


def _index_store_fifo(world, here):
    """An index-only folder reads nothing but batches.json, its plan and the store: a FIFO in the store."""
    copy(world, here, "batches-index", "store")
    fifo(here / "store" / "tokens.npy")
    return ("batch", "check", str(here / "batches-index"), "--store", str(here / "store"))


def _huge_npy_header() -> bytes:
    """A .npy header of 1 MiB (padding spaces), past the reader's 10,000-byte header cap."""
    text = "{'descr': '<u2', 'fortran_order': False, 'shape': (4,), }" + " " * (1 << 20) + "\n"
    return b"\x93NUMPY\x02\x00" + struct.pack("<I", len(text)) + text.encode("latin1") + bytes(8)


def _zstd_bomb_file(with_size: bool):
    """A .npz.zst of 1.1 GiB of zeros in about 40 KiB: stating its size (refused by the size in its
    header, past the 1 GiB cap, before anything is decompressed) or not (refused: no stated size)."""
    def make(world, here):
        import zstandard

        copy(world, here, "batches-zstd")
        path = first_batch_file(here / "batches-zstd")
        total = (1 << 30) + (100 << 20)
        block = bytes(16 << 20)
        with open(path, "wb") as raw, zstandard.ZstdCompressor(level=1, write_content_size=with_size).stream_writer(
                raw, size=total if with_size else -1) as handle:
            for _ in range(total // len(block)):
                handle.write(block)
            handle.write(bytes(total % len(block)))
        return ("batch", "check", str(here / "batches-zstd"))
    return make


def _zstd_frame_lies_about_its_size(world, here):
    """A frame whose header says 100 bytes and whose data holds 64 MiB: decompression stops at 100."""
    import zstandard

    copy(world, here, "batches-zstd")
    path = first_batch_file(here / "batches-zstd")
    honest = zstandard.ZstdCompressor(level=1, write_content_size=False).compress(bytes(64 << 20))
    small = zstandard.ZstdCompressor(level=1).compress(bytes(100))
    # the frame header of ``small`` (which states 100 bytes) over the blocks of ``honest``
    head = zstandard.frame_header_size(small)
    path.write_bytes(small[:head] + honest[zstandard.frame_header_size(honest):])
    return ("batch", "check", str(here / "batches-zstd"))


# ------------------------------------------------------------------ umlos-cuda info / verify (any artifact)
A = errors.ARTIFACT_UNKNOWN


def _artifact_fifo(world, here):
    fifo(here / "x")
    return ("info", str(here / "x"))


def _marker_only(text: str):
    def make(world, here):
        (here / "thing").mkdir()
        (here / "thing" / "umlos-artifact.json").write_text(text)
        return ("verify", str(here / "thing"))
    return make


def _artifact_plan_fifo_meta(world, here):
    copy(world, here, "plan")
    fifo(here / "plan" / "meta.json")
    return ("info", str(here / "plan"))


def _artifact_sparse_cache(world, here):
    copy(world, here, "lengths.jsonl")
    sparse(here / "lengths.jsonl")
    return ("verify", str(here / "lengths.jsonl"))


def _artifact_megatron_fifo_idx(world, here):
    copy(world, here, "mega")
    fifo(here / "mega.idx")
    return ("info", str(here / "mega"))


def _artifact_gym_fifo_log(world, here):
    from umlos_cuda.streams.window.log import GYM_RUN

    copy(world, here, "run")
    (here / "run" / "umlos-artifact.json").write_bytes(GYM_RUN.marker_bytes())  # as `gym run` marks its folder
    fifo(here / "run" / "windows.jsonl")
    return ("verify", str(here / "run"))


def _artifact_shards_fifo_index(world, here):
    from umlos_cuda.batching.plans.io import load_plan, save_shards

    save_shards(load_plan(world / "plan"), 2, here / "shards")
    fifo(here / "shards" / "shards.json")
    return ("verify", str(here / "shards"))


def _artifact_store_fifo_offsets(world, here):
    copy(world, here, "store")
    fifo(here / "store" / "offsets.npy")
    return ("verify", str(here / "store"))


def _config(make_file):
    def make(world, here):
        make_file(here / "c.yaml")
        return ("plan", "build", "--config", str(here / "c.yaml"), "--output", str(here / "out"))
    return make


ARTIFACT_CASES = [
    Case("hang/info-fifo-path", _artifact_fifo, (A,), "x"),
    Case("hang/info-plan-fifo-meta-json", _artifact_plan_fifo_meta, (P, errors.PLAN_NOT_FOUND), "meta.json"),
    Case("hang/info-megatron-fifo-idx", _artifact_megatron_fifo_idx, (errors.MEGATRON_INDEX_INVALID,), "mega.idx"),
    Case("hang/verify-sparse-length-cache", _artifact_sparse_cache,
         (errors.LENGTHS_INVALID, errors.LENGTHS_SIDECAR_MISMATCH), "lengths.jsonl"),
    Case("hang/verify-gym-run-fifo-log", _artifact_gym_fifo_log, (errors.WINDOW_LOG_INVALID,), "windows.jsonl"),
    Case("hang/verify-shard-set-fifo-index", _artifact_shards_fifo_index, (P, errors.PLAN_NOT_FOUND), "shards.json"),
    Case("hang/verify-store-fifo-offsets", _artifact_store_fifo_offsets, (S,), "offsets.npy"),
    Case("traceback/verify-marker-of-an-unknown-kind", _marker_only(
        '{"artifact":"nonsense","format":"umlos-cuda/artifact-v1"}'), (A,), "thing"),
    Case("traceback/verify-deep-json-marker", _marker_only(deep_json()), (A,), "thing"),
    Case("hang/plan-build-fifo-config", _config(fifo), (errors.INVALID_ARGUMENT,), "c.yaml"),
    Case("hang/plan-build-sparse-config", _config(sparse), (errors.INVALID_ARGUMENT,), "c.yaml"),
    Case("traceback/plan-build-deep-yaml-config", _config(lambda p: p.write_text("a: " + deep_json())),
         (errors.INVALID_ARGUMENT,), "c.yaml"),
]


# -- integers: every integer read from text goes through checks.integer_text; ids and counts bounded by what
#    the data holds (issue 33, "Nothing lost, nothing trusted blindly II")
def _cut_eos(source: str, eos: str):
    """``plan cut --eos EOS`` over the world's ``source`` (a token store or the Megatron pair) copied into ``here``."""
    def make(world, here):
        copy(world, here, source)
        return ("plan", "cut", "--source", str(here / source), "--sequence-length", "16", "--window", "4", "--eos",
                eos, "--output", str(here / "out"), "--quiet")
    return make


def _vocab_size(world) -> int:
    return json.loads((world / "store" / "meta.json").read_text())["vocab_size"]


def _separator_past_the_vocabulary(world, here):
    """A plan packed with one separator over the store, and ``batch generate --separator-ids VOCAB_SIZE``."""
    from umlos_cuda.batching import BatchingConfig, BatchPlanBuilder, PackingConfig, save_plan
    from umlos_cuda.batching.tokens.store import TokenStore

    copy(world, here, "store")
    config = BatchingConfig(1024, (), 256, "pad_to_bucket", 3, pack=PackingConfig(256, "first_fit", separator_len=1))
    save_plan(BatchPlanBuilder(TokenStore.open(here / "store").length_cache(), config).build(1), here / "plan")
    return ("batch", "generate", "--plan", str(here / "plan"), "--source", str(here / "store"), "--separator-ids",
            str(_vocab_size(world)), "--output", str(here / "out"), "--quiet", "--workers", "1")


def _mix_of_10_12_samples(world, here):
    copy(world, here, "lengths.jsonl")
    lengths = here / "lengths.jsonl"
    return ("plan", "build", "--window", "16", "--mix", f"{lengths}:0.7", f"{lengths}:0.3", "--bucket-edges",
            "32,64,128", "--overflow-max", "256", "--token-budget", "512", "--num-samples", str(10**12), "--output",
            str(here / "out"), "--quiet")


def _cut_mix_entry(entry: str):
    """``plan cut --mix`` of the Megatron pair with a second entry ``PAIR:0.5:ENTRY``."""
    def make(world, here):
        copy(world, here, "mega")
        return ("plan", "cut", "--mix", f"{here / 'mega'}:0.5", f"{here / 'mega'}:0.5:{entry}", "--num-samples", "10",
                "--sequence-length", "16", "--output", str(here / "out"))
    return make


def _jsonl_only_plan_sample_id(sample_id: str):
    """A plan of row-number ids (a length cache without ids) kept only as JSONL, its first sample id replaced."""
    def make(world, here):
        from umlos_cuda.batching import BatchingConfig, BatchPlanBuilder, LengthCache, save_plan

        cache = LengthCache.from_arrays(None, np.arange(40, dtype=np.uint32) % 90 + 1, "t")
        config = BatchingConfig.predictable(token_budget=512, bucket_edges=(32, 64, 128), overflow_max=256, seed=7)
        save_plan(BatchPlanBuilder(cache, config).build(1), here / "plan", jsonl="always")
        _jsonl_only_plan(world, here)
        path = here / "plan" / "epoch_0" / "microbatches.jsonl"
        lines = path.read_text().splitlines(keepends=True)
        first = json.loads(lines[0])
        first["samples"][0] = sample_id
        lines[0] = json.dumps(first) + "\n"
        path.write_text("".join(lines))
        return plan_info(here)
    return make


def _policy(text: str):
    return _deep_policy("policies:\n" + text)


def _menu_greeting(number: str):
    """A server whose menu numbers its one game ``number``; it answers game 3 as game 1 (``int()`` reads an
    Arabic-Indic three as 3: a client that took it would go on)."""
    line = f"\r\n  {number}) Sudoku          - Classic logic puzzle\r\n".encode()
    return lambda: scripted({**GAME, "3 ?": GAME["1 ?"], "<greeting>": line})


INTEGER_CASES = [
    Case("user/plan-cut-eos-past-the-store-vocabulary", _cut_eos("store", "70000"), (errors.BATCHING_CONFIG_INVALID,),
         "store"),
    Case("user/plan-cut-eos-past-the-megatron-dtype", _cut_eos("mega", str(1 << 16)),
         (errors.BATCHING_CONFIG_INVALID,), "mega"),
    Case("user/batch-generate-separator-id-past-the-vocabulary", _separator_past_the_vocabulary,
         (errors.COLLATE_INPUT_INVALID,), "store"),
    Case("hang/mixed-plan-build-num-samples-10^12", _mix_of_10_12_samples, (errors.BATCHING_CONFIG_INVALID,),
         "lengths"),
    Case("user/plan-cut-mix-cap-arabic-indic-digit", _cut_mix_entry("\u0663"), (errors.BATCHING_CONFIG_INVALID,),
         "mega"),
    Case("traceback/plan-cut-mix-seed-of-5000-digits", _cut_mix_entry("1:" + "9" * 5000),
         (errors.BATCHING_CONFIG_INVALID,), "mega"),
    Case("traceback/plan-info-jsonl-only-sample-id-superscript-two", _jsonl_only_plan_sample_id("\u00b2"), (P,),
         "microbatches.jsonl"),
    Case("traceback/plan-info-jsonl-only-sample-id-arabic-indic-digit", _jsonl_only_plan_sample_id("\u0663"), (P,),
         "microbatches.jsonl"),
    Case("traceback/gym-run-policy-quota-edge-superscript-two",
         _policy("  - type: length_quota\n    quotas: {'\u00b2': 1}\n"), (errors.SAMPLING_POLICY_INVALID,),
         "policy.yaml"),
    Case("traceback/gym-run-policy-quota-edge-2^70",
         _policy(f"  - type: length_quota\n    quotas: {{{1 << 70}: 1}}\n"), (errors.SAMPLING_POLICY_INVALID,),
         "policy.yaml"),
    Case("traceback/gym-run-policy-novelty-window-10^30",
         _policy(f"  - type: novelty\n    novelty_window: {10**30}\n"), (errors.SAMPLING_POLICY_INVALID,),
         "policy.yaml"),
    Case("traceback/gym-info-menu-number-of-5000-digits", _flood_info, (GP,), None, server=_menu_greeting("9" * 5000)),
    Case("tamper/gym-info-menu-number-arabic-indic-digit", _flood_info, (GP,), None,
         server=_menu_greeting("\u0663")),
    Case("hang/gym-replay-header-samples-per-window-10^12",
         _window_header(lambda h: h.__setitem__("samples_per_window", 10**12)), (W,), "windows.jsonl"),
]

CASES = [
    # ------------------------------------------------------------------ hang: FIFOs where a file should be
    Case("hang/plan-info-fifo-meta-json", _plan_fifo("meta.json"), (P, errors.PLAN_NOT_FOUND), "meta.json"),
    Case("hang/plan-info-fifo-stats-json", _plan_fifo("epoch_0/stats.json"), (P,), "stats.json"),
    Case("hang/plan-info-fifo-offsets-npy", _plan_fifo("epoch_0/offsets.npy"), (P,), "offsets.npy"),
    Case("hang/plan-info-fifo-lengths-npy", _plan_fifo("lengths.npy"), (P,), "lengths.npy"),
    Case("hang/plan-info-fifo-sample-ids", _plan_fifo("sample_ids.jsonl"), (P,), "sample_ids.jsonl"),
    Case("hang/plan-verify-fifo-lengths", _plan_verify_lengths_fifo, (L,), "lengths.jsonl"),
    Case("hang/batch-check-fifo-npz", _batch_fifo, (B,), ".npz"),
    Case("hang/batch-check-fifo-batches-json", _batch_index_fifo, (B, errors.BATCH_FILES_NOT_FOUND), "batches.json"),
    Case("hang/batch-generate-fifo-resumed-file", _generate_resume_fifo,
         (B, errors.BATCH_OUTPUT_MISMATCH, errors.OUTPUT_PATH_INVALID), ".npz"),
    Case("hang/batch-generate-fifo-store-tokens", _generate_store_fifo, (S,), "tokens.npy"),
    Case("hang/batch-generate-fifo-store-meta", _generate_store_meta_fifo, (S, errors.TOKEN_STORE_NOT_FOUND,
                                                                           errors.MEGATRON_INDEX_INVALID), "meta.json"),
    Case("hang/batch-verify-fifo-expected", _fingerprint_fifo, (errors.BATCH_FINGERPRINT_INVALID,), "expected.json"),
    Case("hang/data-megatron-fifo-idx", _megatron_fifo(".idx"), (M,), "mega.idx"),
    Case("hang/data-megatron-fifo-bin", _megatron_fifo(".bin"), (M,), "mega.bin"),
    # auto mode: a sidecar that is not a regular file is set aside with a warning, the JSONL is parsed
    Case("hang/data-lengths-stats-fifo-sidecar-falls-back-to-the-jsonl", _lengths_sidecar_fifo, (), None),
    Case("hang/data-lengths-build-fifo-tokenizer-config", _tokenizer_fifo("tokenizer_config.json"), (T,),
         "tokenizer_config.json"),
    Case("hang/data-lengths-build-fifo-chat-template", _tokenizer_fifo("chat_template.jinja"), (T,),
         "chat_template.jinja"),
    Case("hang/data-lengths-build-fifo-tokenizer-json", _bare_tokenizer_fifo, (T,), "tokenizer.json"),
    # chat templates run as sandboxed Jinja with counted steps (umlos_cuda/batching/chat/steps.py: a count at the
    # head of every loop body and every function body, a loop filter's, a macro's, a caller's included)
    Case("hang/data-tokenize-chat-template-nested-loops", _chat(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"), (RB,), "chat.jsonl"),
    Case("hang/data-tokenize-chat-template-filtered-loops-whose-body-never-runs", _chat(
        "{% for i in range(100000) %}{% for j in range(100000) if false %}{% endfor %}{% endfor %}"), (RB,),
        "chat.jsonl"),
    Case("hang/data-lengths-build-chat-template-macro-calling-itself-twice", _chat(
        "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(200) }}", "lengths"),
        (RB,), "chat.jsonl"),
    Case("hang/data-tokenize-chat-template-caller-in-loops", _chat(
        "{% macro m() %}{% for i in range(100000) %}{{ caller() }}{% endfor %}{% endmacro %}"
        "{% call m() %}{% call m() %}x{% endcall %}{% endcall %}"), (RB,), "chat.jsonl"),
    Case("hang/data-lengths-build-chat-template-huge-power", _chat("{{ 2 ** 4000000000 }}", "lengths"), (RB,),
         "chat.jsonl"),
    Case("hang/data-tokenize-chat-template-recursive-macro", _chat(
        "{% macro f(n) %}{{ f(n ~ 'x') }}{% endmacro %}{{ f('') }}"), (RB,), "chat.jsonl"),
    Case("hang/data-tokenize-chat-template-doubling-string", _chat(  # past the memory budget: MemoryError
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"), (RB,),
        "chat.jsonl", env=RENDER_BUDGET),
    # ... and in worker processes under a CPU, memory and wall-clock budget, for the work no count sees: one step of
    # template code that computes for hours in C or in a filter (the attack of 2026-12-06 and more of each class)
    Case("traceback/data-tokenize-chat-template-lipsum", _chat("{{ lipsum(1000000, false, 100000, 100001) }}"), (D,),
         "chat.jsonl", env=RENDER_BUDGET),
    _budgeted(SHARED + "{{ ns.a == ns.b }}"),
    _budgeted(SHARED + "{{ ns.a != ns.b }}", "lengths"),
    _budgeted(SHARED + "{{ ns.a|tojson }}"),
    _budgeted(SHARED + "{{ ns.a|pprint }}"),
    _budgeted(SHARED + "{{ ns.a }}"),
    _budgeted(SHARED + "{{ ns.a|string|length }}", "lengths"),
    _budgeted(SHARED + "{{ [ns.a, ns.b]|sort|length }}"),
    _budgeted("{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}"),
    _budgeted("{{ (2 ** 65000) * (2 ** 65000) }}", "lengths"),
    _budgeted("{{ ('x ' * 30000000)|wordwrap(1)|length }}"),
    _budgeted("{{ [1]|slice(1000000000)|list|length }}"),
    _budgeted("{{ [1]|batch(1000000000, 0)|list|length }}", "lengths"),
    _budgeted("{{ 'x'|center(1000000000000) }}"),
    _budgeted("{{ 'a\\nb'|indent(1000000000) }}"),
    _budgeted("{{ messages|tojson(indent=1000000000) }}"),
    _budgeted("{{ '%1000000000d' % 1 }}"),
    _budgeted("{{ '%.1000000000f'|format(1) }}", "lengths"),
    _budgeted("{{ '{:>1000000000}'.format(1) }}"),
    _budgeted("{{ strftime_now('%1000000000Y') }}"),
    _budgeted("{{ 1|round(1000000000, 'floor') }}"),
    _budgeted("{{ 'x'.ljust(10000000000) }}"),
    _budgeted("{{ ('x' * 60000000)|replace('x', 'xx')|length }}"),
    _budgeted("{{ ('ab' * 1000).replace('', 'x' * 100000)|length }}", "lengths"),
    Case("traceback/data-tokenize-chat-render-budget-setting-not-a-number", _chat("{{ messages[0].content }}"),
         (errors.INVALID_ARGUMENT,), "UMLOS_CHAT_RENDER_CPU_S", env={"UMLOS_CHAT_RENDER_CPU_S": "ten"}),
    Case("hang/data-tokenize-huge-chat-template-jinja", _huge_template("jinja"), (errors.CHAT_TEMPLATE_INVALID,),
         "model", env=RENDER_BUDGET),
    Case("hang/data-tokenize-huge-chat-template-in-config", _huge_template("config"),
         (errors.CHAT_TEMPLATE_INVALID,), "model", env=RENDER_BUDGET),
    Case("hang/data-tokenize-huge-chat-template-option", _huge_template("option"), (errors.CHAT_TEMPLATE_INVALID,),
         "t.jinja", env=RENDER_BUDGET),
    Case("hang/data-tokenize-fifo-chat-template-option", _chat(None, template_file=_fifo_at("t.jinja")),
         (errors.CHAT_TEMPLATE_INVALID,), "t.jinja"),
    Case("traceback/data-tokenize-chat-template-raises", _chat("{{ raise_exception('no system role here') }}"),
         (D,), "chat.jsonl"),
    Case("traceback/data-tokenize-chat-template-sandbox-escape", _chat(
        "{{ messages.__class__.__mro__[1].__subclasses__() }}"), (D,), "chat.jsonl"),
    Case("traceback/data-lengths-build-chat-template-syntax", _chat("{% for m in messages %}", "lengths"),
         (errors.CHAT_TEMPLATE_INVALID,), "model"),
    Case("traceback/data-tokenize-chat-messages-not-objects",
         _chat("{% for m in messages %}{{ m['content'] }}{% endfor %}", messages=[["user", "hi"]]), (D,), "chat.jsonl"),
    Case("traceback/data-tokenize-chat-messages-image-part", _chat(CHATML, messages=[
        {"role": "user", "content": [{"type": "image", "image": "x.png"}]}]), (errors.CHAT_CONTENT_UNSUPPORTED,),
        "chat.jsonl"),
    # preference records: conversational pairs, implicit-prompt pairs, unpaired (KTO) records
    Case("traceback/data-tokenize-conversational-pairs-messages-not-objects", _preference(
        {"prompt": ASK, "chosen": [["assistant", "hi"]], "rejected": BAD}, *PAIRS), (D,), "prefs.jsonl"),
    Case("traceback/data-tokenize-conversational-pairs-prompt-a-string", _preference(
        {"prompt": "hi", "chosen": GOOD, "rejected": BAD}, *PAIRS), (D,), "prefs.jsonl"),
    Case("traceback/data-tokenize-conversational-pairs-role-missing", _preference(
        {"prompt": [{"content": "hi"}], "chosen": GOOD, "rejected": BAD}, *PAIRS), (D,), "prefs.jsonl"),
    Case("traceback/data-lengths-build-conversational-pairs-image-part", _preference(
        {"prompt": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
         "chosen": GOOD, "rejected": BAD}, *PAIRS, command="lengths"), (errors.CHAT_CONTENT_UNSUPPORTED,),
         "prefs.jsonl"),
    Case("traceback/data-tokenize-conversational-text-part-an-object", _preference(
        {"prompt": [{"role": "user", "content": [{"type": "text", "text": {"a": [1, {"b": None}]}}]}],
         "chosen": GOOD, "rejected": BAD}, *PAIRS), (D,), "prefs.jsonl"),
    Case("traceback/data-tokenize-implicit-pairs-no-shared-prompt", _preference(
        {"chosen": GOOD, "rejected": BAD}, "--chosen-field", "chosen", "--rejected-field", "rejected"), (D,),
         "prefs.jsonl"),
    Case("traceback/data-tokenize-unpaired-label-missing", _preference(
        {"prompt": ASK, "completion": GOOD}, *UNPAIRED), (D,), "prefs.jsonl"),
    Case("traceback/data-tokenize-unpaired-label-a-string", _preference(
        {"prompt": ASK, "completion": GOOD, "label": "true"}, *UNPAIRED), (D,), "prefs.jsonl"),
    Case("traceback/data-tokenize-unpaired-parquet-label-of-integers", _preference(
        {"prompt": ASK, "completion": GOOD, "label": 1}, *UNPAIRED, parquet=True), (D,), "prefs.parquet"),
    # ... rendered in the same budgeted workers as chat records: past a counted limit or the budget, alike
    Case("hang/data-tokenize-conversational-pairs-template-nested-loops", _preference(
        {"prompt": ASK, "chosen": GOOD, "rejected": BAD}, *PAIRS,
        template="{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"), (RB,),
         "prefs.jsonl"),
    Case("hang/data-tokenize-conversational-pairs-template-shared-lists", _preference(
        {"prompt": ASK, "chosen": GOOD, "rejected": BAD}, *PAIRS, template=SHARED + "{{ ns.a == ns.b }}"), (RB,),
         "prefs.jsonl", env=RENDER_BUDGET),
    Case("hang/data-lengths-build-implicit-pairs-template-shared-lists-tojson", _preference(
        {"chosen": ASK + GOOD, "rejected": ASK + BAD}, "--chosen-field", "chosen", "--rejected-field", "rejected",
        command="lengths", template=SHARED + "{{ ns.a|tojson }}"), (RB,), "prefs.jsonl", env=RENDER_BUDGET),
    Case("hang/data-tokenize-unpaired-parquet-template-shared-lists-once-a-completion", _preference(
        {"prompt": ASK, "completion": GOOD, "label": True}, *UNPAIRED, parquet=True,
        template="{% if messages[-1]['role'] == 'assistant' %}" + SHARED + "{{ ns.a == ns.b }}{% endif %}"), (RB,),
         "prefs.parquet", env=RENDER_BUDGET),
    Case("hang/data-tokenize-fifo-special-tokens-map", _tokenize_fifo_special_tokens, (T,),
         "special_tokens_map.json"),
    Case("hang/batch-fingerprint-fifo-store-offsets", _fingerprint_fifo_offsets, (S,), "offsets.npy"),
    Case("hang/gym-replay-fifo-log", _window_log_fifo, (W,), "windows.jsonl"),
    Case("hang/gym-run-fifo-policy", _policy_fifo, (errors.SAMPLING_POLICY_INVALID,), "policy.yaml"),
    Case("hang/next-batch-fifo-manifest", _manifest_fifo("next-batch"), (errors.INVALID_MANIFEST,), "m.yaml"),
    Case("hang/next-batch-v1-fifo-manifest", _manifest_fifo("next-batch-v1"), (errors.INVALID_MANIFEST,), "m.yaml"),
    Case("hang/indices-fifo-manifest", _manifest_fifo("indices"), (errors.INVALID_MANIFEST,), "m.yaml"),
    Case("hang/demo-fifo-manifest", _manifest_fifo("demo"), (errors.INVALID_MANIFEST,), "m.yaml"),
    Case("hang/quality-fifo-labels", _labels_fifo, (errors.LABELS_UNREADABLE,), "labels.npy"),
    Case("hang/golden-verify-fifo-file", _golden_fifo, (errors.GOLDEN_MISMATCH,), "golden.json"),
    Case("hang/checkpoint-inspect-fifo", _checkpoint_fifo("inspect"), (errors.CHECKPOINT_NOT_FOUND,), "store"),
    Case("hang/checkpoint-verify-fifo", _checkpoint_fifo("verify"), (errors.CHECKPOINT_NOT_FOUND,), "store"),
    Case("hang/checkpoint-recover-fifo", _checkpoint_fifo("recover"), (errors.CHECKPOINT_NOT_FOUND,), "store"),
    Case("hang/checkpoint-gc-fifo", _checkpoint_fifo("gc"), (errors.CHECKPOINT_NOT_FOUND,), "store"),
    # ------------------------------------------------------------------ hang: more bytes than memory
    Case("hang/plan-info-sparse-meta-json", _sparse_in_plan("meta.json"), (P,), "meta.json"),
    Case("hang/plan-info-sparse-stats-json", _sparse_in_plan("epoch_0/stats.json"), (P,), "stats.json"),
    Case("hang/plan-info-sparse-sample-ids", _sparse_in_plan("sample_ids.jsonl"), (P,), "sample_ids.jsonl"),
    Case("hang/plan-info-sparse-microbatches-jsonl", _sparse_in_plan("epoch_0/microbatches.jsonl", True), (P,),
         "microbatches.jsonl"),
    Case("hang/plan-build-sparse-lengths", _plan_build_lengths_sparse, (L,), "lengths.jsonl"),
    Case("hang/batch-generate-sparse-store-meta", _sparse_store_meta, (S,), "meta.json"),
    Case("hang/batch-generate-resume-sparse-batch-file", _generate_resume_sparse, (), None, owned=("out",)),
    Case("hang/batch-check-sparse-batches-json", _sparse_batches_json, (B,), "batches.json"),
    Case("hang/data-lengths-build-sparse-dataset-line", _sparse_dataset, (D, errors.DATASET_UNREADABLE), "train.jsonl"),
    Case("hang/data-lengths-build-sparse-tokenizer-config", _sparse_tokenizer_config, (T,), "tokenizer_config.json"),
    Case("hang/data-lengths-stats-sparse-cache-line", _sparse_lengths_cache, (L,), "lengths.jsonl"),
    Case("hang/length-cache-sparse-sidecar-header", _sparse_sidecar, (LS,), "lengths.jsonl.u32"),
    Case("hang/gym-replay-sparse-log-line", _sparse_window_log, (W,), "windows.jsonl"),
    Case("hang/gym-run-sparse-policy", _sparse_policy, (errors.SAMPLING_POLICY_INVALID,), "policy.yaml"),
    Case("hang/batch-check-npz-extra-deflated-member", _npz_extra_deflated_member, (B,), ".npz"),
    Case("hang/batch-check-npz-member-claims-2^38-elements", _npz_giant_member_header, (B,), ".npz"),
    Case("hang/read-npy-header-claims-2^38-elements", _npy_giant_header, (P,), "labels.npy"),
    Case("hang/token-store-npy-header-claims-2^38-elements", _store_tokens_giant_header, (S,), "tokens.npy"),
    Case("hang/megatron-pointer-wraps-past-2^63", _megatron_idx(1, 2, [(1 << 31) - 1], [(1 << 63) - 4], [0, 1], 8),
         (M,), "evil.idx"),
    Case("hang/megatron-count-past-the-file", _megatron_idx(1 << 60, 2, [], [], [], 8), (M,), "evil.idx"),
    # bounded now, the replay goes on and finds that a buffer of another size gives other windows
    Case("hang/gym-replay-header-asks-for-a-giant-buffer", _window_header_giant_buffer,
         (W, errors.WINDOW_REPLAY_MISMATCH), "windows.jsonl"),
    # ------------------------------------------------------------------ hang: giant world sizes
    Case("hang/plan-shard-world-size-2^32-1", _giant_world_shard, (errors.INVALID_RANK,
                                                                   errors.BATCHING_CONFIG_INVALID), None),
    Case("hang/plan-info-world-size-2^32-1", _giant_world_info, (errors.INVALID_RANK,
                                                                 errors.BATCHING_CONFIG_INVALID), None),
    Case("hang/batch-check-world-size-2^32-1", _giant_world_check, (), None),
    # ------------------------------------------------------------------ hang: hostile servers
    Case("hang/gym-info-telnet-flood-of-lines", _flood_info, (GP,), None, server=lambda: flood(b"x" * 1000 + b"\r\n")),
    Case("hang/gym-info-telnet-flood-of-long-lines", _flood_info, (GP,), None,
         server=lambda: flood(b"y" * ((1 << 20) - 8) + b"\r\n")),
    Case("hang/gym-info-telnet-endless-line", _flood_info, (GP,), None, server=lambda: flood(b"z" * 4096)),
    Case("hang/gym-run-telnet-flood", _flood_run, (GP, errors.GYM_CONNECTION_FAILED), None,
         server=lambda: flood(b"x" * 200 + b"\r\n")),
    Case("hang/client-start-observation-flood", lambda w, h: client_start(), (GP,), None,
         server=lambda: scripted({**GAME, "show": observation() * 200_000})),  # about 26 MB
    # ------------------------------------------------------------------ traceback: deep JSON in every JSON reader
    Case("traceback/deep-json-plan-meta", _deep_in_plan("meta.json"), (P,), "meta.json"),
    Case("traceback/deep-json-plan-stats", _deep_in_plan("epoch_0/stats.json"), (P,), "stats.json"),
    Case("traceback/deep-json-sample-ids", _deep_in_plan("sample_ids.jsonl", line=True), (P,), "sample_ids.jsonl"),
    Case("traceback/deep-json-microbatches-jsonl", _deep_in_plan("epoch_0/microbatches.jsonl", True, True), (P,),
         "microbatches.jsonl"),
    Case("traceback/deep-json-batches-json", _deep_batches_json, (B,), "batches.json"),
    Case("traceback/deep-json-store-meta", _deep_store_meta, (S,), "meta.json"),
    Case("traceback/deep-json-length-cache", _deep_lengths, (L,), "lengths.jsonl"),
    Case("traceback/deep-json-sidecar-header-required", _deep_sidecar_header, (LS,), "lengths.jsonl.u32"),
    Case("traceback/deep-json-dataset-line", _deep_dataset, (D,), "train.jsonl"),
    Case("traceback/deep-json-tokenizer-config", _deep_tokenizer_file("tokenizer_config.json"), (T,),
         "tokenizer_config.json"),
    Case("traceback/deep-json-special-tokens-map", _deep_tokenizer_file("special_tokens_map.json"), (T,),
         "special_tokens_map.json"),
    Case("traceback/deep-json-tokenizer-json", _deep_tokenizer_file("tokenizer.json"), (T,), "tokenizer.json"),
    Case("traceback/deep-json-window-log-header", _deep_window_log(0), (W,), "windows.jsonl"),
    Case("traceback/deep-json-window-log-record", _deep_window_log(1), (W,), "windows.jsonl"),
    Case("traceback/deep-json-fingerprint-file", _deep_fingerprint_file, (errors.BATCH_FINGERPRINT_INVALID,),
         "expected.json"),
    Case("traceback/deep-json-golden-file", _deep_golden, (errors.GOLDEN_MISMATCH,), "golden.json"),
    Case("traceback/deep-json-manifest", _deep_manifest(".json", deep_json()), (errors.INVALID_MANIFEST,), "m.json"),
    Case("traceback/deep-json-server-observation", lambda w, h: client_start(), (GP,), None,
         server=lambda: scripted({**GAME, "show": deep_json('{"type": "observation", "x": ', "}").encode() + b"\r\n"})),
    # ------------------------------------------------------------------ traceback: deep YAML
    Case("traceback/deep-yaml-flow-policy", _deep_policy("policies: " + deep_json()),
         (errors.SAMPLING_POLICY_INVALID,), "policy.yaml"),
    Case("traceback/deep-yaml-block-policy", _deep_policy(_block_nested_yaml(1400)),
         (errors.SAMPLING_POLICY_INVALID,), "policy.yaml"),
    Case("traceback/deep-yaml-manifest", _deep_manifest(".yaml", "a: " + deep_json()), (errors.INVALID_MANIFEST,),
         "m.yaml"),
    Case("traceback/deep-yaml-block-manifest", _deep_manifest(".yaml", _block_nested_yaml(1400)),
         (errors.INVALID_MANIFEST,), "m.yaml"),
    # ------------------------------------------------------------------ traceback: wrong field types
    Case("traceback/plan-meta-shard-of-strings", _plan_meta(_shard({"rank": "0", "world_size": "x",
                                                                    "source_fingerprint": 5})), (P,), "meta.json"),
    Case("traceback/plan-meta-shard-world-size-0", _plan_meta(_shard({"rank": 0, "world_size": 0,
                                                                      "source_fingerprint": "a" * 64})), (P,),
         "meta.json"),
    Case("traceback/plan-meta-epoch-digests-number", _plan_meta(lambda m: m.__setitem__("epoch_digests", 5)), (P,),
         "meta.json"),
    Case("traceback/plan-meta-fingerprint-list", _plan_meta(lambda m: m.__setitem__("fingerprint", [1])), (P,),
         "meta.json"),
    Case("traceback/plan-meta-bucket-edges-string", _plan_meta(lambda m: m.__setitem__("bucket_edges", "64")), (P,),
         "meta.json"),
    Case("traceback/plan-meta-pack-config-number", _plan_meta(lambda m: m.__setitem__("pack_config", 5)), (P,),
         "meta.json"),
    Case("traceback/plan-meta-group-size-string", _plan_meta(lambda m: m.__setitem__("group_size", "2")), (P,),
         "meta.json"),
    Case("traceback/plan-meta-group-size-odd-rows",
         _plan_meta(lambda m: m.update(group_size=2, num_samples=m["num_samples"] | 1)), (P,), "meta.json"),
    Case("traceback/plan-meta-num-samples-huge", _plan_meta(lambda m: m.__setitem__("num_samples", 1 << 70)), (P,),
         "plan"),
    Case("traceback/plan-stats-padding-waste-string", _plan_stats(lambda s: s.__setitem__("padding_waste", "x")),
         (P,), "stats.json"),
    Case("traceback/plan-stats-without-counts",
         _plan_stats(lambda s: [s.pop(k) for k in list(s) if k != "microbatches"]), (P,), "stats.json"),
    Case("traceback/batches-json-epochs-indices-number",
         _batches_index(lambda d: d["epochs"][0].__setitem__("indices", 5)), (B,), "batches.json"),
    Case("traceback/batches-json-pad-id-string", _batches_index(lambda d: d.__setitem__("pad_id", "x")), (B,),
         "batches.json"),
    Case("traceback/batches-json-fingerprint-fields", _batches_index(
        lambda d: d.__setitem__("batch_fingerprint", {"fingerprint": 1})), (B, errors.BATCH_FINGERPRINT_INVALID),
        "batches.json"),
    Case("traceback/store-meta-hash-number", _store_meta(lambda m: m.__setitem__("tokenizer_hash", 5)), (S,),
         "meta.json"),
    Case("traceback/window-header-batching-number", _window_header(lambda h: h.__setitem__("batching", 5)), (W,),
         "windows.jsonl"),
    Case("traceback/window-header-buffer-list", _window_header(lambda h: h.__setitem__("buffer", [1])), (W,),
         "windows.jsonl"),
    Case("traceback/window-header-policies-string", _window_header(lambda h: h.__setitem__("policies", "x")),
         (W, errors.SAMPLING_POLICY_INVALID), "windows.jsonl"),
    Case("traceback/window-record-added-number", _window_record(lambda r: r.__setitem__("added", 5)), (W,),
         "windows.jsonl"),
    Case("traceback/window-record-added-entry-number", _window_record(lambda r: r.__setitem__("added", [5])), (W,),
         "windows.jsonl"),
    Case("traceback/window-record-sample-string", _window_record(
        lambda r: r["added"][0].__setitem__("sample", "x")), (W, errors.STREAM_INVALID), "windows.jsonl"),
    Case("traceback/fingerprint-file-n-batches-string",
         _fingerprint_file(lambda d: d.__setitem__("n_batches", "x")), (errors.BATCH_FINGERPRINT_INVALID,),
         "fingerprint.json"),
    # auto mode: a sidecar it cannot use is set aside with a warning and the JSONL is parsed instead
    Case("traceback/data-lengths-stats-sidecar-count-huge-falls-back-to-the-jsonl",
         _sidecar_header(lambda h: h.__setitem__("count", 1 << 70)), (), None),
    Case("traceback/length-cache-sidecar-count-huge-required", _sidecar_header(
        lambda h: h.__setitem__("count", 1 << 70), require=True), (LS,), "lengths.jsonl.u32"),
    Case("traceback/length-cache-sidecar-count-list-required", _sidecar_header(
        lambda h: h.__setitem__("count", [1] * 1000), require=True), (LS,), "lengths.jsonl.u32"),
    Case("traceback/observation-is-complete-string", lambda w, h: client_start(), (GP,), None,
         **_observation(is_complete="false")),
    Case("traceback/observation-seed-string", lambda w, h: client_start(), (GP,), None, **_observation(seed="x")),
    Case("traceback/observation-not-an-object-grid", lambda w, h: client_start(), (GP,), None,
         **_observation(moves=[1])),
    # ------------------------------------------------------------------ traceback: command-line values
    Case("traceback/gym-info-timeout-inf", _cli("gym", "info", "--port", "9", "--timeout", "inf"), (G,), None),
    Case("traceback/gym-info-timeout-nan", _cli("gym", "info", "--port", "9", "--timeout", "nan"), (G,), None),
    Case("traceback/gym-info-timeout-1e300", _cli("gym", "info", "--port", "9", "--timeout", "1e300"), (G,), None),
    Case("traceback/gym-info-port-70000", _cli("gym", "info", "--port", "70000"), (G,), None),
    Case("traceback/gym-serve-port-70000", _serve("--port", "70000"), (G,), None),
    Case("traceback/gym-serve-bad-host", _serve("--host", "256.1.1.1", "--port", "0"), (G,), None),
    Case("traceback/gym-serve-port-file-in-missing-folder", lambda w, h: ("gym", "serve", "--port", "0", "--port-file",
                                                                        str(h / "missing" / "port")),
         (G, errors.OUTPUT_PATH_INVALID), "missing"),
    Case("traceback/gym-run-timeout-inf", lambda w, h: (copy(w, h, "model"), gym_run(h, 9)[:-2] + ("--timeout", "inf")
                                                        )[1], (G,), None),
    # ------------------------------------------------------------------ datasets in other formats
    Case("traceback/data-lengths-build-truncated-parquet", _truncated_parquet, (DU,), "train.parquet"),
    Case("hang/data-lengths-build-parquet-footer-length-past-the-file", _parquet_footer_past_the_file, (DU,),
         "train.parquet"),
    Case("user/data-lengths-build-parquet-named-jsonl", _parquet_named_jsonl, (D,), "train.jsonl"),
    Case("traceback/data-tokenize-parquet-text-column-of-integers", _parquet_text_of_integers, (D,), "train.parquet"),
    Case("traceback/data-lengths-build-length-field-negative", _parquet_negative_length, (D,), "train.parquet"),
    Case("hang/data-lengths-build-symlinked-shard-to-a-fifo", _symlinked_shard_fifo, (DU,), "shard-2.jsonl"),
    Case("user/data-lengths-build-symlinked-shard-repeats-a-shard", _symlinked_shard_repeats, (DU,), "shard-2.jsonl"),
    Case("user/data-lengths-build-glob-matches-nothing", _glob_matches_nothing, (DU,), "shard-*.jsonl"),
    Case("user/data-lengths-build-folder-not-save-to-disk", _folder_not_save_to_disk, (DU,), "data"),
    Case("traceback/deep-json-datasets-state", _deep_datasets_state, (DU,), "state.json"),
    Case("tamper/data-lengths-build-datasets-state-names-a-file-outside", _datasets_state_escapes, (DU,), "state.json"),
    Case("hang/data-lengths-build-gzip-bomb-one-long-line", _gzip_bomb, (D,), "train.jsonl.gz"),
    Case("hang/data-lengths-build-zstd-bomb-of-skipped-lines", _zstd_bomb, (DU,), "train.jsonl.zst"),
    Case("traceback/data-lengths-build-zstd-stream-not-zstd", _zstd_not_zstd, (DU,), "train.jsonl.zst"),
    # ------------------------------------------------------------------ sharded token stores: index, shards, digests
    Case("hang/data-verify-fifo-sharded-meta", _sharded(lambda d: fifo(d / "meta.json")),
         (SH, errors.TOKEN_STORE_NOT_FOUND), "meta.json"),
    Case("hang/data-verify-sparse-sharded-meta", _sharded(lambda d: sparse(d / "meta.json", b'{"format": "')),
         (SH,), "meta.json"),
    Case("hang/data-verify-fifo-shard-meta", _sharded(lambda d: fifo(d / "shards" / "00001" / "meta.json")),
         (SH,), "00001"),
    Case("hang/data-verify-fifo-row-digests", _sharded(lambda d: fifo(d / "digests" / "00000.npy")), (SH,),
         "00000.npy"),
    Case("hang/data-verify-row-digests-header-claims-2^38-elements", _sharded(lambda d: _giant_npy(
        d / "digests" / "00000.npy")), (SH,), "00000.npy"),
    Case("traceback/deep-json-sharded-meta", _sharded(lambda d: (d / "meta.json").write_text(
        deep_json('{"format": ', "}"))), (SH,), "meta.json"),
    Case("traceback/sharded-meta-not-an-object", _sharded(lambda d: (d / "meta.json").write_text("[1]")), (SH,),
         "meta.json"),
    Case("traceback/sharded-meta-shards-of-strings", _sharded_meta(lambda m: m.__setitem__("shards", ["x"])), (SH,),
         "meta.json"),
    Case("traceback/sharded-meta-shards-a-mapping", _sharded_meta(lambda m: m.__setitem__("shards", {"a": 1})),
         (SH,), "meta.json"),
    Case("traceback/sharded-meta-num-samples-huge", _sharded_meta(lambda m: m.__setitem__("num_samples", 1 << 70)),
         (SH,), "meta.json"),
    Case("traceback/sharded-meta-shard-count-string",
         _sharded_meta(lambda m: m["shards"][0].__setitem__("num_samples", "10")), (SH,), "meta.json"),
    Case("traceback/sharded-meta-vocab-size-float", _sharded_meta(lambda m: m.__setitem__("vocab_size", 300.0)),
         (SH,), "meta.json"),
    Case("tamper/sharded-meta-shard-name-escapes-the-store",
         _sharded_meta(lambda m: m["shards"][1].__setitem__("name", "../../store")), (SH,), "meta.json"),
    Case("tamper/data-verify-shard-is-a-symlink", _sharded(lambda d: (shutil.move(d / "shards" / "00001", d / "x"),
                                                                     os.symlink(d / "x", d / "shards" / "00001"))),
         (SH,), "00001"),
    Case("tamper/data-verify-shards-folder-is-a-symlink", _sharded(lambda d: (
        shutil.move(d / "shards", d / "elsewhere"), os.symlink(d / "elsewhere", d / "shards"))), (SH,), "shards"),
    Case("tamper/data-append-orphan-shard-is-never-overwritten", _sharded(_planted_orphan, "append"), (SH,),
         "00002", owned=()),
    Case("tamper/data-append-staged-store-is-a-fifo", lambda w, h: (copy(w, h, "sharded"), fifo(h / "staged"), (
        "data", "append", str(h / "sharded"), str(h / "staged")))[2], (errors.TOKEN_STORE_NOT_FOUND,), "staged"),
    Case("hang/data-append-sparse-sharded-meta", _sharded(lambda d: sparse(d / "meta.json", b'{"format": "'),
                                                          "append"), (SH,), "meta.json", owned=()),
    Case("hang/data-append-lock-file-is-a-fifo", _sharded(lambda d: fifo(d / ".lock"), "append"),
         (errors.OUTPUT_PATH_INVALID,), ".lock", owned=()),
    Case("tamper/data-append-a-shard-the-store-lists", lambda w, h: (copy(w, h, "sharded"), (
        "data", "append", str(h / "sharded"), str(h / "sharded" / "shards" / "00001")))[1],
         (errors.SHARDED_STORE_MISMATCH,), "00001", owned=()),
    Case("hang/data-verify-fifo-shard-tokens", _sharded(lambda d: fifo(d / "shards" / "00000" / "tokens.npy")),
         (S,), "tokens.npy"),
    # ------------------------------------------------------------------ batch file layouts
    Case("hang/batch-verify-batches-fifo-zstd", _verify_batches_fifo("batches-zstd", "verify"), (B,), ".npz.zst"),
    Case("hang/batch-fingerprint-batches-fifo-compact", _verify_batches_fifo("batches", "fingerprint"), (B,),
         ".npz"),
    Case("hang/batch-check-fifo-npz-layout", _layout_fifo("batches-npz"), (B,), ".npz"),
    Case("hang/batch-check-index-layout-fifo-store-tokens", _index_store_fifo, (S,), "tokens.npy"),
    Case("hang/batch-check-fifo-zstd", _layout_fifo("batches-zstd"), (B,), ".npz.zst"),
    Case("hang/batch-check-symlink-to-fifo-compact", _layout_symlink_to_fifo("batches"), (B,), ".npz"),
    Case("hang/batch-check-symlink-to-fifo-zstd", _layout_symlink_to_fifo("batches-zstd"), (B,), ".npz.zst"),
    Case("hang/batch-check-symlink-to-sparse-zstd", _layout_symlink_to_sparse, (B,), ".npz.zst"),
    Case("hang/batch-check-zstd-bomb", _zstd_bomb_file(True), (B,), ".npz.zst"),
    Case("hang/batch-check-zstd-bomb-without-stated-size", _zstd_bomb_file(False), (B,), ".npz.zst"),
    Case("hang/batch-check-zstd-frame-lies-about-its-size", _zstd_frame_lies_about_its_size, (B,), ".npz.zst"),
    Case("hang/batch-check-compact-huge-npy-header", _compact_member("batches", "input_ids", _huge_npy_header()),
         (B,), ".npz"),
    Case("hang/batch-check-zstd-huge-npy-header", _compact_member("batches-zstd", "input_ids", _huge_npy_header()),
         (B,), ".npz.zst"),
    Case("hang/batch-check-npz-layout-extra-deflated-member", _npz_layout_deflated, (B,), ".npz"),
    Case("traceback/batch-check-compact-truncated", _layout_truncated("batches"), (B,), ".npz"),
    Case("traceback/batch-check-zstd-truncated", _layout_truncated("batches-zstd"), (B,), ".npz.zst"),
    Case("traceback/batch-check-npz-layout-truncated", _layout_truncated("batches-npz"), (B,), ".npz"),
    Case("traceback/batch-check-compact-tokens-float64",
         _compact_member("batches", "input_ids", np.zeros(8, dtype=np.float64)), (B,), ".npz"),
    Case("traceback/batch-check-zstd-row-sizes-int8",
         _compact_member("batches-zstd", "row_sizes", np.ones(2, dtype=np.int8)), (B,), ".npz.zst"),
    Case("traceback/batch-check-compact-epoch-text",
         _compact_member("batches", "epoch", np.array("zero")), (B,), ".npz"),
    Case("traceback/batch-check-compact-segments-past-the-tokens",
         _compact_member("batches", "segment_lengths", np.full(2, 1 << 31, dtype="<u4")), (B,), ".npz"),
]


def _explain(folder: str, change, *extra: str):
    """``plan explain`` of the world's ``folder`` copied into ``here`` (with the length cache and its sidecar,
    which the mixed plan records), ``change(here)`` applied."""
    def make(world, here):
        copy(world, here, folder, "lengths.jsonl")
        change(here)
        return ("plan", "explain", str(here / folder), *extra)
    return make


def _explain_with_store(change, source: str = "store"):
    """``plan explain`` of the whole plan with ``--source`` (the world's token store, or ``source``) copied into
    ``here``, ``change(here)`` applied."""
    def make(world, here):
        copy(world, here, "plan", source)
        change(here)
        return ("plan", "explain", str(here / "plan"), "--step", "0", "--source", str(here / source))
    return make


def _tape_of_steps(change):
    """``plan explain --check-tape`` of a checkpoint store whose tape records two steps of the windowed plan
    (copied into ``here`` with its length cache), ``change(here)`` applied to the store."""
    def make(world, here):
        from test_checkpoint_support import DATASET, KEY, identity

        from umlos_cuda.batching.plans.explain import StepExplainer, step_record, unit_rows
        from umlos_cuda.checkpoint import CheckpointStore

        copy(world, here, "windowed", "lengths.jsonl")
        explainer = StepExplainer.open(here / "windowed")
        with CheckpointStore.open(here / "store", identity(), KEY) as store:
            store.start_run(DATASET, world_size=1, task_type="training")
            for t in (1, 2):
                store.tape.append(step_record(t, explainer.plan.fingerprint, 0,
                                              [(t - 1, unit_rows(explainer.unit(0, t - 1)))]))
            store.commit()
        change(here / "store")
        return ("plan", "explain", str(here / "windowed"), "--check-tape", str(here / "store"))
    return make


EXPLAIN_CASES = [
    Case("hang/plan-explain-check-tape-fifo-segment", _tape_of_steps(lambda d: fifo(d / "trace" / "segment=1.tape")),
         (errors.CHECKPOINT_UNEXPECTED_FILE,), "segment=1.tape"),
    Case("traceback/plan-explain-check-tape-truncated-segment",
         _tape_of_steps(lambda d: (d / "trace" / "segment=1.tape").write_bytes(
             (d / "trace" / "segment=1.tape").read_bytes()[:-7])),
         (errors.TRACE_TRUNCATED,), "segment=1.tape"),
    Case("user/plan-explain-check-tape-of-a-plan-folder", _tape_of_steps(lambda d: shutil.rmtree(d) or
                                                                          shutil.copytree(d.parent / "windowed", d)),
         (errors.CHECKPOINT_NOT_FOUND,), "store"),
    Case("user/plan-explain-check-tape-in-a-fresh-process", _tape_of_steps(lambda d: None), ()),
    Case("hang/plan-explain-fifo-meta-json", _explain("windowed", lambda h: fifo(h / "windowed" / "meta.json"),
                                                      "--step", "0"), (WP,), "meta.json"),
    Case("hang/plan-explain-sparse-index-npy", _explain("windowed", lambda h: sparse(h / "windowed" / "index.npy"),
                                                        "--step", "0"), (WP,), "index.npy"),
    Case("hang/plan-explain-mixed-plan-fifo-lengths-sidecar",
         _explain("mixed", lambda h: fifo(h / "lengths.jsonl.u32"), "--step", "0"), (LS,), "lengths.jsonl.u32"),
    Case("hang/plan-explain-sequences-fifo-index-npy",
         _explain("sequences", lambda h: fifo(h / "sequences" / "index.npy"), "--step", "0"), (WP,), "index.npy"),
    Case("hang/plan-explain-fifo-store-tokens", _explain_with_store(lambda h: fifo(h / "store" / "tokens.npy")), (S,),
         "tokens.npy"),
    Case("user/plan-explain-source-of-another-dataset", _explain_with_store(lambda h: None, "mega"),
         (errors.BATCH_STORE_MISMATCH,)),
    Case("hang/plan-explain-world-size-2^32-1-every-rank",
         _explain("windowed", lambda h: None, "--step", "0", "--world-size", "4294967295"),
         (errors.BATCHING_CONFIG_INVALID,)),
    Case("hang/plan-explain-world-size-2^32-1-one-rank",
         _explain("windowed", lambda h: None, "--step", "0", "--world-size", "4294967295", "--rank", "7"), ()),
    Case("hang/plan-explain-a-billion-steps", _explain("windowed", lambda h: None, "--step", "0:1000000000"),
         (errors.BATCHING_CONFIG_INVALID,)),
    Case("traceback/plan-explain-step-of-40-digits", _explain("sequences", lambda h: None, "--step", "9" * 40),
         (errors.PLAN_CURSOR_INVALID,)),
    Case("traceback/plan-explain-start-past-the-plan", _explain("mixed", lambda h: None, "--step", "0",
                                                                "--start", "1:0"), (errors.PLAN_CURSOR_INVALID,)),
]


def _edited(change, *command: str):
    """``command`` (default ``plan info``) of an edited plan of the world's windowed plan, both copied into
    ``here`` (with the length cache the windowed plan records), ``change(here)`` applied."""
    def make(world, here):
        from umlos_cuda.batching.plans.edits import edit_plan, save_edited_plan, skip_steps

        copy(world, here, "windowed", "lengths.jsonl")
        save_edited_plan(edit_plan(here / "windowed", lambda plan: skip_steps(plan, 1, 3, world_size=2)),
                         here / "edited")
        change(here)
        return (*(command or ("plan", "info")), str(here / "edited"))
    return make


def _edit_meta(change):
    """The edited plan's meta.json, ``change(meta)`` applied (the edit and the parent as JSON)."""
    def apply(here):
        meta = json.loads((here / "edited" / "meta.json").read_text())
        change(meta)
        (here / "edited" / "meta.json").write_text(json.dumps(meta))
    return apply


def _edit(*argv: str):
    """``plan edit`` of the world's windowed plan copied into ``here``, ``argv`` its flags."""
    def make(world, here):
        copy(world, here, "windowed", "lengths.jsonl")
        return ("plan", "edit", str(here / "windowed"), *argv, "--output", str(here / "out"))
    return make


def _skip_samples(make_rows):
    """``plan edit --skip-samples rows.txt`` of the world's windowed plan copied into ``here``, the rows file made
    by ``make_rows(path)``."""
    def make(world, here):
        copy(world, here, "windowed", "lengths.jsonl")
        make_rows(here / "rows.txt")
        return ("plan", "edit", str(here / "windowed"), "--skip-samples", str(here / "rows.txt"), "--output",
                str(here / "out"))
    return make


def _swap_parent(other: str):
    """An edited plan whose parent's folder now holds the world's plan ``other``."""
    def make(world, here):
        argv = _edited(lambda h: shutil.rmtree(h / "windowed"))(world, here)
        shutil.copytree(world / other, here / "windowed", symlinks=True)
        return argv
    return make


EDIT_CASES = [
    Case("hang/plan-edited-fifo-meta-json", _edited(lambda h: fifo(h / "edited" / "meta.json")), (WP,), "meta.json"),
    Case("hang/plan-edited-sparse-meta-json", _edited(lambda h: sparse(h / "edited" / "meta.json")), (WP,),
         "meta.json"),
    Case("hang/plan-edited-meta-json-a-symlink-to-a-fifo", _edited(lambda h: _link_to_fifo(h / "edited" / "meta.json")),
         (WP,), "meta.json"),
    Case("traceback/plan-edited-deep-meta-json", _edited(lambda h: (h / "edited" / "meta.json").write_text(
        deep_json())), (WP,), "meta.json"),
    Case("traceback/plan-edited-parent-path-a-number", _edited(_edit_meta(lambda m: m["parent"].update(path=7))),
         (WP,), "meta.json"),
    Case("traceback/plan-edited-range-of-40-digits",
         _edited(_edit_meta(lambda m: m["edit"].update(units=[[0, 1, int("9" * 40)]]))), (WP,), "meta.json"),
    Case("hang/plan-edited-a-million-ranges",
         _edited(_edit_meta(lambda m: m["edit"].update(units=[[0, 2 * i, 2 * i + 1] for i in range(1 << 20)]))),
         (WP,), "meta.json"),
    Case("traceback/plan-edited-names-itself-as-its-parent",
         _edited(_edit_meta(lambda m: m["parent"].update(path="edited"))), (WP,), "meta.json"),
    Case("user/plan-edited-parent-gone", _edited(lambda h: shutil.rmtree(h / "windowed")),
         (errors.PLAN_PARENT_MISMATCH,), "windowed"),
    Case("user/plan-edited-parent-a-fifo", _edited(lambda h: shutil.rmtree(h / "windowed") or fifo(h / "windowed")),
         (errors.PLAN_NOT_FOUND, errors.PLAN_PARENT_MISMATCH), "windowed"),
    Case("user/plan-edited-parent-replaced-by-another-kind-of-plan", _swap_parent("mixed"),
         (errors.PLAN_PARENT_MISMATCH,), "windowed"),
    Case("hang/plan-edited-parent-fifo-index-npy", _edited(lambda h: fifo(h / "windowed" / "index.npy"),
                                                           "plan", "verify"), (WP,), "index.npy"),
    Case("hang/plan-edit-world-size-2^32-1", _edit("--skip-steps", "0:1", "--world-size", "4294967295"), ()),
    Case("traceback/plan-edit-steps-of-40-digits", _edit("--skip-steps", "0:" + "9" * 40),
         (errors.PLAN_CURSOR_INVALID,)),
    Case("traceback/plan-edit-empty-range", _edit("--skip-steps", "4:4"), (errors.BATCHING_CONFIG_INVALID,)),
    Case("hang/plan-edit-skip-samples-fifo", _skip_samples(fifo), (errors.BATCHING_CONFIG_INVALID,), "rows.txt"),
    Case("hang/plan-edit-skip-samples-sparse", _skip_samples(sparse), (errors.BATCHING_CONFIG_INVALID,), "rows.txt"),
    Case("traceback/plan-edit-skip-samples-binary", _skip_samples(lambda p: p.write_bytes(b"\xff\xfe7\n")),
         (errors.BATCHING_CONFIG_INVALID,), "rows.txt"),
    Case("traceback/plan-edit-skip-samples-row-of-40-digits", _skip_samples(lambda p: p.write_text("9" * 40 + "\n")),
         (errors.BATCHING_CONFIG_INVALID,), "rows.txt"),
    Case("traceback/plan-edit-skip-samples-a-directory", _skip_samples(lambda p: p.mkdir()),
         (errors.BATCHING_CONFIG_INVALID,), "rows.txt"),
]


CASES += WINDOWED_CASES + SEQUENCES_CASES + EXPLAIN_CASES + EDIT_CASES
CASES += MIXED_CASES + MIXED_SEQUENCES_CASES + MIXED_BATCH_CASES + SCHEDULE_CASES + UNIT_CASES
CASES += TOKEN_SOURCE_CASES
CASES += TRUNCATION_AND_ROW_CASES
CASES += SILENT_ACCEPTANCE_CASES
CASES += ARTIFACT_CASES
CASES += INTEGER_CASES


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_is_refused_in_bounds(case: Case, world, tmp_path):
    here = tmp_path / "case"
    here.mkdir()
    server = HostileServer(case.server()) if case.server is not None else None
    try:
        argv = case.make(world, here)
        if server is not None:
            argv = tuple(a.replace("{port}", str(server.port)) for a in argv)
        before = hs.tree_state(tmp_path)
        env = {**os.environ, **case.env}
        if argv[0] == "python":
            outcome = hs.python(argv[1], cwd=here, wall_s=case.wall_s, env=env)
        else:
            outcome = hs.cli(*argv, cwd=here, wall_s=case.wall_s, env=env)
        after = hs.tree_state(tmp_path)
    finally:
        if server is not None:
            server.close()
    if case.codes:
        hs.assert_refused(outcome, case.codes, names=case.names)
    else:
        hs.assert_ok(outcome)
    hs.assert_untouched(before, after, owned=[f"case/{o}" for o in case.owned])


def test_the_suite_covers_every_command_that_reads_a_path_or_a_host():
    """Each command whose arguments name a file, a folder or a server is in at least one case."""
    wanted = {"plan info", "plan verify", "plan build", "plan shard", "batch check", "batch generate", "batch verify",
              "data megatron", "data lengths stats", "data lengths build", "gym replay", "gym run", "gym info",
              "gym serve", "next-batch", "next-batch-v1", "indices", "demo", "quality", "golden verify",
              "checkpoint inspect", "checkpoint verify", "checkpoint recover", "checkpoint gc", "data tokenize",
              "batch fingerprint", "data verify", "data append", "plan cut", "info", "verify", "plan explain"}
    names = {case.id.split("/", 1)[1] for case in CASES}
    for command in wanted:
        assert any(name.startswith(command.replace(" ", "-") + "-") for name in names), command
    assert len(CASES) >= 45


# ---------------------------------------------------------------------- token stores in an object store
def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def _patch_meta(**fields):
    def change(store: Path) -> None:
        meta = json.loads((store / "meta.json").read_text())
        meta.update(fields)
        (store / "meta.json").write_text(json.dumps(meta))
    return change


def _claims_2_38_tokens(store: Path) -> None:
    """tokens.npy's header says 2^38 elements (rewritten by numpy's own header writer); its data stays as it is."""
    tokens = np.load(store / "tokens.npy")
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": tokens.dtype.str, "fortran_order": False,
                                                  "shape": (1 << 38,)})
    (store / "tokens.npy").write_bytes(header.getvalue() + tokens.tobytes())


@dataclass
class RemoteCase:
    """A token store copied into a bucket after ``change(folder)``; reading it through the source layer
    (``open_source(URL, tokens=True)``) in a fenced child must be refused with ``code`` naming ``names``
    (an object's name: a suffix of its URL)."""

    id: str
    change: Callable[[Path], None]
    code: str
    names: str
    folder: str = "store"
    files: tuple[str, ...] = ()  # files of the world put under the prefix instead of a folder
    entry: str = ""  # what the URL names under the prefix (a Megatron prefix, a sidecar)
    tokens: bool = True  # opened as a token source (a row read), else as lengths (a row's length read)


#: The world's Megatron pair under the prefix, read as PREFIX/mega; its length sidecar, read as itself.
PAIR = {"files": ("mega.idx", "mega.bin"), "entry": "/mega"}
SIDECAR = {"files": ("lengths.jsonl.u32",), "entry": "/lengths.jsonl.u32", "tokens": False}


def _idx_header(**fields):
    """Rewrite fields of mega.idx's header (version, code, count, documents), its arrays left as they are."""
    def change(folder: Path) -> None:
        data = bytearray((folder / "mega.idx").read_bytes())
        version, code, count, documents = struct.unpack("<QBQQ", data[9:34])
        values = {"version": version, "code": code, "count": count, "documents": documents, **fields}
        data[9:34] = struct.pack("<QBQQ", values["version"], values["code"], values["count"], values["documents"])
        (folder / "mega.idx").write_bytes(bytes(data))
    return change


def _sidecar_bytes(folder: Path, change: Callable[[bytes], bytes]) -> None:
    (folder / "lengths.jsonl.u32").write_bytes(change((folder / "lengths.jsonl.u32").read_bytes()))


def _first_pointer(value: int):
    def change(folder: Path) -> None:
        data = bytearray((folder / "mega.idx").read_bytes())
        count = struct.unpack("<Q", data[18:26])[0]
        data[34 + 4 * count:34 + 4 * count + 8] = struct.pack("<q", value)
        (folder / "mega.idx").write_bytes(bytes(data))
    return change


def _sharded_index(**fields):
    def change(store: Path) -> None:
        edit_json(store / "meta.json", lambda index: index.update(fields))
    return change


def _first_shard_entry(**fields):
    def change(store: Path) -> None:
        edit_json(store / "meta.json", lambda index: index["shards"][0].update(fields))
    return change


REMOTE_CASES = [
    RemoteCase("hang/remote-store-header-claims-2^38-tokens", _claims_2_38_tokens, errors.TOKEN_STORE_INVALID,
               "tokens.npy"),
    RemoteCase("hang/remote-store-meta-claims-10^12-samples", _patch_meta(num_samples=10**12),
               errors.TOKEN_STORE_INVALID, "case"),
    RemoteCase("traceback/remote-store-deep-meta-json",
               lambda store: (store / "meta.json").write_text(deep_json()), errors.TOKEN_STORE_INVALID, "meta.json"),
    RemoteCase("traceback/remote-store-meta-not-utf8", lambda store: (store / "meta.json").write_bytes(b"\xff\xfe{"),
               errors.TOKEN_STORE_INVALID, "meta.json"),
    RemoteCase("traceback/remote-store-meta-wrong-field-type", _patch_meta(num_tokens="many"),
               errors.TOKEN_STORE_INVALID, "meta.json"),
    RemoteCase("traceback/remote-store-pickled-offsets",
               lambda store: (store / "offsets.npy").write_bytes(_npy_bytes(np.array([object()] * 3))),
               errors.TOKEN_STORE_INVALID, "offsets.npy"),
    RemoteCase("traceback/remote-store-truncated-loss-mask",
               lambda store: (store / "loss_mask.npy").write_bytes((store / "loss_mask.npy").read_bytes()[:-7]),
               errors.TOKEN_STORE_INVALID, "loss_mask.npy"),
    RemoteCase("traceback/remote-store-offsets-past-the-tokens",
               lambda store: (store / "offsets.npy").write_bytes(_npy_bytes(
                   np.load(store / "offsets.npy") * 2)), errors.TOKEN_STORE_INVALID, "offsets.npy"),
    RemoteCase("user/remote-store-not-there", lambda store: (store / "meta.json").unlink(),
               errors.TOKEN_STORE_NOT_FOUND, "meta.json"),
    # a sharded store (its marker says so): the index's checks and each shard's are the folder reader's
    RemoteCase("hang/remote-sharded-index-over-its-cap",
               lambda store: (store / "meta.json").write_bytes(b" " * (64 << 20) + b"{}"),
               errors.SHARDED_STORE_INVALID, "meta.json", "sharded"),
    RemoteCase("hang/remote-sharded-shard-meta-over-its-cap",
               lambda store: (store / "shards" / "00000" / "meta.json").write_bytes(b" " * (1 << 20) + b"{}"),
               errors.SHARDED_STORE_INVALID, "shards/00000/meta.json", "sharded"),
    RemoteCase("traceback/remote-sharded-deep-index", lambda store: (store / "meta.json").write_text(deep_json()),
               errors.SHARDED_STORE_INVALID, "meta.json", "sharded"),
    RemoteCase("traceback/remote-sharded-index-totals-not-the-sums", _sharded_index(num_samples=10**12),
               errors.SHARDED_STORE_INVALID, "meta.json", "sharded"),
    RemoteCase("traceback/remote-sharded-shard-name-escapes", _first_shard_entry(name="../../elsewhere"),
               errors.SHARDED_STORE_INVALID, "meta.json", "sharded"),
    RemoteCase("traceback/remote-sharded-shard-replaced",
               lambda store: edit_json(store / "shards" / "00000" / "meta.json",
                                       lambda meta: meta.update(dataset_hash="0" * 64)),
               errors.SHARDED_STORE_INVALID, "shards/00000/meta.json", "sharded"),
    RemoteCase("traceback/remote-sharded-truncated-shard-tokens",
               lambda store: (store / "shards" / "00000" / "tokens.npy").write_bytes(
                   (store / "shards" / "00000" / "tokens.npy").read_bytes()[:-3]),
               errors.TOKEN_STORE_INVALID, "shards/00000/tokens.npy", "sharded"),
    RemoteCase("user/remote-sharded-missing-shard", lambda store: shutil.rmtree(store / "shards" / "00000"),
               errors.SHARDED_STORE_INVALID, "shards/00000", "sharded"),
    # a Megatron pair: the .idx header checked against the object's size before its body is fetched
    RemoteCase("hang/remote-megatron-idx-claims-2^40-sequences", _idx_header(count=1 << 40),
               errors.MEGATRON_INDEX_INVALID, "mega.idx", **PAIR),
    RemoteCase("traceback/remote-megatron-idx-truncated",
               lambda folder: (folder / "mega.idx").write_bytes((folder / "mega.idx").read_bytes()[:20]),
               errors.MEGATRON_INDEX_INVALID, "mega.idx", **PAIR),
    RemoteCase("traceback/remote-megatron-float-dtype-code", _idx_header(code=6), errors.MEGATRON_INDEX_INVALID,
               "mega.idx", **PAIR),
    RemoteCase("traceback/remote-megatron-pointer-near-2^63", _first_pointer((1 << 63) - 2),
               errors.MEGATRON_INDEX_INVALID, "mega.idx", **PAIR),
    RemoteCase("traceback/remote-megatron-bin-truncated",
               lambda folder: (folder / "mega.bin").write_bytes((folder / "mega.bin").read_bytes()[:-2]),
               errors.MEGATRON_INDEX_INVALID, "mega.idx", **PAIR),
    RemoteCase("user/remote-megatron-bin-missing", lambda folder: (folder / "mega.bin").unlink(),
               errors.MEGATRON_INDEX_INVALID, "mega.bin", **PAIR),
    # a length cache's sidecar: its preamble, header and size checked before its length bytes are fetched
    RemoteCase("hang/remote-sidecar-header-claims-4-GiB", lambda folder: _sidecar_bytes(
        folder, lambda data: data[:8] + struct.pack("<I", 0xFFFFFFFF) + data[12:]),
        errors.LENGTHS_SIDECAR_MISMATCH, "lengths.jsonl.u32", **SIDECAR),
    RemoteCase("traceback/remote-sidecar-no-magic", lambda folder: _sidecar_bytes(folder, lambda data: b"X" + data[1:]),
               errors.LENGTHS_SIDECAR_MISMATCH, "lengths.jsonl.u32", **SIDECAR),
    RemoteCase("traceback/remote-sidecar-truncated-lengths", lambda folder: _sidecar_bytes(
        folder, lambda data: data[:-4]), errors.LENGTHS_SIDECAR_MISMATCH, "lengths.jsonl.u32", **SIDECAR),
    RemoteCase("traceback/remote-sidecar-lengths-not-their-sha256", lambda folder: _sidecar_bytes(
        folder, lambda data: data[:-1] + bytes([data[-1] ^ 1])), errors.LENGTHS_SIDECAR_MISMATCH,
        "lengths.jsonl.u32", **SIDECAR),
    RemoteCase("user/remote-length-cache-jsonl", lambda folder: None, errors.REMOTE_UNAVAILABLE, "lengths.jsonl",
               files=("lengths.jsonl",), entry="/lengths.jsonl", tokens=False),
]

_REMOTE_LENGTHS = hs.API_PRELUDE + (
    "import numpy as np\n"
    "from umlos_cuda.batching.sources import open_source\n"
    "guarded(lambda: open_source(sys.argv[1]).take(np.arange(1)))\n"
)
_REMOTE_OPEN = hs.API_PRELUDE + (
    "from umlos_cuda.batching.sources import open_source\n"
    "guarded(lambda: open_source(sys.argv[1], tokens=True).arrays(0))\n"
)


def _case_url(case: RemoteCase, world: Path, tmp_path: Path, object_store) -> str:
    """The URL of ``case``'s store (or files) copied from the world into a fresh bucket after its change."""
    here = tmp_path / "case"
    if case.files:
        here.mkdir()
        for name in case.files:
            shutil.copyfile(world / name, here / name)
    else:
        shutil.copytree(world / case.folder, here)
    case.change(here)
    return object_store.upload_folder(here, object_store.bucket(), "case") + case.entry


@pytest.mark.parametrize("case", REMOTE_CASES, ids=[c.id for c in REMOTE_CASES])
def test_a_hostile_remote_store_is_refused_in_bounds(case: RemoteCase, world, tmp_path, object_store):
    """The reader of token stores in object stores (umlos_cuda/remote/) keeps the bounded reader's rules: sizes
    and headers before allocation, depth before parsing, each failure the store's documented code."""
    url = _case_url(case, world, tmp_path, object_store)
    before = hs.tree_state(tmp_path)
    outcome = hs.python(_REMOTE_OPEN if case.tokens else _REMOTE_LENGTHS, url, cwd=tmp_path, wall_s=WALL_S,
                        env=dict(os.environ))
    hs.assert_refused(outcome, case.code, names=case.names)
    hs.assert_untouched(before, hs.tree_state(tmp_path))


#: The sharded store's cases again, read through the planned cache (a shard is opened when the pass that reads its
#: rows is planned), and a Megatron pair, which the planned cache refuses.
PLANNED_CASES = [case for case in REMOTE_CASES if case.folder == "sharded"] + [
    RemoteCase("user/remote-megatron-through-the-planned-cache", lambda folder: None, errors.REMOTE_UNAVAILABLE,
               "mega", **PAIR),
]

#: A plan over the intact sharded store on disk (``argv[2]``), its first microbatch read through a planned cache
#: of the URL (``argv[1]``).
_REMOTE_PLANNED = hs.API_PRELUDE + (
    "from umlos_cuda.batching import BatchingConfig\n"
    "from umlos_cuda.batching.plans.windows import ArrayLengths, WindowDefinition, WindowedPlan\n"
    "from umlos_cuda.batching.tokens.logical import ShardedTokenStore\n"
    "from umlos_cuda.remote import PlannedTokenSource\n"
    "from umlos_cuda.torch import PlanBatchSampler\n"
    "intact = ShardedTokenStore.open(sys.argv[2])\n"
    "config = BatchingConfig.throughput(512, (32, 64, 128), 256, seed=1)\n"
    "plan = WindowedPlan.build(WindowDefinition(config, len(intact), 8), ArrayLengths(intact.lengths), 1)\n"
    "rows = [int(key) for key in next(iter(PlanBatchSampler(plan)))]\n"
    "guarded(lambda: PlannedTokenSource(sys.argv[1], PlanBatchSampler(plan), cache_bytes=4096,\n"
    "                                   block_bytes=1024).arrays_many(rows))\n"
)


@pytest.mark.parametrize("case", PLANNED_CASES, ids=[c.id for c in PLANNED_CASES])
def test_a_hostile_remote_store_is_refused_by_the_planned_cache_in_bounds(case: RemoteCase, world, tmp_path,
                                                                          object_store):
    """The planned cache opens a sharded store's shards through the same checks as the source layer (each
    failure the store's documented code, in bounds), and refuses what it does not read with its code."""
    url = _case_url(case, world, tmp_path, object_store)
    before = hs.tree_state(tmp_path)
    outcome = hs.python(_REMOTE_PLANNED, url, str(world / "sharded"), cwd=tmp_path, wall_s=WALL_S,
                        env=dict(os.environ))
    hs.assert_refused(outcome, case.code, names=case.names)
    hs.assert_untouched(before, hs.tree_state(tmp_path))


def test_a_remote_shard_rewritten_between_its_opening_and_a_read_is_refused(world, tmp_path, object_store):
    """An object rewritten after a shard was opened (its ETag recorded) is REMOTE_OBJECT_CHANGED naming it, at the
    next read of it, never a mix of the old and new bytes."""
    from umlos_cuda.batching.sources import open_source
    from umlos_cuda.errors import UmlosError

    bucket = object_store.bucket()
    url = object_store.upload_folder(world / "sharded", bucket, "case")
    source = open_source(url, tokens=True)
    source.arrays(0)  # shard 00000 opened: its objects' ETags recorded
    mask = (world / "sharded" / "shards" / "00000" / "loss_mask.npy").read_bytes()
    object_store.put(bucket, "case/shards/00000/loss_mask.npy", mask[:-1] + bytes([mask[-1] ^ 1]))
    with pytest.raises(UmlosError) as info:
        source.arrays(1)
    assert info.value.code == errors.REMOTE_OBJECT_CHANGED
    assert f"{url}/shards/00000/loss_mask.npy" in info.value.message


# ---------------------------------------------------------------------- datasets named by object-store URLs
def _truncated_parquet_bytes(world: Path) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in (world / "train.jsonl").read_text(encoding="utf-8").splitlines()]
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer)
    return buffer.getvalue()[:-9]  # no footer


def _gzip_without_trailer(world: Path) -> bytes:
    import gzip

    return gzip.compress((world / "train.jsonl").read_bytes())[:-8]


@dataclass
class DatasetUrlCase:
    """Objects put under a bucket's prefix ``data`` (``{key: bytes of the world}``); ``data tokenize --dataset
    s3://BUCKET/data/<entry>`` in a fenced child must be refused with ``code`` naming the URL, and leave no copy."""

    id: str
    objects: Callable[[Path], dict[str, bytes]]
    entry: str
    code: str


DATASET_URL_CASES = [
    DatasetUrlCase("traceback/data-tokenize-url-parquet-without-footer",
                   lambda world: {"train.parquet": _truncated_parquet_bytes(world)}, "train.parquet",
                   errors.DATASET_UNREADABLE),
    DatasetUrlCase("traceback/data-tokenize-url-gzip-without-trailer",
                   lambda world: {"train.jsonl.gz": _gzip_without_trailer(world)}, "train.jsonl.gz",
                   errors.DATASET_UNREADABLE),
    DatasetUrlCase("traceback/data-tokenize-url-line-not-a-record",
                   lambda world: {"train.jsonl": (world / "train.jsonl").read_bytes() + b"[1, 2]\n"}, "train.jsonl",
                   errors.DATASET_RECORD_INVALID),
    DatasetUrlCase("traceback/data-tokenize-url-folder-not-save-to-disk",
                   lambda world: {"ds/notes.txt": b"hello"}, "ds", errors.DATASET_UNREADABLE),
    DatasetUrlCase("user/data-tokenize-url-nothing-there", lambda world: {}, "missing.jsonl",
                   errors.DATASET_UNREADABLE),
]


@pytest.mark.parametrize("case", DATASET_URL_CASES, ids=[c.id for c in DATASET_URL_CASES])
def test_a_hostile_dataset_url_is_refused_in_bounds(case: DatasetUrlCase, world, tmp_path, object_store):
    """A dataset read from an object store is copied to a private folder and read by the records layer with its
    own bounds: each failure its documented code, naming the URL (not the copy), the copy removed."""
    bucket = object_store.bucket()
    for key, data in case.objects(world).items():
        object_store.put(bucket, f"data/{key}", data)
    url = f"s3://{bucket}/data/{case.entry}"
    copy(world, tmp_path, "model")
    (tmp_path / "tmp").mkdir()
    before = hs.tree_state(tmp_path)
    outcome = hs.cli("data", "tokenize", "--dataset", url, "--tokenizer", str(tmp_path / "model"), "--output",
                     str(tmp_path / "out"), "--quiet", cwd=tmp_path, wall_s=WALL_S,
                     env={**os.environ, "TMPDIR": str(tmp_path / "tmp")})
    hs.assert_refused(outcome, case.code, names=url)
    assert str(tmp_path / "tmp") not in outcome.stderr
    hs.assert_untouched(before, hs.tree_state(tmp_path))
