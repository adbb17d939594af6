"""Writing and reading checkpoint containers (docs/checkpoint-format.md §2 to §5).

A container is a directory::

    checkpoint_manifest.cbor            the header, the entry list, checkpoint_hash
    tensors/rank=<r>/shard=<k>.bin      tensor shards (safetensors)
    optimizer/rank=<r>/state.bin        optimizer state per rank (safetensors)
    dp/accountant_state.cbor            DP accountant state (or "DP disabled")
    data/cursors.cbor                   {dataset_key: {epoch, global_index}} + sampler_config_hash
    data/manifest.cbor                  the canonical run manifest
    tmmu/plan.cbor                      the memory plan
    trace/link.cbor                     binds the checkpoint to the trace tape's hash chain
    artifacts/artifact_index.cbor       index of user state
    artifacts/blob=<name>.bin           user byte blobs
    artifacts/array=<name>.bin          user arrays (safetensors)
    data/cursors=<kind>.cbor            a registered cursor kind's state (schema 1.2, :mod:`.extensions`)

Every file except the manifest is an *entry* ``{path, size, sha256}``; the
manifest lists the entries in path order and the header binds their Merkle
root, so ``checkpoint_hash = SHA-256(CBOR_CANONICAL(header))`` fixes every byte
of the container. docs/checkpoint-format.md is the normative description;
this module implements it and names each rule it checks.

Writing: :class:`ContainerBuilder` builds the files in memory, then
:meth:`ContainerBuilder.write` puts them in a directory that must not exist
yet (the commit protocol writes into a temp name and renames it). Reading:
:class:`ContainerReader` checks the manifest when opened and the files on
demand; :func:`verify_container` runs every check.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from .. import checks, errors
from ..cursor import Cursor
from ..hashing import cbor_canonical, hash_canonical, sha256
from ..manifest.core import Manifest
from . import atomic, cbor_safe, extensions, limits, merkle, paths, schema, tensors
from .codes import SERIALIZE, VALIDATE, error, exact_map
from .state import CheckpointState, RunIdentity, check_user_name, dataset_snapshot_id, plain
from .tape import SEGMENT_KEYS, parse_segment_name

#: Bounds for untrusted input (one set for writer and reader: :mod:`.limits`).
MAX_MANIFEST_BYTES = limits.MAX_MANIFEST_BYTES
MAX_ENTRIES = limits.MAX_ENTRIES
MAX_SMALL_CBOR_BYTES = limits.MAX_SMALL_CBOR_BYTES
MAX_STATE_CBOR_DEPTH = limits.MAX_STATE_CBOR_DEPTH
MAX_RUN_MANIFEST_DEPTH = limits.MAX_RUN_MANIFEST_DEPTH
MAX_TRACE_SEGMENTS = limits.MAX_TRACE_SEGMENTS
#: Files up to this size are kept in memory after their hash is checked (read once).
KEEP_BYTES = 1 << 20

MANIFEST_KEYS = frozenset({"format", "header", "entries", "checkpoint_hash"})
ENTRY_KEYS = frozenset({"path", "size", "sha256"})


# -- the trace link --------------------------------------------------------------------


@dataclass(frozen=True)
class TraceLink:
    """``trace/link.cbor``: where the checkpoint sits on the trace tape's hash chain.

    ``segments`` lists the committed tape segments up to this point as
    ``{path, size, sha256, first_seq, event_count}`` (paths relative to the store).
    A checkpoint written without a tape has ``event_count = 0``, no segments and
    zero hashes.
    """

    trace_root_hash: bytes = schema.ZERO_HASH
    trace_tail_hash: bytes = schema.ZERO_HASH
    event_count: int = 0
    segments: tuple = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "trace_root_hash": self.trace_root_hash,
            "trace_tail_hash": self.trace_tail_hash,
            "event_count": self.event_count,
            "segments": [dict(s) for s in self.segments],
        }

    @classmethod
    def from_dict(cls, value: Any, what: str = paths.TRACE_LINK_PATH) -> TraceLink:
        code = errors.CHECKPOINT_CONTENT_INVALID
        keys = {"trace_root_hash", "trace_tail_hash", "event_count", "segments"}
        exact_map(value, keys, f"{what} must be a map with exactly {sorted(keys)}", code)
        root = schema.check_hash(value["trace_root_hash"], f"{what}: trace_root_hash", code)
        tail = schema.check_hash(value["trace_tail_hash"], f"{what}: trace_tail_hash", code)
        count = schema.check_uint64(value["event_count"], f"{what}: event_count", code)
        segments = checks.instance(value["segments"], what, list, max_length=MAX_TRACE_SEGMENTS,
                                   fail=partial(error, code), message="{name}: segments must be a list of at most "
                                                                      "{max_length}")
        expected_seq = 0
        for segment in segments:
            exact_map(segment, SEGMENT_KEYS, f"{what}: a segment has exactly {', '.join(SEGMENT_KEYS)}", code)
            parse_segment_name(segment["path"], code)
            schema.check_uint64(segment["size"], f"{what}: segment size", code)
            schema.check_hash(segment["sha256"], f"{what}: segment sha256", code)
            if segment["first_seq"] != expected_seq:
                raise error(code, f"{what}: segment {segment['path']} starts at event {segment['first_seq']}, "
                                  f"expected {expected_seq}")
            expected_seq += schema.check_uint64(segment["event_count"], f"{what}: segment event_count", code)
        if expected_seq != count:
            raise error(code, f"{what}: segments hold {expected_seq} events, event_count says {count}")
        if count == 0 and (root != schema.ZERO_HASH or tail != schema.ZERO_HASH):
            raise error(code, f"{what}: an empty trace has zero root and tail hashes")
        return cls(root, tail, count, tuple(segments))


NO_TRACE = TraceLink()


# -- writing ---------------------------------------------------------------------------


@dataclass
class ContainerInfo:
    """What a written or opened container is: its hash, header and entries."""

    checkpoint_hash: bytes
    header: dict[str, Any]
    entries: list[dict[str, Any]]
    manifest_bytes: bytes = field(repr=False, default=b"")

    @property
    def t(self) -> int:
        return self.header["t"]

    @property
    def merkle_root(self) -> bytes:
        return self.header["checkpoint_merkle_root"]


def _component(entries: list[dict], prefix: str) -> list[dict]:
    return [entry for entry in entries if entry["path"].startswith(prefix)]


def component_roots(entries: list[dict]) -> dict[str, bytes]:
    """The Merkle roots and component manifest hashes the header binds (§II.G binding rule)."""
    tensor_entries = _component(entries, "tensors/")
    optimizer_entries = _component(entries, "optimizer/")
    dp_entries = _component(entries, "dp/")
    return {
        "checkpoint_merkle_root": merkle.entries_root(entries),
        "tensors_root_hash": merkle.entries_root(tensor_entries),
        "weights_manifest_hash": hash_canonical(tensor_entries),
        "optimizer_state_root_hash": merkle.entries_root(optimizer_entries),
        "optimizer_manifest_hash": hash_canonical(optimizer_entries),
        "dp_accountant_state_root_hash": merkle.entries_root(dp_entries),
        "dp_accountant_manifest_hash": hash_canonical(dp_entries),
    }


def sort_key(path: str) -> bytes:
    return path.encode("utf-8")


def cursor_range_problem(key: str, cursor: Cursor, manifest: Manifest) -> str | None:
    """Why ``cursor`` cannot be a position of dataset ``key`` (None if it can).

    NextBatch_v2 only ever hands out cursors with ``global_index`` inside the
    epoch, ``[0, N - 1]`` (``0`` for an empty dataset); one past that is
    refused by next_batch, so a checkpoint holding it could never resume.
    Writer and reader share this rule.
    """
    cardinality = manifest.datasets[key].cardinality
    if cursor.global_index >= max(cardinality, 1):
        return (f"cursor {key!r} has global_index {cursor.global_index}, past the dataset's cardinality "
                f"{cardinality} (allowed: 0..{max(cardinality, 1) - 1})")
    return None


class ContainerBuilder:
    """Builds a container's files and header; see the module docstring.

    The header needs ``lineage_root_hash``, and the lineage record needs the
    Merkle root, so building is two steps: construct (files, entries, roots),
    then :meth:`finish` with the lineage root and the previous checkpoint hash.
    """

    def __init__(
        self,
        identity: RunIdentity,
        state: CheckpointState,
        *,
        trace_link: TraceLink = NO_TRACE,
        schema_version: str | None = None,
        restore_profiles: Iterable[str] | None = None,
    ) -> None:
        if not isinstance(identity, RunIdentity) or not isinstance(state, CheckpointState):
            raise error(errors.CHECKPOINT_STATE_INVALID, "expected a RunIdentity and a CheckpointState",
                        operator=SERIALIZE)
        schema_version = _schema_version(schema_version, state)
        self.identity = identity
        self.state = state
        self.schema_version = schema_version
        self.trace_link = trace_link
        schema.check_uint64(state.t, "t", errors.CHECKPOINT_STATE_INVALID)
        if restore_profiles is None:
            restore_profiles = schema.RESTORE_PROFILES
        self.restore_profiles = sorted(set(restore_profiles))
        if schema.FULL_PROFILE not in self.restore_profiles \
                or set(self.restore_profiles) - set(schema.RESTORE_PROFILES):
            raise error(
                errors.CHECKPOINT_STATE_INVALID,
                f"restore_profiles must include {schema.FULL_PROFILE} and only "
                f"{', '.join(schema.RESTORE_PROFILES)}",
                operator=SERIALIZE,
            )
        self.files = self._build_files()
        if len(self.files) > MAX_ENTRIES:
            raise error(errors.CHECKPOINT_STATE_INVALID,
                        f"the checkpoint would hold {len(self.files)} files; readers accept at most {MAX_ENTRIES} "
                        "(tensor shards, optimizer states and user_state entries together)", operator=SERIALIZE)
        #: Decoded CBOR files, shared with the in-memory reader of :meth:`validate`.
        self._decoded: dict[str, Any] = {}
        #: Whether every file's content passed the reader's checks (only the trace link changes after).
        self._content_checked = False
        self._index()

    def _index(self) -> None:
        self.entries = [
            {"path": path, "size": len(data), "sha256": sha256(data)}
            for path, data in sorted(self.files.items(), key=lambda item: sort_key(item[0]))
        ]
        self.roots = component_roots(self.entries)
        self.header: dict[str, Any] | None = None
        self.manifest_bytes: bytes | None = None
        self.checkpoint_hash: bytes | None = None

    def set_trace_link(self, trace_link: TraceLink) -> None:
        """Replace the trace link (the commit protocol knows it only after the
        state was checked); the header must be built again with :meth:`finish`."""
        self.trace_link = trace_link
        self.files[paths.TRACE_LINK_PATH] = cbor_canonical(trace_link.to_dict())
        self._decoded.pop(paths.TRACE_LINK_PATH, None)
        self._index()

    def validate(self) -> None:
        """Run the reader's checks (manifest, bounds, every file's content and
        binding) on the files as built, with a provisional header if
        :meth:`finish` has not run; refuse with ``CHECKPOINT_STATE_INVALID``.
        Nothing is written, so a writer can refuse state before it commits."""
        self._check(self._header(schema.ZERO_HASH, None))

    def _check(self, header: dict[str, Any]) -> bytes:
        """The manifest bytes of ``header``, after the reader accepted them and
        the files. Once every file's content passed, only the manifest and the
        trace link (the one file :meth:`set_trace_link` replaces) are checked again."""
        try:
            manifest_bytes = encode_manifest(header, self.entries)
            info = parse_manifest(manifest_bytes)
            with ContainerReader.in_memory(info, self.files, self._decoded) as reader:
                if self._content_checked:
                    reader.trace_link()
                else:
                    reader.check_content()
                    self._content_checked = True
        except errors.UmlosError as exc:
            if exc.code == errors.CHECKPOINT_STATE_INVALID:
                raise
            raise error(errors.CHECKPOINT_STATE_INVALID,
                        f"readers would refuse this checkpoint ({exc.code}: {exc.message}); see the bounds in "
                        "docs/checkpoint-format.md §11", operator=SERIALIZE) from None
        return manifest_bytes

    @property
    def merkle_root(self) -> bytes:
        return self.roots["checkpoint_merkle_root"]

    def _build_files(self) -> dict[str, bytes]:
        identity, state = self.identity, self.state
        files: dict[str, bytes] = {}
        cursors = state.cursor_map()
        unknown = sorted(set(cursors) - set(identity.manifest.datasets))
        if unknown:
            raise error(
                errors.CHECKPOINT_STATE_INVALID,
                f"cursor dataset key(s) {', '.join(map(repr, unknown))} are not in the manifest",
                operator=SERIALIZE,
            )
        for key, cursor in cursors.items():
            problem = cursor_range_problem(key, cursor, identity.manifest)
            if problem is not None:
                raise error(errors.CHECKPOINT_STATE_INVALID, problem, operator=SERIALIZE)
        files[paths.CURSORS_PATH] = cbor_canonical(
            {
                "data_cursors": {key: cursor.to_dict() for key, cursor in cursors.items()},
                "sampler_config_hash": identity.sampler_config_hash,
            }
        )
        files[paths.RUN_MANIFEST_PATH] = cbor_canonical(identity.manifest.canonical)
        if state.dp_accountant is None:
            files[paths.DP_PATH] = cbor_canonical({"dp_enabled": False})
        else:
            files[paths.DP_PATH] = cbor_canonical({"dp_enabled": True,
                                                   "state": plain(state.dp_accountant, "dp_accountant")})
        files[paths.TMMU_PATH] = cbor_canonical({"plan": plain(state.tmmu_plan, "tmmu_plan")})
        files[paths.TRACE_LINK_PATH] = cbor_canonical(self.trace_link.to_dict())
        for name in ("tensors", "optimizer"):
            checks.instance(getattr(state, name), name, Mapping, fail=_state_invalid,
                            message="tensors and optimizer map ranks to state")
        for rank, shards in state.tensors.items():
            rank = _rank(rank)
            checks.instance(shards, f"tensors[{rank}]", (list, tuple), fail=_state_invalid,
                            message="{name} must be a list of shards")
            for shard, arrays in enumerate(shards):
                files[paths.tensor_path(rank, shard)] = tensors.encode(arrays, f"tensors[{rank}][{shard}]")
        for rank, arrays in state.optimizer.items():
            rank = _rank(rank)
            files[paths.optimizer_path(rank)] = tensors.encode(arrays, f"optimizer[{rank}]")
        index: dict[str, Any] = {}
        folded: set[str] = set()
        checks.instance(state.user_state, "user_state", Mapping, fail=_state_invalid,
                        message="{name} maps names to bytes or arrays")
        for name, value in state.user_state.items():
            check_user_name(name)
            if name.casefold() in folded:
                raise error(errors.CHECKPOINT_STATE_INVALID, f"user state names differ only by case: {name!r}",
                            operator=SERIALIZE)
            folded.add(name.casefold())
            if isinstance(value, (bytes, bytearray, memoryview)):
                kind, data = "blob", bytes(value)
            elif isinstance(value, np.ndarray):
                kind, data = "array", tensors.encode({"value": value}, f"user_state[{name!r}]")
            else:
                raise error(
                    errors.CHECKPOINT_STATE_INVALID,
                    f"user_state[{name!r}] is a {type(value).__name__}; store bytes or a NumPy array",
                    operator=SERIALIZE,
                )
            path = paths.artifact_path(kind, name)
            files[path] = data
            index[name] = {"kind": kind, "path": path, "size": len(data), "sha256": sha256(data)}
        files[paths.ARTIFACT_INDEX_PATH] = cbor_canonical({"artifacts": index})
        for name, value in state.extra_cursors.items():
            files[paths.cursor_kind_path(name)] = encode_cursor_kind(name, value)
        return files

    def finish(self, *, lineage_root_hash: bytes = schema.ZERO_HASH,
               checkpoint_hash_prev: bytes | None = None) -> bytes:
        """Build the header and manifest, check them and the files as a reader
        would (:meth:`validate`); return ``checkpoint_hash``."""
        header = self._header(lineage_root_hash, checkpoint_hash_prev)
        self.manifest_bytes = self._check(header)
        self.header = header
        self.checkpoint_hash = hash_canonical(header)
        return self.checkpoint_hash

    def _header(self, lineage_root_hash: bytes, checkpoint_hash_prev: bytes | None) -> dict[str, Any]:
        identity, manifest = self.identity, self.identity.manifest
        schema.check_hash(lineage_root_hash, "lineage_root_hash", errors.CHECKPOINT_STATE_INVALID)
        header: dict[str, Any] = {
            "tenant_id": identity.tenant_id,
            "run_id": identity.run_id,
            "spec_version": manifest.spec_version,
            "checkpoint_schema_version": self.schema_version,
            "replay_token": identity.token,
            "t": self.state.t,
            "manifest_hash": manifest.hash,
            "trace_root_hash": self.trace_link.trace_root_hash,
            "sampler_config_hash": identity.sampler_config_hash,
            "tmmu_plan_hash": sha256(self.files[paths.TMMU_PATH]),
            "backend_binary_hash": identity.backend_binary_hash,
            "checkpoint_merkle_root": self.roots["checkpoint_merkle_root"],
            "policy_hash": manifest.policy_hash,
            "determinism_profile_hash": identity.determinism_profile_hash,
            "dependencies_lock_hash": identity.dependencies_lock_hash,
            "operator_contracts_root_hash": identity.operator_contracts_root_hash,
            "runtime_env_hash": manifest.env_manifest_hash,
            "code_commit_hash": identity.code_commit_hash,
            "lineage_root_hash": lineage_root_hash,
            "tensors_root_hash": self.roots["tensors_root_hash"],
            "optimizer_state_root_hash": self.roots["optimizer_state_root_hash"],
            "trace_tail_hash_at_checkpoint": self.trace_link.trace_tail_hash,
            "weights_manifest_hash": self.roots["weights_manifest_hash"],
            "optimizer_manifest_hash": self.roots["optimizer_manifest_hash"],
            "dataset_snapshot_id": identity.dataset_snapshot_id,
            "artifact_index_hash": sha256(self.files[paths.ARTIFACT_INDEX_PATH]),
            "migration_supported_from": list(schema.MIGRATION_SOURCES[self.schema_version]),
            "migration_operator": schema.MIGRATION_OPERATOR,
            "migration_invariants": sorted(schema.MIGRATION_INVARIANTS),
        }
        if self.state.dp_accountant is not None:
            header["dp_accountant_state_root_hash"] = self.roots["dp_accountant_state_root_hash"]
            header["dp_accountant_manifest_hash"] = self.roots["dp_accountant_manifest_hash"]
        if checkpoint_hash_prev is not None:
            header["checkpoint_hash_prev"] = schema.check_hash(
                checkpoint_hash_prev, "checkpoint_hash_prev", errors.CHECKPOINT_STATE_INVALID
            )
        if self.schema_version != "1.0":
            header["restore_profiles"] = list(self.restore_profiles)
        return header

    def write(self, directory: str) -> ContainerInfo:
        """Write the container into ``directory`` (created here; it must not exist).

        Files are written and fsynced, then the manifest, then every folder is
        fsynced. The caller makes the directory visible atomically by renaming it.
        """
        if self.manifest_bytes is None:
            self.finish()
        # finish() sets all three (or raises)
        assert self.manifest_bytes is not None and self.header is not None and self.checkpoint_hash is not None
        atomic.make_dir(directory)
        made = {""}
        for path, data in sorted(self.files.items(), key=lambda item: sort_key(item[0])):
            parts = path.split("/")
            for depth in range(1, len(parts)):
                folder = "/".join(parts[:depth])
                if folder not in made:
                    atomic.make_dir(os.path.join(directory, folder))
                    made.add(folder)
            atomic.write_file(os.path.join(directory, path), data)
            atomic.crash_point("container_file")
        atomic.write_file(os.path.join(directory, paths.MANIFEST_NAME), self.manifest_bytes)
        for folder in sorted(made, key=len, reverse=True):
            atomic.fsync_dir(os.path.join(directory, folder) if folder else directory)
        return ContainerInfo(self.checkpoint_hash, self.header, self.entries, self.manifest_bytes)


def _schema_version(requested: str | None, state: CheckpointState) -> str:
    """The version to write: the one asked for, else 1.1, or 1.2 when the
    state holds registered cursor kinds (so other checkpoints keep the bytes of 1.1)."""
    checks.instance(state.extra_cursors, "extra_cursors", Mapping, fail=_state_invalid,
                    message="{name} maps cursor kind names to their state")
    if requested is None:
        requested = schema.CURSOR_KINDS_VERSION if state.extra_cursors else schema.SCHEMA_VERSION
    schema.check_version(requested)
    if state.extra_cursors and not schema.has_cursor_kinds(requested):
        raise error(errors.CHECKPOINT_STATE_INVALID,
                    f"schema {requested} has no cursor kinds; extra_cursors need schema {schema.CURSOR_KINDS_VERSION} "
                    "or later (leave schema_version unset)", operator=SERIALIZE)
    return requested


def encode_cursor_kind(name: Any, value: Any) -> bytes:
    """``data/cursors=<name>.cbor``: ``{kind, state}`` with the state the kind's ``encode`` made of ``value``."""
    checks.text(name, "extra_cursors key", fail=_state_invalid, message="{name} {value!r} must be a cursor kind name")
    kind = extensions.cursor_kind(name, errors.CHECKPOINT_STATE_INVALID, SERIALIZE)
    try:
        encoded = kind.encode(value)
    except extensions.REFUSALS as exc:
        raise error(errors.CHECKPOINT_STATE_INVALID,
                    f"extra_cursors[{name!r}]: the kind's encode refused it ({_reason(exc)})",
                    operator=SERIALIZE) from None
    return cbor_canonical({"kind": name, "state": plain(encoded, f"extra_cursors[{name!r}]")})


