"""Schema migrations and their signed certificates (docs/checkpoint-format.md §8).

MINOR versions only add optional fields, so a reader reads every older MINOR
of its MAJOR directly. A *migration* rewrites an older container as a newer
version: schema 1.0 -> 1.1 adds ``restore_profiles`` (which partial restores
the checkpoint permits), taken from the migration *policy*. The migration is a
pure function of (source header, policy): the entries are copied byte for byte
(so every Merkle root is unchanged), the header gains the new field, the
version and ``migration_supported_from``, and nothing else changes. Two
conforming implementations therefore produce the same ``target_hash``.

Every migration emits a certificate ``{from_schema_version, to_schema_version,
source_hash, target_hash, migration_operator, migration_policy_hash,
migration_policy}`` signed with Ed25519 (domain ``UML_OS.Checkpoint.Migrate_v1``),
written beside the target as ``<target>.migration.cbor``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .. import errors
from ..hashing import cbor_canonical, hash_canonical
from . import atomic, cbor_safe, schema, signing
from .codes import MIGRATE, error, exact_map
from .container import ContainerReader, encode_manifest, sort_key, verify_container

#: Migration steps this implementation knows: (from, to).
MIGRATIONS = {("1.0", "1.1")}
DEFAULT_POLICY = {"restore_profiles": [schema.FULL_PROFILE]}
CERTIFICATE_SUFFIX = ".migration.cbor"
BODY_KEYS = frozenset({"kind", "from_schema_version", "to_schema_version", "source_hash", "target_hash",
                       "migration_operator", "migration_policy_hash", "migration_policy"})


def _check_policy(policy: Any) -> dict[str, Any]:
    exact_map(policy, ("restore_profiles",), "a 1.0 -> 1.1 policy is {restore_profiles: [...]}",
              errors.CHECKPOINT_MIGRATION_UNSUPPORTED, operator=MIGRATE)
    profiles = sorted(set(policy["restore_profiles"]))
    if schema.FULL_PROFILE not in profiles or set(profiles) - set(schema.RESTORE_PROFILES):
        raise error(errors.CHECKPOINT_MIGRATION_UNSUPPORTED,
                    f"restore_profiles must include {schema.FULL_PROFILE} and only "
                    f"{', '.join(schema.RESTORE_PROFILES)}",
                    operator=MIGRATE)
    return {"restore_profiles": profiles}


def migrated_header(header: Mapping[str, Any], to_version: str, policy: Mapping[str, Any]) -> dict[str, Any]:
    """The target header: a pure function of the source header and the policy."""
    from_version = header["checkpoint_schema_version"]
    if (from_version, to_version) not in MIGRATIONS:
        raise error(errors.CHECKPOINT_MIGRATION_UNSUPPORTED,
                    f"no migration from schema {from_version} to {to_version} "
                    f"(known: {', '.join(f'{a} -> {b}' for a, b in sorted(MIGRATIONS))})", operator=MIGRATE)
    policy = _check_policy(policy)
    target = dict(header)
    target["checkpoint_schema_version"] = to_version
    target["migration_supported_from"] = list(schema.MIGRATION_SOURCES[to_version])
    target["restore_profiles"] = policy["restore_profiles"]
    schema.validate_header(target)
    return target


def migrate_container(
    source: str | os.PathLike[str],
    target: str | os.PathLike[str],
    signing_key: Any,
    *,
    to_version: str = schema.SCHEMA_VERSION,
    policy: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Migrate the container ``source`` into a new container ``target``; write
    and return the signed migration certificate (``target + ".migration.cbor"``)."""
    source, target = os.fspath(source), os.fspath(target)
    policy = _check_policy(DEFAULT_POLICY if policy is None else policy)
    if os.path.lexists(target) or os.path.lexists(target + CERTIFICATE_SUFFIX):
        raise error(errors.CHECKPOINT_STATE_INVALID, f"{target} already exists", operator=MIGRATE)
    verify_container(source)
    with ContainerReader(source) as reader:
        header = migrated_header(reader.header, to_version, policy)
        manifest_bytes = encode_manifest(header, list(reader.info.entries))
        temp = target + ".tmp"
        atomic.remove(temp)
        try:
            atomic.make_dir(temp)
            made = {""}
            for entry in sorted(reader.info.entries, key=lambda e: sort_key(e["path"])):
                parts = entry["path"].split("/")
                for depth in range(1, len(parts)):
                    folder = "/".join(parts[:depth])
                    if folder not in made:
                        atomic.make_dir(os.path.join(temp, folder))
                        made.add(folder)
                atomic.write_file(os.path.join(temp, entry["path"]), reader.read_verified(entry["path"]))
            atomic.write_file(os.path.join(temp, "checkpoint_manifest.cbor"), manifest_bytes)
            for folder in sorted(made, key=len, reverse=True):
                atomic.fsync_dir(os.path.join(temp, folder) if folder else temp)
            info = verify_container(temp)
            atomic.rename(temp, target)
        except BaseException:
            atomic.remove(temp)
            raise
        body = {
            "kind": "migration",
            "from_schema_version": reader.header["checkpoint_schema_version"],
            "to_schema_version": to_version,
            "source_hash": reader.checkpoint_hash,
            "target_hash": info.checkpoint_hash,
            "migration_operator": schema.MIGRATION_OPERATOR,
            "migration_policy_hash": hash_canonical(policy),
            "migration_policy": policy,
        }
    certificate = signing.sign_certificate(signing.MIGRATION_DOMAIN, body, signing_key)
    atomic.write_file_atomic(target + CERTIFICATE_SUFFIX, cbor_canonical(certificate))
    return certificate


