"""R2 canonical CBOR, R3 manifests (defaults, hash, replay token, loading), R4
epoch seeds, R9 metadata hashes and the cursor's CBOR form."""

from __future__ import annotations

import json

import cbor2
import pytest
import yaml
from hypothesis import given, strategies as st

import oracle
import umlos_cuda as uc
from nbcases import raw_manifest
from umlos_cuda import errors
from umlos_cuda.epoch import epoch_seed, philox_key_words
from umlos_cuda.hashing import cbor_canonical, hash_canonical
from umlos_cuda.nextbatch import data_replay_t, sampler_config_hash

R9_SELF_CHECK = "fd98df5908735429e5bc7ee2e4bffd7a4d91987c51c80697f112512562ecd90b"


def test_r9_self_check_hash():
    mode = "SHUFFLE_WITHOUT_REPLACEMENT_BLOCK_AFFINE_V1"
    assert sampler_config_hash(mode, 1048576, False).hex() == R9_SELF_CHECK
    assert oracle.sampler_config_hash(mode, 1048576, False).hex() == R9_SELF_CHECK


def test_r9_self_check_through_next_batch():
    batch = uc.next_batch(uc.Manifest.from_dict(raw_manifest(100)), "train", backend="numpy")
    assert batch.metadata["sampler_config_hash"] == R9_SELF_CHECK
    assert batch.metadata["sampling_mode"] == "SHUFFLE_WITHOUT_REPLACEMENT_BLOCK_AFFINE_V1"


@pytest.mark.parametrize("mode", ["SHUFFLE_WITHOUT_REPLACEMENT_BLOCK_AFFINE_V1", "SEQUENTIAL_V1"])
@pytest.mark.parametrize("block_size", [1, 4096, 1048576, 2**64 - 1])
@pytest.mark.parametrize("drop_last", [False, True])
def test_sampler_config_hash_matches_oracle(mode, block_size, drop_last):
    assert sampler_config_hash(mode, block_size, drop_last) == oracle.sampler_config_hash(mode, block_size, drop_last)


def test_cbor_canonical_bytes():
    """R2: text keys sorted canonically (length first), unsigned ints, byte strings, booleans."""
    value = {"global_index": 2**64 - 1, "epoch": 1, "b": b"\x00\x01", "f": False}
    expected = (
        b"\xa4"
        + b"\x61b" + b"\x42\x00\x01"
        + b"\x61f" + b"\xf4"
        + b"\x65epoch" + b"\x01"
        + b"\x6cglobal_index" + b"\x1b" + b"\xff" * 8
    )
    assert cbor_canonical(value) == expected


# ----------------------------------------------------------------- manifests
STATED_DEFAULTS = {"spec_version": "UML_OS-v3.8-OS", "seed": 0,
                   "data": {"sampler_block_size": 1048576, "drop_last": False}}


@pytest.mark.parametrize(
    "omit",
    [(), ("spec_version",), ("seed",), ("data.sampler_block_size",), ("data.drop_last",), ("data",),
     ("spec_version", "seed", "data")],
)
def test_defaults_hash_the_same_stated_or_omitted(omit):
    stated = raw_manifest(1000, global_batch_size=8)
    stated.update(json.loads(json.dumps(STATED_DEFAULTS)))
    partial = json.loads(json.dumps(stated))
    for name in omit:
        if "." in name:
            outer, inner = name.split(".")
            del partial[outer][inner]
        else:
            del partial[name]
    a, b = uc.Manifest.from_dict(stated), uc.Manifest.from_dict(partial)
    assert a.hash == b.hash and a.replay_token == b.replay_token
    assert a.hash == oracle.manifest_hash(partial)
    assert a.canonical == b.canonical


def test_data_null_is_the_same_as_omitted():
    with_null = raw_manifest(10, data=None)
    assert uc.Manifest.from_dict(with_null).hash == uc.Manifest.from_dict(raw_manifest(10)).hash


@pytest.mark.parametrize(
    "change",
    [{"seed": 1}, {"spec_version": "other"}, {"global_batch_size": 16}, {"data": {"drop_last": True}},
     {"data": {"sampler_block_size": 4096}}, {"extra": {"field": [1, 2]}}, {"policy": {"p": 1}}, {"env": {"e": 1}}],
)
def test_every_field_changes_the_manifest_hash(change):
    base = uc.Manifest.from_dict(raw_manifest(1000, global_batch_size=8))
    assert uc.Manifest.from_dict({**raw_manifest(1000, global_batch_size=8), **change}).hash != base.hash


