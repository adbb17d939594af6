"""One writer at a time in a folder (umlos_cuda/files/lock.py), in-process.

The lock file exists only while held and names its holder's pid; a second
taker is refused at once with that pid; a taker that opened the file just
before the holder removed it never believes it holds the lock (the race the
removal opens); a link, a FIFO or a hard link at the name is refused and left
as it was. Across processes: tests/test_sharded_one_writer.py.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from umlos_cuda.files import lock as lock_module
from umlos_cuda.files.folder import Folder
from umlos_cuda.files.lock import FolderLock, FolderLocked, hold_folder, try_hold_folder


@pytest.fixture
def folder(tmp_path):
    with Folder.open(str(tmp_path)) as opened:
        yield opened


def test_the_lock_file_names_its_holder_and_is_removed_on_release(folder, tmp_path):
    with FolderLock.take(folder, ".lock") as held:
        assert (tmp_path / ".lock").read_text() == f"{os.getpid()}\n" and held.path == str(tmp_path / ".lock")
    assert os.listdir(tmp_path) == []
    with FolderLock.take(folder, ".lock"):  # taken again after a release
        pass
    assert os.listdir(tmp_path) == []


def test_a_second_taker_is_refused_with_the_holders_pid(folder, tmp_path):
    with FolderLock.take(folder, ".lock"):
        with pytest.raises(FolderLocked) as refused:
            FolderLock.take(folder, ".lock")  # another open file description: flock refuses it too
        assert (refused.value.holder, refused.value.path) == (os.getpid(), str(tmp_path / ".lock"))
        assert (tmp_path / ".lock").read_text() == f"{os.getpid()}\n"  # the refused taker changed nothing


def test_a_stale_lock_file_is_taken_over(folder, tmp_path):
    (tmp_path / ".lock").write_text("999999999\n")  # left by a killed holder; no one holds the lock
    with FolderLock.take(folder, ".lock"):
        assert (tmp_path / ".lock").read_text() == f"{os.getpid()}\n"
    assert not (tmp_path / ".lock").exists()


@pytest.mark.parametrize("then", ["nothing", "another-takes-it"])
def test_a_taker_that_opened_the_file_before_its_removal_never_holds_it(folder, tmp_path, monkeypatch, then):
    held = FolderLock.take(folder, ".lock")
    late = os.open(tmp_path / ".lock", os.O_RDWR)  # a second taker has opened and checked the file ...
    real = lock_module.fcntl
    others: list[FolderLock] = []

    def flock(fd, operation):  # ... when the holder releases it (and, maybe, a third takes a new one)
        if fd == late and held.folder.fd >= 0:
            held.release()
            if then == "another-takes-it":
                others.append(FolderLock.take(folder, ".lock"))
        return real.flock(fd, operation)

    monkeypatch.setattr(lock_module, "fcntl", SimpleNamespace(flock=flock, LOCK_EX=real.LOCK_EX, LOCK_NB=real.LOCK_NB))
    try:
        assert lock_module._lock(folder, ".lock", late) is False  # its flock succeeds; the name says it is not ours
        assert [os.path.exists(tmp_path / ".lock")] == [then == "another-takes-it"]
    finally:
        os.close(late)
        for other in others:
            other.release()


@pytest.mark.parametrize("plant", ["symlink", "hard-link", "fifo", "folder"])
def test_a_name_that_is_no_lock_file_is_refused_and_left_alone(folder, tmp_path, plant):
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    target = tmp_path / ".lock"
    {"symlink": lambda: os.symlink(victim, target), "hard-link": lambda: os.link(victim, target),
     "fifo": lambda: os.mkfifo(target), "folder": lambda: target.mkdir()}[plant]()
    with pytest.raises(OSError):
        FolderLock.take(folder, ".lock")
    assert victim.read_text() == "keep me\n" and os.path.lexists(target)


def test_a_folder_hold_ends_when_its_descriptor_closes_though_the_folder_stays_open(folder, tmp_path):
    """A hold is its own open of the folder: a ``dup`` of the folder's descriptor would share the lock with it,
    so the hold would outlive ``os.close`` for as long as the folder stays open and every other taker would
    wait (DataLoader workers opening one block cache hung so)."""
    hold = hold_folder(folder)
    with Folder.open(str(tmp_path)) as other:
        assert try_hold_folder(other) is None
        os.close(hold)
        again = try_hold_folder(other)
        assert again is not None
        os.close(again)
