"""``umlos_cuda.commands._device_info`` (NVML, never raising) and ``umlos-cuda env [--json]``."""

from __future__ import annotations

import json
import sys
import types

import pytest

from umlos_cuda import __version__, backends, cli
from umlos_cuda.commands import _device_info as device_info


class NVMLError(Exception):
    pass


def fake_pynvml(*, init_error=None, devices=(), count_error=None, memory_error=False):
    """A stand-in ``pynvml``: ``devices`` is a list of (name, total_bytes, used_bytes)."""
    nvml = types.ModuleType("pynvml")
    nvml.shutdowns = []

    def init():
        if init_error:
            raise init_error

    def count():
        if count_error:
            raise count_error
        return len(devices)

    def memory(handle):
        if memory_error:
            raise NVMLError("Not Supported")
        _, total, used = devices[handle]
        return types.SimpleNamespace(total=total, used=used, free=total - used)

    nvml.nvmlInit = init
    nvml.nvmlShutdown = lambda: nvml.shutdowns.append(True)
    nvml.nvmlSystemGetDriverVersion = lambda: b"560.35.03"
    nvml.nvmlSystemGetCudaDriverVersion = lambda: 12060
    nvml.nvmlDeviceGetCount = count
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetName = lambda h: devices[h][0]
    nvml.nvmlDeviceGetMemoryInfo = memory
    nvml.nvmlDeviceGetCudaComputeCapability = lambda h: (9, 0)
    nvml.nvmlDeviceGetUUID = lambda h: f"GPU-{h:04d}"
    return nvml


def test_without_nvml_bindings(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    info = device_info.describe()
    assert info["available"] is False and info["devices"] == []
    assert info["reason"].startswith("no NVIDIA device/driver: NVML bindings not installed")
    assert device_info.summary_lines(info) == [info["reason"]]


def test_without_driver(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_error=NVMLError("NVML Shared Library Not Found")))
    info = device_info.describe()
    assert info["available"] is False
    assert "no NVIDIA device/driver" in info["reason"] and "NVML Shared Library Not Found" in info["reason"]
    assert "no NVIDIA device/driver" in device_info.device_name()


def test_driver_without_devices(monkeypatch):
    nvml = fake_pynvml(devices=[])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    info = device_info.describe()
    assert info["available"] is False and "lists no device" in info["reason"]
    assert nvml.shutdowns == [True]


def test_one_device(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    nvml = fake_pynvml(devices=[(b"NVIDIA H100 80GB HBM3", 80 << 30, 1 << 30)])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    info = device_info.describe()
    assert info["available"] is True and info["reason"] is None
    assert info["driver_version"] == "560.35.03" and info["cuda_driver_version"] == "12.6"
    assert info["devices"] == [
        {
            "index": 0,
            "name": "NVIDIA H100 80GB HBM3",
            "memory_total_bytes": 80 << 30,
            "memory_used_bytes": 1 << 30,
            "compute_capability": "9.0",
            "uuid": "GPU-0000",
        }
    ]
    lines = device_info.summary_lines(info)
    assert lines[0] == "driver 560.35.03, CUDA 12.6, CUDA_VISIBLE_DEVICES=0"
    assert lines[1] == "GPU 0: NVIDIA H100 80GB HBM3, sm_90, 80.0 GiB (1.0 GiB used)"
    assert nvml.shutdowns == [True]
    assert device_info.device_name(0) == "NVIDIA H100 80GB HBM3"
    json.dumps(info)  # plain data


def test_unsupported_fields_are_none_not_errors(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(devices=[("A100", 1, 0)], memory_error=True))
    info = device_info.describe()
    assert info["available"] is True
    assert info["devices"][0]["memory_total_bytes"] is None
    assert "?" in device_info.summary_lines(info)[1]


def test_failure_while_listing_is_a_reason(monkeypatch):
    nvml = fake_pynvml(count_error=NVMLError("GPU is lost"))
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    info = device_info.describe()
    assert info["available"] is False and "GPU is lost" in info["reason"]
    assert nvml.shutdowns == [True]


def test_real_nvml_if_installed_never_raises():
    pytest.importorskip("pynvml")
    info = device_info.describe()
    assert info["available"] or info["reason"]


def test_env_prints_every_backend_and_the_device(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert cli.main(["env"]) == 0
    out = capsys.readouterr().out
    status = backends.available_backends()
    for name, reason in status.items():
        # The registry words a remembered failure with a prefix; the reason itself is the same.
        reason = reason.removeprefix(f"backend {name!r} is unavailable: ")
        assert f"backend {name}" in out and reason in out
    picked = next(name for name in backends.AUTO_ORDER if status[name] == "ok")
    assert f"-> {picked}" in out
    assert out.splitlines()[0].split() == ["umlos-cuda", __version__]
    assert "numpy" in out and "cbor2" in out and "CPUs" in out
    assert "no NVIDIA device/driver" in out


def test_env_json(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(devices=[(b"Test GPU", 2 << 30, 0)]))
    assert cli.main(["env", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["umlos_cuda"] == __version__
    assert set(report["backends"]) == {"numpy", "native", "cupy"}
    assert report["backends"]["numpy"] == "ok"
    assert report["auto_backend"] in backends.AUTO_ORDER
    import numpy

    assert report["packages"]["numpy"] == numpy.__version__
    assert report["cpus"]["logical"] >= 1
    assert report["nvidia"]["devices"][0]["name"] == "Test GPU"
    assert len(report["kernel_source_sha256"]) == 64


def test_env_reports_cupy_reason_when_missing(capsys, monkeypatch):
    monkeypatch.setattr(backends, "_instances", {})
    monkeypatch.setattr(backends, "_failures", {})
    monkeypatch.setitem(sys.modules, "cupy", None)
    assert cli.main(["env", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "CuPy is not installed" in report["backends"]["cupy"]
    assert report["auto_backend"] != "cupy"


def test_env_reports_every_declared_core_requirement(capsys, monkeypatch):
    """The core packages come from the installed metadata: a new one is reported without an edit to env.py."""
    from umlos_cuda import distribution
    from umlos_cuda.commands import env

    declared = ["numpy>=2.0", "cbor2>=5.6", "PyYAML>=6.0", "safetensors>=0.4", 'pytest>=8; extra == "test"']
    monkeypatch.setattr(distribution.metadata, "requires", lambda name: declared)
    labels = list(env.packages())
    assert labels[:4] == ["numpy", "cbor2", "PyYAML", "safetensors"] and "pytest" not in labels
    assert labels[4:] == list(env.OPTIONAL_PACKAGES)
    monkeypatch.setattr(device_info, "describe", lambda: {"available": False, "reason": "test"})
    assert cli.main(["env", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"numpy", "cbor2", "PyYAML", "safetensors"} <= set(report["packages"]) and "pytest" not in report["packages"]
    assert report["packages"]["safetensors"] is not None  # installed here, so its version is reported
