"""Retention (docs/checkpoint-format.md, "Retention"): ``keep_last`` keeps the
newest checkpoints, collects the older containers under the writer's lock,
never the newest; verification takes collected checkpoints' hashes from
their certificates; a SIGKILL at any step of a collection (alone, or after a
writer's commit with ``keep_last``) leaves a store that verifies and
restores to its newest commit."""

from __future__ import annotations

import os
import shutil
from functools import partial

import pytest

import umlos_cuda as uc
from umlos_cuda import errors
from umlos_cuda.checkpoint import CheckpointStore, atomic, restore_latest, retention, verify_store
from umlos_cuda.checkpoint.tape import iter_fields
from umlos_cuda.cli import main
from umlos_cuda.hashing import cbor_canonical
from test_checkpoint_crash import Reference, check_after_kill, collect, crash_state, fork_writer, kill_hook, warm_up
from test_checkpoint_support import DATASET, KEY, identity

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the crash tests fork processes")


def expect_code(code, function, *args, **kwargs):
    with pytest.raises(uc.UmlosError) as info:
        function(*args, **kwargs)
    assert info.value.code == code, f"expected {code}, got {info.value.code}: {info.value.message}"
    return info.value


def step(store, t, cursor, *, checkpoint=True):
    """Append step ``t``'s iter record and commit (with a checkpoint or trace only)."""
    batch = uc.next_batch(identity().manifest, DATASET, 1, 0, cursor=cursor, backend="numpy", t=t)
    store.tape.append(iter_fields(batch, t))
    store.commit(crash_state(t, batch.cursor) if checkpoint else None)
    return batch.cursor


def build(store_dir, steps, *, trace_only=(), keep_last=None):
    """Commits 1..steps at t = 1..steps, each with a checkpoint unless its t is in ``trace_only``."""
    cursor = uc.Cursor()
    with CheckpointStore.open(store_dir, identity(), KEY, keep_last=keep_last) as store:
        store.start_run(DATASET, world_size=1)
        for t in range(1, steps + 1):
            cursor = step(store, t, cursor, checkpoint=t not in trace_only)
    return cursor


def containers(store_dir):
    return sorted(os.listdir(os.path.join(store_dir, "checkpoints")), key=lambda n: int(n.split("=")[1]))


def test_gc_keeps_the_newest_checkpoints(tmp_path):
    store_dir = str(tmp_path / "s")
    build(store_dir, 6, trace_only={6})  # checkpoints at commits 1..5, commit 6 trace only
    report = retention.collect_garbage(store_dir, 2)
    assert report.collected_through == 3 and report.kept == [4, 5]
    assert report.removed == ["checkpoints/commit=1", "checkpoints/commit=2", "checkpoints/commit=3"]
    assert containers(store_dir) == ["commit=4", "commit=5"]
    assert retention.read_collected(store_dir) == 3
    # Certificates, lineage records and the tape stay: the history still verifies from commit 1.
    assert len(os.listdir(os.path.join(store_dir, "commits"))) == 6
    summary = verify_store(store_dir)
    assert summary["commits"] == 6 and summary["checkpoints"] == 2 and summary["checkpoints_collected"] == 3
    assert restore_latest(store_dir, identity()).t == 5
    # Again: nothing to do. A larger keep_last never brings collected checkpoints back.
    assert retention.collect_garbage(store_dir, 2).removed == []
    assert retention.collect_garbage(store_dir, 5).collected_through == 3
    # A writer continues: its checkpoint chains the newest one, and the store verifies.
    with CheckpointStore.open(store_dir, identity(), KEY) as store:
        restored = store.restore_latest()
        step(store, 7, restored.cursors[DATASET])
    assert verify_store(store_dir)["checkpoints"] == 3
    assert retention.collect_garbage(store_dir, 1).removed == ["checkpoints/commit=4", "checkpoints/commit=5"]
    assert verify_store(store_dir)["checkpoints_collected"] == 5 and restore_latest(store_dir).t == 7


def test_keep_last_after_each_commit(tmp_path):
    store_dir = str(tmp_path / "s")
    build(store_dir, 5, keep_last=2)
    assert containers(store_dir) == ["commit=4", "commit=5"] and retention.read_collected(store_dir) == 3
    summary = verify_store(store_dir)
    assert summary["checkpoints"] == 2 and summary["checkpoints_collected"] == 3
    # Without keep_last, a writer collects nothing.
    build(str(tmp_path / "all"), 3)
    assert containers(str(tmp_path / "all")) == ["commit=1", "commit=2", "commit=3"]
    assert not os.path.exists(os.path.join(str(tmp_path / "all"), retention.RETENTION_NAME))


