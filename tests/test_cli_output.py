"""``--out`` of ``umlos-cuda next-batch`` and ``umlos-cuda indices``
(umlos_cuda/files/atomic.py): only a new name or, with ``--force``, an existing
regular file is written; the umask decides the mode; a full disk, a file size
limit or a signal is an ordinary failure that leaves no temp file behind.

Nothing here needs root or a special file system: a full disk is simulated by
the free-space figure the command reads and by RLIMIT_FSIZE in a child
process; the one device-node case runs only where ``mknod`` is allowed. The
files written are at most a few MiB, and the signal tests stop their child
before it has written much of its window."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import oracle
from nbcases import raw_manifest
from umlos_cuda.files import atomic as atomic_file
from umlos_cuda import cli, errors

RAW = raw_manifest(1000, 64, 48, seed=5)
WINDOW = oracle.Oracle(RAW).epoch("train", 0).window(0, 1000)
COMMANDS = {
    "indices": ["indices", "{m}", "--dataset", "train", "--epoch", "0", "--backend", "numpy", "--quiet"],
    "next-batch": ["next-batch", "{m}", "--dataset", "train", "--backend", "numpy"],
}


@pytest.fixture
def manifest(tmp_path) -> str:
    folder = tmp_path / "in"
    folder.mkdir()
    path = folder / "run.json"
    path.write_text(json.dumps(RAW))
    return str(path)


def write(capsys, manifest, which, target, *extra) -> tuple[int, str]:
    argv = [a.format(m=manifest) for a in COMMANDS[which]] + ["--out", str(target), *extra]
    status = cli.main(argv)
    return status, capsys.readouterr().err


def temp_files(folder) -> list[str]:
    return [name for name in os.listdir(folder) if name.startswith(".tmp-")]


def expected(which) -> list[int]:
    return WINDOW if which == "indices" else WINDOW[:48]


@pytest.fixture(params=sorted(COMMANDS))
def which(request) -> str:
    return request.param


# --------------------------------------------------------------- targets
@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077, 0o002])
def test_a_new_file_gets_the_umask_mode(capsys, manifest, tmp_path, which, umask):
    previous = os.umask(umask)
    try:
        status, err = write(capsys, manifest, which, tmp_path / "out.npy")
    finally:
        os.umask(previous)
    assert status == 0, err
    assert stat.S_IMODE(os.stat(tmp_path / "out.npy").st_mode) == 0o666 & ~umask
    assert np.load(tmp_path / "out.npy").tolist() == expected(which)


def test_an_existing_file_needs_force(capsys, manifest, tmp_path, which):
    target = tmp_path / "out.npy"
    target.write_bytes(b"keep me")
    status, err = write(capsys, manifest, which, target)
    assert status == 2 and err == f"error {errors.OUTPUT_EXISTS}: {target} exists; pass --force to replace it\n"
    assert target.read_bytes() == b"keep me" and temp_files(tmp_path) == []
    status, err = write(capsys, manifest, which, target, "--force")
    assert status == 0, err
    assert np.load(target).tolist() == expected(which) and temp_files(tmp_path) == []


def _fifo(path):
    os.mkfifo(path)


def _socket(path):
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.close()  # the socket file stays


def _symlink_to_file(path):
    (path.parent / "target.npy").write_bytes(b"target")
    os.symlink("target.npy", path)


def _dangling_symlink(path):
    os.symlink("nowhere.npy", path)


def _symlink_to_directory(path):
    (path.parent / "sub").mkdir()
    os.symlink("sub", path)


def _char_device(path):
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # what /dev/null is
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot create a device node here: {exc}")


@pytest.mark.parametrize(
    "make,kind",
    [(_fifo, "a FIFO"), (_socket, "a socket"), (_symlink_to_file, "a symbolic link"),
     (_dangling_symlink, "a symbolic link"), (_symlink_to_directory, "a symbolic link"),
     (_char_device, "a character device"), (os.mkdir, "a directory")],
    ids=lambda value: getattr(value, "__name__", value),
)
@pytest.mark.parametrize("force", [False, True])
def test_anything_but_a_regular_file_is_refused(capsys, manifest, tmp_path, which, make, kind, force):
    """Before the fix each of these was renamed over and became a regular mode-0600 file."""
    target = tmp_path / "out.npy"
    make(target)
    before = os.lstat(target)
    status, err = write(capsys, manifest, which, target, *(["--force"] if force else []))
    assert status == 2
    assert err.startswith(
        f"error {errors.OUTPUT_PATH_INVALID}: {target} is {kind}; umlos-cuda writes only regular files")
    after = os.lstat(target)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)  # untouched
    if make is _symlink_to_file:
        assert (tmp_path / "target.npy").read_bytes() == b"target"
    assert temp_files(tmp_path) == []


@pytest.mark.parametrize(
    "name,message",
    [
        ("missing/out.npy", "cannot write {t}/missing/out.npy: directory {t}/missing does not exist (create it first)"),
        ("file.txt/out.npy", "cannot write {t}/file.txt/out.npy: {t}/file.txt is not a directory"),
        ("sub/", "output path '{t}/sub/' names a directory; give a file name"),
    ],
)
def test_a_path_without_a_usable_directory_is_refused(capsys, manifest, tmp_path, which, name, message):
    (tmp_path / "file.txt").write_text("x")
    status, err = write(capsys, manifest, which, f"{tmp_path}/{name}")
    assert status == 2
    assert err == f"error {errors.OUTPUT_PATH_INVALID}: {message.format(t=tmp_path)}\n"
    assert sorted(os.listdir(tmp_path)) == ["file.txt", "in"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into any directory")
def test_an_unwritable_directory_is_refused(capsys, manifest, tmp_path, which):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        status, err = write(capsys, manifest, which, locked / "out.npy")
    finally:
        locked.chmod(0o700)
    assert status == 2
    assert err.startswith(f"error {errors.OUTPUT_PATH_INVALID}: cannot create a file in {locked}: Permission denied")
    assert os.listdir(locked) == []


def test_a_file_that_appears_during_the_work_is_not_replaced(tmp_path):
    """Without --force the file is published with link(), which never replaces."""
    target = tmp_path / "out.npy"
    with pytest.raises(errors.UmlosError) as info, atomic_file.atomic_output(target) as handle:
        handle.write(b"new")
        target.write_bytes(b"someone else's")
    assert info.value.code == errors.OUTPUT_EXISTS
    assert target.read_bytes() == b"someone else's" and temp_files(tmp_path) == []


def test_a_fifo_that_appears_during_the_work_is_not_replaced_even_with_force(tmp_path):
    target = tmp_path / "out.npy"
    with pytest.raises(errors.UmlosError) as info, atomic_file.atomic_output(target, force=True) as handle:
        handle.write(b"new")
        os.mkfifo(target)
    assert info.value.code == errors.OUTPUT_PATH_INVALID
    assert stat.S_ISFIFO(os.lstat(target).st_mode) and temp_files(tmp_path) == []


# --------------------------------------------------------------- full disk
class _Statvfs:
    def __init__(self, free_bytes):
        self.f_frsize = 4096
        self.f_bfree = self.f_bavail = free_bytes // 4096


def test_too_little_free_space_is_refused_before_any_work(capsys, manifest, tmp_path, which, monkeypatch):
    monkeypatch.setattr(atomic_file.os, "statvfs", lambda path: _Statvfs(0))  # a full disk
    status, err = write(capsys, manifest, which, tmp_path / "out.npy")
    size = 128 + 8 * len(expected(which))
    assert status == 2
    assert err == (f"error {errors.OUTPUT_WRITE_FAILED}: {tmp_path / 'out.npy'} needs {atomic_file._size(size)} "
                   f"but the file system of {tmp_path} has 0 bytes free\n")
    assert sorted(os.listdir(tmp_path)) == ["in"]


def test_the_exact_size_fits(capsys, manifest, tmp_path, monkeypatch):
    monkeypatch.setattr(atomic_file.os, "statvfs", lambda path: _Statvfs(128 + 8000 + 4095))
    status, err = write(capsys, manifest, "indices", tmp_path / "out.npy")
    assert status == 0, err


def _limit_file_size(limit):
    def preexec():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG, as Python arranges anyway
    return preexec


def test_a_file_size_limit_is_refused_before_any_work(manifest, tmp_path):
    target = tmp_path / "out.npy"
    done = subprocess.run(
        [sys.executable, "-m", "umlos_cuda.cli", "indices", manifest, "--dataset", "train", "--epoch", "0",
         "--backend", "numpy", "--out", str(target)],
        capture_output=True, text=True, timeout=120, preexec_fn=_limit_file_size(4096),
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"error {errors.OUTPUT_WRITE_FAILED}: {target} needs 7.9 KiB (8128 bytes) but this process "
                           f"may write files of at most 4.0 KiB (4096 bytes) (ulimit -f)\n")
    assert os.listdir(tmp_path) == ["in"]


#: Runs ``indices`` in-process with the pre-flight check disabled, so that the
#: file size limit strikes in the middle of the writes, as a disk filling up
#: during the work (or a quota) would.
MID_WRITE = """
import resource, sys
from umlos_cuda import cli
from umlos_cuda.files import atomic as atomic_file
from umlos_cuda.commands import nextbatch
resource.setrlimit(resource.RLIMIT_FSIZE, (20000, resource.RLIM_INFINITY))
atomic_file.check_free_space = lambda path, size: None
nextbatch.INDICES_CHUNK = 1000
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_write_failing_midway_is_an_error_and_removes_the_temp_file(tmp_path):
    manifest = tmp_path / "big.json"
    manifest.write_text(json.dumps(raw_manifest(100_000, 64, 48)))
    target = tmp_path / "out.npy"
    done = subprocess.run(
        [sys.executable, "-c", MID_WRITE, "indices", str(manifest), "--dataset", "train", "--epoch", "0",
         "--backend", "numpy", "--quiet", "--out", str(target)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"error {errors.OUTPUT_WRITE_FAILED}: writing {target} failed: File too large (EFBIG)\n"
    assert os.listdir(tmp_path) == ["big.json"]


# --------------------------------------------------------------- signals
def _default_signals():
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)  # whatever the test runner's parent ignores


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_during_a_large_window_removes_the_temp_file(tmp_path, signum):
    """A scheduler's SIGTERM (or a closed terminal's SIGHUP, or Ctrl-C) while
    ``indices`` writes 2^28 positions (2 GiB; about 16 chunks of NumPy work,
    seconds) stops it with status 128 + signal and no file left behind."""
    manifest = tmp_path / "run.json"
    manifest.write_text(json.dumps(raw_manifest(10**9, 1 << 20, 4096)))
    target = tmp_path / "window.npy"
    child = subprocess.Popen(
        [sys.executable, "-m", "umlos_cuda.cli", "indices", str(manifest), "--dataset", "train", "--epoch", "0",
         "--count", str(1 << 28), "--backend", "numpy", "--quiet", "--out", str(target)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_signals,
    )
    try:
        deadline = time.monotonic() + 120
        while not temp_files(tmp_path) and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert temp_files(tmp_path), f"no temp file appeared (status {child.poll()})"
        assert child.poll() is None, "the window finished before the signal"
        child.send_signal(signum)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 128 + signum, err
    assert err == ("interrupted\n" if signum == signal.SIGINT else f"terminated by {signum.name}\n")
    assert out == "" and sorted(os.listdir(tmp_path)) == ["run.json"]


# --------------------------------------------------------------- documentation
def test_the_new_codes_are_documented():
    """docs/nextbatch.md, "Failure codes", names every code this CLI and the
    entry points added for outputs and request sizes."""
    doc = Path(os.path.join(os.path.dirname(__file__), "..", "docs", "nextbatch.md")).read_text()
    section = doc.split("### Failure codes", 1)[1].split("\n## ", 1)[0]
    for code in (errors.OUTPUT_PATH_INVALID, errors.OUTPUT_EXISTS, errors.OUTPUT_WRITE_FAILED,
                 errors.REQUEST_TOO_LARGE):
        assert re.search(rf"`{code}`", section), code