def verify_migration(
    certificate_path: str | os.PathLike[str],
    *,
    public_key: Any = None,
    source: str | os.PathLike[str] | None = None,
    target: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Check a migration certificate: signature (against ``public_key`` when
    given), its body, and, when the containers are given, that the source
    hashes to ``source_hash``, the target to ``target_hash``, and that the
    target is exactly what migrating the source under the policy produces."""
    certificate_path = os.fspath(certificate_path)
    try:
        with open(certificate_path, "rb") as handle:
            data = handle.read(1 << 20)
    except OSError as exc:
        raise error(errors.CHECKPOINT_NOT_FOUND, f"cannot read {certificate_path}: {exc.strerror}",
                    operator=MIGRATE) from None
    certificate = cbor_safe.decode(data, what=os.path.basename(certificate_path), max_depth=4)
    trusted = signing.parse_public_key(public_key) if public_key is not None else None
    body = signing.check_certificate(signing.MIGRATION_DOMAIN, certificate, certificate_path, trusted)
    exact_map(body, BODY_KEYS, f"{certificate_path}: not a migration certificate body",
              errors.CHECKPOINT_SCHEMA_INVALID, operator=MIGRATE,
              where={"kind": "migration", "migration_operator": schema.MIGRATION_OPERATOR})
    policy = _check_policy(body["migration_policy"])
    if hash_canonical(policy) != body["migration_policy_hash"]:
        raise error(errors.CHECKPOINT_BINDING_MISMATCH, "migration_policy_hash does not match the policy",
                    operator=MIGRATE)
    source_info = verify_container(source) if source is not None else None
    if source_info is not None and source_info.checkpoint_hash != body["source_hash"]:
        raise error(errors.CHECKPOINT_BINDING_MISMATCH, "the source container is not the certified source",
                    operator=MIGRATE)
    if target is not None:
        target_info = verify_container(target)
        if target_info.checkpoint_hash != body["target_hash"]:
            raise error(errors.CHECKPOINT_BINDING_MISMATCH, "the target container is not the certified target",
                        operator=MIGRATE)
        if source_info is not None:
            expected = migrated_header(source_info.header, body["to_schema_version"], policy)
            if hash_canonical(expected) != body["target_hash"] or target_info.entries != source_info.entries:
                raise error(errors.CHECKPOINT_BINDING_MISMATCH,
                            "the target is not what migrating the source under the policy produces", operator=MIGRATE)
    return body
