"""NextBatch_v2 (R4-R9, docs/spec/nextbatch-v2.md §3 and §4) and the bulk
``epoch_indices`` entry point (R10).

A call is pure: ``(manifest, dataset_key, world_size, rank, stage, cursor)`` in,
``(indices, cursor_next, metadata)`` out. Rank ``r`` of ``W`` takes the
contiguous slice ``[gp + r*mb, gp + (r+1)*mb)`` of the global virtual sequence,
clipped to the epoch, so concatenating ranks 0..W-1 gives the same global batch
for every W. Validation happens on the host, before any backend runs, in a
fixed order so that a bad call always reports the same code.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import checks, errors
from .backends import get_backend
from .cursor import Cursor, as_cursor
from .dtypes import check_fits, output_dtype
from .epoch import PlanCache, check_plan_budget, epoch_seed, limit_setting
from .errors import MAX_WORLD_SIZE, UINT64_MAX, UmlosError
from .hashing import hash_canonical, sha256
from .manifest.core import Manifest, as_manifest
from .modes import SEQUENTIAL_MODE, block_affine
from .presets import STAGES
from .sampler import SamplerConfig, resolve_sampler, sampler_config_hash

__all__ = [
    "Batch",
    "STAGES",
    "check_dataset_length",
    "check_request_size",
    "data_replay_t",
    "epoch_indices",
    "epoch_window",
    "next_batch",
    "sampler_config_hash",
]

#: The default mode's R9 ``sampling_mode`` strings (modes/), under their earlier names.
MODE_SHUFFLE = block_affine.TRAIN_MODE
MODE_SEQUENTIAL = SEQUENTIAL_MODE
SUBSAMPLING_TRAIN = "SHUFFLE_WITHOUT_REPLACEMENT"
SUBSAMPLING_NONE = "NONE"
#: The most indices one call returns unless UMLOS_MAX_INDICES says otherwise:
#: 2^32 indices are 32 GiB as uint64, more than any one batch or window needs
#: and far below what would exhaust a host only after minutes of work.
DEFAULT_MAX_INDICES = 1 << 32

#: Every failure of a next_batch or epoch_indices call names this operator
#: (docs/spec/nextbatch-v2.md §2), whichever part raised it.
OPERATOR = errors.NEXTBATCH_OPERATOR

_plans = PlanCache()


@dataclass(frozen=True)
class Batch:
    """One NextBatch_v2 result: this rank's ``indices``, the ``cursor`` after the
    call, and its R9 ``metadata``."""

    indices: Any
    cursor: Cursor
    metadata: dict[str, Any] = field(repr=False)


@dataclass(frozen=True, slots=True)
class _Call:
    """A validated call: everything the index arithmetic needs, as plain ints."""

    manifest: Manifest
    dataset_key: str
    n: int
    global_batch_size: int
    token: bytes
    sampler: SamplerConfig
    epoch_limit: int


def data_replay_t(token: bytes, dataset_key: str, epoch: int, global_position: int, world_size: int,
                  rank: int) -> bytes:
    """R9 ``data_replay_t`` (32 bytes), from the cursor before the call."""
    return hash_canonical(["nextbatch_v2", token, dataset_key, epoch, global_position, world_size, rank])


def _record_replay_t(manifest, dataset_key, world_size, rank, cursor, replay_token) -> str | None:
    """``data_replay_t`` (hex) for a failure record, computed from the raw call
    inputs whenever they are well-typed (R8: the record carries it even when the
    call fails a semantic check such as ``G % W``); None when they are not."""
    try:
        manifest = as_manifest(manifest)
        token = manifest.resolve_replay_token(replay_token)
        cursor = as_cursor(cursor)
        world_size = _uint64(world_size, "world_size")
        rank = _uint64(rank, "rank")
    except UmlosError:
        return None
    if not isinstance(dataset_key, str) or world_size > MAX_WORLD_SIZE or rank > MAX_WORLD_SIZE:
        return None
    return data_replay_t(token, dataset_key, cursor.epoch, cursor.global_index, world_size, rank).hex()


def _uint64(value: Any, what: str) -> int:
    """R8's last row: in a call, a value that is not an integer in [0, 2^64 - 1] is INVALID_MANIFEST."""
    return checks.uint64(value, what, fail=_r8_invalid)


