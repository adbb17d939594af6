"""The sampling-mode registry: every train order the engine can run, by name.

One place maps a mode's name to everything the mode is (:class:`SamplingMode`:
plan builders, reference map, compiled entry points, metadata strings and
``sampler_config_hash`` tokens). Backends, ``nextbatch`` and the checkpoint
layer look modes up here and never branch on a mode's name. ``block_affine``
(:mod:`.block_affine`) is the default; ``feistel`` (:mod:`.feistel`) sends the
whole epoch through one keyed Feistel bijection; ``block_feistel``
(:mod:`.block_feistel`) keeps the permuted blocks and runs the bijection inside each.

Adding a mode (docs/architecture.md, "Adding a sampling mode"): a module in
this package that defines its ``MODE``, a kernel header and ``.cu`` file in
``kernels/``, its native entry points, its tests and golden vectors, and its
line in ``BUILT_IN`` below. :func:`register_mode` adds one at run time (the
tests register a toy mode this way).
"""

from __future__ import annotations

from threading import Lock

from .. import errors
from ..errors import UmlosError
from . import block_affine, block_feistel, feistel
from .base import MAP_DTYPES, Plan, SamplingMode, registry_error

__all__ = [
    "DEFAULT_MODE",
    "MAP_DTYPES",
    "SEQUENTIAL_MODE",
    "Plan",
    "SamplingMode",
    "get_mode",
    "mode_names",
    "register_mode",
    "unregister_mode",
]

#: The modes of this release, in the order they are listed to users.
BUILT_IN = (block_affine.MODE, feistel.MODE, block_feistel.MODE)
#: The order of NextBatch_v2 manifests that name none (docs/spec/nextbatch-v2.md; its golden bits never change).
DEFAULT_MODE = block_affine.NAME
#: ``sampling_mode`` of eval and infer: positions are the indices, whatever the train order.
SEQUENTIAL_MODE = "SEQUENTIAL_V1"

_modes: dict[str, SamplingMode] = {mode.name: mode for mode in BUILT_IN}
_lock = Lock()


def mode_names() -> tuple[str, ...]:
    """The names of the registered modes, built-in first."""
    return tuple(_modes)


def get_mode(name: str) -> SamplingMode:
    """The registered mode called ``name``, or INVALID_MANIFEST naming the allowed values
    (the name comes from a manifest's ``data.sampling_mode``)."""
    mode = _modes.get(name) if isinstance(name, str) else None
    if mode is None:
        raise UmlosError(
            errors.INVALID_MANIFEST,
            f"unknown sampling mode {name!r}; choose one of {', '.join(_modes)}",
            operator=errors.MODES_OPERATOR,
        )
    return mode


def register_mode(mode: SamplingMode) -> SamplingMode:
    """Add ``mode`` to the registry and return it.

    Its name and its ``sampling_mode`` strings must be new (two modes sharing a
    string would share a ``sampler_config_hash``): INVALID_ARGUMENT otherwise.
    """
    if not isinstance(mode, SamplingMode):
        raise registry_error(f"register_mode takes a SamplingMode, got {type(mode).__name__}")
    with _lock:
        if mode.name in _modes:
            raise registry_error(f"sampling mode {mode.name!r} is already registered")
        taken = {text: other.name for other in _modes.values() for text in other.sampling_modes}
        taken[SEQUENTIAL_MODE] = "eval and infer"
        for text in mode.sampling_modes:
            if text in taken:
                raise registry_error(f"sampling_mode {text!r} of {mode.name!r} is already used by {taken[text]!r}")
        if mode.train_sampling_mode == mode.streaming_sampling_mode:
            raise registry_error(f"{mode.name!r} needs different train and streaming sampling_mode strings")
        _modes[mode.name] = mode
    return mode


def unregister_mode(name: str) -> None:
    """Remove a mode added by :func:`register_mode` (built-in modes stay)."""
    with _lock:
        if any(mode.name == name for mode in BUILT_IN):
            raise registry_error(f"{name!r} is a built-in sampling mode and cannot be removed")
        _modes.pop(name, None)
