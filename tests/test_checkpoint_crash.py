"""Crash consistency (docs/checkpoint-format.md §9.2, §9.4): a writer killed with SIGKILL at any
instant leaves either the previous checkpoint or the new one, fully valid, and
never one that verifies but holds other state.

Two campaigns:

* random instants: a forked writer restores the latest checkpoint and commits
  one step after another until the parent kills it after a random delay
  (>= 200 kills here; ``bench/bench_checkpoint_crash.py`` runs thousands);
* every step of the protocol: the writer kills itself (SIGKILL) exactly at
  the k-th step of a commit, and at the k-th removal of a recovery.

After every kill the parent checks, without recovering first: the latest
committed checkpoint is the one the writer's progress log allows (the commit
before the one in flight, or that one), a full restore verifies it, and its
cursors and tensors equal the uninterrupted run's state at its step. It then
recovers and verifies the whole store.

The stores live on tmpfs (``/dev/shm``) when the machine has one: there
``fsync`` costs nothing, so each kill is cheap. A SIGKILL does not lose the page
cache, so what these tests check (the protocol's order of renames) is the
same on any file system; what ``fsync`` adds is durability across power loss.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

import umlos_cuda as uc
from umlos_cuda.checkpoint import CheckpointStore, open_store, recover_store, restore_latest, verify_store
from umlos_cuda.checkpoint import atomic
from umlos_cuda.checkpoint.commit import store_leftovers
from umlos_cuda.checkpoint.tape import iter_fields
from test_checkpoint_support import DATASET, KEY, identity, reference_cursors, state

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the crash tests fork writer processes")


def warm_up() -> None:
    """Import and initialise in the parent what writers use, so a forked writer starts at once."""
    from umlos_cuda.checkpoint import signing, tensors

    signing.public_key_bytes(KEY)
    tensors.encode({"x": np.zeros(1)}, "warm-up")
    reference_cursors(identity().manifest, 2)


def crash_state(t: int, cursor: uc.Cursor):
    return state(t, cursor, shards=1, ranks=1)


def writer(store_dir: str, progress_fd: int, steps: int | None = None) -> None:
    """The writer process: open (recovering), restore or start, then step and commit."""
    ident = identity()
    store = CheckpointStore.open(store_dir, ident, KEY)
    restored = store.restore_latest()
    if restored is None:
        store.start_run(DATASET, world_size=1)
        t, cursor = 0, uc.Cursor()
    else:
        t, cursor = restored.t, restored.cursors[DATASET]
    os.write(progress_fd, b"R %d\n" % t)
    done = 0
    while steps is None or done < steps:
        t += 1
        batch = uc.next_batch(ident.manifest, DATASET, 1, 0, cursor=cursor, backend="numpy", t=t)
        store.tape.append(iter_fields(batch, t))
        cursor = batch.cursor
        os.write(progress_fd, b"B %d\n" % t)
        store.commit(crash_state(t, cursor))
        os.write(progress_fd, b"E %d\n" % t)
        done += 1
    store.close()


def kill_hook(kill_at: int | None, label_log: str | None):
    """A crash hook that appends each crash point's label to ``label_log`` and
    SIGKILLs the process at its ``kill_at``-th crash point (counted from 0)."""
    calls = [0]

    def hook(label):
        if label_log is not None:
            with open(label_log, "a") as handle:
                handle.write(label + "\n")
        if kill_at is not None and calls[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        calls[0] += 1

    return hook


def fork_writer(store_dir: str, *, steps: int | None = None, kill_at: int | None = None, label_log: str | None = None):
    """Start a writer; returns ``(pid, read end of its progress pipe)``.

    ``kill_at`` makes the writer SIGKILL itself at that crash point (counted
    over the whole process); ``label_log`` records the crash point labels."""
    warm_up()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            os.close(read_fd)
            atomic.crash_hook = kill_hook(kill_at, label_log)
            writer(store_dir, write_fd, steps)
            os._exit(0)
        except BaseException:
            os._exit(3)
    os.close(write_fd)
    return pid, read_fd


def wait_ready(read_fd: int) -> bytes:
    """Read the progress pipe until the writer says it restored (``R``); return what was read."""
    data = b""
    while b"R " not in data:
        chunk = os.read(read_fd, 4096)
        if not chunk:
            break
        data += chunk
    return data


def collect(pid: int, read_fd: int, already: bytes = b"") -> tuple[int, list[tuple[str, int]]]:
    """Wait for the writer; return its status and its B (commit begins) / E (commit ended) log."""
    _, status = os.waitpid(pid, 0)
    chunks = [already]
    while True:
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_fd)
    lines = [line.split() for line in b"".join(chunks).decode().splitlines()]
    return status, [(kind, int(t)) for kind, t in lines if kind in ("B", "E")]


@dataclass
class Outcomes:
    kills: int = 0
    mid_commit_kept_previous: int = 0
    mid_commit_got_new: int = 0
    between_commits: int = 0
    before_first_step: int = 0
    restores_checked: int = 0
    full_verifies: int = 0
    rolled_back_objects: int = 0
    codes: dict = field(default_factory=dict)


class Reference:
    """The uninterrupted run's cursors, extended on demand."""

    def __init__(self):
        self.cursors = reference_cursors(identity().manifest, 64)

    def cursor(self, t: int) -> uc.Cursor:
        while len(self.cursors) <= t:
            self.cursors += reference_cursors_from(self.cursors[-1], 64)
        return self.cursors[t]


