"""A checkpoint store as readers see it: its folders, marker and certificates.

A store (docs/checkpoint-format.md §9) is a directory::

    store.cbor                      {format, tenant_id, run_id, public_key}
    .lock                           the writers' lock (empty)
    trace/segment=<k>.tape          committed tape segments
    checkpoints/commit=<n>/         committed containers
    lineage/commit=<n>.cbor         lineage records
    commits/commit=<n>.cbor         run-commit certificates (Ed25519)

This module reads what every reader and the writer share: the layout (the
four folders must be real directories: a link there could lead verification,
restore or recovery out of the store), the marker, the checked certificates
``1..M`` and what they bind, and the store-named objects no certificate binds
(``store_leftovers``). Writing is :mod:`.commit`; verification and restore
through a store are :mod:`.store_readers`.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from .. import checks, errors
from ..hashing import sha256
from . import cbor_safe, limits, paths, schema, signing
from .codes import COMMIT, error, exact_map
from .tape import SEGMENT_FILE_RE, SEGMENT_KEYS, Segment, TapeState, parse_segment_name

STORE_FORMAT = "UML_OS.Checkpoint.Store_v1"
MARKER_NAME = "store.cbor"
MANAGED_DIRS = ("checkpoints", "commits", "lineage", "trace")
MAX_CERTIFICATE_BYTES = limits.MAX_CERTIFICATE_BYTES

_COMMIT_FILE = re.compile(r"commit=([1-9][0-9]{0,9})\.cbor\Z")
_COMMIT_DIR = re.compile(r"commit=([1-9][0-9]{0,9})\Z")


def checkpoint_dir(seq: int) -> str:
    return f"checkpoints/commit={seq}"


def lineage_path(seq: int) -> str:
    return f"lineage/commit={seq}.cbor"


def certificate_path(seq: int) -> str:
    return f"commits/commit={seq}.cbor"


# -- the records -----------------------------------------------------------------------


@dataclass(frozen=True)
class CommitRecord:
    """One committed certificate's body, decoded and checked."""

    seq: int
    t: int
    body: dict[str, Any]
    certificate_hash: bytes
    public_key: bytes

    @property
    def checkpoint(self) -> dict[str, Any] | None:
        return self.body["checkpoint"]

    @property
    def checkpoint_hash(self) -> bytes | None:
        return self.body["checkpoint"]["checkpoint_hash"] if self.body["checkpoint"] else None

    @property
    def trace(self) -> dict[str, Any]:
        return self.body["trace"]

    @property
    def lineage_root_hash(self) -> bytes:
        return self.body["lineage"]["lineage_root_hash"]

    @property
    def head(self) -> str:
        """The commit's *head hash*: the SHA-256 of its certificate (hex), which
        chains every earlier certificate. Keep it outside the store and pass it
        back as ``expect_head`` to detect a store rolled back past it."""
        return self.certificate_hash.hex()


def _body_error(what: str, reason: str) -> errors.UmlosError:
    return error(errors.CHECKPOINT_COMMIT_MISMATCH, f"{what}: {reason}", operator=COMMIT)