_r8_invalid = checks.raising(errors.INVALID_MANIFEST, operator=OPERATOR)


def _call_cursor(value: Any) -> Cursor:
    """The call's cursor. Check 9 of docs/spec/nextbatch-v2.md §2: within a
    call, a cursor that is not a pair of integers in [0, 2^64 - 1] is
    INVALID_MANIFEST (R8), where a cursor made on its own is INVALID_CURSOR."""
    try:
        return as_cursor(value)
    except UmlosError as exc:
        raise UmlosError(errors.INVALID_MANIFEST, exc.message, operator=OPERATOR) from None


def _complete_record(exc: UmlosError, dataset_key: Any, replay_t, **fields: Any) -> None:
    """Fill what a failure record raised deep inside a call does not know.

    Helpers (backends, the plan builder, the manifest, the cursor) raise
    without the call's context and name their own operator; the entry point
    names itself as ``failure_operator`` (the operator the caller invoked,
    docs/spec/nextbatch-v2.md §2), adds the caller's ``dataset_key``, the
    fields in ``fields`` (``t``) and ``data_replay_t`` (``replay_t()``, hex or
    None) so that every record of a call whose inputs are well-typed carries
    the replay token (R3) without the caller passing anything."""
    exc.record.update(fields, failure_operator=OPERATOR)
    if exc.record.get("dataset_key") is None and isinstance(dataset_key, str):
        exc.record["dataset_key"] = dataset_key
    if exc.record.get("data_replay_t") is None:
        exc.record["data_replay_t"] = replay_t()


def check_request_size(count: int, dataset_key: str | None = None) -> None:
    """Refuse a call that would return more than UMLOS_MAX_INDICES indices.

    Checked before anything is allocated, so an impossible request (a
    ``global_batch_size`` of 2^40 in eval is 8 TiB of output) fails at once
    with REQUEST_TOO_LARGE instead of with the allocator's MemoryError.
    """
    limit = limit_setting("UMLOS_MAX_INDICES", DEFAULT_MAX_INDICES, operator=OPERATOR)
    if count > limit:
        raise UmlosError(
            errors.REQUEST_TOO_LARGE,
            f"this call would return {count} indices ({_gib(count)} as uint64); one call returns at most "
            f"{limit} (UMLOS_MAX_INDICES, default {DEFAULT_MAX_INDICES}): ask for a smaller window or batch",
            dataset_key=dataset_key,
            operator=OPERATOR,
        )


@contextlib.contextmanager
def _out_of_memory_is_refused(count: int, dataset_key: str) -> Iterator[None]:
    """Turn a MemoryError while computing ``count`` indices into REQUEST_TOO_LARGE:
    a request under the bound can still exceed what this machine can allocate."""
    try:
        yield
    except MemoryError as exc:
        raise UmlosError(
            errors.REQUEST_TOO_LARGE,
            f"this machine could not allocate the {count} indices ({_gib(count)} as uint64) "
            f"of this call ({exc}); ask for a smaller window or batch",
            dataset_key=dataset_key,
            operator=OPERATOR,
        ) from exc


def _gib(count: int) -> str:
    return f"{count * 8 / (1 << 30):,.1f} GiB"


