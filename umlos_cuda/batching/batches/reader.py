"""Read a folder of batch files: by epoch, by index, by rank, and verified.

What goes in: a folder that ``umlos-cuda batch generate``
(:class:`~umlos_cuda.batching.batches.writer.BatchWriter`) finished. What
comes out: each microbatch's arrays as a ``dict`` of NumPy arrays (the
:class:`~umlos_cuda.batching.collate.CollatedBatch` fields plus
``sample_ids``, ``rows``, ``bucket_id``, ``epoch``, ``index``, ``max_len``,
``plan_fingerprint``, ``fingerprint``), in the plan's order.

The reader needs nothing but the folder: the plan is its ``plan/``
subfolder, opened through its kind (a windowed or mixed plan's copy reopens
its lengths from the token sources it records, by absolute path), and
``batches.json`` names the files' layout (layouts.py: a compact file decodes
to the same dict, its plan fields taken from the plan) and, for a plan of
any kind but the whole plan, that kind and the token sources the files were
collated from (provenance.py). Reading a file checks only that it is the one asked for (its
``epoch`` and ``index``), so iteration costs no more than ``numpy.load`` of
the six arrays (bench/bench_batch_files.py); :meth:`BatchReader.verify` checks every file completely against the
plan and the digests of ``batches.json``, and, given the token source,
against a fresh collation (byte for byte).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from typing import Any

import numpy as np

from ... import checks, errors
from ...errors import UmlosError
from .layouts import FILES_FORMAT_V2, Layout
from .npz import FILES_FORMAT, INDEX_FILE, PLAN_FOLDER, file_error, plan_members
from .fingerprint import DEFAULT_N_BATCHES, BatchFingerprint, batch_fingerprint, microbatch_digest
from .provenance import FILES_FORMAT_V3, IMPLIED_KIND, check_record, check_sources
from ...files import reader
from ..plans.kinds import open_row_plan, plan_kind_of
from ..plans.plan import plan_error
from ..plans.rows import RowPlan, join_parts, open_row_parts, rank_share
from ..collate import collate_microbatch
from ..tokens.sources import source_name, verify_source


class BatchReader:
    """``BatchReader(dir)``: the batch files of a finished folder.

    Args:
        directory: the folder ``batch generate`` wrote.
        plan: the plan to read by (default: ``directory/plan``, opened through its kind); a shard of
            it reads only that rank's files (see :meth:`shard`).
        store: the token source (a path or an opened source; a mixed plan's: one per component, in order)
            for a folder of the ``index`` layout, which holds no files: each microbatch is
            collated from it and must hash to the digest batches.json
            records. Ignored for the other layouts (``verify(store)`` compares
            their files with it).
    """

    def __init__(self, directory: str | os.PathLike[str], *, plan: RowPlan | None = None,
                 store: Any = None) -> None:
        self.root = os.path.abspath(os.fspath(directory))
        self.index = read_index(os.path.join(self.root, INDEX_FILE))
        self.plan: Any = _open_copy(self.root, self.index) if plan is None else plan
        #: The plan the folder holds, opened (what verify() re-hashes); None when another was given (a shard's).
        self._folder_plan: Any = self.plan if plan is None else None
        if self.index["plan_fingerprint"] not in (self.plan.fingerprint, self.plan.source_fingerprint):
            raise file_error(f"{self.root} was written for plan {self.index['plan_fingerprint']}, not "
                             f"{self.plan.fingerprint}")  # a shard of the folder's plan names it as its source
        self.pad_id = self.index["pad_id"]
        self.layout = Layout.from_index(self.index, os.path.join(self.root, INDEX_FILE))
        try:
            self.fingerprint = BatchFingerprint.from_json(self.index["batch_fingerprint"])
        except UmlosError as exc:
            raise file_error(f"{INDEX_FILE} in {self.root}: its batch_fingerprint is malformed "
                             f"({exc.message})") from None
        self._digests: dict[tuple[int, int], str] = {}
        for row in self.index["epochs"]:
            self._digests.update(((row["epoch"], i), d) for i, d in zip(row["indices"], row["digests"]))
        positions = self.fingerprint.positions or ()
        if len(positions) != len(self.fingerprint.digests) or \
                any(self._digests.get((epoch, index)) != d
                    for (epoch, index), d in zip(positions, self.fingerprint.digests)):
            raise file_error(f"{INDEX_FILE} in {self.root}: its batch fingerprint disagrees with its file digests")
        #: ``(rank, world_size)`` of a reader of one rank's files (:meth:`shard`); None: every file.
        self._ranks: tuple[int, int] | None = None
        self.source = None
        if not self.layout.has_files:
            if store is None:
                raise UmlosError(errors.BATCH_STORE_MISMATCH, f"{self.root} is an index-only batch folder: it holds "
                                 "no batch files, and its microbatches are collated from the token store they were "
                                 "made from; give the store (store=..., --source)", operator=errors.BATCHING_OPERATOR)
            self.source = self._open_source(store)

    def __repr__(self) -> str:
        return f"BatchReader({self.root!r}, {len(self)} microbatches, {self.plan.num_epochs} epochs)"

    def __len__(self) -> int:
        return sum(len(self._indices(epoch)) for epoch in range(self.num_epochs))

    @property
    def num_epochs(self) -> int:
        return self.plan.num_epochs

    @property
    def plan_fingerprint(self) -> str:
        return self.index["plan_fingerprint"]

    def path(self, epoch: int, index: int) -> str:
        return os.path.join(self.root, self.layout.file_name(epoch, index))

    # ------------------------------------------------------------------ reading
    def load(self, epoch: int, index: int) -> dict[str, np.ndarray]:
        """Global microbatch ``index`` of ``epoch`` (random access)."""
        self._check_held(epoch, index)
        if self.source is not None:
            return self._collate(epoch, index)
        path = self.path(epoch, index)
        members = self.layout.read(path)
        if any(members[name].shape != () or members[name].dtype.kind not in "iu" for name in ("epoch", "index")) \
                or (int(members["epoch"]), int(members["index"])) != (int(epoch), int(index)):
            raise file_error(f"{path} holds epoch {members['epoch']} microbatch {members['index']}, "
                             f"not epoch {epoch} microbatch {index}")
        if self.layout.name == "npz":
            return members
        return self.layout.arrays(members, epoch, self.plan.microbatch_at(epoch, index), self.plan_fingerprint,
                                  self.pad_id, path)

    def _collate(self, epoch: int, index: int) -> dict[str, np.ndarray]:
        """An index-only folder's microbatch: collated from the store, checked against its recorded digest."""

        microbatch = self.plan.microbatch_at(epoch, index)
        batch = collate_microbatch(self.source, microbatch, pad_id=self.pad_id,
                                   separator_ids=self.index.get("separator_ids") or ())
        digest = microbatch_digest(batch.input_ids, batch.loss_mask)
        recorded = self._digests.get((epoch, index))
        if digest != recorded:
            raise file_error(f"{source_name(self.source)} collates epoch {epoch} microbatch {index} to {digest}; "
                             f"{INDEX_FILE} in {self.root} records {recorded}")
        arrays: dict[str, np.ndarray] = batch.as_dict()
        arrays.update(plan_members(epoch, microbatch, self.plan_fingerprint, digest))
        return arrays

    def __getitem__(self, key: tuple[int, int]) -> dict[str, np.ndarray]:
        epoch, index = key
        return self.load(epoch, index)

    def iter_epoch(self, epoch: int) -> Iterator[dict[str, np.ndarray]]:
        """The microbatches of ``epoch`` in order (this rank's, for a shard)."""
        for index in self._indices(epoch):
            yield self.load(epoch, index)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for epoch in range(self.num_epochs):
            yield from self.iter_epoch(epoch)

    def shard(self, rank: int, world_size: int) -> BatchReader:
        """A reader of rank ``rank``'s files: global microbatch ``i`` of each
        epoch goes to rank ``i % world_size`` (every plan's sharding)."""
        rank_share(range(0), rank, world_size)  # INVALID_RANK before anything is opened
        reader = BatchReader(self.root, plan=self.plan, store=self.source)
        reader._folder_plan, reader._ranks = self._folder_plan, (rank, world_size)
        return reader

    def _indices(self, epoch: int) -> Sequence[int]:
        """The global indices of ``epoch``'s microbatches this reader reads, in order (PLAN_CURSOR_INVALID for an
        epoch the plan does not have)."""
        held = self.plan.epoch_indices(epoch)
        return held if self._ranks is None else rank_share(held, *self._ranks)

    def _check_held(self, epoch: int, index: int) -> None:
        """PLAN_CURSOR_INVALID unless microbatch ``index`` of ``epoch`` is one this reader reads."""
        indices = self._indices(epoch)
        if not checks.is_integer(index) or index not in indices:
            shard = self._ranks is not None or len(indices) != self.plan.epoch_microbatches(epoch)
            raise plan_error(errors.PLAN_CURSOR_INVALID, f"microbatch {index!r} is not one of epoch {epoch} "
                             f"of this {'shard' if shard else 'plan'}")

    def _open_source(self, store: Any) -> Any:
        """The token source of the plan's rows from ``store``, checked against the plan and, where batches.json
        records them (format 3), against the sources the files were collated from (provenance.py)."""
        pieces = open_row_parts(self.plan, store)
        if "sources" in self.index:
            check_sources(self.index["sources"], self.plan, pieces, self.root)
        return join_parts(pieces)

    def content_fingerprint(self, n_batches: int = DEFAULT_N_BATCHES) -> BatchFingerprint:
        """The batch fingerprint of the first ``n_batches`` microbatches of the files, in training
        order, hashed from the arrays the files decode to (never from the digests they or
        batches.json record): what `batch verify --batches` compares with an expected fingerprint,
        so that files edited together with their recorded digests still differ from it."""
        order = ((epoch, index) for epoch in range(self.num_epochs) for index in self._indices(epoch))
        positions = list(islice(order, n_batches))
        return batch_fingerprint((self.load(e, i) for e, i in positions), n_batches, positions=positions,
                                 plan_fingerprint=self.plan_fingerprint)

    # ------------------------------------------------------------------ checks
    def verify(self, store: Any = None, *, progress: Callable[[int, int], None] | None = None,
               digests: bool = True) -> dict:
        """Check every file of the plan (of the shard): it loads, it is its
        plan microbatch's (epoch, index, rows, ids, bucket, pad length), its
        arrays are consistent, its digest is the one ``batches.json``
        records; with ``store`` (the token source; a mixed plan's, one per component), its bytes are exactly
        those a fresh collation gives, and each component's source is the one the files were collated from
        (BATCH_STORE_MISMATCH naming it). BATCH_FILE_INVALID names the first
        file that fails. First, unless ``digests=False``, the folder's plan
        and the token source are re-hashed against their recorded digests
        (a plan changed after the files were written is named as such, not
        as a file that disagrees with it). An index-only folder has no files:
        every microbatch is collated from ``store`` (or the reader's own) and
        must hash to its recorded digest."""

        if digests:
            copy = os.path.join(self.root, PLAN_FOLDER)
            if self._folder_plan is None:
                open_row_plan(copy, "batch check", verify=True)  # the copy reopened: its kind hashes it
            else:
                kind = plan_kind_of(copy)
                if kind.digests is not None:
                    kind.digests(self._folder_plan, copy)
        source = None
        if store is None and self.source is not None:
            store = self.source
        if store is not None:
            source = self._open_source(store)
            if digests:
                verify_source(source)
        collating = None  # an index-only folder: the reader that collates from the store given here
        if not self.layout.has_files:
            collating = self if source is self.source else self._with_source(source)
        total, done = len(self), 0
        for epoch in range(self.num_epochs):
            for index in self._indices(epoch):
                if collating is not None:
                    collating._collate(epoch, index)
                    done += 1
                    if progress is not None:
                        progress(done, total)
                    continue
                microbatch = self.plan.microbatch_at(epoch, index)
                path = self.path(epoch, index)
                members = self.layout.read(path)
                self.layout.check(path, members, epoch, microbatch, self.plan_fingerprint,
                                  self._digests.get((epoch, index)), self.pad_id)
                if source is not None:
                    batch = collate_microbatch(source, microbatch, pad_id=self.pad_id,
                                               separator_ids=self.index.get("separator_ids") or ())
                    fresh, _ = self.layout.plain_bytes(epoch, microbatch, batch, self.plan_fingerprint, self.pad_id)
                    if not self.layout.same_content(path, fresh):
                        raise file_error(f"{path} differs from what the token store collates for epoch {epoch} "
                                         f"microbatch {index}")
                done += 1
                if progress is not None:
                    progress(done, total)
        return {"files": done, "plan_fingerprint": self.plan_fingerprint,
                "batch_fingerprint": self.fingerprint.fingerprint, "against_store": source is not None}

    def _with_source(self, source: Any) -> BatchReader:
        """This reader (its plan, its share) over another token source, opened and checked."""
        reader = BatchReader(self.root, plan=self.plan, store=source)
        reader._folder_plan, reader._ranks = self._folder_plan, self._ranks
        return reader


def _open_copy(root: str, index: dict) -> Any:
    """The plan copy in ``root/plan``, opened through its kind (which reopens what it does not hold, a windowed
    plan's lengths, from where it records them), which must be the kind batches.json names (BATCH_FILE_INVALID)."""
    copy = os.path.join(root, PLAN_FOLDER)
    named = index.get("plan_kind", IMPLIED_KIND)
    kind = plan_kind_of(copy)
    if kind.name != named:
        raise file_error(f"{copy} is a {kind.name}; {INDEX_FILE} in {root} was written for a {named}")
    return open_row_plan(copy, "BatchReader")


def read_index(path: str, *, require_complete: bool = True) -> dict:
    """batches.json: BATCH_FILES_NOT_FOUND when missing or unfinished, BATCH_FILE_INVALID when malformed."""
    folder = os.path.dirname(path)
    try:
        data = reader.read_json(path, file_error)
    except FileNotFoundError:
        raise _not_found(f"no batch files at {folder}: {path} does not exist (write them with "
                         "`umlos-cuda batch generate`)") from None
    not_index = checks.literal(f"{path} is not a batch folder index (format {FILES_FORMAT!r})")
    checks.instance(data, "index", dict, fail=file_error, message=not_index)
    if data.get("format") not in (FILES_FORMAT_V2, FILES_FORMAT_V3):
        checks.equal(data.get("format"), "format", FILES_FORMAT, fail=file_error, message=not_index)
    Layout.from_index(data, path)
    _check_identity(data, path)
    if data["format"] == FILES_FORMAT_V3:
        check_record(data, path)
    if require_complete:
        if data.get("complete") is not True:
            raise _not_found(f"the batch files in {folder} are unfinished: writing stopped before the end (run "
                             "`umlos-cuda batch generate` again with the same arguments to finish)")
        unfinished = f"{path} lacks the per-epoch digests or the batch fingerprint of a finished folder"
        if not all(_is_epoch_row(e) for e in checks.instance(data.get("epochs"), "epochs", list, fail=file_error,
                                                              message=checks.literal(unfinished))):
            raise file_error(unfinished)
        checks.instance(data.get("batch_fingerprint"), "batch_fingerprint", dict, fail=file_error,
                        message=checks.literal(unfinished))
    return data


def _check_identity(data: dict, path: str) -> None:
    """The types of what the writer compares on resume and the reader uses (pad_id, separator_ids)."""
    def fail(message: str) -> UmlosError:
        return file_error(f"{path}: {message}")

    recorded = ("plan_fingerprint",) if data.get("format") == FILES_FORMAT_V3 else \
        ("plan_fingerprint", "tokenizer_hash", "lengths_sha256")  # format 3 records them per source
    for name in recorded:
        checks.text(data.get(name), name, fail=fail, message="{name} must be a string, got {type}")
    checks.integer(data.get("pad_id"), "pad_id", None, None, strict=True, fail=fail,
                   message="{name} must be an integer, got {type}")
    separators = data.get("separator_ids")
    if separators is not None:
        wrong = "{name} must be a list of integers"
        for token in checks.instance(separators, "separator_ids", list, fail=fail, message=wrong):
            checks.integer(token, "separator_ids", None, None, strict=True, fail=fail, message=wrong)


def _is_epoch_row(row) -> bool:
    """A finished epoch's row: its number and one digest (text) per batch index (an integer); more keys may follow."""
    if not isinstance(row, dict) or not {"epoch", "indices", "digests"} <= set(row):
        return False
    indices, digests = row["indices"], row["digests"]
    return checks.is_integer(row["epoch"], strict=True) and isinstance(indices, list) and isinstance(digests, list) \
        and len(indices) == len(digests) and all(checks.is_integer(i, strict=True) for i in indices) \
        and all(isinstance(d, str) for d in digests)


def _not_found(message: str) -> UmlosError:
    return UmlosError(errors.BATCH_FILES_NOT_FOUND, message, operator=errors.BATCHING_OPERATOR)
