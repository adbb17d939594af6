"""One epoch from an S3-compatible server, side by side: our planned cache, MosaicML Streaming and LitData.

One run writes the same documents (lognormal lengths, uint16 ids and a uint8 loss mask, as
bench/bench_object_store.py writes them) three ways: (a) our token store, (b) Streaming's MDS shards of
``--chunk-mb`` MB, (c) LitData's chunks of ``--chunk-mb`` MB (its ``BinaryWriter``), all three copied into one
moto server behind the tests' counting proxy (tests/objstore_support.py, in this process). Then, for each added
latency of ``--latency`` ms per request, it reads one epoch with each reader in turn, cold (a new reader, an
empty cache), batches collated by the same ``PlanCollator`` (the peers' samples handed to it as the
``(row, input_ids, loss_mask)`` items ``TokenDataset`` gives), ``num_workers=0`` for all (every reader in the
reading process and its threads; ours reads each microbatch in one call, ``TokenDataset.__getitems__``):

* ``ours feistel``: a windowed plan (``--window`` positions) in the ``feistel`` order, a shuffle of the whole
  dataset, through a ``PlannedTokenSource`` with a cache of every block, once for each ``--lookahead`` and
  ``--request-kb`` (``request_bytes``; the other readers of ours take the first of each);
* ``ours rows`` (named in ``--readers``): the same plan in rows mode (``block_bytes=0``: each row's own byte
  ranges, no blocks) with the cache of ``ours block`` (one window's working set); its bytes fetched are
  checked equal to the rows' bytes;
* ``ours warm`` (named in ``--readers``): ``ours feistel`` with a disk tier of every block (``cache_dir``), read
  twice: cold (it fills the folder), then by a new reader over the same folder, warm (nothing fetched): the
  issue's "within 80 % of the same reader from local disk once the cache is warm";
* ``ours block``: the same plan in the ``block_feistel`` order with blocks of one window (each window a shuffle
  of ``--window`` consecutive rows, the windows in shuffled order), with a cache of one window's working set
  (the most blocks one window's rows reference);
* ``streaming``: ``StreamingDataset(shuffle=True, batch_size=32)`` (its default ``py1e`` shuffle), no cache
  limit; ``litdata``: ``StreamingDataset(shuffle=True)`` through its ``StreamingDataLoader``, batch 32;
* ``resumed``: ours, a new reader at rank 0 of 2 from half way through the epoch (a resume at another world
  size): its first batch, and whether the rows before the cursor (world 1) and after it (every rank of 2) are
  the epoch's rows, each once;
* ``ours feistel, local disk``: the same store on disk, memory-mapped;
* last, at the latencies of ``--quarter-latency`` only (a small cache can fetch only as far ahead as it has
  room): ``ours feistel`` with a cache of a quarter of the stored bytes in blocks of ``--quarter-block-kb``,
  and ``streaming`` with ``cache_limit`` a quarter of its shards' bytes (at least four shards, which it
  requires), given up after ``--limit-s`` s or a batch slower than ``--stall-s`` s (it thrashes; a reader
  given up leaves its download threads running, hence last).

Each of our cold readers' bytes fetched (tokens and loss mask) is checked equal to an offline Belady count of
the same references before its row is printed. Columns: seconds to the first batch, samples/s over the epoch,
mean rows per batch, bytes fetched (every GET under the reader's prefix, index files included, as the proxy
counted them) / bytes stored (the files that hold samples and where each begins: tokens.npy, loss_mask.npy
and offsets.npy; the shards; the chunks), GETs, and mixing: the
mean over batches of the fraction of a batch's pairs of samples that lie in the same chunk, one partition for
every reader (the MDS shard that holds the document); a uniform shuffle in batches of 32 is printed beside
them. Then, from the references alone, Belady's minimum for each order and cache, and the smallest cache
that fetches each stored byte at most once.

The peers are not the project's dependencies: ``make bench-object-peers-env`` installs the versions measured
in docs/performance.md, with the few modules they import and none of their other dependencies, into
bench/.peer-objstores, outside the project's venv; only this script's path names it:

    make bench-object-peers-env
    PYTHONPATH=bench/.peer-objstores python bench/bench_object_peers.py [--samples 200000] [--latency 0 20 100]

Streaming's package ``__init__`` imports its vision and text datasets, hence torchvision, whose CUDA wheels
do not load beside a CPU torch: :func:`import_streaming` imports ``streaming.base`` without that
``__init__`` (the classes used are the ones it re-exports). LitData fetches chunks with obstore under fixed
client options that refuse plain http; the bench adds ``allow_http`` to them (the server here is http on
127.0.0.1). Nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import sys
import tempfile
import time
import types

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
from bench_collate import documents  # noqa: E402
from bench_object_store import belady_bytes  # noqa: E402
from bench_sharded_store import write_store  # noqa: E402
from objstore_support import _CHILD, object_store_session  # noqa: E402

from umlos_cuda.batching import BatchingConfig  # noqa: E402
from umlos_cuda.batching.plans.windows import ArrayLengths, WindowDefinition, WindowedPlan  # noqa: E402
from umlos_cuda.remote import PlannedTokenSource, RemoteTokenStore  # noqa: E402
from umlos_cuda.remote.planned import LOOKAHEAD, REQUEST_BYTES, block_refs, pass_rows  # noqa: E402

BATCH = 32

#: moto's server reads an object's whole spool file and copies it for every GET, ranged or not
#: (``FakeKey.value``), so a ranged GET of a 100 MB tokens.npy cost it 100 MB where S3's costs its range, and a
#: reader of ranges into one large object (ours) paid for a moto artefact that readers of whole 4 MB shards did
#: not. The bench's server holds each object's bytes once, read on the first GET after a put, and slices ranges
#: from them (moto's own range handling, unchanged); the peers' whole-object GETs cost what they did.
HELD_CHILD = _CHILD.replace("from moto.moto_server.threaded_moto_server import ThreadedMotoServer", """
from moto.s3.models import FakeKey
_read, _write = FakeKey.value.fget, FakeKey.value.fset
def _held(key):
    if key.__dict__.get("_held") is None:
        key.__dict__["_held"] = _read(key)
    return key.__dict__["_held"]