@pytest.mark.parametrize("keep_last", [0, -1, True, 1.5, "2", None])
def test_keep_last_must_be_a_positive_integer(tmp_path, keep_last):
    store_dir = str(tmp_path / "s")
    build(store_dir, 2)
    error = expect_code(errors.CHECKPOINT_STATE_INVALID, retention.collect_garbage, store_dir, keep_last)
    assert "keep_last must be an integer >= 1" in error.message
    if keep_last is not None:
        expect_code(errors.CHECKPOINT_STATE_INVALID, CheckpointStore.open, store_dir, identity(), KEY,
                    keep_last=keep_last)
    assert containers(store_dir) == ["commit=1", "commit=2"]


def test_gc_takes_the_writer_lock(tmp_path):
    store_dir = str(tmp_path / "s")
    build(store_dir, 3)
    with CheckpointStore.open(store_dir, identity(), KEY):
        expect_code(errors.CHECKPOINT_LOCKED, retention.collect_garbage, store_dir, 1)
    assert containers(store_dir) == ["commit=1", "commit=2", "commit=3"]
    expect_code(errors.CHECKPOINT_NOT_FOUND, retention.collect_garbage, str(tmp_path / "nothing"), 1)


def write_marker(store_dir, value):
    with open(os.path.join(store_dir, retention.RETENTION_NAME), "wb") as handle:
        handle.write(value if isinstance(value, bytes) else cbor_canonical(value))


def test_verify_checks_the_retention_marker(tmp_path):
    store_dir = str(tmp_path / "s")
    build(store_dir, 4, trace_only={4})
    marker = {"format": retention.RETENTION_FORMAT, "collected_through": 3}
    write_marker(store_dir, marker)  # the newest checkpoint is commit 3
    error = expect_code(errors.CHECKPOINT_CHAIN_MISMATCH, verify_store, store_dir)
    assert "the newest is never collected" in error.message
    write_marker(store_dir, dict(marker, collected_through=2, extra=1))
    expect_code(errors.CHECKPOINT_SCHEMA_INVALID, verify_store, store_dir)
    write_marker(store_dir, dict(marker, collected_through=-1))
    expect_code(errors.CHECKPOINT_SCHEMA_INVALID, verify_store, store_dir)
    write_marker(store_dir, b"\xa2" + cbor_canonical(marker)[1:] + b"\x00")
    expect_code(errors.CHECKPOINT_CBOR_INVALID, verify_store, store_dir)
    # A checkpoint the marker does not collect must be there, complete.
    write_marker(store_dir, dict(marker, collected_through=1))
    shutil.rmtree(os.path.join(store_dir, "checkpoints", "commit=2"))
    with pytest.raises(uc.UmlosError):
        verify_store(store_dir)
    write_marker(store_dir, dict(marker, collected_through=2))
    assert verify_store(store_dir)["checkpoints_collected"] == 2
    # A collected checkpoint may be partly removed (an interrupted collection): it is not read.
    os.remove(os.path.join(store_dir, "checkpoints", "commit=1", "data", "cursors.cbor"))
    assert verify_store(store_dir)["checkpoints"] == 1
    assert restore_latest(store_dir).t == 3


def test_cli_gc(tmp_path, capsys):
    store_dir = str(tmp_path / "s")
    build(store_dir, 3)
    capsys.readouterr()
    assert main(["checkpoint", "gc", store_dir, "--keep-last", "1"]) == 0
    out = capsys.readouterr().out
    assert "keeping the checkpoints of commits 3" in out and "removed checkpoints/commit=1" in out
    assert "removed checkpoints/commit=2" in out and containers(store_dir) == ["commit=3"]
    assert main(["checkpoint", "verify", store_dir]) == 0
    assert "2 collected" in capsys.readouterr().out
    assert main(["checkpoint", "gc", store_dir, "--keep-last", "1"]) == 0
    assert "nothing to remove" in capsys.readouterr().out
    assert main(["checkpoint", "gc", store_dir, "--keep-last", "0"]) == 2
    assert "error CHECKPOINT_STATE_INVALID" in capsys.readouterr().err


