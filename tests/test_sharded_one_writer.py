"""One writer at a time in a sharded token store (tokens/adopt.py, "One writer at a time"; issue 33).

The attack this answers: two ``data append`` runs into one store at once. The
second wrote ``digests/NNNNN.npy`` over the first's, found the shard name
taken and rolled back by deleting files it had not created: the store no
longer verified. Here the second append runs as a real second process while
the first is held, by a pipe, at a chosen step (no sleeps: the child says
"held" and waits for "go"):

* it is refused with SHARDED_STORE_LOCKED naming the store and the first's
  pid, and changes nothing, whether the first is still checking or has
  already written its digests and moved its shard; ``tokenize --append``
  is refused before it tokenizes a file;
* two appends released together by a barrier end with a store that
  verifies, each append either adopted (its folder moved in) or refused
  (its folder where it was);
* a shard folder of another sharded store, or one this store lists, is never
  moved; a rollback removes only the files the append created; a digest file
  an interrupted append left is replaced; ``--create --force`` never
  replaces a store another append holds.

The retry after a killed append is tests/test_batching_sharded.py's
``test_an_append_killed_before_the_index_leaves_the_store_valid``; planted
lock files are cases of the hostile suites.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from batching_cases import expect, train_tokenizer, write_model_dir
from token_cases import write_dataset
from umlos_cuda import errors
from umlos_cuda.batching.tokens import adopt
from umlos_cuda.batching.tokens.index import digests_name
from umlos_cuda.batching.tokens.sharded import ShardedTokenStore, append_shards, tokenize_shard, tokenize_sharded
from umlos_cuda.cli import EXIT_UMLOS_ERROR
from hostile_support import tree_state as tree

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, *sys.path])}
#: A child that waits longer than this for its "go" fails (a test bug), never passes.
CHILD_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """A store of two shards (parts 0 and 1 of a four-file dataset), two staged shards (a: part 2, b: part 3) and
    another sharded store (parts 2 and 3)."""
    root = tmp_path_factory.mktemp("one-writer")
    write_model_dir(root / "model", train_tokenizer(), {"eos_token": "</s>"})
    parts = [str(root / f"part-{i}.jsonl") for i in range(4)]
    for i, part in enumerate(parts):
        write_dataset(part, 12 + i, seed=40 + i, ids=False)
    tokenize_sharded(parts[:2], root / "model", root / "store")
    tokenize_shard(parts, 2, root / "model", root / "a")
    tokenize_shard(parts, 3, root / "model", root / "b")
    tokenize_sharded(parts[2:], root / "model", root / "other")
    return root


@pytest.fixture
def world(template, tmp_path) -> Path:
    for name in ("store", "a", "b", "other"):
        shutil.copytree(template / name, tmp_path / name)
    return tmp_path


class HeldAppend:
    """``append_shards(store, [staged], **options)`` in a child process that stops just before ``adopt.<step>``
    runs (the store locked by then), says ``held`` and waits for ``go`` on its standard input."""

    def __init__(self, step: str, store: Path, staged: Path, **options) -> None:
        script = textwrap.dedent(f"""
            import sys
            from umlos_cuda.batching.tokens import adopt
            original = adopt.{step}
            def held(*args, **kwargs):
                print("held", flush=True)
                if sys.stdin.readline() != "go\\n":
                    raise SystemExit("not told to go on")
                return original(*args, **kwargs)
            adopt.{step} = held
            store = adopt.append_shards({str(store)!r}, [{str(staged)!r}], **{options!r})
            print(f"appended {{store.num_parts}}", flush=True)
        """)
        self.process = subprocess.Popen([sys.executable, "-c", script], env=ENV, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()  # blocks until the child holds the store (or dies: "")
        if line != "held\n":
            self.process.kill()
            raise AssertionError(f"the child never reached {step}: {line!r} {self.process.stderr.read()}")

    @property
    def pid(self) -> int:
        return self.process.pid

    def go(self) -> str:
        out, err = self.process.communicate("go\n", timeout=CHILD_TIMEOUT_S)
        assert self.process.returncode == 0, err
        return out


def cli(*args) -> subprocess.CompletedProcess:
    """``umlos-cuda ARGS`` in a second process."""
    return subprocess.run([sys.executable, "-m", "umlos_cuda.cli", *map(str, args)], env=ENV, capture_output=True,
                          text=True, timeout=CHILD_TIMEOUT_S)


def assert_locked_out(result: subprocess.CompletedProcess, store: Path, holder: int) -> None:
    assert result.returncode == EXIT_UMLOS_ERROR, result.stderr
    assert result.stderr.startswith("error SHARDED_STORE_LOCKED: "), result.stderr
    assert str(store) in result.stderr and f"process {holder}," in result.stderr, result.stderr


# ====================================================================== a second writer
@pytest.mark.parametrize("step", ["_prepare", "_replace_index"], ids=["while-checking", "after-moving-its-shard"])
def test_a_second_append_is_refused_while_the_first_holds_the_store(world, step):
    store, first, second = world / "store", world / "a", world / "b"
    held = HeldAppend(step, store, first)
    before, second_before = tree(store), tree(second)
    assert_locked_out(cli("data", "append", store, second), store, held.pid)
    assert tree(store) == before and tree(second) == second_before  # nothing written, nothing removed
    assert held.go().strip() == "appended 3"
    assert ShardedTokenStore.open(store).verify()["shards"] == 3 and not first.exists()
    assert not (store / ".lock").exists()
    assert append_shards(store, [second]).verify()["shards"] == 4  # the same command again, now alone


def test_create_force_never_replaces_a_store_another_append_holds(world):
    store = world / "store"
    held = HeldAppend("_replace_index", store, world / "a")
    before = tree(store)
    expect(errors.SHARDED_STORE_LOCKED, append_shards, store, [world / "b"], create=True, force=True,
           mention=f"process {held.pid},")
    assert tree(store) == before and (world / "b").is_dir()
    held.go()
    assert ShardedTokenStore.open(store).verify()["shards"] == 3


RACER = textwrap.dedent("""
    import sys
    from umlos_cuda.cli import main
    print("ready", flush=True)
    if sys.stdin.readline() != "go\\n":
        raise SystemExit("not told to go on")
    sys.exit(main(["data", "append", sys.argv[1], sys.argv[2]]))