def reference_cursors_from(cursor: uc.Cursor, steps: int) -> list[uc.Cursor]:
    m = identity().manifest
    out = []
    for _ in range(steps):
        cursor = uc.next_batch(m, DATASET, 1, 0, cursor=cursor, backend="numpy").cursor
        out.append(cursor)
    return out


def check_after_kill(store_dir: str, allowed: set[int], reference: Reference) -> int:
    """The latest committed checkpoint is allowed, verifies, and equals the reference."""
    try:
        _, commits = open_store(store_dir)
    except uc.UmlosError as exc:  # killed before the store existed
        assert exc.code == uc.errors.CHECKPOINT_NOT_FOUND
        commits = []
    latest = commits[-1].t if commits else 0
    assert latest in allowed, f"latest committed step {latest}, allowed {sorted(allowed)}"
    if latest:
        restored = restore_latest(store_dir, identity())  # full restore: verifies every byte first
        assert restored.t == latest
        cursor = reference.cursor(latest)
        assert restored.cursors[DATASET] == cursor
        want = crash_state(latest, cursor)
        for name, array in want.tensors[0][0].items():
            got = restored.tensors[0][0][name]
            assert got.dtype == array.dtype and np.array_equal(got, array)
        assert restored.user_state["rng_torch"] == want.user_state["rng_torch"]
        assert restored.dp_accountant == want.dp_accountant
    return latest