# -- crashes -------------------------------------------------------------------------------


def fork_hooked(function, *, kill_at=None, label_log=None) -> int:
    """Run ``function()`` in a child that SIGKILLs itself at its ``kill_at``-th
    crash point (counted from 0) and logs the labels to ``label_log``."""
    warm_up()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            atomic.crash_hook = kill_hook(kill_at, label_log)
            function()
            os._exit(0)
        except BaseException:
            os._exit(3)
    return os.waitpid(pid, 0)[1]


def labels_of(function, log) -> list[str]:
    status = fork_hooked(function, label_log=log)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    return open(log).read().split()


def test_sigkill_at_every_step_of_a_collection(tmp_path):
    template = str(tmp_path / "template")
    status, _ = collect(*fork_writer(template, steps=4))  # commits 1..4 at t = 1..4, each with a checkpoint
    assert os.WIFEXITED(status)
    first = str(tmp_path / "labels")
    shutil.copytree(template, first)
    labels = labels_of(lambda: retention.collect_garbage(first, 1), str(tmp_path / "labels.log"))
    assert labels == ["gc_begin", "gc_marker_temp", "gc_marker_written"] + ["gc_removed"] * 3
    reference = Reference()
    for k, label in enumerate(labels):
        store_dir = str(tmp_path / f"k{k}")
        shutil.copytree(template, store_dir)
        status = fork_hooked(partial(retention.collect_garbage, store_dir, 1), kill_at=k)
        assert os.WIFSIGNALED(status), (k, label)
        # Without any repair: the store verifies and restores its newest commit.
        summary = verify_store(store_dir)
        assert summary["commits"] == 4 and summary["checkpoints"] + summary["checkpoints_collected"] == 4
        assert check_after_kill(store_dir, {4}, reference) == 4, (k, label)
        assert len(containers(store_dir)) == 4 - max(0, k - 2)
        # The next collection finishes the job.
        retention.collect_garbage(store_dir, 1)
        assert containers(store_dir) == ["commit=4"] and verify_store(store_dir)["checkpoints_collected"] == 3
        # And a writer continues from the newest commit.
        status, _ = collect(*fork_writer(store_dir, steps=1))
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        assert check_after_kill(store_dir, {5}, reference) == 5 and verify_store(store_dir)["checkpoints"] == 2
    print(f"\nSIGKILL at each of the {len(labels)} steps of a collection: {', '.join(labels)}")


def commit_with_keep_last(store_dir: str) -> None:
    """Open with keep_last = 2, restore the newest checkpoint, commit one more step."""
    store = CheckpointStore.open(store_dir, identity(), KEY, keep_last=2)
    restored = store.restore_latest()
    step(store, restored.t + 1, restored.cursors[DATASET])
    store.close()


def test_sigkill_at_every_step_of_a_commit_with_keep_last(tmp_path):
    template = str(tmp_path / "template")
    status, _ = collect(*fork_writer(template, steps=3))  # commits 1..3
    assert os.WIFEXITED(status)
    first = str(tmp_path / "labels")
    shutil.copytree(template, first)
    labels = labels_of(lambda: commit_with_keep_last(first), str(tmp_path / "labels.log"))
    assert labels.index("committed") < labels.index("gc_begin") and labels[-1] == "gc_removed"
    assert labels.count("gc_removed") == 2  # commits 1 and 2: keep 3 and 4
    reference = Reference()
    for k, label in enumerate(labels):
        store_dir = str(tmp_path / f"k{k}")
        shutil.copytree(template, store_dir)
        status = fork_hooked(partial(commit_with_keep_last, store_dir), kill_at=k)
        assert os.WIFSIGNALED(status), (k, label)
        newest = 4 if k >= labels.index("committed") else 3
        assert check_after_kill(store_dir, {newest}, reference) == newest, (k, label)
        # Recovery rolls back an interrupted commit; then everything verifies.
        retention_before = retention.read_collected(store_dir)
        uc.checkpoint.recover_store(store_dir)
        assert retention.read_collected(store_dir) == retention_before
        summary = verify_store(store_dir)
        assert summary["latest_t"] == newest and summary["commits"] == newest
        commit_with_keep_last(store_dir)  # the next commit collects what is due
        assert containers(store_dir) == [f"commit={newest}", f"commit={newest + 1}"]
        assert verify_store(store_dir)["checkpoints_collected"] == newest - 1
