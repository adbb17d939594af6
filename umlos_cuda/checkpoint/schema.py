"""The checkpoint header (docs/checkpoint-format.md §3), its versions and field types.

The header is a canonical CBOR map with text keys. Schema ``1.0`` has the
contract's required fields, its two optional ones, the migration controls of
§II.F and the fields §II.G/§II.I ask the manifest to hold; ``1.1`` (a MINOR
step) adds one optional field, ``restore_profiles``; ``1.2`` adds optional
files, the registered cursor kinds' ``data/cursors=<kind>.cbor``, and is
written only by a checkpoint that holds one (:mod:`.extensions`), so every
other checkpoint keeps the bytes of 1.1. A reader accepts every
version of its MAJOR up to its own MINOR and refuses newer or other MAJOR
versions (``CHECKPOINT_SCHEMA_UNSUPPORTED``): it cannot check a field it does
not know. Within a version, a missing required field, an unknown field or a
value of the wrong type is ``CHECKPOINT_SCHEMA_INVALID``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import partial
from typing import Any

from .. import checks, distribution, errors
from ..checks import utf8_length as utf8_length  # re-exported: schema.utf8_length in the state and tensor code
from ..hashing import ZERO_HASH as ZERO_HASH  # re-exported: schema.ZERO_HASH in the container and commit code
from ..hashing import hash_canonical
from . import limits, merkle
from .codes import SERIALIZE, error

#: The container format name (the manifest's ``format`` field).
CONTAINER_FORMAT = "UML_OS.Checkpoint.SchemaContract_v1"
#: The version this writer emits, and every version this reader accepts.
SCHEMA_VERSION = "1.1"
SUPPORTED_VERSIONS = ("1.0", "1.1", "1.2")
#: The version a checkpoint holding registered cursor kinds is written as (the first that has them).
CURSOR_KINDS_VERSION = "1.2"
#: ``migration_supported_from`` of each version: the versions a migration leads from.
#: None leads to 1.2: a 1.1 container needs no change to be read, and adding a
#: subsystem's cursors means writing a new checkpoint.
MIGRATION_SOURCES = {"1.0": [], "1.1": ["1.0"], "1.2": []}
#: The versions this writer writes (restore reports them as compatibility level E0).
WRITTEN_VERSIONS = (SCHEMA_VERSION, CURSOR_KINDS_VERSION)
MIGRATION_OPERATOR = errors.CHECKPOINT_MIGRATE_OPERATOR
#: What a migration must preserve (recorded in every header, §II.F migration controls).
MIGRATION_INVARIANTS = (
    "entries_byte_identical",
    "identity_fields_unchanged",
    "checkpoint_merkle_root_unchanged",
)

#: The header's required fields (docs/checkpoint-format.md §3.1), by type.
SEED_TEXT_FIELDS = ("tenant_id", "run_id", "spec_version", "checkpoint_schema_version")
SEED_HASH_FIELDS = (
    "replay_token",
    "manifest_hash",
    "trace_root_hash",
    "sampler_config_hash",
    "tmmu_plan_hash",
    "backend_binary_hash",
    "checkpoint_merkle_root",
    "policy_hash",
    "determinism_profile_hash",
    "dependencies_lock_hash",
    "operator_contracts_root_hash",
    "runtime_env_hash",
    "code_commit_hash",
    "lineage_root_hash",
    "tensors_root_hash",
    "optimizer_state_root_hash",
    "trace_tail_hash_at_checkpoint",
)
SEED_OPTIONAL_HASH_FIELDS = ("dp_accountant_state_root_hash", "checkpoint_hash_prev")
#: Fields §II.G (binding rule) and §II.I (dataset_snapshot_id, artifact_index_hash) require.
BINDING_HASH_FIELDS = ("weights_manifest_hash", "optimizer_manifest_hash", "dataset_snapshot_id", "artifact_index_hash")
BINDING_OPTIONAL_HASH_FIELDS = ("dp_accountant_manifest_hash",)
MIGRATION_FIELDS = ("migration_supported_from", "migration_operator", "migration_invariants")

#: The identity rule (docs/checkpoint-format.md §7): restore aborts on any mismatch of these.
IDENTITY_FIELDS = (
    "tenant_id",
    "run_id",
    "replay_token",
    "trace_root_hash",
    "checkpoint_merkle_root",
    "manifest_hash",
    "sampler_config_hash",
    "tmmu_plan_hash",
    "backend_binary_hash",
    "determinism_profile_hash",
)

#: Restore profiles (docs/checkpoint-format.md §7); "train_full" is always allowed.
RESTORE_PROFILES = ("data_cursors", "eval_params", "shard_subset", "train_full")
FULL_PROFILE = "train_full"

_REQUIRED_1_0 = frozenset(SEED_TEXT_FIELDS + SEED_HASH_FIELDS + ("t",) + BINDING_HASH_FIELDS + MIGRATION_FIELDS)
_OPTIONAL_1_0 = frozenset(SEED_OPTIONAL_HASH_FIELDS + BINDING_OPTIONAL_HASH_FIELDS)
FIELDS = {
    "1.0": (_REQUIRED_1_0, _OPTIONAL_1_0),
    "1.1": (_REQUIRED_1_0, _OPTIONAL_1_0 | {"restore_profiles"}),
    "1.2": (_REQUIRED_1_0, _OPTIONAL_1_0 | {"restore_profiles"}),
}

MAX_TEXT_BYTES = limits.MAX_TEXT_BYTES
_VERSION_RE = re.compile(r"(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})\Z")

# -- identity defaults: what this engine is --------------------------------------------

#: The determinism profile the engine guarantees (docs/spec/nextbatch-v2.md §1: exact uint64, no wrap).
DETERMINISM_PROFILE = {
    "determinism_level": "BITWISE",
    "index_arithmetic": "uint64_exact_no_wrap",
    "prng": "Philox4x32-10",
    "floating_point_in_index_path": False,
    "hash": "SHA-256(CBOR_CANONICAL)",
}
#: The UML_OS operators whose contracts the engine implements.
OPERATOR_CONTRACTS = (
    errors.CHECKPOINT_RESTORE_OPERATOR,
    errors.CHECKPOINT_SERIALIZE_OPERATOR,
    errors.CHECKPOINT_VALIDATE_OPERATOR,
    errors.NEXTBATCH_OPERATOR,
    "UML_OS.Data.SeededBlockPermute_v1",
    "UML_OS.Data.SeededIntraBlockMap_v1",
    "UML_OS.Error.Emit_v1",
    errors.TAPE_OPERATOR,
)
#: The index math every backend reproduces bit for bit (resolutions R1-R10).
BACKEND_CONTRACT = ["umlos_cuda.index_math", "UML_OS.Data.NextBatch_v2", "resolutions R1-R10"]
#: The core requirements whose declared versions ``dependencies_lock_hash``
#: covers: the packages that decide the engine's bits (canonical CBOR, the
#: index math, manifest parsing). Their version ranges come from the installed
#: package metadata (:func:`declared_dependencies`). cryptography and
#: safetensors became core requirements later; adding them would change the
#: hash, hence the bytes, of every checkpoint header (the golden store's too).
LOCKED_DEPENDENCIES = ("cbor2", "numpy", "PyYAML")


def determinism_profile_hash() -> bytes:
    return hash_canonical(DETERMINISM_PROFILE)


def operator_contracts_root_hash() -> bytes:
    return merkle.merkle_root([name.encode("utf-8") for name in OPERATOR_CONTRACTS])


def backend_binary_hash() -> bytes:
    """The index-math contract, not a machine's binary: every backend
    (numpy, native, cupy) emits the same bits, so a checkpoint restores on any."""
    return hash_canonical(BACKEND_CONTRACT)


def declared_dependencies() -> list[str]:
    """The installed distribution's declared requirement of each of
    :data:`LOCKED_DEPENDENCIES` (``["cbor2>=5.6", "numpy>=2.0", "PyYAML>=6.0"]``),
    in that order: what the package declares, not what a machine has installed."""
    declared = distribution.core_requirements()
    if declared is None:
        raise error(errors.CHECKPOINT_STATE_INVALID,
                    f"the {distribution.DISTRIBUTION} package metadata is missing, so dependencies_lock_hash "
                    "cannot be computed: install the package (pip install -e .) or pass "
                    "RunIdentity(dependencies_lock_hash=...)", operator=SERIALIZE)
    by_name = {distribution.normalize(distribution.requirement_name(text)): text for text in declared}
    missing = [name for name in LOCKED_DEPENDENCIES if distribution.normalize(name) not in by_name]
    if missing:
        raise error(errors.CHECKPOINT_STATE_INVALID,
                    f"the installed {distribution.DISTRIBUTION} metadata declares no {', '.join(missing)}; "
                    "reinstall the package (pip install -e .)", operator=SERIALIZE)
    return [by_name[distribution.normalize(name)] for name in LOCKED_DEPENDENCIES]


def dependencies_lock_hash() -> bytes:
    return hash_canonical(declared_dependencies())


def code_commit_hash(version: str) -> bytes:
    return hash_canonical(["umlos-cuda", version])


# -- validation -----------------------------------------------------------------------

#: A header field whose value the checks below read (the record checks the keys).
_ANY = checks.field(checks.anything)


def parse_version(version: Any) -> tuple[int, int]:
    checks.text(version, "checkpoint_schema_version", pattern=_VERSION_RE,
                fail=partial(error, errors.CHECKPOINT_SCHEMA_INVALID), message="{name} {value!r} is not MAJOR.MINOR")
    major, minor = version.split(".")
    return int(major), int(minor)


def check_version(version: Any) -> str:
    """Accept a supported schema version; ``CHECKPOINT_SCHEMA_UNSUPPORTED`` otherwise."""
    major, minor = parse_version(version)
    ours_major, ours_minor = parse_version(SUPPORTED_VERSIONS[-1])
    if major != ours_major or minor > ours_minor or version not in FIELDS:
        raise error(
            errors.CHECKPOINT_SCHEMA_UNSUPPORTED,
            f"checkpoint_schema_version {version} is not readable here (supported: {', '.join(SUPPORTED_VERSIONS)})",
        )
    return version


def check_text(value: Any, what: str, code: str = errors.CHECKPOINT_SCHEMA_INVALID) -> str:
    length = utf8_length(value) if isinstance(value, str) else None
    if (
        length is None
        or not 0 < length <= MAX_TEXT_BYTES
        or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value)
    ):
        raise error(code, f"{what} must be non-empty UTF-8 text of at most {MAX_TEXT_BYTES} bytes without "
                          "control characters or lone surrogates")
    return value


def check_hash(value: Any, what: str, code: str = errors.CHECKPOINT_SCHEMA_INVALID) -> bytes:
    return checks.instance(value, what, bytes, length=32, fail=partial(error, code),
                           message="{name} must be a 32-byte string")


def check_uint64(value: Any, what: str, code: str = errors.CHECKPOINT_SCHEMA_INVALID) -> int:
    """A uint64 field (a plain int, as CBOR holds it); the message never echoes untrusted data."""
    return checks.integer(value, what, fail=partial(error, code), message="{name} must be an integer in [0, 2^64 - 1]",
                          strict=True)


def check_text_list(value: Any, what: str, *, sorted_unique: bool = True) -> list[str]:
    checks.instance(value, what, list, max_length=limits.MAX_TEXT_LIST,
                    fail=partial(error, errors.CHECKPOINT_SCHEMA_INVALID),
                    message="{name} must be a list of at most {max_length} strings")
    for item in value:
        check_text(item, f"{what} item")
    if sorted_unique and value != sorted(set(value)):
        raise error(errors.CHECKPOINT_SCHEMA_INVALID, f"{what} must be sorted and free of repeats")
    return value


def validate_header(header: Any) -> dict[str, Any]:
    """Check every field of a decoded header; return it."""
    invalid = partial(error, errors.CHECKPOINT_SCHEMA_INVALID)
    checks.instance(header, "the header", dict, fail=invalid, message="{name} must be a map")
    if "checkpoint_schema_version" not in header:
        raise invalid("the header lacks checkpoint_schema_version")
    version = check_version(header["checkpoint_schema_version"])
    required, optional = FIELDS[version]
    checks.record(header, dict.fromkeys(sorted(required), _ANY), optional=dict.fromkeys(optional, _ANY), fail=invalid,
                  what="the header", missing="{what} lacks required field(s) {missing}",
                  unknown="{what} has field(s) {unknown} unknown to schema " + version)
    for name in SEED_TEXT_FIELDS + ("migration_operator",):
        check_text(header[name], name)
    for name in SEED_HASH_FIELDS + BINDING_HASH_FIELDS:
        check_hash(header[name], name)
    for name in SEED_OPTIONAL_HASH_FIELDS + BINDING_OPTIONAL_HASH_FIELDS:
        if name in header:
            check_hash(header[name], name)
    check_uint64(header["t"], "t")
    check_text_list(header["migration_supported_from"], "migration_supported_from")
    for item in header["migration_supported_from"]:
        parse_version(item)
    check_text_list(header["migration_invariants"], "migration_invariants")
    if ("dp_accountant_state_root_hash" in header) != ("dp_accountant_manifest_hash" in header):
        raise error(
            errors.CHECKPOINT_SCHEMA_INVALID,
            "dp_accountant_state_root_hash and dp_accountant_manifest_hash are present together or not at all",
        )
    if "restore_profiles" in header:
        profiles = check_text_list(header["restore_profiles"], "restore_profiles")
        unknown_profiles = sorted(set(profiles) - set(RESTORE_PROFILES))
        if unknown_profiles or FULL_PROFILE not in profiles:
            raise error(
                errors.CHECKPOINT_SCHEMA_INVALID,
                f"restore_profiles must include {FULL_PROFILE} and only known profiles ({', '.join(RESTORE_PROFILES)})",
            )
    return header


def has_cursor_kinds(version: str) -> bool:
    """Whether containers of ``version`` may hold ``data/cursors=<kind>.cbor`` files."""
    return parse_version(version) >= parse_version(CURSOR_KINDS_VERSION)


def declared_profiles(header: Mapping[str, Any]) -> tuple[str, ...]:
    """The restore profiles a header permits (schema 1.0: only the full restore)."""
    return tuple(header.get("restore_profiles", [FULL_PROFILE]))
