"""What an output on disk is: the artifact kind marker that ``--force`` reads before it removes anything.

Every folder this project writes (a plan, a plan's shards, a token store, a
batch folder, a gym run) holds one small file of its own, :data:`MARKER`::

    {"artifact":"plan","format":"umlos-cuda/artifact-v1"}

like git's ``.git/HEAD``: a name that says what the folder is, readable
without parsing anything else in it. ``--force`` replaces a folder only when
its marker names the kind being written. A folder written before markers
existed is recognised by its kind's own *signature* (a plan's ``meta.json``
with the plan format, ...), never by the mere presence of a file name such
as ``meta.json``, which model folders and datasets have too.

A file cannot hold a marker without changing its format: a file kind
(:class:`FileKind`, the length cache) is recognised by its content instead.

Reads here are small and safe: regular files only, never through a link,
never blocking on a FIFO, at most :data:`MARKER_LIMIT` (or a signature's own
limit) bytes, and a parse failure of any kind (deep nesting included) only
means "not this kind".
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .folder import Folder
from .reader import MAX_JSON_DEPTH, json_depth

#: The marker's file name inside every folder artifact.
MARKER = "umlos-artifact.json"
#: The marker's own format.
MARKER_FORMAT = "umlos-cuda/artifact-v1"
#: A marker is a few dozen bytes; anything larger is not one.
MARKER_LIMIT = 4096
#: What a signature reads of a file at most (a plan's meta.json is a few KiB).
SIGNATURE_LIMIT = 1 << 20


@dataclass(frozen=True)
class ArtifactKind:
    """A kind of folder this project writes.

    ``name`` is what the marker says and what messages call it ("plan",
    "token store"); ``signature(folder)`` recognises a folder of this kind
    written before markers existed (None: every folder of this kind has one).
    """

    name: str
    signature: Callable[[Folder], bool] | None = None

    def marker_bytes(self) -> bytes:
        return (json.dumps({"artifact": self.name, "format": MARKER_FORMAT}, separators=(",", ":")) + "\n").encode()


@dataclass(frozen=True)
class FileKind:
    """A kind of single file this project writes; ``recognise(path)`` says
    whether the regular file at ``path`` is one (by its content)."""

    name: str
    recognise: Callable[[str], bool]


def write_marker(folder: Folder, kind: ArtifactKind) -> None:
    """Write ``kind``'s marker into ``folder`` (a new file, fsynced)."""
    folder.write_bytes(MARKER, kind.marker_bytes())


def marked_kind(folder: Folder) -> str | None:
    """The artifact name the marker of ``folder`` states, or None when it has none."""
    return marker_artifact(folder.read(MARKER, MARKER_LIMIT))


def marker_artifact(data: bytes | None) -> str | None:
    """The artifact name a marker's bytes state (a folder's, an object store's: at most :data:`MARKER_LIMIT`
    of them), or None when they are no marker."""
    value = _json(data)
    if isinstance(value, dict) and value.get("format") == MARKER_FORMAT and isinstance(value.get("artifact"), str):
        return value["artifact"]
    return None


def identify(folder: Folder, kind: ArtifactKind) -> tuple[bool, str | None]:
    """``(is a kind folder, the kind its marker names or None)``."""
    found = marked_kind(folder)
    if found is not None:
        return found == kind.name, found
    return bool(kind.signature is not None and kind.signature(folder)), None


# ---------------------------------------------------------------------- signatures
def json_field(folder: Folder, name: str, key: str) -> Any:
    """``value[key]`` of the JSON object in the file ``name`` of ``folder``
    (None when it is missing, too large, not JSON or not an object)."""
    value = _json(folder.read(name, SIGNATURE_LIMIT))
    return value.get(key) if isinstance(value, dict) else None


def first_line_field(folder: Folder, name: str, key: str) -> Any:
    """``value[key]`` of the JSON object on the first line of the file ``name``
    (a JSONL file's header), read up to :data:`SIGNATURE_LIMIT` bytes."""
    handle = folder.open_regular(name)
    if handle is None:
        return None
    with handle:
        line = handle.readline(SIGNATURE_LIMIT)
    value = _json(line)
    return value.get(key) if isinstance(value, dict) else None


def read_head(path: str, limit: int) -> bytes | None:
    """The first ``limit`` bytes of the regular file ``path`` (never through a
    link, never blocking on a FIFO), or None when it is anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit)
    finally:
        os.close(fd)


def _json(data: bytes | None) -> Any:
    """The JSON value of ``data``, or None; nesting is measured first (files/reader.py), so the
    parser never recurses deeper than the input layer allows."""
    if data is None or json_depth(data) > MAX_JSON_DEPTH:
        return None
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
