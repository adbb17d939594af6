"""The ``plan_window`` cursor kind: a rolling window builder's state inside checkpoints.

Importing this module registers it (:mod:`umlos_cuda.checkpoint.extensions`)::

    store.commit(dataclasses.replace(state, extra_cursors={"plan_window": window}))
    saved = store.restore_latest().extra_cursors["plan_window"]     # a WindowCheckpoint
    window = saved.resume("run/windows.jsonl")                      # RollingBatchPlanWindow

What is stored is :meth:`RollingBatchPlanWindow.state_dict`: the buffer's
configuration, RNG key and offsets, which sample key each slot holds with
its priority and draw count (as bytes), the number of windows built and the
novelty policy's recent draws. The samples themselves are in the window log,
which :meth:`WindowCheckpoint.resume` reads back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...checkpoint.extensions import CursorKind, register_cursor_kind
from .rolling import RollingBatchPlanWindow, check_window_state

KIND = "plan_window"


@dataclass(frozen=True)
class WindowCheckpoint:
    """A checked window state, as a restore returns it."""

    state: dict

    @property
    def windows(self) -> int:
        return self.state["windows"]

    def resume(self, log: Any) -> RollingBatchPlanWindow:
        return RollingBatchPlanWindow.resume(self.state, log)


def _encode(value: Any) -> dict:
    if isinstance(value, RollingBatchPlanWindow):
        return value.state_dict()
    if isinstance(value, WindowCheckpoint):
        return value.state
    return check_window_state(value)


def _decode(state: Any, manifest: Any = None) -> WindowCheckpoint:
    return WindowCheckpoint(check_window_state(state))


register_cursor_kind(CursorKind(KIND, encode=_encode, decode=_decode,
                                description="rolling plan window over a replay buffer "
                                            "(buffer slots, RNG offsets, windows)"))