def _put(key, value):
    key.__dict__["_held"] = None
    _write(key, value)
FakeKey.value = property(_held, _put)
from moto.moto_server.threaded_moto_server import ThreadedMotoServer""")
assert HELD_CHILD != _CHILD, "tests/objstore_support.py's child no longer imports moto's server as it did"


def import_streaming():
    """Streaming's ``streaming.base`` (``MDSWriter``, ``StreamingDataset``), without the package ``__init__``
    that imports torchvision (module docstring)."""
    if "streaming" not in sys.modules:
        spec = importlib.util.find_spec("streaming")
        if spec is None:
            raise SystemExit("mosaicml-streaming is not importable: see this script's docstring")
        package = types.ModuleType("streaming")
        package.__path__ = list(spec.submodule_search_locations or [])
        sys.modules["streaming"] = package
    import streaming.base as base
    from streaming._version import __version__

    return base, __version__


# ---------------------------------------------------------------------- the data, three ways
def write_mds(folder: str, tokens: np.ndarray, offsets: np.ndarray, chunk_bytes: int) -> np.ndarray:
    """MDS shards of the documents (tokens, loss mask, index), uncompressed; each document's shard number."""
    base, _ = import_streaming()
    columns = {"tokens": "ndarray:uint16", "loss_mask": "ndarray:uint8", "index": "int"}
    with base.MDSWriter(out=folder, columns=columns, size_limit=chunk_bytes, progress_bar=False) as writer:
        for row in range(offsets.shape[0] - 1):
            ids = tokens[offsets[row]:offsets[row + 1]]
            writer.write({"tokens": ids, "loss_mask": np.ones(ids.shape[0], np.uint8), "index": row})
    with open(os.path.join(folder, "index.json"), encoding="utf-8") as handle:
        shards = json.load(handle)["shards"]
    return np.repeat(np.arange(len(shards)), [shard["samples"] for shard in shards])


def write_litdata(folder: str, tokens: np.ndarray, offsets: np.ndarray, chunk_bytes: int) -> int:
    """LitData chunks of the documents (its ``BinaryWriter``, as ``optimize`` writes them); the chunk count."""
    from litdata.streaming.writer import BinaryWriter

    writer = BinaryWriter(folder, chunk_bytes=chunk_bytes)
    for row in range(offsets.shape[0] - 1):
        ids = tokens[offsets[row]:offsets[row + 1]]
        writer.add_item(row, {"tokens": ids, "loss_mask": np.ones(ids.shape[0], np.uint8), "index": row})
    writer.done()
    writer.merge()
    with open(os.path.join(folder, "index.json"), encoding="utf-8") as handle:
        return len(json.load(handle)["chunks"])


