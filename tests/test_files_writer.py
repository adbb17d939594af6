"""The output layer itself (umlos_cuda/files/: writer, artifacts, inputs, folder, atomic).

What every writing command relies on, tested once here: a folder appears
whole or not at all, with its artifact marker and the umask's modes; ``force``
replaces only a folder (or file) of the same kind and never an input; nothing
is written through a link at a level the writer creates; a failure leaves no
temp folder behind. The commands' own cases are in tests/test_hostile_writers.py.
"""

from __future__ import annotations

import json
import os
import stat

import pytest

from umlos_cuda import errors
from umlos_cuda.errors import UmlosError
from umlos_cuda.files import artifacts, atomic
from umlos_cuda.files.artifacts import MARKER, ArtifactKind, FileKind
from umlos_cuda.files.folder import Folder
from umlos_cuda.files.inputs import refuse_inputs
from umlos_cuda.files.lock import try_hold_folder
from umlos_cuda.files.writer import (check_output_folder, open_in_place, output_folder, remove_stale_temps,
                                     temp_folder)

PLAN = ArtifactKind("plan", lambda folder: artifacts.json_field(folder, "meta.json", "format") == "old-plan")
STORE = ArtifactKind("token store")


def code_of(function, *args, **kwargs) -> UmlosError:
    with pytest.raises(UmlosError) as info:
        function(*args, **kwargs)
    return info.value


def write(path, kind=PLAN, force=False, inputs=(), content=b"data"):
    with output_folder(path, kind, force=force, inputs=inputs) as folder:
        folder.write_bytes("file.bin", content)
        with folder.mkdir("sub") as sub:
            sub.write_bytes("inner.bin", content)


def hidden(folder) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.startswith("."))


# ---------------------------------------------------------------------- markers
def test_a_written_folder_carries_its_marker(tmp_path):
    write(tmp_path / "out")
    marker = json.loads((tmp_path / "out" / MARKER).read_text())
    assert marker == {"artifact": "plan", "format": artifacts.MARKER_FORMAT}
    assert (tmp_path / "out" / MARKER).read_bytes() == PLAN.marker_bytes()
    with Folder.open(str(tmp_path / "out")) as folder:
        assert artifacts.marked_kind(folder) == "plan" and artifacts.identify(folder, STORE) == (False, "plan")


@pytest.mark.parametrize("content", [b"", b"[" * 100_000, b"\xff\xfe", b'{"artifact": 3}', b"x" * 5000,
                                     b'{"artifact": "plan", "format": "other"}'])
def test_a_marker_that_is_not_one_names_no_kind(tmp_path, content):
    (tmp_path / MARKER).write_bytes(content)
    with Folder.open(str(tmp_path)) as folder:
        assert artifacts.marked_kind(folder) is None


def test_a_fifo_or_a_link_as_marker_is_not_read(tmp_path):
    os.mkfifo(tmp_path / MARKER)  # opening it for reading would block without O_NONBLOCK
    with Folder.open(str(tmp_path)) as folder:
        assert artifacts.marked_kind(folder) is None
    os.unlink(tmp_path / MARKER)
    (tmp_path / "real").write_bytes(PLAN.marker_bytes())
    os.symlink(tmp_path / "real", tmp_path / MARKER)
    with Folder.open(str(tmp_path)) as folder:
        assert artifacts.marked_kind(folder) is None


def test_a_folder_written_before_markers_is_known_by_its_signature(tmp_path):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "meta.json").write_text('{"format": "old-plan"}')
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "meta.json").write_text('{"format": "a model"}')
    with Folder.open(str(tmp_path / "old")) as old, Folder.open(str(tmp_path / "model")) as model:
        assert artifacts.identify(old, PLAN) == (True, None)
        assert artifacts.identify(model, PLAN) == (False, None)  # a meta.json alone proves nothing
        assert artifacts.identify(old, STORE) == (False, None)  # no signature: only a marker says "token store"


# ---------------------------------------------------------------------- output folders
@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_modes_come_from_the_umask(tmp_path, umask):
    previous = os.umask(umask)
    try:
        write(tmp_path / "out")
    finally:
        os.umask(previous)
    for base, _, files in os.walk(tmp_path / "out"):
        assert stat.S_IMODE(os.stat(base).st_mode) == 0o777 & ~umask
        for name in files:
            assert stat.S_IMODE(os.stat(os.path.join(base, name)).st_mode) == 0o666 & ~umask


def test_force_replaces_the_same_kind_and_leaves_nothing_aside(tmp_path):
    write(tmp_path / "out", content=b"old")
    assert code_of(write, tmp_path / "out").code == errors.OUTPUT_EXISTS
    write(tmp_path / "out", force=True, content=b"new")
    assert (tmp_path / "out" / "sub" / "inner.bin").read_bytes() == b"new" and hidden(tmp_path) == []


