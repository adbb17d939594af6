"""Checkpoint containers, the run-commit protocol and the trace tape.

The checkpoint schema contract, the trace and the cursors of NextBatch_v2,
and the tape and checkpoint contents of the v3.8 kernel;
docs/checkpoint-format.md is the normative description. The modules, one job each:

- ``limits``: every bound on checkpoint input, shared by writer and reader
- ``codes``: the package's errors, and the shape check of every map it reads
- ``cbor_safe``: strict, bounded canonical-CBOR reader for untrusted files
- ``merkle``: RFC 6962 Merkle tree over file entries
- ``paths``: the container path grammar and link-free file access
- ``atomic``: temp file, fsync, rename, fsync(directory)
- ``lock``: one writer per store
- ``signing``: Ed25519 certificates
- ``schema``: header fields, versions, identity defaults
- ``state``: ``CheckpointState`` and ``RunIdentity``
- ``tensors``: safetensors shards
- ``container``: writing, reading and verifying a container
- ``restore``: restore profiles, identity rule, chain
- ``tape``: the trace tape (and its registry of record types)
- ``extensions``: cursor kinds a subsystem registers, record types it declares
- ``plugins``: finding the installed subsystems that register them
- ``store``: a store's layout, marker and certificates as readers see them
- ``store_readers``: verifying a store and restoring through it (one validation path)
- ``anchor``: refusing a store rolled back past a head hash kept elsewhere
- ``commit``: the store's writer, run commits and crash recovery
- ``migrate``: schema migrations and their certificates

(The checkpoint part of ``umlos-cuda demo`` uses this package from
``umlos_cuda/commands/_checkpoint_demo.py``.)

Typical use::

    from umlos_cuda.checkpoint import CheckpointStore, CheckpointState, RunIdentity
    identity = RunIdentity("tenant", "run-1", manifest)
    with CheckpointStore.open("ckpt", identity, signing_key) as store:
        restored = store.restore_latest()         # None on a fresh store
        if restored is None:
            store.start_run("train", world_size=8)
        ...  # store.tape.append(iter_fields(batch, t)) per next_batch call
        record = store.commit(CheckpointState(t, {"train": cursor}, tensors={0: [params]}))
        keep_elsewhere(record.head)               # restore_latest(..., expect_head=...) later
"""

from .commit import (CheckpointStore, CommitRecord, RecoveryReport, is_store, open_store, recover_store, restore_latest,
                     verify_store)
from .container import ContainerBuilder, ContainerInfo, ContainerReader, TraceLink, save_checkpoint, verify_container
from .extensions import CursorKind, cursor_kinds, register_cursor_kind, register_record_type
from .restore import RestoredCheckpoint, restore_checkpoint
from .schema import IDENTITY_FIELDS, RESTORE_PROFILES, SCHEMA_VERSION, SUPPORTED_VERSIONS
from .state import CheckpointState, RunIdentity
from .tape import BLOCK_SIZE, MAX_EVENTS, TapeWriter, failure_fields, iter_fields, read_tape

__all__ = [
    "BLOCK_SIZE",
    "CheckpointState",
    "CheckpointStore",
    "CommitRecord",
    "ContainerBuilder",
    "ContainerInfo",
    "ContainerReader",
    "CursorKind",
    "IDENTITY_FIELDS",
    "MAX_EVENTS",
    "RESTORE_PROFILES",
    "RecoveryReport",
    "RestoredCheckpoint",
    "RunIdentity",
    "SCHEMA_VERSION",
    "SUPPORTED_VERSIONS",
    "TapeWriter",
    "TraceLink",
    "cursor_kinds",
    "failure_fields",
    "is_store",
    "iter_fields",
    "open_store",
    "read_tape",
    "recover_store",
    "register_cursor_kind",
    "register_record_type",
    "restore_checkpoint",
    "restore_latest",
    "save_checkpoint",
    "verify_container",
    "verify_store",
]
