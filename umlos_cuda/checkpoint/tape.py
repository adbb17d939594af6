"""The trace tape (docs/checkpoint-format.md §10; operator IO.WriteTape_v1).

A run's trace is one hash chain of records: ``run_header`` first, then one
``iter`` per NextBatch call (cursor before and after, ``data_replay_t``),
``failure``, ``checkpoint`` and ``restore`` records where they happen, and
``run_end``. Each record is a canonical CBOR map carrying ``seq`` (0, 1, 2, ...)
and ``prev``, the SHA-256 of the previous record's canonical CBOR (32 zero
bytes for the first). ``trace_root_hash`` is the hash of the ``run_header``,
``trace_tail_hash`` the hash of the last record, so the tail fixes every record
before it.

On disk the chain is cut into *segment* files ``trace/segment=<k>.tape``
(k = 1, 2, ...). A segment is a sequence of frames, each a 4-byte big-endian
length and a canonical CBOR payload: a segment header
``{format, segment_index, first_seq, prev_hash, block_size, max_events}``, then
*blocks* ``{block_index, records}`` of at most ``BLOCK_SIZE = 512`` records.
A segment holds at most ``max_events = 500_000`` records; the writer rotates to
the next segment when it is full (IO.WriteTape_v1). Segments are
written as ``.tmp`` files and renamed by the run-commit protocol, so a
committed segment is immutable and complete.

The reader checks everything: frame bounds, canonical CBOR, each record's
schema, sequence numbers, the ``prev`` chain across blocks and segments, and
the record order (``run_header`` first, nothing but ``restore`` or ``failure``
after ``run_end``). Blocks of ``iter`` and ``checkpoint`` records, nearly all
of a tape, are checked by :mod:`tape_fast` with byte patterns (about 20 times
faster); any block it cannot prove valid is read by the strict reader, which
decides and reports exactly as before (``fast=False`` uses it alone).
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from ..files import durable
from .. import checks, errors
from ..errors import UINT64_MAX, UmlosError
from ..hashing import ZERO_HASH, cbor_canonical, sha256
from . import atomic, cbor_safe, paths, plugins, tape_fast
from .codes import TAPE, error, exact_map

#: The segment header's ``format`` and the run_header's ``schema_version``: the operator's name.
TAPE_FORMAT = errors.TAPE_OPERATOR
BLOCK_SIZE = 512  # IO.WriteTape_v1: records per block
MAX_EVENTS = 500_000  # IO.WriteTape_v1: records per segment before rotation
#: Bounds for untrusted tapes.
MAX_FRAME_BYTES = 64 << 20
MAX_RECORD_DEPTH = 6
SEGMENT_HEADER_KEYS = frozenset({"format", "segment_index", "first_seq", "prev_hash", "block_size", "max_events"})
#: How a segment header with a block size or event bound below 1 (or not a uint64) is refused.
_SIZES = "{name}: invalid block_size or max_events"
#: The keys of a segment as a checkpoint's trace link and a run commit list it (:meth:`Segment.link_dict`).
SEGMENT_KEYS = ("path", "size", "sha256", "first_seq", "event_count")
TRACE_DIR = "trace"
#: A segment's file name in ``trace/`` (store listings match it) ...
SEGMENT_FILE_RE = re.compile(r"segment=([1-9][0-9]{0,9})\.tape\Z")
#: ... and its store-relative path (certificates and trace links name it so).
_SEGMENT_RE = re.compile(TRACE_DIR + "/" + SEGMENT_FILE_RE.pattern)


def segment_path(index: int) -> str:
    """The store-relative path of segment ``index`` (1-based)."""
    return f"{TRACE_DIR}/segment={index}.tape"


def parse_segment_name(path: Any, code: str = errors.TRACE_FORMAT_INVALID) -> int:
    match = _SEGMENT_RE.match(path) if isinstance(path, str) else None
    if not match:
        raise error(code, f"{path!r} is not a tape segment path (trace/segment=<k>.tape)", operator=TAPE)
    return checks.integer_text(match.group(1), "segment", 1, None, fail=partial(error, code, operator=TAPE),
                               message=checks.literal(f"{path!r} is not a tape segment path (trace/segment=<k>.tape)"))


# -- record schemas ----------------------------------------------------------------------
#
# A schema maps each field of a record type to a check (a function of the value
# that says whether it is valid); checks.record applies it (check_record). The
# checks below are public so that a subsystem can declare its own record types
# with them (register_record_type).

#: An integer in [0, 2^64 - 1] (a plain int, not a bool).
is_uint = checks.is_uint64


def is_hash(v: Any) -> bool:
    """A 32-byte string (a SHA-256)."""
    return isinstance(v, bytes) and len(v) == 32


def is_text(v: Any) -> bool:
    """Non-empty text of at most 1024 characters."""
    return isinstance(v, str) and 0 < len(v) <= 1024


def is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def is_float(v: Any) -> bool:
    return isinstance(v, float)


def is_cursor(v: Any) -> bool:
    """A NextBatch cursor ``{epoch, global_index}``."""
    return (isinstance(v, dict) and set(v) == {"epoch", "global_index"}
            and is_uint(v["epoch"]) and is_uint(v["global_index"]))


def _cursors(v: Any) -> bool:
    return isinstance(v, dict) and all(is_text(k) and is_cursor(c) for k, c in v.items())


def nullable(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """``check``, or None."""
    return lambda v: v is None or check(v)


def _text_map(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(x, (str, int, bool)) or x is None for x in v.values())


def _cardinalities(v: Any) -> bool:
    return isinstance(v, dict) and all(is_text(k) and is_uint(n) for k, n in v.items())


def _stage_flags(v: Any) -> bool:
    return isinstance(v, dict) and set(v) == {"train", "eval", "infer"} and all(is_bool(x) for x in v.values())


COMMON = {"type": is_text, "seq": is_uint, "prev": is_hash}
#: Every record type this process knows: the built-in ones below, then those
#: subsystems registered (:func:`register_record_type`).
SCHEMAS: dict[str, dict[str, Callable[[Any], bool]]] = {
    # docs/checkpoint-format.md §10: each record type's fields
    "run_header": {
        "schema_version": is_text, "tenant_id": is_text, "run_id": is_text, "spec_version": is_text,
        "replay_token": is_hash, "manifest_hash": is_hash, "dataset_key": is_text, "cardinality": is_uint,
        "datasets": _cardinalities, "sampler_block_size": is_uint, "is_shuffled_per_stage": _stage_flags,
        "world_size": is_uint, "backend_hash": is_hash, "task_type": is_text, "source_hash": nullable(is_hash),
    },
    # one NextBatch call (R9 metadata), with cursor before/after and the indices' digest
    "iter": {
        "t": is_uint, "dataset_key": is_text, "stage": is_text, "epoch": is_uint, "global_position": is_uint,
        "is_shuffled": is_bool, "micro_batch_size": is_uint, "global_batch_size": is_uint,
        "subsampling_mode": is_text, "sampling_mode": is_text, "sampler_config_hash": is_hash,
        "effective_q": is_float, "epoch_seed_hash": is_hash, "data_replay_t": is_hash,
        "cursor_before": is_cursor, "cursor_after": is_cursor, "world_size": is_uint, "rank": is_uint,
        "count": is_uint, "indices_sha256": is_hash,
    },
    # the failure record of R8, with the kernel's RNG and state fingerprints
    "failure": {
        "t": nullable(is_uint), "failure_code": is_text, "failure_operator": is_text,
        "dataset_key": nullable(is_text), "data_replay_t": nullable(is_hash), "replay_token": nullable(is_hash),
        "rng_fingerprint_t": nullable(is_hash), "state_fp_t": nullable(is_hash), "diagnostics": _text_map,
    },
    "checkpoint": {"t": is_uint, "commit_seq": is_uint},
    "restore": {"t": is_uint, "checkpoint_hash": is_hash, "restore_profile_id": is_text, "cursors": _cursors},
    "run_end": {
        "status": lambda v: v in ("success", "failed"), "final_epoch_count": is_uint, "total_samples_seen": is_uint,
        "checkpoint_hash": nullable(is_hash), "restore_status": is_text, "final_cursors": _cursors,
    },
}
#: Fields a built-in record carries only when its writer gives them: a record
#: without them keeps the bytes it always had (the run's
#: ``task_type``, ``world_size`` and ``backend_hash`` on ``run_end``).
OPTIONAL_FIELDS: dict[str, dict[str, Callable[[Any], bool]]] = {
    "run_end": {"task_type": is_text, "world_size": is_uint, "backend_hash": is_hash},
}
#: Record types that may follow ``run_end`` (a restore starts the run again).
AFTER_RUN_END: set[str] = {"restore", "failure"}
#: A subsystem's record type: ``<subsystem>.<record>``, so it never meets a built-in name.
RECORD_TYPE_PATTERN = r"[a-z][a-z0-9_]{0,31}\.[a-z][a-z0-9_]{0,31}"
_RECORD_TYPE_RE = re.compile(RECORD_TYPE_PATTERN + r"\Z")


def register_record_type(name: str, fields: Mapping[str, Callable[[Any], bool]], *,
                         after_run_end: bool = False) -> str:
    """Declare a subsystem's record type: its name (``<subsystem>.<record>``)
    and a check per field (``is_uint``, ``is_hash``, ``is_text``, ...,
    ``nullable(check)``, or any function of the value returning a bool).

    Writers then append such records (``TapeWriter.append``) and readers check
    them like the built-in ones (all fields present, none unknown, each
    check true), in the strict reader; the fast path covers only ``iter`` and
    ``checkpoint`` blocks. ``after_run_end``: the record may follow ``run_end``.
    Registering the same schema again does nothing; another schema under a
    taken name is refused (``CHECKPOINT_STATE_INVALID``).
    """
    def refuse(reason: str) -> UmlosError:
        return error(errors.CHECKPOINT_STATE_INVALID, f"record type {name!r}: {reason}", operator=TAPE)

    def refuse_field(shown: str) -> UmlosError:
        return refuse(f"field {shown} must be new text (not {', '.join(COMMON)}) with a callable check")

    checks.text(name, "record type", pattern=_RECORD_TYPE_RE, fail=refuse, message="a subsystem's {name} is named "
                "<subsystem>.<record> (" + checks.literal(RECORD_TYPE_PATTERN) + ")")
    checks.instance(fields, "fields", Mapping, empty=False, fail=refuse,
                    message="declare its {name} as a map of field name to check")
    for field_name, check in fields.items():
        checks.text(field_name, "field", empty=False, fail=refuse_field, message="{value!r}")
        if field_name in COMMON or not callable(check):
            raise refuse_field(repr(field_name))
    schema = dict(fields)
    if name in SCHEMAS:
        if SCHEMAS[name] != schema or (name in AFTER_RUN_END) != after_run_end:
            raise refuse("another schema is registered under this name")
        return name
    SCHEMAS[name] = schema
    if after_run_end:
        AFTER_RUN_END.add(name)
    return name


def record_schema(kind: str, what: str = "record") -> dict[str, Callable[[Any], bool]]:
    """The schema of record type ``kind``; unknown types are looked for among
    the installed subsystems once (:mod:`.plugins`), then refused."""
    schema = SCHEMAS.get(kind)
    if schema is None:
        plugins.load()
        schema = SCHEMAS.get(kind)
    if schema is None:
        raise error(errors.TRACE_FORMAT_INVALID, f"{what}: unknown record type {kind!r} "
                                                  f"(known: {', '.join(SCHEMAS)}; {plugins.hint()})", operator=TAPE)
    return schema


def check_record(record: Any, what: str = "record") -> dict:
    """A record's fields and types match its schema exactly (``TRACE_FORMAT_INVALID``)."""
    fail = partial(error, errors.TRACE_FORMAT_INVALID, operator=TAPE)
    checks.instance(record, what, dict, fail=fail, message="{name}: a record is a map with a text type")
    kind = checks.text(record.get("type"), what, fail=fail, message="{name}: a record is a map with a text type")
    keys = "missing {missing_list}, unknown {unknown_list}"
    checks.record(record, {**COMMON, **record_schema(kind, what)}, optional=OPTIONAL_FIELDS.get(kind),
                  fail=lambda message: error(errors.TRACE_FORMAT_INVALID, f"{what} ({kind}): {message}", operator=TAPE),
                  unknown=keys, missing=keys)
    return record