def test_replay_token_depends_on_declared_policy_env_seed_version_only():
    base = raw_manifest(1000)
    token = uc.Manifest.from_dict(base).replay_token
    # Fields outside (spec_version, policy, env, seed) leave the token alone ...
    assert uc.Manifest.from_dict({**base, "global_batch_size": 48}).replay_token == token
    # ... and each of those four moves it.
    for change in ({"seed": 1}, {"spec_version": "X"}, {"policy": {"a": 1}}, {"env": {"cuda": "12.4"}}):
        changed = {**base, **change}
        assert uc.Manifest.from_dict(changed).replay_token != token
        assert uc.Manifest.from_dict(changed).replay_token == oracle.replay_token(changed)
    # An empty policy is the default policy.
    assert uc.Manifest.from_dict({**base, "policy": {}}).replay_token == token


def test_replay_token_bytes_spelled_out():
    raw = raw_manifest(5, seed=2**64 - 1, policy={"p": 1}, env={"e": "x"})
    expected = oracle.sha256(
        b"UML_OS-v3.8-OS"
        + oracle.sha256(cbor2.dumps({"p": 1}, canonical=True))
        + oracle.sha256(cbor2.dumps({"e": "x"}, canonical=True))
        + b"\xff" * 8
    )
    assert uc.Manifest.from_dict(raw).replay_token == expected


json_scalars = st.one_of(
    st.integers(-(2**63), 2**64 - 1), st.text(max_size=8), st.booleans(), st.none(),
    st.floats(allow_nan=False, allow_infinity=False),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(st.text(max_size=6), children, max_size=4)),
    max_leaves=12,
)
json_maps = st.dictionaries(st.text(max_size=6), json_values, max_size=4)


@given(
    n=st.integers(0, 2**64 - 1), g=st.integers(0, 2**64 - 1), seed=st.integers(0, 2**64 - 1),
    block_size=st.one_of(st.none(), st.integers(0, 2**64 - 1)), drop_last=st.one_of(st.none(), st.booleans()),
    policy=st.one_of(st.none(), json_maps), env=st.one_of(st.none(), json_maps),
    extra=st.one_of(st.none(), st.dictionaries(st.sampled_from(["notes", "owner", "tags"]), json_values, max_size=2)),
)
def test_manifest_hash_and_token_match_oracle(n, g, seed, block_size, drop_last, policy, env, extra):
    raw = raw_manifest(n, block_size, g, seed, drop_last)
    for name, value in (("policy", policy), ("env", env), ("extra", extra)):
        if value is not None:
            raw[name] = value
    manifest = uc.Manifest.from_dict(raw)
    assert manifest.hash == oracle.manifest_hash(raw)
    assert manifest.replay_token == oracle.replay_token(raw)
    assert len(manifest.hash) == len(manifest.replay_token) == 32


@given(st.binary(min_size=32, max_size=32), st.binary(min_size=32, max_size=32), st.text(max_size=10),
       st.integers(0, 2**64 - 1))
def test_epoch_seed_and_key_words_match_oracle(token, m_hash, key, epoch):
    seed16 = epoch_seed(token, m_hash, key, epoch)
    assert seed16 == oracle.epoch_seed(token, m_hash, key, epoch)
    (w0, w1), w2, w3 = philox_key_words(seed16)
    assert (w0, w1, w2, w3) == oracle.seed_words(seed16)


@given(st.binary(min_size=32, max_size=32), st.text(max_size=10), st.integers(0, 2**64 - 1),
       st.integers(0, 2**64 - 1), st.integers(1, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_data_replay_t_matches_oracle(token, key, epoch, position, world_size, rank):
    assert data_replay_t(token, key, epoch, position, world_size, rank) == oracle.data_replay_t(
        token, key, epoch, position, world_size, rank
    )


# ----------------------------------------------------------------- loading
DEMO = {
    "spec_version": "UML_OS-v3.8-OS",
    "seed": 2**64 - 1,
    "global_batch_size": 4096,
    "data": {"sampler_block_size": 1048576, "drop_last": False},
    "datasets": {"train": {"id": "c", "version": "1", "hash": "sha256:00", "cardinality": 10**9}},
    "policy": {"precision": "fp32"},
}


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".json"])
def test_yaml_and_json_files_load_to_the_same_manifest(tmp_path, suffix):
    path = tmp_path / f"run{suffix}"
    path.write_text(json.dumps(DEMO) if suffix == ".json" else yaml.safe_dump(DEMO))
    loaded = uc.Manifest.load(path)
    assert loaded.hash == uc.Manifest.from_dict(DEMO).hash == oracle.manifest_hash(DEMO)
    assert loaded.replay_token == oracle.replay_token(DEMO)
    assert loaded.global_batch_size == 4096 and loaded.seed == 2**64 - 1


