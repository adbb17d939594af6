"""What a run trained on, step by step, on the checkpoint store's tape, and the check that it is what its plan says.

What goes in: at training time, per step, the plan's fingerprint, the epoch, and the units the whole job trained on
in that step (each a global unit index and the dataset rows the collator handed the model: ``PlanCollator``'s
``rows``; for a cut sample, its documents); afterwards, a checkpoint store and the plan. What comes out: a
``plan.step`` tape record per step (:func:`step_record`: ``{t, plan_fingerprint, epoch, cursor, units, digest}``,
the digest :func:`step_digest` of the units; about 150 bytes), which a training loop appends to
``CheckpointStore.tape`` (committed with the next checkpoint, like every record), and :func:`check_tape`, which
reads a store's committed tape (bounded, its chain checked by the tape reader) and checks every ``plan.step``
record against the plan: its fingerprint, its units ``cursor .. cursor + units - 1`` of its epoch inside the plan,
its digest equal to the digest of the rows :mod:`.explainer` gives for those units, and each step starting where
the one before it ended (the next epoch's 0 after an epoch's end), so a run that skipped or repeated units is told
apart from one that trained its plan exactly once, whatever world sizes it was resumed at.

The digest is SHA-256 of the canonical CBOR of ``["umlos_plan_step_v1", epoch, [[index, [row, ...]], ...]]``, the
units in ascending index: the same for a step whatever the world size that trained it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any

from .... import errors
from ....checkpoint import tape
from ....hashing import hash_canonical
from ..plan import plan_error

#: The record type (registered by ``umlos_cuda.batching.plans.checkpoint_kinds``, the subsystem's entry point).
STEP_RECORD = "plan.step"
#: Its fields: the step's number ``t``, the plan, the epoch, the first unit and how many, the units' digest.
STEP_FIELDS = {"t": tape.is_uint, "plan_fingerprint": tape.is_text, "epoch": tape.is_uint, "cursor": tape.is_uint,
               "units": tape.is_uint, "digest": tape.is_hash}
#: The tag the digest starts with.
DIGEST_TAG = "umlos_plan_step_v1"

_mismatch = partial(plan_error, errors.PLAN_TAPE_MISMATCH)


def step_digest(epoch: int, units: Iterable[tuple[int, Sequence[int]]]) -> bytes:
    """The digest of a step's ``units``, ``(global index, rows)`` each, in any order (module docstring)."""
    ordered = sorted((int(index), [int(row) for row in rows]) for index, rows in units)
    return hash_canonical([DIGEST_TAG, int(epoch), [[index, rows] for index, rows in ordered]])


def step_record(t: int, plan_fingerprint: str, epoch: int, units: Sequence[tuple[int, Sequence[int]]]) -> dict:
    """The ``plan.step`` record of step ``t`` that trained ``units`` (``(global index, rows)`` each, consecutive
    indices), for ``CheckpointStore.tape.append``."""
    indices = sorted(int(index) for index, _ in units)
    if not indices or indices != list(range(indices[0], indices[0] + len(indices))):
        raise plan_error(errors.INVALID_ARGUMENT, f"step {t}: a step trains consecutive units of one epoch, got "
                                                  f"indices {indices[:8]}{'...' if len(indices) > 8 else ''}")
    return {"type": STEP_RECORD, "t": int(t), "plan_fingerprint": plan_fingerprint, "epoch": int(epoch),
            "cursor": indices[0], "units": len(indices), "digest": step_digest(epoch, units)}


