"""Batch folders as artifacts (``umlos_cuda.artifacts``), for ``umlos-cuda info`` and ``umlos-cuda verify``.

What goes in: a batch folder (``batch generate``: its marker, or before markers its ``batches.json``). What comes
out: its registration. ``verify`` is ``batch check``: the folder's plan and every file re-hashed, each file its
plan microbatch's; with ``store`` (the token source, required for the index layout, which holds no files), each
file's bytes are exactly what a fresh collation gives. ``report`` reads ``batches.json`` and the plan.
"""

from __future__ import annotations

from ... import errors
from ...artifacts import Artifact, register_artifact
from ...errors import UmlosError
from .reader import BatchReader
from .writer import BATCH_FOLDER


def _report(folder) -> dict:
    reader = BatchReader(folder)
    layout = reader.layout
    return {"path": reader.root, "kind": BATCH_FOLDER.name, "microbatches": len(reader), "epochs": reader.num_epochs,
            "layout": layout.name, "compression": layout.compression, "plan_fingerprint": reader.plan_fingerprint,
            "batch_fingerprint": reader.fingerprint.fingerprint, "pad_id": reader.pad_id}


def _lines(report: dict) -> list[str]:
    compression = f", {report['compression']}" if report["compression"] else ""
    return [f"batch folder {report['path']}: {report['microbatches']} microbatches over {report['epochs']} epoch(s), "
            f"{report['layout']} layout{compression}",
            f"  plan {report['plan_fingerprint']}", f"  batch fingerprint {report['batch_fingerprint']}",
            f"  pad_id {report['pad_id']}"]


def _verify(folder, *, store=None, expected_fingerprint: str | None = None) -> dict:
    reader = BatchReader(folder, store=store)
    done = reader.verify(store)
    if expected_fingerprint is not None and done["batch_fingerprint"] != expected_fingerprint:
        raise UmlosError(errors.BATCH_FINGERPRINT_MISMATCH, f"{folder} fingerprints to {done['batch_fingerprint']}, "
                         f"not the expected {expected_fingerprint}", operator=errors.BATCHING_OPERATOR)
    against = " and the token store" if done["against_store"] else ""
    what = "batch files" if reader.layout.has_files else "microbatches of an index-only folder"
    return {"fingerprint": done["batch_fingerprint"],
            "checks": [f"{done['files']} {what} match plan {done['plan_fingerprint']}{against}"]}


BATCHES = register_artifact(Artifact(BATCH_FOLDER.name, open=BatchReader, verify=_verify, report=_report,
                                     lines=_lines, folder=BATCH_FOLDER,
                                     verify_options=frozenset({"store", "expected_fingerprint"})), replace=True)
