"""Collation for DPO-style losses: preference pairs as chosen and rejected arrays aligned by index.

What goes in: preference pairs, each a chosen and a rejected row (any row
:func:`~umlos_cuda.batching.collate.default_collate` takes, or a
:class:`~umlos_cuda.batching.samples.PreferenceSample`), or the collated
microbatch of a plan of pairs, whose rows alternate chosen, rejected
(``plan build`` over a pair cache, umlos_cuda/batching/plans/groups.py; a
batch file of such a plan holds the same rows). What comes out: a
:class:`PreferenceBatch`, two :class:`~umlos_cuda.batching.collate.CollatedBatch`
of ``[pairs, width]`` int32 arrays where row ``i`` of ``chosen`` and row
``i`` of ``rejected`` are one pair:

* ``chosen_input_ids``, ``rejected_input_ids``: the tokens, ``pad_id`` at padding;
* ``chosen_labels``, ``rejected_labels``: shifted as all collation here
  (``labels[b, t] = input_ids[b, t + 1]`` where token ``t + 1`` is trained
  on, else -100): -100 over the prompt and at padding, so the sum of
  ``log_softmax(logits)[b, t, labels[b, t]]`` over ``labels != -100`` is
  the completion's log-probability, with no further shift (TRL's DPO
  collator gives unshifted labels and shifts them in the loss instead);
* ``*_loss_mask`` (1 on the completion and its end token), ``*_attention_mask``,
  ``*_segment_ids``, ``*_position_ids``, as in collation.

Both sides share one width, as TRL's ``concatenated_inputs`` pads them, so
:meth:`PreferenceBatch.concatenated` stacks them into one forward pass
(chosen rows first). The rows are exactly those ``default_collate`` makes of
the pairs' rows in the order chosen, rejected, chosen, ...: collation is
that one call, then a split by even and odd row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .collate import FIELDS, CollatedBatch, collate_error, collate_microbatch, default_collate
from .lengths.pairs import CHOSEN_SUFFIX, PAIR_ROWS, REJECTED_SUFFIX
from .plans.config import PadPolicy
from .samples import PreferenceSample

#: The two sides of a pair, in row order.
SIDES = ("chosen", "rejected")
#: The arrays of :meth:`PreferenceBatch.as_dict`: each side's collation fields.
PREFERENCE_FIELDS = tuple(f"{side}_{name}" for side in SIDES for name in FIELDS)


@dataclass(frozen=True)
class PreferenceBatch:
    """Chosen and rejected rows of the same pairs (see the module docstring)."""

    chosen: CollatedBatch
    rejected: CollatedBatch

    @property
    def num_pairs(self) -> int:
        return int(self.chosen.input_ids.shape[0])

    def as_dict(self) -> dict[str, np.ndarray]:
        """``{"chosen_input_ids": ..., "rejected_labels": ..., ...}`` (:data:`PREFERENCE_FIELDS`)."""
        return {f"{side}_{name}": array for side in SIDES for name, array in getattr(self, side).as_dict().items()}

    def concatenated(self) -> CollatedBatch:
        """One batch of ``2 x pairs`` rows, every chosen row then every rejected row."""
        return CollatedBatch(**{name: np.concatenate((getattr(self.chosen, name), getattr(self.rejected, name)))
                                for name in FIELDS})


def collate_preference(pairs: Sequence[Any], max_len: int | None = None,
                       pad_policy: PadPolicy | str = PadPolicy.PAD_TO_MAX_IN_BATCH, *,
                       pad_id: int = 0) -> PreferenceBatch:
    """Collate preference ``pairs``: each a :class:`PreferenceSample` or a ``(chosen, rejected)``
    pair of rows. ``max_len`` and ``pad_policy`` are those of ``default_collate``, over all rows."""
    rows: list[Any] = []
    for index, pair in enumerate(pairs if isinstance(pairs, Sequence) else ()):
        if isinstance(pair, PreferenceSample):
            rows.extend((pair.chosen(), pair.rejected()))
        elif isinstance(pair, (tuple, list)) and len(pair) == PAIR_ROWS:
            rows.extend(pair)
        else:
            raise collate_error(f"pair {index} is {type(pair).__name__}; a pair is a PreferenceSample or a "
                                "(chosen, rejected) pair of rows")
    if not rows:
        raise collate_error(f"pairs must be a non-empty sequence of preference pairs, got {type(pairs).__name__}")
    return split_pairs(default_collate(rows, max_len, pad_policy, pad_id=pad_id))


def split_pairs(batch: CollatedBatch) -> PreferenceBatch:
    """A collated batch whose rows alternate chosen, rejected (a plan of pairs' microbatch, or its
    batch file) as a :class:`PreferenceBatch`. A packed batch holds its pairs inside rows (segments
    ``2k`` and ``2k + 1`` of a row are one pair) and is refused: it has no row per side."""
    rows = int(batch.input_ids.shape[0])
    if rows % PAIR_ROWS:
        raise collate_error(f"a batch of preference pairs holds an even number of rows (chosen, rejected, ...); "
                            f"this one holds {rows}")
    if int(np.asarray(batch.segment_ids).max(initial=0)) > 0:
        raise collate_error("a packed batch keeps each pair inside one packed row (segments 2k and 2k + 1): it "
                            "cannot be split into chosen and rejected rows; read its segments instead")
    return PreferenceBatch(*(CollatedBatch(**{name: np.ascontiguousarray(getattr(batch, name)[side::PAIR_ROWS])
                                              for name in FIELDS}) for side in range(PAIR_ROWS)))


def collate_preference_microbatch(source: Any, microbatch: Any, *, pad_id: int = 0) -> PreferenceBatch:
    """A microbatch of a plan of pairs collated from its token source (``collate_microbatch``,
    padded to the microbatch's ``max_len``) and split into chosen and rejected rows.
    COLLATE_INPUT_INVALID when its samples are not pairs, chosen then rejected."""
    if getattr(microbatch, "packs", None) is not None:
        raise collate_error(f"microbatch {getattr(microbatch, 'index', '?')} is packed: its pairs sit inside packed "
                            "rows (segments 2k and 2k + 1); collate it with collate_microbatch")
    ids = tuple(microbatch.samples)
    for k in range(0, len(ids) - 1, PAIR_ROWS):
        good, bad = ids[k], ids[k + 1]
        if not (good.endswith(CHOSEN_SUFFIX) and bad == good[:-len(CHOSEN_SUFFIX)] + REJECTED_SUFFIX):
            raise collate_error(f"microbatch {getattr(microbatch, 'index', '?')} holds {good!r} then {bad!r}, not a "
                                "preference pair X/chosen, X/rejected; build the plan from a length cache of pairs")
    if len(ids) % PAIR_ROWS:
        raise collate_error(f"microbatch {getattr(microbatch, 'index', '?')} holds {len(ids)} samples, an odd "
                            "number: it is not a microbatch of a plan of pairs")
    return split_pairs(collate_microbatch(source, microbatch, pad_id=pad_id))
