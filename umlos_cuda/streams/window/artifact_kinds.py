"""Gym runs as artifacts (``umlos_cuda.artifacts``), for ``umlos-cuda info`` and ``umlos-cuda verify``.

What goes in: a ``gym run`` folder (its marker, or before markers the header of its ``windows.jsonl``). What
comes out: its registration. ``verify`` is ``gym replay``: every window rebuilt from the log alone, its
snapshot, plan and window fingerprints equal to the log's; ``report`` reads the log (header and windows).
"""

from __future__ import annotations

import os

from ...artifacts import Artifact, register_artifact
from .log import GYM_RUN, log_path, read_log
from .replay import replay_log


def _report(folder) -> dict:
    contents = read_log(folder)
    windows = contents.windows
    last = windows[-1].get("window_fingerprint") if windows else None
    return {"path": os.fspath(folder), "kind": GYM_RUN.name, "log": log_path(folder), "windows": len(windows),
            "samples_added": sum(len(w["added"]) for w in windows),  # read_log checked each is a list
            "last_window_fingerprint": last if isinstance(last, str) else None}


def _lines(report: dict) -> list[str]:
    return [f"gym run {report['path']}: {report['windows']} windows, {report['samples_added']} samples added",
            f"  log {report['log']}", f"  last window {report['last_window_fingerprint']}"]


def _verify(folder) -> dict:
    done = replay_log(folder)
    return {"fingerprint": done.last_window_fingerprint,
            "checks": [f"{done.windows} windows replayed from the log ({done.samples} samples, {done.microbatches} "
                       "microbatches): every snapshot, plan and window fingerprint equals the log's"]}


GYM = register_artifact(Artifact(GYM_RUN.name, open=read_log, verify=_verify, report=_report, lines=_lines,
                                 folder=GYM_RUN), replace=True)