def test_force_never_replaces_another_kind_or_a_foreign_folder(tmp_path):
    write(tmp_path / "store", kind=STORE)
    error = code_of(write, tmp_path / "store", force=True)
    assert error.code == errors.OUTPUT_PATH_INVALID
    assert "is a token store written by umlos-cuda, not a plan" in error.message
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "meta.json").write_text("{}")
    (tmp_path / "model" / "weights.bin").write_bytes(b"w")
    error = code_of(write, tmp_path / "model", force=True)
    assert error.code == errors.OUTPUT_PATH_INVALID and "--force replaces only a plan" in error.message
    assert sorted(os.listdir(tmp_path / "model")) == ["meta.json", "weights.bin"] and hidden(tmp_path) == []
    (tmp_path / "empty").mkdir()
    write(tmp_path / "empty", force=True)  # an empty folder holds nothing to lose


def test_a_link_is_never_the_output(tmp_path):
    write(tmp_path / "real")
    os.symlink(tmp_path / "real", tmp_path / "link")
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    for name in ("link", "dangling"):
        error = code_of(write, tmp_path / name, force=True)
        assert error.code == errors.OUTPUT_PATH_INVALID and "symbolic link" in error.message
    assert not (tmp_path / "nowhere").exists() and os.readlink(tmp_path / "link") == str(tmp_path / "real")


def test_a_parent_that_is_a_link_is_the_users_choice(tmp_path):
    (tmp_path / "scratch").mkdir()
    os.symlink(tmp_path / "scratch", tmp_path / "alias")
    write(tmp_path / "alias" / "out")
    assert (tmp_path / "scratch" / "out" / MARKER).exists()


def test_a_failure_leaves_nothing_and_a_retry_needs_no_force(tmp_path):
    def failing():
        with output_folder(tmp_path / "out", PLAN) as folder:
            folder.write_bytes("a.bin", b"a")
            raise OSError(28, "No space left on device")

    error = code_of(failing)
    assert error.code == errors.OUTPUT_WRITE_FAILED and str(tmp_path / "out") in error.message
    assert os.listdir(tmp_path) == []
    with pytest.raises(KeyboardInterrupt), output_folder(tmp_path / "out", PLAN):
        raise KeyboardInterrupt
    assert os.listdir(tmp_path) == []
    write(tmp_path / "out")


def test_what_appeared_meanwhile_is_checked_again_before_it_is_replaced(tmp_path):
    def swap():
        with output_folder(tmp_path / "out", PLAN) as folder:
            folder.write_bytes("a.bin", b"a")
            (tmp_path / "out").mkdir()
            (tmp_path / "out" / "mine.txt").write_text("keep")

    assert code_of(swap).code == errors.OUTPUT_EXISTS
    assert os.listdir(tmp_path / "out") == ["mine.txt"] and hidden(tmp_path) == []


def test_missing_parent_and_files_in_the_way(tmp_path):
    assert code_of(check_output_folder, tmp_path / "no" / "out", PLAN).code == errors.OUTPUT_PATH_INVALID
    (tmp_path / "file").write_text("x")
    assert code_of(check_output_folder, tmp_path / "file", PLAN, force=True).code == errors.OUTPUT_PATH_INVALID
    assert code_of(check_output_folder, tmp_path / "file" / "out", PLAN).code == errors.OUTPUT_PATH_INVALID


# ---------------------------------------------------------------------- a folder held open
def test_nothing_is_created_through_a_planted_link(tmp_path):
    (tmp_path / "victim").write_text("keep")
    with Folder.open(str(tmp_path)) as folder:
        os.symlink(tmp_path / "victim", tmp_path / "planted")
        with pytest.raises(FileExistsError):
            folder.create("planted")
        os.symlink(tmp_path / "gone", tmp_path / "dangling")
        with pytest.raises(FileExistsError):
            folder.create("dangling")
        folder.replace_file("planted", b"new")  # the rename replaces the link itself
        os.symlink(tmp_path, tmp_path / "dirlink")
        with pytest.raises(OSError):
            folder.sub("dirlink")
        folder.remove("dirlink")
    assert (tmp_path / "victim").read_text() == "keep" and not (tmp_path / "gone").exists()
    assert (tmp_path / "planted").read_bytes() == b"new" and not os.path.islink(tmp_path / "planted")
    assert (tmp_path / "victim").exists()