def _body_map(value: Any, keys: Iterable[str], message: str, where: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A map of a run-commit body (``CHECKPOINT_COMMIT_MISMATCH``, as :func:`_body_error`)."""
    return exact_map(value, keys, message, errors.CHECKPOINT_COMMIT_MISMATCH, where=where, operator=COMMIT)


def check_certificate_body(body: Any, seq: int, marker: Mapping[str, Any], what: str) -> dict:
    """The shape of a run-commit certificate body (docs/checkpoint-format.md, "Run commit")."""
    keys = {"kind", "store_format", "tenant_id", "run_id", "seq", "t", "prev_certificate_hash",
            "trace", "checkpoint", "lineage"}
    _body_map(body, keys, f"{what}: a run_commit body has exactly {sorted(keys)}",
              where={"kind": "run_commit", "store_format": STORE_FORMAT})
    if body["seq"] != seq:
        raise _body_error(what, f"names commit {body['seq']!r}")
    if body["tenant_id"] != marker["tenant_id"] or body["run_id"] != marker["run_id"]:
        raise _body_error(what, "tenant_id or run_id differs from the store")
    schema.check_uint64(body["t"], f"{what}: t", errors.CHECKPOINT_COMMIT_MISMATCH)
    schema.check_hash(body["prev_certificate_hash"], f"{what}: prev_certificate_hash",
                      errors.CHECKPOINT_COMMIT_MISMATCH)
    trace = _body_map(body["trace"], ("root_hash", "tail_hash", "event_count", "ended", "segments"),
                      f"{what}: trace has exactly root_hash, tail_hash, event_count, ended, segments")
    for name in ("root_hash", "tail_hash"):
        schema.check_hash(trace[name], f"{what}: trace.{name}", errors.CHECKPOINT_COMMIT_MISMATCH)
    schema.check_uint64(trace["event_count"], f"{what}: trace.event_count", errors.CHECKPOINT_COMMIT_MISMATCH)
    for name, kind in (("ended", bool), ("segments", list)):
        checks.instance(trace[name], name, kind, fail=lambda message: _body_error(what, message),
                        message="trace.ended is a boolean and trace.segments a list")
    for segment in trace["segments"]:
        _body_map(segment, SEGMENT_KEYS, f"{what}: a trace segment has exactly {', '.join(SEGMENT_KEYS)}")
        parse_segment_name(segment["path"], errors.CHECKPOINT_COMMIT_MISMATCH)
        for name in ("size", "first_seq", "event_count"):
            schema.check_uint64(segment[name], f"{what}: segment {name}", errors.CHECKPOINT_COMMIT_MISMATCH)
        schema.check_hash(segment["sha256"], f"{what}: segment sha256", errors.CHECKPOINT_COMMIT_MISMATCH)
    checkpoint = body["checkpoint"]
    if checkpoint is not None:
        _body_map(checkpoint, ("path", "checkpoint_hash", "checkpoint_merkle_root"),
                  f"{what}: checkpoint has exactly path, checkpoint_hash, checkpoint_merkle_root")
        if checkpoint["path"] != checkpoint_dir(seq):
            raise _body_error(what, f"checkpoint path must be {checkpoint_dir(seq)}")
        for name in ("checkpoint_hash", "checkpoint_merkle_root"):
            schema.check_hash(checkpoint[name], f"{what}: checkpoint.{name}", errors.CHECKPOINT_COMMIT_MISMATCH)
    lineage = _body_map(body["lineage"], ("path", "lineage_root_hash"),
                        f"{what}: lineage has exactly path ({lineage_path(seq)}) and lineage_root_hash",
                        where={"path": lineage_path(seq)})
    schema.check_hash(lineage["lineage_root_hash"], f"{what}: lineage_root_hash", errors.CHECKPOINT_COMMIT_MISMATCH)
    return body


def read_marker(store_dir: str, trusted_key: bytes | None = None) -> dict[str, Any]:
    """``store.cbor``: the store's format, tenant, run and public key."""
    root = paths.open_root(store_dir)
    try:
        data = paths.read_bytes(root, MARKER_NAME, limits.MAX_MARKER_BYTES)
    except errors.UmlosError as exc:
        if exc.code == errors.CHECKPOINT_FILE_MISSING:
            raise error(errors.CHECKPOINT_NOT_FOUND,
                        f"{store_dir} is not a checkpoint store (no {MARKER_NAME})") from None
        raise
    finally:
        os.close(root)
    marker = cbor_safe.decode(data, what=MARKER_NAME, max_bytes=limits.MAX_MARKER_BYTES, max_depth=2)
    exact_map(marker, ("format", "tenant_id", "run_id", "public_key"),
              f"{MARKER_NAME} must be {{format: {STORE_FORMAT}, tenant_id, run_id, public_key}}",
              errors.CHECKPOINT_SCHEMA_INVALID, where={"format": STORE_FORMAT})
    schema.check_text(marker["tenant_id"], "store tenant_id")
    schema.check_text(marker["run_id"], "store run_id")
    checks.instance(marker["public_key"], f"{MARKER_NAME}: public_key", bytes, length=32,
                    fail=partial(error, errors.CHECKPOINT_SCHEMA_INVALID), message="{name} must be 32 bytes")
    if trusted_key is not None and marker["public_key"] != trusted_key:
        raise error(errors.CHECKPOINT_SIGNATURE_INVALID,
                    f"the store is bound to key {marker['public_key'].hex()}, not the trusted key {trusted_key.hex()}")
    return marker


def check_layout(store_dir: str) -> None:
    """Each of the four store folders that exists is a real directory, not a
    link or anything else (``CHECKPOINT_UNEXPECTED_FILE``): readers, recovery
    and the writer never follow a link out of the store."""
    root = paths.open_root(store_dir)
    try:
        for folder in MANAGED_DIRS:
            try:
                mode = os.stat(folder, dir_fd=root, follow_symlinks=False).st_mode
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise error(errors.CHECKPOINT_IO_ERROR,
                            f"cannot examine {store_dir}/{folder}: {exc.strerror}") from None
            if not stat.S_ISDIR(mode):
                kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a folder"
                raise error(errors.CHECKPOINT_UNEXPECTED_FILE,
                            f"{store_dir}/{folder} is {kind}; a store's {', '.join(MANAGED_DIRS)} must be real "
                            "directories (links are never followed)")
    finally:
        os.close(root)


def list_folder(path: str) -> list[str]:
    """The sorted names in ``path`` (none if it is absent)."""
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise error(errors.CHECKPOINT_IO_ERROR, f"cannot list {path}: {exc.strerror}") from None


def read_commits(store_dir: str, marker: Mapping[str, Any]) -> list[CommitRecord]:
    """Every committed certificate, checked: signature (by the store's key),
    body, numbering 1..M without gaps, the certificate chain and the trace
    and segment numbering across commits."""
    seqs = []
    for name in list_folder(os.path.join(store_dir, "commits")):
        match = _COMMIT_FILE.match(name)
        if match:
            seqs.append(checks.integer_text(match.group(1), "commit", 1, None,
                                            fail=partial(error, errors.CHECKPOINT_CHAIN_MISMATCH),
                                            message=checks.literal(f"{name!r} is not a commit certificate name")))
    seqs.sort()
    if seqs != list(range(1, len(seqs) + 1)):
        raise error(errors.CHECKPOINT_CHAIN_MISMATCH,
                    f"commit certificates are not numbered 1..{len(seqs)}: {seqs[:8]}")
    root = paths.open_root(store_dir)
    records: list[CommitRecord] = []
    try:
        previous_hash = schema.ZERO_HASH
        next_segment, events = 1, 0
        for seq in seqs:
            what = certificate_path(seq)
            data = paths.read_bytes(root, what, MAX_CERTIFICATE_BYTES)
            certificate = cbor_safe.decode(data, what=what, max_bytes=MAX_CERTIFICATE_BYTES, max_depth=6)
            body = signing.check_certificate(signing.RUN_COMMIT_DOMAIN, certificate, what, marker["public_key"])
            check_certificate_body(body, seq, marker, what)
            if body["prev_certificate_hash"] != previous_hash:
                raise error(errors.CHECKPOINT_CHAIN_MISMATCH,
                            f"{what}: prev_certificate_hash does not name commit {seq - 1}")
            for segment in body["trace"]["segments"]:
                if parse_segment_name(segment["path"]) != next_segment or segment["first_seq"] != events:
                    raise error(errors.CHECKPOINT_CHAIN_MISMATCH,
                                f"{what}: segment {segment['path']} does not continue the tape")
                next_segment += 1
                events += segment["event_count"]
            if body["trace"]["event_count"] != events:
                raise error(errors.CHECKPOINT_CHAIN_MISMATCH, f"{what}: trace.event_count disagrees with its segments")
            if records and body["t"] < records[-1].t:
                raise error(errors.CHECKPOINT_CHAIN_MISMATCH, f"{what}: t goes backwards")
            previous_hash = sha256(data)
            records.append(CommitRecord(seq, body["t"], body, previous_hash, certificate["public_key"]))
    finally:
        os.close(root)
    return records


def tape_state_of(commits: list[CommitRecord]) -> TapeState:
    """The committed tape as the certificates describe it."""
    if not commits:
        return TapeState()
    trace = commits[-1].trace
    segments = [
        Segment(parse_segment_name(s["path"]), s["first_seq"], s["event_count"], s["size"], s["sha256"])
        for record in commits
        for s in record.trace["segments"]
    ]
    return TapeState(trace["event_count"], trace["root_hash"], trace["tail_hash"], segments, trace["ended"])


def bound_paths(commits: list[CommitRecord]) -> set[str]:
    """Store-relative paths the certificates bind (folders for containers)."""
    bound = set()
    for record in commits:
        bound.add(certificate_path(record.seq))
        bound.add(lineage_path(record.seq))
        if record.checkpoint:
            bound.add(record.checkpoint["path"])
        for segment in record.trace["segments"]:
            bound.add(segment["path"])
    return bound


def store_leftovers(store_dir: str, commits: list[CommitRecord]) -> tuple[list[str], list[str]]:
    """``(uncommitted, unknown)``: store-named objects no certificate binds
    (what recovery removes) and names the store never uses (left alone)."""
    bound = bound_paths(commits)
    uncommitted, unknown = [], []
    patterns = {"checkpoints": _COMMIT_DIR, "commits": _COMMIT_FILE, "lineage": _COMMIT_FILE, "trace": SEGMENT_FILE_RE}
    for folder in MANAGED_DIRS:
        for name in list_folder(os.path.join(store_dir, folder)):
            relpath = f"{folder}/{name}"
            if relpath in bound:
                continue
            base = name[:-4] if name.endswith(".tmp") else name
            if patterns[folder].match(base):
                uncommitted.append(relpath)
            else:
                unknown.append(relpath)
    for name in list_folder(store_dir):
        if name == MARKER_NAME + ".tmp":
            uncommitted.append(name)
    return sorted(uncommitted), sorted(unknown)



def open_store(store_dir: str | os.PathLike[str], public_key: Any = None) -> tuple[dict, list[CommitRecord]]:
    """Read a store without locking it: its marker, layout and checked certificates."""
    store_dir = os.fspath(store_dir)
    trusted = signing.parse_public_key(public_key) if public_key is not None else None
    marker = read_marker(store_dir, trusted)
    check_layout(store_dir)
    return marker, read_commits(store_dir, marker)


def is_store(path: str) -> bool:
    return os.path.isfile(os.path.join(path, MARKER_NAME))
