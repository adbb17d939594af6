"""What a sampling mode is: :class:`SamplingMode`, and the :class:`Plan` it builds per epoch.

A sampling mode is one train order of NextBatch_v2: a bijection of the
positions ``[0, N)`` of an epoch onto the sample indices, keyed by the epoch
seed (R4). Everything the engine needs to run one lives in its
:class:`SamplingMode` record, so that backends, the front end and the
checkpoint layer dispatch through the registry (``umlos_cuda.modes``) and never
name a mode themselves:

* the strings it is known by: the registry ``name``, and the ``sampling_mode``
  metadata strings of train and ``streaming_infinite`` (R9), which
  with ``config_tokens`` make its ``sampler_config_hash`` (R9);
* how an epoch's plan is built (``build_plan`` on the NumPy reference path,
  ``build_plan_native`` through the native module when the mode has one) and
  how big it is (``plan_blocks``, checked against ``UMLOS_MAX_BLOCKS``);
* how positions become indices: ``reference_map`` (NumPy, the bits every
  backend must give), and the names of its compiled entry points: a function of
  a native module (``native_module``, ``native_map``) and the ``extern "C"``
  kernels of a ``.cu`` file in ``kernels/`` (``cuda_source``, ``cuda_map``);
* its inverse map, when it has one (position of a sample index).

A :class:`Plan` hands the compiled entry points their arguments in one
convention shared by the native and CUDA backends: the plan's uint64 tables,
then its typed scalar parameters, then ``start, count, stride, out``
(kernels/README.md, umlos_cuda/_native_api.h).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np

from .. import checks, errors
from ..errors import UmlosError

#: The output dtypes a compiled map is launched for (keys of ``cuda_map``).
MAP_DTYPES = ("uint64", "int64", "int32")


def registry_error(message: str) -> UmlosError:
    """A sampling mode defined or registered wrongly: a programming error, not a
    manifest's (INVALID_ARGUMENT, naming the mode registry)."""
    return UmlosError(errors.INVALID_ARGUMENT, message, operator=errors.MODES_OPERATOR)


class Plan(Protocol):
    """One epoch of one sampling mode, ready to map positions (O(1) per index).

    ``mode`` names the mode that built it; ``n`` is the epoch's length. Both
    are read-only (properties here), so a frozen dataclass with a ``mode``
    class variable satisfies the protocol.
    """

    @property
    def mode(self) -> str: ...

    @property
    def n(self) -> int: ...

    def kernel_tables(self) -> tuple[np.ndarray, ...]:
        """The uint64 arrays a compiled map reads (device backends upload them once per device)."""
        ...

    def kernel_params(self) -> tuple[np.generic, ...]:
        """The scalars a compiled map takes after the tables, typed as the kernel ABI
        declares them (``numpy.uint64`` for ``u64``, ``numpy.uint32`` for ``u32``)."""
        ...


@dataclass(frozen=True, slots=True, eq=False)
class SamplingMode:
    """Everything one sampling mode is (see the module docstring). Records compare
    by identity: the registry holds one per name.

    Args:
        name: the registry key (what a manifest names; lowercase, e.g. ``"block_affine"``).
        train_sampling_mode: ``sampling_mode`` of a train call (metadata, R9).
        streaming_sampling_mode: ``sampling_mode`` under the ``streaming_infinite`` preset.
        config_tokens: the strings after ``[sampling_mode, sampler_block_size,
            drop_last]`` in ``sampler_config_hash`` (R9); they name the rules
            the order follows, so a different order never shares a hash.
        build_plan: ``(seed16, n, block_size) -> Plan`` on the NumPy reference path.
        reference_map: ``(plan, start, count, out, stride) -> out``: the indices of
            positions ``start + i * stride`` (``i < count``) into the uint64 array ``out``.
        plan_blocks: ``(n, block_size) -> int``: the blocks an epoch's plan
            materialises (metadata ``blocks_materialized``, bounded by ``UMLOS_MAX_BLOCKS``).
        build_plan_native: ``(native_module, seed16, n, block_size) -> Plan``,
            the same plan built by compiled code, or None (hosts use ``build_plan``).
        native_module: the importable module holding ``native_map``.
        native_map: the native map entry point's name in ``native_module``, or
            None when the mode has no native code (backend ``native`` refuses it).
        cuda_source: the ``.cu`` file of ``kernels/`` with the mode's kernels
            (assembled into the CUDA source after ``nextbatch_kernels.cu``), or None.
        cuda_map: output dtype name (``MAP_DTYPES``) -> the map kernel for it.
        inverse: ``(plan, indices) -> positions``, the inverse map, or None.
    """

    name: str
    train_sampling_mode: str
    streaming_sampling_mode: str
    config_tokens: tuple[str, ...]
    build_plan: Callable[[bytes, int, int], Plan]
    reference_map: Callable[..., np.ndarray]
    plan_blocks: Callable[[int, int], int]
    build_plan_native: Callable[[Any, bytes, int, int], Plan] | None = None
    native_module: str = "umlos_cuda._native"
    native_map: str | None = None
    cuda_source: str | None = None
    cuda_map: Mapping[str, str] = field(default_factory=dict)
    # Any: inverse takes its own mode's plan (FeistelPlan, ...), not every Plan.
    inverse: Callable[[Any, np.ndarray], np.ndarray] | None = None

    def __post_init__(self) -> None:
        if not self.name or not self.name.isidentifier() or self.name != self.name.lower():
            raise registry_error(f"a sampling mode name is a lowercase identifier, got {self.name!r}")
        for token in self.config_tokens:
            checks.text(token, f"config_tokens of {self.name!r}", fail=registry_error, message="{name} must be strings")
        unknown = sorted(set(self.cuda_map) - set(MAP_DTYPES))
        if unknown or (self.cuda_map and self.cuda_source is None):
            raise registry_error(
                f"cuda_map of {self.name!r} maps the dtypes {', '.join(MAP_DTYPES)} to kernels of cuda_source; "
                f"got {dict(self.cuda_map)!r} with cuda_source {self.cuda_source!r}",
            )
        object.__setattr__(self, "cuda_map", MappingProxyType(dict(self.cuda_map)))

    @property
    def sampling_modes(self) -> tuple[str, str]:
        """The metadata strings this mode is known by (train, streaming)."""
        return (self.train_sampling_mode, self.streaming_sampling_mode)
