"""What the readers of the LLM stack do with files/reader.py behind them, in-process: dataset lines
over the cap, Megatron pointers that would wrap, a replay buffer whose memory follows what it
holds, YAML nested past the parser's stack, a flooding or deeply nested puzzle server, and the
command-line values no reader could use.

The same inputs through the commands, in fenced children, are tests/test_hostile_readers.py."""

from __future__ import annotations

import math
import socket
import struct
import threading
import tracemalloc

import numpy as np
import pytest
import yaml

from umlos_cuda import errors
from umlos_cuda.batching.records.jsonl import read_chunks
from umlos_cuda.batching.tokens.megatron import MegatronDataset
from umlos_cuda.errors import UmlosError
from umlos_cuda.manifest import yaml_safe
from umlos_cuda.streams import MockGymStream, ReplayBuffer
from umlos_cuda.streams.gym.server import check_address
from umlos_cuda.streams.gym.telnet_client import TelnetClientConfig, parse_answer
from umlos_cuda.streams.gym.telnet_wire import MAX_ANSWER_BYTES, TelnetLines


def code_of(function, *args, **kwargs) -> tuple[str, str]:
    with pytest.raises(UmlosError) as info:
        function(*args, **kwargs)
    return info.value.code, info.value.message


# ---------------------------------------------------------------------- JSONL datasets
def records(path, **kwargs) -> list[str]:
    return [sid for chunk in read_chunks(path, ("text",), **kwargs) for sid in chunk.sample_ids]


def test_a_dataset_line_over_the_cap_is_a_bad_record(tmp_path, monkeypatch):
    from umlos_cuda.files import reader

    monkeypatch.setattr(reader, "MAX_LINE_BYTES", 32)  # 64 MiB in use: a smaller cap keeps the test small
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"text": "a"}\n{"text": "' + b"x" * 40 + b'"}\n')
    code, message = code_of(records, path)
    assert code == errors.DATASET_RECORD_INVALID and "line 2 is longer than 32 bytes" in message


# ---------------------------------------------------------------------- Megatron
def write_idx(path, sizes, pointers, bin_bytes: int, code: int = 4) -> str:
    prefix = str(path)
    with open(prefix + ".idx", "wb") as handle:
        handle.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, len(sizes), 2))
        handle.write(np.asarray(sizes, "<i4").tobytes() + np.asarray(pointers, "<i8").tobytes()
                     + np.asarray([0, len(sizes)], "<i8").tobytes())
    with open(prefix + ".bin", "wb") as handle:
        handle.write(bytes(bin_bytes))
    return prefix


@pytest.mark.parametrize("size,pointer", [
    ((1 << 31) - 1, (1 << 63) - 4),  # pointer + size * 4 wraps to a negative int64: "inside" before the fix
    (1, (1 << 63) - 4),              # a pointer past the .bin
    (3, 0),                          # 12 bytes of an 8-byte .bin
    (1, -4),
])
def test_megatron_pointers_are_checked_without_wrapping(tmp_path, size, pointer):
    prefix = write_idx(tmp_path / "d", [size], [pointer], 8)
    code, message = code_of(MegatronDataset.open, prefix)
    assert code == errors.MEGATRON_INDEX_INVALID and f"points at bytes {pointer} to {pointer + 4 * size}" in message


def test_megatron_pointers_to_the_very_end_are_fine(tmp_path):
    prefix = write_idx(tmp_path / "d", [2, 0], [0, 8], 8)
    dataset = MegatronDataset.open(prefix)
    assert dataset.lengths.tolist() == [2, 0] and dataset.input_ids(1).size == 0


# ---------------------------------------------------------------------- the replay buffer
def test_a_huge_buffer_costs_what_it_holds():
    tracemalloc.start()
    try:
        buffer = ReplayBuffer(1 << 26, "fifo", seed=1)
        for sample in MockGymStream(3, seed=1, max_length=32):
            buffer.add(sample)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak  # 2^26 preallocated slots were about 4.5 GB
    assert len(buffer) == 3 and buffer.snapshot().keys.tolist() == [0, 1, 2]


@pytest.mark.parametrize("eviction", ["fifo", "lowest_priority", "reservoir"])
def test_a_buffer_that_grows_past_its_first_slots_keeps_every_rule(eviction):
    samples = list(MockGymStream(3000, seed=4, max_length=16))
    buffer = ReplayBuffer(2500, eviction, seed=3)
    for i, sample in enumerate(samples):
        buffer.add(sample, 1.0 + i % 7)
    snapshot = buffer.snapshot()
    assert len(snapshot) == 2500 and len(set(snapshot.keys.tolist())) == 2500
    if eviction == "fifo":
        assert snapshot.keys.tolist() == list(range(500, 3000))
    restored = ReplayBuffer(2500, eviction, seed=3)
    restored.load_state_dict(buffer.state_dict(), dict(enumerate(samples)))
    assert restored.snapshot().fingerprint == snapshot.fingerprint


