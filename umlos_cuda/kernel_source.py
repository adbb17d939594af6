"""The CUDA kernel source as one string, and what compiling it needs.

``kernels/`` (shipped as the package ``umlos_cuda._kernels``) holds
``nextbatch_kernels.cu`` and the headers it includes. NVRTC could find the
headers through ``-I``, but CuPy's on-disk kernel cache is keyed on the source
*string*: a header edited after a first compile would then be silently ignored.
:func:`kernel_source` therefore inlines every ``#include "..."`` (each header
once, as ``#pragma once`` would), so the string changes whenever any header
does. ``#line`` directives keep compiler messages pointing at the real files.

The ABI of the kernels (names, parameter lists) is documented in
``kernels/README.md``; :data:`KERNEL_NAMES` lists them and
:func:`divider_params` computes the two scalars the map kernels take besides
the plan tables.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

import numpy as np

from . import errors
from .errors import UmlosError

#: The package that holds the kernel files (``kernels/`` in the repository).
KERNEL_PACKAGE = "umlos_cuda._kernels"
#: The translation unit; everything else is reached from it by ``#include "..."``.
KERNEL_MAIN = "nextbatch_kernels.cu"

#: Options for NVRTC (CuPy ``RawModule(options=...)`` and tests/test_nvrtc.py).
#: The target architecture is added by the caller (CuPy adds its own).
KERNEL_OPTIONS = ("--std=c++17",)

#: The ``extern "C"`` kernels of nextbatch_kernels.cu (kernels/README.md).
KERNEL_NAMES = (
    "umlos_block_permute_j",
    "umlos_block_affine_params",
    "umlos_map_positions_u64",
    "umlos_map_positions_i64",
    "umlos_map_positions_i32",
    "umlos_sequential_u64",
    "umlos_philox4x32_10_batch",
)

_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"[ \t]*(?://.*)?$')
_PRAGMA_ONCE = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+once[ \t]*$")


def read_kernel_file(name: str) -> str:
    """The text of one file of ``umlos_cuda._kernels``."""
    try:
        return resources.files(KERNEL_PACKAGE).joinpath(name).read_text(encoding="utf-8")
    except (FileNotFoundError, ModuleNotFoundError, OSError) as exc:
        raise UmlosError(
            errors.BACKEND_UNAVAILABLE,
            f"kernel file {name!r} is missing from {KERNEL_PACKAGE} ({exc}); reinstall umlos-cuda",
        ) from exc


def assemble(main: str = KERNEL_MAIN) -> str:
    """``main`` with each quoted include replaced by the file's text, recursively, once per file."""
    seen: set[str] = set()
    out: list[str] = []

    def emit(name: str, stack: tuple[str, ...]) -> None:
        if name in stack:
            raise UmlosError(errors.BACKEND_UNAVAILABLE, f"kernel include cycle: {' -> '.join(stack + (name,))}")
        if name in seen:
            return
        seen.add(name)
        out.append(f'#line 1 "{name}"')
        for number, line in enumerate(read_kernel_file(name).splitlines(), start=1):
            if _PRAGMA_ONCE.match(line):
                out.append("")
                continue
            match = _INCLUDE.match(line)
            if match:
                emit(match.group(1), stack + (name,))
                out.append(f'#line {number + 1} "{name}"')
                continue
            out.append(line)

    emit(main, ())
    return "\n".join(out) + "\n"


@functools.lru_cache(maxsize=1)
def kernel_source() -> str:
    """The assembled source of all kernels (cached for the process)."""
    return assemble(KERNEL_MAIN)


# Divider flags of kernels/nextbatch.cuh.
DIVIDER_SHIFT_MASK = 0x3F
DIVIDER_ADD = 0x40
DIVIDER_POW2 = 0x80


def divider_params(d: int) -> tuple[np.uint64, np.uint32]:
    """``(magic, info)`` for dividing by ``d`` in the map kernels: twin of ``divider_make``.

    libdivide's unsigned 64-bit scheme: a power of two is a shift; otherwise
    ``q = mulhi64(magic, x) >> shift``, plus a fix-up add when the exact magic
    needs 65 bits.
    """
    d = int(d)
    if not 1 <= d < 1 << 64:
        raise UmlosError(errors.INVALID_MANIFEST, f"a divisor must be in [1, 2^64 - 1], got {d}")
    floor_log2 = d.bit_length() - 1
    if d & (d - 1) == 0:
        return np.uint64(0), np.uint32(floor_log2 | DIVIDER_POW2)
    proposed, rem = divmod(1 << (64 + floor_log2), d)
    if d - rem < 1 << floor_log2:
        info = floor_log2
    else:
        proposed = 2 * proposed + (1 if 2 * rem >= d else 0)
        info = floor_log2 | DIVIDER_ADD
    return np.uint64((proposed + 1) & ((1 << 64) - 1)), np.uint32(info)
