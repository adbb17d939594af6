"""Containers: layout, header, hashes, Merkle roots, round trip, restore profiles,
the identity rule, the chain, schema versions and migration (docs/checkpoint-format.md §2 to §8)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import umlos_cuda as uc
from umlos_cuda import errors
from umlos_cuda.checkpoint import (
    IDENTITY_FIELDS,
    ContainerReader,
    restore_checkpoint,
    save_checkpoint,
    verify_container,
)
from umlos_cuda.checkpoint import merkle, paths, schema
from umlos_cuda.checkpoint.container import NO_TRACE, parse_manifest
from umlos_cuda.checkpoint.migrate import migrate_container, verify_migration
from umlos_cuda.hashing import cbor_canonical, hash_canonical, sha256
from test_checkpoint_support import KEY, OTHER_KEY, files_of, identity, manifest, state, write_container

SEED_REQUIRED = {
    "tenant_id", "run_id", "spec_version", "checkpoint_schema_version", "replay_token", "t", "manifest_hash",
    "trace_root_hash", "sampler_config_hash", "tmmu_plan_hash", "backend_binary_hash", "checkpoint_merkle_root",
    "policy_hash", "determinism_profile_hash", "dependencies_lock_hash", "operator_contracts_root_hash",
    "runtime_env_hash", "code_commit_hash", "lineage_root_hash", "tensors_root_hash", "optimizer_state_root_hash",
    "trace_tail_hash_at_checkpoint",
}


def expect_code(code, function, *args, **kwargs):
    with pytest.raises(uc.UmlosError) as info:
        function(*args, **kwargs)
    assert info.value.code == code, f"expected {code}, got {info.value.code}: {info.value.message}"
    return info.value


@pytest.fixture()
def container(tmp_path):
    path = str(tmp_path / "ckpt")
    info = write_container(path)
    return path, info


def test_layout_is_the_documented_one(container):
    path, _ = container
    assert files_of(path) == [
        "artifacts/array=loss_hist.bin",
        "artifacts/artifact_index.cbor",
        "artifacts/blob=rng_torch.bin",
        "checkpoint_manifest.cbor",
        "data/cursors.cbor",
        "data/manifest.cbor",
        "dp/accountant_state.cbor",
        "optimizer/rank=0/state.bin",
        "optimizer/rank=1/state.bin",
        "tensors/rank=0/shard=0.bin",
        "tensors/rank=0/shard=1.bin",
        "tensors/rank=1/shard=0.bin",
        "tensors/rank=1/shard=1.bin",
        "tmmu/plan.cbor",
        "trace/link.cbor",
    ]


def test_header_has_every_required_field_and_hash_is_sha256_of_header(container):
    path, info = container
    header = info.header
    assert set(header) >= SEED_REQUIRED
    assert {"dp_accountant_state_root_hash", "dataset_snapshot_id", "artifact_index_hash",
            "migration_supported_from", "migration_operator", "migration_invariants"} <= set(header)
    assert info.checkpoint_hash == sha256(cbor_canonical(header))
    raw = Path(os.path.join(path, "checkpoint_manifest.cbor")).read_bytes()
    assert raw == cbor_canonical({"format": schema.CONTAINER_FORMAT, "header": header, "entries": info.entries,
                                  "checkpoint_hash": info.checkpoint_hash})
    m = manifest()
    assert header["manifest_hash"] == m.hash and header["replay_token"] == m.replay_token
    assert header["policy_hash"] == m.policy_hash and header["runtime_env_hash"] == m.env_manifest_hash
    assert header["sampler_config_hash"] == uc.sampler_config_hash(
        "SHUFFLE_WITHOUT_REPLACEMENT_BLOCK_AFFINE_V1", 64, False)
    assert header["checkpoint_schema_version"] == schema.SCHEMA_VERSION == "1.1"


def test_entries_hash_the_files_and_merkle_roots_follow_rfc6962(container):
    path, info = container
    for entry in info.entries:
        data = Path(os.path.join(path, entry["path"])).read_bytes()
        assert (len(data), sha256(data)) == (entry["size"], entry["sha256"])
    leaves = [cbor_canonical([e["path"], e["size"], e["sha256"]]) for e in info.entries]
    assert info.header["checkpoint_merkle_root"] == merkle.merkle_root(leaves)
    tensors = [e for e in info.entries if e["path"].startswith("tensors/")]
    assert info.header["tensors_root_hash"] == merkle.entries_root(tensors)
    assert info.header["weights_manifest_hash"] == hash_canonical(tensors)
    dp = [e for e in info.entries if e["path"].startswith("dp/")]
    assert info.header["dp_accountant_state_root_hash"] == merkle.entries_root(dp)
    assert info.header["tmmu_plan_hash"] == sha256(Path(os.path.join(path, "tmmu/plan.cbor")).read_bytes())
    assert info.header["artifact_index_hash"] == sha256(
        Path(os.path.join(path, "artifacts/artifact_index.cbor")).read_bytes())


def test_merkle_tree_by_hand():
    leaf = lambda d: sha256(b"\x00" + d)  # noqa: E731
    node = lambda a, b: sha256(b"\x01" + a + b)  # noqa: E731
    d = [bytes([i]) for i in range(5)]
    assert merkle.merkle_root([]) == sha256(b"")
    assert merkle.merkle_root(d[:1]) == leaf(d[0])
    assert merkle.merkle_root(d[:3]) == node(node(leaf(d[0]), leaf(d[1])), leaf(d[2]))
    # RFC 6962: split at the largest power of two below n, never duplicate a node.
    assert merkle.merkle_root(d) == node(node(node(leaf(d[0]), leaf(d[1])), node(leaf(d[2]), leaf(d[3]))), leaf(d[4]))
    assert merkle.merkle_root(d[:3]) != merkle.merkle_root(d[:3] + d[2:3])


def test_writing_is_deterministic(tmp_path):
    a = write_container(str(tmp_path / "a"))
    b = write_container(str(tmp_path / "b"))
    assert a.checkpoint_hash == b.checkpoint_hash
    for rel in files_of(str(tmp_path / "a")):
        assert Path(tmp_path / "a" / rel).read_bytes() == Path(tmp_path / "b" / rel).read_bytes()
    c = write_container(str(tmp_path / "c"), t=4)
    assert c.checkpoint_hash != a.checkpoint_hash


def test_full_restore_round_trips_everything(container):
    path, info = container
    restored = restore_checkpoint(path, expect=identity().expected())
    original = state(3)
    assert restored.restore_profile_id == "train_full" and restored.t == 3
    assert restored.checkpoint_hash == info.checkpoint_hash
    assert restored.cursors == original.cursor_map()
    for rank, shards in original.tensors.items():
        assert len(restored.tensors[rank]) == len(shards)
        for got, want in zip(restored.tensors[rank], shards):
            assert set(got) == set(want)
            for name in want:
                assert got[name].dtype == want[name].dtype and np.array_equal(got[name], want[name])
    for rank, arrays in original.optimizer.items():
        assert np.array_equal(restored.optimizer[rank]["momentum"], arrays["momentum"])
    assert restored.dp_enabled is True and restored.dp_accountant == original.dp_accountant
    assert restored.tmmu_plan == original.tmmu_plan
    assert restored.user_state["rng_torch"] == original.user_state["rng_torch"]
    assert np.array_equal(restored.user_state["loss_hist"], original.user_state["loss_hist"])
    assert restored.manifest.hash == manifest().hash
    assert restored.trace_link.event_count == 5
    assert restored.report["checkpoint_size_bytes"] == sum(os.path.getsize(os.path.join(path, f))
                                                           for f in files_of(path))


def test_restored_cursor_continues_nextbatch_identically(tmp_path):
    """A restored cursor gives the identical continuation, mid-epoch and on any
    world size (docs/spec/nextbatch-v2.md §4.3)."""
    m = manifest()
    cursor = uc.Cursor()
    for _ in range(37):
        cursor = uc.next_batch(m, "train", 1, 0, cursor=cursor, backend="numpy").cursor
    save_checkpoint(str(tmp_path / "c"), identity(), state(37, cursor))
    restored = restore_checkpoint(str(tmp_path / "c"), profile="data_cursors").cursors["train"]
    assert restored == cursor
    a, b = cursor, restored
    for _ in range(200):  # across the epoch boundary at step 125
        ref = uc.next_batch(m, "train", 1, 0, cursor=a, backend="numpy")
        parts = [uc.next_batch(m, "train", 4, r, cursor=b, backend="numpy") for r in range(4)]
        assert np.array_equal(ref.indices, np.concatenate([p.indices for p in parts]))
        a, b = ref.cursor, parts[0].cursor
        assert a == b


def test_dp_disabled_omits_the_optional_fields(tmp_path):
    info = save_checkpoint(str(tmp_path / "c"), identity(), state(1, dp=False))
    assert "dp_accountant_state_root_hash" not in info.header and "dp_accountant_manifest_hash" not in info.header
    assert "checkpoint_hash_prev" not in info.header
    restored = restore_checkpoint(str(tmp_path / "c"))
    assert restored.dp_enabled is False and restored.dp_accountant is None
    assert info.header["trace_root_hash"] == schema.ZERO_HASH == NO_TRACE.trace_tail_hash


def test_partial_profiles_read_only_what_they_declare(container):
    path, _ = container
    for rel in files_of(path):  # a node that fetched only rank 1's shards and the small files
        if rel.startswith(("tensors/rank=0", "optimizer/rank=0")):
            os.unlink(os.path.join(path, rel))
    expect_code(errors.CHECKPOINT_FILE_MISSING, verify_container, path)
    expect_code(errors.CHECKPOINT_FILE_MISSING, restore_checkpoint, path)
    subset = restore_checkpoint(path, profile="shard_subset", ranks=[1])
    assert subset.restore_profile_id == "shard_subset" and set(subset.tensors) == {1} and set(subset.optimizer) == {1}
    assert subset.cursors == state(3).cursor_map()
    cursors = restore_checkpoint(path, profile="data_cursors")
    assert cursors.cursors == state(3).cursor_map() and cursors.tensors == {}
    expect_code(errors.CHECKPOINT_FILE_MISSING, restore_checkpoint, path, profile="eval_params")
    expect_code(errors.CHECKPOINT_FILE_MISSING, restore_checkpoint, path, profile="shard_subset", ranks=[0])
    expect_code(errors.CHECKPOINT_RESTORE_PROFILE, restore_checkpoint, path, profile="shard_subset", ranks=[7])
    expect_code(errors.CHECKPOINT_RESTORE_PROFILE, restore_checkpoint, path, profile="shard_subset")
    expect_code(errors.CHECKPOINT_RESTORE_PROFILE, restore_checkpoint, path, profile="nope")


def test_eval_profile_returns_params_only(container):
    path, _ = container
    restored = restore_checkpoint(path, profile="eval_params")
    assert set(restored.tensors) == {0, 1} and restored.optimizer == {} and restored.cursors == {}
    assert restored.manifest.hash == manifest().hash


def test_undeclared_partial_profile_is_refused(tmp_path):
    path = str(tmp_path / "c")
    write_container(path, restore_profiles=["train_full", "eval_params"])
    restore_checkpoint(path, profile="eval_params")
    error = expect_code(errors.CHECKPOINT_RESTORE_PROFILE, restore_checkpoint, path, profile="data_cursors")
    assert "not declared" in error.message


@pytest.mark.parametrize("field", IDENTITY_FIELDS)
def test_identity_rule_aborts_on_each_field(container, field):
    path, info = container
    expected = {name: info.header[name] for name in IDENTITY_FIELDS}
    restore_checkpoint(path, profile="data_cursors", expect=expected)
    wrong = dict(expected)
    wrong[field] = "other" if isinstance(expected[field], str) else bytes(32 - 1) + b"\x01"
    error = expect_code(errors.CHECKPOINT_IDENTITY_MISMATCH, restore_checkpoint, path, expect=wrong)
    assert error.record["diagnostics"]["field"] == field
    assert error.record["failure_operator"] == errors.CHECKPOINT_RESTORE_OPERATOR


def test_identity_from_another_manifest_or_stage_is_refused(container):
    path, _ = container
    other_seed = identity(manifest=manifest(seed=8)).expected()
    error = expect_code(errors.CHECKPOINT_IDENTITY_MISMATCH, restore_checkpoint, path, expect=other_seed)
    assert error.record["diagnostics"]["field"] in ("replay_token", "manifest_hash")
    eval_stage = identity(stage="eval").expected()
    error = expect_code(errors.CHECKPOINT_IDENTITY_MISMATCH, restore_checkpoint, path, expect=eval_stage)
    assert error.record["diagnostics"]["field"] == "sampler_config_hash"
    expect_code(errors.CHECKPOINT_STATE_INVALID, restore_checkpoint, path, expect={"t": 3})


def test_chain_check(tmp_path):
    first = write_container(str(tmp_path / "1"))
    second = write_container(str(tmp_path / "2"), t=4, prev=first.checkpoint_hash)
    assert second.header["checkpoint_hash_prev"] == first.checkpoint_hash
    restore_checkpoint(str(tmp_path / "2"), expect_prev=first.checkpoint_hash)
    restore_checkpoint(str(tmp_path / "1"), expect_prev=None)
    expect_code(errors.CHECKPOINT_CHAIN_MISMATCH, restore_checkpoint, str(tmp_path / "2"), expect_prev=None)
    expect_code(errors.CHECKPOINT_CHAIN_MISMATCH, restore_checkpoint, str(tmp_path / "1"),
                expect_prev=second.checkpoint_hash)


def test_schema_versions(tmp_path):
    old = save_checkpoint(str(tmp_path / "v10"), identity(), state(2), schema_version="1.0")
    assert "restore_profiles" not in old.header and old.header["migration_supported_from"] == []
    restored = restore_checkpoint(str(tmp_path / "v10"))  # MINOR: 1.0 reads directly
    assert restored.report["schema_version"] == "1.0"
    expect_code(errors.CHECKPOINT_RESTORE_PROFILE, restore_checkpoint, str(tmp_path / "v10"), profile="data_cursors")
    assert schema.check_version("1.2") == "1.2"  # the version of checkpoints with registered cursor kinds
    for version, code in (("1.3", errors.CHECKPOINT_SCHEMA_UNSUPPORTED), ("2.0", errors.CHECKPOINT_SCHEMA_UNSUPPORTED),
                          ("1", errors.CHECKPOINT_SCHEMA_INVALID), (11, errors.CHECKPOINT_SCHEMA_INVALID)):
        expect_code(code, schema.check_version, version)


def test_1_0_header_with_a_1_1_field_is_refused(tmp_path):
    old = save_checkpoint(str(tmp_path / "v10"), identity(), state(2), schema_version="1.0")
    header = dict(old.header, restore_profiles=["train_full"])
    expect_code(errors.CHECKPOINT_SCHEMA_INVALID, schema.validate_header, header)
    missing = {k: v for k, v in old.header.items() if k != "tmmu_plan_hash"}
    expect_code(errors.CHECKPOINT_SCHEMA_INVALID, schema.validate_header, missing)
    expect_code(errors.CHECKPOINT_SCHEMA_INVALID, schema.validate_header, dict(old.header, t=-1))
    expect_code(errors.CHECKPOINT_SCHEMA_INVALID, schema.validate_header, dict(old.header, manifest_hash=b"x" * 31))


def test_migration_1_0_to_1_1(tmp_path):
    from umlos_cuda.checkpoint import signing

    source, target = str(tmp_path / "v10"), str(tmp_path / "v11")
    old = save_checkpoint(source, identity(), state(2), schema_version="1.0")
    policy = {"restore_profiles": ["data_cursors", "train_full"]}
    certificate = migrate_container(source, target, KEY, policy=policy)
    body = certificate["body"]
    new = verify_container(target)
    assert new.header["checkpoint_schema_version"] == "1.1"
    assert new.header["restore_profiles"] == ["data_cursors", "train_full"]
    assert new.header["checkpoint_merkle_root"] == old.header["checkpoint_merkle_root"]
    assert {k: v for k, v in new.header.items() if k not in ("checkpoint_schema_version", "restore_profiles",
                                                              "migration_supported_from")} == \
        {k: v for k, v in old.header.items() if k != "checkpoint_schema_version" and k != "migration_supported_from"}
    assert body["source_hash"] == old.checkpoint_hash and body["target_hash"] == new.checkpoint_hash
    assert body["migration_policy_hash"] == hash_canonical(policy)
    assert {"from_schema_version", "to_schema_version", "source_hash", "target_hash", "migration_operator",
            "migration_policy_hash"} <= set(body)
    assert restore_checkpoint(target, profile="data_cursors").cursors == state(2).cursor_map()
    verify_migration(target + ".migration.cbor", public_key=signing.public_key_bytes(KEY), source=source, target=target)
    expect_code(errors.CHECKPOINT_SIGNATURE_INVALID, verify_migration, target + ".migration.cbor",
                public_key=signing.public_key_bytes(OTHER_KEY))
    # Migration output hashes identically: a second run produces the same bytes.
    again = migrate_container(source, str(tmp_path / "again"), KEY, policy=policy)
    assert again == certificate
    again_file = Path(str(tmp_path / "again") + ".migration.cbor")
    assert Path(target + ".migration.cbor").read_bytes() == again_file.read_bytes()
    expect_code(errors.CHECKPOINT_MIGRATION_UNSUPPORTED, migrate_container, target, str(tmp_path / "x"), KEY)
    expect_code(errors.CHECKPOINT_MIGRATION_UNSUPPORTED, migrate_container, source, str(tmp_path / "y"), KEY,
                policy={"restore_profiles": ["eval_params"]})
    # A target that is not the migration of the source is caught.
    other = str(tmp_path / "other")
    migrate_container(source, other, KEY, policy={"restore_profiles": ["train_full"]})
    expect_code(errors.CHECKPOINT_BINDING_MISMATCH, verify_migration, target + ".migration.cbor", source=source,
                target=other)


def test_containers_are_never_overwritten(container):
    path, _ = container
    expect_code(errors.CHECKPOINT_STATE_INVALID, write_container, path)


@pytest.mark.parametrize(
    "bad",
    [
        {"cursors": {"missing": uc.Cursor()}},
        {"cursors": {"train": {"epoch": -1, "global_index": 0}}},
        {"tensors": {0: {"w": np.zeros(2)}}},
        {"tensors": {-1: [{"w": np.zeros(2)}]}},
        {"tensors": {0: [{"w": [1, 2]}]}},
        {"tensors": {0: [{"w": np.zeros(2, dtype=np.complex64)}]}},
        {"tensors": {0: [{"__metadata__": np.zeros(2)}]}},
        {"optimizer": {0: {"": np.zeros(1)}}},
        {"user_state": {"../escape": b"x"}},
        {"user_state": {".hidden": b"x"}},
        {"user_state": {"a/b": b"x"}},
        {"user_state": {"Name": b"x", "name": b"y"}},
        {"user_state": {"obj": object()}},
        {"dp_accountant": {"x": float("nan")}},
        {"tmmu_plan": {1: "non-text key"}},
        {"tmmu_plan": {"set": {1, 2}}},
        {"t": -1},
    ],
)
def test_invalid_state_is_refused_before_anything_is_written(tmp_path, bad):
    base = state(1)
    fields = {"t": base.t, "cursors": base.cursors, "tensors": base.tensors, "optimizer": base.optimizer,
              "dp_accountant": base.dp_accountant, "tmmu_plan": base.tmmu_plan, "user_state": base.user_state}
    fields.update(bad)
    from umlos_cuda.checkpoint import CheckpointState

    path = tmp_path / "c"
    expect_code(errors.CHECKPOINT_STATE_INVALID, save_checkpoint, str(path), identity(), CheckpointState(**fields))
    assert not path.exists() and not (tmp_path / "c.tmp").exists()


def test_run_identity_validation():
    for bad in ({"tenant_id": ""}, {"run_id": "a\nb"}, {"run_id": "x" * 300}, {"stage": "dance"},
                {"replay_token": b"short"}, {"backend_binary_hash": b"x"}, {"manifest": {"global_batch_size": 1}}):
        expect_code(errors.CHECKPOINT_STATE_INVALID, identity, **bad)


def test_path_grammar():
    assert paths.parse_entry_path("tensors/rank=3/shard=12.bin").shard == 12
    assert paths.parse_entry_path("artifacts/blob=rng.bin").name == "rng"
    for bad in ("../x", "/etc/passwd", "tensors/rank=01/shard=0.bin", "tensors/rank=0/shard=0.bin/..",
                "tensors\\rank=0\\shard=0.bin", "tensors//rank=0/shard=0.bin", "checkpoint_manifest.cbor",
                "artifacts/blob=.hidden.bin", "artifacts/blob=a/b.bin", "tensors/rank=4294967296/shard=0.bin",
                "data/cursors.cbor/", "DATA/cursors.cbor", "", 7, "artifacts/blob=x.bin\n"):
        expect_code(errors.CHECKPOINT_PATH_INVALID, paths.parse_entry_path, bad)


def test_symlinks_and_special_files_are_never_followed(container, tmp_path):
    path, _ = container
    outside = tmp_path / "outside.bin"
    shard = os.path.join(path, "tensors/rank=0/shard=0.bin")
    shutil.copy(shard, outside)
    os.unlink(shard)
    os.symlink(outside, shard)  # same bytes, but through a link
    expect_code(errors.CHECKPOINT_UNEXPECTED_FILE, verify_container, path)
    expect_code(errors.CHECKPOINT_UNEXPECTED_FILE, restore_checkpoint, path)
    os.unlink(shard)
    shutil.copy(outside, shard)
    verify_container(path)
    tensors_dir = os.path.join(path, "tensors")
    shutil.move(tensors_dir, tmp_path / "tensors")
    os.symlink(tmp_path / "tensors", tensors_dir)  # a linked folder
    expect_code(errors.CHECKPOINT_UNEXPECTED_FILE, verify_container, path)
    os.unlink(tensors_dir)
    shutil.move(tmp_path / "tensors", tensors_dir)
    fifo = os.path.join(path, "tmmu/plan.cbor")
    os.unlink(fifo)
    os.mkfifo(fifo)  # reading it must not block
    expect_code(errors.CHECKPOINT_UNEXPECTED_FILE, verify_container, path)


def test_inspect_only_reads_the_manifest(container):
    path, info = container
    with ContainerReader(path) as reader:
        assert reader.checkpoint_hash == info.checkpoint_hash
        assert reader.tensor_layout() == {0: 2, 1: 2}
    assert parse_manifest(Path(os.path.join(path, "checkpoint_manifest.cbor")).read_bytes()).header == info.header


def test_missing_container():
    expect_code(errors.CHECKPOINT_NOT_FOUND, verify_container, "/nonexistent/ckpt")


def test_every_checkpoint_code_is_documented():
    """docs/checkpoint-format.md §12 lists exactly the CHECKPOINT_* and TRACE_* codes of errors.py."""
    import re

    doc = Path(os.path.join(os.path.dirname(__file__), "..", "docs", "checkpoint-format.md")).read_text()
    table = doc.split("## 12. Failure codes", 1)[1].split("## 13.", 1)[0]
    documented = set(re.findall(r"^\| `((?:CHECKPOINT|TRACE)_[A-Z_]+)` \|", table, re.M))
    defined = {value for name, value in vars(errors).items()
               if name.startswith(("CHECKPOINT_", "TRACE_")) and not name.endswith("_OPERATOR")}
    assert documented == defined


# -- one definition of each shared constant -------------------------------------------------


def test_shared_constants_have_one_definition():
    """ZERO_HASH, the tape's operator name, the segment-name pattern and the
    uint32 bound are each defined once and imported everywhere else."""
    from umlos_cuda import hashing
    from umlos_cuda.checkpoint import store, tape

    assert schema.ZERO_HASH is hashing.ZERO_HASH and tape.ZERO_HASH is hashing.ZERO_HASH
    assert tape.TAPE_FORMAT is errors.TAPE_OPERATOR and errors.TAPE_OPERATOR in schema.OPERATOR_CONTRACTS
    assert schema.MIGRATION_OPERATOR is errors.CHECKPOINT_MIGRATE_OPERATOR
    assert paths.UINT32_MAX is errors.UINT32_MAX and errors.MAX_WORLD_SIZE == (1 << 32) - 1
    # store listings and tape paths use one pattern: a name one accepts, the other accepts too
    assert tape._SEGMENT_RE.pattern.endswith(store.SEGMENT_FILE_RE.pattern)
    assert tape.parse_segment_name("trace/segment=7.tape") == 7 and store.SEGMENT_FILE_RE.match("segment=7.tape")
    assert not store.SEGMENT_FILE_RE.match("segment=07.tape")


def test_dependencies_lock_hash_reads_the_installed_metadata(monkeypatch):
    """The declared versions come from importlib.metadata, not from a list in the code."""
    from umlos_cuda import distribution

    assert schema.declared_dependencies() == ["cbor2>=5.6", "numpy>=2.0", "PyYAML>=6.0"]
    assert schema.dependencies_lock_hash() == hash_canonical(["cbor2>=5.6", "numpy>=2.0", "PyYAML>=6.0"])
    declared = ["numpy>=2.1", "cbor2>=5.6", "pyyaml>=6.0", "cryptography>=42", 'pytest>=8; extra == "test"']
    monkeypatch.setattr(distribution.metadata, "requires", lambda name: declared)
    assert schema.declared_dependencies() == ["cbor2>=5.6", "numpy>=2.1", "pyyaml>=6.0"]
    assert identity().dependencies_lock_hash == hash_canonical(["cbor2>=5.6", "numpy>=2.1", "pyyaml>=6.0"])


def test_dependencies_lock_hash_without_metadata_names_the_fix(monkeypatch):
    from umlos_cuda import distribution

    def missing(name):
        raise distribution.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(distribution.metadata, "requires", missing)
    error = expect_code(errors.CHECKPOINT_STATE_INVALID, schema.dependencies_lock_hash)
    assert "pip install -e ." in error.message and "dependencies_lock_hash" in error.message
    # a caller that pins the hash needs no metadata
    assert identity(dependencies_lock_hash=bytes(32)).dependencies_lock_hash == bytes(32)
    monkeypatch.setattr(distribution.metadata, "requires", lambda name: ["numpy>=2.0"])
    assert "cbor2, PyYAML" in expect_code(errors.CHECKPOINT_STATE_INVALID, schema.dependencies_lock_hash).message
