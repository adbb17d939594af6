"""One set of rules for writer and reader (docs/checkpoint-format.md §11):
the writer refuses, before anything is written, every state that a reader
would refuse, and verify and restore accept exactly the same containers."""

from __future__ import annotations

import dataclasses
import os
import shutil

import numpy as np
import pytest

import umlos_cuda as uc
from umlos_cuda import errors
from umlos_cuda.checkpoint import (
    CheckpointStore,
    ContainerReader,
    limits,
    restore_checkpoint,
    restore_latest,
    verify_container,
    verify_store,
)
from umlos_cuda.checkpoint import container, paths, tensors
from umlos_cuda.hashing import cbor_canonical
from test_checkpoint_support import DATASET, KEY, files_of, identity, reseal, state, write_container
from test_checkpoint_store import build_store, expect_code, run_steps

# State each of which a reader refuses for one bound of limits.py.
UNRESTORABLE = {
    # 1.1 M floats: more CBOR values than limits.MAX_CBOR_ITEMS in dp/accountant_state.cbor
    "dp_accountant_items": {"dp_accountant": {"epsilon_history": [0.5] * 1_100_000}},
    # a TMMU plan over limits.MAX_SMALL_CBOR_BYTES
    "tmmu_plan_bytes": {"tmmu_plan": {"arena": bytes(limits.MAX_SMALL_CBOR_BYTES)}},
    # more files than limits.MAX_ENTRIES
    "user_state_entries": {"user_state": {f"blob{i}": b"x" for i in range(70_000)}},
    # a safetensors JSON header over limits.MAX_SAFETENSORS_HEADER_BYTES
    "safetensors_header": {"tensors": {0: [{f"{i:05d}" + "w" * 1000: np.zeros(0, np.uint8) for i in range(16_500)}]}},
}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("bounds") / "store")
    build_store(path, commits=1)
    return path


@pytest.fixture()
def store_dir(pristine, tmp_path):
    path = str(tmp_path / "store")
    shutil.copytree(pristine, path)
    return path


@pytest.mark.parametrize("case", sorted(UNRESTORABLE))
def test_the_writer_refuses_state_no_reader_could_restore(store_dir, case):
    before = files_of(store_dir)
    with CheckpointStore.open(store_dir, identity(), KEY) as store:
        restored = store.restore_latest()
        cursor = run_steps(store, restored.cursors[DATASET], 3, 4)
        during = files_of(store_dir)
        bad = dataclasses.replace(state(4, cursor, shards=1, ranks=1), **UNRESTORABLE[case])
        error = expect_code(errors.CHECKPOINT_STATE_INVALID, store.commit, bad)
        assert files_of(store_dir) == during  # nothing was written
        assert "readers" in error.message
        record = store.commit(state(4, cursor))  # the session is still usable
    assert restore_latest(store_dir).t == 4 and verify_store(store_dir)["head"] == record.head
    assert before != files_of(store_dir)


def test_save_checkpoint_refuses_it_too_and_writes_nothing(tmp_path):
    bad = dataclasses.replace(state(1), **UNRESTORABLE["tmmu_plan_bytes"])
    expect_code(errors.CHECKPOINT_STATE_INVALID, uc.checkpoint.save_checkpoint, str(tmp_path / "c"), identity(), bad)
    assert os.listdir(tmp_path) == []


def test_reader_and_writer_take_their_bounds_from_one_module():
    assert container.MAX_SMALL_CBOR_BYTES == limits.MAX_SMALL_CBOR_BYTES
    assert container.MAX_ENTRIES == limits.MAX_ENTRIES
    assert tensors.MAX_HEADER_BYTES == limits.MAX_SAFETENSORS_HEADER_BYTES
    assert paths.MAX_WALK_ENTRIES >= 2 * limits.MAX_ENTRIES + 8  # any valid container can be walked


# -- verify and restore agree ------------------------------------------------------------


def cursors_file(global_index: int) -> bytes:
    return cbor_canonical({"data_cursors": {DATASET: {"epoch": 0, "global_index": global_index}},
                           "sampler_config_hash": identity().sampler_config_hash})


def shard(header_json: str) -> bytes:
    """A safetensors file of one F32 tensor of two zeros under ``header_json``."""
    header = header_json.encode()
    return len(header).to_bytes(8, "little") + header + np.zeros(2, np.float32).tobytes()


FORGED = {
    # a cursor one past the dataset (cardinality 1000): next_batch would refuse to resume from it
    "cursor_past_cardinality": {paths.CURSORS_PATH: cursors_file(1000)},
    # a lone surrogate as a tensor name: the safetensors library refuses the header
    "surrogate_tensor_name": {"tensors/rank=0/shard=0.bin":
                              shard('{"\\ud800":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}')},
    # JSON, but not a safetensors integer: the library refuses it
    "negative_zero_offset": {"tensors/rank=0/shard=0.bin":
                             shard('{"w":{"dtype":"F32","shape":[2],"data_offsets":[-0,8]}}')},
    # the same tensor twice: JSON readers disagree on which one counts
    "repeated_tensor_name": {"tensors/rank=0/shard=0.bin": shard(
        '{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}')},
    # an array artifact must hold exactly one tensor named value
    "array_artifact_without_value": {"artifacts/array=loss_hist.bin": tensors.encode({"x": np.zeros(3)}, "t")},
}


