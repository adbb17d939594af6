"""Reading a manifest file: regular files only, bounded in size, no duplicate keys.

A manifest path may name anything. ``/dev/zero`` would be read until memory
runs out, a FIFO blocks forever and a 1 GB JSON file costs several GB to
parse, so the file is checked by ``stat`` before a byte is read: it must be a
regular file of at most ``max_bytes`` (:data:`MAX_MANIFEST_BYTES` unless the
caller says otherwise). It is opened with ``O_NONBLOCK`` so that a file
swapped for a FIFO after the check cannot block either, and checked again on
the open descriptor. ``.json`` files are JSON; anything else is YAML (JSON is
a subset of YAML 1.2, so a JSON file with another suffix loads too). Every
failure is ``INVALID_MANIFEST``.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

from . import yaml_safe
from .schema import invalid_manifest

#: The largest manifest file read. Real manifests are kilobytes; 1 MiB holds
#: about 6,700 dataset entries. PyYAML's pure-Python parser is slow (a 1 MiB
#: file of 500,000 tiny values takes about 17 s and 430 MB), so the bound is
#: kept small; ``Manifest.load(path, max_bytes=...)`` reads larger files.
MAX_MANIFEST_BYTES = 1 << 20
#: Bounds on a YAML document with its aliases expanded (yaml_safe).
MAX_EXPANDED_NODES = 1_000_000
MAX_EXPANDED_BYTES = 16 << 20
#: Nesting bound for untrusted manifests: deep enough for any real config,
#: shallow enough that a hostile file cannot exhaust the stack.
MAX_NESTING = 64


def read_manifest_file(path: str | os.PathLike[str], *, max_bytes: int = MAX_MANIFEST_BYTES) -> Any:
    """Parse a manifest file into plain data; every failure is ``INVALID_MANIFEST``."""
    path = os.fspath(path)
    text = _read_text(path, max_bytes)
    if path.endswith(".json"):
        try:
            return json.loads(text, object_pairs_hook=_refuse_duplicate_keys)
        except ValueError as exc:  # also json.JSONDecodeError and integers over 4300 digits
            raise invalid_manifest(f"{path}: not valid JSON: {exc}") from None
        except RecursionError:  # a hostile file nested deeper than the parser's stack
            raise invalid_manifest(f"{path}: nested too deeply to parse") from None
    import yaml

    try:
        return yaml_safe.load(text, max_nodes=MAX_EXPANDED_NODES, max_bytes=MAX_EXPANDED_BYTES, max_depth=MAX_NESTING)
    except yaml.YAMLError as exc:
        raise invalid_manifest(f"{path}: not valid YAML: {_one_line(exc)}") from None
    except RecursionError:
        raise invalid_manifest(f"{path}: nested too deeply to parse") from None


def _read_text(path: str, max_bytes: int) -> str:
    try:
        _require_small_regular_file(path, os.stat(path), max_bytes)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as handle:
            _require_small_regular_file(path, os.fstat(handle.fileno()), max_bytes)
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        raise invalid_manifest(f"cannot read manifest {path!r}: {exc}") from None
    if len(data) > max_bytes:  # the file grew after the check
        raise invalid_manifest(f"manifest {path!r} is larger than {max_bytes} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid_manifest(f"manifest {path!r} is not UTF-8 text: {exc}") from None


def _require_small_regular_file(path: str, info: os.stat_result, max_bytes: int) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise invalid_manifest(f"manifest {path!r} is a directory, not a file")
    if not stat.S_ISREG(info.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(info.st_mode) else "a device or socket"
        raise invalid_manifest(f"manifest {path!r} is {kind}, not a regular file")
    if info.st_size > max_bytes:
        raise invalid_manifest(
            f"manifest {path!r} is {info.st_size} bytes; the limit is {max_bytes} (MAX_MANIFEST_BYTES)",
        )


def _one_line(exc: Exception) -> str:
    """A YAML error on one line, ``line L, column C: problem`` (the CLI prints one line per error)."""
    problem, mark = getattr(exc, "problem", None), getattr(exc, "problem_mark", None)
    if problem is None:
        return " ".join(str(exc).split())
    context = getattr(exc, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + (f"{context}: " if context else "") + problem


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads`` hook: an object that states a key twice is refused, not last-one-wins."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}; a key may appear only once")
        out[key] = value
    return out