def _validate(manifest: Any, dataset_key: Any, stage: Any, preset: Any, replay_token: Any) -> _Call:
    """Checks shared by every entry point, in the order of R8's table."""
    manifest = as_manifest(manifest)
    dataset = manifest.dataset(dataset_key)
    sampler = resolve_sampler(manifest, stage, preset)
    token = manifest.resolve_replay_token(replay_token)
    n = dataset.cardinality
    if n == 0:
        raise UmlosError(
            errors.CARDINALITY_MISMATCH,
            f"dataset {dataset_key!r} has cardinality 0; a sampler needs at least one sample",
            dataset_key=dataset_key,
            operator=OPERATOR,
        )
    g = manifest.global_batch_size
    if g == 0:
        raise UmlosError(errors.BATCH_SIZE_INCONSISTENT, "global_batch_size is 0; it must be at least 1",
                         dataset_key=dataset_key, operator=OPERATOR)
    if sampler.block_size == 0:
        raise UmlosError(
            errors.BATCH_SIZE_INCONSISTENT,
            "data.sampler_block_size is 0; it must be at least 1 (default 1048576)",
            dataset_key=dataset_key,
            operator=OPERATOR,
        )
    train_drops = sampler.shuffled and sampler.drop_last
    if train_drops and g > n:
        raise UmlosError(
            errors.BATCH_SIZE_INCONSISTENT,
            f"train with drop_last needs global_batch_size <= N, got {g} > {n}: every batch would be dropped",
            dataset_key=dataset_key,
            operator=OPERATOR,
        )
    epoch_limit = (n // g) * g if train_drops else n
    return _Call(manifest, dataset_key, n, g, token, sampler, epoch_limit)


def _validate_rank(world_size: Any, rank: Any, g: int, dataset_key: str) -> tuple[int, int]:
    world_size = _uint64(world_size, "world_size")
    rank = _uint64(rank, "rank")
    if world_size == 0 or world_size > MAX_WORLD_SIZE:
        raise UmlosError(
            errors.INVALID_RANK, f"world_size {world_size} is outside [1, {MAX_WORLD_SIZE}]", dataset_key=dataset_key,
            operator=OPERATOR,
        )
    if rank >= world_size:
        raise UmlosError(errors.INVALID_RANK, f"rank {rank} is outside [0, {world_size - 1}]", dataset_key=dataset_key,
                         operator=OPERATOR)
    if g % world_size:
        raise UmlosError(
            errors.BATCH_SIZE_INCONSISTENT,
            f"global_batch_size {g} is not divisible by world_size {world_size}",
            dataset_key=dataset_key,
            operator=OPERATOR,
        )
    return world_size, rank


def _plan(backend, call: _Call, epoch: int):
    """The epoch's plan of the call's sampling mode on ``backend`` (cached)."""
    mode, block_size = call.sampler.mode, call.sampler.block_size
    seed16 = epoch_seed(call.token, call.manifest.hash, call.dataset_key, epoch)
    check_plan_budget(mode.plan_blocks(call.n, block_size), call.n, block_size)
    return _plans.get(
        (backend.name, mode.name, seed16, call.n, block_size),
        lambda: backend.build_plan(seed16, call.n, block_size, mode.name),
    )


def _emit(backend, call: _Call, epoch: int, start: int, count: int, out=None, *, stride=1, dtype=None, stream=None):
    """Indices of ``count`` positions ``start + i * stride`` of ``epoch`` (no wrap):
    through the sampling mode's plan when the sampler shuffles, else the positions."""
    if call.sampler.shuffled and count:
        plan = _plan(backend, call, epoch)
        return backend.map_train(plan, start, count, out, stride=stride, dtype=dtype, stream=stream)
    return backend.sequential(start, count, out, stride=stride, dtype=dtype, stream=stream)


def _emit_streaming(backend, call: _Call, epoch: int, start: int, count: int):
    """The streaming preset: positions past N continue in the next epoch's order."""
    pieces = []
    position = start
    end = start + count
    while position < end:
        epoch_offset, local = divmod(position, call.n)
        length = min(end, (epoch_offset + 1) * call.n) - position
        if epoch + epoch_offset > UINT64_MAX:
            raise UmlosError(errors.UINT64_OVERFLOW, "the epoch counter would pass 2^64 - 1",
                             dataset_key=call.dataset_key,
                             operator=OPERATOR)
        pieces.append(_emit(backend, call, epoch + epoch_offset, local, length))
        position += length
    if not pieces:
        return backend.sequential(0, 0)
    if len(pieces) == 1:
        return pieces[0]
    return backend.xp.concatenate(pieces)


def _advance(call: _Call, cursor: Cursor) -> tuple[Cursor, int]:
    """R7 cursor advance (streaming: carry into following epochs)."""
    g = call.global_batch_size
    if call.sampler.streaming:
        epochs, index = divmod(cursor.global_index + g, call.n)
        produced = g
    else:
        produced = min(g, call.epoch_limit - cursor.global_index)
        index = cursor.global_index + produced
        epochs = 0
        if index >= call.epoch_limit:
            epochs, index = 1, 0
    if cursor.epoch + epochs > UINT64_MAX:
        raise UmlosError(errors.UINT64_OVERFLOW, "the epoch counter would pass 2^64 - 1", dataset_key=call.dataset_key,
                         operator=OPERATOR)
    return Cursor(cursor.epoch + epochs, index), produced


def next_batch(
    manifest: Manifest | Mapping[str, Any] | str | os.PathLike[str],
    dataset_key: str,
    world_size: int = 1,
    rank: int = 0,
    stage: str = "train",
    cursor: Cursor | Mapping[str, int] | None = None,
    replay_token: bytes | None = None,
    backend: str = "auto",
    *,
    preset: str | None = None,
    t: int | None = None,
) -> Batch:
    """This rank's next micro-batch of sample indices (NextBatch_v2).

    Args:
        manifest: a :class:`Manifest` (or a mapping or a file path, validated on every call).
        dataset_key: a key of ``manifest.datasets``.
        world_size, rank: the data-parallel layout; ``global_batch_size`` must
            be divisible by ``world_size``. Any layout yields the same global
            sequence.
        stage: ``"train"`` (shuffled), ``"eval"`` or ``"infer"`` (sequential,
            final partial batch emitted).
        cursor: ``Cursor(epoch, global_index)`` before the call (default: start).
        replay_token: 32 bytes replacing the manifest's derived token (R3).
        backend: ``"numpy"``, ``"native"``, ``"cupy"`` or ``"auto"``.
        preset: a preset name (docs/spec/nextbatch-v2.md §5); ``"streaming_infinite"`` crosses epoch
            boundaries (see docs/nextbatch.md). Overrides ``stage``.
        t: the caller's step counter, copied into failure records.

    Returns:
        :class:`Batch` with ``indices`` (uint64; NumPy, or CuPy for ``cupy``),
        ``cursor`` (after the call) and ``metadata``.

    Raises:
        UmlosError: with an R8 code on any invalid input; nothing is computed.
    """
    context: dict[str, Any] = {"t": t}
    try:
        call = _validate(manifest, dataset_key, stage, preset, replay_token)
        cursor = _call_cursor(cursor)
        world_size, rank = _validate_rank(world_size, rank, call.global_batch_size, call.dataset_key)
        context["data_replay_t"] = data_replay_t(
            call.token, call.dataset_key, cursor.epoch, cursor.global_index, world_size, rank
        ).hex()
        limit = call.n if call.sampler.streaming else call.epoch_limit
        if cursor.global_index >= limit:
            raise UmlosError(
                errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY,
                f"cursor.global_index {cursor.global_index} is outside the epoch [0, {limit - 1}]",
                dataset_key=call.dataset_key,
                operator=OPERATOR,
            )
        micro = call.global_batch_size // world_size
        first = cursor.global_index + rank * micro
        if call.sampler.streaming:
            check_request_size(micro, call.dataset_key)
            engine = get_backend(backend)
            with _out_of_memory_is_refused(micro, call.dataset_key):
                indices = _emit_streaming(engine, call, cursor.epoch, first, micro)
        else:
            lo = min(first, call.epoch_limit)
            hi = min(first + micro, call.epoch_limit)
            check_request_size(hi - lo, call.dataset_key)
            engine = get_backend(backend)
            with _out_of_memory_is_refused(hi - lo, call.dataset_key):
                indices = _emit(engine, call, cursor.epoch, lo, hi - lo)
        cursor_next, produced = _advance(call, cursor)
    except UmlosError as exc:
        _complete_record(
            exc, dataset_key, lambda: context.get("data_replay_t") or _record_replay_t(
                manifest, dataset_key, world_size, rank, cursor, replay_token
            ), t=t,
        )
        raise
    metadata = _metadata(call, cursor, cursor_next, world_size, rank, micro, produced, engine.name, context)
    return Batch(indices, cursor_next, metadata)


def _metadata(call: _Call, before: Cursor, after: Cursor, world_size, rank, micro, produced, backend_name, context):
    sampler = call.sampler
    shuffled = sampler.shuffled
    seed16 = epoch_seed(call.token, call.manifest.hash, call.dataset_key, before.epoch)
    return {
        "dataset_key": call.dataset_key,
        "stage": sampler.stage,
        "preset": sampler.preset,
        "epoch": before.epoch,
        "global_position": before.global_index,
        "cursor_before": before.to_dict(),
        "cursor_after": after.to_dict(),
        "is_shuffled": shuffled,
        "world_size": world_size,
        "rank": rank,
        "micro_batch_size": micro,
        "global_batch_size": call.global_batch_size,
        "effective_batch_size": call.global_batch_size,  # R9: B_eff = global_batch_size
        "produced_global_count": produced,
        "effective_q": float(call.global_batch_size) / float(call.n),
        "subsampling_mode": SUBSAMPLING_TRAIN if shuffled else SUBSAMPLING_NONE,
        "sampling_mode": sampler.sampling_mode,
        "sampler_block_size": sampler.block_size,
        "drop_last": sampler.drop_last,
        "sampler_config_hash": sampler.config_hash.hex(),
        "blocks_materialized": sampler.mode.plan_blocks(call.n, sampler.block_size) if shuffled else 0,
        "epoch_seed_hash": sha256(seed16).hex(),
        "data_replay_t": context["data_replay_t"],
        "manifest_hash": call.manifest.hash.hex(),
        "backend": backend_name,
    }


def epoch_indices(
    manifest: Manifest | Mapping[str, Any] | str | os.PathLike[str],
    dataset_key: str,
    epoch: int = 0,
    start: int = 0,
    count: int | None = None,
    replay_token: bytes | None = None,
    backend: str = "auto",
    *,
    stride: int = 1,
    out=None,
    dtype=None,
    stream=None,
):
    """Positions ``start, start + stride, ...`` (``count`` of them) of one epoch's train-mode virtual sequence (R10).

    The sequence has ``epoch_limit`` positions: N, or ``floor(N/G)*G`` with
    ``drop_last``. ``count=None`` runs to its end. Windows of millions of
    positions are the intended use (prefetchers, offline plans); memory is the
    output plus the epoch's plan. ``stride`` (default 1: a contiguous window)
    takes every ``stride``-th position, e.g. rank ``r`` of ``W`` reading the
    positions ``r, r + W, ...`` of a rank-strided order without computing the
    others. ``out`` may be a preallocated array of exactly ``count`` elements
    (a contiguous NumPy array, or a CuPy array for the cupy backend); its dtype
    is the output dtype. ``dtype`` is ``uint64`` (default), ``int64`` or
    ``int32``, a signed type only when every index of the epoch (``N - 1``)
    fits in it, else OUTPUT_DTYPE_OVERFLOW. ``stream`` is the CUDA stream the
    cupy backend launches on (default: the current stream); host backends ignore it.
    """
    context: dict[str, Any] = {}
    try:
        call, epoch, start, count, stride = _window(manifest, dataset_key, epoch, start, count, stride, replay_token,
                                                    context)
        return _epoch_indices(call, epoch, start, count, stride, backend, out, dtype, stream)
    except UmlosError as exc:
        _complete_record(exc, dataset_key, lambda: context.get("data_replay_t"))
        raise


def _epoch_indices(call: _Call, epoch: int, start: int, count: int, stride: int, backend, out, dtype, stream):
    if out is not None and getattr(out, "shape", None) != (count,):
        raise UmlosError(
            errors.INVALID_ARGUMENT, f"out must be an array of shape ({count},), got {getattr(out, 'shape', out)!r}",
            operator=OPERATOR,
        )
    if out is not None:
        if dtype is not None and output_dtype(dtype) != output_dtype(out.dtype):
            raise UmlosError(errors.INVALID_ARGUMENT, f"dtype {dtype!r} differs from out's dtype {out.dtype}",
                             operator=OPERATOR)
        dtype = out.dtype
    dtype = output_dtype(dtype)
    check_fits(dtype, call.n - 1, f"an epoch of N = {call.n}")
    check_request_size(count, call.dataset_key)
    engine = get_backend(backend)
    with _out_of_memory_is_refused(count, call.dataset_key):
        return _emit(engine, call, epoch, start, count, out, stride=stride, dtype=dtype, stream=stream)


def epoch_window(
    manifest, dataset_key: str, start: int = 0, count: int | None = None, *, epoch: int = 0, stride: int = 1
) -> tuple[int, int]:
    """Validate a window of an epoch's train sequence without computing it.

    Returns ``(start, count)`` with ``count`` resolved (``None`` means to the
    end of the epoch: every ``stride``-th position from ``start``); raises
    exactly what :func:`epoch_indices` would for the validation of its window
    (failure record included).
    """
    context: dict[str, Any] = {}
    try:
        _, _, start, count, _ = _window(manifest, dataset_key, epoch, start, count, stride, None, context)
    except UmlosError as exc:
        _complete_record(exc, dataset_key, lambda: context.get("data_replay_t"))
        raise
    return start, count


def _window(manifest, dataset_key, epoch, start, count, stride, replay_token, context: dict[str, Any]):
    """Validate an ``epoch_indices`` window. Once the epoch and start are known,
    ``context["data_replay_t"]`` holds the window's replay token: the R9 value
    of a world-size-1 call at cursor ``(epoch, start)``, whose batch begins
    where the window does."""
    call = _validate(manifest, dataset_key, "train", None, replay_token)
    epoch = _uint64(epoch, "epoch")
    start = _uint64(start, "start")
    context["data_replay_t"] = data_replay_t(call.token, call.dataset_key, epoch, start, 1, 0).hex()
    # not an R8 input: INVALID_ARGUMENT
    stride = checks.uint64(stride, "stride", fail=checks.raising(errors.INVALID_ARGUMENT, operator=OPERATOR))
    if stride == 0:
        raise UmlosError(errors.INVALID_ARGUMENT, "stride must be at least 1 (1: a contiguous window)",
                         operator=OPERATOR)
    limit = call.epoch_limit
    if start > limit:
        raise UmlosError(
            errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY,
            f"start {start} is past the end of the epoch ({limit} positions)",
            dataset_key=call.dataset_key,
            operator=OPERATOR,
        )
    if count is None:
        count = -(-(limit - start) // stride)
    count = _uint64(count, "count")
    if count and start + (count - 1) * stride >= limit:
        last = start + (count - 1) * stride
        shown = f"[{start}, {start + count})" if stride == 1 else f"{start}, {start + stride}, ..., {last}"
        raise UmlosError(
            errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY,
            f"window {shown} passes the end of the epoch ({limit} positions)",
            dataset_key=call.dataset_key,
            operator=OPERATOR,
        )
    return call, epoch, start, count, stride


def check_dataset_length(manifest: Manifest, dataset_key: str, actual_length: int) -> None:
    """R8: a bound dataset whose real length differs from ``cardinality`` aborts."""
    declared = as_manifest(manifest).dataset(dataset_key).cardinality
    if int(actual_length) != declared:
        raise UmlosError(
            errors.CARDINALITY_MISMATCH,
            f"dataset {dataset_key!r} has {actual_length} samples but the manifest declares cardinality {declared}",
            dataset_key=dataset_key,
            operator=OPERATOR,
        )
