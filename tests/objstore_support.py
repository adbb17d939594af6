"""A real S3-compatible server for the object-store tests, behind a proxy that counts, slows and breaks requests.

``MotoServer`` runs moto's server (the ``moto[server]`` test dependency) in a child process on a free
loopback port. The child stops by itself: it reads its standard input, a pipe whose only writer is
this process, and exits when the pipe closes (this process ended, however it ended); on Linux it also
asks the kernel for SIGKILL when its parent dies (``PR_SET_PDEATHSIG``). :meth:`MotoServer.close`
kills its process group.

``FaultProxy`` is an HTTP/1.1 proxy in this process, on another free loopback port, that forwards each
request to the server and records it (method, key, ``Range``, status, body bytes sent). It adds
``latency`` seconds before each request and injects faults in order (:meth:`FaultProxy.inject`): a
503 SlowDown, a 500, a connection reset before any reply, a short body (the full ``Content-Length``
announced, half the body sent, then the connection closed), or a stall longer than the client's
timeout. Clients are pointed at the proxy, never at the server.

``object_store`` (a session fixture in conftest.py, started the first time a test asks for it) holds
both, and sets the client library's standard credential variables to dummy values for the session
only; they are never printed. Nothing here reaches beyond 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

READY_DEADLINE_S = 60.0
REGION = "us-east-1"
#: The variables the client library reads (its standard chain); dummy values, this session only.
DUMMY_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                     "AWS_SESSION_TOKEN": "testing", "AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION,
                     "AWS_ALLOW_HTTP": "true"}

#: The child: moto's threaded server on port 0 of 127.0.0.1, its port printed, alive while stdin is open.
_CHILD = """
import ctypes, os, signal, sys
if sys.platform.startswith("linux"):
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: killed when the parent dies
    if os.getppid() == 1:
        sys.exit(0)