_state_invalid = partial(error, errors.CHECKPOINT_STATE_INVALID, operator=SERIALIZE)


def _reason(exc: BaseException) -> str:
    return exc.message if isinstance(exc, errors.UmlosError) else f"{type(exc).__name__}: {exc}"


def _rank(rank: Any) -> int:
    return checks.integer(rank, "rank", 0, errors.UINT32_MAX,
                          fail=partial(error, errors.CHECKPOINT_STATE_INVALID, operator=SERIALIZE),
                          message="{name} {value!r} must be an integer in [0, 2^32 - 1]")


def encode_manifest(header: dict, entries: list[dict]) -> bytes:
    return cbor_canonical(
        {
            "format": schema.CONTAINER_FORMAT,
            "header": header,
            "entries": entries,
            "checkpoint_hash": hash_canonical(header),
        }
    )


def save_checkpoint(
    path: str | os.PathLike[str],
    identity: RunIdentity,
    state: CheckpointState,
    *,
    trace_link: TraceLink = NO_TRACE,
    lineage_root_hash: bytes = schema.ZERO_HASH,
    checkpoint_hash_prev: bytes | None = None,
    schema_version: str | None = None,
    restore_profiles: Iterable[str] | None = None,
) -> ContainerInfo:
    """Write one standalone container at ``path`` (which must not exist), atomically:
    the files go into ``path + ".tmp"``, which is renamed to ``path`` and the
    parent folder fsynced. For a run with a trace tape, commit certificates and
    crash recovery, use :class:`umlos_cuda.checkpoint.CheckpointStore`."""
    path = os.fspath(path)
    if os.path.lexists(path):
        raise error(errors.CHECKPOINT_STATE_INVALID, f"{path} already exists; containers are never overwritten",
                    operator=SERIALIZE)
    builder = ContainerBuilder(
        identity, state, trace_link=trace_link, schema_version=schema_version, restore_profiles=restore_profiles
    )
    builder.finish(lineage_root_hash=lineage_root_hash, checkpoint_hash_prev=checkpoint_hash_prev)
    temp = path + ".tmp"
    atomic.remove(temp)
    try:
        info = builder.write(temp)
        atomic.rename(temp, path)
    except BaseException:
        atomic.remove(temp)
        raise
    return info