""")


@pytest.mark.parametrize("round_", range(3))
def test_two_appends_released_together_leave_a_store_that_verifies(world, round_):
    store = world / "store"
    racers = {staged: subprocess.Popen([sys.executable, "-c", RACER, str(store), str(world / staged)], env=ENV,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True) for staged in ("a", "b")}
    for racer in racers.values():  # the barrier: both have imported everything before either starts
        assert racer.stdout.readline() == "ready\n", racer.stderr.read()
    for racer in racers.values():
        racer.stdin.write("go\n")
        racer.stdin.flush()
    results = {staged: racer.communicate(timeout=CHILD_TIMEOUT_S) for staged, racer in racers.items()}
    adopted = []
    for staged, racer in racers.items():
        if racer.returncode == 0:
            adopted.append(staged)
            assert not (world / staged).exists()
        else:
            assert racer.returncode == EXIT_UMLOS_ERROR and "error SHARDED_STORE_LOCKED" in results[staged][1], \
                results[staged][1]
            assert (world / staged / "meta.json").is_file()  # refused: its folder is where it was
    assert adopted  # the lock refuses a second writer, never both
    reopened = ShardedTokenStore.open(store)
    assert reopened.verify()["shards"] == 2 + len(adopted)
    assert sorted(os.listdir(store / "shards")) == [f"{i:05d}" for i in range(2 + len(adopted))]
    assert sorted(os.listdir(store / "digests")) == sorted(
        name for i in range(2 + len(adopted)) for name in (f"{i:05d}.npy", f"{i:05d}.ids.npy"))
    assert not (store / ".lock").exists()


def test_tokenize_append_is_refused_before_it_tokenizes_a_file(world, template, monkeypatch):
    from umlos_cuda.batching.tokens import partition

    store = world / "store"
    held = HeldAppend("_prepare", store, world / "a")
    tokenized = []
    monkeypatch.setattr(partition, "tokenize_shard", lambda *args, **kwargs: tokenized.append(args))
    expect(errors.SHARDED_STORE_LOCKED, tokenize_sharded, [str(template / "part-3.jsonl")], template / "model", store,
           append=True, mention=f"process {held.pid},")
    assert tokenized == [] and not [name for name in os.listdir(world) if name.startswith(".tmp")]
    held.go()
    assert ShardedTokenStore.open(store).verify()["shards"] == 3


# ====================================================================== what an append may move and remove
def test_a_shard_of_another_sharded_store_is_never_moved(world):
    store, other = world / "store", world / "other"
    before, other_before = tree(store), tree(other)
    for shard in ("00000", "00001"):  # rows the store does not hold: only where the folder is refuses it
        expect(errors.SHARDED_STORE_MISMATCH, append_shards, store, [other / "shards" / shard],
               mention=f"is a shard folder of the sharded token store {other}")
    expect(errors.SHARDED_STORE_MISMATCH, append_shards, world / "new", [other / "shards" / "00001"], create=True,
           mention="copy it")
    assert tree(other) == other_before and ShardedTokenStore.open(other).verify()["shards"] == 2
    assert tree(store) == before and not (world / "new").exists()
    expect(errors.SHARDED_STORE_MISMATCH, append_shards, store, [store / "shards" / "00000"],
           mention="is already shard 00000")
    shutil.copytree(other / "shards" / "00001", world / "copy")
    assert append_shards(store, [world / "copy"]).verify()["shards"] == 3  # a copy is adopted


def test_a_rollback_removes_only_the_files_the_append_created(world, monkeypatch):
    store = world / "store"
    before = tree(store)
    planted = store / "digests" / digests_name(3)
    original = adopt._remove_leftover

    def then_someone_writes(folder, name, number):  # a file appears between the check and the creation
        original(folder, name, number)
        if name == digests_name(3):
            planted.write_bytes(b"not this append's")

    monkeypatch.setattr(adopt, "_remove_leftover", then_someone_writes)
    expect(errors.OUTPUT_WRITE_FAILED, append_shards, store, [world / "a", world / "b"], mention=str(store))
    assert planted.read_bytes() == b"not this append's"  # never written over, never removed
    planted.unlink()
    assert tree(store) == before and (world / "a").is_dir() and (world / "b").is_dir()  # shard 2 moved back
    assert ShardedTokenStore.open(store).verify()["shards"] == 2


def test_digest_files_an_interrupted_append_left_are_replaced(world):
    store = world / "store"
    for name in ("00002.npy", "00002.ids.npy"):
        (store / "digests" / name).write_bytes(b"half written")
    assert append_shards(store, [world / "a"]).verify()["shards"] == 3


def test_the_lock_file_a_killed_append_left_is_taken_over(world):
    store = world / "store"
    (store / ".lock").write_text("999999999\n")  # the pid of a writer that is gone; nobody holds the lock
    assert append_shards(store, [world / "a"]).num_parts == 3
    assert not (store / ".lock").exists()
