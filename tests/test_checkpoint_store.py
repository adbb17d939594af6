"""The store: run commits with signed certificates, recovery, the lock, the
checkpoint chain and store-level verification (docs/checkpoint-format.md §7, §9)."""

from __future__ import annotations

import os
import shutil
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

import umlos_cuda as uc
from umlos_cuda import errors
from umlos_cuda.checkpoint import (
    CheckpointStore,
    open_store,
    recover_store,
    restore_latest,
    verify_container,
    verify_store,
)
from umlos_cuda.checkpoint import atomic, signing
from umlos_cuda.checkpoint.commit import certificate_path, checkpoint_dir, lineage_path
from umlos_cuda.checkpoint.summary import verify_path
from umlos_cuda.checkpoint.tape import iter_fields, read_tape
from umlos_cuda.hashing import cbor_canonical
from test_checkpoint_support import DATASET, KEY, OTHER_KEY, identity, manifest, reference_cursors, state


def expect_code(code, function, *args, **kwargs):
    """The UmlosError ``function`` raises, which must have ``code`` (any code if None)."""
    with pytest.raises(uc.UmlosError) as info:
        function(*args, **kwargs)
    assert code is None or info.value.code == code, f"expected {code}, got {info.value.code}: {info.value.message}"
    return info.value


def run_steps(store, cursor, first, last):
    m = store.identity.manifest
    for t in range(first, last + 1):
        batch = uc.next_batch(m, DATASET, 1, 0, cursor=cursor, backend="numpy", t=t)
        store.tape.append(iter_fields(batch, t))
        cursor = batch.cursor
    return cursor


def build_store(path, commits=3, steps_per_commit=2):
    cursor = uc.Cursor()
    with CheckpointStore.open(path, identity(), KEY) as store:
        store.start_run(DATASET, world_size=1)
        t = 0
        for _ in range(commits):
            cursor = run_steps(store, cursor, t + 1, t + steps_per_commit)
            t += steps_per_commit
            store.commit(state(t, cursor))
    return cursor


@pytest.fixture()
def store_dir(tmp_path):
    path = str(tmp_path / "store")
    build_store(path)
    return path


def test_commits_bind_trace_checkpoint_and_lineage(store_dir):
    summary = verify_store(store_dir, signing.public_key_bytes(KEY))
    assert summary["commits"] == 3 and summary["checkpoints"] == 3 and summary["latest_t"] == 6
    marker, commits = open_store(store_dir)
    assert marker["public_key"] == signing.public_key_bytes(KEY)
    previous = None
    for record in commits:
        info = verify_container(os.path.join(store_dir, record.checkpoint["path"]))
        assert info.checkpoint_hash == record.checkpoint_hash
        assert info.header["lineage_root_hash"] == record.lineage_root_hash
        assert info.header["trace_tail_hash_at_checkpoint"] == record.trace["tail_hash"]
        assert info.header.get("checkpoint_hash_prev") == previous
        previous = info.checkpoint_hash
    # One iter per NextBatch call, cursors before/after chained; checkpoints recorded.
    kinds = []
    read_tape(store_dir, [s for r in commits for s in r.trace["segments"]], on_record=lambda r, h: kinds.append(r))
    assert [r["type"] for r in kinds] == ["run_header"] + ["iter", "iter", "checkpoint"] * 3
    iters = [r for r in kinds if r["type"] == "iter"]
    assert all(a["cursor_after"] == b["cursor_before"] for a, b in pairwise(iters))
    assert [uc.Cursor(**r["cursor_after"]) for r in iters] == reference_cursors(manifest(), 6)[1:]


