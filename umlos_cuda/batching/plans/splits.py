"""Train/validation splits that stay put when data is appended.

What goes in: the sample ids of a dataset (the length cache's ids, or the
row numbers ``"0"``, ``"1"``, ... when it has none, as a plan names its
samples) and a :class:`SplitConfig`. What comes out: which rows are on
the chosen side (a boolean mask), decided for each sample from its own id
and the split seed alone:

    u(id) = the first 8 bytes, little-endian, of BLAKE2b(UTF-8 of id,
            key = seed as 8 little-endian bytes, person = b"umlos-split-v1",
            digest_size = 8)
    the sample is in validation  iff  u(id) < floor(validation_fraction x 2^64)

Since nothing else enters, appending rows never moves an existing sample
from one side to the other, and the two sides of one seed and fraction are
disjoint and together cover every sample. With row numbers for ids this
holds for rows appended at the end only: inserting, removing or reordering
rows renumbers the rows after them, hence their ids and their side (give
the records ids, ``--id-field``, to be free of that).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ... import checks
from .buckets import config_error

#: The sides a plan may take.
SPLIT_SIDES = ("train", "validation")
#: BLAKE2b's personalisation of the split hash (versioned: another rule would be another tag).
SPLIT_PERSON = b"umlos-split-v1"
#: The keys of a stored :class:`SplitConfig` (meta.json ``split``).
_STORED = dict.fromkeys(("side", "validation_fraction", "seed"), checks.field(checks.anything))
_SHAPE = "a plan's split is {{side, validation_fraction, seed}}, got {value!r}"


@dataclass(frozen=True, slots=True)
class SplitConfig:
    """One side of a train/validation split (checked on construction).

    Args:
        side: ``"train"`` or ``"validation"``, the samples the plan takes.
        validation_fraction: in (0, 1): the expected share of validation samples.
        seed: the split seed (uint64), independent of the plan seed, so
            plans with other seeds or epochs share one split.
    """

    side: str
    validation_fraction: float
    seed: int = 0

    def __post_init__(self) -> None:
        checks.choice(self.side, "split side", SPLIT_SIDES, fail=config_error)
        fraction = checks.number(self.validation_fraction, "validation_fraction", above=0.0, below=1.0,
                                 fail=config_error,
                                 message="{name} must be a number in (0, 1) (exclusive), got {value!r}")
        object.__setattr__(self, "validation_fraction", fraction)
        object.__setattr__(self, "seed", checks.uint64(self.seed, "split seed", fail=config_error))

    @property
    def threshold(self) -> int:
        """``floor(validation_fraction x 2^64)`` (exact: scaling a float by 2^64 rounds nothing)."""
        return int(self.validation_fraction * 2.0 ** 64)

    def to_dict(self) -> dict:
        return {"side": self.side, "validation_fraction": self.validation_fraction, "seed": self.seed}

    @classmethod
    def from_dict(cls, data) -> SplitConfig:
        data = checks.record(data, _STORED, fail=config_error, not_a_map=_SHAPE, unknown=_SHAPE, missing=_SHAPE)
        return cls(data["side"], data["validation_fraction"], data["seed"])


def split_hash(sample_id: str, seed: int) -> int:
    """``u(id)`` of the module docstring."""
    digest = hashlib.blake2b(sample_id.encode("utf-8"), digest_size=8, key=int(seed).to_bytes(8, "little"),
                             person=SPLIT_PERSON)
    return int.from_bytes(digest.digest(), "little")


def validation_mask(sample_ids: Sequence[str] | None, n: int, fraction: float, seed: int) -> np.ndarray:
    """True for each of the ``n`` samples in validation (``sample_ids`` None: ids are row numbers)."""
    key = int(seed).to_bytes(8, "little")
    ids = (str(r) for r in range(n)) if sample_ids is None else sample_ids
    blake2b = hashlib.blake2b
    raw = b"".join(blake2b(i.encode("utf-8"), digest_size=8, key=key, person=SPLIT_PERSON).digest() for i in ids)
    hashes = np.frombuffer(raw, dtype="<u8")
    return hashes < np.uint64(SplitConfig("train", fraction, seed).threshold)


def selected_rows(sample_ids: Sequence[str] | None, n: int, split: SplitConfig | None) -> np.ndarray:
    """The rows (int64, ascending) on ``split``'s side; every row when ``split`` is None."""
    if split is None:
        return np.arange(n, dtype=np.int64)
    validation = validation_mask(sample_ids, n, split.validation_fraction, split.seed)
    return np.flatnonzero(validation if split.side == "validation" else ~validation).astype(np.int64)
