"""What a window's curriculum did: the metrics logged with each window, and a plot.

Per window (computed on the window's snapshot and the rows its policy drew):

- ``success_rate_by_difficulty``: per difficulty, the share of the
  snapshot's samples with a known outcome whose episode was solved;
- ``replay_hit_rate``: the share of the window's draws whose sample had
  been drawn by an earlier window (its draw count was above 0);
- ``difficulty_distribution``: per difficulty, the share of the window's
  draws (the sampling distribution the curriculum produced).

:func:`plot_curriculum` draws ``difficulty_distribution`` window after
window from a window log into a PNG (matplotlib, the ``plot`` extra): a
stacked bar per window (:func:`curriculum_figure`).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ... import errors
from ...errors import UmlosError
from ..buffer.snapshot import BufferSnapshot
from ..types import DIFFICULTY_ORDER

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
    from ..window.log import read_log

    plt = _pyplot()
    figure = curriculum_figure(read_log(log).windows)
    output = os.fspath(output)
    figure.savefig(output, dpi=100)
    plt.close(figure)
    return output


def curriculum_figure(windows: list[dict]) -> Any:
    """The figure :func:`plot_curriculum` saves: one stacked bar per window.

    Stacked bars, not lines: the shares of a window add up to 1, so two
    difficulties drawn with the same share would hide one line under the
    other, while stacked segments each keep their own area, color and
    hatch. Windows are whole numbers on the x axis (the log's window
    index), never 0.5 or 1.5."""
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    shares = [w["metrics"]["difficulty_distribution"] for w in windows]
    def order(name: str) -> tuple[int, str]:  # easiest at the bottom of each bar; unknown names last
        return (DIFFICULTY_ORDER.index(name) if name in DIFFICULTY_ORDER else len(DIFFICULTY_ORDER), name)

    names = sorted({d for share in shares for d in share}, key=order)
    x = np.array([w.get("window", i) for i, w in enumerate(windows)], dtype=np.int64)
    figure, axis = plt.subplots(figsize=(7, 3.5))
    bottom = np.zeros(len(windows))
    colors = plt.get_cmap("viridis")(np.linspace(0.1, 0.9, max(len(names), 1)))
    for k, name in enumerate(names):
        height = np.array([share.get(name, 0.0) for share in shares])
        axis.bar(x, height, bottom=bottom, width=0.8, label=name, color=colors[k], edgecolor="black", linewidth=0.5,
                 hatch=_HATCHES[k % len(_HATCHES)])
        bottom += height
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    if len(x):
        axis.set_xlim(x.min() - 0.6, x.max() + 0.6)
    axis.set_ylim(0, 1)
    axis.set_xlabel("window")
    axis.set_ylabel("share of draws")
    axis.set_title("sampling distribution by difficulty")
    axis.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small")
    figure.tight_layout()
    return figure


#: Hatches that tell stacked segments apart in grey print too.
_HATCHES = ("", "//", "..", "xx", "\\\\", "oo", "--")


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UmlosError(errors.BACKEND_UNAVAILABLE, "plotting needs matplotlib: pip install 'umlos-cuda[plot]'",
                         operator=errors.STREAMS_OPERATOR) from None
    return plt
