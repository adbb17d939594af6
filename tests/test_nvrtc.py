"""The assembled kernel source compiles with NVRTC, cleanly, for sm_80 and sm_90.

No GPU is needed: NVRTC from PyPI (``pip install 'umlos-cuda[nvrtc]'``, i.e.
cuda-bindings and nvidia-cuda-nvrtc-cu12) compiles to PTX and SASS on any
machine. The test fails on any error *or warning* in the compile log, checks
that every kernel of the ABI (the shared ones and each registered sampling
mode's) is exported under its unmangled ``extern "C"`` name, and first proves
on a deliberately sloppy program that the log reading does see warnings. It
skips, saying why, only when the packages are missing.
"""

from __future__ import annotations

import re

import pytest

from umlos_cuda.kernel_source import KERNEL_OPTIONS, kernel_names, kernel_source

ARCHES = ("sm_80", "sm_90")


def _nvrtc():
    try:
        from cuda.bindings import nvrtc  # cuda-bindings >= 12.6
    except ImportError:
        try:
            from cuda import nvrtc  # older cuda-python layout
        except ImportError:
            pytest.skip("NVRTC bindings missing: pip install 'umlos-cuda[nvrtc]' (cuda-bindings, "
                        "nvidia-cuda-nvrtc-cu12)")
    try:
        err, _major, _minor = nvrtc.nvrtcVersion()
    except Exception as exc:  # the bindings are there but libnvrtc is not loadable
        pytest.skip(f"libnvrtc not loadable ({type(exc).__name__}: {exc}); pip install nvidia-cuda-nvrtc-cu12")
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        pytest.skip(f"nvrtcVersion failed: {err}")
    return nvrtc


def _compile(nvrtc, source: str, name: str, options: list[str]):
    """Compile; return (result code, log text, PTX text, CUBIN size)."""
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
    try:
        encoded = [o.encode() for o in options]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
        err, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = bytearray(size)
        nvrtc.nvrtcGetProgramLog(prog, log)
        ptx_text, cubin_size = "", 0
        if result == nvrtc.nvrtcResult.NVRTC_SUCCESS:
            err, size = nvrtc.nvrtcGetPTXSize(prog)
            ptx = bytearray(size)
            nvrtc.nvrtcGetPTX(prog, ptx)
            ptx_text = ptx.rstrip(b"\0").decode()
            err, cubin_size = nvrtc.nvrtcGetCUBINSize(prog)
        return result, log.rstrip(b"\0").decode(errors="replace").strip(), ptx_text, cubin_size
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def test_log_reading_sees_warnings():
    nvrtc = _nvrtc()
    sloppy = 'extern "C" __global__ void k(int* o) { int never_used = 1; o[0] = 2; }\n'
    result, log, _, _ = _compile(nvrtc, sloppy, "sloppy.cu", list(KERNEL_OPTIONS) + ["--gpu-architecture=sm_80"])
    assert result == nvrtc.nvrtcResult.NVRTC_SUCCESS
    assert "warning" in log and "never_used" in log


@pytest.mark.parametrize("arch", ARCHES)
def test_kernel_source_compiles_without_warnings(arch):
    nvrtc = _nvrtc()
    options = list(KERNEL_OPTIONS) + [f"--gpu-architecture={arch}"]
    result, log, ptx, cubin_size = _compile(nvrtc, kernel_source(), "nextbatch_kernels.cu", options)
    assert result == nvrtc.nvrtcResult.NVRTC_SUCCESS, f"NVRTC failed for {arch}:\n{log}"
    assert log == "", f"NVRTC log for {arch} is not empty:\n{log}"
    assert f".target {arch}" in ptx
    assert cubin_size > 0  # ptxas ran too
    entries = set(re.findall(r"\.entry\s+(\w+)\s*\(", ptx))
    assert entries == set(kernel_names())