# -- reading ---------------------------------------------------------------------------


def parse_manifest(data: bytes, what: str = paths.MANIFEST_NAME) -> ContainerInfo:
    """Decode and check a container manifest without touching any other file.

    Checks, in order: canonical CBOR within bounds, the four top-level keys and
    the format name, the header schema, ``checkpoint_hash`` against the header,
    the entry list (grammar, order, required files, shard numbering), and every
    Merkle root and component manifest hash of the header against the entries.
    """
    top = cbor_safe.decode(data, what=what, max_bytes=MAX_MANIFEST_BYTES, max_depth=limits.MAX_MANIFEST_DEPTH,
                           max_items=limits.MAX_MANIFEST_ITEMS)
    exact_map(top, MANIFEST_KEYS, f"{what} must be a map with exactly {sorted(MANIFEST_KEYS)}",
              errors.CHECKPOINT_SCHEMA_INVALID)
    if top["format"] != schema.CONTAINER_FORMAT:
        raise error(errors.CHECKPOINT_SCHEMA_UNSUPPORTED,
                    f"{what}: format {top['format']!r} is not {schema.CONTAINER_FORMAT}")
    header = schema.validate_header(top["header"])
    stored_hash = schema.check_hash(top["checkpoint_hash"], "checkpoint_hash")
    checkpoint_hash = hash_canonical(header)
    if stored_hash != checkpoint_hash:
        raise error(errors.CHECKPOINT_MERKLE_MISMATCH, f"{what}: checkpoint_hash does not match SHA-256 of the header")
    entries = _check_entries(top["entries"], what, header["checkpoint_schema_version"])
    roots = component_roots(entries)
    for name in ("checkpoint_merkle_root", "tensors_root_hash", "weights_manifest_hash",
                 "optimizer_state_root_hash", "optimizer_manifest_hash"):
        if header[name] != roots[name]:
            raise error(errors.CHECKPOINT_MERKLE_MISMATCH, f"{what}: {name} does not match the entry list")
    if "dp_accountant_state_root_hash" in header:
        for name in ("dp_accountant_state_root_hash", "dp_accountant_manifest_hash"):
            if header[name] != roots[name]:
                raise error(errors.CHECKPOINT_MERKLE_MISMATCH, f"{what}: {name} does not match the entry list")
    return ContainerInfo(checkpoint_hash, header, entries, data)