def test_a_renamed_folder_is_still_the_one_written(tmp_path):
    """Writes go through the descriptor: swapping the path for a link sends nothing elsewhere."""
    (tmp_path / "elsewhere").mkdir()
    os.mkdir(tmp_path / "work")
    with Folder.open(str(tmp_path / "work")) as folder:
        os.rename(tmp_path / "work", tmp_path / "moved")
        os.symlink(tmp_path / "elsewhere", tmp_path / "work")
        folder.write_bytes("a.bin", b"a")
    assert os.listdir(tmp_path / "elsewhere") == [] and (tmp_path / "moved" / "a.bin").read_bytes() == b"a"


def test_open_in_place_creates_reopens_and_refuses(tmp_path):
    def foreign(path, found):
        return UmlosError(errors.BATCH_OUTPUT_MISMATCH, f"{path} is {found}", operator=errors.BATCHING_OPERATOR)

    with open_in_place(tmp_path / "out", PLAN, foreign=foreign) as folder:
        folder.write_bytes("a.bin", b"a")
    assert json.loads((tmp_path / "out" / MARKER).read_text())["artifact"] == "plan"
    with open_in_place(tmp_path / "out", PLAN, foreign=foreign) as folder:
        assert sorted(folder.names()) == ["a.bin", MARKER]
    assert code_of(open_in_place, tmp_path / "out", STORE, foreign=foreign).code == errors.BATCH_OUTPUT_MISMATCH
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "meta.json").write_text('{"format": "old-plan"}')
    open_in_place(tmp_path / "old", PLAN, foreign=foreign).close()  # known by its signature: marked now
    assert (tmp_path / "old" / MARKER).read_bytes() == PLAN.marker_bytes()
    os.symlink(tmp_path / "out", tmp_path / "link")
    assert code_of(open_in_place, tmp_path / "link", PLAN, foreign=foreign).code == errors.OUTPUT_PATH_INVALID
    (tmp_path / "linked-marker").mkdir()
    (tmp_path / "linked-marker" / "meta.json").write_text('{"format": "old-plan"}')
    os.symlink(tmp_path / "victim", tmp_path / "linked-marker" / MARKER)
    error = code_of(open_in_place, tmp_path / "linked-marker", PLAN, foreign=foreign)
    assert error.code == errors.OUTPUT_PATH_INVALID and MARKER in error.message
    assert not (tmp_path / "victim").exists()


def _foreign(path, found):
    return UmlosError(errors.BATCH_OUTPUT_MISMATCH, f"{path} is {found}", operator=errors.BATCHING_OPERATOR)


def test_open_in_place_takes_a_folder_another_process_created_a_moment_before(tmp_path, monkeypatch):
    """The DataLoader workers sharing a block cache open it at once: the one whose ``mkdir`` finds the folder
    there opens it instead of failing (``EEXIST`` was once an OUTPUT_PATH_INVALID)."""
    made = Folder.mkdir

    def made_by_another_first(self, name):
        with made(self, name) as other:
            artifacts.write_marker(other, STORE)
        raise FileExistsError(17, "File exists")

    monkeypatch.setattr(Folder, "mkdir", made_by_another_first)
    with open_in_place(tmp_path / "cache", STORE, foreign=_foreign) as folder:
        assert folder.names() == [MARKER]
    assert artifacts.marker_artifact((tmp_path / "cache" / MARKER).read_bytes()) == "token store"


def _open_at_once(paths, barrier, results):
    """In a process of its own: open each of ``paths`` at the moment the others do (``barrier``)."""
    for path in paths:
        barrier.wait(timeout=120)
        try:
            with open_in_place(path, STORE, foreign=_foreign) as folder:
                folder.write_bytes(f"{os.getpid()}.bin", b"x")  # what a worker's first block does next
            results.put((str(path), "ok"))
        except UmlosError as exc:
            results.put((str(path), f"{exc.code}: {exc.message}"))


