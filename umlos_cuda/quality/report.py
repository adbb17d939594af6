"""One run of the quality report: every candidate order measured on one dataset's labels.

:func:`run_report` computes, for each :class:`~.orders.Candidate`, epoch 0's
whole order and the five statistics of :mod:`.statistics` on it, plus the
first batch of epochs ``0 .. epochs - 1`` for the overlap; :func:`format_table`
prints the rows side by side, NumPy's permutation first, so every number has
its true-shuffle value in the same column. Each order is checked to be a
permutation of ``[0, N)`` before it is measured.

Memory is a few arrays of N: the order (int64), its labels, and temporaries of
the statistics; N = 10^7 needs about 0.5 GB.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import checks, errors
from ..errors import QUALITY_OPERATOR, UmlosError
from .labels import Labels
from .orders import Candidate, OrderSource
from .statistics import (ChiSquare, JumpStatistics, batch_class_tv, chi_square_independence, class_frequencies,
                         first_batch_overlap, jump_statistics, spearman_position_index)

#: Defaults of the command line (docs/sampling-modes.md).
DEFAULT_BATCH_SIZE = 1024
DEFAULT_BUCKETS = 16
DEFAULT_EPOCHS = 5
#: Level of the chi-square test: it passes when ``ALPHA <= p <= 1 - ALPHA`` (statistics.ChiSquare.passes).
ALPHA = 0.01
#: ``feistel`` is as well mixed as a true shuffle when its mean batch TV is
#: within this share of the permutation's (the acceptance bar of the mode).
TV_TOLERANCE = 0.05


@dataclass(frozen=True)
class QualityConfig:
    """What a run measures: global batch size, chi-square buckets, epochs for the overlap, seed, backend."""

    batch_size: int = DEFAULT_BATCH_SIZE
    buckets: int = DEFAULT_BUCKETS
    epochs: int = DEFAULT_EPOCHS
    seed: int = 0
    backend: str = "auto"
    alpha: float = ALPHA

    def check(self, n: int) -> None:
        """Refuse values that cannot measure anything on ``n`` samples (LABELS_INVALID / INVALID_ARGUMENT)."""
        for name, lowest in (("batch_size", 1), ("buckets", 2), ("epochs", 2), ("seed", 0)):
            checks.integer(getattr(self, name), name, lowest, None, message=checks.AT_LEAST, strict=True,
                           fail=checks.raising(errors.INVALID_ARGUMENT, operator=QUALITY_OPERATOR))
        if n < max(self.batch_size, self.buckets, 2):
            raise UmlosError(
                errors.LABELS_INVALID,
                f"{n} samples hold no full global batch of {self.batch_size} (and need at least "
                f"{max(self.buckets, 2)} for {self.buckets} buckets); label more samples or lower --batch-size",
                operator=QUALITY_OPERATOR,
            )


@dataclass(frozen=True)
class Row:
    """The measurements of one candidate (see :mod:`.statistics` for each)."""

    candidate: Candidate
    backend: str
    batch_tv: np.ndarray = field(repr=False)
    jumps: JumpStatistics
    spearman: float
    chi_square: ChiSquare
    overlap: np.ndarray
    order_seconds: float

    @property
    def label(self) -> str:
        return self.candidate.label

    @property
    def mean_tv(self) -> float:
        return float(self.batch_tv.mean())

    def to_dict(self, n: int) -> dict[str, Any]:
        return {
            "order": self.label,
            "mode": self.candidate.mode,
            "block_size": self.candidate.block_size,
            "backend": self.backend,
            "batch_tv_mean": self.mean_tv,
            "batch_tv_max": float(self.batch_tv.max()),
            "jump_median": self.jumps.median,
            "jump_median_over_n": self.jumps.median / n,
            "jump_mean_over_n": self.jumps.mean / n,
            "jump_ks": self.jumps.ks,
            "spearman": self.spearman,
            "chi_square": self.chi_square.statistic,
            "chi_square_dof": self.chi_square.dof,
            "chi_square_p": self.chi_square.p_value,
            "first_batch_overlap_mean": float(self.overlap.mean()),
            "order_seconds": self.order_seconds,
        }


@dataclass(frozen=True)
class QualityReport:
    labels: Labels = field(repr=False)
    config: QualityConfig
    rows: list[Row]

    @property
    def reference(self) -> Row:
        """The row of NumPy's permutation."""
        return next(row for row in self.rows if row.candidate.is_reference)

    def tv_ratio(self, row: Row) -> float:
        """``row``'s mean batch TV over the permutation's (1.0 = as well mixed)."""
        return row.mean_tv / self.reference.mean_tv

    def as_well_mixed(self, row: Row) -> bool:
        """Mean batch TV within :data:`TV_TOLERANCE` of the permutation's, and the chi-square test passed."""
        return abs(self.tv_ratio(row) - 1.0) <= TV_TOLERANCE and row.chi_square.passes(self.config.alpha)

    def to_dict(self) -> dict[str, Any]:
        n = self.labels.n
        return {
            "dataset": {"source": self.labels.source, "n": n, "classes": self.labels.num_classes},
            "config": {"batch_size": self.config.batch_size, "buckets": self.config.buckets,
                       "epochs": self.config.epochs, "seed": self.config.seed, "alpha": self.config.alpha},
            "random_first_batch_overlap": self.config.batch_size / n,
            "rows": [dict(row.to_dict(n), tv_vs_permutation=self.tv_ratio(row),
                          as_well_mixed=self.as_well_mixed(row)) for row in self.rows],
        }


