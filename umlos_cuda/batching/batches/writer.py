"""Write a plan's microbatches as batch files (``umlos-cuda batch generate``).

What goes in: a plan of any kind whose microbatches are dataset rows (plans/rows.py: a whole plan or a shard
of one, a windowed plan, a mixed plan; a kind's ``save_into`` writes its copy), the token source its rows are
read from (a token store or a Megatron dataset; a mixture's: one per component, in order; BATCH_STORE_MISMATCH,
naming the component, when one is not the plan's) and an output folder, and the layout of the files (layouts.py:
``compact`` by default, ``npz`` for the six int32 arrays; zstd optional). What comes out: the folder of
umlos_cuda/batching/batches/npz.py, one file per microbatch of every epoch, and a report of what was done. The
folder holds a copy of the plan in its own kind (``plan/``); for a kind other than the whole plan, batches.json
also names that kind and each token source with its identity (provenance.py, format 3).

A packed plan's microbatches are collated row by packed row
(:func:`~umlos_cuda.batching.collate.collate_microbatch`).

Parallel: microbatches are collated, encoded and written by a pool of
threads (collation and hashing are NumPy and ``hashlib`` work that releases
the GIL on large buffers, and writing is I/O), a bounded number in flight.

Written in place through the output layer (umlos_cuda/files/writer.py): the
folder is created with its artifact marker (``"artifact": "batch folder"``)
first, is never a symbolic link nor reached through one (every name in it is
created, read and renamed relative to the folder's descriptor), is never a
path the job reads (the plan, the token source), and takes its mode from the
umask. Before anything is removed or written, every name of this project's
in it must be what the writer makes (regular files, a real plan folder):
a link or a FIFO there is refused, nothing deleted.

Atomic per file, resumable: each file is written to a hidden temp name, fsynced
and renamed, so a crash or a kill leaves only finished files (and temp files,
removed on the next run). ``batches.json`` is written first, marked unfinished,
with what the files are made from (plan fingerprint, tokenizer and lengths, or
the plan's kind and its token sources; pad and separator ids); a later run into
the same folder checks that it is the same job (BATCH_OUTPUT_MISMATCH
otherwise, unless ``force``, which starts over), keeps every finished file
whose bytes are exactly those it would write (the files are deterministic, so
this verifies each one completely), rewrites any other, and writes the missing
ones. The last step marks ``batches.json`` finished, with every file's digest
and the batch fingerprint of the first microbatches; only then does a
:class:`~umlos_cuda.batching.batches.reader.BatchReader` open the folder.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from ... import checks, errors
from ...errors import UmlosError
from ...files.artifacts import MARKER, json_field
from ...files.atomic import write_failed
from ...files.writer import ArtifactKind, Folder, open_in_place
from .layouts import DEFAULT_LAYOUT, FILES_FORMAT_V2, Layout
from .npz import FILES_FORMAT, INDEX_FILE, PLAN_FOLDER
from .fingerprint import DEFAULT_N_BATCHES, BatchFingerprint, combine_digests, microbatch_digest
from .provenance import FILES_FORMAT_V3, IMPLIED_KIND, job_view, source_parts, source_path, source_records
from ..collate import collate_microbatch, plan_separator_ids
from ..plans.kinds import PlanKind, kind_of_plan, open_row_plan, plan_kind_of, plan_kinds
from ..plans.plan import plan_error
from ..plans.rows import RowPlan, iter_microbatches, open_row_source
from ..tokens.sources import verify_source
from .reader import read_index

#: The fields of batches.json that say what the files are made from.
IDENTITY = ("format", "layout", "compression", "token_dtype", "plan_kind", "plan_fingerprint", "tokenizer_hash",
            "lengths_sha256", "sources", "pad_id", "separator_ids")
_OUR_FILES = re.compile(r"^(\.tmp-[0-9a-f]{8}-)?epoch_\d+_batch_\d+\.npz(\.zst)?$")
#: The index's temp file, which a run killed while writing it leaves behind.
_INDEX_TEMP = re.compile(r"^\.tmp-[0-9a-f]{8}-batches\.json$")
#: The plan copy's temp and moved-aside folders, which a killed run leaves behind.
_PLAN_TEMP = re.compile(rf"^\.(tmp|old)-{PLAN_FOLDER}-[0-9a-f]{{8}}$")
#: The artifact kind; a folder written before markers is known by its batches.json's format.
BATCH_FOLDER = ArtifactKind("batch folder", lambda folder: json_field(folder, INDEX_FILE, "format") in (FILES_FORMAT,
                                                                                           FILES_FORMAT_V2,
                                                                                           FILES_FORMAT_V3))


@dataclass(frozen=True)
class BatchWriteReport:
    """What :meth:`BatchWriter.write_all` did: ``written`` new files, ``kept``
    finished files found byte-identical, ``rewritten`` files found different
    and replaced; ``fingerprint`` of the first microbatches."""

    files: int
    written: int
    kept: int
    rewritten: int
    fingerprint: BatchFingerprint


class BatchWriter:
    """``BatchWriter(plan, output_dir, store).write_all()``.

    Args:
        plan: a plan of rows (a :class:`~..plans.plan.BatchPlan`, a windowed or a mixed plan, or a plan of a kind
            registered with ``save_into``) or its folder.
        output_dir: the batch folder (created; its parent must exist).
        store: the token source: a token store, a Megatron dataset, or a path to one; for a mixed plan, one per
            component, in the plan's order (a list).
        pad_id: the token id at padding.
        separator_ids: for a plan packed with separators, the token ids put
            between a row's samples (exactly ``separator_len`` of them).
        workers: threads (default: the CPU count, at most 8).
        force: replace an existing batch folder of another job instead of refusing.
        n_batches: microbatches the batch fingerprint covers (default 100).
        verify: re-hash a plan given as a folder (its kind's ``digests``) and the token source against
            their recorded digests before anything is written (default; see
            :func:`~umlos_cuda.batching.tokens.sources.verify_source`).
        layout: ``"compact"`` (default), ``"npz"`` (the six int32 arrays,
            byte for byte as before), ``"index"`` (no files: the reader
            collates from the store), or a :class:`~.layouts.Layout`.
        compression: ``None`` / ``"none"`` or ``"zstd"`` (compact files only).
    """

    def __init__(self, plan: RowPlan | str | os.PathLike[str], output_dir: str | os.PathLike[str], store: Any, *,
                 pad_id: int = 0, separator_ids=(), workers: int | None = None, force: bool = False,
                 n_batches: int = DEFAULT_N_BATCHES, verify: bool = True, layout: str | Layout = DEFAULT_LAYOUT,
                 compression: str | None = None) -> None:
        self.inputs = _input_paths(plan, store)
        self.kind, self.plan = _open(plan, verify)
        self.source = open_row_source(self.plan, store)
        self.separator_ids = plan_separator_ids(self.plan, separator_ids, self.source)
        if verify:
            verify_source(self.source)
        self.sources = None if self.kind.name == IMPLIED_KIND else source_records(self.plan, self.source)
        self.output = os.path.abspath(os.fspath(output_dir))
        self.pad_id = pad_id
        self.workers = checks.integer(workers or min(8, os.cpu_count() or 1), "workers", 1, None,
                                      fail=checks.raising(errors.BATCHING_CONFIG_INVALID,
                                                          operator=errors.BATCHING_OPERATOR),
                                      message=checks.POSITIVE)
        self.force = force
        self.n_batches = n_batches
        self.layout = layout if isinstance(layout, Layout) else \
            Layout.choose(layout, compression, source=self.source, separator_ids=self.separator_ids)

    @property
    def total_microbatches(self) -> int:
        """The files (microbatches) of every epoch."""
        return sum(len(self.plan.epoch_indices(epoch)) for epoch in range(self.plan.num_epochs))

    def identity(self) -> dict:
        """What the files are made from (the fields a resumed run must match): a whole plan's fingerprint,
        tokenizer and lengths (formats 1 and 2, as ever), or any other kind's name, fingerprint and token sources
        (format 3, provenance.py); the pad and separator ids."""
        ids = {"pad_id": self.pad_id, "separator_ids": list(self.separator_ids)}
        if self.sources is None:
            part = self.plan.row_parts()[0]
            return {**self.layout.identity(), "plan_fingerprint": self.plan.fingerprint,
                    "tokenizer_hash": part.tokenizer_hash, "lengths_sha256": part.binding["lengths_sha256"], **ids}
        return {"format": FILES_FORMAT_V3, **self.layout.fields(), "plan_kind": self.kind.name,
                "plan_fingerprint": self.plan.fingerprint, "sources": self.sources, **ids}

    def write_all(self, progress: Callable[[int, int], None] | None = None) -> BatchWriteReport:
        """Write (or keep, after verifying) every microbatch's file; ``progress(done, total)`` as files finish."""
        with self._prepare() as folder:
            return self._write_all(folder, progress)

    def _write_all(self, folder: Folder, progress) -> BatchWriteReport:
        total = self.total_microbatches
        digests: dict[tuple[int, int], str] = {}
        counts = {"written": 0, "kept": 0, "rewritten": 0}
        window = 4 * self.workers
        with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="umlos-batches") as pool:
            pending: set = set()
            try:
                for epoch, microbatch in iter_microbatches(self.plan):
                    if len(pending) >= window:
                        done, pending = wait(pending, return_when=FIRST_COMPLETED)
                        self._collect(done, digests, counts, progress, total)
                    pending.add(pool.submit(self._one, folder, epoch, microbatch))
                done, _ = wait(pending)
                self._collect(done, digests, counts, progress, total)
            except BaseException:
                for future in pending:
                    future.cancel()
                raise
        fingerprint = self._finish(folder, digests)
        return BatchWriteReport(total, counts["written"], counts["kept"], counts["rewritten"], fingerprint)

    # ------------------------------------------------------------------ steps
    def _prepare(self) -> Folder:
        """The batch folder, open, checked and ready: batches.json marked unfinished, the plan copy in place."""
        folder = open_in_place(self.output, BATCH_FOLDER, inputs=self.inputs, foreign=_foreign,
                               operator=errors.BATCHING_OPERATOR)
        try:
            _refuse_strays(folder)
            index = folder.join(INDEX_FILE)
            if folder.lstat(INDEX_FILE) is not None and (self.force or _read_identity(index) != _view(self.identity())):
                if not self.force:
                    raise _mismatch(f"{self.output} holds batch files of another job ({INDEX_FILE} differs in "
                                    f"{_differences(_read_identity(index), _view(self.identity()))}); pass --force to "
                                    "replace them, or write to another folder")
                _clear(folder)
            _write_index(folder, {**self.identity(), "complete": False})  # unreadable until every file is checked
            for name in folder.names():  # what a killed run left half-written
                if (name.startswith(".tmp-") and _OUR_FILES.match(name)) or _INDEX_TEMP.match(name) \
                        or _PLAN_TEMP.match(name):
                    folder.remove(name)
            plan = folder.lstat(PLAN_FOLDER)
            finished = False
            if plan is not None:
                with folder.sub(PLAN_FOLDER) as copy:
                    finished = copy.lstat("meta.json") is not None
            if finished:
                held = folder.join(PLAN_FOLDER)
                if plan_kind_of(held) is not self.kind or \
                        open_row_plan(held, "batch generate").fingerprint != self.plan.fingerprint:
                    raise _mismatch(f"{held} holds another plan than {self.plan.fingerprint}")
            else:
                assert self.kind.save_into is not None  # _open refused a kind without one
                self.kind.save_into(self.plan, folder, PLAN_FOLDER, force=plan is not None,
                                    sources=[source_path(part) for part in source_parts(self.plan, self.source)])
        except OSError as exc:
            folder.close()
            raise write_failed(self.output, exc) from exc
        except BaseException:
            folder.close()
            raise
        return folder

    def _one(self, folder: Folder, epoch: int, microbatch) -> tuple[int, int, str, str]:
        batch = collate_microbatch(self.source, microbatch, pad_id=self.pad_id, separator_ids=self.separator_ids)
        if not self.layout.has_files:  # index: batches.json keeps the digest, the reader collates again
            return epoch, microbatch.index, microbatch_digest(batch.input_ids, batch.loss_mask), "written"
        data, digest = self.layout.file_bytes(epoch, microbatch, batch, self.plan.fingerprint, self.pad_id)
        name = self.layout.file_name(epoch, microbatch.index)
        status = "written"
        try:
            existing = folder.open_regular(name)
            if existing is not None:
                with existing:
                    if existing.read(len(data) + 1) == data:
                        return epoch, microbatch.index, digest, "kept"
            if folder.lstat(name) is not None:
                status = "rewritten"
            folder.replace_file(name, data)
        except OSError as exc:
            raise write_failed(folder.join(name), exc) from exc
        return epoch, microbatch.index, digest, status

    def _collect(self, done, digests: dict, counts: dict, progress, total: int) -> None:
        for future in done:
            epoch, index, digest, status = future.result()
            digests[(epoch, index)] = digest
            counts[status] += 1
        if progress is not None:
            progress(len(digests), total)

    def _finish(self, folder: Folder, digests: dict[tuple[int, int], str]) -> BatchFingerprint:
        held = [(epoch, list(self.plan.epoch_indices(epoch))) for epoch in range(self.plan.num_epochs)]
        first = [(epoch, index) for epoch, indices in held for index in indices][:self.n_batches]
        fingerprint = BatchFingerprint(combine_digests(digests[p] for p in first), self.n_batches,
                                       tuple(digests[p] for p in first), tuple(first), self.plan.fingerprint)
        epochs = [{"epoch": epoch, "indices": indices, "digests": [digests[(epoch, i)] for i in indices]}
                  for epoch, indices in held]
        try:
            _write_index(folder, {**self.identity(), "complete": True, "epochs": epochs,
                                        "batch_fingerprint": fingerprint.to_json()})
        except OSError as exc:
            raise write_failed(folder.join(INDEX_FILE), exc) from exc
        return fingerprint


