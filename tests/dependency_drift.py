"""What the newest releases changed against constraints.txt (``make test-latest`` prints it first).

    python tests/dependency_drift.py constraints.txt

Compares each pin of the file with the version installed in this interpreter's
environment and prints one line per package that moved, was added or is gone,
then a count. It always exits 0: the suite that runs next says whether the
drift matters; this says where to look when it does.
"""

from __future__ import annotations

import re
import sys
import sysconfig
from importlib import metadata

#: Installed but never pinned: this project, and torch (the Makefile's TORCH_CPU pins its CPU build).
UNPINNED = {"umlos-cuda", "torch"}
#: ``name==version`` at the start of a line of a pip requirements file (comments and markers aside).
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)")


def canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: str) -> dict[str, str]:
    """Every ``name==version`` of the file, by canonical name."""
    with open(path, encoding="utf-8") as handle:
        matches = (_PIN.match(line) for line in handle)
        return {canonical(m.group(1)): m.group(2) for m in matches if m}


def installed() -> dict[str, str]:
    """Every distribution installed in this environment's site-packages, by canonical name
    (not what ``sys.path`` holds besides: setuptools puts its vendored copies there)."""
    folders = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    return {canonical(d.metadata["Name"]): d.version for d in metadata.distributions(path=folders)
            if d.metadata["Name"]}


def drift(pins: dict[str, str], now: dict[str, str]) -> list[tuple[str, str | None, str | None]]:
    """``(name, pinned, installed)`` for each package that moved from its pin, is no longer
    installed (``installed`` None), or is installed without a pin (``pinned`` None: a new
    dependency of a newer release), sorted by name."""
    names = set(pins) | (set(now) - UNPINNED)
    return [(name, pins.get(name), now.get(name)) for name in sorted(names) if pins.get(name) != now.get(name)]


def describe(name: str, pinned: str | None, installed: str | None) -> str:
    """One line of the report."""
    if installed is None:
        return f"  {name}: pinned {pinned}, not installed now"
    if pinned is None:
        return f"  {name}: not pinned, now {installed} (new)"
    return f"  {name}: pinned {pinned}, now {installed}"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    pins = read_pins(argv[0])
    lines = [describe(*change) for change in drift(pins, installed())]
    print(f"dependency drift against {argv[0]} ({len(pins)} pins): {len(lines)} changes")
    print("\n".join(lines) if lines else "  none: the newest releases are the pinned ones")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
