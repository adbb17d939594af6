"""What travels through a ``DataLoader`` over a batch plan: the sampler's keys and the dataset's items.

A plan that takes its samples whole hands out dataset rows (Python ints),
and a :class:`~umlos_cuda.torch.TokenDataset` item is ``(row, input_ids,
loss_mask)``. A plan whose over-long policy cuts samples (``truncate_right``,
``truncate_left``, ``split``: :mod:`~umlos_cuda.batching.plans.overlong`) takes
a token range of each, which a row number cannot say, so its sampler hands
out :class:`PlanKey` ``(row, start, stop)``, the dataset turns one into a
:class:`PlanItem` holding the whole row and that range, and the collator
cuts it with :func:`~umlos_cuda.batching.collate.take_span`, the cut
``collate_microbatch`` and batch files make: the tensors are theirs, bit
for bit. A packed plan's keys also carry the packed row of the sample
within its microbatch (``pack``; :class:`~umlos_cuda.torch.PackedBatchSampler`
adds it; a whole-sample packed plan keeps its ``(row, k)`` pairs).

Keys and items are tuples of plain values, so worker processes take them by
pickle, and they are made per sample only at this edge (the plan itself
stays arrays).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np


class PlanKey(NamedTuple):
    """One sample of a plan microbatch that is taken as a token range ``[start, stop)`` of dataset row ``row``;
    ``pack``: its packed row within the microbatch (a packed plan), else None."""

    row: int
    start: int
    stop: int
    pack: int | None = None


class PlanItem(NamedTuple):
    """A :class:`~umlos_cuda.torch.TokenDataset` item for a :class:`PlanKey`: the whole row's arrays (memory-mapped
    views) and the range the collator cuts (``span``; None: the whole row), with the key's ``pack``."""

    row: int
    input_ids: np.ndarray
    loss_mask: np.ndarray
    pack: int | None = None
    span: tuple[int, int] | None = None


def takes_ranges(config: Any) -> bool:
    """True when a plan of ``config`` takes token ranges of its samples (an over-long policy that cuts)."""
    overlong = getattr(config, "overlong", None)
    return overlong is not None and overlong.cuts


def plan_keys(rows: np.ndarray, spans: np.ndarray | None) -> list:
    """The keys of one microbatch: its rows as ints, or one :class:`PlanKey` per sample when ``spans`` are given."""
    if spans is None:
        return np.asarray(rows).tolist()
    spans = np.asarray(spans)
    return list(map(PlanKey, np.asarray(rows).tolist(), spans[:, 0].tolist(), spans[:, 1].tolist()))


def with_pack(key: Any, pack: int) -> Any:
    """``key`` with its packed row: a :class:`PlanKey` with ``pack`` set, a row as the pair ``(row, pack)``."""
    return key._replace(pack=pack) if isinstance(key, PlanKey) else (key, pack)


def as_item(item: Any) -> PlanItem | None:
    """Any :class:`~umlos_cuda.torch.TokenDataset` item as a :class:`PlanItem`: ``(row, input_ids, loss_mask)``,
    ``(row, input_ids, loss_mask, pack)`` or a :class:`PlanItem`; None for anything else."""
    if isinstance(item, PlanItem):
        return item
    if isinstance(item, tuple) and len(item) in (3, 4):
        return PlanItem(*item)
    return None