def test_restore_latest_continues_identically(store_dir):
    restored = restore_latest(store_dir, identity(), public_key=signing.public_key_bytes(KEY))
    assert restored.t == 6 and restored.cursors[DATASET] == reference_cursors(manifest(), 6)[6]
    with CheckpointStore.open(store_dir, identity(), KEY) as store:
        again = store.restore_latest()
        assert again.checkpoint_hash == restored.checkpoint_hash
        cursor = run_steps(store, again.cursors[DATASET], 7, 10)
        store.commit(state(10, cursor))
    assert cursor == reference_cursors(manifest(), 10)[10]
    _, commits = open_store(store_dir)
    records = []
    read_tape(store_dir, [s for r in commits for s in r.trace["segments"]], on_record=lambda r, h: records.append(r))
    assert records[10]["type"] == "restore" and records[10]["restore_profile_id"] == "train_full"
    assert records[10]["checkpoint_hash"] == restored.checkpoint_hash
    verify_store(store_dir)


def test_identity_mismatch_on_restore(store_dir):
    expect_code(errors.CHECKPOINT_IDENTITY_MISMATCH, restore_latest, store_dir, identity(manifest=manifest(seed=99)))
    expect_code(errors.CHECKPOINT_IDENTITY_MISMATCH, restore_latest, store_dir, identity(),
                expect={"tmmu_plan_hash": bytes(32)})
    expect_code(errors.CHECKPOINT_IDENTITY_MISMATCH, CheckpointStore.open, store_dir, identity(run_id="run-2"), KEY)


def test_two_writers_cannot_interleave(store_dir):
    with CheckpointStore.open(store_dir, identity(), KEY):
        expect_code(errors.CHECKPOINT_LOCKED, CheckpointStore.open, store_dir, identity(), KEY)
        expect_code(errors.CHECKPOINT_LOCKED, recover_store, store_dir)
    with CheckpointStore.open(store_dir, identity(), KEY):  # released on close
        pass


def test_lock_is_released_when_the_writer_dies(store_dir):
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            CheckpointStore.open(store_dir, identity(), KEY)
            os.kill(os.getpid(), 9)
        finally:
            os._exit(1)
    os.waitpid(pid, 0)
    with CheckpointStore.open(store_dir, identity(), KEY):
        pass


def test_wrong_signing_key_or_trusted_key(store_dir):
    expect_code(errors.CHECKPOINT_SIGNATURE_INVALID, CheckpointStore.open, store_dir, identity(), OTHER_KEY)
    expect_code(errors.CHECKPOINT_SIGNATURE_INVALID, verify_store, store_dir, signing.public_key_bytes(OTHER_KEY))
    expect_code(errors.CHECKPOINT_SIGNATURE_INVALID, restore_latest, store_dir,
                public_key=signing.public_key_bytes(OTHER_KEY).hex())
    container = os.path.join(store_dir, checkpoint_dir(2))
    assert verify_path(container, signing.public_key_bytes(KEY))["certificate"]["commit"] == 2
    expect_code(errors.CHECKPOINT_SIGNATURE_INVALID, verify_path, container, signing.public_key_bytes(OTHER_KEY))


def test_resigned_certificate_with_another_key_is_refused(store_dir):
    """A certificate re-signed by someone else fails against the store's key."""
    from umlos_cuda.checkpoint import cbor_safe

    path = os.path.join(store_dir, certificate_path(3))
    certificate = cbor_safe.decode(Path(path).read_bytes())
    forged = signing.sign_certificate(signing.RUN_COMMIT_DOMAIN, certificate["body"], OTHER_KEY)
    Path(path).write_bytes(cbor_canonical(forged))
    expect_code(errors.CHECKPOINT_SIGNATURE_INVALID, verify_store, store_dir)
    expect_code(errors.CHECKPOINT_SIGNATURE_INVALID, restore_latest, store_dir)


def test_a_consistent_forgery_needs_the_key(store_dir, tmp_path):
    """Rewrite a checkpoint's state and every hash in it: the container verifies
    on its own, but the store does not, because the certificate is signed."""
    from umlos_cuda.checkpoint import ContainerBuilder, ContainerReader

    _, commits = open_store(store_dir)
    record = commits[-1]
    container = os.path.join(store_dir, record.checkpoint["path"])
    original = verify_container(container)
    with ContainerReader(container) as reader:
        link = reader.trace_link()
    forged = ContainerBuilder(identity(), state(6, uc.Cursor(0, 0)), trace_link=link)
    forged.finish(lineage_root_hash=original.header["lineage_root_hash"],
                  checkpoint_hash_prev=original.header["checkpoint_hash_prev"])
    shutil.rmtree(container)
    forged.write(container)
    verify_container(container)  # self-consistent
    expect_code(errors.CHECKPOINT_COMMIT_MISMATCH, verify_store, store_dir)  # not the certified checkpoint
    error = expect_code(errors.CHECKPOINT_IDENTITY_MISMATCH, restore_latest, store_dir)
    assert error.record["diagnostics"]["field"] == "checkpoint_merkle_root"  # the certificate's root