class StepRecorder:
    """What each step of a training loop trained, appended to a checkpoint store's tape as ``plan.step`` records:
    the one helper every loop uses (examples/train_ddp.py, the Trainer's ``plan_tape``).

    Per microbatch (or sample) trained, :meth:`add` its epoch, global index and the dataset rows the collator handed
    the model; at the step's end, :meth:`end_step` appends one :func:`step_record` per epoch the step's units are in
    (a step of ``G`` units may cross an epoch's end, where the next epoch's units follow: two records with the same
    ``t``, which :func:`check_tape` reads as one step after the other) and forgets them. ``tape``: the store's
    ``CheckpointStore.tape`` (anything with ``append``); the records are committed with the store's next commit.
    """

    def __init__(self, tape: Any, plan_fingerprint: str) -> None:
        self.tape, self.fingerprint = tape, plan_fingerprint
        #: ``(epoch, index, rows)`` of each unit trained since the last :meth:`end_step`.
        self.units: list[tuple[int, int, list[int]]] = []

    def add(self, epoch: int, index: int, rows: Iterable[int]) -> None:
        """Unit ``index`` of ``epoch`` was trained on ``rows`` in the current step."""
        self.units.append((int(epoch), int(index), [int(row) for row in rows]))

    def end_step(self, t: int) -> list[dict]:
        """Append the records of step ``t`` (class docstring) and return them; none for a step without a unit."""
        epochs = sorted({epoch for epoch, _, _ in self.units})
        records = [step_record(t, self.fingerprint, epoch, [(index, rows) for e, index, rows in self.units
                                                            if e == epoch]) for epoch in epochs]
        for record in records:
            self.tape.append(record)
        self.units = []
        return records


def unit_rows(unit: dict) -> list[int]:
    """The rows a unit of :mod:`.explainer` trains on: a microbatch's dataset rows, a cut sample's documents."""
    return [row["document"] if row["row"] is None else row["row"] for row in unit["rows"]]


def tape_steps(store: Any) -> list[dict]:
    """The ``plan.step`` records of the committed tape of the checkpoint store ``store``, in order (the store's
    certificates read and checked, every committed segment read against them)."""
    from ....checkpoint import open_store

    store = os.fspath(store)
    _, commits = open_store(store)
    steps: list[dict] = []

    def keep(record: dict, _digest: bytes) -> None:
        if record["type"] == STEP_RECORD:
            steps.append(record)

    tape.read_tape(store, [segment for commit in commits for segment in commit.trace["segments"]], on_record=keep)
    return steps


def check_tape(store: Any, explainer: Any) -> dict:
    """Every ``plan.step`` record of ``store``'s tape checked against the plan of ``explainer`` (a
    :class:`~.explainer.StepExplainer`; module docstring). PLAN_TAPE_MISMATCH naming the first step that differs
    (another plan, units outside the plan, a gap or an overlap with the step before, other rows), or a tape without
    any step. Returns ``{"steps", "units", "first", "last"}`` (``first``/``last``: ``{t, epoch, cursor}``)."""
    plan = explainer.plan
    fingerprint = plan.fingerprint
    records = tape_steps(store)
    if not records:
        raise _mismatch(f"{os.fspath(store)}: the tape holds no {STEP_RECORD} record: the run did not record its steps")
    expected: tuple[int, int] | None = None  # where the next step starts
    units = 0
    for record in records:
        t, epoch, cursor, count = record["t"], record["epoch"], record["cursor"], record["units"]
        where = f"{os.fspath(store)}: step {t} (epoch {epoch}, units {cursor} to {cursor + count - 1})"
        if record["plan_fingerprint"] != fingerprint:
            raise _mismatch(f"{where} was trained on plan {record['plan_fingerprint']}, not {fingerprint}")
        if epoch >= plan.num_epochs or count < 1 or cursor + count > plan.epoch_microbatches(epoch):
            raise _mismatch(f"{where} is outside the plan ({plan.num_epochs} epoch(s))")
        if expected is not None and (epoch, cursor) != expected:
            raise _mismatch(f"{where} does not start where the step before ended (epoch {expected[0]}, unit "
                            f"{expected[1]}): the run skipped or repeated units")
        want = step_digest(epoch, [(k, unit_rows(explainer.unit(epoch, k))) for k in range(cursor, cursor + count)])
        if want != record["digest"]:
            raise _mismatch(f"{where} trained other rows than the plan gives (plan explain --step shows them)")
        units += count
        end = cursor + count
        expected = (epoch + 1, 0) if end == plan.epoch_microbatches(epoch) and epoch + 1 < plan.num_epochs \
            else (epoch, end)
    first, last = records[0], records[-1]
    return {"steps": len(records), "units": units,
            "first": {"t": first["t"], "epoch": first["epoch"], "cursor": first["cursor"]},
            "last": {"t": last["t"], "epoch": last["epoch"], "cursor": last["cursor"] + last["units"]}}
