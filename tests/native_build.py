"""Compiling test-only C++ (tests/kernel_harness/) with the host compiler.

Shared by tests/test_kernels_host.py and tests/test_feistel.py (the kernel
bodies as a ctypes library, :func:`load_harness`) and tests/test_modes.py (a
toy sampling mode's native entry point as a CPython extension module). A
machine without a C++ compiler skips those tests.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from importlib import resources

from umlos_cuda.bundled import bundled_folder

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
HARNESS_DIR = os.path.join(HERE, "kernel_harness")
#: The repository's umlos_cuda/ folder: _native_api.h, the native entry points' argument handling.
PACKAGE_DIR = os.path.join(os.path.dirname(HERE), "umlos_cuda")


def compiler() -> str | None:
    for candidate in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


def build_shared(source: str, output: str, include_dirs: tuple[str, ...] = (), optimise: str = "-O2") -> str:
    """Compile ``source`` (a file of tests/kernel_harness/) into the shared library ``output``
    with warnings as errors, the installed kernel files on the include path; skip without a compiler."""
    cxx = compiler()
    if cxx is None:
        pytest.skip("no host C++ compiler (g++, c++ or clang++; or set CXX) to build tests/kernel_harness")
    with resources.as_file(bundled_folder("kernels")) as kernel_dir:
        command = [
            cxx, "-std=c++17", optimise, "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
            f"-I{kernel_dir}", f"-I{HARNESS_DIR}", *(f"-I{d}" for d in include_dirs),
            os.path.join(HARNESS_DIR, source), "-o", str(output),
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, f"build failed:\n{' '.join(command)}\n{result.stderr}"
    assert result.stderr == "", f"build warned:\n{result.stderr}"
    return str(output)


def load_harness(folder, signatures: dict[str, list]) -> ctypes.CDLL:
    """tests/kernel_harness/harness.cpp built into ``folder`` and loaded, each
    function of ``signatures`` given its argument types (all return void)."""
    lib = ctypes.CDLL(build_shared("harness.cpp", os.path.join(folder, "harness.so")))
    for name, argtypes in signatures.items():
        getattr(lib, name).argtypes = argtypes
        getattr(lib, name).restype = None
    return lib


def pointer(array: np.ndarray) -> int:
    """The address of a C-contiguous array, for a ``ctypes.c_void_p`` argument."""
    assert array.flags.c_contiguous
    return array.ctypes.data