def _check_entries(entries: Any, what: str, version: str) -> list[dict]:
    code = errors.CHECKPOINT_SCHEMA_INVALID
    kinds_allowed = schema.has_cursor_kinds(version)
    checks.instance(entries, what, list, max_length=MAX_ENTRIES, fail=partial(error, code),
                    message="{name}: entries must be a list of at most {max_length}")
    previous = b""
    folded: set[str] = set()
    shards: dict[int, set[int]] = {}
    for entry in entries:
        exact_map(entry, ENTRY_KEYS, f"{what}: an entry has exactly the keys path, size, sha256", code)
        info = paths.parse_entry_path(entry["path"])
        schema.check_uint64(entry["size"], f"size of {entry['path']}")
        schema.check_hash(entry["sha256"], f"sha256 of {entry['path']}")
        key = sort_key(entry["path"])
        if key <= previous:
            raise error(code, f"{what}: entries are not in strictly increasing path order at {entry['path']!r}")
        previous = key
        if entry["path"].casefold() in folded:
            raise error(errors.CHECKPOINT_PATH_INVALID, f"{what}: paths differ only by case at {entry['path']!r}")
        folded.add(entry["path"].casefold())
        if info.kind == "tensor":
            assert info.rank is not None and info.shard is not None  # a tensor path names both
            shards.setdefault(info.rank, set()).add(info.shard)
        elif info.kind == "cursor_kind" and not kinds_allowed:
            raise error(errors.CHECKPOINT_PATH_INVALID, f"{what}: {entry['path']!r} is not in the schema {version} "
                                                        f"grammar (cursor kinds need {schema.CURSOR_KINDS_VERSION})")
    missing = sorted(set(paths.REQUIRED_PATHS) - {entry["path"] for entry in entries})
    if missing:
        raise error(code, f"{what}: the entry list lacks required file(s) {', '.join(missing)}")
    for rank, numbers in shards.items():
        if numbers != set(range(len(numbers))):
            raise error(code, f"{what}: the shards of rank {rank} are not numbered 0..{len(numbers) - 1}")
    return entries


