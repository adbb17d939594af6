"""Readers beside a live writer (docs/checkpoint-format.md §9.4): verification
sees the last commit whatever a running writer has in flight, and a reader
never makes a writer fail to open the store."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

import umlos_cuda as uc
from umlos_cuda import errors
from umlos_cuda.checkpoint import CheckpointStore, verify_store
from umlos_cuda.checkpoint.commit import checkpoint_dir
from umlos_cuda.checkpoint.lock import while_no_writer
from test_checkpoint_support import DATASET, KEY, identity, state
from test_checkpoint_store import build_store, expect_code, run_steps

#: How long the parent verifies while the child commits (bounded; see the live test).
VERIFY_SECONDS = 2.5


@pytest.fixture()
def store_dir(tmp_path):
    """A store with three commits, as test_checkpoint_store's fixture builds it."""
    path = str(tmp_path / "store")
    build_store(path)
    return path


def test_in_flight_objects_of_a_writer_are_not_leftovers(store_dir):
    store = CheckpointStore.open(store_dir, identity(), KEY)
    try:
        restored = store.restore_latest()
        run_steps(store, restored.cursors[DATASET], 7, 8)  # an open temp segment
        shutil.copytree(os.path.join(store_dir, checkpoint_dir(3)),
                        os.path.join(store_dir, "checkpoints", "commit=4.tmp"))
        summary = verify_store(store_dir)
        assert summary["writer_active"] is True and summary["commits"] == 3
        Path(os.path.join(store_dir, "trace", "notes.txt")).write_text("x")
        expect_code(errors.CHECKPOINT_UNEXPECTED_FILE, verify_store, store_dir)  # not a store name: refused anyway
        os.unlink(os.path.join(store_dir, "trace", "notes.txt"))
    finally:
        store.abandon()  # the writer is gone, its objects stay: now they are leftovers
    expect_code(errors.CHECKPOINT_UNCOMMITTED, verify_store, store_dir)


def test_a_reader_looking_does_not_make_a_writer_fail(store_dir):
    looking, done = threading.Event(), []

    def look():
        looking.set()
        time.sleep(0.3)
        return "looked"

    reader = threading.Thread(target=lambda: done.append(while_no_writer(store_dir, look)))
    reader.start()
    assert looking.wait(10)
    with CheckpointStore.open(store_dir, identity(), KEY, lock_timeout=0.0):  # waits for the reader, then opens
        assert done == [(True, "looked")]
        assert while_no_writer(store_dir, look) == (False, None)
    reader.join()


def committing_child(store_dir: str, stop_path: str, ready_fd: int) -> None:  # pragma: no cover - child process
    """Commit one step after another until ``stop_path`` exists (at most 500 commits)."""
    status = 3
    try:
        ident = identity()
        with CheckpointStore.open(store_dir, ident, KEY) as store:
            restored = store.restore_latest()
            t, cursor = restored.t, restored.cursors[DATASET]
            os.write(ready_fd, b"R")
            while not os.path.exists(stop_path) and t < 500:
                t += 1
                cursor = run_steps(store, cursor, t, t)
                time.sleep(0.01)  # the temp segment stays in flight meanwhile
                store.commit(state(t, cursor, shards=1, ranks=1))
        status = 0
    finally:
        os._exit(status)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks a writer process")
def test_verify_beside_a_process_that_commits_in_a_loop(store_dir, tmp_path):
    stop_path = str(tmp_path / "stop")
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os.close(read_fd)
        committing_child(store_dir, stop_path, write_fd)
    os.close(write_fd)
    failures, heads, active, runs = [], set(), 0, 0
    try:
        assert os.read(read_fd, 1) == b"R", "the writer did not start"
        started = time.monotonic()
        # Bounded: VERIFY_SECONDS, longer only if the writer has not committed twice meanwhile.
        while time.monotonic() - started < VERIFY_SECONDS or (len(heads) < 3 and time.monotonic() - started < 30):
            try:
                summary = verify_store(store_dir)
                heads.add(summary["head"])
                active += summary["writer_active"]
            except uc.UmlosError as exc:
                failures.append(f"{exc.code}: {exc.message}")
            runs += 1
    finally:
        open(stop_path, "w").close()
        _, status = os.waitpid(pid, 0)
        os.close(read_fd)
    assert failures == [], f"{len(failures)} of {runs} verifications failed: {failures[:3]}"
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert len(heads) >= 3 and active >= 1, (runs, len(heads), active)  # it verified while commits happened
    print(f"\n{runs} verifications beside {len(heads)} commits, {active} while the writer held the store")
    assert verify_store(store_dir)["writer_active"] is False  # the writer closed cleanly: nothing is left over
