"""Over-long samples: what a plan does with a sample longer than ``max_length`` tokens.

What goes in: the lengths of the samples a plan takes and an
:class:`OverlongConfig` (``max_length`` L and a policy). What comes out:
the pieces the plan orders, as arrays: which sample each piece comes
from, its piece number and its token range ``[start, stop)`` in the
sample. A sample of ``n <= L`` tokens is one piece ``[0, n)`` under every
policy; a longer one is, by policy (docs/batching.md, "Over-long samples
and splits"):

* ``truncate_right``: one piece ``[0, L)``, its first L tokens;
* ``truncate_left``: one piece ``[n - L, n)``, its last L tokens;
* ``split``: pieces ``k = 0 .. ceil(n / L) - 1``, piece ``k`` being
  ``[k L, min((k + 1) L, n))``; the last piece is kept even when it is
  shorter (it holds the sample's last tokens); every piece keeps its
  sample's id and its piece number ``k``;
* ``skip``: no piece; the sample is left out of every epoch.

Every policy is counted (:func:`overlong_counts`): the over-long samples,
the pieces they became and the tokens lost. A plan with no
:class:`OverlongConfig` (the default) keeps the behaviour plans always had,
so their bytes and fingerprints stay: a sample longer than the bucket
spec's ``overflow_max`` is skipped by the buckets and listed in the
epoch's ``skipped``; :func:`default_overlong_counts` counts those for
``plan build`` and ``plan info``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from ... import checks
from .buckets import MAX_LENGTH, config_error


class OverlongPolicy(str, enum.Enum):
    """What a plan does with a sample longer than ``max_length``."""

    TRUNCATE_RIGHT = "truncate_right"  # keep the first max_length tokens
    TRUNCATE_LEFT = "truncate_left"  # keep the last max_length tokens
    SPLIT = "split"  # pieces of max_length tokens, the last shorter, each with its piece number
    SKIP = "skip"  # leave the sample out, counted

    @classmethod
    def parse(cls, value) -> OverlongPolicy:
        if isinstance(value, cls):
            return value
        for policy in cls:
            if value == policy.value:
                return policy
        raise config_error(f"overlong policy must be one of {', '.join(p.value for p in cls)}, got {value!r}")


#: The keys of a stored :class:`OverlongConfig` (meta.json ``overlong``).
_STORED = {"max_length": checks.field(checks.anything), "policy": checks.field(checks.anything)}
_SHAPE = "a plan's overlong is {{max_length, policy}}, got {value!r}"


@dataclass(frozen=True, slots=True)
class OverlongConfig:
    """``max_length`` (tokens, >= 1) and the :class:`OverlongPolicy` for longer samples.

    Default policy: ``truncate_right`` (what tokenizers' ``truncation=True``
    does). A plan holding one must have ``max_length <= overflow_max``, so
    that every piece fits a bucket (:class:`~.config.BatchingConfig` checks it).
    """

    max_length: int
    policy: OverlongPolicy = OverlongPolicy.TRUNCATE_RIGHT

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_length", checks.integer(self.max_length, "max_length", 1, MAX_LENGTH,
                                                              fail=config_error))
        object.__setattr__(self, "policy", OverlongPolicy.parse(self.policy))

    @property
    def cuts(self) -> bool:
        """True when the plan takes token ranges of samples (a truncation or ``split``), not whole samples."""
        return self.policy is not OverlongPolicy.SKIP

    def to_dict(self) -> dict:
        return {"max_length": self.max_length, "policy": self.policy.value}

    @classmethod
    def from_dict(cls, data) -> OverlongConfig:
        data = checks.record(data, _STORED, fail=config_error, not_a_map=_SHAPE, unknown=_SHAPE, missing=_SHAPE)
        return cls(data["max_length"], data["policy"])


def piece_counts(lengths: np.ndarray, config: OverlongConfig) -> np.ndarray:
    """Pieces of each sample (int64): 1, or ``ceil(n / L)`` for ``split``, 0 for ``skip``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    length = config.max_length
    if config.policy is OverlongPolicy.SPLIT:
        return np.maximum(-(-lengths // length), 1)
    if config.policy is OverlongPolicy.SKIP:
        return (lengths <= length).astype(np.int64)
    return np.ones(lengths.shape[0], dtype=np.int64)


def pieces(lengths: np.ndarray, config: OverlongConfig | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(sample, piece, start, stop)`` of every piece (int64 arrays), sample by sample, pieces in order.

    ``sample`` indexes ``lengths``; ``None`` for ``config`` gives one whole piece per sample."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if config is None:
        index = np.arange(lengths.shape[0], dtype=np.int64)
        return index, np.zeros_like(index), np.zeros_like(index), lengths.copy()
    counts = piece_counts(lengths, config)
    sample = np.repeat(np.arange(lengths.shape[0], dtype=np.int64), counts)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    piece = np.arange(sample.shape[0], dtype=np.int64) - first
    n, length = lengths[sample], config.max_length
    if config.policy is OverlongPolicy.SPLIT:
        start = piece * length
        return sample, piece, start, np.minimum(start + length, n)
    if config.policy is OverlongPolicy.TRUNCATE_LEFT:
        return sample, piece, np.maximum(n - length, 0), n
    if config.policy is OverlongPolicy.TRUNCATE_RIGHT:
        return sample, piece, np.zeros_like(n), np.minimum(n, length)
    return sample, piece, np.zeros_like(n), n  # skip: the samples kept are whole


def overlong_counts(lengths: np.ndarray, config: OverlongConfig) -> dict:
    """What the policy did to ``lengths``: ``policy``, ``max_length``, ``samples``
    (over-long ones), ``pieces`` (what they became: their pieces under split,
    1 each when truncated, 0 when skipped) and ``tokens_lost`` (cut off by a
    truncation, or every token of a skipped sample; 0 under split)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    over = lengths[lengths > config.max_length]
    kept = piece_counts(over, config)
    lost = 0 if config.policy is OverlongPolicy.SPLIT else int(over.sum()) - int(
        np.minimum(over, config.max_length).sum() if config.policy is not OverlongPolicy.SKIP else 0)
    return {"policy": config.policy.value, "max_length": config.max_length, "samples": int(over.shape[0]),
            "pieces": int(kept.sum()), "tokens_lost": lost}


def default_overlong_counts(lengths: np.ndarray, overflow_max: int) -> dict:
    """:func:`overlong_counts` of a plan without an over-long policy: the
    samples above ``overflow_max`` that the buckets skip (policy ``skip``)."""
    return overlong_counts(lengths, OverlongConfig(overflow_max, OverlongPolicy.SKIP))
