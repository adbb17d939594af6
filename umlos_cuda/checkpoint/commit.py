"""The checkpoint store's writer: the run-commit protocol and recovery (docs/checkpoint-format.md §9).

A store (layout and certificates: :mod:`.store`) holds one run's trace tape,
checkpoints, lineage and signed commit certificates. Before commit ``n``
(:meth:`CheckpointStore.commit`) touches anything, the state is checked as a
reader would check it (bounds, content, bindings: ``ContainerBuilder.validate``);
state no reader could restore is refused with ``CHECKPOINT_STATE_INVALID``
and the session stays usable. Then:

1. write the temp objects: the tape's new segments ``trace/segment=<k>.tape.tmp``,
   the container ``checkpoints/commit=<n>.tmp/``, ``lineage/commit=<n>.cbor.tmp``
   (every file fsynced);
2. compute ``trace_tail_hash``, ``checkpoint_merkle_root``, ``lineage_root_hash``;
3. build the certificate bound to those hashes (and to the checkpoint hash, the
   segment files' digests and the previous certificate), sign it with Ed25519,
   write ``commits/commit=<n>.cbor.tmp``;
4. rename the segments, the container and the lineage record to their final
   names, fsyncing each folder, and **last** the certificate: that rename is
   the commit point, and the certificate is the ``run_commit`` record.

Recovery (run by every writer when it opens a store, under the lock): the
committed state is exactly what the valid certificates ``1..M`` bind. If the
latest certificate and all objects it binds are present, the commit is final
(a certificate is renamed last, so its presence implies its objects'). Every
other object with a store name (temp objects, finals of commit ``M+1`` renamed
before the crash, segments past the committed tape) is removed, in sorted
order, and the writer's tape starts with a ``failure`` record
(``CHECKPOINT_COMMIT_ROLLED_BACK``) that lists them. Files with names the store
does not use are never removed; verification reports them. Recovery refuses a
store whose folders are not real directories and removes objects through
directory descriptors, never following a link.

A clean close (:meth:`CheckpointStore.close`, the end of a ``with`` block)
removes the session's uncommitted tape segments, so the store verifies;
records appended after the last commit are dropped. Only a writer that dies
(or :meth:`CheckpointStore.abandon`) leaves temp objects for recovery.
Verification and restore through a store are :mod:`.store_readers`.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from .. import checks, errors
from ..errors import MAX_WORLD_SIZE
from ..hashing import cbor_canonical, sha256
from . import atomic, paths, retention, schema, signing
from .anchor import check_anchor
from .codes import COMMIT, error
from .container import NO_TRACE, ContainerBuilder, TraceLink
from .lock import LOCK_NAME, StoreLock
from .restore import RestoredCheckpoint
from .state import CheckpointState, RunIdentity
from .store import (  # re-exported: the store's layout and certificates, as readers see them
    MANAGED_DIRS,
    MARKER_NAME,
    MAX_CERTIFICATE_BYTES,
    STORE_FORMAT,
    CommitRecord,
    bound_paths,
    certificate_path,
    check_certificate_body,
    check_layout,
    checkpoint_dir,
    is_store,
    lineage_path,
    list_folder,
    open_store,
    read_commits,
    read_marker,
    store_leftovers,
    tape_state_of,
)
from .store_readers import check_bound, restore_checked, restore_committed, restore_latest, verify_store
from .tape import Segment, TapeWriter, is_text, run_end_fields, run_header_fields


def _make_store_folder(path: str) -> None:
    """Create the store's folder (not its parent: a mistyped path should fail)."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise error(errors.CHECKPOINT_NOT_FOUND, f"{parent} does not exist", operator=COMMIT)
    try:
        os.mkdir(path)
    except FileExistsError:
        pass
    except OSError as exc:
        raise error(errors.CHECKPOINT_IO_ERROR, f"cannot create {path}: {exc.strerror}", operator=COMMIT) from None


def _check_latest_present(store_dir: str, commits: list[CommitRecord]) -> None:
    if not commits:
        return
    latest = commits[-1]
    root = paths.open_root(store_dir)
    try:
        for relpath in sorted(bound_paths([latest])):
            try:
                os.stat(relpath, dir_fd=root, follow_symlinks=False)
            except FileNotFoundError:
                raise error(errors.CHECKPOINT_COMMIT_MISMATCH,
                            f"commit {latest.seq} binds {relpath}, which is missing", operator=COMMIT) from None
    finally:
        os.close(root)


