"""What the plan cursor costs in a checkpoint of examples/train_tiny_lm.py.

Takes the latest checkpoint of a run folder of the example, and commits
that state to a scratch store ``--repeats`` times with the plan cursor and
as many times without it (alternating, so that load on the machine hits
both alike), then times the cursor's own work: capturing it from the
sampler (``PlanCursor.of``), encoding it (the registered kind), and
restoring it into a fresh sampler (``restore_into``). Prints medians::

    python examples/train_tiny_lm.py --out runs/tiny
    python bench/bench_plan_cursor.py runs/tiny
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time

from umlos_cuda.batching import load_plan
from umlos_cuda.batching.plans.checkpoint_kinds import PlanCursor
from umlos_cuda.batching.plans.planner import plan_manifest
from umlos_cuda import errors
from umlos_cuda.checkpoint import CheckpointState, CheckpointStore, RunIdentity, restore_latest
from umlos_cuda.checkpoint.extensions import cursor_kind
from umlos_cuda.hashing import sha256
from umlos_cuda.torch import PlanBatchSampler

#: The example's identity and public example key (examples/train_tiny_lm.py).
TENANT, RUN_ID = "examples", "train-tiny-lm"
KEY = sha256(b"umlos-cuda train_tiny_lm example key: public, never use for real checkpoints")


def median_us(work, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        work()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a run folder of examples/train_tiny_lm.py")
    parser.add_argument("--plan", help="its plan, when it was given one (default RUN/plan)")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    plan = load_plan(args.plan or os.path.join(args.run, "plan"))
    identity = RunIdentity(TENANT, RUN_ID, plan_manifest(plan.config, plan.meta.num_samples))
    restored = restore_latest(os.path.join(args.run, "checkpoints"), identity)
    with_cursor = CheckpointState(restored.t, {}, tensors=restored.tensors, optimizer=restored.optimizer,
                                  user_state=restored.user_state,
                                  extra_cursors={"plan": restored.extra_cursors["plan"]})
    without = dataclasses.replace(with_cursor, extra_cursors={})
    state_bytes = sum(a.nbytes for shard in restored.tensors[0] for a in shard.values()) + sum(
        a.nbytes for a in restored.optimizer[0].values())
    timings: dict[str, list[float]] = {"with": [], "without": []}
    with tempfile.TemporaryDirectory() as scratch, \
            CheckpointStore.open(os.path.join(scratch, "store"), identity, KEY, keep_last=2) as store:
        store.start_run("train", world_size=1)
        for _ in range(args.repeats):
            for name, state in (("with", with_cursor), ("without", without)):
                began = time.perf_counter()
                store.commit(state)
                timings[name].append(time.perf_counter() - began)
    sampler = PlanBatchSampler(plan, rank=0, world_size=1)
    restored.extra_cursors["plan"].restore_into(sampler)
    kind = cursor_kind("plan", errors.CHECKPOINT_STATE_INVALID, "bench")
    capture = median_us(lambda: PlanCursor.of(sampler), 1000)
    encode = median_us(lambda: kind.encode(PlanCursor.of(sampler)), 1000)
    restore = median_us(lambda: restored.extra_cursors["plan"].restore_into(PlanBatchSampler(plan, rank=0,
                                                                                            world_size=1)), 200)
    fresh = median_us(lambda: PlanBatchSampler(plan, rank=0, world_size=1), 200)
    commit_with = statistics.median(timings["with"]) * 1e3
    commit_without = statistics.median(timings["without"]) * 1e3
    print(f"checkpoint state: {state_bytes / 2**20:.2f} MiB of tensors; {args.repeats} commits each way")
    print(f"commit with the plan cursor     {commit_with:8.2f} ms (median)")
    print(f"commit without it               {commit_without:8.2f} ms (median)")
    print(f"difference                      {commit_with - commit_without:+8.2f} ms")
    print(f"PlanCursor.of(sampler)          {capture:8.1f} us")
    print(f"  + encode (the cursor kind)    {encode:8.1f} us")
    print(f"restore_into(new sampler)       {max(0.0, restore - fresh):8.1f} us (beyond the sampler's construction)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