def test_checkpoint_chain_is_checked_across_the_store(store_dir, tmp_path):
    # Replace commit 2's container with commit 3's: the chain and the binding break.
    shutil.rmtree(os.path.join(store_dir, checkpoint_dir(2)))
    shutil.copytree(os.path.join(store_dir, checkpoint_dir(3)), os.path.join(store_dir, checkpoint_dir(2)))
    with pytest.raises(uc.UmlosError) as info:
        verify_store(store_dir)
    assert info.value.code in (errors.CHECKPOINT_COMMIT_MISMATCH, errors.CHECKPOINT_CHAIN_MISMATCH,
                               errors.CHECKPOINT_IDENTITY_MISMATCH)
    expect_code(errors.CHECKPOINT_COMMIT_MISMATCH, verify_path, os.path.join(store_dir, checkpoint_dir(2)))


def test_deleted_or_renumbered_certificate(store_dir):
    os.rename(os.path.join(store_dir, certificate_path(2)), os.path.join(store_dir, "commits", "commit=7.cbor"))
    expect_code(errors.CHECKPOINT_CHAIN_MISMATCH, verify_store, store_dir)
    expect_code(errors.CHECKPOINT_CHAIN_MISMATCH, restore_latest, store_dir)


def test_lineage_tampering(store_dir):
    path = os.path.join(store_dir, lineage_path(1))
    data = bytearray(Path(path).read_bytes())
    data[-1] ^= 1
    Path(path).write_bytes(data)
    expect_code(errors.CHECKPOINT_COMMIT_MISMATCH, verify_store, store_dir)


def test_uncommitted_records_are_rolled_back_with_a_failure_record(store_dir):
    store = CheckpointStore.open(store_dir, identity(), KEY)
    restored = store.restore_latest()
    run_steps(store, restored.cursors[DATASET], 7, 9)  # never committed
    store.abandon()  # as a writer that crashed: the temp segment stays
    expect_code(errors.CHECKPOINT_UNCOMMITTED, verify_store, store_dir)
    assert restore_latest(store_dir).t == 6  # readers ignore leftovers
    with CheckpointStore.open(store_dir, identity(), KEY) as store:
        assert store.recovery.rolled_back == ["trace/segment=4.tape.tmp"]
        store.restore_latest()
        store.commit()
    _, commits = open_store(store_dir)
    records = []
    read_tape(store_dir, [s for r in commits for s in r.trace["segments"]], on_record=lambda r, h: records.append(r))
    failure = records[-2]
    assert failure["type"] == "failure" and failure["failure_code"] == errors.CHECKPOINT_COMMIT_ROLLED_BACK
    assert failure["t"] == 6 and failure["replay_token"] == identity().token
    assert "trace/segment=4.tape.tmp" in failure["diagnostics"]["objects"]
    assert records[-3]["type"] == "checkpoint" and records[-1]["type"] == "restore"
    verify_store(store_dir)


