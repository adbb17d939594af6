"""Extension points: a toy subsystem, declared in this test module alone, keeps
its own cursor in checkpoints and its own records on the trace tape, and
commits, verifies and restores them through the store; nothing in the
checkpoint package names it (docs/architecture.md, "Adding a subsystem with
its own cursors and tape records")."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest

import umlos_cuda as uc
from umlos_cuda import errors
from umlos_cuda.checkpoint import (
    CheckpointState,
    CheckpointStore,
    CursorKind,
    cursor_kinds,
    register_cursor_kind,
    register_record_type,
    restore_checkpoint,
    restore_latest,
    save_checkpoint,
    verify_container,
    verify_store,
)
from umlos_cuda.checkpoint import extensions, paths, plugins, schema, tape
from umlos_cuda.checkpoint.container import encode_manifest, parse_manifest
from umlos_cuda.checkpoint.store import open_store
from test_checkpoint_support import DATASET, KEY, files_of, identity, state

# -- the toy subsystem: everything it needs to live in checkpoints and on the tape ----------------


@dataclass(frozen=True)
class ToyCursor:
    """The toy's position: how far it got through the dataset, and a tag it must find again."""

    position: int
    tag: bytes


def encode_toy(cursor: ToyCursor) -> dict:
    return {"position": cursor.position, "tag": cursor.tag}


def decode_toy(value, manifest: uc.Manifest) -> ToyCursor:
    if not isinstance(value, dict) or set(value) != {"position", "tag"}:
        raise ValueError("a toy cursor is {position, tag}")
    cardinality = manifest.datasets[DATASET].cardinality
    if not tape.is_uint(value["position"]) or value["position"] > cardinality:
        raise ValueError(f"position {value['position']!r} is outside 0..{cardinality}")
    if not tape.is_hash(value["tag"]):
        raise ValueError("tag is 32 bytes")
    return ToyCursor(value["position"], value["tag"])


TOY = register_cursor_kind(CursorKind("toy", encode_toy, decode_toy, "the toy subsystem's position"))
TOY_STEP = register_record_type("toy.step", {"t": tape.is_uint, "position": tape.is_uint,
                                             "note": tape.nullable(tape.is_text)})
TOY_FAREWELL = register_record_type("toy.farewell", {"t": tape.is_uint}, after_run_end=True)
TAG = bytes(range(32))


def toy_run(store_dir: str, *, commits: int = 2, steps: int = 3, finish: bool = False) -> list[ToyCursor]:
    """A toy job: no NextBatch call, its own records, its own cursor in each checkpoint."""
    saved = []
    with CheckpointStore.open(store_dir, identity(), KEY) as store:
        store.start_run(DATASET, world_size=3, task_type="toy_training",
                        shuffled_per_stage={"train": False, "eval": False, "infer": False})
        position = 0
        for commit in range(commits):
            for step in range(steps):
                t = commit * steps + step + 1
                position += 7
                store.tape.append({"type": TOY_STEP, "t": t, "position": position, "note": None if step else "start"})
            cursor = ToyCursor(position, TAG)
            store.commit(CheckpointState(t, {}, extra_cursors={"toy": cursor}))
            saved.append(cursor)
        if finish:
            store.tape.append({"type": "run_end", "status": "success", "final_epoch_count": 0,
                               "total_samples_seen": position, "checkpoint_hash": None, "restore_status": "none",
                               "final_cursors": {}})
            store.tape.append({"type": TOY_FAREWELL, "t": t})
            store.commit()
    return saved


def tape_records(store_dir: str, fast: bool = True) -> list[dict]:
    _, commits = open_store(store_dir)
    out: list[dict] = []
    tape.read_tape(store_dir, [s for c in commits for s in c.trace["segments"]], on_record=lambda r, h: out.append(r),
                   fast=fast)
    return out


def expect_code(code, function, *args, **kwargs):
    with pytest.raises(uc.UmlosError) as info:
        function(*args, **kwargs)
    assert info.value.code == code, f"expected {code}, got {info.value.code}: {info.value.message}"
    return info.value


# -- through the store ----------------------------------------------------------------------------


