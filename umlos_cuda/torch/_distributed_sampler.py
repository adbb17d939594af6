"""A drop-in ``torch.utils.data.DistributedSampler`` whose shuffle is the engine's.

Seed 002 (the distributed sampler spec) with PyTorch's constructor and Sampler
protocol. Each epoch has one global order of the whole dataset, a pure
function of ``(len(dataset), seed + epoch)``; rank ``r`` of ``W`` takes the
global positions ``r, r + W, r + 2W, ...`` of that order, as PyTorch's sampler
does. What differs from PyTorch:

* the order comes from the NextBatch_v2 engine (O(num_blocks) memory, any
  backend), never from an O(N) ``randperm``; iteration computes it in windows;
* the uneven remainder is not padded: ranks ``r < N % W`` take one sample more
  (``pad=True`` restores PyTorch's padding for ranks that must take equal steps);
* ``state_dict()`` is the epoch and the global position reached, so a run
  resumes mid-epoch in O(1) at any world size.

The global order (normative for this sampler; docs/integrations.md): the
train-mode sequence, epoch 0, of the dataset ``"dataset"`` in the manifest::

    {"seed": seed + epoch, "global_batch_size": 1,
     "data": {"sampler_block_size": block_size, "drop_last": false},
     "datasets": {"dataset": {"id": "umlos_cuda.torch.DistributedSampler",
                              "version": 1, "hash": "", "cardinality": N}}}

so ``(seed, epoch)`` and ``(seed + epoch, 0)`` give the same order (seed 002's
``effectiveSeed = baseSeed + epoch``, as in PyTorch). With ``shuffle=False``
the order is ``0, 1, ..., N-1``.
"""

from __future__ import annotations

import numbers
from typing import Any, Iterator, Mapping

import numpy as np

from .. import errors
from ..backends import to_numpy
from ..errors import UINT64_MAX
from ..manifest import DEFAULT_BLOCK_SIZE, Manifest
from ..nextbatch import epoch_indices
from ._dist import argument_error, require_int, require_uint64, resolve_world

try:  # the Sampler base only when torch is installed; the logic needs none of it
    from torch.utils.data import Sampler as _SamplerBase
except ImportError:  # pragma: no cover - exercised where torch is absent
    _SamplerBase = object  # type: ignore[assignment,misc]

#: The dataset key and id of the internal manifest (part of the normative order).
DATASET_KEY = "dataset"
DATASET_ID = "umlos_cuda.torch.DistributedSampler"
#: ``state_dict()["format"]``.
STATE_FORMAT = "umlos_cuda.torch.DistributedSampler/1"
#: Global positions mapped per engine call while iterating: bounds memory.
WINDOW = 1 << 20


def sampler_manifest(length: int, effective_seed: int, block_size: int = DEFAULT_BLOCK_SIZE) -> Manifest:
    """The internal manifest whose epoch-0 train sequence is this sampler's global order."""
    return Manifest.from_dict(
        {
            "seed": effective_seed,
            "global_batch_size": 1,
            "data": {"sampler_block_size": block_size, "drop_last": False},
            "datasets": {DATASET_KEY: {"id": DATASET_ID, "version": 1, "hash": "", "cardinality": length}},
        }
    )


def _dataset_length(dataset: Any) -> int:
    if isinstance(dataset, numbers.Integral) and not isinstance(dataset, bool):
        length = int(dataset)
    else:
        try:
            length = len(dataset)
        except TypeError:
            raise argument_error(
                errors.CARDINALITY_MISMATCH,
                f"dataset must have a length (a map-style dataset) or be an int, got {type(dataset).__name__}",
            ) from None
    if length < 0:
        raise argument_error(errors.CARDINALITY_MISMATCH, f"dataset length {length} is outside [0, 2^63 - 1]")
    return length