def write_batches(plan, output_dir, store, **kwargs) -> BatchWriteReport:
    """``BatchWriter(plan, output_dir, store, **kwargs).write_all()``; ``progress`` goes to ``write_all``."""
    progress = kwargs.pop("progress", None)
    return BatchWriter(plan, output_dir, store, **kwargs).write_all(progress)


def _read_identity(path: str) -> dict:
    return _view(read_index(path, require_complete=False))


def _view(data: dict) -> dict:
    """The identity fields of ``data`` (None for those its format does not have), its sources without their paths."""
    view = {key: data.get(key) for key in IDENTITY}
    view["sources"] = job_view(view["sources"])
    return view


def _open(plan: Any, verify: bool) -> tuple[PlanKind, Any]:
    """The kind of ``plan`` (a folder, or a plan opened) and the plan, opened (``verify``: its kind's ``digests``
    re-hashed); PLAN_NOT_FOUND for a kind that is no plan of rows, or that cannot write its copy (no ``save_into``)."""
    if isinstance(plan, (str, os.PathLike)):
        kind, plan = plan_kind_of(plan), open_row_plan(plan, "batch generate", verify=verify)
    else:
        kind = kind_of_plan(plan)
    if not kind.rows or kind.save_into is None:
        takes = " or a ".join(k.name for k in plan_kinds() if k.save_into is not None)
        raise plan_error(errors.PLAN_NOT_FOUND, f"a {kind.name} cannot be written as batch files (its kind has no "
                                                f"save_into); batch generate takes a {takes}")
    return kind, plan


