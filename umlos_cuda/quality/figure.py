"""The quality report as a PNG: one panel per statistic, one colour per order.

Drawn with matplotlib's object interface (``Figure`` and the Agg canvas), so
it never touches pyplot's global state or needs a display. matplotlib is an
optional dependency (the ``plot`` extra): :func:`matplotlib_missing` says why
it cannot be imported, and the command line then prints the table only.
"""

from __future__ import annotations

import io
import os

import numpy as np

from ..files.atomic import atomic_output
from .report import QualityReport, Row
from .statistics import JumpStatistics, random_jump_cdf

#: Batches averaged per point of the "TV along the epoch" panel: about 200 points.
_POINTS = 200


def matplotlib_missing() -> str | None:
    """None when matplotlib can be imported, else the reason and the install command."""
    try:
        import matplotlib  # noqa: F401 - imported only to see whether it imports
    except ImportError as exc:
        return f"matplotlib is not installed ({exc}); pip install 'umlos-cuda[plot]' for the figure"
    return None


def render_png(report: QualityReport) -> bytes:
    """The figure's PNG bytes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(16, 9.5), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(2, 3)
    rows = report.rows
    colours = _colours(rows)
    labels = [row.label for row in rows]
    n, config = report.labels.n, report.config
    figure.suptitle(f"Mixing quality: {report.labels.source}; global batch {config.batch_size:,}, seed {config.seed}")
    _bars(axes[0, 0], labels, [row.mean_tv for row in rows], colours,
          "mean batch class-mix TV\n(0 = the dataset's mix)", reference=report.reference.mean_tv)
    _tv_along_epoch(axes[0, 1], rows, colours)
    _jumps(axes[0, 2], rows, colours, n)
    _bars(axes[1, 0], labels, [row.spearman for row in rows], colours,
          "Spearman correlation of position and index\n(random: 0)", reference=0.0)
    _chi_square(axes[1, 1], rows, labels, colours, config.alpha)
    _bars(axes[1, 2], labels, [float(row.overlap.mean()) for row in rows], colours,
          f"overlap of consecutive epochs' first batches\n(random: B/N = {config.batch_size / n:.2g})",
          reference=config.batch_size / n)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def write_png(report: QualityReport, path: str | os.PathLike[str], *, force: bool = False) -> None:
    """Render the figure and write it to ``path`` atomically (``umlos_cuda.files.atomic``'s rules)."""
    data = render_png(report)
    with atomic_output(path, force=force, size=len(data)) as handle:
        handle.write(data)


def _colours(rows: list[Row]) -> list:
    from matplotlib import colormaps

    cycle = colormaps["tab10"].colors
    others = iter(range(len(rows)))
    return ["black" if row.candidate.is_reference else cycle[next(others) % len(cycle)] for row in rows]


def _bars(ax, labels, values, colours, title, *, reference=None, notes=None) -> None:
    positions = np.arange(len(labels))
    ax.barh(positions, values, color=colours)
    ax.set_yticks(positions, labels)
    ax.invert_yaxis()
    if reference is not None:
        ax.axvline(reference, color="black", linestyle="--", linewidth=1)
    ax.set_title(title, fontsize=10)
    notes = notes or [f"{value:.3g}" for value in values]
    for y, value, note in zip(positions, values, notes):
        ax.annotate(note, (value, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)


def _tv_along_epoch(ax, rows: list[Row], colours) -> None:
    for row, colour in zip(rows, colours):
        tv = row.batch_tv
        width = max(1, tv.size // _POINTS)
        points = tv[: tv.size // width * width].reshape(-1, width).mean(axis=1)
        ax.plot(np.arange(points.size) * width, points, color=colour, label=row.label, linewidth=1)
    ax.set_xlabel("global batch of epoch 0")
    ax.set_ylim(0, 1)
    ax.set_title("batch class-mix TV along the epoch", fontsize=10)
    ax.legend(fontsize=7, loc="best")


def _jumps(ax, rows: list[Row], colours, n: int) -> None:
    levels = JumpStatistics.QUANTILE_LEVELS
    for row, colour in zip(rows, colours):
        ax.step(np.maximum(row.jumps.quantiles, 1) / n, levels, where="post", color=colour, label=row.label,
                linewidth=1)
    x = np.logspace(np.log10(1.0 / n), 0, 200)
    ax.plot(x, random_jump_cdf(x * n, n), color="grey", linestyle=":", label="random (exact)")
    ax.set_xscale("log")
    ax.set_xlabel("|index(p+1) - index(p)| / N")
    ax.set_ylabel("CDF")
    ax.set_title("distribution of consecutive jumps", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")


def _chi_square(ax, rows: list[Row], labels, colours, alpha: float) -> None:
    dof = rows[0].chi_square.dof
    ratios = [max(row.chi_square.statistic / dof, 1e-6) for row in rows]
    notes = [f"{ratio:.3g}  p = {row.chi_square.p_value:.2g} {'pass' if row.chi_square.passes(alpha) else 'FAIL'}"
             for ratio, row in zip(ratios, rows)]
    _bars(ax, labels, ratios, colours, "chi-square / dof, position x index buckets\n(random: about 1)",
          reference=1.0, notes=notes)
    ax.set_xscale("log")
    ax.set_xlim(right=max(ratios) * 1e3)  # room for the notes