def random_kill_campaign(base_dir: str, kills: int, *, seed: int, stores: int = 10, max_delay: float = 0.04,
                         commit_delay: float = 0.02,
                         full_verify_every: int = 25) -> Outcomes:
    """Kill writers at random instants; return what happened."""
    rng = random.Random(seed)
    reference = Reference()
    outcomes = Outcomes()
    per_store = -(-kills // stores)
    for store_index in range(stores):
        store_dir = os.path.join(base_dir, f"store{store_index}")
        committed = 0
        for i in range(min(per_store, kills - outcomes.kills)):
            pid, read_fd = fork_writer(store_dir)
            already = b""
            if rng.random() < 0.7:  # most kills while committing, the rest anywhere from the start
                already = wait_ready(read_fd)
                time.sleep(rng.uniform(0.0, commit_delay))
            else:
                time.sleep(rng.uniform(0.0, max_delay))
            os.kill(pid, signal.SIGKILL)
            status, log = collect(pid, read_fd, already)
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"writer exited: {status}"
            outcomes.kills += 1
            if not log:
                allowed = {committed}
                outcomes.before_first_step += 1
            elif log[-1][0] == "E":
                allowed = {log[-1][1]}
                outcomes.between_commits += 1
            else:
                allowed = {log[-1][1] - 1, log[-1][1]}
            latest = check_after_kill(store_dir, allowed, reference)
            if log and log[-1][0] == "B":
                if latest == log[-1][1]:
                    outcomes.mid_commit_got_new += 1
                else:
                    outcomes.mid_commit_kept_previous += 1
            outcomes.restores_checked += 1 if latest else 0
            committed = latest
            if (i + 1) % full_verify_every == 0 and latest:
                report = recover_store(store_dir)
                outcomes.rolled_back_objects += len(report.rolled_back)
                assert store_leftovers(store_dir, open_store(store_dir)[1]) == ([], [])
                verify_store(store_dir)
                outcomes.full_verifies += 1
        report = recover_store(store_dir)
        outcomes.rolled_back_objects += len(report.rolled_back)
        summary = verify_store(store_dir)
        outcomes.full_verifies += 1
        # A store whose every writer was killed before its first commit (a
        # loaded machine can be that slow) holds no checkpoint: verify reports
        # latest_t None where this loop counts 0.
        assert summary["latest_t"] == (committed or None)
    return outcomes


@pytest.fixture()
def fast_dir(tmp_path):
    """A scratch folder on tmpfs when there is one (see the module docstring)."""
    import tempfile

    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        path = tempfile.mkdtemp(prefix="umlos-crash-", dir="/dev/shm")
        yield path
        shutil.rmtree(path, ignore_errors=True)
    else:
        yield str(tmp_path)


def test_sigkill_at_random_instants(fast_dir):
    outcomes = random_kill_campaign(fast_dir, 250, seed=20260218)
    print(f"\nSIGKILL at random instants: {outcomes}")
    assert outcomes.kills == 250
    # The campaign must have hit commits in flight both before and after their commit point.
    assert outcomes.mid_commit_kept_previous > 0 and outcomes.mid_commit_got_new + outcomes.between_commits > 0


def commit_labels(tmp_path) -> list[str]:
    """The crash points of one commit, as a writer passes them."""
    store_dir = str(tmp_path / "labels")
    log = str(tmp_path / "labels.log")
    status, _ = collect(*fork_writer(store_dir, steps=1))
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    status, _ = collect(*fork_writer(store_dir, steps=1, label_log=log))
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    labels = Path(log).read_text().split()
    assert labels[0] == "commit_begin" and labels[-1] == "committed"
    return labels


def test_sigkill_at_every_step_of_a_commit(tmp_path):
    labels = commit_labels(tmp_path)
    template = str(tmp_path / "template")
    status, _ = collect(*fork_writer(template, steps=1))  # commit 1 (t = 1)
    assert os.WIFEXITED(status)
    reference = Reference()
    for k, label in enumerate(labels):
        store_dir = str(tmp_path / f"k{k}")
        shutil.copytree(template, store_dir)
        status, _ = collect(*fork_writer(store_dir, steps=1, kill_at=k))
        assert os.WIFSIGNALED(status), (k, label)
        # The certificate rename ("committed") is the commit point.
        expected = 2 if label == "committed" else 1
        assert check_after_kill(store_dir, {expected}, reference) == expected, (k, label)
        report = recover_store(store_dir)
        if label not in ("commit_begin", "committed"):
            assert report.rolled_back, (k, label)  # the temp objects of the interrupted commit
        verify_store(store_dir)
        # The next writer continues from whatever is committed.
        status, _ = collect(*fork_writer(store_dir, steps=2))
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        assert check_after_kill(store_dir, {expected + 2}, reference) == expected + 2
        verify_store(store_dir)
    print(f"\nSIGKILL at each of the {len(labels)} steps of a commit: {', '.join(labels)}")


def test_sigkill_during_recovery(tmp_path):
    """A recovery killed midway leaves a store the next recovery completes."""
    labels = commit_labels(tmp_path)
    template = str(tmp_path / "template")
    collect(*fork_writer(template, steps=1))
    stop = labels.index("lineage_renamed")  # after the container and segments were renamed
    collect(*fork_writer(template, steps=1, kill_at=stop))
    _, commits = open_store(template)
    uncommitted, _ = store_leftovers(template, commits)
    assert len(uncommitted) >= 3
    reference = Reference()
    for j in range(len(uncommitted)):
        store_dir = str(tmp_path / f"r{j}")
        shutil.copytree(template, store_dir)
        # The writer's first crash points are recovery's removals.
        status, log = collect(*fork_writer(store_dir, steps=1, kill_at=j))
        assert os.WIFSIGNALED(status) and log == []  # killed before it restored
        assert check_after_kill(store_dir, {1}, reference) == 1
        report = recover_store(store_dir)
        assert len(report.rolled_back) == len(uncommitted) - j
        verify_store(store_dir)
