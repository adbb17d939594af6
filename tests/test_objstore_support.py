"""The object-store harness itself (tests/objstore_support.py): the server answers, the proxy counts what it
forwards and injects each fault as asked, and the server stops when the process that started it dies.

The object-store tests trust these counts (bytes fetched per epoch, requests per resume) and these faults
(each refusal code), so a proxy that miscounted or failed to inject would make them pass for nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from objstore_support import FAULTS, require_moto

HERE = os.path.dirname(os.path.abspath(__file__))


def _store(bucket: str, timeout: str = "10s"):
    """An obstore client of ``bucket`` through the proxy, without retries (each fault shows)."""
    from obstore.store import S3Store

    return S3Store(bucket, client_options={"allow_http": True, "timeout": timeout},
                   retry_config={"max_retries": 0})


def test_the_proxy_forwards_and_counts_ranged_gets(object_store):
    import obstore
    import obstore.exceptions

    bucket = object_store.bucket()
    data = bytes(range(256)) * 40
    object_store.put(bucket, "a/object.bin", data)
    proxy = object_store.proxy
    proxy.reset()
    store = _store(bucket)
    assert bytes(obstore.get_range(store, "a/object.bin", start=100, end=1100)) == data[100:1100]
    assert bytes(obstore.get(store, "a/object.bin").bytes()) == data
    (first, second) = proxy.gets("object.bin")
    assert (first.bucket, first.key, first.span, first.status, first.sent) == (bucket, "a/object.bin", (100, 1100),
                                                                              206, 1000)
    assert (second.span, second.status, second.sent) == (None, 200, len(data))
    assert proxy.body_bytes("object.bin") == 1000 + len(data)


@pytest.mark.parametrize("fault", FAULTS)
def test_each_fault_reaches_the_client_once(object_store, fault):
    import obstore
    import obstore.exceptions

    bucket = object_store.bucket()
    data = b"x" * 5000
    object_store.put(bucket, "object.bin", data)
    proxy = object_store.proxy
    proxy.stall_s = 2.0
    proxy.reset()
    proxy.inject(fault, count=1, match=lambda request: request.key == "object.bin")
    store = _store(bucket, timeout="1s")
    try:
        with pytest.raises(obstore.exceptions.BaseError) as info:
            bytes(obstore.get_range(store, "object.bin", start=0, end=len(data)))
        if fault in ("slowdown", "error500"):
            assert ("503" if fault == "slowdown" else "500") in str(info.value)
        (first,) = proxy.gets("object.bin")
        assert first.fault == fault
        assert first.sent == (len(data) // 2 if fault == "short" else 0)
        assert bytes(obstore.get_range(store, "object.bin", start=0, end=len(data))) == data  # only the first met it
    finally:
        proxy.clear()
        proxy.stall_s = 5.0


def test_an_unknown_fault_is_refused_naming_the_faults(object_store):
    with pytest.raises(ValueError, match="slowdown"):
        object_store.proxy.inject("teapot")


_ORPHAN = """
import sys, time
sys.path.insert(0, sys.argv[1])
from objstore_support import MotoServer
server = MotoServer()
print(server.process.pid, flush=True)
time.sleep(600)
"""


def test_the_server_stops_when_the_process_that_started_it_is_killed():
    require_moto()
    parent = subprocess.Popen([sys.executable, "-c", _ORPHAN, HERE], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        server_pid = int(parent.stdout.readline())
        os.kill(server_pid, 0)  # running
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        for _ in range(500):  # 10 s at most; it goes within milliseconds
            try:
                os.kill(server_pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.02)
        else:
            os.kill(server_pid, signal.SIGKILL)
            pytest.fail("moto's server outlived the process that started it")
    finally:
        parent.stdout.close()
        if parent.poll() is None:
            os.kill(parent.pid, signal.SIGKILL)
            parent.wait()
