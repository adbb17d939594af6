"""Crash-consistency campaign at scale: SIGKILL checkpoint writers thousands of times.

The test suite kills 250 writers (tests/test_checkpoint_crash.py); this script
runs the same harness with as many kills as you ask for and prints what
happened::

    python bench/bench_checkpoint_crash.py                 # 2000 kills
    python bench/bench_checkpoint_crash.py --kills 10000 --stores 100 --seed 7
    python bench/bench_checkpoint_crash.py --dir /mnt/disk  # on a real disk (slower: fsync is real)

Each writer is forked, restores the store's latest checkpoint and commits one
step after another until it is killed at a random instant (70% of kills after
it restored, within a few commits; the rest anywhere from its start, which
covers recovery and restore). After every kill the parent checks, before any
recovery, that the latest committed checkpoint is the one the writer's
progress allows (the commit in flight or the one before it), that it verifies
completely, and that its cursors and tensors equal the uninterrupted run's at
that step; every 25 kills and at the end of each store it recovers and
verifies the whole store. Any violation stops the run with a traceback.
Exit status 0 means every kill left a valid previous-or-new checkpoint.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
sys.path.insert(0, os.path.dirname(HERE))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=2000, help="writers to kill (default 2000)")
    parser.add_argument("--stores", type=int, default=None, help="fresh stores to spread the kills over "
                                                                  "(default: one per 25 kills)")
    parser.add_argument("--seed", type=int, default=20260218)
    parser.add_argument("--dir", default=None, help="where to put the stores (default: /dev/shm if present)")
    parser.add_argument("--keep", action="store_true", help="keep the stores afterwards")
    args = parser.parse_args(argv)
    if args.kills < 1:
        parser.error("--kills must be at least 1")

    import test_checkpoint_crash as harness

    base = args.dir
    if base is None:
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    work = tempfile.mkdtemp(prefix="umlos-crash-bench-", dir=base)
    stores = args.stores or max(1, args.kills // 25)
    print(f"killing {args.kills} writers over {stores} stores in {work} (seed {args.seed})", flush=True)
    started = time.perf_counter()
    try:
        outcomes = harness.random_kill_campaign(work, args.kills, seed=args.seed, stores=stores)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    elapsed = time.perf_counter() - started
    rows = [
        ("kills", outcomes.kills),
        ("  during a commit, previous checkpoint kept", outcomes.mid_commit_kept_previous),
        ("  during a commit, after its commit point (new checkpoint)", outcomes.mid_commit_got_new),
        ("  between two commits", outcomes.between_commits),
        ("  before the first step (open, recovery, restore)", outcomes.before_first_step),
        ("full restores checked against the uninterrupted run", outcomes.restores_checked),
        ("whole-store verifications after recovery", outcomes.full_verifies),
        ("uncommitted objects rolled back by those recoveries", outcomes.rolled_back_objects),
        ("violations", 0),
        ("seconds", f"{elapsed:.1f}"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