def test_yaml_written_by_hand_loads(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "global_batch_size: 24\n"
        "datasets:\n"
        "  train: {id: x, version: '1', hash: h, cardinality: 1000}\n"
    )
    assert uc.Manifest.load(path).hash == oracle.manifest_hash(
        {"global_batch_size": 24, "datasets": {"train": {"id": "x", "version": "1", "hash": "h", "cardinality": 1000}}}
    )


@pytest.mark.parametrize(
    "text,suffix",
    [("{not json", ".json"), ("a: [1, 2", ".yaml"), ("- 1\n- 2\n", ".yaml"), ("global_batch_size: 3\n", ".yaml")],
)
def test_bad_files_are_invalid_manifest(tmp_path, text, suffix):
    path = tmp_path / f"bad{suffix}"
    path.write_text(text)
    with pytest.raises(uc.UmlosError) as info:
        uc.Manifest.load(path)
    assert info.value.code == errors.INVALID_MANIFEST


def test_missing_file_is_invalid_manifest(tmp_path):
    with pytest.raises(uc.UmlosError) as info:
        uc.Manifest.load(tmp_path / "absent.yaml")
    assert info.value.code == errors.INVALID_MANIFEST


def test_explicit_replay_token_replaces_the_derived_one():
    raw = raw_manifest(1000, block_size=16)
    manifest = uc.Manifest.from_dict(raw)
    token = bytes(range(32))
    batch = uc.next_batch(manifest, "train", replay_token=token, backend="numpy")
    expected = oracle.Oracle(raw, token=token).next_batch("train", 1, 0, "train", 0, 0)
    assert batch.indices.tolist() == expected.indices
    assert batch.metadata["data_replay_t"] == expected.data_replay_t
    derived = uc.next_batch(manifest, "train", backend="numpy")
    assert derived.indices.tolist() != batch.indices.tolist()
    same = uc.next_batch(manifest, "train", replay_token=manifest.replay_token, backend="numpy")
    assert same.indices.tolist() == derived.indices.tolist()


# ----------------------------------------------------------------- cursor CBOR
def test_cursor_cbor_bytes_are_canonical():
    assert uc.Cursor(1, 2).to_cbor() == b"\xa2\x65epoch\x01\x6cglobal_index\x02"
    assert uc.Cursor(1, 2).to_cbor() == cbor2.dumps({"global_index": 2, "epoch": 1}, canonical=True)


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_cursor_round_trips_through_cbor(epoch, index):
    cursor = uc.Cursor(epoch, index)
    assert uc.Cursor.from_cbor(cursor.to_cbor()) == cursor
    assert uc.Cursor.from_dict(cursor.to_dict()) == cursor


@pytest.mark.parametrize(
    "data",
    [b"", b"\xff\xff", cbor2.dumps([1, 2]), cbor2.dumps({"epoch": 1}), cbor2.dumps({"epoch": -1, "global_index": 0}),
     cbor2.dumps({"epoch": 1, "global_index": 2, "x": 3}), cbor2.dumps({"epoch": 1.0, "global_index": 0}),
     cbor2.dumps({"epoch": 2**64, "global_index": 0}), b"\xa2" + b"\x00" * 2000],
)
def test_bad_cursor_cbor_is_invalid_cursor(data):
    with pytest.raises(uc.UmlosError) as info:
        uc.Cursor.from_cbor(data)
    assert info.value.code == errors.INVALID_CURSOR


def test_hash_canonical_is_sha256_of_cbor():
    value = ["x", 1, b"\x00", True]
    assert hash_canonical(value) == oracle.sha256(cbor2.dumps(value, canonical=True))