def test_toy_subsystem_commits_verifies_and_restores_through_the_store(tmp_path):
    store_dir = str(tmp_path / "store")
    saved = toy_run(store_dir, finish=True)
    summary = verify_store(store_dir)
    assert summary["commits"] == 3 and summary["checkpoints"] == 2
    container = os.path.join(store_dir, "checkpoints", "commit=2")
    assert "data/cursors=toy.cbor" in files_of(container)
    restored = restore_latest(store_dir, identity())
    assert restored.extra_cursors == {"toy": saved[-1]} and restored.cursors == {}
    assert restored.header["checkpoint_schema_version"] == schema.CURSOR_KINDS_VERSION == "1.2"
    assert restored.report["compatibility_level"] == "E0"
    # a writer resumes from it, and the restore record goes on the tape after the toy's records
    with CheckpointStore.open(store_dir, identity(), KEY) as store:
        assert store.restore_latest().extra_cursors["toy"] == saved[-1]
        store.commit()
    records = tape_records(store_dir)
    header = records[0]
    assert header["task_type"] == "toy_training" and header["world_size"] == 3
    assert header["is_shuffled_per_stage"] == {"train": False, "eval": False, "infer": False}
    kinds = [r["type"] for r in records]
    assert kinds.count("toy.step") == 6 and kinds[-3:] == ["run_end", "toy.farewell", "restore"]
    assert [r["position"] for r in records if r["type"] == "toy.step"] == [7, 14, 21, 28, 35, 42]
    assert records == tape_records(store_dir, fast=False)  # the fast path leaves the toy's records to the strict reader
    verify_store(store_dir)


def test_profiles_that_resume_data_return_the_toy_cursor(tmp_path):
    path = str(tmp_path / "c")
    toy = ToyCursor(5, TAG)
    save_checkpoint(path, identity(), CheckpointState(2, {DATASET: uc.Cursor(0, 16)}, extra_cursors={"toy": toy}))
    for profile in ("train_full", "data_cursors"):
        restored = restore_checkpoint(path, profile=profile)
        assert restored.extra_cursors == {"toy": toy} and restored.cursors == {DATASET: uc.Cursor(0, 16)}
    assert restore_checkpoint(path, profile="eval_params").extra_cursors == {}
    assert verify_container(path).header["checkpoint_schema_version"] == "1.2"


def test_checkpoints_without_extra_cursors_keep_the_bytes_of_schema_1_1(tmp_path):
    """Only a checkpoint holding a registered kind is written as 1.2 (golden files stay valid)."""
    info = save_checkpoint(str(tmp_path / "plain"), identity(), state(3))
    assert info.header["checkpoint_schema_version"] == "1.1" and info.header["migration_supported_from"] == ["1.0"]
    assert not any(p.startswith("data/cursors=") for p in files_of(str(tmp_path / "plain")))
    extended = save_checkpoint(str(tmp_path / "ext"), identity(),
                               CheckpointState(3, state(3).cursors, extra_cursors={"toy": ToyCursor(1, TAG)}))
    assert extended.header["migration_supported_from"] == []


def test_nothing_in_the_checkpoint_package_names_the_toy():
    package = Path(extensions.__file__).parent
    for module in package.glob("*.py"):
        text = module.read_text(encoding="utf-8")
        assert not re.search(r"ToyCursor|['\"]toy[._'\"]", text), f"{module.name} names the toy subsystem"
    assert "toy" in cursor_kinds() and "toy.step" in tape.SCHEMAS


# -- the writer refuses what a reader would -------------------------------------------------------


def test_writer_refuses_state_its_kind_would_not_read(tmp_path):
    store_dir = str(tmp_path / "store")
    with CheckpointStore.open(store_dir, identity(), KEY) as store:
        store.start_run(DATASET, world_size=1)
        cases = [
            ({"nope": 1}, "not registered"),                                  # no such kind
            ({"toy": ToyCursor(10**6, TAG)}, "outside 0..1000"),              # decode refuses: past the dataset
            ({"toy": ToyCursor(1, b"short")}, "tag is 32 bytes"),
            ({"toy": "not a cursor"}, "AttributeError"),                      # encode refuses
            ({"toy": ToyCursor(float("nan"), TAG)}, "not finite"),            # not plain data
            ({3: ToyCursor(1, TAG)}, "cursor kind name"),
        ]
        for extra, words in cases:
            error = expect_code(errors.CHECKPOINT_STATE_INVALID, store.commit,
                                CheckpointState(1, {}, extra_cursors=extra))
            assert words in error.message, (extra, error.message)
        error = expect_code(errors.CHECKPOINT_STATE_INVALID, store.commit,
                            CheckpointState(1, {}, extra_cursors={"toy": ToyCursor(1, TAG)}), schema_version="1.1")
        assert "need schema 1.2" in error.message
        record = store.commit(CheckpointState(1, {}, extra_cursors={"toy": ToyCursor(1, TAG)}))  # still usable
    assert record.seq == 1 and verify_store(store_dir)["checkpoints"] == 1


# -- the reader refuses what the kind refuses, and what it cannot check ---------------------------


@dataclass
class Switch:
    strict: bool = False


LAX = Switch()


def decode_lax(value, manifest):
    if LAX.strict and value != "fine":
        raise KeyError("the strict reader wants 'fine'")
    return value


register_cursor_kind(CursorKind("toy_lax", lambda v: v, decode_lax))