def test_a_clean_close_leaves_a_store_that_verifies(store_dir):
    """Restore, or append records, then leave without committing: nothing is left over."""
    head = verify_store(store_dir)["head"]
    with CheckpointStore.open(store_dir, identity(), KEY) as store:
        store.restore_latest()  # appends a restore record: a temp segment
        assert os.path.exists(os.path.join(store_dir, "trace", "segment=4.tape.tmp"))
    summary = verify_store(store_dir)
    assert summary["head"] == head and summary["trace_events"] == 10
    assert sorted(os.listdir(os.path.join(store_dir, "trace"))) == [f"segment={k}.tape" for k in (1, 2, 3)]
    with pytest.raises(RuntimeError), CheckpointStore.open(store_dir, identity(), KEY) as store:
        restored = store.restore_latest()
        run_steps(store, restored.cursors[DATASET], 7, 9)
        raise RuntimeError("the job fails between two commits")
    assert verify_store(store_dir)["head"] == head
    with CheckpointStore.open(store_dir, identity(), KEY) as store:
        assert store.recovery.rolled_back == []


def test_recover_command_rolls_back_a_half_commit(store_dir):
    """Stop a commit after its temp objects and two renames: recovery removes them all."""
    labels = []

    def stop_at_lineage_rename(label):
        labels.append(label)
        if label == "checkpoint_renamed":
            raise KeyboardInterrupt

    store = CheckpointStore.open(store_dir, identity(), KEY)
    restored = store.restore_latest()
    cursor = run_steps(store, restored.cursors[DATASET], 7, 8)
    atomic.crash_hook = stop_at_lineage_rename
    try:
        with pytest.raises(KeyboardInterrupt):
            store.commit(state(8, cursor))
    finally:
        atomic.crash_hook = None
    expect_code(errors.CHECKPOINT_STATE_INVALID, store.commit)  # the session is unusable after a failed commit
    store.close()
    assert "certificate_written" in labels
    expect_code(errors.CHECKPOINT_UNCOMMITTED, verify_store, store_dir)
    assert restore_latest(store_dir).t == 6
    report = recover_store(store_dir)
    assert report.committed_seq == 3
    assert report.rolled_back == sorted(["checkpoints/commit=4", "commits/commit=4.cbor.tmp",
                                         "lineage/commit=4.cbor.tmp", "trace/segment=4.tape"])
    verify_store(store_dir)


def test_unknown_files_in_the_store(store_dir):
    Path(os.path.join(store_dir, "notes.txt")).write_text("ignored: not in a store folder")
    verify_store(store_dir)
    Path(os.path.join(store_dir, "checkpoints", "README")).write_text("x")
    expect_code(errors.CHECKPOINT_UNEXPECTED_FILE, verify_store, store_dir)
    report = recover_store(store_dir)
    assert report.unknown == ["checkpoints/README"] and os.path.exists(os.path.join(store_dir, "checkpoints", "README"))


def test_uncommitted_container_inside_a_store_is_not_valid(store_dir):
    shutil.copytree(os.path.join(store_dir, checkpoint_dir(3)), os.path.join(store_dir, "checkpoints", "commit=4.tmp"))
    expect_code(errors.CHECKPOINT_UNCOMMITTED, verify_path, os.path.join(store_dir, "checkpoints", "commit=4.tmp"))


def test_trace_only_commit_and_first_commit_rules(tmp_path):
    path = str(tmp_path / "s")
    with CheckpointStore.open(path, identity(), KEY) as store:
        expect_code(errors.CHECKPOINT_STATE_INVALID, store.commit)  # no run_header yet
        assert store.restore_latest() is None
        store.start_run(DATASET, world_size=1)
        record = store.commit()
        assert record.checkpoint is None
    expect_code(errors.CHECKPOINT_NOT_FOUND, restore_latest, path)
    assert verify_store(path)["checkpoints"] == 0


def test_store_without_marker_or_missing(tmp_path):
    expect_code(errors.CHECKPOINT_NOT_FOUND, verify_store, str(tmp_path))
    expect_code(errors.CHECKPOINT_NOT_FOUND, CheckpointStore.open, str(tmp_path / "a" / "b"), identity(), KEY)
    os.makedirs(tmp_path / "odd" / "commits")
    Path(tmp_path / "odd" / "commits" / "commit=1.cbor").write_bytes(b"x")
    expect_code(errors.CHECKPOINT_SCHEMA_INVALID, CheckpointStore.open, str(tmp_path / "odd"), identity(), KEY)


