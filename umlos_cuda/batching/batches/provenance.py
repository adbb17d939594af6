"""What a batch folder records of its plan's kind and of the token sources its files were collated from.

What goes in: a plan of rows (plans/rows.py: any kind whose microbatches list dataset rows) and the token source its
rows were read from (one source, or a mixture's components read as one ``SourceList``). What comes out: the fields
``batches.json`` records for a plan of any kind but the whole plan (format :data:`FILES_FORMAT_V3`; a whole plan's
folder keeps format 1 or 2 and its bytes, its kind implied):

* ``plan_kind``: the kind of the copy in ``OUT/plan`` (its marker's name), which the reader opens through the
  plan-kind registry;
* ``sources``: one record per part of the plan's rows, in order (one, or each component of a mixture):
  ``name`` (a mixture's component name, empty otherwise), ``path`` (the absolute path of the token source,
  a list for several Megatron prefixes read as one, null for a source opened by the caller with none),
  ``lengths`` (the part's binding as the plan records it), ``tokenizer_hash`` and ``identity`` (what the token
  source keeps of its tokens, :meth:`~..lengths.sources.LengthSource.identity`; null when it keeps nothing).

and the checks of both: :func:`check_record` (BATCH_FILE_INVALID for a malformed record) and
:func:`check_sources` (BATCH_STORE_MISMATCH when a token source given to the reader is not, part by part, the one
the files were collated from: the component named, with what differs).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ... import checks, errors
from ...errors import UmlosError
from ..lengths.sources import identity_differences, source_identity
from ..plans.io import PLAN
from ..plans.windows.io import absolute_paths
from .npz import file_error

#: batches.json ``format`` of a folder whose plan is not a whole plan: the fields of format 2, any layout, and these.
FILES_FORMAT_V3 = "umlos_cuda.batch_files/3"
#: The plan kind formats 1 and 2 imply (their folders predate the others): the whole plan.
IMPLIED_KIND = PLAN.name
#: The fields this module adds to batches.json.
FIELDS = ("plan_kind", "sources")
_SOURCE_KEYS = ("name", "path", "lengths", "tokenizer_hash", "identity")


def source_parts(plan, source) -> list[Any]:
    """The token source of each part of ``plan``'s rows, in order: ``source`` itself for a plan of one dataset, its
    parts for a mixture's (``plans.rows.open_row_source`` opened them as one ``SourceList``)."""
    return [source] if len(plan.row_parts()) == 1 else list(source.parts)


def source_path(source) -> str | list | None:
    """Where ``source`` was opened from, absolute: its ``origin``, root folder or Megatron prefix(es); None for a
    source that says none."""
    for name in ("origin", "root", "prefix"):
        value = getattr(source, name, None)
        if isinstance(value, (str, os.PathLike)) or (isinstance(value, list) and value):
            return absolute_paths(value)
    return None


def source_records(plan, source) -> list[dict]:
    """batches.json ``sources``: one record per part (module docstring)."""
    return [{"name": part.name, "path": source_path(piece), "lengths": part.binding,
             "tokenizer_hash": getattr(piece, "tokenizer_hash", None), "identity": source_identity(piece)}
            for part, piece in zip(plan.row_parts(), source_parts(plan, source))]


def job_view(records) -> list[dict] | None:
    """``sources`` as a resumed run compares them: without the paths (the same stores moved are the same job)."""
    if not isinstance(records, list):
        return records
    return [{key: value for key, value in record.items() if key != "path"} for record in records]


def check_record(data: dict, path: str) -> None:
    """BATCH_FILE_INVALID unless a format-3 batches.json's ``plan_kind`` is text and its ``sources`` a list of
    records of :data:`_SOURCE_KEYS` (a path: text, a list of text or null; lengths: an object with an integer
    ``count``; tokenizer_hash: text or null; identity: an object or null)."""
    def fail(message: str) -> UmlosError:
        return file_error(f"{path}: {message}")

    checks.text(data.get("plan_kind"), "plan_kind", fail=fail, empty=False,
                message="{name} must be a plan kind's name, got {type}")
    wrong = "sources must be a list of {name, path, lengths, tokenizer_hash, identity} records"
    records = checks.instance(data.get("sources"), "sources", list, fail=fail, empty=False,
                              message=checks.literal(wrong))
    fields: dict[str, checks.Field | Callable[[Any], bool]] = {
        "name": checks.field(checks.text), "path": _is_path, "lengths": _is_binding,
        "tokenizer_hash": lambda value: value is None or isinstance(value, str),
        "identity": lambda value: value is None or isinstance(value, dict)}
    for i, record in enumerate(records):
        checks.record(record, fields, fail=fail, what=f"sources[{i}]", invalid=f"sources[{i}] {{name}} is malformed")


def _is_path(value) -> bool:
    return value is None or isinstance(value, str) or \
        (isinstance(value, list) and all(isinstance(item, str) for item in value))


def _is_binding(value) -> bool:
    return isinstance(value, dict) and checks.is_integer(value.get("count"), strict=True) and value["count"] >= 0


def check_sources(recorded: list[dict], plan, pieces: list, root: str) -> None:
    """BATCH_STORE_MISMATCH unless each of ``pieces`` (the token source of each part of the plan's rows, given to
    read or verify the folder ``root``: ``plans.rows.open_row_parts``) is the one the files were collated from:
    its tokenizer, and what it keeps of its tokens (``identity``: a store re-tokenized in place with equal lengths
    differs there), the component named. BATCH_FILE_INVALID when the folder records another number of parts than
    the plan has."""
    parts = plan.row_parts()
    if len(recorded) != len(parts):
        raise file_error(f"{root}: batches.json records {len(recorded)} token sources; its plan reads "
                         f"{len(parts)} datasets")
    for i, (part, piece, record) in enumerate(zip(parts, pieces, recorded)):
        what = "the token source" if len(parts) == 1 else f"component {i} ({part.name!r})'s token source"
        tokenizer = getattr(piece, "tokenizer_hash", None)
        differ = identity_differences(record["identity"], piece)
        if differ is None and record["tokenizer_hash"] is not None and tokenizer is not None \
                and tokenizer != record["tokenizer_hash"]:
            differ = f"tokenizer_hash {tokenizer!r} (recorded {record['tokenizer_hash']!r})"
        if differ is not None:
            raise UmlosError(errors.BATCH_STORE_MISMATCH, f"{what} {source_path(piece) or ''} is not the one the "
                             f"batch files in {root} were collated from ({record['path']}): {differ}; give that "
                             "source, or write the files again from this one (umlos-cuda batch generate)",
                             operator=errors.BATCHING_OPERATOR)
