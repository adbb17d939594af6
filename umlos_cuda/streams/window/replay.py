"""Rebuild every window of a window log offline and prove its fingerprints.

``replay_log(path)`` starts from the log's header (an empty buffer with the
recorded RNG key, the window and batching configuration, the policies),
then for each window record adds its recorded samples, with their keys and
priorities, and builds the window again. The snapshot, plan and window
fingerprints and the RNG offsets must equal the recorded ones; the first
that differs raises ``WINDOW_REPLAY_MISMATCH`` naming the window and the
field. No server, no network: the log is the whole input. A log with a
header and no window (a run that stopped before its first window) proves
nothing and is refused (``WINDOW_LOG_INVALID``), never reported as replayed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from ... import errors
from ..failures import failure
from ..types import StreamSample
from .rolling import RollingBatchPlanWindow
from .log import iter_lines, log_path, read_log

CHECKED = ("snapshot_fingerprint", "plan_fingerprint", "window_fingerprint", "microbatches", "rng_offsets")


@dataclass
class ReplayReport:
    windows: int = 0
    samples: int = 0
    microbatches: int = 0
    build_seconds: list[float] = field(default_factory=list)
    last_window_fingerprint: str | None = None


def replay_log(path: str | os.PathLike[str], progress: Callable[[int], None] | None = None) -> ReplayReport:
    path = log_path(path)
    header = read_log(path, max_windows=0).header
    builder = RollingBatchPlanWindow.from_header(header, where=f"{path}:1")
    report = ReplayReport()
    index = -1
    for number, record in iter_lines(path, drop_torn_tail=False):
        assert record is not None  # drop_torn_tail=False: a torn tail raises instead
        if record["kind"] == "header":
            continue
        index += 1
        if record.get("window") != index:
            raise failure(errors.WINDOW_LOG_INVALID, f"{path}:{number} should be window {index}")
        for entry in record["added"]:  # iter_lines checked their layout
            if entry["key"] != builder.buffer.added:
                raise failure(errors.WINDOW_LOG_INVALID, f"{path}:{number}: sample key {entry['key']!r} out of "
                                                         f"order (expected {builder.buffer.added})")
            try:
                builder.add(StreamSample.from_dict(entry["sample"]), entry["priority"])
            except errors.UmlosError as exc:
                raise failure(errors.WINDOW_LOG_INVALID, f"{path}:{number}: sample key {entry['key']} is refused: "
                                                         f"{exc.code}: {exc.message}") from None
            report.samples += 1
        window = builder.next_window()
        rebuilt = builder.record(window, [])
        for name in CHECKED:
            if rebuilt[name] != record.get(name):
                raise failure(errors.WINDOW_REPLAY_MISMATCH, f"window {index}: the rebuilt {name} is "
                                                             f"{rebuilt[name]!r}, the log says {record.get(name)!r} "
                                                             f"({path}:{number})")
        report.windows += 1
        report.microbatches += len(window.microbatches)
        report.build_seconds.append(window.build_seconds)
        report.last_window_fingerprint = window.fingerprint
        if progress is not None:
            progress(index + 1)
    if report.windows == 0:
        raise failure(errors.WINDOW_LOG_INVALID,
                      f"{path} holds a header and no window: the run that wrote it stopped "
                      "before its first window, so there is nothing to replay (run it again)")
    return report