def test_tensors_round_trip_through_the_store(store_dir):
    restored = restore_latest(store_dir)
    want = state(6)
    for rank in want.tensors:
        assert np.array_equal(restored.tensors[rank][1]["weight"], want.tensors[rank][1]["weight"])


# -- links: nothing outside the store is read, written or removed -----------------------------


@pytest.mark.parametrize("folder", ["checkpoints", "commits", "lineage", "trace"])
def test_a_linked_store_folder_is_refused_and_nothing_outside_is_removed(store_dir, tmp_path, folder):
    """A store-named leftover in the link's target (outside the store) survives every operation."""
    outside = tmp_path / "elsewhere"
    shutil.move(os.path.join(store_dir, folder), outside)
    os.symlink(outside, os.path.join(store_dir, folder))
    bait = {"checkpoints": "commit=9.tmp", "commits": "commit=9.cbor.tmp", "lineage": "commit=9.cbor.tmp",
            "trace": "segment=9.tape.tmp"}[folder]
    os.makedirs(outside / bait) if folder == "checkpoints" else (outside / bait).write_bytes(b"not the store's")
    for function, args in ((recover_store, (store_dir,)), (CheckpointStore.open, (store_dir, identity(), KEY)),
                           (verify_store, (store_dir,)), (restore_latest, (store_dir,)), (open_store, (store_dir,))):
        expect_code(errors.CHECKPOINT_UNEXPECTED_FILE, function, *args)
    assert (outside / bait).exists() and len(os.listdir(outside)) > 1
    from umlos_cuda.cli import main

    assert main(["checkpoint", "recover", store_dir]) == 2
    assert (outside / bait).exists()


def test_a_linked_container_folder_is_refused(store_dir, tmp_path):
    container = os.path.join(store_dir, checkpoint_dir(3))
    shutil.move(container, tmp_path / "real")
    os.symlink(tmp_path / "real", container)  # the same bytes, through a link
    expect_code(errors.CHECKPOINT_UNEXPECTED_FILE, verify_store, store_dir)
    expect_code(errors.CHECKPOINT_UNEXPECTED_FILE, restore_latest, store_dir)
    expect_code(errors.CHECKPOINT_UNEXPECTED_FILE, verify_path, container)
    expect_code(errors.CHECKPOINT_UNEXPECTED_FILE, verify_container, container)
    verify_container(str(tmp_path / "real"))  # the folder itself is fine


# -- verify and restore agree on the store --------------------------------------------------


def flip_last_byte(path):
    data = bytearray(Path(path).read_bytes())
    data[-1] ^= 1
    Path(path).write_bytes(data)


def truncate(path):
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[:-3])


STORE_DAMAGE = {
    "lineage_of_commit_1": lambda s: flip_last_byte(os.path.join(s, lineage_path(1))),
    "lineage_of_commit_3": lambda s: flip_last_byte(os.path.join(s, lineage_path(3))),
    "segment_1_byte": lambda s: flip_last_byte(os.path.join(s, "trace", "segment=1.tape")),
    "segment_3_truncated": lambda s: truncate(os.path.join(s, "trace", "segment=3.tape")),
    "segment_2_missing": lambda s: os.unlink(os.path.join(s, "trace", "segment=2.tape")),
}


@pytest.mark.parametrize("damage", sorted(STORE_DAMAGE))
def test_restore_refuses_what_verify_refuses(store_dir, damage):
    STORE_DAMAGE[damage](store_dir)
    verified = expect_code(None, verify_store, store_dir)
    expect_code(verified.code, restore_latest, store_dir)
    expect_code(verified.code, restore_latest, store_dir, profile="data_cursors")
    with CheckpointStore.open(store_dir, identity(), KEY) as store:
        expect_code(verified.code, store.restore_latest)


# -- anchors: a rolled-back store is refused when the caller kept its head -----------------------


