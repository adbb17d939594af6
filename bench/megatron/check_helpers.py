"""megatron-core's C++ dataset helpers compile on this CPU machine, and the build matches the shipped one.

megatron-core 0.19's PyPI wheel ships ``megatron/core/datasets/helpers_cpp``
prebuilt (a pybind11 module); Megatron-LM from source builds it with the
Makefile beside ``helpers.cpp`` (``g++ -O3 -shared -std=c++11 -fPIC``
with ``python -m pybind11 --includes``), the command
``megatron.core.datasets.utils.compile_helpers`` runs at first use. This
script runs that compile on the ``helpers.cpp`` the wheel ships, into a
temporary folder (the installed package is never touched), imports the
result and checks that ``build_sample_idx_int32`` and
``build_blending_indices`` give the same arrays as the shipped module.
Needs: a C++ compiler (``CXX``, default g++), pybind11 (setup.sh installs it),
the Python 3.12 headers (pyenv builds have them). Run under the bench venv:

    bench/.venv-megatron/bin/python bench/megatron/check_helpers.py
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
import time

import numpy as np


def compile_helpers(folder: str):
    import megatron.core.datasets as datasets
    import pybind11

    source = os.path.join(os.path.dirname(datasets.__file__), "helpers.cpp")
    target = os.path.join(folder, "helpers_cpp" + sysconfig.get_config_var("EXT_SUFFIX"))
    includes = [f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}"]
    command = [os.environ.get("CXX", "g++"), "-O3", "-Wall", "-shared", "-std=c++11", "-fPIC", *includes,
               source, "-o", target]
    print("$", shlex.join(command))
    start = time.perf_counter()
    subprocess.run(command, check=True)
    print(f"compiled in {time.perf_counter() - start:.1f} s: {os.path.getsize(target)} bytes")
    spec = importlib.util.spec_from_file_location("helpers_cpp", target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def same_results(built, shipped) -> None:
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 4000, 10_000).astype(np.int32)
    documents = np.tile(np.arange(sizes.shape[0], dtype=np.int32), 3)
    rng.shuffle(documents)
    arguments = (sizes, documents, 2048, 3, int(sizes.sum()), True, 1)
    assert np.array_equal(built.build_sample_idx_int32(*arguments), shipped.build_sample_idx_int32(*arguments))
    weights = np.array([0.5, 0.3, 0.2])
    outputs = []
    for module in (built, shipped):
        index, sample = np.zeros(100_000, dtype=np.int16), np.zeros(100_000, dtype=np.int64)
        module.build_blending_indices(index, sample, weights, 3, 100_000, False)
        outputs.append((index, sample))
    assert all(np.array_equal(a, b) for a, b in zip(*outputs))
    print("build_sample_idx_int32 and build_blending_indices: same arrays as the shipped helpers_cpp")


def main() -> None:
    from megatron.core.datasets import helpers_cpp

    print(f"Python {sys.version.split()[0]}, shipped module {helpers_cpp.__file__}")
    with tempfile.TemporaryDirectory() as folder:
        same_results(compile_helpers(folder), helpers_cpp)


if __name__ == "__main__":
    main()