def run_report(labels: Labels, candidates: Sequence[Candidate], config: QualityConfig = QualityConfig(),
               log: Callable[[str], None] | None = None) -> QualityReport:
    """Measure every candidate on ``labels`` (see the module docstring)."""
    config.check(labels.n)
    frequencies = class_frequencies(labels.ids, labels.num_classes)
    rows = [_measure(candidate, labels, frequencies, config, log) for candidate in candidates]
    if not any(row.candidate.is_reference for row in rows):
        raise UmlosError(errors.INVALID_ARGUMENT, "the candidates must include the permutation (the reference row)",
                         operator=QUALITY_OPERATOR)
    return QualityReport(labels, config, rows)


def _measure(candidate: Candidate, labels: Labels, frequencies: np.ndarray, config: QualityConfig, log) -> Row:
    n = labels.n
    source = OrderSource(candidate, n, config.batch_size, config.seed, config.backend)
    started = time.perf_counter()
    order = source.indices(0)
    seconds = time.perf_counter() - started
    _require_permutation(order, candidate)
    row = Row(
        candidate=candidate,
        backend=source.backend_name,
        batch_tv=batch_class_tv(labels.ids[order], config.batch_size, frequencies),
        jumps=jump_statistics(order),
        spearman=spearman_position_index(order),
        chi_square=chi_square_independence(order, config.buckets),
        overlap=first_batch_overlap(
            [order[: config.batch_size]] + [source.indices(e, config.batch_size) for e in range(1, config.epochs)]
        ),
        order_seconds=seconds,
    )
    if log is not None:
        log(f"{candidate.label}: mean batch TV {row.mean_tv:.3f} ({source.backend_name}, order in {seconds:.2f} s)")
    return row


def _require_permutation(order: np.ndarray, candidate: Candidate) -> None:
    """CONTRACT_VIOLATION unless ``order`` holds every index of ``[0, N)`` once (the statistics assume it)."""
    n = order.size
    seen = np.zeros(n, dtype=bool)
    inside = (order >= 0) & (order < n)
    seen[order[inside]] = True
    if not inside.all() or not seen.all():
        raise UmlosError(errors.CONTRACT_VIOLATION, f"the order of {candidate.label} is not a permutation of [0, {n})",
                         operator=QUALITY_OPERATOR)


def format_table(report: QualityReport) -> str:
    """The rows as a fixed-width text table, with a header saying what each column is."""
    n = report.labels.n
    config = report.config
    header = ("order", "backend", "batch TV", "vs perm", "jump med/N", "jump KS", "Spearman",
              f"chi2 (dof {(config.buckets - 1) ** 2})", "p", "overlap", "order s")
    lines = []
    for row in report.rows:
        chi = row.chi_square
        lines.append((
            row.label,
            row.backend,
            f"{row.mean_tv:.3f}",
            f"{report.tv_ratio(row):.2f}x",
            f"{row.jumps.median / n:.4f}",
            f"{row.jumps.ks:.3f}",
            f"{row.spearman:+.4f}",
            f"{chi.statistic:.4g}",
            f"{_p_value(chi.p_value)} {'pass' if chi.passes(config.alpha) else 'FAIL'}",
            f"{row.overlap.mean():.4f}",
            f"{row.order_seconds:.2f}",
        ))
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header))]
    text = ["  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths)))
            for line in [header, *lines]]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(text)


def _p_value(p: float) -> str:
    return "0 (<1e-300)" if p == 0.0 else f"{p:.3g}"


def describe(report: QualityReport) -> str:
    """What the run measured and how to read the columns (printed above the table)."""
    n, config = report.labels.n, report.config
    return "\n".join((
        f"dataset: {report.labels.source}, "
        f"global batch {config.batch_size:,}, seed {config.seed}",
        "batch TV: mean total-variation distance of a batch's class mix from the dataset's (0 = same mix); "
        "vs perm: over the permutation's",
        f"jump: |index(p+1) - index(p)|, median / N (random: {1 - 2 ** -0.5:.4f}) and KS distance from a random "
        f"permutation's jumps (0 = same)",
        f"Spearman: rank correlation of position and index (random: 0); chi2: position bucket x index bucket, "
        f"{config.buckets} x {config.buckets}, passes when {config.alpha} <= p <= {1 - config.alpha}",
        f"overlap: share of epoch e's first batch in epoch e+1's, mean over {config.epochs - 1} pairs "
        f"(random: {config.batch_size / n:.2g})",
    ))