def record_hash(record: Mapping[str, Any]) -> bytes:
    return sha256(cbor_canonical(dict(record)))


# -- building records from the engine's objects ------------------------------------------


def indices_digest(indices: Any) -> tuple[int, bytes]:
    """``(count, SHA-256)`` of indices as uint64 little-endian (the golden-trace encoding)."""
    from ..backends import to_numpy

    array = np.ascontiguousarray(to_numpy(indices).astype("<u8", copy=False))
    return int(array.size), sha256(array.tobytes())


#: R7: the train stage shuffles, eval and infer run in order (the run_header's default).
STAGE_SHUFFLED = {"train": True, "eval": False, "infer": False}


def run_header_fields(
    *,
    tenant_id: str,
    run_id: str,
    manifest: Any,
    replay_token: bytes,
    backend_hash: bytes,
    dataset_key: str,
    world_size: int,
    task_type: str = "data_loading",
    source_hash: bytes | None = None,
    shuffled_per_stage: Mapping[str, bool] | None = None,
) -> dict[str, Any]:
    """The ``run_header`` of a run over ``manifest`` (a :class:`umlos_cuda.Manifest`).

    Nothing here is particular to NextBatch: ``dataset_key`` names the
    manifest's dataset the run reads (any subsystem's runs read one),
    ``task_type`` says what the run does, and ``shuffled_per_stage`` which
    stages read in a shuffled order (default :data:`STAGE_SHUFFLED`)."""
    spec = manifest.datasets[dataset_key]
    return {
        "type": "run_header",
        "schema_version": TAPE_FORMAT,
        "tenant_id": tenant_id,
        "run_id": run_id,
        "spec_version": manifest.spec_version,
        "replay_token": replay_token,
        "manifest_hash": manifest.hash,
        "dataset_key": dataset_key,
        "cardinality": spec.cardinality,
        "datasets": {key: entry.cardinality for key, entry in manifest.datasets.items()},
        "sampler_block_size": manifest.sampler_block_size,
        "is_shuffled_per_stage": dict(STAGE_SHUFFLED if shuffled_per_stage is None else shuffled_per_stage),
        "world_size": world_size,
        "backend_hash": backend_hash,
        "task_type": task_type,
        "source_hash": source_hash,
    }


