"""``umlos-cuda env``: what this machine offers umlos-cuda, for bug reports and CI logs.

Prints the versions that decide the bits and the speed (Python, NumPy, cbor2,
umlos-cuda, the kernel source's hash, CuPy and PyTorch when installed), every
backend with ``ok`` or the reason it cannot run here, the backend ``"auto"``
picks, the CPU count, and the NVIDIA devices NVML sees. ``--json`` prints the
same as one JSON object. It never fails on a missing GPU: that is an answer.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from importlib import metadata
from typing import Any

from .. import __version__
from . import _device_info as device_info
from ..distribution import core_requirements, requirement_name
from ..backends import AUTO_ORDER, available_backends

#: Optional distributions reported after the core ones (the first installed name of each group).
OPTIONAL_PACKAGES = {
    "cupy": ("cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x", "cupy"),
    "nvidia-ml-py": ("nvidia-ml-py",),
    "torch": ("torch",),
}


def packages() -> dict[str, tuple[str, ...]]:
    """Label -> distribution names: every core requirement the installed
    package declares (read from its metadata, so a new core dependency is
    reported without an edit here), then :data:`OPTIONAL_PACKAGES`."""
    names = [requirement_name(text) for text in core_requirements() or []]
    return {**{name: (name,) for name in names}, **OPTIONAL_PACKAGES}


def register(subparsers) -> None:
    env = subparsers.add_parser(
        "env",
        help="versions, backends (with the reason one is unavailable), CPUs and NVIDIA devices",
        description="Print the versions that decide the results and the speed (Python, NumPy, cbor2, "
        "umlos-cuda, the hash of the GPU kernel source, CuPy and PyTorch when installed), every backend with "
        "'ok' or the reason it cannot run here, the backend that auto picks, the CPU count, and the NVIDIA "
        "GPUs the driver reports. A missing GPU is reported, never an error. Paste it into bug reports.",
    )
    env.add_argument("--json", action="store_true", help="print one JSON object")
    env.set_defaults(func=run)


def package_version(names: tuple[str, ...]) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def kernel_source_sha256() -> str:
    """SHA-256 of the assembled kernel source (what NVRTC compiles), or why it is unavailable."""
    try:
        from ..kernel_source import kernel_source

        return hashlib.sha256(kernel_source().encode("utf-8")).hexdigest()
    except Exception as exc:  # reported, never fatal
        return f"unavailable ({type(exc).__name__}: {exc})"


def cpu_counts() -> dict[str, int | None]:
    usable = None
    if hasattr(os, "sched_getaffinity"):
        usable = len(os.sched_getaffinity(0))
    return {"logical": os.cpu_count(), "usable": usable}


def collect() -> dict[str, Any]:
    """Everything ``env`` reports, as plain data."""
    backends = available_backends()
    auto = next((name for name in AUTO_ORDER if backends.get(name) == "ok"), None)
    return {
        "umlos_cuda": __version__,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "packages": {label: package_version(names) for label, names in packages().items()},
        "kernel_source_sha256": kernel_source_sha256(),
        "cpus": cpu_counts(),
        "backends": backends,
        "auto_backend": auto,
        "nvidia": device_info.describe(),
    }


def run(args) -> int:
    report = collect()
    if args.json:
        json.dump(report, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
        return 0
    cpus = report["cpus"]
    rows = [
        ("umlos-cuda", report["umlos_cuda"]),
        ("python", f"{report['python']} ({report['python_executable']})"),
        ("platform", f"{report['platform']} ({report['machine']})"),
    ]
    rows += [(label, version or "not installed") for label, version in report["packages"].items()]
    rows += [
        ("kernel source", report["kernel_source_sha256"]),
        ("CPUs",
         f"{cpus['logical']} logical" + (f", {cpus['usable']} usable by this process" if cpus["usable"] else "")),
    ]
    rows += [(f"backend {name}", status) for name, status in report["backends"].items()]
    rows.append(("backend auto", f"-> {report['auto_backend']}" if report["auto_backend"] else "no backend is usable"))
    rows += [("NVIDIA", line) for line in device_info.summary_lines(report["nvidia"])]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0
