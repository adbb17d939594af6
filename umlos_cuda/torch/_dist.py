"""The errors a sampler raises, and its rank and world size.

The rank and world size come from :mod:`umlos_cuda.world` (argument,
``torch.distributed``, ``RANK`` / ``WORLD_SIZE``, else rank 0 of 1), which the
DALI source shares; here its errors become :class:`SamplerArgumentError`, the
``ValueError`` that code written for PyTorch's samplers catches. Nothing here
imports torch, so the samplers also work in a process without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from .. import checks, errors, world
from ..errors import UINT64_MAX, UmlosError


class SamplerArgumentError(UmlosError, ValueError):
    """A bad sampler argument: a :class:`~umlos_cuda.UmlosError` (with ``.code``)
    that is also a ``ValueError``, which is what code written for
    ``torch.utils.data.DistributedSampler`` catches."""


class SamplerTypeError(UmlosError, TypeError):
    """A dataset without a length: a :class:`~umlos_cuda.UmlosError` (code
    ``CARDINALITY_MISMATCH``) that is also the ``TypeError`` PyTorch's sampler
    raises there (``object of type ... has no len()``)."""


def argument_error(code: str, message: str, **kwargs: Any) -> SamplerArgumentError:
    return SamplerArgumentError(code, message, operator=errors.TORCH_OPERATOR, **kwargs)


def type_error(code: str, message: str) -> SamplerTypeError:
    return SamplerTypeError(code, message, operator=errors.TORCH_OPERATOR)


def as_argument_error(exc: UmlosError) -> SamplerArgumentError:
    """Re-raise an engine error raised during construction as a SamplerArgumentError."""
    if isinstance(exc, SamplerArgumentError):
        return exc
    new = SamplerArgumentError(exc.code, exc.message, operator=exc.record["failure_operator"])
    new.record = dict(exc.record)
    return new


def require_int(value: Any, what: str, low: int, high: int, code: str) -> int:
    """``value`` as an int in ``[low, high]``, else a SamplerArgumentError ``code`` that names the range."""
    return checks.integer(value, what, low, high, fail=partial(argument_error, code), message=checks.OUTSIDE)


def resolve_world(world_size: Any = None, rank: Any = None, size_name: str = "world_size") -> tuple[int, int]:
    """``(world_size, rank)``, validated: world_size in [1, 2^32-1], rank in [0, world_size-1].

    :func:`umlos_cuda.world.resolve_world` (argument, ``torch.distributed``,
    ``WORLD_SIZE`` / ``RANK``, else ``(1, 0)``) raising SamplerArgumentError;
    ``size_name`` is what error messages call the world size (``num_replicas``
    for DistributedSampler, whose argument has that name)."""
    try:
        return world.resolve_world(world_size, rank, size_name=size_name, operator=errors.TORCH_OPERATOR)
    except UmlosError as exc:
        raise as_argument_error(exc) from None


def require_uint64(value: Any, what: str, code: str = errors.INVALID_ARGUMENT) -> int:
    return require_int(value, what, 0, UINT64_MAX, code)


def state_of(state: Any, kind: str, state_format: str, code: str) -> Mapping[str, Any]:
    """``state`` if it is a mapping whose ``format`` is ``state_format``, else a
    SamplerArgumentError ``code``: not a ``kind`` state. Its other keys are the
    sampler's to read (a state may carry more than the sampler restores)."""
    fail = partial(argument_error, code)
    message = f"not a {{name}} state (expected format {state_format!r})"
    checks.instance(state, kind, Mapping, fail=fail, message=message)
    checks.equal(state.get("format"), kind, state_format, fail=fail, message=message)
    return state