def sample_bytes(folder: str, suffixes: tuple[str, ...]) -> int:
    return sum(os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder) if name.endswith(suffixes))


# ---------------------------------------------------------------------- measuring
def same_chunk_pairs(batches: list[np.ndarray], chunk_of: np.ndarray) -> float:
    """Mean over batches of the fraction of pairs of rows in one batch that lie in the same chunk."""
    fractions = []
    for rows in batches:
        n = rows.shape[0]
        if n < 2:
            continue
        counts = np.bincount(chunk_of[rows])
        fractions.append(float((counts * (counts - 1)).sum()) / (n * (n - 1)))
    return float(np.mean(fractions))


def read_epoch(loader, stall_s: float = 0, limit_s: float = 0) -> tuple[float, float, list[np.ndarray], bool]:
    """Seconds to the first batch, samples/s, each batch's rows, and whether the pass ended, of one pass of
    ``loader``, given up when a batch takes longer than ``stall_s`` or the pass longer than ``limit_s`` (0: no
    limit; SIGALRM, which the readers' Python loops let through)."""
    class Stop(Exception):
        pass

    def stop(*_) -> None:
        raise Stop

    def arm() -> None:
        waits = ([stall_s] if stall_s else []) + ([max(limit_s - (time.perf_counter() - began), 1e-3)] if limit_s
                                                  else [])
        signal.setitimer(signal.ITIMER_REAL, min(waits) if waits else 0)

    previous = signal.signal(signal.SIGALRM, stop)
    began = time.perf_counter()
    first, batches, ended = None, [], False
    try:
        arm()
        for batch in loader:
            arm()
            batches.append(batch["rows"].numpy())
            first = first if first is not None else time.perf_counter() - began
        ended = True
    except Stop:
        pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return first or 0.0, sum(b.shape[0] for b in batches) / (time.perf_counter() - began), batches, ended


class PeerItems:
    """Collates a peer's samples (dicts) with our ``PlanCollator``: each as the ``(row, ids, mask)`` item
    ``TokenDataset`` gives, so that every reader's batches cost the same to build."""

    def __init__(self, collator) -> None:
        self.collator = collator

    def __call__(self, samples):
        return self.collator([(int(s["index"]), np.asarray(s["tokens"]), np.asarray(s["loss_mask"]))
                              for s in samples])


