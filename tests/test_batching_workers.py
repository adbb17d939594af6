"""``--workers N`` (umlos_cuda/batching/lengths/workers.py): the same bytes for every N and chunk size,
the same errors, and a Ctrl-C or SIGTERM that stops every worker and leaves nothing behind.

Byte identity is checked on every file a build writes (the length cache and
its sidecar; every file of the token store), for every input format
(JSONL plain, gzip, zstd, Parquet, Arrow IPC file and stream, a
``save_to_disk`` folder, a ``datasets.Dataset``, shards) and every kind of
record (text, prompt/response, preference pairs, chat messages, a token-count
field), against one worker and one chunk. Signals go to a real ``umlos-cuda``
process once its workers run: the exit status, no output, no hidden folder,
and no process of its group left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

from batching_cases import expect, train_tokenizer, write_model_dir
from test_batching_records import FORMATS, sharded, write
from token_cases import records
from umlos_cuda import errors
from umlos_cuda.batching import build_lengths
from umlos_cuda.batching.lengths import workers as workers_module
from umlos_cuda.batching.lengths.budget import Budget
from umlos_cuda.batching.lengths.workers import available_cores, in_order
from umlos_cuda.batching.records.chunk import RecordChunk
from umlos_cuda.batching.tokens.writer import tokenize_dataset
from umlos_cuda.errors import UmlosError

import worker_cases

ROOT = Path(__file__).resolve().parents[1]
COUNT = 90


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_model_dir(tmp_path_factory.mktemp("model") / "model", train_tokenizer(), {"eos_token": "</s>"})


@pytest.fixture(scope="module")
def rows():
    return [{**row, "n": len(row["text"])} for row in records(COUNT, seed=11)]


def files(dataset, model, out: Path, workers: int, chunk_size: int, **fields) -> dict[str, bytes]:
    """Every byte the length cache and the token store of ``dataset`` hold, by file name."""
    out.mkdir()
    build_lengths(dataset, model, out / "lengths.jsonl", chunk_size=chunk_size, workers=workers, **fields)
    found = {name: (out / name).read_bytes() for name in ("lengths.jsonl", "lengths.jsonl.u32")}
    if "length_field" not in fields:  # a token store encodes text
        tokenize_dataset(dataset, model, out / "store", chunk_size=chunk_size, workers=workers, **fields)
        found |= {f"store/{p.name}": p.read_bytes() for p in sorted((out / "store").iterdir())}
        assert {"store/tokens.npy", "store/loss_mask.npy", "store/offsets.npy", "store/meta.json"} <= set(found)
    return found


def test_every_format_gives_the_same_bytes_with_two_workers(rows, model, tmp_path):
    """Each format (and 3 shards of it) with 2 workers and chunks of 7 records: the bytes of 1 worker, 1 chunk."""
    reference = files(write(rows, tmp_path / "ref", "jsonl"), model, tmp_path / "ref-out", 1, 4096)
    for kind in FORMATS:
        got = files(write(rows, tmp_path / kind, kind), model, tmp_path / f"{kind}-out", 2, 7)
        assert got == reference, kind
    for kind in ("jsonl.zst", "parquet"):
        got = files(sharded(rows, tmp_path / f"{kind}-shards", kind), model, tmp_path / f"{kind}-s-out", 2, 7)
        assert got == reference, f"{kind} in 3 shards"


def chat_model(folder: Path) -> Path:
    from test_batching_chat import write_family

    return write_family(folder, "chatml")


KINDS = {
    "text": ({}, None),
    "prompt-response": ({"prompt_field": "prompt", "response_field": "response"}, None),
    "preference-pairs": ({"prompt_field": "prompt", "chosen_field": "response", "rejected_field": "text"}, None),
    "chat": ({"messages_field": "messages"}, "chat"),
    "length-field": ({"length_field": "n"}, None),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_record_kind_gives_the_same_bytes_for_every_worker_count_and_chunk_size(rows, model, tmp_path, kind):
    fields, special = KINDS[kind]
    if special == "chat":
        model = chat_model(tmp_path / "chat-model")
        rows = [{"id": row["id"], "messages": [{"role": "user", "content": row["prompt"]},
                                               {"role": "assistant", "content": row["response"]}]} for row in rows]
    dataset = write(rows, tmp_path / "data", "jsonl")
    reference = files(dataset, model, tmp_path / "reference", 1, 4096, **fields)
    for workers, chunk_size in [(1, 1), (1, 5), (1, 64), (2, 3), (2, 64), (2, 4096), (4, 5)]:
        got = files(dataset, model, tmp_path / f"w{workers}-c{chunk_size}", workers, chunk_size, **fields)
        assert got == reference, (workers, chunk_size)


def test_chat_records_reach_the_workers_in_chunks_of_at_most_the_render_chunk(rows, tmp_path, monkeypatch):
    """Chat records go to the render workers in chunks of at most RENDER_CHUNK records whatever ``chunk_size``
    (so that N workers share a small dataset evenly), a smaller ``chunk_size`` still applying, and the store
    is the bytes of one worker and one chunk."""
    from umlos_cuda.batching.lengths import builder
    from umlos_cuda.batching.lengths.builder import DatasetEncoding

    model = chat_model(tmp_path / "chat-model")
    chats = [{"id": row["id"], "messages": [{"role": "user", "content": row["prompt"]},
                                            {"role": "assistant", "content": row["response"]}]} for row in rows]
    dataset = write(chats, tmp_path / "data", "jsonl")
    reference = files(dataset, model, tmp_path / "reference", 1, 4096, messages_field="messages")
    monkeypatch.setattr(builder, "RENDER_CHUNK", 16)
    for chunk_size, sizes in [(4096, [16] * 5 + [10]), (7, [7] * 12 + [6])]:
        source = DatasetEncoding(dataset, model, messages_field="messages")
        with closing(source.stream(source.work(), chunk_size, 2)) as stream:
            assert [len(chunk.sample_ids) for chunk, _lengths in stream] == sizes
        got = files(dataset, model, tmp_path / f"capped-{chunk_size}", 2, chunk_size, messages_field="messages")
        assert got == reference, chunk_size


# --------------------------------------------------------------- errors
def tokenizer_that_panics_on_long_texts(tmp_path) -> Path:
    """A tokenizer.json whose truncation stride exceeds its length: the Rust library panics on any text it
    must truncate (more than 2 tokens) and encodes shorter ones."""
    data = json.loads(train_tokenizer().to_str())
    data["truncation"] = {"direction": "Right", "max_length": 2, "strategy": "LongestFirst", "stride": 5}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("build", [build_lengths, tokenize_dataset], ids=["lengths", "tokenize"])
def test_errors_are_the_same_for_every_worker_count(tmp_path, build):
    """A tokenizer failure in a worker (lines 13-15) is raised with one worker's code and message, and
    before a bad line read later (line 20), for any number of workers; a bad line alone likewise."""
    tokenizer = tokenizer_that_panics_on_long_texts(tmp_path)
    lines = [json.dumps({"text": "the"})] * 12 + [json.dumps({"text": "the quick brown fox jumps"})] * 3 \
        + [json.dumps({"text": "the"})] * 4 + ['{"text": "broken']
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n")
    messages = set()
    for workers in (1, 2, 4):
        error = expect(errors.TOKENIZER_INVALID, build, tmp_path / "train.jsonl", tokenizer, tmp_path / f"out{workers}",
                       chunk_size=3, workers=workers, mention="the tokenizer failed on lines 13-15 of ")
        messages.add(error.message)
    assert len(messages) == 1
    (tmp_path / "bad.jsonl").write_text("\n".join(lines[:12] + lines[15:]) + "\n")
    messages = {expect(errors.DATASET_RECORD_INVALID, build, tmp_path / "bad.jsonl", tokenizer,
                       tmp_path / f"bad{workers}", chunk_size=3, workers=workers, mention="line 17 is not JSON").message
                for workers in (1, 2, 4)}
    assert len(messages) == 1
    assert sorted(os.listdir(tmp_path)) == ["bad.jsonl", "tokenizer.json", "train.jsonl"]  # nothing written


def chunks(count: int, size: int):
    for start in range(0, count, size):
        n = min(size, count - start)
        yield RecordChunk([str(i) for i in range(start, start + n)], [["x"] * n], start, start + n)


def test_results_come_in_order_and_other_exceptions_cross_as_they_are():
    got = [(chunk.first_line, result) for chunk, result in in_order(worker_cases.count_rows, chunks(23, 4), 3)]
    assert got == [(0, 4), (4, 4), (8, 4), (12, 4), (16, 4), (20, 3)]
    with pytest.raises(ValueError, match="no work on line 0"):
        list(in_order(worker_cases.fail_with_value_error, chunks(9, 2), 2))


def test_a_worker_that_dies_is_a_documented_error_naming_its_lines():
    with pytest.raises(UmlosError) as info:
        list(in_order(worker_cases.die_on_line(8), chunks(20, 4), 2,
                      lambda chunk: f"lines {chunk.first_line + 1}-{chunk.first_line + 4}"))
    assert info.value.code == errors.TOKENIZER_INVALID
    assert info.value.message.startswith("the worker process encoding lines 9-12 ended without a result (killed by "
                                         "SIGKILL)"), info.value.message


def value_chunks(values: list[str], size: int):
    for start in range(0, len(values), size):
        part = values[start:start + size]
        yield RecordChunk([str(i) for i in range(start, start + len(part))], [part], start, start + len(part))


@pytest.mark.parametrize("workers", [1, 2])
def test_a_budgeted_item_past_its_cpu_seconds_is_given_up_and_the_rest_done(workers):
    """Untrusted work (lengths/budget.py): a row that spins inside one C call ends its worker at the CPU budget;
    the pool gives that row up with the reason and runs the chunk again on a new worker, which skips it. Every
    other row, in its chunk and in the chunks the dead worker held, is done once, in order."""
    values = [f"v{i}" for i in range(14)]
    work = worker_cases.budgeted(burn={"v2", "v9"})
    got = [pair for _chunk, result in in_order(work, value_chunks(values, 4), workers,
                                                budget=Budget(cpu_s=1, memory_mib=0, wall_s=0, cpu_setting="CPU"))
           for pair in result]
    assert [value for value, _ in got] == values
    given_up = {value: outcome for value, outcome in got if outcome != "ok"}
    assert given_up == dict.fromkeys(("v2", "v9"), "it used more than 1 CPU seconds (CPU=1)")


def test_a_budgeted_item_past_its_wall_clock_seconds_is_given_up():
    """A row that makes no progress (asleep: no CPU time) has its worker killed by the parent at the wall-clock
    budget; a row that asks for more memory than the budget fails inside its item, and the worker goes on."""
    values = [f"v{i}" for i in range(6)]
    work = worker_cases.budgeted(sleep={"v1"}, allocate={"v4"})
    budget = Budget(cpu_s=0, memory_mib=256, wall_s=1, wall_setting="WALL")
    got = [pair for _chunk, result in in_order(work, value_chunks(values, 3), 1, budget=budget) for pair in result]
    assert got == [("v0", "ok"), ("v1", "it ran for more than 1 seconds by the clock (WALL=1)"), ("v2", "ok"),
                   ("v3", "ok"), ("v4", "MemoryError"), ("v5", "ok")]


def test_a_budgeted_worker_that_dies_outside_an_item_names_its_lines():
    """Outside an item (no row of untrusted work in progress) a death is the worker's, as without a budget."""
    with pytest.raises(UmlosError) as info:
        list(in_order(worker_cases.die_on_line(4), value_chunks([f"v{i}" for i in range(8)], 4), 1,
                      lambda chunk: f"lines {chunk.first_line + 1}-{chunk.first_line + 4}",
                      budget=Budget(cpu_s=5, memory_mib=100, wall_s=5)))
    assert info.value.code == errors.TOKENIZER_INVALID
    assert info.value.message.startswith("the worker process encoding lines 5-8 ended without a result (killed by "
                                         "SIGKILL)"), info.value.message
    assert "its memory budget (memory_mib=100) was too small" in info.value.message


