"""A plan shard set (``plan shard``): one whole plan per rank, ``rank_<r>/``, and ``shards.json``.

What goes in: a shard set folder (marker ``plan shard set``, or one written before markers whose
``shards.json`` names a world size and whose ``rank_0`` is a plan). What comes out: :data:`ARTIFACT`, whose
report lists each rank's fingerprint and microbatches from ``shards.json`` and whose verify checks every rank
as ``plan verify`` checks a plan, against the fingerprint and source ``shards.json`` records for it.
"""

from __future__ import annotations

import os

from .... import checks, errors
from ....artifacts import Artifact
from ....files import reader
from ..io import SHARDS, load_plan
from ..plan import plan_error
from ..verify import verify_plan

_ROW_KEYS = dict.fromkeys(("rank", "fingerprint", "microbatches"), checks.field(checks.anything))


def _invalid(message: str):
    return plan_error(errors.PLAN_FORMAT_INVALID, message)


def read_index(folder) -> dict:
    """``shards.json``, checked: a world size, the source plan's fingerprint, one row per rank in rank order."""
    path = os.path.join(os.fspath(folder), "shards.json")
    try:
        index = reader.read_json(path, _invalid)
    except FileNotFoundError:
        raise plan_error(errors.PLAN_NOT_FOUND, f"no plan shard set at {folder}: {path} does not exist") from None
    index = checks.record(index, dict.fromkeys(("world_size", "source_fingerprint", "shards"),
                                               checks.field(checks.anything)), fail=_invalid, what=path)
    world_size = checks.integer(index["world_size"], f"{path} world_size", 1, 1 << 20, fail=_invalid)
    rows = checks.instance(index["shards"], f"{path} shards", list, fail=_invalid)
    if len(rows) != world_size:
        raise _invalid(f"{path} lists {len(rows)} shards for world_size {world_size}")
    for rank, row in enumerate(rows):
        row = checks.record(row, _ROW_KEYS, fail=_invalid, what=f"{path} shard {rank}")
        if row["rank"] != rank:
            raise _invalid(f"{path} shard {rank} names rank {row['rank']!r}")
    checks.text(index["source_fingerprint"], f"{path} source_fingerprint", fail=_invalid)
    return index


def open_shards(folder) -> list:
    """Each rank's plan, in rank order."""
    index = read_index(folder)
    return [load_plan(os.path.join(os.fspath(folder), f"rank_{rank}")) for rank in range(index["world_size"])]


def report(folder) -> dict:
    index = read_index(folder)
    return {"plan": str(folder), "kind": SHARDS.name, "world_size": index["world_size"],
            "source_fingerprint": index["source_fingerprint"], "shards": index["shards"]}


def lines(report: dict) -> list[str]:
    out = [f"plan shard set {report['plan']}: {report['world_size']} ranks of plan {report['source_fingerprint']}"]
    out += [f"  rank {row['rank']}: {row['microbatches']} microbatches, fingerprint {row['fingerprint']}"
            for row in report["shards"]]
    return out


def verify(folder, *, expected_fingerprint: str | None = None) -> dict:
    """Every rank verified as a plan (its fingerprint the one ``shards.json`` records), each a shard of the source
    plan ``shards.json`` names (``expected_fingerprint``: that source's)."""
    index = read_index(folder)
    source = index["source_fingerprint"]
    if expected_fingerprint is not None and source != expected_fingerprint:
        raise plan_error(errors.PLAN_FINGERPRINT_MISMATCH, f"{folder} shards plan {source}, not the expected "
                                                           f"{expected_fingerprint}")
    for row in index["shards"]:
        rank_folder = os.path.join(os.fspath(folder), f"rank_{row['rank']}")
        verify_plan(rank_folder, expected_fingerprint=row["fingerprint"])
        shard = load_plan(rank_folder).meta.shard
        if shard is None or (shard["rank"], shard["world_size"], shard["source_fingerprint"]) != \
                (row["rank"], index["world_size"], source):
            raise plan_error(errors.PLAN_FINGERPRINT_MISMATCH, f"{rank_folder} is not shard {row['rank']} of "
                                                               f"{index['world_size']} of plan {source}")
    return {"fingerprint": source, "checks": [f"{index['world_size']} ranks, each a plan that verifies, with the "
                                              "fingerprint shards.json records and the source's shard fields"]}


ARTIFACT = Artifact(SHARDS.name, open=open_shards, verify=verify, report=report, lines=lines, folder=SHARDS,
                    verify_options=frozenset({"expected_fingerprint"}))