# -- the writer ------------------------------------------------------------------------


@dataclass
class RecoveryReport:
    """What opening a store found: the committed commit and what was rolled back."""

    committed_seq: int
    rolled_back: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


def recover(store_dir: str, marker: Mapping[str, Any]) -> tuple[list[CommitRecord], RecoveryReport]:
    """Recovery (docs/checkpoint-format.md §9.4); the caller holds the lock. See the module docstring."""
    check_layout(store_dir)
    commits = read_commits(store_dir, marker)
    _check_latest_present(store_dir, commits)
    uncommitted, unknown = store_leftovers(store_dir, commits)
    remove_objects(store_dir, uncommitted)
    return commits, RecoveryReport(len(commits), uncommitted, unknown)


def remove_objects(store_dir: str, relpaths: list[str]) -> None:
    """Remove store objects (``folder/name`` or a top-level name), in order,
    through directory descriptors opened without following links, then fsync
    their folders. The caller holds the lock and checked the layout."""
    if not relpaths:
        return
    root = paths.open_root(store_dir)
    folders: dict[str, int] = {"": root}
    try:
        for relpath in relpaths:
            folder, _, name = relpath.rpartition("/")
            if folder not in folders:
                try:
                    folders[folder] = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=root)
                except OSError as exc:
                    code = errors.CHECKPOINT_UNEXPECTED_FILE if exc.errno == errno.ELOOP else errors.CHECKPOINT_IO_ERROR
                    raise error(code, f"cannot open {store_dir}/{folder} without following links: {exc.strerror}",
                                operator=COMMIT) from None
            atomic.crash_point("recover_remove")
            atomic.remove_in(folders[folder], name, f"{store_dir}/{relpath}")
        for fd in folders.values():
            os.fsync(fd)
    except OSError as exc:
        raise error(errors.CHECKPOINT_IO_ERROR, f"cannot fsync a folder of {store_dir}: {exc.strerror}",
                    operator=COMMIT) from None
    finally:
        for fd in folders.values():
            os.close(fd)


