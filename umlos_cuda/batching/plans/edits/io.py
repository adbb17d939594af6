"""Edited plan folders: the parent named, the edit, the fingerprint; written atomically, read bounded.

Layout (docs/batching.md, "Editing a plan")::

    DIR/umlos-artifact.json   the marker: "edited " + the parent's kind ("edited windowed plan", ...)
    DIR/meta.json             {"format", "parent": {"path", "fingerprint", "kind"}, "edit", "units", "fingerprint"}

Nothing of the parent is copied: ``parent.path`` is where it is read again (relative to DIR's parent, as it was
when the edit was written, so the two may move together; an absolute path when given one on another root), and
the parent is reopened there as any plan is (its own reader, its own checks) and must still have the fingerprint
recorded (PLAN_PARENT_MISMATCH names it otherwise, or when it is gone or is another kind of plan). ``units`` is each
epoch's units after the edit, which the fingerprint covers (:mod:`.plan`).

Written through the output layer (files/writer.py: a hidden sibling filled, fsynced and renamed; ``force``
replaces an edited plan of the same kind only; the parent is an input, never replaced). Read through the input
layer (files/reader.py: a regular file of bounded size and depth).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from functools import partial
from typing import Any

from .... import checks, errors
from ....files import reader
from ....files.writer import ArtifactKind, output_folder
from ..plan import plan_error
from .edit import SkipRows, read_edit
from .plan import EditedPlan

#: ``format`` of meta.json.
EDITED_FORMAT = "umlos_cuda.edited_plan/1"
#: meta.json's keys.
META_KEYS = ("format", "parent", "edit", "units", "fingerprint")
#: What an edited plan's folder kind is called: the parent's kind's name after this.
PREFIX = "edited "

_format = partial(plan_error, errors.PLAN_FORMAT_INVALID)
_parent = partial(plan_error, errors.PLAN_PARENT_MISMATCH)


def folder_kind(parent_kind_name: str) -> ArtifactKind:
    """The folder kind of a plan edited from a plan of kind ``parent_kind_name`` (an edited plan's edit is of
    the same kind as its parent: the edits chain, the kind does not grow)."""
    name = parent_kind_name if parent_kind_name.startswith(PREFIX) else PREFIX + parent_kind_name
    return ArtifactKind(name)


def save_edited_plan(plan: EditedPlan, directory, *, force: bool = False, inputs: Iterable = ()) -> str:
    """Write ``plan`` to the folder ``directory`` (module docstring); returns its absolute path."""
    if plan.parent_path is None:
        raise plan_error(errors.INVALID_ARGUMENT, "an edited plan is saved with the folder of its parent "
                                                  "(EditedPlan(parent_path=...), or edit_plan of a folder)")
    target = os.path.abspath(os.fspath(directory))
    parent = ancestors(plan)[0]
    try:
        recorded = os.path.relpath(parent, os.path.dirname(target))
    except ValueError:  # another drive: no relative path
        recorded = parent
    meta = {"format": EDITED_FORMAT,
            "parent": {"path": recorded, "fingerprint": plan.parent.fingerprint, "kind": plan.parent_kind.name},
            "edit": plan.edit.to_dict(), "units": [plan.epoch_microbatches(e) for e in range(plan.num_epochs)],
            "fingerprint": plan.fingerprint}
    kind = folder_kind(plan.parent_kind.name)
    with output_folder(target, kind, force=force, inputs=(*inputs, *ancestors(plan)),
                       operator=errors.BATCH_PLAN_OPERATOR) as folder:
        folder.write_bytes("meta.json", (json.dumps(meta, indent=2) + "\n").encode("ascii"))
    return target


def ancestors(plan: EditedPlan) -> list[str]:
    """The folders ``plan`` reads: its parent's, and each ancestor's of an edited parent (none may be replaced)."""
    out: list[str] = []
    while isinstance(plan, EditedPlan) and plan.parent_path is not None:
        out.append(os.path.abspath(plan.parent_path))
        plan = plan.parent
    return out


def load_edited_plan(directory, *, kind_name: str | None = None) -> EditedPlan:
    """The edited plan in ``directory``, its parent reopened from what meta.json records and checked (module
    docstring): PLAN_NOT_FOUND, PLAN_FORMAT_INVALID, PLAN_PARENT_MISMATCH, PLAN_FINGERPRINT_MISMATCH, or the
    parent's own refusal. ``kind_name``: the folder's kind (its marker), which must be that of the parent's edits."""
    from ..kinds.registry import plan_kind_of

    root = os.fspath(directory)
    meta_path = os.path.join(root, "meta.json")
    try:
        meta = reader.read_json(meta_path, _format)
    except FileNotFoundError:
        raise plan_error(errors.PLAN_NOT_FOUND, f"no edited plan at {root}: {meta_path} does not exist") from None
    record = checks.record(meta, dict.fromkeys(META_KEYS, checks.field(checks.anything)), fail=_format,
                           what=meta_path)
    checks.equal(record["format"], f"{meta_path} format", EDITED_FORMAT, fail=_format)
    named = checks.record(record["parent"], dict.fromkeys(("path", "fingerprint", "kind"),
                                                          checks.field(checks.text, empty=False)),
                          fail=lambda message: _format(f"{meta_path} parent: {message}"), what="it")
    path = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(root)), named["path"]))
    if os.path.realpath(path) == os.path.realpath(root):
        raise _format(f"{meta_path}: the plan names itself as its parent")
    if not os.path.lexists(path):
        raise _parent(f"{root}: its parent plan {path} (fingerprint {named['fingerprint']}) is gone: put it back "
                      "there, or edit the plan you have again")
    parent_kind = plan_kind_of(path)
    expected = folder_kind(parent_kind.name).name
    if parent_kind.name != named["kind"] or (kind_name is not None and kind_name != expected):
        raise _parent(f"{root}: its parent {path} is a {parent_kind.name}; meta.json records a {named['kind']} "
                      f"(this folder is a {kind_name or expected})")
    parent = parent_kind.open(path)
    if parent.fingerprint != named["fingerprint"]:
        raise _parent(f"{root}: its parent {path} is now plan {parent.fingerprint}, not the plan "
                      f"{named['fingerprint']} it was edited from: restore that plan, or edit this one again")
    plan = EditedPlan(parent, parent_kind, read_edit(record["edit"], parent, meta_path), parent_path=path)
    units = [plan.epoch_microbatches(e) for e in range(plan.num_epochs)]
    if record["units"] != units or plan.fingerprint != record["fingerprint"]:
        raise plan_error(errors.PLAN_FINGERPRINT_MISMATCH, f"{root}: the parent's fingerprint, the edit and its "
                                                           f"units hash to {plan.fingerprint}; meta.json records "
                                                           f"{record['fingerprint']}")
    return plan


