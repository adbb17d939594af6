"""Where a process learns its rank and world size.

Order of precedence, for each of the two values separately: the argument when
given; ``torch.distributed`` when it is installed and initialised; the
``RANK`` / ``WORLD_SIZE`` environment variables that ``torchrun`` (and most
launchers) set; else rank 0 of 1 (docs/spec/nextbatch-v2.md §8), where PyTorch's sampler raises.

The torch samplers and the DALI source share this one resolution. It lives
outside ``umlos_cuda.torch`` so that the DALI source does not reach into the
torch integration's private modules, and it imports torch only inside
:func:`torch_distributed`, only where torch is installed, so a process without
torch resolves its world from the arguments and the environment alone.

Errors are :class:`~umlos_cuda.UmlosError` with code ``INVALID_RANK`` and the
caller's operator (each integration names its own), in PyTorch's words
(``Invalid rank 3, rank should be in the interval [0, 2]``), which code written
for ``torch.utils.data.DistributedSampler`` matches on.
"""

from __future__ import annotations

import os
from typing import Any

from . import checks, errors
from .errors import MAX_WORLD_SIZE, UmlosError


def torch_distributed():
    """``torch.distributed`` when it is importable, available and initialised, else None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    try:
        if dist.is_available() and dist.is_initialized():
            return dist
    except Exception:  # a partial torch build; treat as not initialised
        return None
    return None


def env_int(name: str, *, operator: str) -> int | None:
    """The integer in environment variable ``name``; None when unset or blank."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    return checks.integer_text(raw.strip(), name, None, None,
                               fail=lambda message: UmlosError(errors.INVALID_RANK, message, operator=operator),
                               message="environment variable {name}={value!r} is not an integer")


#: PyTorch's DistributedSampler's words for a rank or world size outside its interval.
PYTORCH_WORDING = ("Invalid {name} {value!r} ({type}), {name} should be an integer in the interval [{low}, {high}]",
                   "Invalid {name} {value}, {name} should be in the interval [{low}, {high}]")


def resolve_world(world_size: Any = None, rank: Any = None, *, size_name: str = "world_size",
                  operator: str) -> tuple[int, int]:
    """``(world_size, rank)``, validated: world_size in [1, 2^32-1], rank in [0, world_size-1].

    ``size_name`` is what error messages call the world size (``num_replicas``
    for DistributedSampler, ``num_shards`` for DALI, after their arguments);
    ``operator`` is the failure record's operator. With neither the arguments
    nor a process group nor the environment variables, this is ``(1, 0)``.
    """
    dist = torch_distributed() if (world_size is None or rank is None) else None
    if world_size is None:
        world_size = dist.get_world_size() if dist is not None else env_int("WORLD_SIZE", operator=operator)
        if world_size is None:
            world_size = 1
    if rank is None:
        rank = dist.get_rank() if dist is not None else env_int("RANK", operator=operator)
        if rank is None:
            rank = 0
    fail = checks.raising(errors.INVALID_RANK, operator=operator)
    world_size = checks.integer(world_size, size_name, 1, MAX_WORLD_SIZE, fail=fail, message=PYTORCH_WORDING)
    rank = checks.integer(rank, "rank", 0, world_size - 1, fail=fail, message=PYTORCH_WORDING)
    return world_size, rank