def test_reader_runs_the_kinds_check_on_every_restore_and_verify(tmp_path, monkeypatch):
    path = str(tmp_path / "c")
    save_checkpoint(path, identity(), CheckpointState(1, {}, extra_cursors={"toy_lax": "forged"}))
    monkeypatch.setattr(LAX, "strict", True)
    for reader in (verify_container, restore_checkpoint, lambda p: restore_checkpoint(p, profile="data_cursors")):
        error = expect_code(errors.CHECKPOINT_CONTENT_INVALID, reader, path)
        assert "data/cursors=toy_lax.cbor" in error.message and "wants 'fine'" in error.message


def test_a_kind_no_one_registered_is_refused_then_found_through_an_entry_point(tmp_path, monkeypatch):
    path = str(tmp_path / "c")
    gone = register_cursor_kind(CursorKind("toy_gone", lambda v: v, lambda v, m: v))
    save_checkpoint(path, identity(), CheckpointState(1, {}, extra_cursors={"toy_gone": [1, 2]}))
    monkeypatch.delitem(extensions._KINDS, "toy_gone")
    monkeypatch.setattr(plugins.ENTRY_POINTS, "_loaded", False)
    monkeypatch.setattr(plugins.ENTRY_POINTS, "failures", [])
    broken = metadata.EntryPoint("broken", "no_such_module_anywhere", plugins.GROUP)
    monkeypatch.setattr(metadata, "entry_points", lambda group: [broken] if group == plugins.GROUP else [])
    error = expect_code(errors.CHECKPOINT_SCHEMA_UNSUPPORTED, verify_container, path)
    assert "'toy_gone' is not registered" in error.message and plugins.GROUP in error.message
    assert "no_such_module_anywhere" in error.message  # the entry point that failed to load is named
    # an installed subsystem declares a module that registers the kind when imported
    module = tmp_path / "toy_gone_plugin.py"
    module.write_text("from umlos_cuda.checkpoint import CursorKind, register_cursor_kind\n"
                      "register_cursor_kind(CursorKind('toy_gone', list, lambda value, manifest: tuple(value)))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins.ENTRY_POINTS, "_loaded", False)
    point = metadata.EntryPoint("toy", "toy_gone_plugin", plugins.GROUP)
    monkeypatch.setattr(metadata, "entry_points", lambda group: [point] if group == plugins.GROUP else [])
    assert restore_checkpoint(path).extra_cursors == {"toy_gone": (1, 2)}  # decoded by the plugin's kind
    assert plugins.ENTRY_POINTS.failures == [] and extensions._KINDS["toy_gone"] is not gone


def test_a_1_1_container_cannot_hold_cursor_kinds(tmp_path):
    info = save_checkpoint(str(tmp_path / "c"), identity(),
                           CheckpointState(1, {}, extra_cursors={"toy": ToyCursor(1, TAG)}))
    header = dict(info.header, checkpoint_schema_version="1.1", migration_supported_from=["1.0"])
    error = expect_code(errors.CHECKPOINT_PATH_INVALID, parse_manifest, encode_manifest(header, info.entries))
    assert "data/cursors=toy.cbor" in error.message and "schema 1.1" in error.message
    assert paths.parse_entry_path("data/cursors=toy.cbor") == paths.PathInfo("cursor_kind", name="toy")
    for bad in ("data/cursors=Toy.cbor", "data/cursors=.cbor", "data/cursors=toy.bin",
                "data/cursors=" + "a" * 33 + ".cbor"):
        expect_code(errors.CHECKPOINT_PATH_INVALID, paths.parse_entry_path, bad)


# -- registering ----------------------------------------------------------------------------------


def test_registering_a_cursor_kind():
    assert register_cursor_kind(TOY) is TOY  # the same kind again: nothing changes
    error = expect_code(errors.CHECKPOINT_STATE_INVALID, register_cursor_kind,
                        CursorKind("toy", encode_toy, decode_lax))
    assert "already registered" in error.message and "position" in error.message
    for name in ("Toy", "1toy", "toy-x", "", "t" * 33, None):
        expect_code(errors.CHECKPOINT_STATE_INVALID, CursorKind, name, encode_toy, decode_toy)
    expect_code(errors.CHECKPOINT_STATE_INVALID, CursorKind, "fine", "not callable", decode_toy)
    expect_code(errors.CHECKPOINT_STATE_INVALID, register_cursor_kind, "toy")


def test_registering_a_record_type():
    assert register_record_type(TOY_STEP, tape.SCHEMAS[TOY_STEP]) == TOY_STEP  # the same schema again
    for name in ("step", "run_header", "Toy.step", "toy.", "toy.step.more"):
        expect_code(errors.CHECKPOINT_STATE_INVALID, register_record_type, name, {"t": tape.is_uint})
    for fields in ({}, {"seq": tape.is_uint}, {"t": "not a check"}, {"": tape.is_uint}):
        expect_code(errors.CHECKPOINT_STATE_INVALID, register_record_type, "toy.other", fields)
    error = expect_code(errors.CHECKPOINT_STATE_INVALID, register_record_type, TOY_STEP, {"t": tape.is_text})
    assert "another schema" in error.message
    expect_code(errors.CHECKPOINT_STATE_INVALID, register_record_type, TOY_FAREWELL,
                {"t": tape.is_uint})  # after_run_end differs


def test_tape_checks_the_toy_records(tmp_path):
    with CheckpointStore.open(str(tmp_path / "s"), identity(), KEY) as store:
        store.start_run(DATASET, world_size=1)
        for bad in ({"type": TOY_STEP, "t": 1, "position": -1, "note": None},        # invalid field
                    {"type": TOY_STEP, "t": 1, "position": 1},                       # missing field
                    {"type": TOY_STEP, "t": 1, "position": 1, "note": None, "x": 1},  # unknown field
                    {"type": "toy.unknown", "t": 1}):
            expect_code(errors.TRACE_FORMAT_INVALID, store.tape.append, bad)
        store.tape.append({"type": "run_end", "status": "success", "final_epoch_count": 0, "total_samples_seen": 0,
                           "checkpoint_hash": None, "restore_status": "none", "final_cursors": {}})
        error = expect_code(errors.TRACE_FORMAT_INVALID, store.tape.append,
                            {"type": TOY_STEP, "t": 2, "position": 1, "note": None})
        assert "may follow run_end" in error.message and TOY_FAREWELL in error.message
        store.tape.append({"type": TOY_FAREWELL, "t": 2})
        store.commit()


def test_the_fast_path_still_reads_iter_blocks_beside_the_toys_records(tmp_path):
    """tape_fast builds its patterns from tape.SCHEMAS: registered types leave
    them intact, and blocks holding toy records go to the strict reader."""
    store_dir = str(tmp_path / "s")
    m = identity().manifest
    cursor = uc.Cursor()
    with CheckpointStore.open(store_dir, identity(), KEY, block_size=2) as store:
        store.start_run(DATASET, world_size=1)
        for t in range(1, 9):
            batch = uc.next_batch(m, DATASET, 1, 0, cursor=cursor, backend="numpy", t=t)
            store.tape.append(tape.iter_fields(batch, t))
            cursor = batch.cursor
            if t % 4 == 0:
                store.tape.append({"type": TOY_STEP, "t": t, "position": t, "note": "beside iter"})
        store.commit()
    _, commits = open_store(store_dir)
    (segment,) = [s for c in commits for s in c.trace["segments"]]
    matcher = tape._new_matcher()
    with open(os.path.join(store_dir, segment["path"]), "rb") as handle:
        chunks = list(tape._segment_chunks(handle, "s", index=1, first_seq=0, prev_hash=bytes(32), ended=False,
                                           digest=None, matcher=matcher, want_records=True))
    records = [r for chunk, _, _ in chunks for r in chunk]
    assert [r["type"] for r in records].count(TOY_STEP) == 2 and len(records) == 1 + 8 + 2
    assert matcher.fast_blocks >= 2 and matcher.strict_blocks >= 2
    assert records == tape_records(store_dir, fast=False)


def test_a_check_that_raises_says_invalid():
    register_record_type("toy.picky", {"items": lambda v: v["a"] == 1})
    header = tape.run_header_fields(tenant_id="t", run_id="r", manifest=identity().manifest, replay_token=bytes(32),
                                    backend_hash=bytes(32), dataset_key=DATASET, world_size=1)
    assert header["is_shuffled_per_stage"] == tape.STAGE_SHUFFLED
    for value in ([], {"b": 1}, None):
        error = expect_code(errors.TRACE_FORMAT_INVALID, tape.check_record,
                            {"type": "toy.picky", "seq": 1, "prev": bytes(32), "items": value})
        assert "invalid items" in error.message


def test_start_run_validates_with_checkpoint_codes(tmp_path):
    with CheckpointStore.open(str(tmp_path / "s"), identity(), KEY) as store:
        for kwargs in ({"world_size": 0}, {"world_size": 1 << 32}, {"world_size": "2"}, {"world_size": True}):
            error = expect_code(errors.CHECKPOINT_STATE_INVALID, store.start_run, DATASET, **kwargs)
            assert error.record["failure_operator"] == errors.CHECKPOINT_COMMIT_OPERATOR
        error = expect_code(errors.CHECKPOINT_STATE_INVALID, store.start_run, "nope", world_size=1)
        assert "'train', 'val'" in error.message
        assert store.tape.event_count == 0
