"""A ``batch_sampler`` that yields this rank's NextBatch_v2 micro-batches.

The sampler owns the cursor: every micro-batch it yields advances it by one
global batch, and ``state_dict()`` is that cursor (plain, CBOR-safe data). A
cursor does not depend on the world size, so a checkpoint written by 8 ranks
resumes on 2 (or 16, any world size that divides ``global_batch_size``) with
the identical global sequence: rank ``r`` of ``W`` takes the contiguous slice
``[r * G/W, (r+1) * G/W)`` of each global batch (resolution R7).

One pass of ``iter()`` runs to the end of the cursor's epoch, like any
sampler; the next pass is the next epoch. An iterator is a snapshot: it yields
the epoch of the cursor at ``iter()`` time with the sampler's configuration
then, whatever ``set_epoch`` or ``load_state_dict`` do meanwhile (they detach
it: it no longer moves the sampler's cursor). While a ``DataLoader`` with
workers pulls a pass, ``state_dict()`` counts the micro-batches that loader
has handed the training loop, not the ones its workers prefetched
(``_prefetch.py``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .. import errors
from ..backends import to_numpy
from ..cursor import Cursor, as_cursor
from ..errors import UmlosError
from ..manifest.core import Manifest, as_manifest
from ..nextbatch import check_dataset_length, next_batch
from ._dist import argument_error, as_argument_error, require_uint64, resolve_world, state_of
from ._prefetch import LoaderLink, link_for, loop_count
from ._sampler_base import SamplerBase as _SamplerBase
from ._padding import Padding


#: ``state_dict()["format"]``.
STATE_FORMAT = "umlos_cuda.torch.NextBatchSampler/1"


class NextBatchSampler(_SamplerBase):
    """Batch sampler over a manifest's dataset: ``DataLoader(ds, batch_sampler=...)``.

    Args:
        manifest: a :class:`~umlos_cuda.Manifest`, a mapping, or a YAML/JSON path.
            ``global_batch_size`` is the global batch; each rank yields
            micro-batches of ``global_batch_size // world_size``.
        dataset_key: a key of ``manifest.datasets``.
        stage: ``"train"`` (shuffled), ``"eval"`` or ``"infer"`` (sequential).
        rank, world_size: default: ``torch.distributed`` when initialised,
            else ``$RANK`` / ``$WORLD_SIZE``, else 0 / 1.
        backend: engine backend (``"auto"``, ``"numpy"``, ``"native"``, ``"cupy"``).
        cursor: where to start (default ``Cursor(0, 0)``); see also
            :meth:`load_state_dict`.
        pad: pad every micro-batch to ``global_batch_size // world_size`` with
            :class:`Padding` keys, so that every rank takes the same number of
            steps; wrap the dataset in :class:`MaskedDataset` and apply the
            mask. Without it, a short micro-batch is yielded as it is and an
            empty one (a rank past the end of the epoch's last, partial
            global batch) is skipped.
        replay_token: 32 bytes replacing the manifest's derived token (R3).
        dataset: optional; when given, its ``len()`` must equal the manifest's
            ``cardinality`` (``CARDINALITY_MISMATCH`` otherwise).

    Items are lists of Python ints (and :class:`Padding` keys with ``pad``).

    Raises:
        SamplerArgumentError: (a :class:`~umlos_cuda.UmlosError` and a
            ``ValueError``) with the engine's code on any invalid argument.
    """

    def __init__(
        self,
        manifest: Manifest | Mapping[str, Any] | str | os.PathLike[str],
        dataset_key: str,
        stage: str = "train",
        rank: int | None = None,
        world_size: int | None = None,
        backend: str = "auto",
        *,
        cursor: Cursor | Mapping[str, int] | None = None,
        pad: bool = False,
        replay_token: bytes | None = None,
        dataset: Any = None,
    ) -> None:
        try:
            self.manifest = as_manifest(manifest)
            self.world_size, self.rank = resolve_world(world_size, rank)
            self.dataset_key = dataset_key
            self.stage = stage
            self.backend = backend
            self.pad = bool(pad)
            self.replay_token = replay_token
            self.cursor = as_cursor(cursor)
            if dataset is not None:
                check_dataset_length(self.manifest, dataset_key, len(dataset))
            probe = self._call(self.cursor)  # validates everything the engine checks
        except UmlosError as exc:
            raise as_argument_error(exc) from None
        self.global_batch_size = self.manifest.global_batch_size
        self.micro_batch_size = probe.metadata["micro_batch_size"]
        n = self.manifest.dataset(dataset_key).cardinality
        drop = stage == "train" and self.manifest.drop_last
        #: Positions per epoch (R7): N, or floor(N / G) * G for train with drop_last.
        self.epoch_limit = (n // self.global_batch_size) * self.global_batch_size if drop else n
        #: The metadata of the last micro-batch yielded (sampler_config_hash, data_replay_t, ...).
        self.last_metadata: dict[str, Any] | None = None
        self._iter_start = self.cursor  # the cursor the current pass of iter() began at
        self._owner: object | None = None  # the pass that moves self.cursor (None: none)
        self._handed = 0  # micro-batches the owned pass has handed out
        self._link: LoaderLink | None = None  # the loader with workers pulling the owned pass

    def _engine(self) -> Callable[..., Any]:
        """``next_batch`` bound to this sampler's configuration as it is now."""
        return functools.partial(
            next_batch,
            self.manifest,
            self.dataset_key,
            world_size=self.world_size,
            rank=self.rank,
            stage=self.stage,
            replay_token=self.replay_token,
            backend=self.backend,
        )

    def _call(self, cursor: Cursor):
        return self._engine()(cursor=cursor)

    # -- sizes -------------------------------------------------------------
    @property
    def steps_per_epoch(self) -> int:
        """Global batches in a whole epoch: ``ceil(epoch_limit / global_batch_size)``."""
        return -(-self.epoch_limit // self.global_batch_size)

    def __len__(self) -> int:
        """Micro-batches this rank yields in a whole epoch (with ``pad``, every
        rank yields ``steps_per_epoch``; without it, a rank whose slice of the
        last global batch is empty yields one fewer)."""
        if self.pad:
            return self.steps_per_epoch
        offset = self.rank * self.micro_batch_size
        if self.epoch_limit <= offset:
            return 0
        return -(-(self.epoch_limit - offset) // self.global_batch_size)

    # -- iteration -----------------------------------------------------------
    def __iter__(self) -> Iterator[list]:
        self._iter_start = self.cursor
        self._owner = owner = object()
        self._handed, self._link = 0, None
        return self._generate(self._pass_from(self.cursor), owner)

    def _generate(self, steps: Iterator[tuple[Cursor, dict, list]], owner: object) -> Iterator[list]:
        for cursor, metadata, indices in steps:
            if self._owner is owner:
                self.cursor = cursor  # owned: advanced before the consumer sees the batch
            self.last_metadata = metadata
            if indices:
                if self._owner is owner:
                    self._handed += 1
                    if self._handed == 1:
                        self._link = link_for(self, batches=True)
                yield indices

    def _pass_from(self, cursor: Cursor) -> Iterator[tuple[Cursor, dict, list]]:
        """The rest of ``cursor``'s epoch, one global batch at a time, with the
        configuration fixed now: ``(cursor after, metadata, indices)``, where
        ``indices`` is this rank's micro-batch (padded with ``pad``; empty for a
        rank past the end of the last, partial global batch). Owns nothing."""
        return _steps(self._engine(), cursor, self.pad, self.micro_batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Move the cursor to the start of ``epoch``, unless it is already inside
        it (a restored mid-epoch cursor is kept), so the usual
        ``sampler.set_epoch(epoch)`` loop works with resumption. An iteration
        under way keeps yielding its own epoch, and no longer moves the cursor."""
        epoch = require_uint64(epoch, "epoch")
        if epoch != self.cursor.epoch:
            self.cursor = self._iter_start = Cursor(epoch, 0)
            self._owner, self._link = None, None

    # -- checkpointing ---------------------------------------------------------
    def _cursor_after(self, batches: int) -> Cursor:
        """The cursor once ``batches`` micro-batches of the current pass were consumed."""
        start = self._iter_start
        position = start.global_index + batches * self.global_batch_size
        if position >= self.epoch_limit:
            return Cursor(start.epoch + 1, 0)
        return Cursor(start.epoch, position)

    def state_dict(self, batches_consumed: int | None = None) -> dict[str, Any]:
        """The cursor and what it belongs to, as plain data (str and int only).

        The cursor is after the micro-batches the training loop has
        received: when a ``DataLoader`` with workers pulls this pass, the
        ones its workers fetched ahead are not counted (as for
        :meth:`PlanBatchSampler.state_dict`). ``batches_consumed``
        (micro-batches the loop has used in the current pass, counted on
        rank 0) overrides that count; without it, a loader whose count
        cannot be known (``in_order=False``, an unknown batch sampler
        around this one) makes a plain call warn. torchdata's
        ``StatefulDataLoader`` gets the cursor of what was handed out when
        it calls this itself.
        """
        cursor = self.cursor
        if batches_consumed is None:
            batches_consumed = loop_count(self._link, self._handed, "NextBatchSampler", "micro-batches",
                                          "batches_consumed")
        if batches_consumed is not None:
            cursor = self._cursor_after(require_uint64(batches_consumed, "batches_consumed"))
        return {
            "format": STATE_FORMAT,
            "cursor": cursor.to_dict(),
            "dataset_key": self.dataset_key,
            "stage": self.stage,
            "manifest_hash": self.manifest.hash.hex(),
            "world_size": self.world_size,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the cursor from :meth:`state_dict` output written at any world
        size; the manifest, dataset key and stage must be the ones it was written with."""
        state_of(state, "NextBatchSampler", STATE_FORMAT, errors.SAMPLER_STATE_INVALID)
        for key, mine in (
            ("manifest_hash", self.manifest.hash.hex()),
            ("dataset_key", self.dataset_key),
            ("stage", self.stage),
        ):
            if state.get(key) != mine:
                raise argument_error(
                    errors.SAMPLER_STATE_INVALID,
                    f"the state was written with {key}={state.get(key)!r} but this sampler has {key}={mine!r}",
                )
        try:
            cursor = as_cursor(state.get("cursor"))
        except UmlosError as exc:
            raise argument_error(errors.SAMPLER_STATE_INVALID, f"the state's cursor: {exc.message}") from None
        try:
            self._call(cursor)  # GLOBAL_POSITION_EXCEEDS_CARDINALITY and friends, now
        except UmlosError as exc:
            raise as_argument_error(exc) from None
        self.cursor = self._iter_start = cursor
        self._owner, self._link = None, None


def _steps(engine: Callable[..., Any], cursor: Cursor, pad: bool,
           micro_batch_size: int) -> Iterator[tuple[Cursor, dict, list]]:
    """Call ``engine`` (``next_batch`` with the configuration bound) from ``cursor``
    to the end of its epoch; a generator's arguments are fixed when it is made,
    which is what makes an iterator a snapshot."""
    epoch = cursor.epoch
    while cursor.epoch == epoch:
        batch = engine(cursor=cursor)
        cursor = batch.cursor
        indices = to_numpy(batch.indices).tolist()
        if pad and len(indices) < micro_batch_size:
            fill = indices[0] if indices else 0
            indices.extend(Padding(fill) for _ in range(micro_batch_size - len(indices)))
        yield cursor, batch.metadata, indices
