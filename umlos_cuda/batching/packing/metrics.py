"""How well a packing fills its rows (:class:`PackingMetrics`).

``capacity`` is ``rows x max_length``. ``packing_efficiency`` is the share
of it the rows use (sequence and separator tokens; the rest is padding),
``loss_token_efficiency`` the share that is trained on (None when the loss
masks are not known, as in plans built from lengths). ``lower_bound_rows``
is ``ceil(tokens / max_length)``: no packing of these tokens needs fewer
rows. The oversize counts say what happened to sequences longer than
``max_length`` (``OversizePolicy``): skipped ones are also listed by id.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PackingMetrics:
    max_length: int
    sequences: int  # sequences given (before oversize handling)
    segments: int  # segments in the rows (a split sequence counts once per piece)
    rows: int
    tokens: int  # sequence tokens in the rows (separators not counted)
    separator_tokens: int = 0
    loss_tokens: int | None = None
    skipped: int = 0
    truncated: int = 0
    truncated_tokens: int = 0  # tokens cut off by truncation
    split: int = 0  # sequences split into pieces
    skipped_ids: tuple[str, ...] = ()

    @property
    def capacity(self) -> int:
        return self.rows * self.max_length

    @property
    def padding_tokens(self) -> int:
        return self.capacity - self.tokens - self.separator_tokens

    @property
    def packing_efficiency(self) -> float:
        """Tokens used / capacity."""
        return (self.tokens + self.separator_tokens) / self.capacity if self.capacity else 0.0

    @property
    def loss_token_efficiency(self) -> float | None:
        if self.loss_tokens is None:
            return None
        return self.loss_tokens / self.capacity if self.capacity else 0.0

    @property
    def segments_per_row(self) -> float:
        return self.segments / self.rows if self.rows else 0.0

    @property
    def lower_bound_rows(self) -> int:
        return -(-self.tokens // self.max_length)

    def to_dict(self) -> dict:
        """Plain data, as stats.json and ``plan info --json`` hold it (ratios rounded to 9 digits)."""
        loss = self.loss_token_efficiency
        return {
            "max_length": self.max_length, "sequences": self.sequences, "segments": self.segments,
            "rows": self.rows, "lower_bound_rows": self.lower_bound_rows, "tokens": self.tokens,
            "separator_tokens": self.separator_tokens, "padding_tokens": self.padding_tokens,
            "loss_tokens": self.loss_tokens, "packing_efficiency": round(self.packing_efficiency, 9),
            "loss_token_efficiency": None if loss is None else round(loss, 9),
            "segments_per_row": round(self.segments_per_row, 9), "skipped": self.skipped,
            "truncated": self.truncated, "truncated_tokens": self.truncated_tokens, "split": self.split,
            "skipped_ids": list(self.skipped_ids),
        }


def compute_packing_metrics(packed_rows: Sequence, max_length: int, **counts) -> PackingMetrics:
    """Metrics of a list of :class:`~umlos_cuda.batching.packing.rows.PackedRow`."""
    segments = sum(r.num_segments for r in packed_rows)
    separators = sum(r.separator_tokens for r in packed_rows)
    tokens = sum(r.length for r in packed_rows) - separators
    sequences = counts.pop("sequences", segments)
    return PackingMetrics(max_length, sequences, segments, len(packed_rows), tokens, separators,
                          sum(r.loss_tokens for r in packed_rows), **counts)
