"""Every kind of artifact this project writes, and what can be asked of one: the registry behind
``umlos-cuda info PATH`` and ``umlos-cuda verify PATH``.

What goes in: a path (a folder, a file, a Megatron prefix). What comes out: the :class:`Artifact` it is,
whose ``open`` reads it, ``verify`` runs every check its files allow (``{"checks": [...], "fingerprint"}``),
``report`` describes it as a plain dict (``info --json``) and ``lines`` as text.

A folder is recognised by its marker (``umlos-artifact.json``, :mod:`.files.artifacts`: a few bytes, never
through a link, never blocking on a FIFO), one written before markers by its kind's signature, a file by
its content, a prefix by its name; the first kind that recognises a path is its kind, markers first.

Each subsystem registers its kinds (:func:`register_artifact`) in a module of its own, which the package
declares as an entry point of the group :data:`GROUP` (pyproject.toml); the registry imports those modules
the first time it is asked (:class:`~umlos_cuda.plugins.EntryPoints`), so a process that never imported a
subsystem still knows its artifacts. Adding a kind: its entry in such a module (docs/architecture.md,
"Artifacts").
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from threading import Lock
from typing import Any

from . import errors
from .errors import UmlosError
from .files.artifacts import ArtifactKind, marked_kind
from .files.folder import Folder
from .plugins import EntryPoints

__all__ = ["GROUP", "INFO_OPTIONS", "VERIFY_OPTIONS", "Artifact", "artifact_of", "artifacts", "get_artifact",
           "register_artifact", "unregister_artifact"]

#: The entry-point group whose modules register artifact kinds.
GROUP = "umlos_cuda.artifacts"
#: The keyword options an artifact's ``report`` may take beyond the path (``umlos-cuda info``'s flags).
INFO_OPTIONS = ("world_size", "rank")
#: The keyword options an artifact's ``verify`` may take (``umlos-cuda verify``'s flags).
VERIFY_OPTIONS = ("expected_fingerprint", "windows", "seed", "lengths", "rebuild", "store")

ENTRY_POINTS = EntryPoints(GROUP)


@dataclass(frozen=True)
class Artifact:
    """One kind of artifact (module docstring). ``folder`` is its folder kind when it is a folder (recognised by
    the marker, else the kind's signature); otherwise ``recognise(path)`` says whether a path is one (cheap, never
    raising). ``info_options`` and ``verify_options`` are the keyword options its ``report`` and ``verify`` take,
    among :data:`INFO_OPTIONS` and :data:`VERIFY_OPTIONS`."""

    name: str
    open: Callable[[str], Any]
    verify: Callable[..., dict]
    report: Callable[..., dict]
    lines: Callable[[dict], list[str]]
    folder: ArtifactKind | None = None
    recognise: Callable[[str], bool] | None = None
    info_options: frozenset[str] = frozenset()
    verify_options: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if (self.folder is None) == (self.recognise is None):
            raise _registry_error(f"artifact {self.name!r} needs exactly one of folder= (a folder kind, recognised "
                                  "by its marker) and recognise= (a file or prefix)")
        if self.folder is not None and self.folder.name != self.name:
            raise _registry_error(f"artifact {self.name!r} names the folder kind {self.folder.name!r}")
        for given, allowed, what in ((self.info_options, INFO_OPTIONS, "info"),
                                     (self.verify_options, VERIFY_OPTIONS, "verify")):
            unknown = sorted(set(given) - set(allowed))
            if unknown:
                raise _registry_error(f"artifact {self.name!r}: unknown {what} options {unknown}")


_kinds: dict[str, Artifact] = {}
_lock = Lock()


def register_artifact(artifact: Artifact, *, replace: bool = False) -> Artifact:
    """Add ``artifact`` and return it; INVALID_ARGUMENT when its name is taken (unless ``replace``)."""
    if not isinstance(artifact, Artifact):
        raise _registry_error(f"register_artifact takes an Artifact, got {type(artifact).__name__}")
    with _lock:
        if artifact.name in _kinds and not replace:
            raise _registry_error(f"artifact kind {artifact.name!r} is already registered")
        _kinds[artifact.name] = artifact
    return artifact


def unregister_artifact(name: str) -> None:
    """Remove the kind ``name``."""
    with _lock:
        if _kinds.pop(name, None) is None:
            raise _registry_error(f"no artifact kind {name!r} is registered")


def artifacts() -> tuple[Artifact, ...]:
    """Every registered kind, the subsystems' entry points imported first."""
    ENTRY_POINTS.load()
    return tuple(_kinds.values())


def get_artifact(name: str) -> Artifact:
    """The kind called ``name``, or ARTIFACT_UNKNOWN."""
    known = {artifact.name: artifact for artifact in artifacts()}
    if name not in known:
        raise UmlosError(errors.ARTIFACT_UNKNOWN, f"no artifact kind {name!r}; the kinds are {', '.join(known)} "
                         f"({ENTRY_POINTS.hint()})", operator=errors.ARTIFACTS_OPERATOR)
    return known[name]


def artifact_of(path) -> Artifact:
    """The kind of the artifact at ``path``: by a folder's marker, a folder's signature, a file's content or a
    prefix's name, in that order; ARTIFACT_UNKNOWN (saying what the path is) for anything else."""
    path = os.fspath(path)
    kinds = artifacts()
    marked = None
    try:
        with Folder.open(path) as folder:
            marked = marked_kind(folder)
            if marked is None:
                for artifact in kinds:
                    kind = artifact.folder
                    if kind is not None and kind.signature is not None and kind.signature(folder):
                        return artifact
    except (OSError, ValueError):
        pass  # not a folder that opens: a file or a prefix
    if marked is not None:
        for artifact in kinds:
            if artifact.name == marked:
                return artifact
        raise UmlosError(errors.ARTIFACT_UNKNOWN, f"{path} is marked as a {marked!r}, which no registered kind is "
                         f"({ENTRY_POINTS.hint()})", operator=errors.ARTIFACTS_OPERATOR)
    for artifact in kinds:
        if artifact.recognise is not None and artifact.recognise(path):
            return artifact
    what = "does not exist" if not os.path.lexists(path) else "is a folder" if os.path.isdir(path) else "is a file"
    raise UmlosError(errors.ARTIFACT_UNKNOWN, f"{path} {what}, and no artifact kind recognises it (the kinds are "
                     f"{', '.join(a.name for a in kinds)})", operator=errors.ARTIFACTS_OPERATOR)


def _registry_error(message: str) -> UmlosError:
    return UmlosError(errors.INVALID_ARGUMENT, message, operator=errors.ARTIFACTS_OPERATOR)