def iter_fields(batch: Any, t: int) -> dict[str, Any]:
    """The ``iter`` record of one NextBatch call (a :class:`umlos_cuda.Batch`) at step ``t``."""
    meta = batch.metadata
    count, digest = indices_digest(batch.indices)
    return {
        "type": "iter",
        "t": t,
        "dataset_key": meta["dataset_key"],
        "stage": meta["stage"],
        "epoch": meta["epoch"],
        "global_position": meta["global_position"],
        "is_shuffled": meta["is_shuffled"],
        "micro_batch_size": meta["micro_batch_size"],
        "global_batch_size": meta["global_batch_size"],
        "subsampling_mode": meta["subsampling_mode"],
        "sampling_mode": meta["sampling_mode"],
        "sampler_config_hash": bytes.fromhex(meta["sampler_config_hash"]),
        "effective_q": float(meta["effective_q"]),
        "epoch_seed_hash": bytes.fromhex(meta["epoch_seed_hash"]),
        "data_replay_t": bytes.fromhex(meta["data_replay_t"]),
        "cursor_before": dict(meta["cursor_before"]),
        "cursor_after": dict(meta["cursor_after"]),
        "world_size": meta["world_size"],
        "rank": meta["rank"],
        "count": count,
        "indices_sha256": digest,
    }


