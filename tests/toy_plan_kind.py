"""A toy plan kind, registered by importing this module: what adding a kind of plan takes.

A toy plan cuts one dataset, in row order, into microbatches of ``size`` rows; its folder holds the
marker and ``plan.json`` (the size, the source's binding and where it was read, the fingerprint). The kind
is this module and its one registration line; ``plan info``, ``plan verify``, ``umlos-cuda info``,
``open_plan`` and ``plan explain`` reach it through the registry (tests/test_plan_kinds.py,
tests/test_plan_explain.py).
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from umlos_cuda import errors
from umlos_cuda.batching.plans.explain.rows import row_record, unit_record
from umlos_cuda.batching.plans.kinds import PlanKind, register_plan_kind
from umlos_cuda.batching.plans.plan import plan_error
from umlos_cuda.batching.plans.sharding import share_ranks
from umlos_cuda.batching.sources import open_source
from umlos_cuda.files import reader
from umlos_cuda.files.writer import ArtifactKind, output_folder

TOY = ArtifactKind("toy plan")


class ToyPlan:
    def __init__(self, source, size: int) -> None:
        self.source, self.size = source, size
        self.header = {"size": size, "lengths": source.binding()}
        self.fingerprint = hashlib.sha256(json.dumps(self.header, sort_keys=True).encode()).hexdigest()

    @property
    def num_microbatches(self) -> int:
        return -(-self.source.count // self.size)

    def microbatch(self, k: int) -> list[int]:
        return list(range(k * self.size, min((k + 1) * self.size, self.source.count)))

    def tokens(self, k: int) -> int:
        return int(self.source.take(np.asarray(self.microbatch(k))).sum())

    # the resume rule's interface (one epoch), which ``plan explain`` steps by
    num_epochs = 1

    def epoch_microbatches(self, epoch: int) -> int:
        return self.num_microbatches


def explain(plan: ToyPlan, epoch: int, k: int, tokens=None) -> dict:
    """Microbatch ``k`` row by row, whole samples, read from the toy's one source."""
    rows = plan.microbatch(k)
    return unit_record(k, [row_record(sample=str(r), row=r, source=plan.source.origin, document=r, start=0,
                                      stop=int(plan.source.take(np.asarray([r]))[0])) for r in rows],
                       bucket_id=None, max_len=None, window=None)


def save(plan: ToyPlan, folder, *, force: bool = False, inputs=()) -> str:
    record = {**plan.header, "lengths_path": plan.source.origin, "fingerprint": plan.fingerprint}
    with output_folder(folder, TOY, force=force, inputs=inputs, operator=errors.BATCH_PLAN_OPERATOR) as out:
        out.write_bytes("plan.json", json.dumps(record).encode())
    return os.path.abspath(folder)


def open_toy(folder) -> ToyPlan:
    def invalid(message):
        return plan_error(errors.PLAN_FORMAT_INVALID, message)

    record = reader.read_json(os.path.join(os.fspath(folder), "plan.json"), invalid)
    plan = ToyPlan(open_source(record["lengths_path"], recorded=True), record["size"])
    if plan.fingerprint != record["fingerprint"]:
        raise plan_error(errors.PLAN_FINGERPRINT_MISMATCH, f"{folder}: {plan.fingerprint} != {record['fingerprint']}")
    return plan


def verify(folder, *, expected_fingerprint: str | None = None) -> dict:
    plan = open_toy(folder)
    if expected_fingerprint is not None and plan.fingerprint != expected_fingerprint:
        raise plan_error(errors.PLAN_FINGERPRINT_MISMATCH, f"{folder}: not the expected {expected_fingerprint}")
    every = [row for k in range(plan.num_microbatches) for row in plan.microbatch(k)]
    if every != list(range(plan.source.count)):
        raise plan_error(errors.PLAN_SAMPLES_INVALID, f"{folder}: not every row once")
    return {"fingerprint": plan.fingerprint, "checks": ["opens", "every row once, in order"]}


def report(folder, *, world_size: int | None = None, rank: int | None = None) -> dict:
    ranks = share_ranks(world_size, rank)
    plan = open_toy(folder)
    counts = [len(range(r, plan.num_microbatches, world_size or 1)) for r in ranks]
    return {"plan": str(folder), "kind": TOY.name, "fingerprint": plan.fingerprint, "size": plan.size,
            "microbatches": plan.num_microbatches, "ranks": [{"rank": r, "microbatches": c} for r, c in
                                                             zip(ranks, counts)]}


def lines(report: dict) -> list[str]:
    return [f"toy plan {report['plan']}: {report['microbatches']} microbatches of {report['size']} rows",
            *(f"  rank {row['rank']}: {row['microbatches']} microbatches" for row in report["ranks"])]


KIND = register_plan_kind(PlanKind(TOY, order="dataset", scope="epoch", unit="microbatch", rows=False,
                                   open=open_toy, save=save, verify=verify, report=report, lines=lines,
                                   explain=explain))
