"""Helpers of the stream tests: the real puzzle server on a free port, a
relay that breaks one connection on purpose, fake servers that misbehave,
a small tokenizer, and a logged gym run of a mock stream (``write_mock_run``).

``puzzle_server()`` starts ``python -m umlos_cuda.streams.gym.server --port
0`` in its own process group, waits (with a deadline, polling) for the port
file it writes once listening, and kills the group in a ``finally``. Only
127.0.0.1 is used.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from batching_cases import train_tokenizer
from umlos_cuda import errors
from umlos_cuda.errors import UmlosError

READY_DEADLINE_S = 60.0
EOS = "</s>"


def require_gym():
    pytest.importorskip("chuk_puzzles_gym", reason="chuk-puzzles-gym is not installed (the optional 'gym' extra)")


@contextlib.contextmanager
def puzzle_server(tmp_path):
    """``(host, port)`` of a real puzzle server, stopped afterwards."""
    require_gym()
    port_file = tmp_path / f"server-{time.monotonic_ns()}.port"
    process = subprocess.Popen([sys.executable, "-m", "umlos_cuda.streams.gym.server", "--port", "0",
                                "--port-file", str(port_file)], start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + READY_DEADLINE_S
        while not port_file.exists():
            if process.poll() is not None:
                raise RuntimeError(f"the puzzle server exited: {process.stderr.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the puzzle server did not listen within {READY_DEADLINE_S} s")
            time.sleep(0.02)
        host, port = port_file.read_text().split()
        yield host, int(port)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        process.stderr.close()


class TcpServer:
    """A one-thread TCP server on 127.0.0.1 running ``handler(conn, index)`` per connection."""

    def __init__(self, handler) -> None:
        self.handler = handler
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._threads = []
        self._accept = threading.Thread(target=self._loop, daemon=True)
        self._accept.start()

    def _loop(self) -> None:
        self.sock.settimeout(0.05)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            index = self.connections
            self.connections += 1
            thread = threading.Thread(target=self._run, args=(conn, index), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _run(self, conn, index) -> None:
        with conn, contextlib.suppress(OSError):
            self.handler(conn, index, self._stop)

    def close(self) -> None:
        self._stop.set()
        self._accept.join(5)
        self.sock.close()
        for thread in self._threads:
            thread.join(5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def relay(upstream: tuple[str, int], break_connection: int | None = None, after_bytes: int = 0, mode: str = "close"):
    """A handler relaying to ``upstream``; connection ``break_connection``
    forwards ``after_bytes`` bytes to the client and then closes (``mode``
    close) or goes silent (``stall``)."""

    def handler(conn, index, stop):
        up = socket.create_connection(upstream, timeout=5)
        with up:
            conn.settimeout(0.05)
            up.settimeout(0.05)
            sent = 0
            stalled = False
            while not stop.is_set():
                for source, target, downstream in ((conn, up, False), (up, conn, True)):
                    try:
                        data = source.recv(65536)
                    except TimeoutError:
                        continue
                    if not data:
                        return
                    if downstream and index == break_connection:
                        if stalled:
                            continue
                        room = after_bytes - sent
                        if len(data) >= room:
                            target.sendall(data[:max(room, 0)])
                            if mode == "close":
                                return
                            stalled = True
                            continue
                        sent += len(data)
                    target.sendall(data)

    return handler


def scripted(replies: dict[str, bytes], greeting: bytes = b"\r\n  1) Sudoku          - Classic logic puzzle\r\n"):
    """A fake server speaking the real one's framing (greeting, echo of each
    line, reply, prompt); ``replies[command]`` is the reply (a command not
    listed gets an "Unknown command" line), ``b"<close>"`` closes the
    connection, ``b"<stall>"`` goes silent. ``replies["<greeting>"]`` replaces
    the greeting the same way."""

    def handler(conn, index, stop):
        conn.settimeout(0.05)
        first = replies.get("<greeting>", greeting)
        if first == b"<close>":
            return
        if first == b"<stall>":
            stop.wait(10)
            return
        conn.sendall(first)
        buffer = b""
        while not stop.is_set():
            try:
                data = conn.recv(4096)
            except TimeoutError:
                continue
            if not data:
                return
            buffer += data.replace(bytes([255, 241]), b"")
            while b"\n" in buffer:
                raw, buffer = buffer.split(b"\n", 1)
                line = raw.decode().strip()
                reply = replies.get(line, b"Unknown command.\r\n")
                if reply == b"<close>":
                    return
                if reply == b"<stall>":
                    stop.wait(10)
                    return
                conn.settimeout(None)  # a long reply is sent whole, however slowly the client reads
                conn.sendall(line.encode() + b"\r\n" + reply + b"> ")
                conn.settimeout(0.05)

    return handler


_TOKENIZERS: dict = {}


def tokenizer():
    if "t" not in _TOKENIZERS:
        _TOKENIZERS["t"] = train_tokenizer()
    return _TOKENIZERS["t"]


def expect(code, function, *args, mention=None, **kwargs) -> UmlosError:
    """``function(*args, **kwargs)`` raises UmlosError ``code`` naming the
    streams operator, its message containing ``mention``."""
    with pytest.raises(UmlosError) as info:
        function(*args, **kwargs)
    assert info.value.code == code, info.value
    if code not in (errors.DATASET_RECORD_INVALID, errors.BACKEND_UNAVAILABLE):
        assert info.value.record["failure_operator"] == errors.STREAMS_OPERATOR
    if mention:
        assert mention in info.value.message, info.value.message
    return info.value


def write_mock_run(folder) -> None:
    """``folder/windows.jsonl``: two windows of 2 microbatches over 20 mock samples in a FIFO buffer of 16."""
    from umlos_cuda.batching import BatchingConfig
    from umlos_cuda.streams import MockGymStream, ReplayBuffer, RollingBatchPlanWindow

    window = RollingBatchPlanWindow(ReplayBuffer(16, "fifo", seed=1), 2,
                                    batching=BatchingConfig.throughput(2048, (128, 256, 512), 1024),
                                    log=folder / "windows.jsonl")
    for i, sample in enumerate(MockGymStream(20, seed=5, max_length=300)):
        window.add(sample)
        if i % 10 == 9:
            window.next_window()