def run_end_fields(
    *,
    status: str,
    final_epoch_count: int,
    total_samples_seen: int,
    restore_status: str,
    final_cursors: Mapping[str, Mapping[str, int]],
    checkpoint_hash: bytes | None = None,
    task_type: str | None = None,
    world_size: int | None = None,
    backend_hash: bytes | None = None,
) -> dict[str, Any]:
    """The ``run_end`` record. ``task_type``, ``world_size`` and ``backend_hash``
    are written only when given, so a run that gives none
    writes the record it always wrote."""
    record = {
        "type": "run_end", "status": status, "final_epoch_count": final_epoch_count,
        "total_samples_seen": total_samples_seen, "checkpoint_hash": checkpoint_hash,
        "restore_status": restore_status, "final_cursors": {k: dict(c) for k, c in final_cursors.items()},
    }
    given = {"task_type": task_type, "world_size": world_size, "backend_hash": backend_hash}
    record.update({name: value for name, value in given.items() if value is not None})
    return record


def failure_fields(
    exc: UmlosError,
    *,
    replay_token: bytes | None = None,
    rng_fingerprint_t: bytes | None = None,
    state_fp_t: bytes | None = None,
) -> dict[str, Any]:
    """The ``failure`` record of an error: R8's fields plus the message."""
    record = exc.record
    replay_t = record.get("data_replay_t")
    if isinstance(replay_t, str):
        try:
            replay_t = bytes.fromhex(replay_t)
        except ValueError:
            replay_t = None
    t = record.get("t")
    return {
        "type": "failure",
        "t": t if is_uint(t) else None,
        "failure_code": exc.code,
        "failure_operator": record.get("failure_operator") or errors.NEXTBATCH_OPERATOR,
        "dataset_key": record.get("dataset_key") if is_text(record.get("dataset_key")) else None,
        "data_replay_t": replay_t if is_hash(replay_t) else None,
        "replay_token": replay_token,
        "rng_fingerprint_t": rng_fingerprint_t,
        "state_fp_t": state_fp_t,
        "diagnostics": {"message": exc.message[:1024] or "-"},
    }