# ---------------------------------------------------------------------- YAML
def nested_blocks(depth: int) -> str:
    return "policies:\n" + "".join(" " * (i + 1) + "a:\n" for i in range(depth)) + " " * (depth + 1) + "b\n"


@pytest.mark.parametrize("text", ["a: " + "[" * 100_000, nested_blocks(1400), "- " * 2000 + "x"])
def test_yaml_nested_past_the_stack_is_a_yaml_error(text):
    with pytest.raises(yaml.YAMLError, match="nested deeper than 64 levels"):
        yaml_safe.load(text)


def test_yaml_at_the_depth_limit_loads():
    value = yaml_safe.load("a: " + "[" * 64 + "]" * 64)
    depth = 0
    while isinstance(value, (list, dict)) and value:
        value = value["a"] if isinstance(value, dict) else value[0]
        depth += 1
    assert depth == 64


# ---------------------------------------------------------------------- the puzzle server
def test_a_flooding_server_is_cut_off_at_the_answer_cap():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    stop = threading.Event()

    def flood():
        conn, _ = server.accept()
        with conn:
            block = (b"x" * 1000 + b"\r\n") * 64
            try:
                while not stop.is_set():
                    conn.sendall(block)
            except OSError:
                pass

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    try:
        with TelnetLines("127.0.0.1", server.getsockname()[1], 60) as lines:
            code, message = code_of(lines.exchange, None)
        assert code == errors.GYM_PROTOCOL_ERROR and f"more than {MAX_ANSWER_BYTES} bytes" in message
    finally:
        stop.set()
        thread.join(10)
        server.close()


@pytest.mark.parametrize("line,mention", [
    ('{"type": "x", "a": ' + "[" * 10_000 + "]" * 10_000 + "}", "nests 10001 levels"),
    ('{"type": "observation", "grid": ' + "[" * 65 + "]" * 65 + "}", "nests 66 levels"),
])
def test_server_json_nested_too_deeply_is_a_protocol_error(line, mention):
    code, message = code_of(parse_answer, [line])
    assert code == errors.GYM_PROTOCOL_ERROR and mention in message, message


def test_a_well_typed_observation_parses():
    result = parse_answer(['{"type": "observation", "game": "s", "difficulty": "e", "seed": 1, "moves": 2, '
                           '"is_complete": true, "grid_display": "..", "grid": [[1]]}',
                           '{"type": "result", "success": false, "message": "no", "state": {"is_complete": false}}'])
    assert result.solved and result.observation.moves == 2 and result.accepted is False and result.message == "no"


# ---------------------------------------------------------------------- command-line values
@pytest.mark.parametrize("timeout", [math.inf, math.nan, 1e300, 0, -1, 86_401, True, "5"])
def test_a_timeout_no_socket_takes_is_refused(timeout):
    code, message = code_of(TelnetClientConfig, timeout=timeout)
    assert code == errors.GYM_CONFIG_INVALID and "timeout" in message


@pytest.mark.parametrize("host,port,mention", [
    ("", 0, "host"), (None, 0, "host"), ("127.0.0.1", 70000, "[0, 65535]"), ("127.0.0.1", -1, "[0, 65535]"),
    ("127.0.0.1", True, "[0, 65535]"),
])
def test_serve_checks_its_address_before_listening(host, port, mention):
    code, message = code_of(check_address, host, port)
    assert code == errors.GYM_CONFIG_INVALID and mention in message


def test_shards_are_capped_before_anything_is_written(tmp_path):
    from umlos_cuda.batching import BatchingConfig, BatchPlanBuilder, LengthCache
    from umlos_cuda.batching.plans.io import save_shards
    from umlos_cuda.batching.plans.sharding import MAX_SHARE_RANKS

    cache = LengthCache.from_arrays(None, np.full(20, 10), "t" * 64)
    plan = BatchPlanBuilder(cache, BatchingConfig.predictable(token_budget=64, bucket_edges=(16,), overflow_max=32)) \
        .build(1)
    code, message = code_of(save_shards, plan, MAX_SHARE_RANKS + 1, tmp_path / "out")
    assert code == errors.BATCHING_CONFIG_INVALID and "at most 65536" in message
    assert not (tmp_path / "out").exists()
    assert len(save_shards(plan, 3, tmp_path / "out")) == 3
