"""Edited plans: a plan of any kind with some of its units left out (``plan edit``; plans/edits/).

What goes in: an edited plan folder, whose meta.json names its parent (reopened and checked). What comes out:
:func:`edited_kind`, the kind of the plans edited from plans of a given kind: the parent's place in the plan model
(order, scope, unit, rows), so every sampler, loader and command takes it as it takes the parent, with this
module's open, save, verify, report, explain and origin. One kind per parent kind (``edited windowed plan``, ...)
because the registry tells samplers what a folder hands out from its marker alone; an edit of an edited plan is
of its parent's kind (the edits chain, the name does not grow). No whole plan holds an edited plan's microbatches
(``plan shard`` and ``batch generate`` refuse it): shard or generate batches from the parent, or train from the
edited plan's samplers.
"""

from __future__ import annotations

from functools import partial

from .... import errors
from ..edits.io import folder_kind, load_edited_plan, save_edited_plan
from ..edits.edit import SkipRows, skip_rows
from ..edits.plan import EditedPlan, unit_row_chunks
from ..explain.rows import unit_record
from ..plan import plan_error
from ..sharding import share_ranks
from ..windows.resume import rank_indices
from .kind import PlanKind


def report(folder, *, world_size: int | None = None, rank: int | None = None) -> dict:
    """``plan info``'s report: the parent (path, fingerprint, kind), every edit, and per epoch the units before
    and after the edit and, with a world size, each rank's units under the resume rule."""
    ranks = share_ranks(world_size, rank)
    plan = load_edited_plan(folder)
    epochs = []
    for e in range(plan.num_epochs):
        units = plan.epoch_microbatches(e)
        entry: dict = {"epoch": e, "units": units, "parent_units": plan.parent.epoch_microbatches(e),
                       "skipped": plan.edit.skipped(e)}
        if ranks:
            entry["ranks"] = [{"rank": r, "units": len(rank_indices(0, units, r, world_size or 1))} for r in ranks]
        epochs.append(entry)
    origin = plan.origin()
    return {"plan": str(folder), "kind": folder_kind(plan.parent_kind.name).name, "fingerprint": plan.fingerprint,
            "unit": plan.parent_kind.unit,
            "parent": {"path": plan.parent_path, "fingerprint": plan.parent.fingerprint,
                       "kind": plan.parent_kind.name},
            "edits": origin["edits"], "epochs": epochs}


#: A unit, counted.
PLURAL = {"microbatch": "microbatches", "sample": "samples"}


def lines(report: dict) -> list[str]:
    """The text of ``plan info`` for :func:`report`'s dict."""
    parent, units = report["parent"], PLURAL[report["unit"]]
    out = [f"{report['kind']} {report['plan']}", f"  fingerprint {report['fingerprint']}",
           f"  parent: {parent['kind']} {parent['path']} (fingerprint {parent['fingerprint']})"]
    for i, edit in enumerate(report["edits"]):
        asked = edit.get("asked") or {}
        words = "" if "skip_steps" not in asked else (
            f" (steps {asked['skip_steps'][0]} to {asked['skip_steps'][1] - 1} at world size {asked['world_size']}"
            f", from cursor {asked['start'][0]}:{asked['start'][1]})")
        ranges = ", ".join(f"epoch {e} units {first} to {stop - 1}" for e, first, stop in edit["units"][:8])
        more = f" and {len(edit['units']) - 8} more" if len(edit["units"]) > 8 else ""
        if "rows" in edit:
            listed = ", ".join(map(str, edit["rows"][:8])) + (" ..." if len(edit["rows"]) > 8 else "")
            out.append(f"  edit {i}: skip {len(edit['rows'])} row(s) ({listed}) from cursor {edit['from'][0]}:"
                       f"{edit['from'][1]} on" + (f"; microbatches left empty: {ranges}{more}" if ranges else ""))
            continue
        out.append(f"  edit {i}: skip {ranges}{more}{words}")
    for entry in report["epochs"]:
        out.append(f"  epoch {entry['epoch']}: {entry['units']} {units} ({entry['parent_units']} in the parent, "
                   f"{entry['skipped']} skipped)")
        out += [f"    rank {row['rank']}: {row['units']} {units}" for row in entry.get("ranks", [])]
    return out


def verify(folder, *, expected_fingerprint: str | None = None) -> dict:
    """The parent verified by its own kind against the fingerprint recorded, then the edit read against it and
    the fingerprint recomputed (PLAN_FINGERPRINT_MISMATCH when it is not ``expected_fingerprint``)."""
    plan = load_edited_plan(folder)
    parent = plan.parent_kind.verify(plan.parent_path, expected_fingerprint=plan.parent.fingerprint)
    if expected_fingerprint is not None and plan.fingerprint != expected_fingerprint:
        raise plan_error(errors.PLAN_FINGERPRINT_MISMATCH, f"{folder}: fingerprint {plan.fingerprint}, not the "
                                                           f"expected {expected_fingerprint}")
    checks = [f"parent {plan.parent_path} ({plan.parent_kind.name}): {check}" for check in parent["checks"]]
    if isinstance(plan.edit, SkipRows):  # the microbatches it leaves empty, found again by reading every one
        again = skip_rows(plan.parent, plan.edit.rows, partial(unit_row_chunks, plan.parent), start=plan.edit.start)
        if again.ranges != plan.edit.ranges:
            raise plan_error(errors.PLAN_FINGERPRINT_MISMATCH, f"{folder}: the rows left out empty the microbatches "
                                                               f"{[list(r) for r in again.ranges][:8]}; meta.json "
                                                               "lists others")
        checks.append("every microbatch from the edit's cursor read: the rows left out empty those the edit lists")
    checks.append("the edit's ranges inside the parent's epochs, sorted and disjoint; the parent's fingerprint, "
                  "the edit and the units hash to meta.json's fingerprint")
    return {"fingerprint": plan.fingerprint, "checks": checks}


def explain_unit(plan: EditedPlan, epoch: int, k: int, tokens=None) -> dict:
    """Unit ``k`` of ``epoch``: the parent's unit it is, explained by the parent's kind, with its index in the
    edited plan and ``parent_index`` its index in the parent; the rows an edit leaves out of it are not listed."""
    index = plan.parent_index(epoch, k)
    unit = plan.parent_kind.explain(plan.parent, epoch, index, tokens)
    kept = plan.edit.kept(epoch, index, [row["row"] for row in unit["rows"]])
    if kept is None:
        return {**unit, "index": k, "parent_index": index}
    extra = {key: value for key, value in unit.items() if key not in ("index", "tokens", "loss_tokens", "rows")}
    return unit_record(k, [row for row, keep in zip(unit["rows"], kept) if keep], **extra, parent_index=index)


def origin(plan: EditedPlan) -> dict:
    return plan.origin()


def edited_kind(parent: PlanKind) -> PlanKind:
    """The kind of plans edited from plans of kind ``parent`` (module docstring)."""
    artifact = folder_kind(parent.name)
    return PlanKind(artifact, order=parent.order, scope=parent.scope, unit=parent.unit, rows=parent.rows,
                    open=partial(load_edited_plan, kind_name=artifact.name), save=save_edited_plan, verify=verify,
                    report=report, lines=lines, explain=None if parent.explain is None else explain_unit,
                    origin=origin)
