"""The container's path grammar and file access that cannot leave the container.

A container is a directory whose every file path matches one rule of
:data:`GRAMMAR` (docs/checkpoint-format.md, "Layout"). A path from a manifest
is checked against the grammar *before* it touches the file system, so ``..``,
absolute paths, backslashes, empty components and unknown names are refused
with ``CHECKPOINT_PATH_INVALID`` whatever the manifest says.

Files are opened relative to a directory descriptor, one component at a time,
with ``O_NOFOLLOW``: a symbolic link anywhere inside the container is refused
(``CHECKPOINT_UNEXPECTED_FILE``) rather than followed out of it, and only
regular files are read (a FIFO or device is refused, never waited on).
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from .. import checks, errors
from ..errors import UINT32_MAX, UmlosError
from . import limits

MANIFEST_NAME = "checkpoint_manifest.cbor"
CURSORS_PATH = "data/cursors.cbor"
RUN_MANIFEST_PATH = "data/manifest.cbor"
DP_PATH = "dp/accountant_state.cbor"
TMMU_PATH = "tmmu/plan.cbor"
TRACE_LINK_PATH = "trace/link.cbor"
ARTIFACT_INDEX_PATH = "artifacts/artifact_index.cbor"

#: Files every container holds besides the manifest.
REQUIRED_PATHS = (ARTIFACT_INDEX_PATH, CURSORS_PATH, RUN_MANIFEST_PATH, DP_PATH, TMMU_PATH, TRACE_LINK_PATH)
#: A registered cursor kind's name (``extensions.KIND_PATTERN``; schema 1.2).
KIND_PATTERN = r"[a-z][a-z0-9_]{0,31}"

_NUMBER = r"(0|[1-9][0-9]{0,9})"
#: A user-state name: letters, digits, ``_ . -``; not starting with a dot.
NAME_PATTERN = r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}"
_NAME_RE = re.compile(NAME_PATTERN + r"\Z")
_TENSOR_RE = re.compile(rf"tensors/rank={_NUMBER}/shard={_NUMBER}\.bin\Z")
_OPTIMIZER_RE = re.compile(rf"optimizer/rank={_NUMBER}/state\.bin\Z")
_BLOB_RE = re.compile(rf"artifacts/(blob|array)=({NAME_PATTERN})\.bin\Z")
_KIND_RE = re.compile(rf"data/cursors=({KIND_PATTERN})\.cbor\Z")

#: Every rule of the grammar, for documentation and error messages.
GRAMMAR = (
    MANIFEST_NAME,
    "tensors/rank=<r>/shard=<k>.bin",
    "optimizer/rank=<r>/state.bin",
    DP_PATH,
    CURSORS_PATH,
    RUN_MANIFEST_PATH,
    TMMU_PATH,
    TRACE_LINK_PATH,
    ARTIFACT_INDEX_PATH,
    "artifacts/blob=<name>.bin",
    "artifacts/array=<name>.bin",
    "data/cursors=<kind>.cbor",
)

#: Bounds on what a directory walk will look at before giving up.
MAX_WALK_ENTRIES = limits.MAX_WALK_ENTRIES
MAX_WALK_DEPTH = limits.MAX_WALK_DEPTH
_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class PathInfo:
    """What a valid entry path names: ``kind`` and its numbers or name."""

    kind: str  # "tensor" | "optimizer" | "blob" | "array" | "cursor_kind" | "fixed"
    rank: int | None = None
    shard: int | None = None
    name: str | None = None


def valid_name(name: object) -> bool:
    return isinstance(name, str) and bool(_NAME_RE.match(name))


def parse_entry_path(path: object) -> PathInfo:
    """Classify an entry path; ``CHECKPOINT_PATH_INVALID`` if it is outside the grammar.

    The manifest itself is not an entry, so its name is refused here.
    """
    path = checks.text(path, "an entry path", fail=_invalid, message="{name} must be text, got {type}")
    if path in REQUIRED_PATHS:
        return PathInfo("fixed")
    match = _TENSOR_RE.match(path)
    if match:
        return PathInfo("tensor", rank=_bounded(match.group(1), path), shard=_bounded(match.group(2), path))
    match = _OPTIMIZER_RE.match(path)
    if match:
        return PathInfo("optimizer", rank=_bounded(match.group(1), path))
    match = _BLOB_RE.match(path)
    if match:
        return PathInfo(match.group(1), name=match.group(2))
    match = _KIND_RE.match(path)
    if match:
        return PathInfo("cursor_kind", name=match.group(1))
    raise _invalid(f"entry path {path!r} is not in the container grammar ({', '.join(GRAMMAR[1:])})")


def _bounded(text: str, path: str) -> int:
    return checks.integer_text(text, "rank and shard numbers", 0, UINT32_MAX, fail=_invalid,
                               message=checks.literal(f"entry path {path!r}: rank and shard numbers are at most "
                                                      f"{UINT32_MAX}"))


def _invalid(message: str) -> UmlosError:
    return UmlosError(errors.CHECKPOINT_PATH_INVALID, message, operator=errors.CHECKPOINT_VALIDATE_OPERATOR)


def tensor_path(rank: int, shard: int) -> str:
    return f"tensors/rank={rank}/shard={shard}.bin"


def optimizer_path(rank: int) -> str:
    return f"optimizer/rank={rank}/state.bin"


def artifact_path(kind: str, name: str) -> str:
    return f"artifacts/{kind}={name}.bin"


def cursor_kind_path(kind: str) -> str:
    """The file of a registered cursor kind's state (schema 1.2)."""
    return f"data/cursors={kind}.cbor"