def edit_plan(parent, edit: Any) -> EditedPlan:
    """``edit`` applied to the plan folder ``parent`` (any kind), or to a plan already opened as
    ``(plan, kind, folder)``; ``edit`` is a :class:`~.edit.SkipUnits`, or a function of the opened parent that
    returns one (so that steps are located on the plan they name)."""
    from ..kinds.registry import plan_kind_of

    if isinstance(parent, tuple):
        opened, kind, folder = parent
    else:
        folder = os.fspath(parent)
        kind = plan_kind_of(folder)
        opened = kind.open(folder)
    made = edit(opened) if callable(edit) else edit
    return EditedPlan(opened, kind, made, parent_path=None if folder is None else os.fspath(folder))


def skip_samples_from(plan: Any, kind: Any, rows: Any, step: int, where: dict) -> Any:
    """The :class:`~.edit.SkipRows` edit of ``plan`` (of ``kind``) leaving ``rows`` out from the first unit of step
    ``step`` of the run ``where`` describes (``world_size``, ``batch_size``, ``start``: as ``plan explain``'s);
    BATCHING_CONFIG_INVALID for a plan whose microbatches are not unpacked rows (checked before any is read)."""
    from ..explain.steps import locate_steps
    from .edit import skip_rows
    from .plan import EditedPlan, unit_row_chunks

    EditedPlan(plan, kind, SkipRows((), None, (0,)))  # the kinds a rows edit takes, refused before the scan
    (located,) = locate_steps(plan, step, 1, where["world_size"], where["batch_size"], where["start"])
    asked = {"skip_samples_from_step": step, "world_size": where["world_size"], "batch_size": where["batch_size"],
             "start": list(where["start"])}
    return skip_rows(plan, rows, partial(unit_row_chunks, plan), start=(located.epoch, located.cursor), asked=asked)
