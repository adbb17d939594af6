"""Masked padding: how a rank with fewer samples still takes every step.

A padded slot is a :class:`Padding` key, not an index. A plain dataset
refuses it (``dataset[Padding(...)]`` raises), so padding can never pass
silently as a real, duplicated sample; :class:`MaskedDataset` reads the slot's
``fill`` sample (so that tensor shapes stay uniform) and returns it with
``valid = False``. After the DataLoader's default collate, a batch is
``(samples, mask)`` with ``mask`` a bool tensor: apply it to every metric.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Padding:
    """A padded slot of a micro-batch. ``fill`` is a real key (an index, or a
    plan's key: :class:`~umlos_cuda.torch.PlanEvalData`) whose sample is read
    in its place and masked out."""

    fill: Any


class MaskedDataset:
    """Wrap a map-style dataset so that every item is ``(sample, valid)``.

    ``valid`` is ``True`` for a real index and ``False`` for a :class:`Padding`
    key (whose sample is ``dataset[padding.fill]``, to be ignored).
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: Any) -> tuple[Any, bool]:
        if isinstance(key, Padding):
            return self.dataset[key.fill], False
        return self.dataset[key], True
