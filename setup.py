"""Package discovery and the optional C++ extensions ``umlos_cuda._native``
(backend "native") and ``umlos_cuda._packing`` (``pack_lengths``).

Everything else about the package is declared in pyproject.toml.

Packages are discovered, not listed: every folder below each root that
pyproject.toml's ``[tool.setuptools] package-dir`` maps (``umlos_cuda/``, and
``kernels/`` and ``golden/`` shipped as ``umlos_cuda/_kernels`` and
``umlos_cuda/_golden``) whose path is made of identifiers is a package, data
folders included (setuptools ships a folder's files only through a package).
pyproject.toml's own discovery (``packages.find``) cannot rename folders, so
it could not ship ``kernels/`` as ``umlos_cuda._kernels``; docs/architecture.md
says more.

``_native`` compiles the kernel headers of ``kernels/`` with the host C++
compiler (``-O3``, C++17, OpenMP when the compiler has it). ``_packing``
(``umlos_cuda/_packing.cpp``: first-fit, best-fit and greedy packing) needs
no kernel header and is a module of its own, so either builds without the
other. Both are optional: without a working compiler the build prints a
warning and the package installs anyway; ``backend="native"`` then reports
itself unavailable, ``"auto"`` falls back to NumPy (same bits), and
``pack_lengths`` to its Python trees (same rows, slower).

Set ``UMLOS_NO_NATIVE=1`` to skip both extensions on purpose.
"""

from __future__ import annotations

import os
import sys
import tomllib

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE = "umlos_cuda._native"
PACKING = "umlos_cuda._packing"
#: What each optional extension's absence costs (the build's warning says it).
FALLBACKS = {
    NATIVE: "backend 'numpy', same results",
    PACKING: "pack_lengths uses its Python trees, same rows, slower",
}

if sys.platform == "win32":
    BASE_ARGS = ["/O2", "/std:c++17"]
    OPENMP_COMPILE, OPENMP_LINK = ["/openmp"], []
else:
    BASE_ARGS = ["-O3", "-std=c++17", "-fno-strict-aliasing", "-Wall", "-Wextra"]
    OPENMP_COMPILE, OPENMP_LINK = ["-fopenmp"], ["-fopenmp"]


def _warn(message: str) -> None:
    bar = "=" * 78
    sys.stderr.write(f"\n{bar}\nWARNING (umlos-cuda): {message}\n{bar}\n\n")
    sys.stderr.flush()


class OptionalBuildExt(build_ext):
    """build_ext that tries OpenMP, then no OpenMP, then gives up with a warning."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler at all (DistutilsPlatformError and kin)
            _warn(
                f"the native extensions {NATIVE} and {PACKING} were not built ({exc}). umlos-cuda works without "
                "them (backend 'numpy' and Python packing, same results); install a C++ compiler and reinstall."
            )

    def build_extension(self, ext: Extension) -> None:
        if ext.name not in FALLBACKS:
            super().build_extension(ext)
            return
        if os.environ.get("UMLOS_NO_NATIVE"):
            _warn(f"UMLOS_NO_NATIVE is set: {ext.name} is not built ({FALLBACKS[ext.name]}).")
            return
        attempts = [([], [], "")]
        if ext.name == NATIVE:
            attempts = [(OPENMP_COMPILE, OPENMP_LINK, "with OpenMP"), ([], [], "without OpenMP (one core)")]
        errors = []
        for compile_args, link_args, what in attempts:
            ext.extra_compile_args = BASE_ARGS + compile_args
            ext.extra_link_args = list(link_args)
            try:
                super().build_extension(ext)
            except Exception as exc:  # CompileError, LinkError, DistutilsExecError, OSError
                errors.append(f"{what}: {exc}" if what else str(exc))
                continue
            if errors:
                _warn(f"{ext.name} was built {what}; the OpenMP build failed ({errors[0]}).")
            return
        _warn(
            f"the native extension {ext.name} could not be compiled ({'; '.join(errors)}). umlos-cuda works "
            f"without it ({FALLBACKS[ext.name]}); fix the C++ compiler and reinstall."
        )


def discover_packages(root: str = ".") -> list[str]:
    """Every package below the roots of pyproject.toml's ``package-dir``: each
    folder reached through identifier names (``commit=1/`` is data inside its
    parent package, ``__pycache__`` is never shipped), sorted."""
    with open(os.path.join(root, "pyproject.toml"), "rb") as handle:
        roots = tomllib.load(handle)["tool"]["setuptools"]["package-dir"]
    found = set()
    for package, folder in roots.items():
        top = os.path.join(root, folder)
        for directory, subdirs, _ in os.walk(top):
            subdirs[:] = sorted(d for d in subdirs if d.isidentifier() and d != "__pycache__")
            relative = os.path.relpath(directory, top)
            found.add(package if relative == "." else ".".join([package, *relative.split(os.sep)]))
    return sorted(found)


if __name__ == "__main__":  # the build backend runs this file as __main__; tests import discover_packages
    setup(
        packages=discover_packages(os.path.dirname(os.path.abspath(__file__))),
        ext_modules=[
            Extension(
                NATIVE,
                sources=["umlos_cuda/_native.cpp"],
                include_dirs=["kernels"],
                depends=[
                    "umlos_cuda/_native_api.h",
                    "kernels/platform.cuh",
                    "kernels/philox.cuh",
                    "kernels/nextbatch.cuh",
                    "kernels/block_affine.cuh",
                    "kernels/feistel.cuh",
                    "kernels/block_feistel.cuh",
                ],
                language="c++",
                optional=True,  # an editable install skips copying it when it was not built
            ),
            Extension(PACKING, sources=["umlos_cuda/_packing.cpp"], language="c++", optional=True),
        ],
        cmdclass={"build_ext": OptionalBuildExt},
    )