# -- reading inside a container ---------------------------------------------------


def _has_link(root_fd: int, parts: list[str]) -> bool:
    """Whether some component of ``parts`` under ``root_fd`` is a symbolic link."""
    prefix = ""
    for part in parts:
        prefix = f"{prefix}/{part}" if prefix else part
        try:
            if stat.S_ISLNK(os.stat(prefix, dir_fd=root_fd, follow_symlinks=False).st_mode):
                return True
        except OSError:
            return False
    return False


def _os_error(exc: OSError, what: str, link: bool = False) -> UmlosError:
    if link or exc.errno == errno.ELOOP:
        return UmlosError(
            errors.CHECKPOINT_UNEXPECTED_FILE,
            f"{what} passes through a symbolic link; links are never followed inside a container",
            operator=errors.CHECKPOINT_VALIDATE_OPERATOR,
        )
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return UmlosError(errors.CHECKPOINT_FILE_MISSING, f"{what} is missing",
                          operator=errors.CHECKPOINT_VALIDATE_OPERATOR)
    return UmlosError(errors.CHECKPOINT_IO_ERROR, f"cannot read {what}: {exc.strerror}",
                      operator=errors.CHECKPOINT_VALIDATE_OPERATOR)


def open_root(path: str | os.PathLike[str], *, follow: bool = True) -> int:
    """A descriptor of the directory ``path`` (the caller closes it).

    ``follow=False`` (containers) refuses ``path`` itself being a symbolic
    link (``CHECKPOINT_UNEXPECTED_FILE``); a store's own folder may be a link.
    """
    path = os.fspath(path)
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | (0 if follow else os.O_NOFOLLOW))
    except OSError as exc:
        if not follow and (exc.errno == errno.ELOOP or os.path.islink(path)):
            raise UmlosError(
                errors.CHECKPOINT_UNEXPECTED_FILE,
                f"{path} is a symbolic link; links are never followed (pass the folder it points to)",
                operator=errors.CHECKPOINT_VALIDATE_OPERATOR,
            ) from None
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise UmlosError(
                errors.CHECKPOINT_NOT_FOUND, f"{path} is not a directory", operator=errors.CHECKPOINT_VALIDATE_OPERATOR
            ) from None
        raise UmlosError(errors.CHECKPOINT_IO_ERROR, f"cannot open {path}: {exc.strerror}",
                         operator=errors.CHECKPOINT_VALIDATE_OPERATOR) from None