def window_working_set(store, rows: list[int], window: int, block: int) -> int:
    """The most blocks the rows of one window (``window`` consecutive rows of a world-1 pass) reference."""
    refs, starts = block_refs(store, rows, block)
    return max(np.unique(refs[starts[i]:starts[min(i + window, len(rows))]]).shape[0]
               for i in range(0, len(rows), window))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--latency", type=float, nargs="*", default=[0.0, 20.0, 100.0], help="ms per request")
    parser.add_argument("--quarter-latency", type=float, nargs="*", default=[0.0])
    parser.add_argument("--window", type=int, default=4096)
    parser.add_argument("--token-budget", type=int, default=40960,
                        help="our microbatches' token budget (about 32 rows each at the default lengths)")
    parser.add_argument("--block-kb", type=int, default=64)
    parser.add_argument("--quarter-block-kb", type=int, default=4,
                        help="blocks of the cache of 1/4 (a miss fetches a block for a row of a few hundred bytes)")
    parser.add_argument("--chunk-mb", type=float, default=4.0, help="Streaming's shards and LitData's chunks")
    parser.add_argument("--lookahead", type=int, nargs="+", default=[LOOKAHEAD],
                        help="ours feistel is read once for each lookahead and --request-kb (the others: the first)")
    parser.add_argument("--request-kb", type=int, nargs="+", default=[REQUEST_BYTES >> 10],
                        help="the most bytes one merged request of ours fetches (request_bytes), in KiB")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--stall-s", type=float, default=120.0, help="give a peer up after this long without a batch")
    parser.add_argument("--limit-s", type=float, default=300.0, help="give a cache-limited peer up after this long")
    parser.add_argument("--readers", nargs="+", default=["ours feistel", "ours block", "streaming", "litdata"],
                        help="also 'ours rows': the feistel plan in rows mode (block_bytes=0), a cache of the "
                             "lookahead's rows")
    args = parser.parse_args()
    from torch.utils.data import DataLoader

    from umlos_cuda.torch import PlanBatchSampler, PlanCollator, TokenDataset

    streaming, streaming_version = import_streaming()
    import litdata
    from litdata.streaming import downloader

    # LitData's obstore client options have no allow_http (it assumes https); the local server is http.
    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"

    rng = np.random.default_rng(0)
    lengths, tokens = documents(rng, args.samples)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    block, chunk_bytes = args.block_kb << 10, int(args.chunk_mb * (1 << 20))
    plans = {}
    for name, order in (("ours feistel", {"order": "feistel"}),
                        ("ours block", {"order": "block_feistel", "sampler_block_size": args.window})):
        config = BatchingConfig.throughput(args.token_budget, (2048,), 4096, seed=1, **order)
        plans[name] = WindowedPlan.build(WindowDefinition(config, args.samples, args.window),
                                         ArrayLengths(lengths.astype(np.uint32)), 1)
    collator = PlanCollator(plans["ours feistel"])
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as folder, object_store_session(HELD_CHILD) as served:
        local, mds, lit = (os.path.join(folder, name) for name in ("store", "mds", "lit"))
        write_store(local, tokens, lengths, 0)
        shard_of = write_mds(mds, tokens, offsets, chunk_bytes)
        chunks = write_litdata(lit, tokens, offsets, chunk_bytes)
        bucket = served.bucket("bench")
        url = served.upload_folder(local, bucket, "store")
        served.upload_folder(mds, bucket, "mds")
        served.upload_folder(lit, bucket, "lit")
        os.environ["S3_ENDPOINT_URL"] = served.endpoint  # Streaming's boto3 client
        stored = {"ours": sample_bytes(local, ("tokens.npy", "loss_mask.npy", "offsets.npy")),
                  "streaming": sample_bytes(mds, (".mds",)), "litdata": sample_bytes(lit, (".bin",))}
        opened = RemoteTokenStore.open(url)
        passes = {name: [row for step in pass_rows(PlanBatchSampler(plan, rank=0, world_size=1), 0, 0)
                         for row in step] for name, plan in plans.items()}
        refs = {name: block_refs(opened, rows, block)[0] for name, rows in passes.items()}
        working = window_working_set(opened, passes["ours block"], args.window, block)
        every = -(-opened.objects["tokens"].size // block) + -(-opened.objects["loss_mask"].size // block)
        shuffled = rng.permutation(args.samples)
        uniform = same_chunk_pairs([shuffled[i:i + BATCH] for i in range(0, args.samples, BATCH)], shard_of)
        print(f"{args.samples:,} documents, {int(lengths.sum()):,} tokens; stored: ours {stored['ours'] / 1e6:.1f} "
              f"MB (tokens, loss mask, offsets), Streaming {int(shard_of.max()) + 1} shards "
              f"{stored['streaming'] / 1e6:.1f} MB, LitData {chunks} chunks {stored['litdata'] / 1e6:.1f} MB; "
              f"mosaicml-streaming {streaming_version}, litdata {litdata.__version__}; blocks of {args.block_kb} "
              f"KiB, one window's working set {working} blocks ({working * block / stored['ours']:.1%} of the "
              f"store), window {args.window}; uniform shuffle mixing {uniform:.3f}")
        print(f"{'reader':28} {'ms':>4} {'first s':>8} {'samples/s':>10} {'rows/b':>7} {'fetched/stored':>15} "
              f"{'GETs':>6} {'mixing':>7}", flush=True)

        def report(name: str, latency: float, first: float, rate: float, batches: list[np.ndarray], prefix: str,
                   owner: str, ended: bool = True) -> None:
            gets = [r for r in served.proxy.gets() if r.key.startswith(prefix + "/")]
            fetched = sum(r.sent for r in gets)
            mean_rows = np.mean([b.shape[0] for b in batches]) if batches else 0.0
            rows = np.sort(np.concatenate(batches)) if batches else np.zeros(0, np.int64)
            whole = "" if np.array_equal(rows, np.arange(args.samples)) else " (not every row once)"
            if not ended:
                whole = (f" (given up after {rows.shape[0]} rows, {rows.shape[0] / args.samples:.1%} of the epoch: "
                         f"a batch took over {args.stall_s:.0f} s or the epoch over {args.limit_s:.0f} s)")
            print(f"{name:28} {latency:4.0f} {first:8.3f} {rate:10.0f} {mean_rows:7.1f} "
                  f"{fetched / stored[owner]:15.3f} {len(gets):6d} {same_chunk_pairs(batches, shard_of):7.3f}{whole}",
                  flush=True)

        lookahead, request = args.lookahead[0], args.request_kb[0] << 10

        def ours(name: str, latency: float, cache: int, label: str, block: int = block, lookahead: int = lookahead,
                 request: int = request, cache_dir: str | None = None, warm: bool = False) -> None:
            """One cold epoch of ours (``cache_dir``: with a disk tier of every block there; ``warm``: one a
            reader before filled, so nothing is fetched)."""
            served.proxy.reset()
            plan = plans[name]
            sampler = PlanBatchSampler(plan, rank=0, world_size=1)
            disk = {} if cache_dir is None else {"cache_dir": cache_dir, "disk_bytes": every * block}
            source = PlannedTokenSource(url, sampler, cache_bytes=max(cache, block), block_bytes=block,
                                        lookahead=lookahead, concurrency=args.concurrency, request_bytes=request,
                                        **disk)
            loader = DataLoader(TokenDataset(source, plan=plan), batch_sampler=sampler, collate_fn=collator)
            first, rate, batches, _ = read_epoch(loader)
            source.close()
            if block:
                references = refs[name] if block == args.block_kb << 10 else \
                    block_refs(opened, passes[name], block)[0]
                expected = belady_bytes(opened, references, max(cache, block) // block, block)
            else:  # rows mode: every row's tokens and loss mask, once
                expected = int(lengths.sum()) * (1 + tokens.itemsize)
            expected = 0 if warm else expected
            if source.fetched_bytes != expected or source.unplanned_rows:
                raise SystemExit(f"{label}: fetched {source.fetched_bytes}, expected {expected}, "
                                 f"{source.unplanned_rows} rows out of order")
            report(label, latency, first, rate, batches, "store", "ours")

        def peer_streaming(latency: float, cache_limit: int | None, label: str) -> None:
            served.proxy.reset()
            streaming.util.clean_stale_shared_memory()
            with tempfile.TemporaryDirectory(dir=folder, ignore_cleanup_errors=True) as cache:
                dataset = streaming.StreamingDataset(remote=f"s3://{bucket}/mds", local=cache, shuffle=True,
                                                     batch_size=BATCH, cache_limit=cache_limit)
                loader = DataLoader(dataset, batch_size=BATCH, collate_fn=PeerItems(collator), num_workers=0)
                limits = (args.stall_s, args.limit_s) if cache_limit else (0, 0)
                first, rate, batches, ended = read_epoch(loader, *limits)
                del loader, dataset
            report(label, latency, first, rate, batches, "mds", "streaming", ended)

        def peer_litdata(latency: float) -> None:
            served.proxy.reset()
            with tempfile.TemporaryDirectory(dir=folder) as cache:
                dataset = litdata.StreamingDataset(f"s3://{bucket}/lit", cache_dir=cache, shuffle=True,
                                                   storage_options={"endpoint_url": served.endpoint})
                loader = litdata.StreamingDataLoader(dataset, batch_size=BATCH, collate_fn=PeerItems(collator),
                                                     num_workers=0)
                first, rate, batches, _ = read_epoch(loader)
                del loader, dataset
            report("litdata", latency, first, rate, batches, "lit", "litdata")

        def resumed(latency: float) -> None:
            """A new reader at rank 0 of 2 from half way (a resume at another world size), cold."""
            served.proxy.reset()
            plan = plans["ours feistel"]
            half = plan.epoch_microbatches(0) // 2
            sampler = PlanBatchSampler(plan, rank=0, world_size=2, epoch=0, microbatch_index=half)
            source = PlannedTokenSource(url, sampler, cache_bytes=every * block, block_bytes=block,
                                        lookahead=lookahead, concurrency=args.concurrency, request_bytes=request)
            loader = DataLoader(TokenDataset(source, plan=plan), batch_sampler=sampler, collate_fn=collator)
            first, rate, batches, _ = read_epoch(loader)
            source.close()
            before = [row for step in pass_rows(PlanBatchSampler(plan, rank=0, world_size=1), 0, 0)[:half]
                      for row in step]
            after = [row for rank in range(2)
                     for step in pass_rows(PlanBatchSampler(plan, rank=rank, world_size=2), 0, half) for row in step]
            read = np.concatenate(batches).tolist()
            exact = (sorted(before + after) == list(range(args.samples))
                     and read == [row for step in pass_rows(sampler, 0, half) for row in step])
            gets = [r for r in served.proxy.gets() if r.key.startswith("store/")]
            print(f"{'resumed at rank 0 of 2':28} {latency:4.0f} {first:8.3f} {rate:10.0f} "
                  f"{np.mean([b.shape[0] for b in batches]):7.1f} {sum(r.sent for r in gets) / stored['ours']:15.3f} "
                  f"{len(gets):6d} {'':>7} {'exact' if exact else 'NOT EXACT'}: {len(before)} rows before the cursor, "
                  f"{len(after)} after", flush=True)

        for latency in args.latency:
            served.proxy.latency = latency / 1000
            for name in args.readers:
                if name == "ours feistel":
                    for ahead in args.lookahead:
                        for kib in args.request_kb:
                            ours(name, latency, every * block, f"ours feistel, every, {ahead}/{kib}K",
                                 lookahead=ahead, request=kib << 10)
                elif name == "ours rows":  # the cache of the block order's row: one window's working set
                    ours("ours feistel", latency, working * block, "ours rows, one window", block=0)
                elif name == "ours warm":  # "once the cache is warm": a disk tier a cold epoch filled
                    with tempfile.TemporaryDirectory(dir=folder) as blocks:
                        ours("ours feistel", latency, every * block, "ours feistel, disk tier, cold", cache_dir=blocks)
                        ours("ours feistel", latency, every * block, "ours feistel, disk tier, warm", cache_dir=blocks,
                             warm=True)
                elif name == "ours block":
                    ours(name, latency, working * block, "ours block, one window")
                elif name == "streaming":
                    peer_streaming(latency, None, "streaming")
                elif name == "litdata":
                    peer_litdata(latency)
            resumed(latency)
        plan = plans["ours feistel"]
        sampler = PlanBatchSampler(plan, rank=0, world_size=1)
        loader = DataLoader(TokenDataset(local, plan=plan), batch_sampler=sampler, collate_fn=collator)
        first, rate, batches, _ = read_epoch(loader)
        print(f"{'ours feistel, local disk':28} {'':4} {first:8.3f} {rate:10.0f} "
              f"{np.mean([b.shape[0] for b in batches]):7.1f} {'':>15} {'':>6} "
              f"{same_chunk_pairs(batches, shard_of):7.3f}")
        for latency in args.quarter_latency:  # last: Streaming given up leaves its threads behind
            served.proxy.latency = latency / 1000
            ours("ours feistel", latency, stored["ours"] // 4, f"ours feistel, cache 1/4, {args.quarter_block_kb}K",
                 args.quarter_block_kb << 10)
            # Streaming refuses a limit under four times its largest shard.
            limit = max(stored["streaming"] // 4, 4 * max(os.path.getsize(os.path.join(mds, name))
                                                          for name in os.listdir(mds) if name.endswith(".mds")))
            peer_streaming(latency, limit, f"streaming, cache {limit / stored['streaming']:.0%}")
        print("Belady's minimum, fetched / stored (from the references alone):")
        for name in plans:
            cells = [f"{label} {belady_bytes(opened, refs[name], max(cache // block, 1), block) / stored['ours']:.3f}"
                     for label, cache in (("one window's working set", working * block),
                                          ("1/4 of the store", stored["ours"] // 4), ("every block", every * block))]
            print(f"  {name}: " + ", ".join(cells))
            quarter = args.quarter_block_kb << 10
            small = block_refs(opened, passes[name], quarter)[0]
            print(f"    with blocks of {args.quarter_block_kb} KiB, 1/4 of the store: "
                  f"{belady_bytes(opened, small, stored['ours'] // 4 // quarter, quarter) / stored['ours']:.3f}")
            low, high = 1, every + 2
            while low < high:  # Belady's bytes fall as the cache grows
                middle = (low + high) // 2
                if belady_bytes(opened, refs[name], middle, block) <= stored["ours"]:
                    high = middle
                else:
                    low = middle + 1
            print(f"    the smallest cache fetching each stored byte at most once: {low} blocks "
                  f"({low * block / stored['ours']:.1%} of the store)", flush=True)


if __name__ == "__main__":
    main()
