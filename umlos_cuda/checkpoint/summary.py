"""Readable summaries of containers and stores (``umlos-cuda checkpoint inspect``).

Inspecting reads the manifest (so a container whose manifest is damaged
fails with the reader's code) but does not hash the other files; ``verify``
does. Everything is returned as plain JSON-able data.
"""

from __future__ import annotations

import os
from typing import Any

from .. import errors
from . import paths, schema
from .codes import error
from .container import ContainerReader, verify_container
from .retention import collected_for
from .store import MARKER_NAME, CommitRecord, is_store, open_store
from .store_readers import check_bound, verify_store

def _hex(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {k: _hex(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_hex(v) for v in value]
    return value


def enclosing_store(container: str) -> tuple[str, str] | None:
    """``(store_dir, relpath)`` if ``container`` is ``STORE/checkpoints/<name>``."""
    container = os.path.abspath(container)
    parent = os.path.dirname(container)
    if os.path.basename(parent) == "checkpoints" and is_store(os.path.dirname(parent)):
        return os.path.dirname(parent), f"checkpoints/{os.path.basename(container)}"
    return None


def certifying_commit(container: str, public_key: Any = None) -> CommitRecord | None:
    """The commit whose certificate binds ``container``, if it lives in a store.

    A container inside a store that no certificate binds is a leftover of an
    interrupted commit: ``CHECKPOINT_UNCOMMITTED``.
    """
    found = enclosing_store(container)
    if found is None:
        if public_key is not None:
            raise error(errors.CHECKPOINT_SIGNATURE_INVALID,
                        f"{container} is not inside a checkpoint store, so no certificate signs it")
        return None
    store_dir, relpath = found
    _, commits = open_store(store_dir, public_key)
    for record in commits:
        if record.checkpoint and record.checkpoint["path"] == relpath:
            return record
    raise error(errors.CHECKPOINT_UNCOMMITTED, f"{relpath} is not bound by any commit certificate of {store_dir}")


def inspect_container(path: str) -> dict[str, Any]:
    with ContainerReader(path) as reader:
        header = reader.header
        tensors: dict[str, Any] = {}
        for entry in reader.info.entries:
            info = paths.parse_entry_path(entry["path"])
            if info.kind in ("tensor", "optimizer", "array"):
                try:
                    tensors[entry["path"]] = reader.describe_arrays(entry["path"])
                except errors.UmlosError as exc:
                    tensors[entry["path"]] = {"error": f"{exc.code}: {exc.message}"}
        cursors: dict[str, Any]
        try:
            cursors = {k: c.to_dict() for k, c in reader.cursors().items()}
        except errors.UmlosError as exc:
            cursors = {"error": f"{exc.code}: {exc.message}"}
        try:
            link = _hex(reader.trace_link().to_dict())
        except errors.UmlosError as exc:
            link = {"error": f"{exc.code}: {exc.message}"}
        return {
            "kind": "container",
            "path": os.path.abspath(path),
            "format": schema.CONTAINER_FORMAT,
            "checkpoint_hash": reader.checkpoint_hash.hex(),
            "header": _hex(header),
            "entries": [_hex(e) for e in reader.info.entries],
            "total_bytes": sum(e["size"] for e in reader.info.entries) + len(reader.info.manifest_bytes),
            "tensors": tensors,
            "cursors": cursors,
            "trace_link": link,
            "chain": {"checkpoint_hash_prev": _hex(header.get("checkpoint_hash_prev"))},
            "restore_profiles": list(schema.declared_profiles(header)),
        }


def inspect_store(path: str) -> dict[str, Any]:
    """The store's commits, each marked ``collected`` when retention has
    removed its checkpoint (``retention.cbor``): its certificate and hash
    stay, its container is gone or going."""
    marker, commits = open_store(path)
    collected_through = collected_for(path, commits)
    return {
        "kind": "store",
        "path": os.path.abspath(path),
        "tenant_id": marker["tenant_id"],
        "run_id": marker["run_id"],
        "public_key": marker["public_key"].hex(),
        "collected_through": collected_through,
        "commits": [
            {
                "seq": r.seq,
                "t": r.t,
                "checkpoint": r.checkpoint["path"] if r.checkpoint else None,
                "collected": bool(r.checkpoint) and r.seq <= collected_through,
                "checkpoint_hash": r.checkpoint_hash.hex() if r.checkpoint_hash is not None else None,
                "lineage_root_hash": r.lineage_root_hash.hex(),
                "trace_events": r.trace["event_count"],
                "trace_tail_hash": r.trace["tail_hash"].hex(),
                "segments": [s["path"] for s in r.trace["segments"]],
                "certificate_hash": r.certificate_hash.hex(),
                "head": r.head,
            }
            for r in commits
        ],
    }


def inspect_path(path: str) -> dict[str, Any]:
    if os.path.isfile(os.path.join(path, MARKER_NAME)):
        return inspect_store(path)
    return inspect_container(path)


def verify_path(path: str, public_key: Any = None, *, expect_head: Any = None,
                min_commit: int | None = None) -> dict[str, Any]:
    """Verify a store (everything in it) or one container (and, inside a
    store, the certificate that binds it). Raises on the first failure.
    ``expect_head`` / ``min_commit`` (stores only) refuse a store behind
    what the caller kept (``CHECKPOINT_STALE``)."""
    if is_store(path):
        return {"kind": "store", **verify_store(path, public_key, expect_head=expect_head, min_commit=min_commit)}
    if expect_head is not None or min_commit is not None:
        raise error(errors.CHECKPOINT_STATE_INVALID,
                    f"{path} is not a store: expect_head and min_commit anchor a store's commits")
    info = verify_container(path)
    record = certifying_commit(path, public_key)
    result = {
        "kind": "container",
        "path": os.path.abspath(path),
        "checkpoint_hash": info.checkpoint_hash.hex(),
        "t": info.header["t"],
        "files": len(info.entries) + 1,
        "schema_version": info.header["checkpoint_schema_version"],
        "checkpoint_merkle_root": info.header["checkpoint_merkle_root"].hex(),
        "certificate": None,
    }
    if record is not None:
        check_bound(info.checkpoint_hash, info.header, record)
        result["certificate"] = {"commit": record.seq, "public_key": record.public_key.hex(),
                                 "key_trusted": public_key is not None}
    return result


__all__ = ["certifying_commit", "enclosing_store", "inspect_path", "verify_path"]