def _open_container(path: str) -> tuple[int, ContainerInfo]:
    """A descriptor of the container folder (never through a link) and its checked manifest."""
    fd = paths.open_root(path, follow=False)
    try:
        data = paths.read_bytes(fd, paths.MANIFEST_NAME, MAX_MANIFEST_BYTES)
        return fd, parse_manifest(data)
    except errors.UmlosError as exc:
        os.close(fd)
        if exc.code == errors.CHECKPOINT_FILE_MISSING:
            raise error(errors.CHECKPOINT_NOT_FOUND, f"{path} has no {paths.MANIFEST_NAME}") from None
        raise
    except BaseException:
        os.close(fd)
        raise


class ContainerReader:
    """An opened container: the manifest is checked on open; files on demand.

    Use as a context manager (it holds a directory descriptor).
    """

    def __init__(self, path: str | os.PathLike[str], *, files: Mapping[str, bytes] | None = None,
                 info: ContainerInfo | None = None, cache: dict[str, Any] | None = None) -> None:
        """Open the container at ``path`` and check its manifest; or, given the
        ``files`` a writer holds and their ``info``, read those (:meth:`in_memory`)."""
        self.path = os.fspath(path)
        self._files = files
        self._fd: int | None = None
        if files is None:
            self._fd, info = _open_container(self.path)
        elif info is None:
            raise error(errors.CHECKPOINT_STATE_INVALID, "an in-memory reader needs the files and their ContainerInfo")
        self.info = info
        self.header = info.header
        self.entries = {entry["path"]: entry for entry in info.entries}
        #: Decoded CBOR files by path (a writer shares its own with the reader it checks against).
        self._cache = {} if cache is None else cache
        #: Paths whose bytes were checked against their entries.
        self.checked: set[str] = set()
        self._bytes: dict[str, bytes] = {}
        self._manifest: Manifest | None = None
        self._extra_cursors: dict[str, Any] | None = None

    @classmethod
    def in_memory(cls, info: ContainerInfo, files: Mapping[str, bytes],
                  cache: dict[str, Any] | None = None) -> ContainerReader:
        """A reader of a container a writer holds in memory (``files`` are the
        bytes ``info``'s entries were computed from): the writer runs the
        reader's content checks on what it is about to write."""
        return cls("(in memory)", files=files, info=info, cache=cache)

    @property
    def checkpoint_hash(self) -> bytes:
        return self.info.checkpoint_hash

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @property
    def _root(self) -> int:
        """The container folder's descriptor, which the file checks read under
        (an in-memory reader has none; a closed one no longer has it)."""
        if self._fd is None:
            raise error(errors.CHECKPOINT_STATE_INVALID,
                        f"{self.path}: no container folder is open (in memory or closed)")
        return self._fd

    def __enter__(self) -> ContainerReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- files ---------------------------------------------------------------------
    def check_file(self, path: str) -> None:
        """The file at ``path`` exists, is regular and matches its entry's size and hash."""
        entry = self.entries[path]
        size, digest = paths.hash_file(self._root, path)
        if size != entry["size"]:
            raise error(errors.CHECKPOINT_SIZE_MISMATCH, f"{path} is {size} bytes; the manifest lists {entry['size']}")
        if digest != entry["sha256"]:
            raise error(errors.CHECKPOINT_HASH_MISMATCH, f"{path}: SHA-256 differs from the manifest")
        self.checked.add(path)

    def read_verified(self, path: str) -> bytes:
        """The bytes of ``path``, checked against its entry."""
        if path in self._bytes:
            return self._bytes[path]
        entry = self.entries.get(path)
        if entry is None:
            raise error(errors.CHECKPOINT_FILE_MISSING, f"the container has no entry {path}")
        if self._files is not None:
            return self._files[path]  # the entries were computed from these bytes
        data = paths.read_bytes(self._root, path, max(entry["size"], 0), code=errors.CHECKPOINT_SIZE_MISMATCH)
        if len(data) != entry["size"]:
            raise error(errors.CHECKPOINT_SIZE_MISMATCH,
                        f"{path} is {len(data)} bytes; the manifest lists {entry['size']}")
        if sha256(data) != entry["sha256"]:
            raise error(errors.CHECKPOINT_HASH_MISMATCH, f"{path}: SHA-256 differs from the manifest")
        self.checked.add(path)
        if len(data) <= KEEP_BYTES:
            self._bytes[path] = data
        return data

    def check_all_files(self) -> None:
        """Every listed file, in path order; small files are kept for the content checks."""
        for path, entry in self.entries.items():
            if entry["size"] <= KEEP_BYTES:
                self.read_verified(path)
            else:
                self.check_file(path)

    def check_no_extra(self) -> None:
        """Nothing in the folder that the manifest does not list (files, links, folders)."""
        listed = set(self.entries) | {paths.MANIFEST_NAME}
        folders = {"/".join(p.split("/")[:i]) for p in listed for i in range(1, p.count("/") + 1)}
        for relpath, kind in paths.walk(self._root):
            if kind == "file" and relpath in listed:
                continue
            if kind == "dir" and relpath in folders:
                continue
            raise error(
                errors.CHECKPOINT_UNEXPECTED_FILE,
                f"{relpath} ({'folder' if kind == 'dir' else 'link or special file' if kind == 'other' else 'file'}) "
                "is not listed in the manifest",
            )

    # -- content -------------------------------------------------------------------
    def cbor(self, path: str, max_depth: int = MAX_STATE_CBOR_DEPTH) -> Any:
        if path not in self._cache:
            entry = self.entries.get(path)
            if entry is not None and entry["size"] > MAX_SMALL_CBOR_BYTES:
                raise error(errors.CHECKPOINT_CBOR_INVALID, f"{path} is listed at {entry['size']} bytes; "
                                                            f"the limit is {MAX_SMALL_CBOR_BYTES}")
            self._cache[path] = cbor_safe.decode(
                self.read_verified(path), what=path, max_bytes=MAX_SMALL_CBOR_BYTES, max_depth=max_depth,
                max_items=limits.MAX_CBOR_ITEMS,
            )
        return self._cache[path]

    def run_manifest(self) -> Manifest:
        """``data/manifest.cbor`` as a Manifest; bound to manifest_hash, policy, env, spec and datasets."""
        if self._manifest is not None:
            return self._manifest
        raw = self.cbor(paths.RUN_MANIFEST_PATH, MAX_RUN_MANIFEST_DEPTH)
        try:
            manifest = Manifest.from_dict(raw) if isinstance(raw, dict) else None
        except errors.UmlosError as exc:
            raise error(errors.CHECKPOINT_CONTENT_INVALID, f"{paths.RUN_MANIFEST_PATH}: {exc.message}") from None
        if manifest is None:
            raise error(errors.CHECKPOINT_CONTENT_INVALID, f"{paths.RUN_MANIFEST_PATH} must be a map")
        header = self.header
        checks = {
            "manifest_hash": manifest.hash,
            "policy_hash": manifest.policy_hash,
            "runtime_env_hash": manifest.env_manifest_hash,
            "dataset_snapshot_id": dataset_snapshot_id(manifest.canonical),
        }
        for name, value in checks.items():
            if header[name] != value:
                raise error(errors.CHECKPOINT_BINDING_MISMATCH, f"{name} does not match {paths.RUN_MANIFEST_PATH}")
        if header["spec_version"] != manifest.spec_version:
            raise error(errors.CHECKPOINT_BINDING_MISMATCH, f"spec_version does not match {paths.RUN_MANIFEST_PATH}")
        if sha256(self.read_verified(paths.RUN_MANIFEST_PATH)) != manifest.hash:
            raise error(errors.CHECKPOINT_BINDING_MISMATCH, f"{paths.RUN_MANIFEST_PATH} is not the canonical manifest")
        self._manifest = manifest
        return manifest

    def cursors(self) -> dict[str, Cursor]:
        value = self.cbor(paths.CURSORS_PATH)
        code = errors.CHECKPOINT_CONTENT_INVALID
        exact_map(value, ("data_cursors", "sampler_config_hash"),
                  f"{paths.CURSORS_PATH} must be a map with exactly data_cursors and sampler_config_hash", code)
        if value["sampler_config_hash"] != self.header["sampler_config_hash"]:
            raise error(errors.CHECKPOINT_BINDING_MISMATCH, "sampler_config_hash differs between header and cursors")
        cursors = checks.instance(value["data_cursors"], paths.CURSORS_PATH, dict, fail=partial(error, code),
                                  message="{name}: data_cursors must be a map")
        manifest = self.run_manifest()
        out = {}
        for key, item in cursors.items():
            if key not in manifest.datasets:
                raise error(errors.CHECKPOINT_BINDING_MISMATCH,
                            f"cursor dataset key {key!r} is not in the run manifest")
            exact_map(item, ("epoch", "global_index"),
                      f"{paths.CURSORS_PATH}: cursor {key!r} has exactly epoch and global_index", code)
            out[key] = Cursor(
                schema.check_uint64(item["epoch"], f"cursor {key!r} epoch", code),
                schema.check_uint64(item["global_index"], f"cursor {key!r} global_index", code),
            )
            problem = cursor_range_problem(key, out[key], manifest)
            if problem is not None:
                raise error(code, f"{paths.CURSORS_PATH}: {problem}")
        return out

    def extra_cursors(self) -> dict[str, Any]:
        """``{kind: state}`` from ``data/cursors=<kind>.cbor``, each decoded
        (hence checked) by its registered kind against the run manifest."""
        if self._extra_cursors is not None:
            return self._extra_cursors
        out: dict[str, Any] = {}
        for path in self.entries:
            if not path.startswith("data/cursors="):
                continue
            name = paths.parse_entry_path(path).name
            assert name is not None  # a cursors= path names its kind
            value = self.cbor(path)
            exact_map(value, ("kind", "state"), f"{path} must be {{kind: {name!r}, state}}",
                      errors.CHECKPOINT_CONTENT_INVALID, where={"kind": name})
            kind = extensions.cursor_kind(name, errors.CHECKPOINT_SCHEMA_UNSUPPORTED, VALIDATE)
            try:
                out[name] = kind.decode(value["state"], self.run_manifest())
            except extensions.REFUSALS as exc:
                raise error(errors.CHECKPOINT_CONTENT_INVALID, f"{path}: the {name!r} kind refused its state "
                                                               f"({_reason(exc)})") from None
        self._extra_cursors = out
        return out

    def dp_state(self) -> tuple[bool, Any]:
        """``(enabled, state)`` from ``dp/accountant_state.cbor``."""
        value = self.cbor(paths.DP_PATH)
        if value == {"dp_enabled": False}:
            enabled, state = False, None
        elif isinstance(value, dict) and set(value) == {"dp_enabled", "state"} and value["dp_enabled"] is True:
            enabled, state = True, value["state"]
        else:
            raise error(errors.CHECKPOINT_CONTENT_INVALID,
                        f"{paths.DP_PATH} must be {{dp_enabled: false}} or {{dp_enabled: true, state}}")
        if enabled != ("dp_accountant_state_root_hash" in self.header):
            raise error(errors.CHECKPOINT_BINDING_MISMATCH,
                        "dp_accountant_state_root_hash is present exactly when DP is enabled")
        return enabled, state

    def tmmu_plan(self) -> Any:
        value = self.cbor(paths.TMMU_PATH)
        if sha256(self.read_verified(paths.TMMU_PATH)) != self.header["tmmu_plan_hash"]:
            raise error(errors.CHECKPOINT_BINDING_MISMATCH, f"tmmu_plan_hash does not match {paths.TMMU_PATH}")
        exact_map(value, ("plan",), f"{paths.TMMU_PATH} must be a map with exactly the key plan",
                  errors.CHECKPOINT_CONTENT_INVALID)
        return value["plan"]

    def trace_link(self) -> TraceLink:
        link = TraceLink.from_dict(self.cbor(paths.TRACE_LINK_PATH))
        if link.trace_root_hash != self.header["trace_root_hash"]:
            raise error(errors.CHECKPOINT_BINDING_MISMATCH,
                        "trace_root_hash differs between header and trace/link.cbor")
        if link.trace_tail_hash != self.header["trace_tail_hash_at_checkpoint"]:
            raise error(errors.CHECKPOINT_BINDING_MISMATCH,
                        "trace_tail_hash_at_checkpoint differs between header and trace/link.cbor")
        return link

    def artifact_index(self) -> dict[str, dict]:
        value = self.cbor(paths.ARTIFACT_INDEX_PATH)
        if sha256(self.read_verified(paths.ARTIFACT_INDEX_PATH)) != self.header["artifact_index_hash"]:
            raise error(errors.CHECKPOINT_BINDING_MISMATCH, "artifact_index_hash does not match the artifact index")
        exact_map(value, ("artifacts",), f"{paths.ARTIFACT_INDEX_PATH} must be {{artifacts: map}}",
                  errors.CHECKPOINT_CONTENT_INVALID, where={"artifacts": dict})
        index = value["artifacts"]
        listed = set()
        for name, item in index.items():
            if not paths.valid_name(name):
                raise error(errors.CHECKPOINT_CONTENT_INVALID, f"artifact {name!r}: invalid index entry")
            exact_map(item, ("kind", "path", "size", "sha256"), f"artifact {name!r}: invalid index entry",
                      errors.CHECKPOINT_CONTENT_INVALID)
            if item["kind"] not in ("blob", "array") or item["path"] != paths.artifact_path(item["kind"], name):
                raise error(errors.CHECKPOINT_CONTENT_INVALID, f"artifact {name!r}: kind and path disagree")
            entry = self.entries.get(item["path"])
            if entry is None or entry["size"] != item["size"] or entry["sha256"] != item["sha256"]:
                raise error(errors.CHECKPOINT_BINDING_MISMATCH, f"artifact {name!r} does not match its manifest entry")
            listed.add(item["path"])
        stored = {p for p in self.entries if p.startswith("artifacts/") and p != paths.ARTIFACT_INDEX_PATH}
        if stored != listed:
            raise error(errors.CHECKPOINT_BINDING_MISMATCH, "the artifact index and the artifact files differ")
        return index

    def tensor_layout(self) -> dict[int, int]:
        """``{rank: number of shards}``."""
        layout: dict[int, int] = {}
        for path in self.entries:
            info = paths.parse_entry_path(path)
            if info.kind == "tensor":
                assert info.rank is not None and info.shard is not None  # a tensor path names both
                layout[info.rank] = max(layout.get(info.rank, 0), info.shard + 1)
        return layout

    def optimizer_ranks(self) -> list[int]:
        ranks = [paths.parse_entry_path(p).rank for p in self.entries if p.startswith("optimizer/")]
        return sorted(rank for rank in ranks if rank is not None)  # every optimizer path names its rank

    def arrays(self, path: str) -> dict[str, np.ndarray]:
        return tensors.decode(self.read_verified(path), path)

    def describe_arrays(self, path: str) -> dict[str, dict]:
        described = tensors.describe(self.read_verified(path), path)
        if path.startswith("artifacts/array="):
            exact_map(described, ("value",), f"{path} must hold one tensor named value",
                      errors.CHECKPOINT_CONTENT_INVALID)
        return described

    def user_value(self, item: Mapping[str, Any]) -> Any:
        """One user_state value of the artifact index: bytes or an array."""
        if item["kind"] == "blob":
            return self.read_verified(item["path"])
        self.describe_arrays(item["path"])
        return self.arrays(item["path"])["value"]

    def check_content(self) -> None:
        """Every binding between header and files, and every file's content."""
        self.run_manifest()
        self.cursors()
        self.extra_cursors()
        self.dp_state()
        self.tmmu_plan()
        self.trace_link()
        self.artifact_index()
        for path in self.entries:
            if path.endswith(".bin") and not path.startswith("artifacts/blob="):
                self.describe_arrays(path)


def verify_container(path: str | os.PathLike[str]) -> ContainerInfo:
    """Run every check on the container at ``path``; return its info or raise.

    Order: manifest (CBOR, schema, header hash, entries, Merkle roots), each
    listed file (present, regular, size, SHA-256) in path order, nothing
    unlisted, then the content of every file and its binding to the header.
    """
    with ContainerReader(path) as reader:
        reader.check_all_files()
        reader.check_no_extra()
        reader.check_content()
        return reader.info