def open_regular(root_fd: int, relpath: str) -> int:
    """Open ``relpath`` under ``root_fd`` without following any link; regular files only."""
    parts = relpath.split("/")
    fd = root_fd
    opened: list[int] = []
    try:
        for part in parts[:-1]:
            fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            opened.append(fd)
        file_fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    except OSError as exc:
        raise _os_error(exc, relpath, _has_link(root_fd, parts)) from None
    finally:
        for item in opened:
            os.close(item)
    info = os.fstat(file_fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(file_fd)
        raise UmlosError(
            errors.CHECKPOINT_UNEXPECTED_FILE,
            f"{relpath} is not a regular file",
            operator=errors.CHECKPOINT_VALIDATE_OPERATOR,
        )
    return file_fd


def read_bytes(root_fd: int, relpath: str, max_bytes: int, code: str = errors.CHECKPOINT_CBOR_INVALID) -> bytes:
    """The bytes of ``relpath``; refuse files larger than ``max_bytes`` before reading them."""
    fd = open_regular(root_fd, relpath)
    try:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise UmlosError(code, f"{relpath} is {size} bytes; the limit is {max_bytes}",
                             operator=errors.CHECKPOINT_VALIDATE_OPERATOR)
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        raise _os_error(exc, relpath) from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise UmlosError(code, f"{relpath} grew past {max_bytes} bytes while read",
                         operator=errors.CHECKPOINT_VALIDATE_OPERATOR)
    return data


def hash_file(root_fd: int, relpath: str) -> tuple[int, bytes]:
    """``(size, sha256)`` of ``relpath``, streamed in 1 MiB chunks."""
    fd = open_regular(root_fd, relpath)
    digest = hashlib.sha256()
    size = 0
    try:
        with os.fdopen(os.dup(fd), "rb") as handle:
            while True:
                chunk = handle.read(_CHUNK)
                if not chunk:
                    break
                size += len(chunk)
                digest.update(chunk)
    except OSError as exc:
        raise _os_error(exc, relpath) from None
    finally:
        os.close(fd)
    return size, digest.digest()


def walk(root_fd: int) -> Iterator[tuple[str, str]]:
    """Every entry under the root as ``(relpath, kind)`` with kind ``file``,
    ``dir`` or ``other`` (links, FIFOs, devices), links never followed.

    Bounded: more than :data:`MAX_WALK_ENTRIES` entries or a folder deeper
    than :data:`MAX_WALK_DEPTH` is refused as ``CHECKPOINT_UNEXPECTED_FILE``.
    """
    count = 0
    stack: list[tuple[str, int]] = [("", 0)]
    while stack:
        prefix, depth = stack.pop()
        try:
            fd = root_fd if not prefix else _open_dir(root_fd, prefix)
            try:
                names = sorted(os.listdir(fd))
                kinds = []
                for name in names:
                    mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
                    kinds.append("file" if stat.S_ISREG(mode) else "dir" if stat.S_ISDIR(mode) else "other")
            finally:
                if fd != root_fd:
                    os.close(fd)
        except OSError as exc:
            raise _os_error(exc, prefix or ".") from None
        for name, kind in zip(names, kinds):
            count += 1
            if count > MAX_WALK_ENTRIES:
                raise UmlosError(
                    errors.CHECKPOINT_UNEXPECTED_FILE,
                    f"more than {MAX_WALK_ENTRIES} entries in the container",
                    operator=errors.CHECKPOINT_VALIDATE_OPERATOR,
                )
            relpath = f"{prefix}/{name}" if prefix else name
            yield relpath, kind
            if kind == "dir":
                if depth + 1 >= MAX_WALK_DEPTH:
                    raise UmlosError(
                        errors.CHECKPOINT_UNEXPECTED_FILE,
                        f"{relpath}/ is nested deeper than any container path",
                        operator=errors.CHECKPOINT_VALIDATE_OPERATOR,
                    )
                stack.append((relpath, depth + 1))


def _open_dir(root_fd: int, relpath: str) -> int:
    fd = root_fd
    opened: list[int] = []
    try:
        for part in relpath.split("/"):
            fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            opened.append(fd)
    except OSError:
        for item in opened:
            os.close(item)
        raise
    for item in opened[:-1]:
        os.close(item)
    return fd
