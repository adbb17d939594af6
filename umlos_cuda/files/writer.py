"""The one output layer: how every command and API of umlos-cuda writes a folder or a file.

The rules, each kept here once for every writer (docs/architecture.md,
"Writing outputs"):

1. **Checked before any work.** The parent folder exists; the output is not a
   symbolic link (a link is never written through, nor replaced); an existing
   output is replaced only with ``force``, and only when it is an artifact of
   the kind being written (its marker, :mod:`umlos_cuda.files.artifacts`);
   the output is never an input of the same command, nor holds one, nor sits
   inside one (:mod:`umlos_cuda.files.inputs`). Commands call the
   ``check_*`` functions before their work, so a wrong ``--output`` fails in
   a second; the writes check again when they publish.
2. **Written aside, published in one step.** A folder is filled in a hidden
   sibling ``.tmp-<name>-<random>`` (created with ``mkdir``, so it is new and
   not a link), marker included, fsynced, and renamed to its name; a folder it
   replaces is first moved into a hidden ``.old-<name>-<random>`` and removed
   after. One file: :mod:`umlos_cuda.files.atomic` (a temp file created
   ``O_EXCL | O_NOFOLLOW`` beside it, renamed).
3. **No link followed at any level the command creates**: everything inside
   a new folder is created through its descriptor
   (:class:`~umlos_cuda.files.folder.Folder`).
4. **Modes from the umask**: folders 0777 and files 0666, less the umask.
5. **A failure leaves nothing that blocks a retry or looks valid**: on any
   exception (Ctrl-C and SIGTERM included, which the CLI turns into
   exceptions) the temp folder is removed; a SIGKILL leaves only the hidden
   temp sibling, which no reader opens and no retry collides with. The
   temp folder holds the marker of the kind being written and is locked by
   its writer (``flock`` on the folder, files/lock.py) until it is published
   or removed, so :func:`remove_stale_temps` can tell one a killed writer
   left (unlocked) from one being written, and a command may remove its own
   kind's leftovers before it writes (``data tokenize`` does).
6. **Every failure has a code** naming the path and what to do:
   OUTPUT_PATH_INVALID, OUTPUT_EXISTS, OUTPUT_IS_INPUT, OUTPUT_WRITE_FAILED.

A folder written in place and resumed (batch files) is opened with
:func:`open_in_place`: created with its marker first, or reopened only when
it is of the same kind.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator

from .. import errors
from ..errors import UmlosError
from .artifacts import MARKER, ArtifactKind, identify, marked_kind, write_marker
from .atomic import atomic_output, check_output_path
from .folder import Folder
from .inputs import refuse_inputs
from .lock import hold_folder, try_hold_folder

__all__ = ["ArtifactKind", "Folder", "MARKER", "atomic_output", "check_output_folder", "check_output_path",
           "open_in_place", "output_folder", "output_member", "remove_stale_temps", "temp_folder"]

PathLike = str | os.PathLike[str]


def check_output_folder(directory: PathLike, kind: ArtifactKind, *, force: bool = False,
                        inputs: Iterable[PathLike | None] = (), operator: str = errors.OUTPUT_OPERATOR) -> str:
    """The absolute path of a ``kind`` folder to write, refused before any
    work when it cannot be written or replaced (rule 1)."""
    path, parent = _open_parent(directory, kind, operator)
    with parent:
        refuse_inputs(path, inputs, operator=operator, what=f"the {kind.name}")
        _check_member(parent, os.path.basename(path), path, kind, force, operator)
    return path


@contextlib.contextmanager
def output_folder(directory: PathLike, kind: ArtifactKind, *, force: bool = False,
                  inputs: Iterable[PathLike | None] = (), operator: str = errors.OUTPUT_OPERATOR) -> Iterator[Folder]:
    """Yield a new hidden folder to fill; when the block succeeds it becomes
    ``directory`` (replacing, with ``force``, a folder of the same kind)."""
    path = check_output_folder(directory, kind, force=force, inputs=inputs, operator=operator)
    parent = _open_parent(path, kind, operator)[1]
    with parent, output_member(parent, os.path.basename(path), kind, force=force, operator=operator) as folder:
        yield folder


@contextlib.contextmanager
def output_member(parent: Folder, name: str, kind: ArtifactKind, *, force: bool = False,
                  operator: str = errors.OUTPUT_OPERATOR) -> Iterator[Folder]:
    """:func:`output_folder` for the folder ``name`` inside a folder held open
    (a batch folder's copy of its plan, the ranks of a shard set)."""
    path = parent.join(name)
    _check_member(parent, name, path, kind, force, operator)
    try:
        temp_name, temp, hold = _locked_temp(parent, f".tmp-{name}-", kind)
    except OSError as exc:
        raise _error(errors.OUTPUT_PATH_INVALID, f"cannot create a folder in {parent.path}: {_reason(exc)}",
                     operator) from exc
    try:
        try:
            with temp:
                yield temp
                temp.sync()
            _check_member(parent, name, path, kind, force, operator)  # it may have changed while we worked
            _publish(parent, temp_name, name)
        except OSError as exc:
            raise _error(errors.OUTPUT_WRITE_FAILED, f"writing the {kind.name} {path} failed: {_reason(exc)}",
                         operator) from exc
    except BaseException:
        with contextlib.suppress(OSError):
            parent.remove(temp_name)
        raise
    finally:
        _release(hold)


@contextlib.contextmanager
def temp_folder(directory: PathLike, label: str, kind: ArtifactKind,
                operator: str = errors.OUTPUT_OPERATOR) -> Iterator[str]:
    """A new hidden folder ``.tmp-NAME-LABEL-<random>`` beside ``directory`` (NAME its name: on its file
    system, so what is written there is moved in by a rename), marked as a temp of a ``kind`` write and
    locked as :func:`output_member`'s, removed with whatever is left in it when the block ends, however it
    ends; yields its path. What a writer stages before it adopts it (a sharded store's new shards)."""
    path, parent = _open_parent(directory, kind, operator)
    with parent:
        try:
            stage_name, stage, hold = _locked_temp(parent, f".tmp-{os.path.basename(path)}-{label}-", kind)
        except OSError as exc:
            raise _error(errors.OUTPUT_PATH_INVALID, f"cannot create a folder in {parent.path}: {_reason(exc)}",
                         operator) from exc
        stage.close()
        try:
            yield parent.join(stage_name)
        finally:
            with contextlib.suppress(OSError):
                parent.remove(stage_name)
            _release(hold)


def remove_stale_temps(directory: PathLike, kind: ArtifactKind, operator: str = errors.OUTPUT_OPERATOR
                       ) -> list[str]:
    """Remove the temp folders of ``kind`` writes of ``directory`` that killed writers left beside it
    (:func:`output_member`'s ``.tmp-NAME-<random>``, :func:`temp_folder`'s ``.tmp-NAME-LABEL-<random>``):
    only a real folder (never a link) whose marker names ``kind`` and that no live process holds (its lock is
    free; each is removed while this one holds it). A temp of another kind, one without a marker (written
    before temps were marked, or its writer just starting) or one held is left alone. Returns the paths
    removed. Names alone cannot tell ``out``'s stage temp from a temp of an output named ``out-stage``: such
    a temp, stale and of the same kind, is removed too (nothing ever resumes from a temp). An earlier
    version's writer did not lock its temps: do not run two versions on one output at once."""
    path, parent = _open_parent(directory, kind, operator)
    prefix = f".tmp-{os.path.basename(path)}"
    removed = []
    with parent:
        for entry in sorted(parent.names()):
            if not entry.startswith(prefix) or _TEMP.fullmatch(entry[len(prefix):]) is None:
                continue
            with contextlib.suppress(OSError):  # gone meanwhile, a link, not a folder: not ours to remove
                if _remove_if_stale(parent, entry, kind):
                    removed.append(parent.join(entry))
    return removed


#: The end of a temp folder's name after ``.tmp-NAME``: ``-<8 hex>``, or ``-LABEL-<8 hex>``.
_TEMP = re.compile(r"-(?:[a-z]+-)?[0-9a-f]{8}")


def _remove_if_stale(parent: Folder, entry: str, kind: ArtifactKind) -> bool:
    with parent.sub(entry) as temp:  # O_NOFOLLOW: a link there raises, and is left alone
        hold = try_hold_folder(temp)
        if hold is None:
            return False
        try:
            if marked_kind(temp) != kind.name:
                return False
            parent.remove(entry)
            return True
        finally:
            _release(hold)


def _locked_temp(parent: Folder, prefix: str, kind: ArtifactKind) -> tuple[str, Folder, int]:
    """A new temp folder in ``parent``, locked (:func:`~umlos_cuda.files.lock.hold_folder`) before its marker
    is written, so a marked temp is always one whose writer holds it or has died."""
    name, temp = parent.mkdir_temp(prefix)
    hold = -1
    try:
        hold = hold_folder(temp)
        write_marker(temp, kind)
    except BaseException:
        temp.close()
        with contextlib.suppress(OSError):
            parent.remove(name)
        _release(hold)
        raise
    return name, temp, hold


def _release(hold: int) -> None:
    if hold >= 0:
        os.close(hold)


def open_in_place(directory: PathLike, kind: ArtifactKind, *, inputs: Iterable[PathLike | None] = (),
                  foreign: Callable[[str, str | None], UmlosError], operator: str = errors.OUTPUT_OPERATOR) -> Folder:
    """The ``kind`` folder ``directory`` opened to be written in place (and
    resumed): created with its marker when missing; an existing folder is
    reopened when it is of this kind or empty, and ``foreign(path, found)``
    is raised otherwise (``found``: the kind its marker names, if any).
    The caller closes the :class:`Folder`."""
    path, parent = _open_parent(directory, kind, operator)
    name = os.path.basename(path)
    with parent:
        refuse_inputs(path, inputs, operator=operator, what=f"the {kind.name}")
        info = _refuse_link_or_file(parent, name, path, kind, operator)
        created = False
        try:
            if info is None:
                try:
                    folder = parent.mkdir(name)
                    created = True
                except FileExistsError:  # another process (a DataLoader worker) created it a moment ago
                    _refuse_link_or_file(parent, name, path, kind, operator)
            if not created:
                folder = parent.sub(name)
        except OSError as exc:
            raise _error(errors.OUTPUT_PATH_INVALID, f"cannot open the {kind.name} {path}: {_reason(exc)}",
                         operator) from exc
        hold = -1
        try:
            # Processes that open one folder at once (the workers sharing a block cache) take turns here, so
            # each finds either no marker or a whole one, and only the first writes it.
            hold = hold_folder(folder)
            same, found = identify(folder, kind)
            if not same and folder.names():
                raise foreign(path, found)
            if found is None and folder.lstat(MARKER) is not None:
                raise _error(errors.OUTPUT_PATH_INVALID, f"{folder.join(MARKER)} is not a marker umlos-cuda wrote (a "
                             "link, a FIFO, other content): remove it, or write to a new folder", operator)
            if found is None:  # new, empty, or written before markers existed
                write_marker(folder, kind)
                folder.sync()
            if created:
                parent.sync()
        except OSError as exc:
            folder.close()
            raise _error(errors.OUTPUT_WRITE_FAILED, f"writing the {kind.name} {path} failed: {_reason(exc)}",
                         operator) from exc
        except BaseException:
            folder.close()
            raise
        finally:
            _release(hold)
    return folder


# ---------------------------------------------------------------------- checks
def _open_parent(directory: PathLike, kind: ArtifactKind, operator: str) -> tuple[str, Folder]:
    path = os.path.abspath(os.fspath(directory))
    parent = os.path.dirname(path)
    if path == parent:
        raise _error(errors.OUTPUT_PATH_INVALID, f"cannot write the {kind.name} {path}: give a folder name", operator)
    try:
        return path, Folder.open(parent, follow=True)  # the user's own folder: a link there is the user's choice
    except (FileNotFoundError, NotADirectoryError):
        raise _error(errors.OUTPUT_PATH_INVALID, f"cannot write the {kind.name} {path}: folder {parent} does not "
                     "exist (create it first)", operator) from None
    except OSError as exc:
        raise _error(errors.OUTPUT_PATH_INVALID, f"cannot write the {kind.name} {path}: {_reason(exc)}",
                     operator) from exc


def _refuse_link_or_file(parent: Folder, name: str, path: str, kind: ArtifactKind,
                         operator: str) -> os.stat_result | None:
    try:
        info = parent.lstat(name)
    except OSError as exc:
        raise _error(errors.OUTPUT_PATH_INVALID, f"cannot write the {kind.name} {path}: {_reason(exc)}",
                     operator) from exc
    if info is None:
        return None
    if stat.S_ISLNK(info.st_mode):
        raise _error(errors.OUTPUT_PATH_INVALID, f"{path} is a symbolic link; umlos-cuda never writes through one "
                     "nor replaces it: give the folder's real path, or remove the link", operator)
    if not stat.S_ISDIR(info.st_mode):
        raise _error(errors.OUTPUT_PATH_INVALID, f"{path} exists and is not a folder; a {kind.name} is a folder",
                     operator)
    return info


def _check_member(parent: Folder, name: str, path: str, kind: ArtifactKind, force: bool, operator: str) -> None:
    """Refuse ``name`` in ``parent`` unless it is new or, with ``force``, an
    empty folder or a folder of ``kind`` (rule 1)."""
    if _refuse_link_or_file(parent, name, path, kind, operator) is None:
        return
    if not force:
        raise _error(errors.OUTPUT_EXISTS, f"{path} exists; pass --force to replace it", operator)
    try:
        with parent.sub(name) as existing:
            if not existing.names():
                return
            same, found = identify(existing, kind)
    except OSError as exc:
        raise _error(errors.OUTPUT_PATH_INVALID, f"cannot read {path}: {_reason(exc)}", operator) from exc
    if not same:
        raise _error(errors.OUTPUT_PATH_INVALID, foreign_message(path, kind, found), operator)


def foreign_message(path: str, kind: ArtifactKind, found: str | None) -> str:
    """Why ``force`` does not replace ``path``: it is not a ``kind``."""
    if found is not None:
        return (f"{path} is a {found} written by umlos-cuda, not a {kind.name}; --force replaces only a {kind.name}: "
                "write to another folder")
    return (f"{path} is a non-empty folder that is not a {kind.name} written by umlos-cuda (it has no {MARKER}); "
            f"--force replaces only a {kind.name}: write to another folder")


# ---------------------------------------------------------------------- publishing
def _publish(parent: Folder, temp_name: str, name: str) -> None:
    """Rename ``temp_name`` to ``name``; a folder already there is moved aside
    first and removed after (never followed: a link there is moved, not its target)."""
    if parent.lstat(name) is None:
        parent.rename(temp_name, name)
        parent.sync()
        return
    old_name, old = parent.mkdir_temp(f".old-{name}-")
    with old:
        parent.rename(name, "previous", into=old)
        try:
            parent.rename(temp_name, name)
        except OSError:
            with contextlib.suppress(OSError):
                old.rename("previous", name, into=parent)  # put the old one back
            raise
    parent.sync()
    with contextlib.suppress(OSError):
        parent.remove(old_name)


def _reason(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0)
    return f"{exc.strerror or exc}" + (f" ({name})" if name else "")


def _error(code: str, message: str, operator: str) -> UmlosError:
    return UmlosError(code, message, operator=operator)