class CheckpointStore:
    """One writer session on a store: the tape, commits, restore.

    Open with :meth:`open`; it takes the lock, creates the store if needed,
    runs recovery and continues the committed tape. Close with :meth:`close`
    (or a ``with`` block): it drops the records appended after the last
    commit (so commit before closing) and leaves a store that verifies.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        identity: RunIdentity,
        signing_key: Any,
        *,
        block_size: int | None = None,
        max_events: int | None = None,
        lock_timeout: float = 0.0,
        keep_last: int | None = None,
    ) -> None:
        """Open the store at ``path`` as its one writer: take its lock (waiting
        up to ``lock_timeout`` seconds), create the store if needed, run
        recovery and continue the committed tape. ``block_size``/``max_events``:
        the tape's records per block and per segment. ``keep_last``: after
        each commit, keep the newest ``keep_last`` checkpoints and collect the
        older containers (:mod:`.retention`). :meth:`open` is the same call."""
        self.keep_last = None if keep_last is None else retention.check_keep_last(keep_last)
        self.path = os.path.abspath(os.fspath(path))
        self.identity = identity
        self._key = signing.load_private_key(signing_key)
        self.public_key = signing.public_key_bytes(self._key)
        self._broken = False
        self._closed = False
        _make_store_folder(self.path)
        self._lock = StoreLock(self.path).acquire(lock_timeout)
        try:
            self._open_locked(block_size, max_events)
        except BaseException:
            self._lock.release()
            raise

    @classmethod
    def open(cls, path: str | os.PathLike[str], identity: RunIdentity, signing_key: Any,
             **options: Any) -> CheckpointStore:
        """``CheckpointStore(path, identity, signing_key, **options)``: see the constructor."""
        return cls(path, identity, signing_key, **options)

    def _open_locked(self, block_size: int | None, max_events: int | None) -> None:
        check_layout(self.path)  # before anything is listed, created or removed
        marker_path = os.path.join(self.path, MARKER_NAME)
        if not os.path.lexists(marker_path):
            atomic.remove(marker_path + ".tmp")
            stray = [name for folder in MANAGED_DIRS for name in list_folder(os.path.join(self.path, folder))]
            if stray:
                raise error(errors.CHECKPOINT_SCHEMA_INVALID,
                            f"{self.path} holds store objects but no {MARKER_NAME}", operator=COMMIT)
            marker: dict[str, Any] = {"format": STORE_FORMAT, "tenant_id": self.identity.tenant_id,
                                      "run_id": self.identity.run_id, "public_key": self.public_key}
            atomic.write_file_atomic(marker_path, cbor_canonical(marker))
        marker = read_marker(self.path)
        if marker["public_key"] != self.public_key:
            raise error(errors.CHECKPOINT_SIGNATURE_INVALID,
                        f"the store is bound to key {marker['public_key'].hex()}; this writer has "
                        f"{self.public_key.hex()}",
                        operator=COMMIT)
        if (marker["tenant_id"], marker["run_id"]) != (self.identity.tenant_id, self.identity.run_id):
            raise error(errors.CHECKPOINT_IDENTITY_MISMATCH,
                        f"the store belongs to tenant {marker['tenant_id']!r}, run {marker['run_id']!r}",
                        operator=COMMIT)
        self.marker = marker
        for folder in MANAGED_DIRS:
            atomic.ensure_dir(os.path.join(self.path, folder))
        self.commits, self.recovery = recover(self.path, marker)
        options = {}
        if block_size is not None:
            options["block_size"] = block_size
        if max_events is not None:
            options["max_events"] = max_events
        self.tape = TapeWriter(self.path, tape_state_of(self.commits), **options)
        self._pending_failure = None
        if self.recovery.rolled_back:
            latest = self.commits[-1] if self.commits else None
            self._pending_failure = {
                "type": "failure",
                "t": latest.t if latest else None,
                "failure_code": errors.CHECKPOINT_COMMIT_ROLLED_BACK,
                "failure_operator": COMMIT,
                "dataset_key": None,
                "data_replay_t": None,
                "replay_token": self.identity.token,
                "rng_fingerprint_t": None,
                "state_fp_t": None,
                "diagnostics": {
                    "message": f"rolled back {len(self.recovery.rolled_back)} uncommitted object(s) "
                               f"after commit {self.recovery.committed_seq}",
                    "objects": ", ".join(self.recovery.rolled_back)[:1000],
                },
            }
            if self.tape.event_count:
                self._append_pending_failure()

    def _append_pending_failure(self) -> None:
        """The rollback's failure record goes on the tape as soon as the tape
        has its run_header (right away, or just after :meth:`start_run`)."""
        if self._pending_failure is not None:
            record, self._pending_failure = self._pending_failure, None
            self.tape.append(record)

    # -- state ---------------------------------------------------------------------
    @property
    def latest(self) -> CommitRecord | None:
        return self.commits[-1] if self.commits else None

    @property
    def latest_checkpoint(self) -> CommitRecord | None:
        for record in reversed(self.commits):
            if record.checkpoint:
                return record
        return None

    def _usable(self) -> None:
        if self._closed:
            raise error(errors.CHECKPOINT_STATE_INVALID, "the store session is closed", operator=COMMIT)
        if self._broken:
            raise error(errors.CHECKPOINT_STATE_INVALID,
                        "a commit failed in this session; reopen the store (recovery rolls it back)", operator=COMMIT)

    # -- tape helpers --------------------------------------------------------------
    def start_run(self, dataset_key: str, *, world_size: int, task_type: str = "data_loading",
                  source_hash: bytes | None = None, shuffled_per_stage: Mapping[str, bool] | None = None) -> bytes:
        """Append the ``run_header`` (the store's tape must be empty); return its hash.

        Any subsystem starts its run here: ``dataset_key`` is the manifest's
        dataset the run reads, ``task_type`` what the run does, and
        ``shuffled_per_stage`` which stages read a shuffled order
        (:func:`tape.run_header_fields`). The header binds the store's
        identity (tenant, run, manifest, replay token, backend)."""
        manifest = self.identity.manifest
        if dataset_key not in manifest.datasets:
            raise error(errors.CHECKPOINT_STATE_INVALID,
                        f"dataset_key {dataset_key!r} is not in the manifest (datasets: "
                        f"{', '.join(map(repr, manifest.datasets))})", operator=COMMIT)
        world_size = _checked_world_size(world_size)
        digest = self.tape.append(run_header_fields(
            tenant_id=self.identity.tenant_id, run_id=self.identity.run_id, manifest=manifest,
            replay_token=self.identity.token, backend_hash=self.identity.backend_binary_hash,
            dataset_key=dataset_key, world_size=world_size, task_type=task_type, source_hash=source_hash,
            shuffled_per_stage=shuffled_per_stage,
        ))
        self._append_pending_failure()
        return digest

    def end_run(self, *, status: str, final_epoch_count: int, total_samples_seen: int, restore_status: str,
                final_cursors: Mapping[str, Mapping[str, int]], checkpoint_hash: bytes | None = None,
                task_type: str | None = None, world_size: int | None = None,
                with_backend_hash: bool = False) -> bytes:
        """Append the ``run_end`` record (:func:`tape.run_end_fields`); return its hash.

        The v3.8 kernel's trace puts the run's ``task_type``, ``world_size`` and
        ``backend_hash`` on ``run_end``: each is written when given
        (``with_backend_hash=True`` writes the store identity's backend hash),
        so a run that gives none writes the record it always wrote. A
        ``task_type`` that is not text of 1 to 1024 characters or a
        ``world_size`` outside ``[1, 2^32 - 1]`` is ``CHECKPOINT_STATE_INVALID``."""
        if task_type is not None and not is_text(task_type):
            raise error(errors.CHECKPOINT_STATE_INVALID,
                        f"task_type must be text of 1 to 1024 characters, got {task_type!r}", operator=COMMIT)
        if world_size is not None:
            world_size = _checked_world_size(world_size)
        checks.instance(with_backend_hash, "with_backend_hash", bool,
                        fail=partial(error, errors.CHECKPOINT_STATE_INVALID, operator=COMMIT),
                        message="{name} must be True or False, got {value!r}")
        return self.tape.append(run_end_fields(
            status=status, final_epoch_count=final_epoch_count, total_samples_seen=total_samples_seen,
            restore_status=restore_status, final_cursors=final_cursors, checkpoint_hash=checkpoint_hash,
            task_type=task_type, world_size=world_size,
            backend_hash=self.identity.backend_binary_hash if with_backend_hash else None,
        ))

    # -- commit --------------------------------------------------------------------
    def commit(self, state: CheckpointState | None = None, *, schema_version: str | None = None,
               restore_profiles: Iterable[str] | None = None) -> CommitRecord:
        """Commit the tape so far and, if ``state`` is given, a checkpoint of it
        (module docstring, steps 1-4). Returns the new commit's record, whose
        ``head`` is the hash to keep elsewhere (``expect_head``).

        State a reader would refuse (bounds of docs/checkpoint-format.md §11,
        invalid names, cursors past a dataset, ``t`` before the last commit)
        is refused with ``CHECKPOINT_STATE_INVALID`` before anything is
        written; the session stays usable. Any later failure breaks the
        session (reopen the store: recovery rolls the commit back)."""
        self._usable()
        if self.tape.event_count == 0:
            raise error(errors.CHECKPOINT_STATE_INVALID, "start the run (start_run) before the first commit",
                        operator=COMMIT)
        builder = self._checked_builder(state, schema_version, restore_profiles)
        try:
            record = self._commit(state, builder)
        except BaseException:
            self._broken = True
            raise
        if self.keep_last is not None:  # after the commit point: the commit stands whatever happens here
            retention.collect_locked(self.path, self.commits, self.keep_last)
        return record

    def _checked_builder(self, state, schema_version, restore_profiles) -> ContainerBuilder | None:
        """The container of ``state``, checked as a reader would check it
        (its trace link follows once the tape is sealed)."""
        if state is None:
            return None
        builder = ContainerBuilder(self.identity, state, trace_link=NO_TRACE, schema_version=schema_version,
                                   restore_profiles=restore_profiles)
        last_t = self.latest.t if self.latest else 0
        if state.t < last_t:
            raise error(errors.CHECKPOINT_STATE_INVALID, f"t = {state.t} is before the last commit's t = {last_t}",
                        operator=COMMIT)
        builder.validate()
        return builder

    def _commit(self, state: CheckpointState | None, builder: ContainerBuilder | None) -> CommitRecord:
        """Steps 1-4 of the module docstring. Each step ends at a crash point
        (its label names what is on disk by then), where the crash tests stop
        the writer with SIGKILL."""
        seq = len(self.commits) + 1
        t = state.t if state is not None else (self.latest.t if self.latest else 0)
        atomic.crash_point("commit_begin")
        if state is not None and not self.tape.ended:
            self.tape.append({"type": "checkpoint", "t": state.t, "commit_seq": seq})
        # 1. temp objects, and 2. the three hashes: trace tail, Merkle root, lineage root
        segments = self._seal_tape(builder)
        lineage = self._lineage_record(seq, t, builder)
        checkpoint = self._write_container(seq, builder, sha256(lineage))
        self._write_temp(lineage_path(seq), lineage, "lineage_written")
        # 3. the certificate bound to them
        body = self._certificate_body(seq, t, segments, checkpoint, sha256(lineage))
        certificate = cbor_canonical(signing.sign_certificate(signing.RUN_COMMIT_DOMAIN, body, self._key))
        self._write_temp(certificate_path(seq), certificate, None)
        for folder in MANAGED_DIRS:
            atomic.fsync_dir(os.path.join(self.path, folder))
        atomic.crash_point("certificate_written")
        # 4. renames; the certificate's is the commit point
        self._rename_into_place(seq, segments, checkpoint is not None)
        self.tape.committed()
        record = CommitRecord(seq, t, body, sha256(certificate), self.public_key)
        self.commits.append(record)
        return record

    def _seal_tape(self, builder: ContainerBuilder | None) -> list[Segment]:
        """Close the tape's segments written since the last commit (fsynced
        ``.tmp`` files) and give the checkpoint its link to the tape."""
        segments = self.tape.seal()
        atomic.crash_point("tape_sealed")
        if builder is not None:
            every = self.tape.state.segments + segments
            builder.set_trace_link(TraceLink(self.tape.root_hash, self.tape.tail_hash, self.tape.event_count,
                                             tuple(s.link_dict() for s in every)))
        return segments

    def _lineage_record(self, seq: int, t: int, builder: ContainerBuilder | None) -> bytes:
        """The lineage record of commit ``seq`` (docs/checkpoint-format.md §9.3), encoded."""
        return cbor_canonical({
            "kind": "lineage",
            "seq": seq,
            "tenant_id": self.identity.tenant_id,
            "run_id": self.identity.run_id,
            "t": t,
            "prev_lineage_root_hash": self.latest.lineage_root_hash if self.latest else schema.ZERO_HASH,
            "manifest_hash": self.identity.manifest.hash,
            "dataset_snapshot_id": self.identity.dataset_snapshot_id,
            "trace_tail_hash": self.tape.tail_hash,
            "checkpoint_merkle_root": builder.merkle_root if builder else None,
        })

    def _write_container(self, seq: int, builder: ContainerBuilder | None, lineage_root: bytes) -> dict | None:
        """Finish the header (lineage root, previous checkpoint) and write the
        container as ``checkpoints/commit=<seq>.tmp/``; return the
        certificate's ``checkpoint`` field (None without a checkpoint)."""
        body = None
        if builder is not None:
            previous = self.latest_checkpoint
            checkpoint_hash = builder.finish(lineage_root_hash=lineage_root,
                                             checkpoint_hash_prev=previous.checkpoint_hash if previous else None)
            temp = os.path.join(self.path, checkpoint_dir(seq)) + ".tmp"
            atomic.remove(temp)
            builder.write(temp)
            body = {"path": checkpoint_dir(seq), "checkpoint_hash": checkpoint_hash,
                    "checkpoint_merkle_root": builder.merkle_root}
        atomic.crash_point("checkpoint_written")
        return body

    def _write_temp(self, relpath: str, data: bytes, label: str | None) -> None:
        """Write ``<relpath>.tmp`` in the store (fsynced), replacing a leftover."""
        temp = os.path.join(self.path, relpath) + ".tmp"
        atomic.remove(temp)
        atomic.write_file(temp, data)
        if label is not None:
            atomic.crash_point(label)

    def _certificate_body(self, seq: int, t: int, segments: list[Segment], checkpoint: dict | None,
                          lineage_root: bytes) -> dict[str, Any]:
        """The run_commit certificate's body (§9.1): it binds the previous
        certificate, the tape, the checkpoint and the lineage record."""
        return {
            "kind": "run_commit",
            "store_format": STORE_FORMAT,
            "tenant_id": self.identity.tenant_id,
            "run_id": self.identity.run_id,
            "seq": seq,
            "t": t,
            "prev_certificate_hash": self.latest.certificate_hash if self.latest else schema.ZERO_HASH,
            "trace": {"root_hash": self.tape.root_hash, "tail_hash": self.tape.tail_hash,
                      "event_count": self.tape.event_count, "ended": self.tape.ended,
                      "segments": [s.link_dict() for s in segments]},
            "checkpoint": checkpoint,
            "lineage": {"path": lineage_path(seq), "lineage_root_hash": lineage_root},
        }

    def _rename_into_place(self, seq: int, segments: list[Segment], has_checkpoint: bool) -> None:
        """Give every temp object its final name, fsyncing each folder: the
        segments, the container, the lineage record, and last the certificate
        (the commit point)."""
        def publish(relpath: str, label: str) -> None:
            final = os.path.join(self.path, relpath)
            atomic.rename(final + ".tmp", final)
            atomic.crash_point(label)

        for segment in segments:
            publish(segment.path, "segment_renamed")
        if has_checkpoint:
            publish(checkpoint_dir(seq), "checkpoint_renamed")
        publish(lineage_path(seq), "lineage_renamed")
        publish(certificate_path(seq), "committed")

    # -- restore -------------------------------------------------------------------
    def restore_latest(self, *, profile: str = schema.FULL_PROFILE, tmmu_plan: Any = None,
                       ranks: Iterable[int] | None = None, expect_head: Any = None,
                       min_commit: int | None = None) -> RestoredCheckpoint | None:
        """Restore the latest committed checkpoint (None if there is none) with
        the checks of :func:`store_readers.restore_checked`, and append a
        ``restore`` record to the tape. ``expect_head`` / ``min_commit``
        refuse a store behind what the caller kept (``CHECKPOINT_STALE``)."""
        self._usable()
        check_anchor(self.commits, expect_head=expect_head, min_commit=min_commit)
        restored = restore_checked(self.path, self.marker, self.commits, self.identity.expected(tmmu_plan),
                                   profile=profile, ranks=ranks)
        if restored is None:
            return None
        self.tape.append({"type": "restore", "t": restored.t, "checkpoint_hash": restored.checkpoint_hash,
                          "restore_profile_id": profile,
                          "cursors": {k: c.to_dict() for k, c in restored.cursors.items()}})
        return restored

    def close(self) -> None:
        """Drop what was not committed and release the lock.

        A healthy session removes its uncommitted tape segments (the records
        appended after the last commit), so the store it leaves verifies.
        After a failed commit the temp objects stay: the next writer (or
        ``checkpoint recover``) rolls them back and records that on the tape.
        """
        if self._closed:
            return
        self._closed = True
        try:
            self.tape.abandon()
            if not self._broken:
                uncommitted, _ = store_leftovers(self.path, self.commits)
                remove_objects(self.path, uncommitted)
        finally:
            self._lock.release()

    def abandon(self) -> None:
        """Release the lock and leave every temp object in place, exactly as a
        writer that crashed would: the next writer rolls them back and writes
        a failure record. For tests and demonstrations of recovery; use
        :meth:`close` otherwise."""
        if not self._closed:
            self._closed = True
            self.tape.abandon()
            self._lock.release()

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
            return
        # Keep the block's own exception; what close could not remove, recovery will.
        with contextlib.suppress(errors.UmlosError):
            self.close()


def recover_store(store_dir: str | os.PathLike[str], lock_timeout: float = 0.0) -> RecoveryReport:
    """Run recovery without a signing key (``umlos-cuda checkpoint recover``):
    take the lock, check the certificates with the store's own key, remove
    uncommitted objects. The failure record is written by the next writer."""
    store_dir = os.fspath(store_dir)
    lock = StoreLock(store_dir)
    if not os.path.exists(os.path.join(store_dir, MARKER_NAME)):
        raise error(errors.CHECKPOINT_NOT_FOUND, f"{store_dir} is not a checkpoint store", operator=COMMIT)
    lock.acquire(lock_timeout)
    try:
        marker = read_marker(store_dir)
        _, report = recover(store_dir, marker)
        return report
    finally:
        lock.release()


__all__ = [
    "CheckpointStore", "CommitRecord", "RecoveryReport", "LOCK_NAME", "MANAGED_DIRS", "MARKER_NAME", "STORE_FORMAT",
    "MAX_CERTIFICATE_BYTES", "bound_paths", "certificate_path", "check_bound", "check_certificate_body", "check_layout",
    "checkpoint_dir", "is_store", "lineage_path", "open_store", "read_commits", "read_marker", "recover",
    "recover_store", "restore_committed", "restore_latest", "store_leftovers", "tape_state_of", "verify_store",
]


def _checked_world_size(world_size: Any) -> int:
    """A run's world size: an integer in ``[1, MAX_WORLD_SIZE]`` (else ``CHECKPOINT_STATE_INVALID``)."""
    return checks.integer(world_size, "world_size", 1, MAX_WORLD_SIZE, message=checks.OUTSIDE,
                          fail=checks.raising(errors.CHECKPOINT_STATE_INVALID, operator=COMMIT))
