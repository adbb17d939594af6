"""``UML_OS.Data.NextBatch_v1`` (docs/spec/nextbatch-v1.md): a global permutation per epoch, strided shards.

The v3.8 kernel's data operator: ``RNG consumption: exactly 1 draw from
stream misc``; a global deterministic permutation from ``manifest_hash +
epoch``; rank ``r`` of ``W`` takes ``indices[r::W]`` of it. Its only cursor
is the epoch: a call returns the rank's whole shard of the epoch, and the
trainer cuts it into batches.

The permutation is pinned to an order the engine already has (docs/spec/
nextbatch-v1.md): NextBatch_v2's train order (block shuffle plus affine maps
inside blocks, O(1) per position, never an O(N) table) of a **derived
manifest** that holds nothing but the dataset entry, the caller's
``sampler_block_size``, ``drop_last: false`` and, under ``extra``, the
caller's ``manifest_hash``. So the order depends on the manifest only
through its hash (as the operator's definition says), is never the order v2 gives the same
manifest, and covers all N samples whatever ``drop_last`` says.

Unlike v2, the shard of a sample changes with the world size (strided, not
contiguous), and a run can only resume at an epoch boundary.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import checks, errors
from ..errors import MAX_WORLD_SIZE, NEXTBATCH_V1_OPERATOR, UmlosError
from ..manifest.core import Manifest, as_manifest
from ..nextbatch import check_request_size, epoch_indices
from .contract import consumes
from .state_fingerprint import order_hash

#: The name of the order v1 is pinned to (metadata ``order``).
ORDER = "nextbatch_v2_train_order_of_derived_manifest"
#: ``extra.derived_for`` of the derived manifest.
DERIVED_FOR = NEXTBATCH_V1_OPERATOR
#: Positions of a shard computed per call of ``epoch_indices`` (32 MiB of uint64).
CHUNK = 1 << 22


@dataclass(frozen=True)
class BatchV1:
    """One NextBatch_v1 result: this rank's shard of the epoch (``indices``,
    uint64), the ``misc`` draw (None without streams) and ``metadata``."""

    indices: np.ndarray
    epoch: int
    misc_draw: int | None
    order_hash: bytes
    metadata: dict[str, Any] = field(repr=False)


def derived_manifest(manifest: Manifest | Mapping[str, Any] | str, dataset_key: str) -> Manifest:
    """The manifest whose NextBatch_v2 train order is NextBatch_v1's permutation."""
    manifest = as_manifest(manifest)
    spec = manifest.dataset(dataset_key)
    return Manifest.from_dict({
        "global_batch_size": 1,
        "data": {"sampler_block_size": manifest.sampler_block_size, "drop_last": False},
        "datasets": {dataset_key: {"id": spec.id, "version": spec.version, "hash": spec.hash,
                                   "cardinality": spec.cardinality}},
        "extra": {"derived_for": DERIVED_FOR, "manifest_hash": manifest.hash.hex()},
    })


def shard_size(n: int, world_size: int, rank: int) -> int:
    """``len(range(rank, n, world_size))``."""
    return 0 if rank >= n else (n - rank + world_size - 1) // world_size


def next_batch_v1(
    manifest: Manifest | Mapping[str, Any] | str,
    key: str,
    world_size: int = 1,
    rank: int = 0,
    epoch: int = 0,
    *,
    streams: Any = None,
    backend: str = "auto",
    t: int | None = None,
) -> BatchV1:
    """Rank ``rank``'s shard ``indices[rank::world_size]`` of epoch ``epoch``'s permutation.

    Args:
        manifest: a :class:`Manifest`, a mapping or a manifest file.
        key: the dataset key.
        world_size, rank: any ``1 <= world_size <= 2^32 - 1``, ``0 <= rank < world_size``
            (no divisibility rule; ranks past N get an empty shard).
        epoch: the epoch (uint64).
        streams: the run's :class:`~umlos_cuda.rng.RngStreams`. The call then
            runs as the declared operator (exactly 1 draw from ``misc``, checked)
            and returns the draw; without it no draw is made.
        backend: as for :func:`umlos_cuda.epoch_indices`.
        t: the caller's step, copied into failure records.

    Raises:
        UmlosError: ``INVALID_MANIFEST``, ``INVALID_DATASET_KEY``,
            ``CARDINALITY_MISMATCH``, ``BATCH_SIZE_INCONSISTENT`` (block size 0),
            ``INVALID_RANK``, ``REQUEST_TOO_LARGE``, with failure operator
            ``UML_OS.Data.NextBatch_v1``; nothing is drawn.
    """
    try:
        call = _validate(manifest, key, world_size, rank, epoch, streams)
        if streams is None:
            return _run(call, None, backend)
        with consumes(streams, "misc", 1, operator=NEXTBATCH_V1_OPERATOR):
            return _run(call, streams, backend)
    except UmlosError as exc:
        if exc.code != errors.RNG_CONSUMPTION_VIOLATION:
            exc.record.update(failure_operator=NEXTBATCH_V1_OPERATOR, data_replay_t=None, t=t)
            if exc.record.get("dataset_key") is None and isinstance(key, str):
                exc.record["dataset_key"] = key
        raise


