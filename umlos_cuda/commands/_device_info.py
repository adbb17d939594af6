"""What NVIDIA devices this machine has, read through NVML (``nvidia-ml-py``).

NVML answers without CUDA, CuPy or a compiler: it needs only the driver. So
``umlos-cuda env`` and the benchmarks can say which GPU they saw (name, driver,
memory) even where no backend can use it, and say plainly when there is no
driver or no device. :func:`describe` never raises: every failure becomes a
reason in its answer.

NVML numbers devices as the driver does; ``CUDA_VISIBLE_DEVICES`` (reported
beside the list) may renumber or hide them for CUDA programs.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from typing import Any

NO_DEVICE = "no NVIDIA device/driver"


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _cuda_version(code: int) -> str:
    """NVML's integer CUDA version (12040) as text (12.4)."""
    return f"{code // 1000}.{(code % 1000) // 10}"


def describe() -> dict[str, Any]:
    """The NVIDIA devices NVML sees, as plain data (JSON-ready).

    Keys: ``available`` (bool: NVML answered and listed at least one device),
    ``reason`` (why not, else None), ``driver_version``, ``cuda_driver_version``,
    ``cuda_visible_devices`` and ``devices``: one dict per device with
    ``index``, ``name``, ``memory_total_bytes``, ``memory_used_bytes``,
    ``compute_capability`` (``"9.0"``) and ``uuid``; a field NVML could not read
    is None.
    """
    info: dict[str, Any] = {
        "available": False,
        "reason": None,
        "source": "nvml",
        "driver_version": None,
        "cuda_driver_version": None,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "devices": [],
    }
    try:
        nvml = importlib.import_module("pynvml")
    except Exception as exc:
        info["reason"] = f"{NO_DEVICE}: NVML bindings not installed (pip install nvidia-ml-py; {_error(exc)})"
        return info
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        info["reason"] = f"{NO_DEVICE}: NVML did not start ({_error(exc)})"
        return info
    try:
        _read(nvml, info)
    except Exception as exc:
        info["reason"] = f"NVML failed while listing devices ({_error(exc)})"
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    if info["reason"] is None:
        if info["devices"]:
            info["available"] = True
        else:
            info["reason"] = f"{NO_DEVICE}: the driver is loaded but lists no device"
    return info


def _read(nvml, info: dict[str, Any]) -> None:
    info["driver_version"] = _field(lambda: _text(nvml.nvmlSystemGetDriverVersion()))
    info["cuda_driver_version"] = _field(lambda: _cuda_version(int(nvml.nvmlSystemGetCudaDriverVersion())))
    for index in range(int(nvml.nvmlDeviceGetCount())):
        info["devices"].append(_device(nvml, index))


def _device(nvml, index: int) -> dict[str, Any]:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = _field(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    return {
        "index": index,
        "name": _field(lambda: _text(nvml.nvmlDeviceGetName(handle))),
        "memory_total_bytes": None if memory is None else int(memory.total),
        "memory_used_bytes": None if memory is None else int(memory.used),
        "compute_capability": _field(lambda: _capability(*nvml.nvmlDeviceGetCudaComputeCapability(handle))),
        "uuid": _field(lambda: _text(nvml.nvmlDeviceGetUUID(handle))),
    }


def _capability(major: int, minor: int) -> str:
    return f"{major:d}.{minor:d}"


def _field(read):
    """One NVML read; None where this driver or device does not support it."""
    try:
        return read()
    except Exception:
        return None


def _gib(value: int | None) -> str:
    return "?" if value is None else f"{value / (1 << 30):.1f} GiB"


def summary_lines(info: dict[str, Any] | None = None) -> list[str]:
    """Human-readable lines for :func:`describe`'s answer: one per device, or the reason."""
    info = describe() if info is None else info
    if not info["available"]:
        return [info["reason"] or NO_DEVICE]
    lines = [
        f"driver {info['driver_version'] or '?'}"
        + (f", CUDA {info['cuda_driver_version']}" if info["cuda_driver_version"] else "")
        + (f", CUDA_VISIBLE_DEVICES={info['cuda_visible_devices']}" if info["cuda_visible_devices"] is not None else "")
    ]
    for device in info["devices"]:
        capability = f", sm_{device['compute_capability'].replace('.', '')}" if device["compute_capability"] else ""
        lines.append(
            f"GPU {device['index']}: {device['name'] or '?'}{capability}, "
            f"{_gib(device['memory_total_bytes'])} ({_gib(device['memory_used_bytes'])} used)"
        )
    return lines


def device_name(index: int = 0) -> str:
    """The name of NVML device ``index``, or the reason there is none (for report headers)."""
    info = describe()
    for device in info["devices"]:
        if device["index"] == index and device["name"]:
            return device["name"]
    return info["reason"] or f"{NO_DEVICE}: no device {index}"
