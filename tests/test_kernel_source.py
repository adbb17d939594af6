"""kernel_source(): one string with every header inlined, read from the installed package.

CuPy's on-disk cache keys on the source string, so a header edit must change
the string; the files must ship inside the package (``umlos_cuda/_kernels``),
not only sit in the checkout; the source is the shared kernels followed by each
registered sampling mode's ``.cu`` file; and the kernel names of the ABI must
agree between the code, the registry (``kernel_names()``) and kernels/README.md.
"""

from __future__ import annotations

import fnmatch
import os
import re
import tomllib

import pytest

from umlos_cuda import errors, kernel_source as ks, modes
from umlos_cuda.bundled import bundled_folder
from umlos_cuda.errors import UmlosError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADERS = ("platform.cuh", "grid.cuh", "philox.cuh", "nextbatch.cuh", "block_affine.cuh", "feistel.cuh",
           "block_feistel.cuh")
MODE_SOURCES = ("block_affine.cu", "feistel.cu", "block_feistel.cu")


def test_every_include_is_inlined_once():
    source = ks.kernel_source()
    assert not re.search(r'^\s*#\s*include\s*"', source, re.M)
    assert not re.search(r"^\s*#\s*pragma\s+once", source, re.M)
    assert source.startswith('#line 1 "nextbatch_kernels.cu"')
    for header in HEADERS + MODE_SOURCES:
        assert source.count(f'#line 1 "{header}"') == 1
    assert source.count("struct PhiloxCtr {") == 1  # philox.cuh is reached three times, emitted once
    assert source.count("u64 grid_next(") == 1  # grid.cuh is reached from every .cu file, emitted once
    # Each header's text precedes its user's: platform, then philox, the shared kernels,
    # then the default mode's .cu file with nextbatch.cuh and block_affine.cuh before its kernels.
    markers = (
        "typedef unsigned long long u64;",
        "struct PhiloxCtr {",
        'extern "C" __global__ void umlos_sequential_u64(',
        '#line 1 "block_affine.cu"',
        "struct EpochKey {",
        "struct BlockParams {",
        'extern "C" __global__ void umlos_map_positions_u64(',
    )
    positions = [source.index(marker) for marker in markers]
    assert positions == sorted(positions)


def test_the_source_is_the_shared_kernels_then_each_modes_file():
    assert ks.kernel_files() == ("nextbatch_kernels.cu",) + MODE_SOURCES
    for name in modes.mode_names():
        mode = modes.get_mode(name)
        if mode.cuda_source is None:
            continue
        code = ks.read_kernel_file(mode.cuda_source)
        for kernel in mode.cuda_map.values():
            assert f'extern "C" __global__ void {kernel}(' in code, (name, kernel)


def test_a_header_edit_changes_the_source(monkeypatch):
    original = ks.read_kernel_file

    def edited(name):
        text = original(name)
        return text + "\n// edited\n" if name == "philox.cuh" else text

    before = ks.assemble()
    monkeypatch.setattr(ks, "read_kernel_file", edited)
    after = ks.assemble()
    assert after != before and "// edited" in after


def test_include_cycles_and_missing_files_raise(monkeypatch):
    files = {"a.cu": '#include "b.cuh"\n', "b.cuh": '#include "a.cu"\n'}
    monkeypatch.setattr(ks, "read_kernel_file", files.__getitem__)
    with pytest.raises(UmlosError) as info:
        ks.assemble("a.cu")
    assert info.value.code == errors.BACKEND_UNAVAILABLE and "a.cu -> b.cuh -> a.cu" in info.value.message
    monkeypatch.undo()
    with pytest.raises(UmlosError) as info:
        ks.read_kernel_file("no_such_header.cuh")
    assert info.value.code == errors.BACKEND_UNAVAILABLE


def test_kernel_files_ship_in_the_package():
    """Every source in kernels/ matches pyproject's package-data for umlos_cuda._kernels,
    and the package (checkout or wheel) serves the same text as the file in kernels/."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as handle:
        config = tomllib.load(handle)["tool"]["setuptools"]
    assert config["package-dir"]["umlos_cuda._kernels"] == "kernels"
    patterns = config["package-data"]["umlos_cuda._kernels"]
    sources = [f for f in os.listdir(os.path.join(ROOT, "kernels")) if f.endswith((".cu", ".cuh", ".h"))]
    assert set(HEADERS) | set(ks.kernel_files()) <= set(sources)
    package = bundled_folder("kernels")
    for name in sources:
        assert any(fnmatch.fnmatch(name, p) for p in patterns), f"{name} would be left out of the wheel"
        with open(os.path.join(ROOT, "kernels", name), encoding="utf-8") as handle:
            assert package.joinpath(name).read_text(encoding="utf-8") == handle.read()


def test_kernel_names_agree_with_the_code_and_the_readme():
    code = "".join(ks.read_kernel_file(name) for name in ks.kernel_files())
    defined = re.findall(r'extern "C" __global__ void (\w+)\(', code)
    assert sorted(defined) == sorted(ks.kernel_names())
    assert ks.kernel_names()[:2] == ks.SHARED_KERNEL_NAMES
    with open(os.path.join(ROOT, "kernels", "README.md"), encoding="utf-8") as handle:
        readme = handle.read()
    documented = set(re.findall(r'extern "C" __global__ void (\w+)\(', readme))
    assert documented == set(ks.kernel_names())


def test_divider_params_refuses_zero_and_overflow():
    for bad in (0, 1 << 64, -3):
        with pytest.raises(UmlosError):
            ks.divider_params(bad)
    magic, info = ks.divider_params(1 << 20)
    assert int(magic) == 0 and int(info) == 20 | ks.DIVIDER_POW2
