"""The orders the quality report compares: every registered sampling mode and NumPy's permutation.

A :class:`Candidate` is one row of the report: a sampling mode of the registry
(``umlos_cuda.modes``) at one ``sampler_block_size``, or
``numpy.random.Generator.permutation`` (:data:`PERMUTATION`), the true shuffle
the others are measured against. :func:`candidates` lists them: each mode
once, and a mode whose plan is made of blocks (its ``plan_blocks`` changes
with the block size) once per block size asked for.

An engine order is what ``epoch_indices`` returns for a manifest of N samples
that names the mode (``data.sampling_mode``, :func:`quality_manifest`): the
report measures exactly what a user of that manifest gets. It runs on the
first backend of ``auto`` (cupy, native, numpy) that has the mode's code; all
of them give the same bits (tests/test_backend_parity.py), so only the time
differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .. import checks, errors
from ..backends import AUTO_ORDER, Backend, get_backend, to_numpy
from ..errors import QUALITY_OPERATOR, UmlosError
from ..manifest.core import DEFAULT_BLOCK_SIZE, Manifest
from ..modes import DEFAULT_MODE, get_mode, mode_names
from ..nextbatch import epoch_indices

#: The name of the reference row: ``numpy.random.default_rng((seed, epoch)).permutation(N)``.
PERMUTATION = "permutation"
#: The dataset key and id of the report's manifest.
DATASET_KEY = "train"
DATASET_ID = "umlos_cuda.quality"
#: Block sizes measured by default for modes made of blocks: 2^16, the default 2^20, 2^24.
DEFAULT_BLOCK_SIZES = (1 << 16, DEFAULT_BLOCK_SIZE, 1 << 24)


def quality_manifest(n: int, batch_size: int, block_size: int, seed: int, mode: str = DEFAULT_MODE) -> Manifest:
    """The manifest whose train order the report measures for one mode and block size."""
    return Manifest.from_dict(
        {
            "seed": seed,
            "global_batch_size": batch_size,
            "data": {"sampler_block_size": block_size, "drop_last": False, "sampling_mode": mode},
            "datasets": {DATASET_KEY: {"id": DATASET_ID, "version": 1, "hash": "", "cardinality": n}},
        }
    )


def uses_blocks(mode: str) -> bool:
    """Whether ``mode``'s plan is made of blocks, so that its order depends on the block size."""
    plan_blocks = get_mode(mode).plan_blocks
    return plan_blocks(1 << 40, 1 << 16) != plan_blocks(1 << 40, 1 << 24)


def block_label(block_size: int) -> str:
    """``2^20`` for a power of two, else the number."""
    if block_size & (block_size - 1) == 0:
        return f"2^{block_size.bit_length() - 1}"
    return f"{block_size:,}"


@dataclass(frozen=True)
class Candidate:
    """One order of the report: ``mode`` (a registry name, or :data:`PERMUTATION`)
    at ``block_size`` (None where the order has no blocks)."""

    mode: str
    block_size: int | None = None

    @property
    def label(self) -> str:
        if self.block_size is None:
            return self.mode
        default = " (default)" if self.mode == DEFAULT_MODE and self.block_size == DEFAULT_BLOCK_SIZE else ""
        return f"{self.mode} {block_label(self.block_size)}{default}"

    @property
    def is_reference(self) -> bool:
        return self.mode == PERMUTATION


def candidates(modes: Sequence[str] | None = None, block_sizes: Sequence[int] = DEFAULT_BLOCK_SIZES) -> list[Candidate]:
    """:data:`PERMUTATION` first, then each mode (default: every registered one), per block size where it has blocks.

    An unknown mode is INVALID_MANIFEST naming the registered ones (the registry's error).
    """
    fail = checks.raising(errors.INVALID_ARGUMENT, operator=QUALITY_OPERATOR)
    block_sizes = [checks.integer(b, "each block size", 1, None, strict=True, fail=fail, message=checks.POSITIVE)
                   for b in block_sizes]
    if not block_sizes:
        raise fail("give at least one block size")
    rows = [Candidate(PERMUTATION)]
    for name in mode_names() if modes is None else modes:
        if name == PERMUTATION:
            continue
        get_mode(name)
        if uses_blocks(name):
            rows += [Candidate(name, size) for size in block_sizes]
        else:
            rows.append(Candidate(name))
    return rows


def engine_backend(mode: str, requested: str = "auto") -> Backend:
    """The backend that runs ``mode``: ``requested``, or with ``auto`` the first of
    cupy, native, numpy that is usable here and has the mode's code."""
    names = AUTO_ORDER if requested == "auto" else (requested,)
    for name in names:
        try:
            backend = get_backend(name)
            backend.map_train(backend.build_plan(b"\0" * 16, 2, 1, mode), 0, 2)  # refuses a mode it has no code for
        except UmlosError as exc:
            if requested != "auto" or exc.code not in (errors.BACKEND_UNAVAILABLE, errors.INVALID_MANIFEST):
                raise
            continue
        return backend
    raise UmlosError(errors.BACKEND_UNAVAILABLE, f"no backend runs sampling mode {mode!r}", operator=QUALITY_OPERATOR)


class OrderSource:
    """The orders of one candidate over a dataset of ``n`` samples, epoch by epoch."""

    def __init__(self, candidate: Candidate, n: int, batch_size: int, seed: int, backend: str = "auto") -> None:
        self.candidate = candidate
        self.n = n
        if candidate.is_reference:
            self.backend_name = "numpy"
            self._seed = seed
            return
        block_size = candidate.block_size or DEFAULT_BLOCK_SIZE
        self.manifest = quality_manifest(n, batch_size, block_size, seed, candidate.mode)
        self.backend_name = engine_backend(candidate.mode, backend).name

    def indices(self, epoch: int, count: int | None = None) -> np.ndarray:
        """The first ``count`` positions of ``epoch`` (default: all N), as int64."""
        count = self.n if count is None else count
        if self.candidate.is_reference:
            return np.random.default_rng((self._seed, epoch)).permutation(self.n)[:count]
        out = epoch_indices(self.manifest, DATASET_KEY, epoch, 0, count, backend=self.backend_name, dtype="int64")
        return to_numpy(out)
