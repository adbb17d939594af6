"""Length buckets: which bucket a sample of a given length belongs to.

What goes in: bucket edges (strictly ascending) and ``overflow_max``; lengths
as a NumPy array. What comes out: one bucket id per length (``int16``; -1 for
a sample the plan skips), in one vectorised ``searchsorted``, never a Python
loop per sample.

Bucket ``k < len(edges)`` holds lengths in ``(edges[k-1], edges[k]]`` (the
first from ``min_length``) and pads to ``edges[k]``; the overflow bucket
``len(edges)`` holds ``(edges[-1], overflow_max]`` and pads to
``overflow_max``. A length below ``min_length`` (an empty sample) or above
``overflow_max`` is skipped: the plan counts and lists it, never drops it
silently.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ... import checks, errors
from ...errors import UmlosError

#: Bucket id of a skipped sample.
SKIPPED = -1
#: Bucket ids are int16; more buckets than this make no sense for padding.
MAX_BUCKETS = 1024
#: Lengths are uint32 in the length cache.
MAX_LENGTH = (1 << 32) - 1
#: ``bucket_ids`` uses a lookup table up to this ``overflow_max`` (int16 entries: 8 MiB at most).
TABLE_MAX = 1 << 22


@functools.lru_cache(maxsize=16)
def _bucket_table(edges: tuple[int, ...], overflow_max: int, min_length: int) -> np.ndarray:
    """Bucket id of every length 0 .. overflow_max + 1 (the last stands for all longer ones)."""
    table = np.searchsorted(np.asarray(edges, dtype=np.int64), np.arange(overflow_max + 2),
                            side="left").astype(np.int16)
    table[:min_length] = SKIPPED
    table[overflow_max + 1] = SKIPPED
    table.flags.writeable = False
    return table


def config_error(message: str) -> UmlosError:
    return UmlosError(errors.BATCHING_CONFIG_INVALID, message, operator=errors.BATCH_PLAN_OPERATOR)


@dataclass(frozen=True, slots=True)
class BucketSpec:
    """Bucket edges and the longest accepted length (validated on construction).

    Args:
        edges: strictly ascending positive lengths, e.g. ``(128, 256, 512, 1024)``;
            may be empty (one bucket up to ``overflow_max``).
        overflow_max: the overflow bucket's pad length; longer samples are skipped.
            Must exceed the last edge.
        min_length: shorter samples (by default: empty ones) are skipped.
    """

    edges: tuple[int, ...]
    overflow_max: int
    min_length: int = 1

    def __post_init__(self) -> None:
        checks.sequence(self.edges, "edges", iterable=True, fail=config_error,
                        message="{name} must be a sequence of integers, got {value!r}")
        edges = tuple(checks.integer(e, "each bucket edge", 1, MAX_LENGTH - 1, fail=config_error) for e in self.edges)
        if len(edges) >= MAX_BUCKETS:
            raise config_error(f"at most {MAX_BUCKETS - 1} edges, got {len(edges)}")
        for i in range(1, len(edges)):
            if edges[i] <= edges[i - 1]:
                raise config_error(f"edges must be strictly ascending, got {edges[i - 1]} then {edges[i]}")
        overflow_max = checks.integer(self.overflow_max, "overflow_max", 1, MAX_LENGTH, fail=config_error)
        if edges and overflow_max <= edges[-1]:
            raise config_error(f"overflow_max must exceed the last edge {edges[-1]}, got {overflow_max}")
        min_length = checks.integer(self.min_length, "min_length", 0, overflow_max, fail=config_error)
        object.__setattr__(self, "edges", edges)
        object.__setattr__(self, "overflow_max", overflow_max)
        object.__setattr__(self, "min_length", min_length)

    @property
    def num_buckets(self) -> int:
        """Buckets, the overflow bucket included."""
        return len(self.edges) + 1

    @property
    def max_lengths(self) -> np.ndarray:
        """Pad length of each bucket (uint32, ``num_buckets`` entries)."""
        return np.asarray(self.edges + (self.overflow_max,), dtype=np.uint32)

    def bucket_max_length(self, bucket_id: int) -> int:
        bucket_id = checks.integer(bucket_id, "bucket_id", 0, self.num_buckets - 1, fail=config_error)
        return int(self.max_lengths[bucket_id])

    def bucket_range(self, bucket_id: int) -> tuple[int, int]:
        """Inclusive ``(shortest, longest)`` length of a bucket."""
        bucket_id = checks.integer(bucket_id, "bucket_id", 0, self.num_buckets - 1, fail=config_error)
        low = self.min_length if bucket_id == 0 else self.edges[bucket_id - 1] + 1
        return max(low, self.min_length), self.bucket_max_length(bucket_id)

    def get_bucket_id(self, length: int) -> int:
        """The bucket of one length (-1 when skipped); see :meth:`bucket_ids`."""
        length = checks.integer(length, "length", 0, MAX_LENGTH, fail=config_error)
        return int(self.bucket_ids(np.asarray([length], dtype=np.uint32))[0])

    def bucket_ids(self, lengths: np.ndarray) -> np.ndarray:
        """Bucket id of each length (``int16``, -1 where the sample is skipped).

        A lookup table indexed by length (``overflow_max + 2`` entries, the
        last for every longer length) when ``overflow_max`` is at most
        :data:`TABLE_MAX` (one gather, about ten times faster than a binary
        search per sample); a ``searchsorted`` otherwise."""
        lengths = np.asarray(lengths)
        if lengths.dtype.kind not in "iu":
            raise config_error(f"lengths must be an integer array, got dtype {lengths.dtype}")
        if self.overflow_max <= TABLE_MAX:
            table = _bucket_table(self.edges, self.overflow_max, self.min_length)
            if lengths.dtype.kind == "i":
                lengths = np.maximum(lengths, 0)
            return table[np.minimum(lengths, self.overflow_max + 1)]
        ids = np.searchsorted(np.asarray(self.edges, dtype=np.int64), lengths, side="left").astype(np.int16)
        ids[(lengths > self.overflow_max) | (lengths < self.min_length)] = SKIPPED
        return ids

    def groups(self, lengths: np.ndarray) -> tuple[int, list[tuple[int, np.ndarray]]]:
        """The number of skipped samples of ``lengths`` and ``(bucket, its lengths in the given order)`` for each
        bucket that holds some, in bucket order (a stable sort by bucket id: what a window's counts read)."""
        buckets = self.bucket_ids(lengths)
        sizes = np.bincount(buckets.astype(np.int64) + 1, minlength=self.num_buckets + 1)
        bases = np.cumsum(sizes)  # skipped rows sort first (bucket -1), then bucket by bucket
        grouped = np.asarray(lengths)[np.argsort(buckets, kind="stable")]  # a radix sort: each bucket keeps its order
        return int(sizes[0]), [(k, grouped[bases[k]:bases[k + 1]]) for k in range(self.num_buckets) if sizes[k + 1]]

    def to_dict(self) -> dict:
        return {"edges": list(self.edges), "overflow_max": self.overflow_max, "min_length": self.min_length}

    @classmethod
    def default(cls) -> BucketSpec:
        """The default: edges 128, 256, 512, 1024 and overflow 2048."""
        return cls((128, 256, 512, 1024), 2048)