def test_the_number_of_workers_is_checked():
    for bad in (0, -1, 1.5, True, "2", workers_module.MAX_WORKERS + 1):
        expect(errors.INVALID_ARGUMENT, lambda bad=bad: list(in_order(worker_cases.count_rows, chunks(3, 1), bad)),
               mention="workers must be an integer from 1 to")
    assert available_cores() == len(os.sched_getaffinity(0))


# --------------------------------------------------------------- signals
def group_members(group: int) -> list[int]:
    """The processes of process group ``group`` still alive (zombies excluded)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            found.append(int(entry))
    return found


def _default_signals():
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)  # whatever the test runner's parent ignores


def write_large_dataset(path: Path) -> None:
    """Enough records that two workers take many seconds (their lines repeat: written in a moment)."""
    block = "".join(json.dumps({"id": f"r{i}", "text": row["text"]}) + "\n"
                    for i, row in enumerate(records(1000, seed=3)))
    with open(path, "w", encoding="utf-8") as handle:
        for copy in range(600):
            handle.write(block.replace('{"id": "r', f'{{"id": "c{copy}-r'))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads process groups from /proc")
@pytest.mark.parametrize("command", ["tokenize", "lengths"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_signal_stops_every_worker_and_leaves_nothing(model, tmp_path, command, signum):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) or SIGTERM (to the command alone,
    as a scheduler sends it) once the workers encode: status 128 + signal, no output, no hidden folder or
    file, and no process of the command's group left (its workers, and multiprocessing's resource tracker,
    which exits when the command does)."""
    write_large_dataset(tmp_path / "big.jsonl")
    output = tmp_path / ("store" if command == "tokenize" else "lengths.jsonl")
    action = ["data", "tokenize"] if command == "tokenize" else ["data", "lengths", "build"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-m", "umlos_cuda.cli", *action, "--dataset", str(tmp_path / "big.jsonl"), "--tokenizer",
         str(model), "--output", str(output), "--workers", "2", "--chunk-size", "256", "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
        preexec_fn=_default_signals)
    try:
        deadline = time.monotonic() + 120
        # Working: the workers' results of several chunks written to the hidden output (at most 4 chunks
        # are in flight, each over 10 KB written), and the workers, the command and the resource tracker alive.
        while time.monotonic() < deadline and child.poll() is None and hidden_bytes(tmp_path) < 200_000:
            time.sleep(0.01)
        assert child.poll() is None, f"the command ended before the signal (status {child.poll()})"
        assert len(group_members(child.pid)) == 4, "not two workers running"
        if signum == signal.SIGINT:
            os.killpg(child.pid, signum)
        else:
            child.send_signal(signum)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
    assert child.returncode == 128 + signum, err
    assert err == ("interrupted\n" if signum == signal.SIGINT else f"terminated by {signum.name}\n")
    assert out == "" and sorted(os.listdir(tmp_path)) == ["big.jsonl"]
    # The command reaped its workers before it exited; only the resource tracker may still be there, for
    # as long as it takes to read the end of its pipe.
    left = {pid: command_line(pid) for pid in group_members(child.pid)}
    assert all(not line or "resource_tracker" in line for line in left.values()), left  # "": exiting
    deadline = time.monotonic() + 60
    while group_members(child.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert group_members(child.pid) == []


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""  # it ended meanwhile


def hidden_bytes(folder: Path) -> int:
    """The bytes written under the hidden entries of ``folder`` (an output in progress)."""
    total = 0
    for name in os.listdir(folder):
        if name.startswith("."):
            path = folder / name
            try:
                total += sum(p.stat().st_size for p in path.rglob("*")) if path.is_dir() else path.stat().st_size
            except OSError:
                continue
    return total


def test_a_sharded_store_is_the_same_for_every_worker_count(rows, model, tmp_path):
    """``tokenize_sharded`` (one shard per input file) passes ``workers`` to each shard's tokenization:
    every file of the sharded store, its shards' included, is the same bytes for 1 and 2 workers."""
    from umlos_cuda.batching.tokens.partition import tokenize_sharded

    dataset = sharded(rows, tmp_path / "shards", "parquet")

    def tree(folder: Path) -> dict[str, bytes]:
        return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}

    tokenize_sharded(dataset, model, tmp_path / "one", chunk_size=4096, workers=1)
    tokenize_sharded(dataset, model, tmp_path / "two", chunk_size=7, workers=2)
    assert len(tree(tmp_path / "one")) > 3 * 5 and tree(tmp_path / "two") == tree(tmp_path / "one")