def test_processes_opening_one_new_folder_at_once_all_succeed(tmp_path):
    """Four processes open each of ten new folders at the same moment: each opens it, one marker is written,
    and no process sees another's half-written marker or takes the others' files for a foreign folder. The
    processes are started by ``spawn`` (a fork of a test process with threads could hang on a lock they held)."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    paths = [tmp_path / f"cache{round_}" for round_ in range(10)]
    barrier, results = context.Barrier(4), context.Queue()
    workers = [context.Process(target=_open_at_once, args=(paths, barrier, results)) for _ in range(4)]
    for worker in workers:
        worker.start()
    try:
        outcomes = [results.get(timeout=180) for _ in range(4 * len(paths))]
    finally:
        for worker in workers:
            worker.join(timeout=60)
            if worker.is_alive():
                worker.kill()
    assert sorted(outcomes) == sorted((str(path), "ok") for path in paths for _ in range(4))
    for path in paths:
        assert (path / MARKER).read_bytes() == STORE.marker_bytes() and len(os.listdir(path)) == 5


# ---------------------------------------------------------------------- inputs
def test_an_output_is_never_an_input(tmp_path):
    (tmp_path / "data").mkdir()
    dataset = tmp_path / "data" / "ds.jsonl"
    dataset.write_text("{}\n")
    os.link(dataset, tmp_path / "hard.jsonl")
    os.symlink(dataset, tmp_path / "soft.jsonl")
    cases = {
        dataset: f" is {dataset},", tmp_path / "hard.jsonl": f" is {dataset},",
        tmp_path / "soft.jsonl": f" is {dataset},",
        tmp_path / "data": f" holds {dataset},",
    }
    for output, words in cases.items():
        error = code_of(refuse_inputs, output, [dataset])
        assert error.code == errors.OUTPUT_IS_INPUT and words in error.message and str(output) in error.message
    (tmp_path / "model").mkdir()
    error = code_of(refuse_inputs, tmp_path / "model" / "store", [tmp_path / "model"])
    assert "would be inside" in error.message
    refuse_inputs(tmp_path / "data" / "sibling", [dataset, tmp_path / "missing", None])  # beside it, missing, absent


def test_a_folder_output_refuses_its_inputs_before_anything_else(tmp_path):
    write(tmp_path / "plan")
    (tmp_path / "plan" / "lengths.jsonl").write_text("{}\n")
    error = code_of(write, tmp_path / "plan", force=True, inputs=[tmp_path / "plan" / "lengths.jsonl"])
    assert error.code == errors.OUTPUT_IS_INPUT and (tmp_path / "plan" / "lengths.jsonl").exists()


# ---------------------------------------------------------------------- one file
def _starts_a_json_object(path: str) -> bool:
    with open(path, "rb") as handle:
        return handle.read(1) == b"{"


CACHE = FileKind("length cache", _starts_a_json_object)


def test_force_replaces_a_file_only_of_its_kind(tmp_path):
    (tmp_path / "cache.jsonl").write_text('{"x": 1}\n')
    (tmp_path / "notes.txt").write_text("mine\n")
    with atomic.atomic_output(tmp_path / "cache.jsonl", force=True, kind=CACHE) as handle:
        handle.write(b"{}\n")
    error = code_of(atomic.check_output_path, tmp_path / "notes.txt", True, kind=CACHE)
    assert error.code == errors.OUTPUT_PATH_INVALID and "not a length cache" in error.message
    assert (tmp_path / "notes.txt").read_text() == "mine\n"


def test_a_pending_file_is_published_only_when_asked(tmp_path):
    pending = atomic.PendingFile(tmp_path / "out.bin")
    pending.handle.write(b"abc")
    pending.finish()
    assert not (tmp_path / "out.bin").exists() and len(os.listdir(tmp_path)) == 1
    pending.publish()
    assert os.listdir(tmp_path) == ["out.bin"] and (tmp_path / "out.bin").read_bytes() == b"abc"
    discarded = atomic.PendingFile(tmp_path / "other.bin")
    discarded.discard()
    assert os.listdir(tmp_path) == ["out.bin"]


# ---------------------------------------------------------------------- temps: marked, held, reaped when stale
def test_a_temp_is_marked_and_held_while_written_and_only_a_stale_one_is_removed(tmp_path):
    with output_folder(tmp_path / "out", PLAN), temp_folder(tmp_path / "out", "stage", PLAN) as stage:
        temps = hidden(tmp_path)
        assert len(temps) == 2 and os.path.basename(stage) in temps
        for name in temps:
            with Folder.open(str(tmp_path / name)) as temp:
                assert artifacts.marked_kind(temp) == "plan"
                assert try_hold_folder(temp) is None  # its writer holds it
        assert remove_stale_temps(tmp_path / "out", PLAN) == []  # live: kept
        assert hidden(tmp_path) == temps
    assert hidden(tmp_path) == [] and (tmp_path / "out").is_dir()
    # what a SIGKILL leaves: a marked temp no process holds (made here by hand, as the writer makes them)
    for name, kind in ((".tmp-out-0123abcd", "plan"), (".tmp-out-stage-4567abcd", "plan"),
                       (".tmp-out-89abcdef", "token store"), (".tmp-outx-feedbeef", "plan")):
        (tmp_path / name).mkdir()
        (tmp_path / name / MARKER).write_bytes(ArtifactKind(kind).marker_bytes())
    removed = remove_stale_temps(tmp_path / "out", PLAN)
    assert sorted(map(os.path.basename, removed)) == [".tmp-out-0123abcd", ".tmp-out-stage-4567abcd"]
    assert hidden(tmp_path) == [".tmp-out-89abcdef", ".tmp-outx-feedbeef"]  # another kind; another output
