"""The inverse of the train order: where in an epoch a sample appears.

``position_of(manifest, dataset_key, epoch, index)`` is the position ``p`` of
epoch ``epoch``'s train order (the order ``epoch_indices`` and ``next_batch``
follow) whose index is ``index``: ``epoch_indices(m, key, epoch, start=p,
count=1)[0] == index``. It answers "which step saw this sample?" for data
attribution and debugging, and it proves that each sampling mode is a
bijection. Each mode registers its inverse map (``SamplingMode.inverse``):
``block_affine`` inverts the block order and the affine map (the modular
inverse of the block's multiplier), the Feistel modes run their rounds
backwards with cycle-walking. Like the forward map it costs O(1) per index
after the epoch's plan, which is cached.

With ``drop_last`` a train epoch stops at ``floor(N / G) * G`` positions; a
sample whose position is at or past that limit is not emitted in that epoch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import checks, errors
from .backends import get_backend
from .errors import UmlosError
from .modes import get_mode, mode_names
from .nextbatch import OPERATOR, _complete_record, _plan, _uint64, _validate

__all__ = ["position_of"]

#: Indices inverted per step (bounds the temporaries of the NumPy inverse maps).
CHUNK = 1 << 18


def position_of(manifest, dataset_key: str, epoch: int, index, replay_token: bytes | None = None):
    """The train position of sample ``index`` in epoch ``epoch`` of ``dataset_key``.

    Args:
        manifest: a :class:`~umlos_cuda.Manifest`, a mapping or a manifest file path.
        dataset_key: a key of ``manifest.datasets``.
        epoch: the epoch (uint64).
        index: one sample index (an int) or an array of them (any integer
            dtype, any shape), each in ``[0, N)``.
        replay_token: 32 bytes replacing the manifest's derived token (R3), as in ``epoch_indices``.

    Returns:
        an int for an int ``index``, else a uint64 array of ``index``'s shape.

    Raises:
        UmlosError: the manifest and dataset checks of ``epoch_indices``;
            INVALID_ARGUMENT for an index that is not an integer in ``[0, N)``.
    """
    try:
        call = _validate(manifest, dataset_key, "train", None, replay_token)
        epoch = _uint64(epoch, "epoch")
        indices, scalar = _indices(index, call.n, call.dataset_key)
        mode = call.sampler.mode
        if mode.inverse is None:
            with_inverse = [name for name in mode_names() if get_mode(name).inverse is not None]
            raise UmlosError(
                errors.INVALID_MANIFEST,
                f"sampling mode {mode.name!r} has no inverse map; position_of runs {', '.join(with_inverse)}",
                dataset_key=call.dataset_key,
                operator=OPERATOR,
            )
        plan = _plan(_host_backend(), call, epoch)
        flat = indices.reshape(-1)
        positions = np.empty_like(flat)
        for offset in range(0, flat.shape[0], CHUNK):
            positions[offset : offset + CHUNK] = mode.inverse(plan, flat[offset : offset + CHUNK])
    except UmlosError as exc:
        _complete_record(exc, dataset_key, lambda: None)
        raise
    return int(positions[0]) if scalar else positions.reshape(indices.shape)


def _host_backend():
    """The native backend builds block tables fastest; NumPy's plans are the same."""
    try:
        return get_backend("native")
    except UmlosError:
        return get_backend("numpy")


def _indices(index: Any, n: int, dataset_key: str) -> tuple[np.ndarray, bool]:
    """``index`` as a uint64 array, and whether it was one int; each value checked to be in ``[0, n)``."""
    if checks.is_integer(index):
        value = checks.integer(index, "index", 0, n - 1, fail=lambda message: _bad_index(message, dataset_key),
                               message=f"{{name}} {{value}} is outside [0, {n})")
        return np.array([value], dtype=np.uint64), True
    array = np.asarray(index)
    if array.dtype.kind not in "iu":
        raise _bad_index(
            f"index must be an int or an array of integers, got {type(index).__name__} of dtype {array.dtype}",
            dataset_key,
        )
    if array.size and (array.min() < 0 or int(array.max()) >= n):
        low, high = int(array.min()), int(array.max())
        raise _bad_index(f"indices span [{low}, {high}]; each must be in [0, {n})", dataset_key)
    return array.astype(np.uint64), False


def _bad_index(message: str, dataset_key: str) -> UmlosError:
    return UmlosError(errors.INVALID_ARGUMENT, message, dataset_key=dataset_key, operator=OPERATOR)