@dataclass(frozen=True)
class _Call:
    manifest: Manifest
    derived: Manifest
    key: str
    n: int
    world_size: int
    rank: int
    epoch: int


def _invalid(code: str, message: str, key: Any) -> UmlosError:
    """A failed check of docs/spec/nextbatch-v1.md §2, its record naming NextBatch_v1."""
    return UmlosError(code, message, operator=NEXTBATCH_V1_OPERATOR, dataset_key=key)


def _validate(manifest, key, world_size, rank, epoch, streams) -> _Call:
    """The checks, in the order of docs/spec/nextbatch-v1.md §2."""
    manifest = as_manifest(manifest)
    spec = manifest.dataset(key)
    if spec.cardinality == 0:
        raise _invalid(errors.CARDINALITY_MISMATCH, f"dataset {key!r} has cardinality 0; a permutation needs "
                       "at least one sample", key)
    if manifest.sampler_block_size == 0:
        raise _invalid(errors.BATCH_SIZE_INCONSISTENT,
                       "data.sampler_block_size is 0; it must be at least 1 (default 1048576)", key)
    fail = checks.raising(errors.INVALID_MANIFEST, operator=NEXTBATCH_V1_OPERATOR)
    epoch, world_size, rank = (checks.uint64(value, name, fail=fail)
                               for value, name in ((epoch, "epoch"), (world_size, "world_size"), (rank, "rank")))
    if world_size == 0 or world_size > MAX_WORLD_SIZE:
        raise _invalid(errors.INVALID_RANK, f"world_size {world_size} is outside [1, {MAX_WORLD_SIZE}]", key)
    if rank >= world_size:
        raise _invalid(errors.INVALID_RANK, f"rank {rank} is outside [0, {world_size - 1}]", key)
    if streams is not None and not hasattr(streams, "accountant"):
        raise _invalid(errors.RNG_STREAM_INVALID,
                       f"streams must be a umlos_cuda.rng.RngStreams, got {type(streams).__name__}", key)
    check_request_size(shard_size(spec.cardinality, world_size, rank), key)
    return _Call(manifest, derived_manifest(manifest, key), key, spec.cardinality, world_size, rank, epoch)


def _run(call: _Call, streams: Any, backend: str) -> BatchV1:
    draw = None
    metadata: dict[str, Any] = {}
    if streams is not None:
        metadata["misc_offset_before"] = streams.offset("misc")
        draw = int(streams.draw("misc", 1)[0])
        metadata["misc_offset_after"] = streams.offset("misc")
    indices, backend_name = _strided(call, backend)
    order = order_hash(call.derived, call.key, call.epoch)
    if streams is not None:
        streams.accountant.attach(cursor=(call.epoch, 0, order))
    metadata.update({
        "operator": NEXTBATCH_V1_OPERATOR,
        "dataset_key": call.key,
        "epoch": call.epoch,
        "world_size": call.world_size,
        "rank": call.rank,
        "count": int(indices.size),
        "cardinality": call.n,
        "order": ORDER,
        "order_hash": order.hex(),
        "manifest_hash": call.manifest.hash.hex(),
        "derived_manifest_hash": call.derived.hash.hex(),
        "backend": backend_name,
    })
    return BatchV1(indices, call.epoch, draw, order, metadata)


def _strided(call: _Call, backend: str) -> tuple[np.ndarray, str]:
    """``order[rank::world_size]``: the order at the shard's positions ``rank, rank + W, ...`` alone
    (``epoch_indices`` with ``stride``: each position is mapped by itself, O(1) each), so a rank's shard costs
    O(N / W) whatever the world size, never the whole epoch. Computed in windows of at most ``CHUNK``
    positions, so that no call asks ``epoch_indices`` (or a device) for more than one window."""
    from ..backends import get_backend, to_numpy

    engine = get_backend(backend)
    out = np.empty(shard_size(call.n, call.world_size, call.rank), dtype=np.uint64)
    for first in range(0, out.size, CHUNK):
        count = min(CHUNK, out.size - first)
        out[first : first + count] = to_numpy(epoch_indices(
            call.derived, call.key, epoch=call.epoch, start=call.rank + first * call.world_size, count=count,
            stride=call.world_size, backend=engine.name))
    return out, engine.name