def _differences(a: dict, b: dict) -> str:
    return ", ".join(key for key in IDENTITY if a.get(key) != b.get(key)) or "nothing"


def _input_paths(plan: Any, store: Any) -> list[Any]:
    """The paths the job reads, which the batch folder must not be, hold or sit inside."""
    paths: list[Any] = [plan] if isinstance(plan, (str, os.PathLike)) else []
    where = store if isinstance(store, (str, os.PathLike, list, tuple)) else \
        getattr(store, "root", getattr(store, "prefix", None))
    for item in (where if isinstance(where, (list, tuple)) else [] if where is None else [where]):
        # a store folder, or a Megatron prefix (one of a list) and its two files
        paths += [item, f"{os.fspath(item)}.idx", f"{os.fspath(item)}.bin"]
    return paths


def _foreign(path: str, found: str | None) -> UmlosError:
    what = f"a {found} written by umlos-cuda" if found else f"a non-empty folder without {INDEX_FILE}"
    return _mismatch(f"{path} is {what}: not a batch folder, so nothing in it is replaced; write to a new or empty "
                     "folder")


def _refuse_strays(folder: Folder) -> None:
    """Refuse a folder where a name of this project's is not what the writer
    makes (a link, a FIFO, a folder in place of a file): nothing is removed
    or written then, so nothing is reached through it."""
    for name in folder.names():
        ours_file = name in (INDEX_FILE, MARKER) or _OUR_FILES.match(name) or _INDEX_TEMP.match(name)
        if not (ours_file or name == PLAN_FOLDER or _PLAN_TEMP.match(name)):
            continue  # the user's own files are left alone
        info = folder.lstat(name)
        if info is None:
            continue
        want = stat.S_ISREG if ours_file else stat.S_ISDIR
        if not want(info.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a regular file" if ours_file \
                else "not a folder"
            raise UmlosError(errors.OUTPUT_PATH_INVALID,
                             f"{folder.join(name)} is {kind}; a batch folder written by umlos-cuda holds regular "
                             "files and a plan folder, and nothing in it is written through a link: remove it, or "
                             "write to a new folder", operator=errors.BATCHING_OPERATOR)


def _clear(folder: Folder) -> None:
    """Remove a batch folder's own files (never anything else in it)."""
    for name in folder.names():
        if _OUR_FILES.match(name) or name in (INDEX_FILE, PLAN_FOLDER):
            folder.remove(name)


def _write_index(folder: Folder, data: dict) -> None:
    folder.replace_file(INDEX_FILE, (json.dumps(data, separators=(",", ":")) + "\n").encode("ascii"))


def _mismatch(message: str) -> UmlosError:
    return UmlosError(errors.BATCH_OUTPUT_MISMATCH, message, operator=errors.BATCHING_OPERATOR)
