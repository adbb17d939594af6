"""NVIDIA DALI integration: NextBatch_v2 index batches for ``fn.external_source``.

:class:`IndexSource` is a batch-mode source for one shard (one pipeline per
GPU, ``shard_id`` = rank, ``num_shards`` = world size). DALI calls it with a
``BatchInfo(iteration, epoch_idx)``; it answers with that iteration's
micro-batch of sample indices: NumPy arrays for CPU pipelines, CuPy arrays for
GPU pipelines. It is a pure function of ``(start cursor, epoch_idx,
iteration)``, so DALI's prefetching, ``reset()`` between epochs and parallel
external sources all see the same sequence, and a pipeline resumes from a
checkpointed cursor by passing it as ``cursor``.

Nothing here imports DALI; :func:`external_source` does, when called inside a
pipeline definition. Install with the ``dali-cu12`` or ``dali-cu13`` extra
(``nvidia-dali-cuda120`` / ``-cuda130``, by the driver's CUDA major:
docs/install.md; its CPU pipelines run on machines without a GPU)::

    from nvidia.dali import pipeline_def, fn
    import umlos_cuda.dali as ud

    source = ud.IndexSource(manifest, "train", shard_id=rank, num_shards=world, reader=read_jpeg)

    @pipeline_def(batch_size=source.micro_batch_size, num_threads=4, device_id=0)
    def pipe():
        indices, jpegs = ud.external_source(source)
        return indices, fn.decoders.image(jpegs, device="mixed")

Outputs, in order: ``indices`` (one int64 scalar per sample, as a list of
0-d NumPy arrays on the CPU, the form DALI's ``parallel=True`` workers also
accept, or one CuPy array on the GPU); ``samples``
when a ``reader`` is given (``reader(index)`` per sample); ``valid`` (one bool
per sample) when ``pad`` is set. The epoch ends (the source raises
``StopIteration``, DALI's end of epoch) after its last global batch, or, without
``pad``, at a global batch whose slice for this shard is empty (DALI refuses
empty batches): with ``drop_last`` in the manifest that never happens.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import numpy as np

from . import checks, errors
from .backends import to_numpy
from .cursor import Cursor, as_cursor
from .errors import UmlosError
from .manifest.core import Manifest, as_manifest
from .nextbatch import next_batch
from .world import resolve_world

DEVICES = ("cpu", "gpu")


def _argument_error(code: str, message: str) -> UmlosError:
    return UmlosError(code, message, operator=errors.DALI_OPERATOR)


def _resolve_shard(shard_id: Any, num_shards: Any) -> tuple[int, int]:
    world, rank = resolve_world(num_shards, shard_id, size_name="num_shards", operator=errors.DALI_OPERATOR)
    return rank, world


class IndexSource:
    """Batch-mode ``external_source`` callable yielding one shard's NextBatch_v2 micro-batches.

    Args:
        manifest: a :class:`~umlos_cuda.Manifest`, a mapping, or a YAML/JSON path.
        dataset_key: a key of ``manifest.datasets``.
        shard_id, num_shards: this pipeline's rank and the world size; default
            ``$RANK`` / ``$WORLD_SIZE`` (or ``torch.distributed``), else 0 / 1.
            ``global_batch_size`` must be divisible by ``num_shards``; the
            pipeline's ``batch_size`` must be :attr:`micro_batch_size`.
        stage: ``"train"``, ``"eval"`` or ``"infer"``.
        cursor: where epoch index 0, iteration 0 starts (default ``Cursor(0, 0)``):
            the cursor a checkpoint saved, see :meth:`cursor_after`.
        device: ``"cpu"`` (NumPy outputs) or ``"gpu"`` (CuPy outputs).
        backend: engine backend; default ``"cupy"`` for ``device="gpu"``, else ``"auto"``.
        reader: optional ``reader(index) -> array``: adds a ``samples`` output.
        pad: pad short micro-batches to :attr:`micro_batch_size` (the padded
            slots repeat the first index of the micro-batch, or 0) and add a
            ``valid`` output that masks them.
        replay_token: 32 bytes replacing the manifest's derived token (R3).
    """

    def __init__(
        self,
        manifest: Manifest | Mapping[str, Any] | str | os.PathLike[str],
        dataset_key: str,
        shard_id: int | None = None,
        num_shards: int | None = None,
        stage: str = "train",
        *,
        cursor: Cursor | Mapping[str, int] | None = None,
        device: str = "cpu",
        backend: str | None = None,
        reader: Callable[[int], Any] | None = None,
        pad: bool = False,
        replay_token: bytes | None = None,
    ) -> None:
        checks.choice(device, "device", DEVICES, fail=partial(_argument_error, errors.INVALID_ARGUMENT),
                      message="{name} {value!r} is not one of {choices}")
        self.manifest = manifest = as_manifest(manifest)
        self.dataset_key = dataset_key
        self.shard_id, self.num_shards = _resolve_shard(shard_id, num_shards)
        self.stage = stage
        self.cursor = as_cursor(cursor)
        self.device = device
        self.backend = backend if backend is not None else ("cupy" if device == "gpu" else "auto")
        self.reader = reader
        self.pad = bool(pad)
        self.replay_token = replay_token
        self._epochs_seen = 0  # for integer (batch_info=False) calls
        probe = self._batch(self.cursor)  # validates the configuration now
        self.global_batch_size = manifest.global_batch_size
        self.micro_batch_size = probe.metadata["micro_batch_size"]
        n = manifest.dataset(dataset_key).cardinality
        drop = stage == "train" and manifest.drop_last
        self.epoch_limit = (n // self.global_batch_size) * self.global_batch_size if drop else n

    @property
    def num_outputs(self) -> int:
        """1 (indices), plus 1 with a ``reader`` (samples), plus 1 with ``pad`` (valid)."""
        return 1 + (self.reader is not None) + self.pad

    def _batch(self, cursor: Cursor):
        return next_batch(
            self.manifest,
            self.dataset_key,
            world_size=self.num_shards,
            rank=self.shard_id,
            stage=self.stage,
            cursor=cursor,
            replay_token=self.replay_token,
            backend=self.backend,
        )

    def cursor_at(self, epoch_idx: int, iteration: int) -> Cursor | None:
        """The cursor before DALI's ``(epoch_idx, iteration)``, or None past the epoch's end."""
        epoch_idx, iteration = (checks.integer(value, what, 0, None, message=checks.AT_LEAST,
                                               fail=partial(_argument_error, errors.INVALID_ARGUMENT))
                                for value, what in ((epoch_idx, "epoch_idx"), (iteration, "iteration")))
        if epoch_idx == 0:
            epoch, start = self.cursor.epoch, self.cursor.global_index
        else:
            epoch, start = self.cursor.epoch + int(epoch_idx), 0
        position = start + int(iteration) * self.manifest.global_batch_size
        if position >= self.epoch_limit:
            return None
        return Cursor(epoch, position)

    def cursor_after(self, epoch_idx: int, iteration: int) -> Cursor:
        """The cursor to checkpoint once the pipeline output of ``(epoch_idx,
        iteration)`` has been consumed: pass it as ``cursor`` to resume."""
        before = self.cursor_at(epoch_idx, iteration)
        if before is None:
            return Cursor(self.cursor.epoch + int(epoch_idx) + 1, 0)
        return self._batch(before).cursor

    def __call__(self, info: Any):
        if checks.is_integer(info):
            iteration, epoch_idx = int(info), self._epochs_seen  # batch_info=False: count the epochs here
        else:
            iteration, epoch_idx = info.iteration, info.epoch_idx
        cursor = self.cursor_at(epoch_idx, iteration)
        if cursor is None:
            self._epochs_seen = epoch_idx + 1
            raise StopIteration
        indices = self._batch(cursor).indices
        count = int(indices.shape[0])
        if count == 0 and not self.pad:
            self._epochs_seen = epoch_idx + 1
            raise StopIteration
        if self.device == "gpu":
            import cupy as xp

            indices = xp.asarray(indices)
        else:
            xp, indices = np, to_numpy(indices)
        indices = indices.astype(xp.int64)
        valid = xp.ones(count, dtype=xp.bool_)
        if self.pad and count < self.micro_batch_size:
            short = self.micro_batch_size - count
            fill = int(indices[0]) if count else 0
            indices = xp.concatenate([indices, xp.full(short, fill, dtype=xp.int64)])
            valid = xp.concatenate([valid, xp.zeros(short, dtype=xp.bool_)])
        outputs = [indices]
        if self.reader is not None:
            outputs.append([xp.asarray(self.reader(i)) for i in to_numpy(indices).tolist()])
        if self.pad:
            outputs.append(valid)
        if xp is np:  # one 0-d array per sample: the form DALI's parallel (worker) mode accepts too
            outputs = [o if isinstance(o, list) else [o[k, ...] for k in range(len(o))] for o in outputs]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


def external_source(source: IndexSource, **kwargs: Any):
    """``nvidia.dali.fn.external_source`` wired for ``source`` (batch mode,
    ``batch_info=True``, its device and number of outputs); call it inside a
    pipeline definition: one node for the indices alone, else a list of nodes
    (indices, samples, valid). Extra keyword arguments go to DALI."""
    from nvidia.dali import fn

    kwargs.setdefault("device", source.device)
    if source.num_outputs > 1:  # one output is a single node, several a list of nodes
        kwargs.setdefault("num_outputs", source.num_outputs)
    return fn.external_source(source=source, batch=True, batch_info=True, **kwargs)