def delete_commit(store_dir, seq):
    """Every object of commit ``seq``: a rollback that leaves a consistent, shorter chain."""
    _, commits = open_store(store_dir)
    record = commits[seq - 1]
    for segment in record.trace["segments"]:
        os.unlink(os.path.join(store_dir, segment["path"]))
    shutil.rmtree(os.path.join(store_dir, checkpoint_dir(seq)))
    os.unlink(os.path.join(store_dir, lineage_path(seq)))
    os.unlink(os.path.join(store_dir, certificate_path(seq)))


def test_rollback_is_refused_with_an_anchor(store_dir, capsys):
    _, commits = open_store(store_dir)
    head3, head2 = commits[2].head, commits[1].head
    assert verify_store(store_dir)["head"] == head3 == commits[2].certificate_hash.hex()
    delete_commit(store_dir, 3)
    # Without an anchor the shorter chain is a valid store (what cannot be detected).
    assert verify_store(store_dir)["head"] == head2 and restore_latest(store_dir).t == 4
    expect_code(errors.CHECKPOINT_STALE, verify_store, store_dir, expect_head=head3)
    expect_code(errors.CHECKPOINT_STALE, verify_store, store_dir, min_commit=3)
    expect_code(errors.CHECKPOINT_STALE, restore_latest, store_dir, expect_head=bytes.fromhex(head3))
    expect_code(errors.CHECKPOINT_STALE, restore_latest, store_dir, min_commit=3)
    with CheckpointStore.open(store_dir, identity(), KEY) as store:
        expect_code(errors.CHECKPOINT_STALE, store.restore_latest, expect_head=head3)
        assert store.restore_latest(expect_head=head2, min_commit=2).t == 4
    assert verify_store(store_dir, expect_head=commits[0].head, min_commit=2)["commits"] == 2
    for bad in ("zz" * 32, head3[:10], 3):
        expect_code(errors.CHECKPOINT_STATE_INVALID, verify_store, store_dir, expect_head=bad)
    expect_code(errors.CHECKPOINT_STATE_INVALID, verify_store, store_dir, min_commit=-1)
    from umlos_cuda.cli import main

    capsys.readouterr()
    assert main(["checkpoint", "verify", store_dir, "--expect-head", head2, "--min-commit", "2"]) == 0
    assert head2 in capsys.readouterr().out
    assert main(["checkpoint", "verify", store_dir, "--expect-head", head3]) == 2
    assert capsys.readouterr().err.startswith("error CHECKPOINT_STALE")
    assert main(["checkpoint", "verify", os.path.join(store_dir, checkpoint_dir(1)), "--min-commit", "1"]) == 2


def test_commit_returns_the_head_that_verify_reports(tmp_path):
    path = str(tmp_path / "s")
    with CheckpointStore.open(path, identity(), KEY) as store:
        store.start_run(DATASET, world_size=1)
        record = store.commit(state(1))
        assert len(record.head) == 64
    assert verify_store(path, expect_head=record.head)["head"] == record.head


def test_commit_steps_pass_their_crash_points_in_protocol_order(tmp_path, monkeypatch):
    """The crash tests stop a writer at each label; the order is the protocol's (module docstring of commit.py)."""
    labels: list[str] = []
    with CheckpointStore(str(tmp_path / "s"), identity(), KEY) as store:  # the constructor is CheckpointStore.open
        store.start_run(DATASET, world_size=1)
        monkeypatch.setattr(atomic, "crash_hook", labels.append)
        store.commit(state(1, shards=1, ranks=1))
        with_checkpoint, labels[:] = list(labels), []
        store.commit()
        without_checkpoint = list(labels)
    files = len([label for label in with_checkpoint if label == "container_file"])
    assert files == 10  # a shard, an optimizer state, two user_state entries and six fixed files
    assert with_checkpoint == ["commit_begin", "tape_sealed"] + ["container_file"] * files + [
        "checkpoint_written", "lineage_written", "certificate_written", "segment_renamed", "checkpoint_renamed",
        "lineage_renamed", "committed"]
    assert without_checkpoint == ["commit_begin", "tape_sealed", "checkpoint_written", "lineage_written",
                                  "certificate_written", "lineage_renamed", "committed"]
    assert verify_store(str(tmp_path / "s"))["commits"] == 2
