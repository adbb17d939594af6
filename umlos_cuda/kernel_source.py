"""The CUDA kernel source as one string, and what compiling it needs.

``kernels/`` (shipped inside the package as ``umlos_cuda/_kernels``; :mod:`.bundled`) holds
``nextbatch_kernels.cu`` (the kernels every mode shares), one ``.cu`` file per
sampling mode that has CUDA kernels (``SamplingMode.cuda_source``), and the
headers they include. NVRTC could find the headers through ``-I``, but CuPy's
on-disk kernel cache is keyed on the source *string*: a header edited after a
first compile would then be silently ignored. :func:`kernel_source` therefore
inlines every ``#include "..."`` (each header once, as ``#pragma once``
would), so the string changes whenever any header does. ``#line`` directives
keep compiler messages pointing at the real files.

The ABI of the kernels (names, parameter lists) is documented in
``kernels/README.md``; :func:`kernel_names` lists them (the shared ones and
each registered mode's ``cuda_map``) and :func:`divider_params` computes the
two scalars the default mode's map kernels take besides the plan tables.
"""

from __future__ import annotations

import functools
import re
from . import errors
from .bundled import bundled_folder
from .errors import UmlosError
from .modes import get_mode, mode_names
from .reference import DIVIDER_ADD, DIVIDER_POW2, DIVIDER_SHIFT_MASK, divider_params

__all__ = [
    "DIVIDER_ADD",
    "DIVIDER_POW2",
    "DIVIDER_SHIFT_MASK",
    "KERNEL_MAIN",
    "KERNEL_OPTIONS",
    "SHARED_KERNEL_NAMES",
    "assemble",
    "divider_params",
    "kernel_files",
    "kernel_names",
    "kernel_source",
    "read_kernel_file",
]

#: The kernels every mode shares; the modes' ``.cu`` files follow it in the source.
KERNEL_MAIN = "nextbatch_kernels.cu"

#: Options for NVRTC (CuPy ``RawModule(options=...)`` and tests/test_nvrtc.py).
#: The target architecture is added by the caller (CuPy adds its own).
KERNEL_OPTIONS = ("--std=c++17",)

#: The ``extern "C"`` kernels of nextbatch_kernels.cu (kernels/README.md).
SHARED_KERNEL_NAMES = ("umlos_sequential_u64", "umlos_philox4x32_10_batch")

_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"[ \t]*(?://.*)?$')
_PRAGMA_ONCE = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+once[ \t]*$")


def read_kernel_file(name: str) -> str:
    """The text of one file of ``kernels/``."""
    try:
        return bundled_folder("kernels").joinpath(name).read_text(encoding="utf-8")
    except OSError as exc:  # FileNotFoundError included
        raise UmlosError(
            errors.BACKEND_UNAVAILABLE,
            f"kernel file {name!r} is missing from the installed kernels/ ({exc}); reinstall umlos-cuda",
            operator=errors.BACKEND_OPERATOR,
        ) from exc


def kernel_files() -> tuple[str, ...]:
    """The ``.cu`` files of the source, in order: the shared kernels, then each registered mode's."""
    sources = (get_mode(name).cuda_source for name in mode_names())
    return (KERNEL_MAIN,) + tuple(dict.fromkeys(source for source in sources if source))


def kernel_names() -> tuple[str, ...]:
    """Every ``extern "C"`` kernel of :func:`kernel_source`: the shared ones and each mode's map kernels."""
    names = list(SHARED_KERNEL_NAMES)
    for name in mode_names():
        names.extend(kernel for kernel in get_mode(name).cuda_map.values() if kernel not in names)
    return tuple(names)


def assemble(*roots: str) -> str:
    """The ``roots`` (default: KERNEL_MAIN) with each quoted include replaced by the
    file's text, recursively, once per file across all of them."""
    seen: set[str] = set()
    out: list[str] = []

    def emit(name: str, stack: tuple[str, ...]) -> None:
        if name in stack:
            raise UmlosError(errors.BACKEND_UNAVAILABLE, f"kernel include cycle: {' -> '.join(stack + (name,))}",
                             operator=errors.BACKEND_OPERATOR)
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

    for root in roots or (KERNEL_MAIN,):
        emit(root, ())
    return "\n".join(out) + "\n"


def kernel_source() -> str:
    """The assembled source of all kernels: :func:`kernel_files`, assembled (cached per file list)."""
    return _assembled(kernel_files())


@functools.lru_cache(maxsize=4)
def _assembled(files: tuple[str, ...]) -> str:
    return assemble(*files)
