"""Exact distributed evaluation: every sample once, every rank the same steps.

Evaluation must count each sample exactly once, yet DDP ranks (and any
collective inside the loop) need the same number of steps. PyTorch's
DistributedSampler pads by repeating samples, which biases the metric. Here
the global order is ``0, 1, ..., N-1`` (NextBatch_v2 ``stage="eval"``) cut into
global batches of ``batch_size * num_replicas``; rank ``r`` takes the ``r``-th
contiguous slice of each, and the short slices of the last global batch are
filled with :class:`Padding` keys that :class:`MaskedDataset` turns into
masked-out samples.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .. import errors
from ..cursor import Cursor
from ..errors import UINT64_MAX
from ._dist import require_int, resolve_world
from ._sampler_base import SamplerBase as _SamplerBase
from ._distributed_sampler import _dataset_length
from ._nextbatch_sampler import NextBatchSampler
from ._order import DATASET_KEY

DATASET_ID = "umlos_cuda.torch.DistributedEvalSampler"


class DistributedEvalSampler(_SamplerBase):
    """Batch sampler for exact distributed evaluation.

    Use with a :class:`MaskedDataset`; each batch is then ``(samples, mask)``::

        sampler = DistributedEvalSampler(val_set, batch_size=64)
        loader = DataLoader(MaskedDataset(val_set), batch_sampler=sampler)
        for samples, mask in loader:
            correct += (model(samples).argmax(1) == labels)[mask].sum()
            seen += mask.sum()
        # all_reduce(correct), all_reduce(seen): seen == len(val_set) exactly

    Every rank yields ``ceil(N / (batch_size * num_replicas))`` batches of
    exactly ``batch_size`` keys; across ranks the real (unmasked) keys are
    ``0 .. N-1``, each once, and in rank order they are in ascending order.

    Args:
        dataset: a dataset with ``len()`` (or the length, an int).
        batch_size: per-rank batch size (at least 1).
        num_replicas, rank: as in :class:`DistributedSampler`.
        backend: engine backend.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        num_replicas: int | None = None,
        rank: int | None = None,
        *,
        backend: str = "auto",
    ) -> None:
        self.num_replicas, self.rank = resolve_world(num_replicas, rank, size_name="num_replicas")
        self.batch_size = require_int(batch_size, "batch_size", 1, UINT64_MAX // self.num_replicas,
                                      errors.BATCH_SIZE_INCONSISTENT)
        self.length = _dataset_length(dataset)
        self._inner: NextBatchSampler | None = None
        if self.length:
            manifest = {
                "global_batch_size": self.batch_size * self.num_replicas,
                "datasets": {DATASET_KEY: {"id": DATASET_ID, "version": 1, "hash": "", "cardinality": self.length}},
            }
            self._inner = NextBatchSampler(
                manifest, DATASET_KEY, stage="eval", rank=self.rank, world_size=self.num_replicas,
                backend=backend, pad=True
            )

    def __len__(self) -> int:
        return len(self._inner) if self._inner is not None else 0

    def __iter__(self) -> Iterator[list]:
        """A whole evaluation from its first batch, every time: iterators are
        independent of each other and of the sampler (nothing is owned)."""
        if self._inner is None:
            return iter(())
        return (indices for _, _, indices in self._inner._pass_from(Cursor(0, 0)) if indices)
