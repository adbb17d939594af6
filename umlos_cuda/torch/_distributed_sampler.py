"""A drop-in ``torch.utils.data.DistributedSampler`` whose shuffle is the engine's.

The order of docs/spec/nextbatch-v2.md §8 with PyTorch's constructor, defaults
and Sampler protocol. Each epoch has one global order of the whole dataset, a
pure function of ``(len(dataset), seed + epoch)`` (see ``_order.py``); rank
``r`` of ``W`` takes the global positions ``r, r + W, r + 2W, ...`` of that
order, as PyTorch's sampler does, and by default pads like it: every rank
takes ``ceil(N / W)`` samples, so every rank of a DDP job takes the same
number of steps. What differs from PyTorch (docs/integrations.md lists all):

* the order comes from the NextBatch_v2 engine (a keyed Feistel bijection of
  the whole dataset by default, ``sampling_mode="feistel"``: as well mixed as
  a ``randperm`` at O(1) memory, any backend), never from an O(N)
  ``randperm``; iteration computes it in windows;
* ``pad=False`` gives each sample to exactly one rank (ranks ``r < N % W``
  take one more) for those who handle uneven steps themselves;
* ``state_dict()`` is the epoch and the global position reached, so a run
  resumes mid-epoch in O(1) at any world size; while a ``DataLoader`` with
  workers pulls the sampler, the position counts the samples of the batches
  that loader has handed the training loop, not those it prefetched
  (``_prefetch.py``).

An iterator is a snapshot: everything it yields is fixed when ``__iter__`` is
called (epoch, seed, sizes), as with PyTorch's sampler, whose ``__iter__``
builds the whole list at once. With ``shuffle=False`` the order is
``0, 1, ..., N-1``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from .. import checks, errors
from ..errors import UINT64_MAX
from ..manifest.core import DEFAULT_BLOCK_SIZE, Manifest
from ._dist import argument_error, require_int, require_uint64, resolve_world, state_of, type_error
from ._prefetch import LoaderLink, link_for, loop_count
from ._sampler_base import SamplerBase as _SamplerBase
from ..modes import get_mode
from ._order import (DEFAULT_SAMPLING_MODE, LEGACY_SAMPLING_MODE, MAX_SEED, RankOrder, check_effective_seed,
                     sampler_manifest)

#: ``state_dict()["format"]``.
STATE_FORMAT = "umlos_cuda.torch.DistributedSampler/1"


def _dataset_length(dataset: Any) -> int:
    if checks.is_integer(dataset):
        length = int(dataset)
    else:
        try:
            length = len(dataset)
        except TypeError:
            raise type_error(
                errors.CARDINALITY_MISMATCH,
                f"object of type {type(dataset).__name__!r} has no len(): the dataset must be a map-style "
                "dataset with a length, or the length itself (an int)",
            ) from None
    if length < 0:
        raise argument_error(errors.CARDINALITY_MISMATCH, f"dataset length {length} is outside [0, 2^63 - 1]")
    return length


def _require_seed(seed: Any) -> int:
    """Any integer: the range is checked where the seed is used (shuffle=True; :func:`check_effective_seed`)."""
    return checks.integer(seed, "seed", None, None, fail=partial(argument_error, errors.INVALID_ARGUMENT),
                          message="{name} must be an integer in [-2^63, 2^64 - 1], got {type} {value!r}")


def _require_mode(sampling_mode: Any) -> str:
    """``sampling_mode`` if it names a registered mode, else INVALID_MANIFEST naming them."""
    try:
        return get_mode(sampling_mode).name
    except errors.UmlosError as exc:
        raise argument_error(exc.code, exc.message) from None


@dataclass
class _Pass:
    """One iteration's progress: the epoch and global position it started at,
    and the samples it has yielded (what :meth:`DistributedSampler.state_dict` reads),
    and the loader with workers pulling it, if any."""

    epoch: int
    start: int
    yielded: int = 0
    link: LoaderLink | None = None


class DistributedSampler(_SamplerBase):
    """Sampler that restricts data loading to a subset of the dataset, per rank.

    Same arguments, defaults and protocol as
    ``torch.utils.data.DistributedSampler``: pass it as
    ``DataLoader(dataset, sampler=...)`` and call :meth:`set_epoch` at the
    start of every epoch.

    Args:
        dataset: a dataset with ``len()`` (or the length itself, an int).
        num_replicas: number of processes; default: ``torch.distributed``'s
            world size when initialised, else ``$WORLD_SIZE``, else 1.
        rank: this process's rank in ``[0, num_replicas - 1]``; default as above
            with ``$RANK``.
        shuffle: shuffle the global order (the engine's order named by
            ``sampling_mode``); ``False`` gives ``0, 1, ..., N-1``.
        seed: base seed; epoch ``e`` uses ``seed + e``, which must lie in
            ``[-2^63, 2^64 - 1]`` (what PyTorch's ``manual_seed`` accepts) when
            ``shuffle``; any integer otherwise. Must be the same on every rank.
        drop_last: drop the tail so that every rank takes ``N // num_replicas``
            samples (``total_size = (N // W) * W``).
        pad: without ``drop_last``, give every rank ``ceil(N / W)`` samples by
            repeating the first positions of the global order, as PyTorch's
            sampler does (the default). ``pad=False`` gives every sample to
            exactly one rank: ranks ``r < N % W`` take one more. See the warning.
        sampling_mode: the engine's order when shuffling: ``"feistel"`` (the
            default: the whole dataset through one keyed Feistel bijection, as
            well mixed as PyTorch's ``randperm``), ``"block_affine"`` (the
            order of earlier releases: shuffled blocks, an affine map inside
            each; keeps reads within a block) or any registered mode
            (``umlos_cuda.modes.mode_names()``); docs/sampling-modes.md
            compares them.
        block_size: the engine's ``sampler_block_size`` (default 2^20), for
            the modes made of blocks.
        backend: engine backend, ``"auto"``, ``"numpy"``, ``"native"`` or ``"cupy"``.

    .. warning::
        With ``pad=False`` (and no ``drop_last``) and a DataLoader of batch
        size B, some ranks take one step more than others when
        ``(N // W) % B == 0`` and ``N % W != 0``. A DDP training loop whose
        ranks take different numbers of steps waits forever in the extra
        step's all-reduce: wrap the loop in ``torch.distributed.algorithms.Join``
        (``with Join([model]): ...``), or use ``drop_last=True``. For exact
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
            ``num_replicas`` / ``rank`` (in PyTorch's words, ``Invalid rank 3,
            rank should be in the interval [0, 2]``), ``INVALID_ARGUMENT`` for
            a seed or epoch out of range, ``INVALID_MANIFEST`` for an unknown
            ``sampling_mode`` (naming the registered ones).
        SamplerTypeError: (a :class:`~umlos_cuda.UmlosError` and a
            ``TypeError``, code ``CARDINALITY_MISMATCH``) for a dataset
            without ``len()``.
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
        pad: bool = True,
        block_size: int = DEFAULT_BLOCK_SIZE,
        backend: str = "auto",
        sampling_mode: str = DEFAULT_SAMPLING_MODE,
    ) -> None:
        self.dataset = dataset
        self.num_replicas, self.rank = resolve_world(num_replicas, rank, size_name="num_replicas")
        self.shuffle = bool(shuffle)
        self.seed = _require_seed(seed)
        if self.shuffle:
            check_effective_seed(self.seed, "seed")
        self.drop_last = bool(drop_last)
        self.pad = bool(pad)
        self.block_size = require_int(block_size, "block_size", 1, UINT64_MAX, errors.BATCH_SIZE_INCONSISTENT)
        self.backend = backend
        self.sampling_mode = _require_mode(sampling_mode)
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
        self._pass: _Pass | None = None  # the latest iteration of self.epoch
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

        An iteration already under way keeps the epoch it started with. A
        position restored by :meth:`load_state_dict` is kept when ``epoch`` is
        the restored epoch and dropped otherwise.
        """
        epoch = require_uint64(epoch, "epoch")
        if self.shuffle and self.seed + epoch > MAX_SEED:
            raise argument_error(
                errors.INVALID_ARGUMENT,
                f"epoch {epoch} is outside [0, {MAX_SEED - self.seed}]: seed + epoch must be in [-2^63, 2^64 - 1]",
            )
        if epoch != self.epoch:
            self._resume = None
            self._pass = None
        self.epoch = epoch

    def _manifest(self) -> Manifest:
        key = self.seed + self.epoch
        manifest = self._manifests.get(key)
        if manifest is None:
            manifest = sampler_manifest(self._length, key, self.block_size, self.sampling_mode)
            self._manifests = {key: manifest}  # one epoch at a time
        return manifest

    def _rank_order(self) -> RankOrder:
        """This rank's share of the current epoch's order, frozen (what an iteration uses)."""
        return RankOrder(
            length=self._length,
            num_replicas=self.num_replicas,
            rank=self.rank,
            num_samples=self.num_samples,
            manifest=self._manifest() if self.shuffle and self._length else None,
            backend=self.backend,
        )

    def global_indices(self, start: int, count: int) -> np.ndarray:
        """Indices at global positions ``[start, start + count)`` of this epoch's order
        (int64; positions past N, which only padding uses, repeat from the start)."""
        return self._rank_order().global_indices(start, count)

    # -- batches and windows (docs/integrations.md) ----------------------------
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
        batch_index = require_int(batch_index, "batch_index", 0, batches - 1,
                                  errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY)
        first = batch_index * batch_size
        return self._rank_order().rank_indices(first, min(batch_size, self.num_samples - first))

    def get_indices(self) -> np.ndarray:
        """All of this rank's indices for the current epoch (int64, O(num_samples) memory)."""
        return self._rank_order().rank_indices(0, self.num_samples)

    # -- iteration -----------------------------------------------------------
    def _first_sample(self, position: int) -> int:
        """This rank's first sample number at or after global position ``position``."""
        return max(0, -(-(position - self.rank) // self.num_replicas))

    def __iter__(self) -> Iterator[int]:
        start = self._resume if self._resume is not None else 0
        self._resume = None
        self._pass = progress = _Pass(self.epoch, start)
        return self._generate(self._rank_order(), self._first_sample(start), progress)

    def _generate(self, order: RankOrder, first: int, progress: _Pass) -> Iterator[int]:
        for chunk in order.chunks(first):
            for index in chunk:
                progress.yielded += 1
                if progress.yielded == 1:
                    progress.link = link_for(self, batches=False)
                yield index

    # -- checkpointing ---------------------------------------------------------
    def state_dict(self, samples_consumed: int | None = None) -> dict[str, Any]:
        """Plain data to resume this epoch where it stands, at any world size.

        ``global_position`` is the prefix of the epoch's global order that the
        ranks have consumed, assuming they advance in lock-step (as DDP steps
        do); save it from any rank. The position counts the samples the
        latest iteration of the current epoch has handed the training loop:
        when a ``DataLoader`` with workers pulls it, the samples of the
        batches its workers fetched ahead are not counted (the loader's
        batch size is read from its ``BatchSampler``), so a state saved in
        the loop, or after leaving it, resumes with the next batch.

        ``samples_consumed`` (samples this rank's loop has used in this
        iteration) overrides that count; without it, a loader whose count
        cannot be known (``in_order=False``, a batch sampler of its own
        without ``batch_size``) makes a plain call warn. torchdata's
        ``StatefulDataLoader`` gets the position of what was handed out
        when it calls this itself.
        """
        progress = self._pass or _Pass(self.epoch, 0)
        if samples_consumed is not None:
            yielded = require_uint64(samples_consumed, "samples_consumed")
        else:
            counted = loop_count(progress.link, progress.yielded, "DistributedSampler", "samples", "samples_consumed")
            yielded = progress.yielded if counted is None else counted
        if self._resume is not None:
            position = self._resume
        else:
            position = min(progress.start + yielded * self.num_replicas, self.total_size)
        return {
            "format": STATE_FORMAT,
            "epoch": self.epoch,
            "global_position": position,
            "yielded": yielded,
            "seed": self.seed,
            "dataset_length": self._length,
            "shuffle": self.shuffle,
            "block_size": self.block_size,
            "sampling_mode": self.sampling_mode,
            "num_replicas": self.num_replicas,
            "drop_last": self.drop_last,
            "pad": self.pad,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict` output, written at any world size.

        The next iteration of ``state["epoch"]`` starts at its global position;
        the configuration that defines the order (dataset length, seed,
        shuffle, sampling mode, block size) must match, else the state is
        refused. A state without ``sampling_mode`` was written before the
        sampler had one, under ``block_affine``.
        """
        state_of(state, "DistributedSampler", STATE_FORMAT, errors.SAMPLER_STATE_INVALID)
        written = dict(state)
        written.setdefault("sampling_mode", LEGACY_SAMPLING_MODE)
        for key, mine in (("seed", self.seed), ("shuffle", self.shuffle), ("sampling_mode", self.sampling_mode),
                          ("block_size", self.block_size)):
            if written.get(key) != mine:
                raise argument_error(
                    errors.SAMPLER_STATE_INVALID,
                    f"the state was written with {key}={written.get(key)!r} but this sampler has {key}={mine!r}",
                )
        if state.get("dataset_length") != self._length:
            raise argument_error(
                errors.CARDINALITY_MISMATCH,
                f"the state was written for a dataset of {state.get('dataset_length')!r} samples, "
                f"this one has {self._length}",
            )
        epoch = require_uint64(state.get("epoch"), "state epoch", errors.SAMPLER_STATE_INVALID)
        position = require_uint64(state.get("global_position"), "state global_position", errors.SAMPLER_STATE_INVALID)
        self.set_epoch(epoch)
        self._resume = min(position, self.total_size)
        self._pass = _Pass(epoch, self._resume)
