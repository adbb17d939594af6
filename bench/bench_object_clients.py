"""Which client library reads byte ranges from an S3-compatible store fastest: obstore, s3fs or boto3.

What the planned cache (umlos_cuda/remote/) asks of a client is ranged GETs of a few hundred KB,
several in flight. This bench puts one object of ``--object-mb`` MB into moto's server on a free
loopback port, behind the tests' counting proxy (tests/objstore_support.py), which adds ``--latency``
milliseconds before each request, and times ``--requests`` ranged GETs of ``--range-kb`` KB at
seeded offsets, ``--concurrency`` in flight, with each client:

* obstore: ``get_range_async`` under an ``asyncio.Semaphore`` (Rust's object_store under tokio);
* s3fs: ``cat_ranges`` with ``batch_size`` = concurrency (aiobotocore under fsspec's event loop);
* boto3: ``get_object(Range=...)`` from a thread pool of that size.

Every byte read is compared with the object's before a time is printed; each row is the best of
``--repeat`` rounds. Each client gets a server and proxy of their own, in a child process, so the
CPU seconds printed are the client's alone. It needs obstore, s3fs, boto3 and
moto[server], which the project does not all depend on (only obstore and moto): run it in a venv
of its own. Nothing leaves 127.0.0.1.

    python bench/bench_object_clients.py [--latency 0 20 100] [--requests 64] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
sys.path.insert(0, TESTS)
from objstore_support import DUMMY_CREDENTIALS  # noqa: E402


def obstore_reader(endpoint: str, bucket: str):
    import obstore
    from obstore.store import S3Store

    store = S3Store(bucket, endpoint=endpoint, client_options={"allow_http": True}, retry_config={"max_retries": 0})

    def read(key: str, spans: list[tuple[int, int]], concurrency: int) -> list[bytes]:
        async def run() -> list[bytes]:
            gate = asyncio.Semaphore(concurrency)

            async def one(start: int, stop: int) -> bytes:
                async with gate:
                    return bytes(await obstore.get_range_async(store, key, start=start, end=stop))

            return await asyncio.gather(*(one(a, b) for a, b in spans))

        return asyncio.run(run())

    return read


def s3fs_reader(endpoint: str, bucket: str):
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=endpoint, anon=False, default_block_size=1 << 20,
                           config_kwargs={"max_pool_connections": 64})

    def read(key: str, spans: list[tuple[int, int]], concurrency: int) -> list[bytes]:
        path = f"{bucket}/{key}"
        return fs.cat_ranges([path] * len(spans), [a for a, _ in spans], [b for _, b in spans],
                             batch_size=concurrency)

    return read


def boto3_reader(endpoint: str, bucket: str):
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=endpoint, config=Config(max_pool_connections=64,
                                                                     retries={"max_attempts": 1}))

    def read(key: str, spans: list[tuple[int, int]], concurrency: int) -> list[bytes]:
        def one(span: tuple[int, int]) -> bytes:
            reply = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={span[0]}-{span[1] - 1}")
            return reply["Body"].read()

        with ThreadPoolExecutor(concurrency) as pool:
            return list(pool.map(one, spans))

    return read


CLIENTS = {"obstore": obstore_reader, "s3fs": s3fs_reader, "boto3": boto3_reader}


#: The child that serves: moto and the proxy (tests/objstore_support.py) in a process of their own, so that
#: this process's CPU time is the client's alone. It prints the proxy's endpoint, then reads commands.
SERVE = """
import sys
sys.path.insert(0, sys.argv[1])
from objstore_support import object_store_session
with object_store_session() as served:
    bucket = served.bucket("bench")
    served.put(bucket, "object.bin", open(sys.argv[2], "rb").read())
    print(served.endpoint, flush=True)
    for line in sys.stdin:
        served.proxy.latency = float(line) / 1000
        print("ok", flush=True)
"""


def used_cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=float, nargs="+", default=[0.0, 20.0, 100.0], help="ms per request")
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--range-kb", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--object-mb", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--clients", nargs="+", default=list(CLIENTS), choices=list(CLIENTS))
    args = parser.parse_args()
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, args.object_mb << 20, dtype=np.uint8).tobytes()
    size = args.range_kb << 10
    starts = rng.integers(0, len(data) - size, args.requests).tolist()
    spans = [(int(a), int(a) + size) for a in starts]
    print(f"{args.requests} GETs of {args.range_kb} KB from a {args.object_mb} MB object, {args.concurrency} in "
          f"flight, best of {args.repeat}; CPU: this process (the client) only")
    print(f"{'client':8} {'latency ms':>10} {'seconds':>8} {'MB/s':>8} {'GETs/s':>8} {'CPU ms/GET':>10}")
    with tempfile.TemporaryDirectory() as folder:
        object_path = os.path.join(folder, "object.bin")
        with open(object_path, "wb") as handle:
            handle.write(data)
        for name in args.clients:
            child = subprocess.Popen([sys.executable, "-c", SERVE, TESTS, object_path], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
            try:
                endpoint = child.stdout.readline().strip()
                os.environ.update(DUMMY_CREDENTIALS, AWS_ENDPOINT_URL=endpoint)
                read = CLIENTS[name](endpoint, "bench")
                for latency in args.latency:
                    child.stdin.write(f"{latency}\n")
                    child.stdin.flush()
                    child.stdout.readline()
                    best, cpu = float("inf"), float("inf")
                    for _ in range(args.repeat):
                        began, cpu_began = time.perf_counter(), used_cpu()
                        parts = read("object.bin", spans, args.concurrency)
                        best = min(best, time.perf_counter() - began)
                        cpu = min(cpu, used_cpu() - cpu_began)
                        if any(bytes(part) != data[a:b] for part, (a, b) in zip(parts, spans)):
                            raise SystemExit(f"{name} read bytes that differ from the object's")
                    print(f"{name:8} {latency:10.0f} {best:8.3f} {len(spans) * size / best / 1e6:8.1f} "
                          f"{len(spans) / best:8.1f} {cpu / len(spans) * 1000:10.2f}", flush=True)
            finally:
                child.stdin.close()
                child.wait(60)

if __name__ == "__main__":
    main()