# -- writing -----------------------------------------------------------------------------


@dataclass
class Segment:
    """A tape segment: where it is, what it holds, and its file digest."""

    index: int
    first_seq: int
    event_count: int
    size: int
    sha256: bytes

    @property
    def path(self) -> str:
        return segment_path(self.index)

    def link_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256,
                "first_seq": self.first_seq, "event_count": self.event_count}


@dataclass
class TapeState:
    """Where a tape's chain stands: next seq, root and tail hashes, committed segments."""

    next_seq: int = 0
    root_hash: bytes = ZERO_HASH
    tail_hash: bytes = ZERO_HASH
    segments: list[Segment] = field(default_factory=list)
    ended: bool = False

    @property
    def next_segment_index(self) -> int:
        return self.segments[-1].index + 1 if self.segments else 1


def frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


class _OpenSegment:
    def __init__(self, store_dir: str, index: int, first_seq: int, prev_hash: bytes, block_size: int, max_events: int):
        self.index = index
        self.first_seq = first_seq
        self.final = os.path.join(store_dir, segment_path(index))
        self.temp = self.final + ".tmp"
        atomic.remove(self.temp)
        try:
            self.fd = durable.create_exclusive(self.temp, 0o644)
        except OSError as exc:
            raise error(errors.CHECKPOINT_IO_ERROR, f"cannot create {self.temp}: {exc.strerror}",
                        operator=TAPE) from None
        self.digest = hashlib.sha256()
        self.size = 0
        self.events = 0
        self.blocks = 0
        self.write(frame(cbor_canonical({
            "format": TAPE_FORMAT, "segment_index": index, "first_seq": first_seq, "prev_hash": prev_hash,
            "block_size": block_size, "max_events": max_events,
        })))

    def write(self, data: bytes) -> None:
        try:
            durable.write_all(self.fd, data)
        except OSError as exc:
            raise error(errors.CHECKPOINT_IO_ERROR, f"cannot write {self.temp}: {exc.strerror}",
                        operator=TAPE) from None
        self.digest.update(data)
        self.size += len(data)

    def close(self) -> Segment:
        try:
            os.fsync(self.fd)
        except OSError as exc:
            raise error(errors.CHECKPOINT_IO_ERROR, f"cannot fsync {self.temp}: {exc.strerror}",
                        operator=TAPE) from None
        finally:
            os.close(self.fd)
        return Segment(self.index, self.first_seq, self.events, self.size, self.digest.digest())

    def abandon(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


class TapeWriter:
    """Appends records to a store's tape; segments stay ``.tmp`` until committed.

    ``state`` is the committed chain to continue (empty for a new run). The
    store calls :meth:`seal` at each commit and :meth:`committed` after the
    renames; records appended after the last commit are lost in a crash,
    which recovery reports with a failure record.
    """

    def __init__(self, store_dir: str, state: TapeState, *, block_size: int = BLOCK_SIZE, max_events: int = MAX_EVENTS):
        fail = partial(error, errors.CHECKPOINT_STATE_INVALID, operator=TAPE)
        self.store_dir = store_dir
        self.block_size = checks.integer(block_size, "block_size", 1, BLOCK_SIZE * 64, fail=fail,
                                         message="{name} must be in [{low}, {high}]")
        self.max_events = checks.integer(max_events, "max_events", 1, fail=fail,
                                         message="{name} must be a positive integer")
        self.state = state
        self.next_seq = state.next_seq
        self.root_hash = state.root_hash
        self.tail_hash = state.tail_hash
        self.ended = state.ended
        self._next_index = state.next_segment_index
        self._block: list[dict] = []
        self._open: _OpenSegment | None = None
        self._sealed: list[Segment] = []

    @property
    def event_count(self) -> int:
        return self.next_seq

    def append(self, fields: Mapping[str, Any]) -> bytes:
        """Append a record (``type`` and its fields; ``seq`` and ``prev`` are
        filled here); return its hash. The record is checked against its
        schema and the record order before anything is written."""
        record = dict(fields)
        record["seq"] = self.next_seq
        record["prev"] = self.tail_hash
        check_record(record, f"record {self.next_seq}")
        _check_order(record, self.next_seq, self.ended, f"record {self.next_seq}")
        digest = record_hash(record)
        if self.next_seq == 0:
            self.root_hash = digest
        self.tail_hash = digest
        self.next_seq += 1
        if record["type"] == "run_end":
            self.ended = True
        elif record["type"] == "restore":
            self.ended = False
        self._block.append(record)
        if self._open is None:
            self._open = _OpenSegment(self.store_dir, self._next_index, record["seq"], record["prev"],
                                      self.block_size, self.max_events)
            self._next_index += 1
        self._open.events += 1
        if len(self._block) >= self.block_size:
            self._flush_block(self._open)
        if self._open.events >= self.max_events:
            self._flush_block(self._open)
            self._sealed.append(self._open.close())
            self._open = None
        return digest

    def _flush_block(self, segment: _OpenSegment) -> None:
        if self._block:
            segment.write(frame(cbor_canonical({"block_index": segment.blocks, "records": self._block})))
            segment.blocks += 1
            self._block = []

    def seal(self) -> list[Segment]:
        """Close every segment written since the last commit (fsynced ``.tmp`` files)."""
        if self._open is not None:
            self._flush_block(self._open)
            self._sealed.append(self._open.close())
            self._open = None
        return list(self._sealed)

    def committed(self) -> TapeState:
        """Record that the sealed segments were renamed to their final names."""
        self.state = TapeState(self.next_seq, self.root_hash, self.tail_hash,
                               self.state.segments + self._sealed, self.ended)
        self._sealed = []
        return self.state

    def abandon(self) -> None:
        """Drop the open segment's descriptor (its ``.tmp`` file is left for recovery)."""
        if self._open is not None:
            self._open.abandon()
            self._open = None


def _check_order(record: dict, seq: int, ended: bool, what: str) -> None:
    kind = record["type"]
    if (seq == 0) != (kind == "run_header"):
        raise error(errors.TRACE_FORMAT_INVALID, f"{what}: a tape starts with exactly one run_header", operator=TAPE)
    if ended and kind not in AFTER_RUN_END:
        raise error(errors.TRACE_FORMAT_INVALID, f"{what}: only {', '.join(sorted(AFTER_RUN_END))} may follow run_end",
                    operator=TAPE)


# -- reading -----------------------------------------------------------------------------


def _read_exact(handle, count: int, what: str, at: int) -> bytes:
    data = handle.read(count)
    if len(data) != count:
        raise error(errors.TRACE_TRUNCATED, f"{what}: ends inside a frame at byte {at}", operator=TAPE)
    return data


def _new_matcher() -> tape_fast.BlockMatcher:
    """The fast path's block matcher, its patterns built from :data:`SCHEMAS`."""
    shapes: dict[Callable[[Any], bool], str] = {is_uint: "uint", is_hash: "hash", is_text: "text", is_bool: "bool",
                                                 is_float: "float", is_cursor: "cursor"}
    return tape_fast.BlockMatcher({kind: {**COMMON, **SCHEMAS[kind]} for kind in tape_fast.FAST_KINDS}, shapes)


def _segment_chunks(
    handle,
    what: str,
    *,
    index: int,
    first_seq: int,
    prev_hash: bytes,
    ended: bool,
    digest: Any,
    matcher: tape_fast.BlockMatcher | None,
    want_records: bool,
) -> Iterator[tuple[list[dict] | None, list[bytes], bool]]:
    """Yield ``(records, hashes, ended)`` chunks of one segment, checking everything.

    A block that ``matcher`` proves valid comes as one chunk (``records`` only
    if ``want_records``); otherwise the strict reader decodes the block and
    yields one chunk per record, so a failure stops at the same record, with
    the same error, as it always did. ``ended`` is the run_end state after
    the chunk.
    """
    position = 0

    def next_frame() -> bytes | None:
        nonlocal position
        head = handle.read(4)
        if not head:
            return None
        if len(head) != 4:
            raise error(errors.TRACE_TRUNCATED, f"{what}: ends inside a frame header at byte {position}", operator=TAPE)
        length = int.from_bytes(head, "big")
        if length > MAX_FRAME_BYTES:
            raise error(errors.TRACE_FORMAT_INVALID, f"{what}: a {length}-byte frame at byte {position} exceeds "
                                                       f"the {MAX_FRAME_BYTES}-byte limit", operator=TAPE)
        payload = _read_exact(handle, length, what, position)
        if digest is not None:
            digest.update(head)
            digest.update(payload)
        position += 4 + length
        return payload

    first = next_frame()
    if first is None:
        raise error(errors.TRACE_TRUNCATED, f"{what}: empty segment", operator=TAPE)
    header = cbor_safe.decode(first, code=errors.TRACE_FORMAT_INVALID, what=f"{what} header", operator=TAPE,
                              max_bytes=MAX_FRAME_BYTES, max_depth=2)
    exact_map(header, SEGMENT_HEADER_KEYS, f"{what}: not a {TAPE_FORMAT} segment header", errors.TRACE_FORMAT_INVALID,
              where={"format": TAPE_FORMAT}, operator=TAPE)
    block_size, max_events = (checks.integer(header[name], what, 1, UINT64_MAX, strict=True, message=_SIZES,
                                             fail=partial(error, errors.TRACE_FORMAT_INVALID, operator=TAPE))
                              for name in ("block_size", "max_events"))
    if header["segment_index"] != index or header["first_seq"] != first_seq or header["prev_hash"] != prev_hash:
        raise error(errors.TRACE_CHAIN_MISMATCH, f"{what}: segment header does not continue the chain "
                                                   f"(expected segment {index} from event {first_seq})", operator=TAPE)
    max_items = 64 * block_size + 16
    seq, tail, count, block_index = first_seq, prev_hash, 0, 0
    while True:
        payload = next_frame()
        if payload is None:
            break
        hashes = None
        if matcher is not None and not ended:
            hashes = matcher.match_block(payload, block_index=block_index, block_size=block_size, seq=seq, tail=tail,
                                         room=max_events - count, max_depth=MAX_RECORD_DEPTH, max_items=max_items)
        if hashes is not None:
            seq += len(hashes)
            count += len(hashes)
            tail = hashes[-1]
            yield (tape_fast.block_records(payload) if want_records else None), hashes, ended
            block_index += 1
            continue
        if matcher is not None:
            matcher.strict_blocks += 1
        block = cbor_safe.decode(payload, code=errors.TRACE_FORMAT_INVALID, what=f"{what} block {block_index}",
                                 operator=TAPE, max_bytes=MAX_FRAME_BYTES, max_depth=MAX_RECORD_DEPTH,
                                 max_items=max_items)
        exact_map(block, ("block_index", "records"), f"{what}: block {block_index} is malformed or out of order",
                  errors.TRACE_FORMAT_INVALID, where={"block_index": block_index}, operator=TAPE)
        records = checks.instance(block["records"], what, list, empty=False, max_length=block_size,
                                  fail=partial(error, errors.TRACE_FORMAT_INVALID, operator=TAPE),
                                  message=f"{{name}}: block {block_index} holds 1..{{max_length}} records")
        for record in records:
            label = f"{what} record {seq}"
            check_record(record, label)
            if record["seq"] != seq or record["prev"] != tail:
                raise error(errors.TRACE_CHAIN_MISMATCH, f"{label}: seq or prev does not continue the chain",
                            operator=TAPE)
            _check_order(record, seq, ended, label)
            if record["type"] == "run_end":
                ended = True
            elif record["type"] == "restore":
                ended = False
            tail = record_hash(record)
            seq += 1
            count += 1
            if count > max_events:
                raise error(errors.TRACE_FORMAT_INVALID, f"{what}: more than max_events = {max_events} records",
                            operator=TAPE)
            if matcher is not None:
                matcher.learn(record)
            yield [record], [tail], ended
        block_index += 1
    if count == 0:
        raise error(errors.TRACE_FORMAT_INVALID, f"{what}: a segment holds at least one record", operator=TAPE)


def iter_segment(
    handle,
    what: str,
    *,
    index: int,
    first_seq: int,
    prev_hash: bytes,
    ended: bool,
    digest: Any = None,
    fast: bool = True,
) -> Iterator[tuple[dict, bytes]]:
    """Yield ``(record, record_hash)`` from one segment file, checking everything.

    ``index``, ``first_seq``, ``prev_hash`` and ``ended`` are what the chain so
    far says the segment must continue; ``digest`` (a hashlib object) receives
    every byte read. ``fast=False`` reads every block with the strict reader
    alone (the result and every error are the same; see :mod:`tape_fast`).
    """
    for records, hashes, _ in _segment_chunks(handle, what, index=index, first_seq=first_seq, prev_hash=prev_hash,
                                              ended=ended, digest=digest, matcher=_new_matcher() if fast else None,
                                              want_records=True):
        assert records is not None  # want_records=True
        yield from zip(records, hashes)


def read_tape(
    store_dir: str,
    segments: Iterable[Mapping[str, Any]],
    *,
    on_record: Callable[[dict, bytes], None] | None = None,
    cuts: Mapping[int, Callable[[bytes], None]] | None = None,
    fast: bool = True,
) -> TapeState:
    """Read and check the committed segments ``segments`` (``{path, size,
    sha256, first_seq, event_count}`` in order) under ``store_dir``; return the
    chain's state.

    ``on_record(record, hash)`` sees every record in order (decoding them
    costs time: pass it only when the records are needed).
    ``cuts[n](tail_hash)`` is called when the chain reaches ``n`` events,
    e.g. to compare the tail with a commit certificate. ``fast=False`` reads
    with the strict reader alone (for comparison: same result, same errors).
    """
    state = TapeState()
    matcher = _new_matcher() if fast else None
    cuts = cuts or {}
    cut_counts = sorted(cuts)
    for item in segments:
        index = parse_segment_name(item["path"])
        if index != state.next_segment_index:
            raise error(errors.TRACE_CHAIN_MISMATCH,
                        f"segment {index} follows segment {index - 1 if state.segments else 0}",
                        operator=TAPE)
        digest = hashlib.sha256()
        count = 0
        root_fd = paths.open_root(store_dir)
        try:
            fd = paths.open_regular(root_fd, item["path"])
        finally:
            os.close(root_fd)
        with os.fdopen(fd, "rb") as handle:
            for records, hashes, ended in _segment_chunks(
                handle, item["path"], index=index, first_seq=state.next_seq, prev_hash=state.tail_hash,
                ended=state.ended, digest=digest, matcher=matcher, want_records=on_record is not None,
            ):
                first = state.next_seq
                if first == 0:
                    state.root_hash = hashes[0]
                state.tail_hash = hashes[-1]
                state.next_seq += len(hashes)
                state.ended = ended
                count += len(hashes)
                if on_record is not None:
                    assert records is not None  # want_records=True
                    for record, digest_of_record in zip(records, hashes):
                        on_record(record, digest_of_record)
                at = bisect.bisect_right(cut_counts, first)
                while at < len(cut_counts) and cut_counts[at] <= state.next_seq:
                    cuts[cut_counts[at]](hashes[cut_counts[at] - first - 1])
                    at += 1
            size = handle.tell()
        if (size, digest.digest()) != (item["size"], item["sha256"]) or count != item["event_count"] \
                or item["first_seq"] != state.next_seq - count:
            raise error(errors.TRACE_CHAIN_MISMATCH, f"{item['path']} differs from its commit record "
                                                       "(size, SHA-256 or event count)", operator=TAPE)
        state.segments.append(Segment(index, item["first_seq"], count, size, item["sha256"]))
    return state


def read_segment_bytes(data: bytes, *, index: int = 1, first_seq: int = 0, prev_hash: bytes = ZERO_HASH,
                       ended: bool = False, fast: bool = True) -> list[dict]:
    """Every record of one segment held in memory (the fuzzing entry point)."""
    import io

    return [record for record, _ in iter_segment(io.BytesIO(data), f"segment={index}", index=index,
                                                 first_seq=first_seq, prev_hash=prev_hash, ended=ended, fast=fast)]