class DistributedSampler(_SamplerBase):  # type: ignore[misc,valid-type]
    """Sampler that restricts data loading to a subset of the dataset, per rank.

    Same arguments and protocol as ``torch.utils.data.DistributedSampler``:
    pass it as ``DataLoader(dataset, sampler=...)`` and call
    :meth:`set_epoch` at the start of every epoch.

    Args:
        dataset: a dataset with ``len()`` (or the length itself, an int).
        num_replicas: number of processes; default: ``torch.distributed``'s
            world size when initialised, else ``$WORLD_SIZE``, else 1.
        rank: this process's rank in ``[0, num_replicas - 1]``; default as above
            with ``$RANK``.
        shuffle: shuffle the global order (the engine's block-affine
            permutation); ``False`` gives ``0, 1, ..., N-1``.
        seed: base seed in ``[0, 2^64 - 1]``; epoch ``e`` uses ``seed + e``.
            Must be the same on every rank.
        drop_last: drop the tail so that every rank takes ``N // num_replicas``
            samples (``total = (N // W) * W``, seed 002).
        pad: only without ``drop_last``: give every rank ``ceil(N / W)`` samples
            by repeating the first positions of the global order, exactly what
            PyTorch's sampler does. Off by default: see the warning.
        block_size: the engine's ``sampler_block_size`` (default 2^20).
        backend: engine backend, ``"auto"``, ``"numpy"``, ``"native"`` or ``"cupy"``.

    .. warning::
        Without ``drop_last`` or ``pad``, ranks ``r < N % W`` take one sample
        more than the others, so with a DataLoader of batch size B some ranks
        may take one step more (when ``(N // W) % B == 0``). A DDP training loop
        whose ranks take different numbers of steps waits forever in the extra
        step's all-reduce. Use ``drop_last=True`` (nothing repeated, a few
        samples skipped per epoch), ``pad=True`` (nothing skipped, up to
        ``W - 1`` samples seen twice per epoch), or DDP's ``join()``. For exact
        evaluation use :class:`DistributedEvalSampler`.

    Example::

        sampler = DistributedSampler(dataset, shuffle=True, seed=0)
        loader = DataLoader(dataset, batch_size=64, sampler=sampler)
        for epoch in range(start_epoch, n_epochs):
            sampler.set_epoch(epoch)
            for batch in loader:
                ...

    Raises:
        SamplerArgumentError: (a :class:`~umlos_cuda.UmlosError` and a
            ``ValueError``) naming the allowed range: ``INVALID_RANK`` for
            ``num_replicas`` / ``rank``, ``INVALID_MANIFEST`` for a seed or
            epoch outside uint64.
    """

    def __init__(
        self,
        dataset: Any,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        pad: bool = False,
        block_size: int = DEFAULT_BLOCK_SIZE,
        backend: str = "auto",
    ) -> None:
        self.dataset = dataset
        self.num_replicas, self.rank = resolve_world(num_replicas, rank, size_name="num_replicas")
        self.shuffle = bool(shuffle)
        self.seed = require_uint64(seed, "seed")
        self.drop_last = bool(drop_last)
        self.pad = bool(pad)
        self.block_size = require_int(block_size, "block_size", 1, UINT64_MAX, errors.BATCH_SIZE_INCONSISTENT)
        self.backend = backend
        self.epoch = 0
        self._length = _dataset_length(dataset)
        n, w = self._length, self.num_replicas
        if self.drop_last:
            self.total_size = (n // w) * w
        elif self.pad and n > 0:
            self.total_size = -(-n // w) * w
        else:
            self.total_size = n
        self.num_samples = self._count_for(self.rank)
        self._manifests: dict[int, Manifest] = {}
        self._yielded = 0  # samples this rank yielded in the current iteration
        self._start = 0  # global position (prefix) the current iteration began at
        self._resume: int | None = None  # global position to resume at, for self.epoch
        if self._length and self.shuffle:  # fail now, not in the first epoch, on a bad backend
            from ..backends import get_backend

            try:
                get_backend(backend)
            except errors.UmlosError as exc:
                raise argument_error(exc.code, exc.message) from None

    # -- sizes -------------------------------------------------------------
    def _count_for(self, rank: int) -> int:
        """Samples of ``rank`` in positions ``[0, total_size)``: ``len(range(rank, total, W))``."""
        if rank >= self.total_size:
            return 0
        return (self.total_size - rank + self.num_replicas - 1) // self.num_replicas

    def __len__(self) -> int:
        return self.num_samples

    def get_num_batches(self, batch_size: int) -> int:
        """``ceil(num_samples / batch_size)`` batches for this rank."""
        batch_size = require_int(batch_size, "batch_size", 1, UINT64_MAX, errors.BATCH_SIZE_INCONSISTENT)
        return -(-self.num_samples // batch_size)

    # -- epochs ------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the next iteration yields (``seed + epoch``).

        A position restored by :meth:`load_state_dict` is kept when ``epoch``
        is the restored epoch and dropped otherwise.
        """
        epoch = require_uint64(epoch, "epoch")
        if self.seed + epoch > UINT64_MAX:
            raise argument_error(
                errors.INVALID_MANIFEST,
                f"epoch {epoch} is outside [0, {UINT64_MAX - self.seed}]: seed + epoch must fit in uint64",
            )
        if epoch != self.epoch:
            self._resume = None
        self.epoch = epoch

    def _manifest(self) -> Manifest:
        key = self.seed + self.epoch
        manifest = self._manifests.get(key)
        if manifest is None:
            if key > UINT64_MAX:
                raise argument_error(errors.INVALID_MANIFEST, f"seed + epoch = {key} is outside [0, {UINT64_MAX}]")
            manifest = sampler_manifest(self._length, key, self.block_size)
            self._manifests = {key: manifest}  # one epoch at a time
        return manifest

    # -- the global order --------------------------------------------------
    def global_indices(self, start: int, count: int) -> np.ndarray:
        """Indices at global positions ``[start, start + count)`` of this epoch's order
        (int64; positions past N, which only ``pad`` uses, repeat from the start)."""
        n = self._length
        out = np.empty(count, dtype=np.int64)
        done = 0
        while done < count:
            position = (start + done) % n if n else 0
            length = min(count - done, n - position)
            out[done : done + length] = self._window(position, length)
            done += length
        return out

    def _window(self, start: int, count: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(start, start + count, dtype=np.int64)
        indices = epoch_indices(self._manifest(), DATASET_KEY, 0, start, count, backend=self.backend)
        return to_numpy(indices).astype(np.int64, copy=False)

    def _rank_indices(self, first: int, count: int) -> np.ndarray:
        """This rank's samples ``first .. first + count - 1`` (global positions
        ``rank + i * W``), computed one window at a time."""
        w, r = self.num_replicas, self.rank
        out = np.empty(count, dtype=np.int64)
        per_window = max(1, WINDOW // w)
        for offset in range(0, count, per_window):
            k = min(per_window, count - offset)
            p0 = r + (first + offset) * w
            out[offset : offset + k] = self.global_indices(p0, (k - 1) * w + 1)[::w]
        return out

    # -- seed 002 methods ----------------------------------------------------
    def get_batch(self, batch_index: int, batch_size: int) -> np.ndarray:
        """This rank's batch ``batch_index`` of ``batch_size`` (the last may be
        shorter), as int64 indices; independent of any iteration in progress."""
        batch_size = require_int(batch_size, "batch_size", 1, UINT64_MAX, errors.BATCH_SIZE_INCONSISTENT)
        batches = -(-self.num_samples // batch_size)
        if batches == 0:
            raise argument_error(
                errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY,
                f"batch_index {batch_index!r}: rank {self.rank} has no samples this epoch",
            )
        batch_index = require_int(batch_index, "batch_index", 0, batches - 1, errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY)
        first = batch_index * batch_size
        return self._rank_indices(first, min(batch_size, self.num_samples - first))

    def get_indices(self) -> np.ndarray:
        """All of this rank's indices for the current epoch (int64, O(num_samples) memory)."""
        return self._rank_indices(0, self.num_samples)

    # -- iteration -----------------------------------------------------------
    def _first_sample(self, position: int) -> int:
        """This rank's first sample number at or after global position ``position``."""
        return max(0, -(-(position - self.rank) // self.num_replicas))

    def __iter__(self) -> Iterator[int]:
        start = self._resume if self._resume is not None else 0
        self._resume = None
        self._start = start
        first = self._first_sample(start)
        self._yielded = 0
        return self._generate(first)

    def _generate(self, first: int) -> Iterator[int]:
        w = self.num_replicas
        per_window = max(1, WINDOW // w)
        i = first
        while i < self.num_samples:
            k = min(per_window, self.num_samples - i)
            chunk = self._rank_indices(i, k).tolist()
            for index in chunk:
                self._yielded += 1
                yield index
            i += k

    # -- checkpointing ---------------------------------------------------------
    def _position(self, yielded: int) -> int:
        """The global prefix consumed once every rank has yielded ``yielded``
        samples of the current iteration (ranks in lock-step)."""
        return min(self._start + yielded * self.num_replicas, self.total_size)

    def state_dict(self, samples_consumed: int | None = None) -> dict[str, Any]:
        """Plain data to resume this epoch where it stands, at any world size.

        ``global_position`` is the prefix of the epoch's global order that the
        ranks have consumed, assuming they advance in lock-step (as DDP steps
        do); save it from any rank. By default the position follows what this
        sampler has yielded; a plain DataLoader with workers runs ahead of the
        training loop by its prefetch, so pass ``samples_consumed`` (samples
        this rank's loop has used in this iteration) or use torchdata's
        ``StatefulDataLoader``, which snapshots at the right moments itself.
        """
        yielded = self._yielded if samples_consumed is None else require_uint64(samples_consumed, "samples_consumed")
        position = self._position(yielded) if self._resume is None else self._resume
        return {
            "format": STATE_FORMAT,
            "epoch": self.epoch,
            "global_position": position,
            "yielded": yielded,
            "seed": self.seed,
            "dataset_length": self._length,
            "shuffle": self.shuffle,
            "block_size": self.block_size,
            "num_replicas": self.num_replicas,
            "drop_last": self.drop_last,
            "pad": self.pad,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict` output, written at any world size.

        The next iteration of ``state["epoch"]`` starts at its global position;
        the configuration that defines the order (dataset length, seed,
        shuffle, block size) must match, else the state is refused.
        """
        if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
            raise argument_error(
                errors.INVALID_MANIFEST, f"not a DistributedSampler state (expected format {STATE_FORMAT!r})"
            )
        for key, mine in (("seed", self.seed), ("shuffle", self.shuffle), ("block_size", self.block_size)):
            if state.get(key) != mine:
                raise argument_error(
                    errors.INVALID_MANIFEST,
                    f"the state was written with {key}={state.get(key)!r} but this sampler has {key}={mine!r}",
                )
        if state.get("dataset_length") != self._length:
            raise argument_error(
                errors.CARDINALITY_MISMATCH,
                f"the state was written for a dataset of {state.get('dataset_length')!r} samples, this one has {self._length}",
            )
        epoch = require_uint64(state.get("epoch"), "state epoch")
        position = require_uint64(state.get("global_position"), "state global_position")
        self.set_epoch(epoch)
        self._resume = min(position, self.total_size)
        self._start = self._resume
        self._yielded = 0
