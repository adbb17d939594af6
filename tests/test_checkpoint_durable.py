"""umlos_cuda.files.durable: the durable-write steps the CLI's outputs and the
checkpoint store share (create exclusively, write all, fsync, rename, fsync
the folder), and each front end's own policy on top of them."""

from __future__ import annotations

import os

import pytest

from umlos_cuda.files import atomic as atomic_file, durable
from umlos_cuda import errors
from umlos_cuda.checkpoint import atomic


def test_create_exclusive_never_opens_an_existing_name_or_a_link(tmp_path):
    existing = tmp_path / "existing"
    existing.write_bytes(b"keep")
    with pytest.raises(FileExistsError):
        durable.create_exclusive(str(existing), 0o644)
    link = tmp_path / "link"
    os.symlink(tmp_path / "elsewhere", link)  # dangling: O_EXCL refuses it rather than create its target
    with pytest.raises(FileExistsError):
        durable.create_exclusive(str(link), 0o644)
    assert existing.read_bytes() == b"keep" and not (tmp_path / "elsewhere").exists()


def test_write_all_finishes_short_writes(tmp_path, monkeypatch):
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:3])))  # 3 bytes per call
    fd = durable.create_exclusive(str(tmp_path / "f"), 0o644)
    try:
        durable.write_and_sync(fd, bytes(range(100)))
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == bytes(range(100))


def test_both_front_ends_take_the_shared_steps(tmp_path, monkeypatch):
    """The CLI output and the store's atomic write create their files and fsync
    their folders through umlos_cuda.files.durable, each keeping its temp names."""
    created, synced = [], []
    real_create, real_sync = durable.create_exclusive, durable.fsync_directory
    monkeypatch.setattr(durable, "create_exclusive", lambda path, mode: created.append(path) or real_create(path, mode))
    monkeypatch.setattr(durable, "fsync_directory", lambda path: synced.append(path) or real_sync(path))
    with atomic_file.atomic_output(tmp_path / "out.txt") as handle:
        handle.write(b"cli")
    atomic.write_file_atomic(str(tmp_path / "store.cbor"), b"store")
    assert (tmp_path / "out.txt").read_bytes() == b"cli" and (tmp_path / "store.cbor").read_bytes() == b"store"
    names = [os.path.basename(path) for path in created]
    assert names[0].startswith(".tmp-") and names[0].endswith("-out.txt")  # hidden random name (CLI)
    assert names[1] == "store.cbor.tmp"  # fixed name recovery recognises (store)
    assert synced == [str(tmp_path), str(tmp_path)]
    assert sorted(os.listdir(tmp_path)) == ["out.txt", "store.cbor"]


def test_each_front_end_keeps_its_codes(tmp_path, monkeypatch):
    def full(fd, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(errors.UmlosError) as full_disk:
        atomic.write_file_atomic(str(tmp_path / "store.cbor"), b"x")
    assert full_disk.value.code == errors.CHECKPOINT_IO_ERROR and "cannot write" in full_disk.value.message
    assert full_disk.value.record["failure_operator"] == errors.CHECKPOINT_SERIALIZE_OPERATOR
    monkeypatch.undo()
    (tmp_path / "taken").write_bytes(b"")
    with pytest.raises(errors.UmlosError) as out, atomic_file.atomic_output(tmp_path / "taken") as handle:
        handle.write(b"x")
    assert out.value.code == errors.OUTPUT_EXISTS
    with pytest.raises(errors.UmlosError) as store:
        atomic.write_file(str(tmp_path / "taken"), b"x")
    assert store.value.code == errors.CHECKPOINT_IO_ERROR and "cannot create" in store.value.message


def test_a_tape_segment_that_cannot_be_synced_fails_with_a_code(tmp_path, monkeypatch):
    """The fsync of a sealed segment was the one OS call of the writer that raised a bare OSError."""
    from umlos_cuda.checkpoint import CheckpointStore
    from test_checkpoint_support import DATASET, KEY, identity

    with CheckpointStore(str(tmp_path / "s"), identity(), KEY) as store:
        store.start_run(DATASET, world_size=1)

        def failing_fsync(fd):
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(os, "fsync", failing_fsync)
        with pytest.raises(errors.UmlosError) as info:
            store.commit()
        monkeypatch.undo()
    assert info.value.code == errors.CHECKPOINT_IO_ERROR and "cannot fsync" in info.value.message
    assert info.value.record["failure_operator"] == errors.TAPE_OPERATOR
