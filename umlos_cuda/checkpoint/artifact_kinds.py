"""Checkpoint stores and containers as artifacts (``umlos_cuda.artifacts``), for ``umlos-cuda info`` and
``umlos-cuda verify``.

What goes in: a store folder (its ``store.cbor``) or a container folder (its ``checkpoint_manifest.cbor``). What
comes out: their registrations. ``report`` is ``checkpoint inspect``'s, ``verify`` is ``checkpoint verify``'s with
the store's own key (``umlos-cuda checkpoint verify --public-key`` checks who signed; ``--expect-head`` refuses a
store rolled back).
"""

from __future__ import annotations

import os

from ..artifacts import Artifact, register_artifact
from . import summary
from .paths import MANIFEST_NAME
from .store import MARKER_NAME


def _report(path) -> dict:
    return summary.inspect_path(os.fspath(path))


def _lines(report: dict) -> list[str]:
    if report["kind"] == "store":
        commits = report["commits"]
        head = commits[-1]["head"] if commits else None
        return [f"checkpoint store {report['path']}: {len(commits)} commits, tenant {report['tenant_id']}, run "
                f"{report['run_id']}", f"  public key {report['public_key']}", f"  head {head}"]
    return [f"checkpoint container {report['path']}: {len(report['entries']) + 1} files, "
            f"{report['total_bytes']:,} bytes", f"  checkpoint_hash {report['checkpoint_hash']}"]


def _verify(path) -> dict:
    result = summary.verify_path(os.fspath(path))
    if result["kind"] == "store":
        return {"fingerprint": result["head"],
                "checks": [f"{result['commits']} commits, {result['checkpoints']} checkpoints, "
                           f"{result['trace_events']} trace events: every file, hash, certificate and chain (the "
                           "store's own key)"]}
    return {"fingerprint": result["checkpoint_hash"],
            "checks": [f"{result['files']} files: sizes, hashes, Merkle root and schema"]}


def _is_store(path: str) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, MARKER_NAME))


def _is_container(path: str) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, MANIFEST_NAME))


STORE = register_artifact(Artifact("checkpoint store", open=summary.inspect_store, verify=_verify, report=_report,
                                   lines=_lines, recognise=_is_store), replace=True)
CONTAINER = register_artifact(Artifact("checkpoint container", open=summary.inspect_container, verify=_verify,
                                       report=_report, lines=_lines, recognise=_is_container), replace=True)