@pytest.mark.parametrize("case", sorted(FORGED))
def test_verify_refuses_what_restore_refuses(tmp_path, case):
    path = str(tmp_path / "c")
    write_container(path)
    changes = dict(FORGED[case])
    if "artifacts/array=loss_hist.bin" in changes:  # keep the artifact index bound to the new bytes
        with ContainerReader(path) as reader:
            index = reader.artifact_index()
        data = changes["artifacts/array=loss_hist.bin"]
        from umlos_cuda.hashing import sha256

        index["loss_hist"] = dict(index["loss_hist"], size=len(data), sha256=sha256(data))
        changes[paths.ARTIFACT_INDEX_PATH] = cbor_canonical({"artifacts": index})
    reseal(path, changes)
    with pytest.raises(uc.UmlosError) as verified:
        verify_container(path)
    with pytest.raises(uc.UmlosError) as restored:
        restore_checkpoint(path)
    assert verified.value.code == restored.value.code == errors.CHECKPOINT_CONTENT_INVALID


def test_the_writer_refuses_a_cursor_past_the_dataset(tmp_path):
    for index in (1000, 5000):
        bad = dataclasses.replace(state(1), cursors={DATASET: uc.Cursor(0, index)})
        expect_code(errors.CHECKPOINT_STATE_INVALID, uc.checkpoint.save_checkpoint, str(tmp_path / "c"), identity(),
                    bad)
    ok = dataclasses.replace(state(1), cursors={DATASET: uc.Cursor(7, 999)})
    uc.checkpoint.save_checkpoint(str(tmp_path / "c"), identity(), ok)
    assert restore_checkpoint(str(tmp_path / "c")).cursors[DATASET] == uc.Cursor(7, 999)


# -- errors that used to escape as Python exceptions --------------------------------------------


@pytest.mark.parametrize("bad", [
    {"tensors": {0: [{"\ud800": np.zeros(1)}]}},
    {"optimizer": {0: {"m\udfff": np.zeros(1)}}},
    {"tmmu_plan": {"slots": ["\ud800"]}},
    {"tmmu_plan": {"\udc80": 1}},
    {"dp_accountant": {"note": "a\ud800b"}},
])
def test_lone_surrogates_in_state_are_state_invalid(store_dir, bad):
    with CheckpointStore.open(store_dir, identity(), KEY) as store:
        restored = store.restore_latest()
        expect_code(errors.CHECKPOINT_STATE_INVALID, store.commit,
                    dataclasses.replace(state(3, restored.cursors[DATASET]), **bad))
        store.commit(state(3, restored.cursors[DATASET]))
    verify_store(store_dir)


@pytest.mark.parametrize("field", ["tenant_id", "run_id"])
def test_lone_surrogates_in_the_run_identity_are_state_invalid(field):
    expect_code(errors.CHECKPOINT_STATE_INVALID, identity, **{field: "run\ud800"})


@pytest.mark.parametrize("ranks", [5, "01", b"\x00", {0: 1}, [0, "1"], [True], [-1], [1 << 32]])
def test_bad_ranks_are_state_invalid(pristine, ranks):
    path = pristine  # left as it was: a clean close drops the restore record
    expect_code(errors.CHECKPOINT_STATE_INVALID, restore_latest, path, profile="shard_subset", ranks=ranks)
    with CheckpointStore.open(path, identity(), KEY) as store:
        expect_code(errors.CHECKPOINT_STATE_INVALID, store.restore_latest, profile="shard_subset", ranks=ranks)
    restored = restore_latest(path, profile="shard_subset", ranks=(r for r in [1]))
    assert sorted(restored.tensors) == [1]


def test_negative_t_is_state_invalid_and_keeps_the_session(store_dir):
    with CheckpointStore.open(store_dir, identity(), KEY) as store:
        restored = store.restore_latest()
        events = store.tape.event_count
        expect_code(errors.CHECKPOINT_STATE_INVALID, store.commit, state(-1, restored.cursors[DATASET]))
        expect_code(errors.CHECKPOINT_STATE_INVALID, store.commit, state(1, restored.cursors[DATASET]))  # t goes back
        assert store.tape.event_count == events  # no checkpoint record was appended
        store.commit(state(2, restored.cursors[DATASET]))
    assert verify_store(store_dir)["commits"] == 2


def test_the_in_memory_reader_sees_what_the_writer_holds(tmp_path):
    """The writer's check is the reader's: a container validated in memory
    and written is one verify_container accepts, byte for byte."""
    builder = container.ContainerBuilder(identity(), state(5))
    builder.validate()
    builder.finish()
    builder.write(str(tmp_path / "c"))
    info = verify_container(str(tmp_path / "c"))
    assert info.checkpoint_hash == builder.checkpoint_hash
