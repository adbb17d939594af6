"""What a window's curriculum did: the metrics logged with each window, and a plot.

Per window (computed on the window's snapshot and the rows its policy drew):

- ``success_rate_by_difficulty``: per difficulty, the share of the
  snapshot's samples with a known outcome whose episode was solved;
- ``replay_hit_rate``: the share of the window's draws whose sample had
  been drawn by an earlier window (its draw count was above 0);
- ``difficulty_distribution``: per difficulty, the share of the window's
  draws (the sampling distribution the curriculum produced).

:func:`plot_curriculum` draws ``difficulty_distribution`` window after
window from a window log into a PNG (matplotlib, the ``plot`` extra).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ... import errors
from ...errors import UmlosError
from ..buffer.snapshot import BufferSnapshot

UNKNOWN = "unknown"


def window_metrics(snapshot: BufferSnapshot, rows: np.ndarray) -> dict[str, Any]:
    codes, difficulties = snapshot.difficulty_codes
    names = [name or UNKNOWN for name in difficulties]
    solved = snapshot.solved
    known = solved >= 0
    outcomes = np.bincount(codes[known], minlength=len(names))
    wins = np.bincount(codes[known], weights=solved[known], minlength=len(names))
    drawn = np.bincount(codes[rows], minlength=len(names)) if len(rows) else np.zeros(len(names))
    total = max(1, len(rows))
    hits = int((snapshot.draw_counts[rows] > 0).sum()) if len(rows) else 0
    return {
        "success_rate_by_difficulty": {names[i]: round(float(wins[i] / outcomes[i]), 6)
                                       for i in np.argsort(names) if outcomes[i]},
        "replay_hit_rate": round(hits / total, 6),
        "difficulty_distribution": {names[i]: round(float(drawn[i] / total), 6) for i in np.argsort(names) if drawn[i]},
        "draws": len(rows),
        "buffer_size": len(snapshot),
    }


def plot_curriculum(log: str | os.PathLike[str], output: str | os.PathLike[str]) -> str:
    """Write the PNG of each window's difficulty distribution; its path.
    Without matplotlib: BACKEND_UNAVAILABLE naming the extra to install."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UmlosError(errors.BACKEND_UNAVAILABLE, "plotting needs matplotlib: pip install 'umlos-cuda[plot]'",
                         operator=errors.STREAMS_OPERATOR) from None
    from ..window.log import read_log

    windows = read_log(log).windows
    names = sorted({d for w in windows for d in w["metrics"]["difficulty_distribution"]})
    figure, axis = plt.subplots(figsize=(7, 3.5))
    x = np.arange(len(windows))
    for name in names:
        axis.plot(x, [w["metrics"]["difficulty_distribution"].get(name, 0.0) for w in windows], label=name, marker=".")
    axis.set_xlabel("window")
    axis.set_ylabel("share of draws")
    axis.set_title("sampling distribution by difficulty")
    axis.legend(loc="best", fontsize="small")
    figure.tight_layout()
    output = os.fspath(output)
    figure.savefig(output, dpi=100)
    plt.close(figure)
    return output