from moto.moto_server.threaded_moto_server import ThreadedMotoServer
server = ThreadedMotoServer("127.0.0.1", 0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()  # EOF: the parent closed the pipe or is gone
"""


def require_moto() -> None:
    pytest.importorskip("moto.moto_server.threaded_moto_server",
                        reason="moto[server] is not installed (the test extra)")
    pytest.importorskip("obstore", reason="obstore is not installed (the 'remote' extra)")


class MotoServer:
    """moto's S3 server in a child process on a free loopback port (module docstring). ``child`` is the child's
    code (default :data:`_CHILD`; a bench may patch moto before it serves)."""

    def __init__(self, child: str = _CHILD) -> None:
        env = {key: value for key, value in os.environ.items() if not key.startswith("AWS_")}
        # Its log goes to a file: a pipe nobody reads fills after a few hundred requests and stalls the server.
        log_fd, self.log_path = tempfile.mkstemp(prefix="moto-server-", suffix=".log")
        try:
            self.process = subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=log_fd, start_new_session=True, env=env)
        finally:
            os.close(log_fd)
        line = self._first_line()
        self.port = int(line)
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def _first_line(self) -> bytes:
        found: list[bytes] = []
        reader = threading.Thread(target=lambda: found.append(self.process.stdout.readline()), daemon=True)
        reader.start()
        reader.join(READY_DEADLINE_S)
        if not found or not found[0].strip():
            log = Path(self.log_path).read_text(errors="replace")[-2000:]
            self.close()
            raise RuntimeError(f"moto's server did not start within {READY_DEADLINE_S} s: {log}")
        return found[0]

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                pipe.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log_path)


# ---------------------------------------------------------------------- the proxy
FAULTS = ("slowdown", "error500", "reset", "short", "stall")
_SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")
_INTERNAL = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
             b"<Message>We encountered an internal error. Please try again.</Message></Error>")
_HOP_HEADERS = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}


@dataclass
class Request:
    """One request the proxy saw: ``key`` is the path without the bucket, ``span`` the ``Range`` asked for
    (``(start, stop)``, stop exclusive) or None, ``query`` the URL's query (``delete`` for a bulk delete),
    ``sent`` the body bytes that reached the client."""

    method: str
    bucket: str
    key: str
    span: tuple[int, int] | None
    query: str = ""
    status: int = 0
    sent: int = 0
    fault: str | None = None


@dataclass
class _Rule:
    fault: str
    count: int
    match: Callable[[Request], bool]


@dataclass
class FaultProxy:
    """The proxy (module docstring). ``latency`` may be changed at any time; ``requests`` is every request
    seen since :meth:`reset`."""

    upstream: int
    latency: float = 0.0
    stall_s: float = 5.0
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rules: list[_Rule] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # a reply's header lines and body go out unheld (no 40 ms delayed ACK)

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                proxy._forward(self)

            do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fault-proxy", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ control
    def inject(self, fault: str, count: int = 1, match: Callable[[Request], bool] | None = None) -> None:
        """The next ``count`` requests that ``match`` (default: every GET) meet ``fault`` (one of :data:`FAULTS`)."""
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; the faults are {', '.join(FAULTS)}")
        with self._lock:
            self._rules.append(_Rule(fault, count, match or (lambda request: request.method == "GET")))

    def clear(self) -> None:
        """No fault left to inject, no latency."""
        with self._lock:
            self._rules.clear()
        self.latency = 0.0

    def reset(self) -> None:
        """Forget the requests seen so far (faults and latency stay)."""
        with self._lock:
            self.requests = []

    def gets(self, key_suffix: str = "") -> list[Request]:
        """The GET requests seen whose key ends with ``key_suffix``, in the order they arrived."""
        with self._lock:
            return [r for r in self.requests if r.method == "GET" and r.key.endswith(key_suffix)]

    def body_bytes(self, key_suffix: str = "") -> int:
        """Body bytes sent for GETs of keys ending with ``key_suffix``: what the client fetched."""
        return sum(r.sent for r in self.gets(key_suffix))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)

    # ------------------------------------------------------------------ forwarding
    def _take_fault(self, request: Request) -> str | None:
        with self._lock:
            for rule in self._rules:
                if rule.count > 0 and rule.match(request):
                    rule.count -= 1
                    return rule.fault
        return None

    def _forward(self, handler: BaseHTTPRequestHandler) -> None:
        path = handler.path
        location, _, query = path.partition("?")
        bucket, _, key = location.lstrip("/").partition("/")
        request = Request(handler.command, bucket, key, _span(handler.headers.get("Range")), query)
        with self._lock:
            self.requests.append(request)
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else None
        if self.latency:
            time.sleep(self.latency)
        request.fault = fault = self._take_fault(request)
        if fault == "reset":
            _reset(handler)
            return
        if fault == "stall":
            time.sleep(self.stall_s)
            _reset(handler)
            return
        if fault in ("slowdown", "error500"):
            payload = _SLOWDOWN if fault == "slowdown" else _INTERNAL
            request.status = 503 if fault == "slowdown" else 500
            handler.send_response(request.status)
            handler.send_header("Content-Type", "application/xml")
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            handler.wfile.write(payload)
            return
        headers = {name: value for name, value in handler.headers.items() if name.lower() not in _HOP_HEADERS}
        connection = http.client.HTTPConnection("127.0.0.1", self.upstream, timeout=30)
        try:
            connection.request(handler.command, path, body=body, headers=headers)
            reply = connection.getresponse()
            data = reply.read()
        finally:
            connection.close()
        request.status = reply.status
        handler.send_response(reply.status)
        for name, value in reply.getheaders():
            if name.lower() not in _HOP_HEADERS and name.lower() != "content-length":
                handler.send_header(name, value)
        # A HEAD reply has no body but the object's length.
        handler.send_header("Content-Length", reply.getheader("Content-Length", "0") if handler.command == "HEAD"
                            else str(len(data)))
        handler.end_headers()
        if handler.command == "HEAD":
            return
        # Counted before the bytes go out: the client may act on them (and a test read the count) before
        # this thread runs again.
        if fault == "short":
            request.sent = len(data) // 2
            handler.wfile.write(data[:len(data) // 2])
            handler.wfile.flush()
            _reset(handler)
            return
        request.sent = len(data)
        handler.wfile.write(data)


def _span(header: str | None) -> tuple[int, int] | None:
    match = re.fullmatch(r"bytes=(\d+)-(\d*)", header or "")
    if match is None:
        return None
    start = int(match.group(1))
    return start, (int(match.group(2)) + 1 if match.group(2) else -1)


def _reset(handler: BaseHTTPRequestHandler) -> None:
    """Close the client's connection with a TCP reset (SO_LINGER 0), as a dropped connection looks."""
    sock = handler.connection
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    handler.close_connection = True
    with contextlib.suppress(OSError):
        sock.close()


# ---------------------------------------------------------------------- the fixture's object
@dataclass
class ObjectStoreServer:
    """What ``object_store`` yields: the server, the proxy, and helpers to make buckets and put objects
    straight into the server (not through the proxy, so the proxy's counts are the reader's alone)."""

    server: MotoServer
    proxy: FaultProxy
    _buckets: int = 0

    @property
    def endpoint(self) -> str:
        return self.proxy.endpoint

    def client_options(self) -> dict:
        return {"endpoint": self.proxy.endpoint}

    def bucket(self, name: str | None = None) -> str:
        """A new bucket (a fresh name unless given), created on the server."""
        self._buckets += 1
        name = name or f"bucket-{self._buckets}-{os.getpid()}"
        connection = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
        try:
            connection.request("PUT", f"/{name}", headers={"Content-Length": "0"})
            reply = connection.getresponse()
            reply.read()
        finally:
            connection.close()
        if reply.status not in (200, 409):
            raise RuntimeError(f"creating bucket {name} answered {reply.status}")
        return name

    def _direct(self, bucket: str):
        """An obstore client of ``bucket`` on the server itself (signed requests: moto refuses an anonymous
        overwrite), so that what the tests put is not counted by the proxy."""
        from obstore.store import S3Store

        return S3Store(bucket, endpoint=self.server.endpoint, client_options={"allow_http": True},
                       access_key_id="testing", secret_access_key="testing", region=REGION)

    def put(self, bucket: str, key: str, data: bytes) -> None:
        """Put ``data`` at ``bucket/key`` on the server (an overwrite changes its ETag)."""
        import obstore

        obstore.put(self._direct(bucket), key, data)

    def delete(self, bucket: str, key: str) -> None:
        """Remove ``bucket/key`` from the server."""
        import obstore

        obstore.delete(self._direct(bucket), key)

    def objects(self, bucket: str, prefix: str) -> dict[str, bytes]:
        """Every object under ``bucket/prefix/`` (its key below the prefix to its bytes), read from the server."""
        import obstore

        direct = self._direct(bucket)
        keys = [meta["path"] for chunk in obstore.list(direct, prefix=prefix + "/") for meta in chunk]
        return {key[len(prefix) + 1:]: bytes(obstore.get(direct, key).bytes()) for key in keys}

    def upload_folder(self, folder: str | os.PathLike[str], bucket: str, prefix: str) -> str:
        """Every file under ``folder`` put at ``bucket/prefix/<relative path>``; the ``s3://`` URL of the prefix."""
        root = Path(folder)
        for path in sorted(root.rglob("*")):
            if path.is_file():
                self.put(bucket, f"{prefix}/{path.relative_to(root).as_posix()}", path.read_bytes())
        return f"s3://{bucket}/{prefix}"


@contextlib.contextmanager
def object_store_session(child: str = _CHILD) -> Iterator[ObjectStoreServer]:
    """The server (its child's code ``child``) and its proxy, the dummy credentials set for the client while they
    run (module docstring)."""
    require_moto()
    server = MotoServer(child)
    proxy = FaultProxy(server.port)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in DUMMY_CREDENTIALS.items():
            patch.setenv(name, value)
        patch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        try:
            yield ObjectStoreServer(server, proxy)
        finally:
            proxy.close()
            server.close()


def refused(call: Callable[[], object], code: str, *mentions: str):
    """The UmlosError ``call()`` raises, asserted to be ``code`` with every one of ``mentions`` in its message
    (any operator: the remote codes name the remote one, the stores' codes the batching one)."""
    from umlos_cuda.errors import UmlosError

    with pytest.raises(UmlosError) as info:
        call()
    assert info.value.code == code, info.value.message
    for text in mentions:
        assert text in info.value.message, info.value.message
    return info.value
