"""DistributedSampler's order: one global order per epoch, and one rank's share of it.

The global order of an epoch is a pure function of ``(N, seed + epoch,
sampling_mode, block_size)``: the train-mode sequence, epoch 0, of dataset
``"dataset"`` in :func:`sampler_manifest`, whose ``data.sampling_mode`` names
the order (:data:`DEFAULT_SAMPLING_MODE`, ``feistel``, unless the sampler was
given another). Rank ``r`` of ``W`` takes the global positions
``r, r + W, r + 2W, ...`` of ``[0, total_size)``; positions past ``N`` (only
padding reaches them) repeat the order from its start, PyTorch's rule.

Seeds. PyTorch seeds ``torch.Generator.manual_seed(seed + epoch)``, which
takes any integer in ``[-2^63, 2^64 - 1]`` (and, by two's complement, gives
``-1`` and ``2^64 - 1`` the same order). That is 1.5 * 2^64 values, more than
the engine's uint64 seed can hold, so the manifest's dataset id carries the
sign; the map from ``s = seed + epoch`` to the manifest is injective:

* ``s >= 0``: manifest seed ``s``, dataset id :data:`DATASET_ID`;
* ``s < 0``:  manifest seed ``s + 2^64``, dataset id :data:`NEGATIVE_SEED_DATASET_ID`.

:class:`RankOrder` is what an iteration works from: frozen when ``__iter__``
is called, so a later ``set_epoch`` cannot change an iteration in progress.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .. import errors
from ..backends import to_numpy
from ..errors import UINT64_MAX
from ..manifest.core import DEFAULT_BLOCK_SIZE, Manifest
from ..nextbatch import epoch_indices
from ._dist import argument_error

#: The dataset key and id of the internal manifest (part of the normative order).
DATASET_KEY = "dataset"
DATASET_ID = "umlos_cuda.torch.DistributedSampler"
#: The dataset id for negative effective seeds (``seed + epoch < 0``).
NEGATIVE_SEED_DATASET_ID = "umlos_cuda.torch.DistributedSampler/negative-seed"
#: The effective seeds PyTorch's ``manual_seed`` accepts: ``[-2^63, 2^64 - 1]``.
MIN_SEED = -(1 << 63)
MAX_SEED = UINT64_MAX
#: This rank's positions mapped per engine call while iterating: bounds memory.
WINDOW = 1 << 20
#: The sampler's order unless ``sampling_mode`` says otherwise: a Feistel
#: bijection of the whole dataset, as well mixed as PyTorch's ``randperm``
#: (docs/sampling-modes.md). NextBatch_v2 manifests keep ``block_affine``.
DEFAULT_SAMPLING_MODE = "feistel"
#: The order of states written before the sampler had a ``sampling_mode``.
LEGACY_SAMPLING_MODE = "block_affine"


def check_effective_seed(effective_seed: int, what: str) -> int:
    """``effective_seed`` if it is in ``[-2^63, 2^64 - 1]``, else ``INVALID_ARGUMENT``."""
    if not MIN_SEED <= effective_seed <= MAX_SEED:
        raise argument_error(
            errors.INVALID_ARGUMENT,
            f"{what} = {effective_seed} is outside [-2^63, 2^64 - 1], the seeds PyTorch accepts"
        )
    return effective_seed


def sampler_manifest(length: int, effective_seed: int, block_size: int = DEFAULT_BLOCK_SIZE,
                     sampling_mode: str = DEFAULT_SAMPLING_MODE) -> Manifest:
    """The internal manifest whose epoch-0 train sequence is the global order for
    ``seed + epoch = effective_seed`` (any integer in ``[-2^63, 2^64 - 1]``)
    under ``sampling_mode``. With ``block_affine`` it is the manifest of
    earlier releases, byte for byte (a manifest naming the default mode hashes
    as one naming none), so their orders are unchanged."""
    check_effective_seed(effective_seed, "seed + epoch")
    negative = effective_seed < 0
    return Manifest.from_dict(
        {
            "seed": effective_seed + (1 << 64) if negative else effective_seed,
            "global_batch_size": 1,
            "data": {"sampler_block_size": block_size, "drop_last": False, "sampling_mode": sampling_mode},
            "datasets": {
                DATASET_KEY: {
                    "id": NEGATIVE_SEED_DATASET_ID if negative else DATASET_ID,
                    "version": 1,
                    "hash": "",
                    "cardinality": length,
                }
            },
        }
    )


@dataclass(frozen=True)
class RankOrder:
    """One epoch's order as one rank takes it; ``manifest`` is None when unshuffled."""

    length: int
    num_replicas: int
    rank: int
    num_samples: int
    manifest: Manifest | None
    backend: str

    def global_indices(self, start: int, count: int, stride: int = 1) -> np.ndarray:
        """Indices at global positions ``start + i * stride``, ``i < count`` (int64;
        positions past N, which only padding uses, repeat from the start)."""
        n = self.length
        out = np.empty(count, dtype=np.int64)
        done = 0
        while done < count:
            position = (start + done * stride) % n if n else 0
            length = min(count - done, (n - 1 - position) // stride + 1)  # this pass over the order
            out[done : done + length] = self._window(position, length, stride)
            done += length
        return out

    def _window(self, start: int, count: int, stride: int) -> np.ndarray:
        if self.manifest is None:
            return np.arange(start, start + count * stride, stride, dtype=np.int64)
        indices = epoch_indices(self.manifest, DATASET_KEY, 0, start, count, backend=self.backend, stride=stride)
        return to_numpy(indices).astype(np.int64, copy=False)

    def rank_indices(self, first: int, count: int) -> np.ndarray:
        """This rank's samples ``first .. first + count - 1`` (global positions
        ``rank + i * W``), one window at a time; only these positions are mapped
        (a strided window of the engine), not the other ranks' in between."""
        w, r = self.num_replicas, self.rank
        out = np.empty(count, dtype=np.int64)
        for offset in range(0, count, self.per_window):
            k = min(self.per_window, count - offset)
            out[offset : offset + k] = self.global_indices(r + (first + offset) * w, k, w)
        return out

    @property
    def per_window(self) -> int:
        return WINDOW

    def chunks(self, first: int) -> Iterator[list[int]]:
        """This rank's samples from sample number ``first`` to the end, a window at a time."""
        i = first
        while i < self.num_samples:
            k = min(self.per_window, self.num_samples - i)
            yield self.rank_indices(i, k).tolist()
            i += k
