"""Tape verification speed: the strict reader alone (before) and with the fast path (after).

Writes a store whose tape is one segment of ``--events`` records (default
500,000, a full segment: a ``run_header`` and ``iter`` records), then reads
it with ``read_tape(fast=False)`` (every block through the strict
pure-Python CBOR reader, as before the fast path existed) and
``read_tape(fast=True)`` (blocks of iter/checkpoint records checked by byte
patterns, docs/checkpoint-format.md §10), side by side in one run, and
prints a table::

    python bench/bench_tape_verify.py                      # 500,000 events
    python bench/bench_tape_verify.py --events 100000 --repeat 3
    python bench/bench_tape_verify.py --dir /mnt/disk --keep

It also times ``verify_store`` on the store (certificates, lineage and the
tape through the fast path). Both readers must return the same tape state,
or the script fails. Speeds are events per second of CPU time
(``time.process_time``), which a busy shared machine disturbs less than wall
time; both are printed. The iter records are one real NextBatch record with
its step, cursors and digests varied, so every record is distinct.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
sys.path.insert(0, os.path.dirname(HERE))


def write_store(store_dir: str, events: int) -> list[dict]:
    """A committed store with ``events`` tape records in one segment; returns the segments."""
    import umlos_cuda as uc
    from umlos_cuda.checkpoint import CheckpointStore, open_store
    from umlos_cuda.checkpoint.tape import iter_fields
    from test_checkpoint_support import DATASET, KEY, identity

    ident = identity()
    template = iter_fields(uc.next_batch(ident.manifest, DATASET, 1, 0, backend="numpy", t=1), 1)
    with CheckpointStore.open(store_dir, ident, KEY, max_events=max(events, 1)) as store:
        store.start_run(DATASET, world_size=1)
        for t in range(1, events):
            record = dict(template)
            digest = hashlib.sha256(t.to_bytes(8, "little")).digest()
            record.update(t=t, global_position=8 * t, data_replay_t=digest,
                          indices_sha256=hashlib.sha256(digest).digest(),
                          cursor_before={"epoch": t // 125, "global_index": 8 * (t - 1)},
                          cursor_after={"epoch": t // 125, "global_index": 8 * t})
            store.tape.append(record)
        store.commit()
    _, commits = open_store(store_dir)
    return [s for c in commits for s in c.trace["segments"]]


def timed(function, repeat: int):
    """``(result, wall seconds, CPU seconds)``, the best of ``repeat`` runs by CPU time."""
    best = None
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        result = function()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if best is None or cpu < best[2]:
            best = (result, wall, cpu)
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=500_000, help="tape records (default 500000, one full segment)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each reader; the best is reported (default 1)")
    parser.add_argument("--dir", default=None, help="where to write the store (default: /dev/shm if present)")
    parser.add_argument("--keep", action="store_true", help="keep the store afterwards")
    args = parser.parse_args(argv)
    if args.events < 2 or args.repeat < 1:
        parser.error("--events must be at least 2 and --repeat at least 1")

    from umlos_cuda.checkpoint import read_tape, verify_store

    base = args.dir
    if base is None:
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    work = tempfile.mkdtemp(prefix="umlos-tape-bench-", dir=base)
    store_dir = os.path.join(work, "store")
    try:
        started = time.perf_counter()
        segments = write_store(store_dir, args.events)
        size = sum(s["size"] for s in segments)
        print(f"wrote {args.events:,} events ({size / 1e6:.1f} MB, {len(segments)} segment) in "
              f"{time.perf_counter() - started:.1f} s: {store_dir}", flush=True)
        strict = timed(lambda: read_tape(store_dir, segments, fast=False), args.repeat)
        fast = timed(lambda: read_tape(store_dir, segments, fast=True), args.repeat)
        if strict[0] != fast[0] or strict[0].next_seq != args.events:
            print("FAIL: the two readers disagree", file=sys.stderr)
            return 1
        summary = timed(lambda: verify_store(store_dir), args.repeat)
        rows = [
            ("read_tape, strict reader (before)", strict),
            ("read_tape, fast path (after)", fast),
            ("verify_store (after; whole store)", summary),
        ]
        print()
        print(f"| {'path':<34} | {'events':>9} | {'wall s':>7} | {'CPU s':>7} | {'events/s (CPU)':>14} | "
              f"{'vs strict':>9} |")
        print(f"|{'-' * 36}|{'-' * 10}:|{'-' * 8}:|{'-' * 8}:|{'-' * 15}:|{'-' * 10}:|")
        for name, (_, wall, cpu) in rows:
            print(f"| {name:<34} | {args.events:>9,} | {wall:>7.2f} | {cpu:>7.2f} | {args.events / cpu:>14,.0f} | "
                  f"{strict[2] / cpu:>8.1f}x |")
        print(f"\nsame tape state from both readers: {fast[0].next_seq:,} events, tail "
              f"{fast[0].tail_hash.hex()[:16]}...")
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
