"""``data append s3://...`` (umlos_cuda/remote/append.py), against a real S3-compatible server.

A sharded store of two shards is written on disk, copied into a bucket (``object_store``: moto behind the
fault-injecting proxy of tests/objstore_support.py), and a third shard is appended there. What is checked:

* the store under the prefix is, object for object and byte for byte, the folder the same append makes on disk
  (the index holds no path, so it is compared whole), and reads back row for row;
* the index is put after every object it lists; a reader opened before keeps reading the old rows, one opened
  after reads all of them;
* one appender at a time: a lock object refuses a second at once, naming the object and its holder;
* a SIGKILLed appender (killed while its second shard object is in flight) leaves the old store readable, its lock
  and some unlisted objects; ``--break-lock`` then appends, its leftovers replaced;
* an index replaced meanwhile refuses the publish (If-Match), a 5xx past the budget refuses it, and neither
  changes the index; an id already in the store is found by fetching the one shard that holds its hash.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from batching_cases import train_tokenizer, write_model_dir
from objstore_support import refused
from token_cases import write_dataset
from umlos_cuda import errors
from umlos_cuda.batching.tokens.sharded import ShardedTokenStore, append_shards, tokenize_shard, tokenize_sharded
from umlos_cuda.batching.tokens.store import TokenStore
from umlos_cuda.cli import main
from umlos_cuda.remote import RemoteShardedStore, RetryBudget
from umlos_cuda.remote import append as remote_append

FAST = RetryBudget(attempts=3, first_delay_s=0.01, max_delay_s=0.05, timeout_s=10.0)
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """model/, sharded/ (parts 0 and 1), staged/ (part 2 tokenized as shard 2), appended/ (the disk append of
    staged/ to a copy of sharded/: what every append into a bucket must equal)."""
    root = tmp_path_factory.mktemp("remote-append")
    write_model_dir(root / "model", train_tokenizer(), {"eos_token": "</s>"})
    parts = [str(root / f"part-{i}.jsonl") for i in range(3)]
    for i, part in enumerate(parts):
        write_dataset(part, 12 + i, seed=30 + i, ids=False)  # rows named by content: distinct across the parts
    tokenize_sharded(parts[:2], root / "model", root / "sharded")
    tokenize_shard(parts, 2, root / "model", root / "staged")
    shutil.copytree(root / "sharded", root / "appended")
    shutil.copytree(root / "staged", root / "staged-for-disk")
    append_shards(root / "appended", [root / "staged-for-disk"])
    return root


@pytest.fixture
def published(world, object_store, tmp_path):
    """``(url, bucket, prefix, staged)``: the two-shard store in a fresh bucket, and a copy of staged/ to adopt."""
    bucket = object_store.bucket()
    url = object_store.upload_folder(world / "sharded", bucket, "corpus/web")
    staged = tmp_path / "staged"
    shutil.copytree(world / "staged", staged)
    return url, bucket, "corpus/web", staged


def files(folder: Path) -> dict[str, bytes]:
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def writes(object_store) -> list[tuple[str, str]]:
    return [(r.method, r.key) for r in object_store.proxy.requests if r.method in ("PUT", "POST", "DELETE")]


def rows_of(store) -> list[tuple[bytes, bytes]]:
    return [tuple(np.asarray(array).tobytes() for array in store.arrays(row)) for row in range(len(store))]


def test_an_append_into_a_bucket_puts_what_the_disk_append_writes(world, published, object_store, capsys):
    url, bucket, prefix, staged = published
    object_store.proxy.reset()
    assert main(["data", "append", url, str(staged)]) == 0
    disk = ShardedTokenStore.open(world / "appended")
    said = capsys.readouterr().out
    assert f"appended to sharded token store {url}: {len(disk)} samples in 3 shards" in said
    assert f"dataset_hash {disk.dataset_hash}" in said
    # Object for object, byte for byte the folder (the index names no path: compared whole); no lock left.
    assert object_store.objects(bucket, prefix) == files(world / "appended")
    remote = RemoteShardedStore.open(url, budget=FAST)
    assert remote.meta == disk.meta and rows_of(remote) == rows_of(disk)
    # The index went up last, once; every other write created a new object of shard 2 (or the lock).
    puts = [key for method, key in writes(object_store) if method == "PUT"]
    assert puts[0] == f"{prefix}/.lock" and puts[-1] == f"{prefix}/meta.json" and puts.count(f"{prefix}/meta.json") == 1
    assert all(key.startswith((f"{prefix}/shards/00002/", f"{prefix}/digests/00002.")) for key in puts[1:-1])
    assert writes(object_store)[-1] == ("POST", "")  # the lock removed (the client deletes by a POST ?delete)
    # Moved: the folder is gone, and nothing is left beside it.
    assert not staged.exists() and os.listdir(staged.parent) == []


def test_a_reader_opened_before_reads_the_old_rows_and_one_after_all_rows(world, published):
    url, _, _, staged = published
    before = RemoteShardedStore.open(url, budget=FAST)
    old_rows = rows_of(ShardedTokenStore.open(world / "sharded"))
    assert rows_of(before)[:3] == old_rows[:3]  # shard 0 opened before the append
    assert main(["data", "append", url, str(staged)]) == 0
    assert len(before) == len(old_rows) and rows_of(before) == old_rows  # shard 1 opened after it: unchanged
    after = RemoteShardedStore.open(url, budget=FAST)
    assert rows_of(after) == rows_of(ShardedTokenStore.open(world / "appended"))


def test_a_second_appender_is_refused_at_once_naming_the_lock_and_its_holder(published, object_store, capsys):
    url, bucket, prefix, staged = published
    index = object_store.objects(bucket, prefix)["meta.json"]
    holder = remote_append._Lock(remote_append.parse_url(url), FAST)
    holder.take()  # this process is the first appender
    try:
        object_store.proxy.reset()
        assert main(["data", "append", url, str(staged)]) == 2
        said = capsys.readouterr().err
        assert said.startswith("error SHARDED_STORE_LOCKED: ") and f"{url}/.lock exists" in said
        assert f"process {os.getpid()} on host" in said and "--break-lock" in said
        assert writes(object_store) == [("PUT", f"{prefix}/.lock")]  # the refused create, nothing else
    finally:
        holder.release()
    now = object_store.objects(bucket, prefix)
    assert now["meta.json"] == index and ".lock" not in now
    assert TokenStore.open(staged).verify()["samples"] == 14


def test_a_killed_appender_leaves_the_old_store_and_its_lock_and_break_lock_recovers(world, published,
                                                                                      object_store, capsys):
    url, bucket, prefix, staged = published
    seen = []

    def second_shard_put(request) -> bool:  # the proxy stalls the second object of the new shard
        if request.method == "PUT" and "/shards/00002/" in request.key:
            seen.append(request.key)
            return len(seen) == 2
        return False

    object_store.proxy.stall_s = 30.0
    object_store.proxy.inject("stall", match=second_shard_put)
    child = subprocess.Popen([sys.executable, "-m", "umlos_cuda.cli", "data", "append", url, str(staged)],
                             cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while len(seen) < 2 and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(seen) == 2, child.communicate()
        child.send_signal(signal.SIGKILL)
        child.wait()
    finally:
        object_store.proxy.clear()
        object_store.proxy.stall_s = 5.0
    left = object_store.objects(bucket, prefix)
    assert left["meta.json"] == (world / "sharded" / "meta.json").read_bytes()
    assert f"shards/00002/{seen[0].rsplit('/', 1)[1]}" in left  # its first object: put, never listed
    assert json.loads(left[".lock"])["pid"] == child.pid
    old = RemoteShardedStore.open(url, budget=FAST)
    assert rows_of(old) == rows_of(ShardedTokenStore.open(world / "sharded"))  # the leftover is never read
    assert TokenStore.open(staged).verify()["samples"] == 14  # the folder is where it was
    # The next append is refused, naming the dead holder; --break-lock removes its lock and appends.
    assert main(["data", "append", url, str(staged)]) == 2
    assert f"process {child.pid} on host" in capsys.readouterr().err
    assert main(["data", "append", url, str(staged), "--break-lock"]) == 0
    assert f"broke the lock of {url}, held by process {child.pid} on host" in capsys.readouterr().out
    assert object_store.objects(bucket, prefix) == files(world / "appended")  # leftovers replaced, lock gone
    for leftover in staged.parent.glob(".umlos-append-*"):  # the killed one's index and digests, removable
        shutil.rmtree(leftover)


def test_an_index_replaced_meanwhile_refuses_the_publish(published, object_store, monkeypatch):
    url, bucket, prefix, staged = published
    index = object_store.objects(bucket, prefix)["meta.json"]
    other = json.dumps(json.loads(index), indent=1).encode()  # the same store, other bytes: another ETag
    putter = remote_append.putter

    def racing(store, key, path, **options):  # another append publishes while this one puts its shard
        if key.endswith("digests/00002.npy"):
            object_store.put(bucket, f"{prefix}/meta.json", other)
        return putter(store, key, path, **options)

    monkeypatch.setattr(remote_append, "putter", racing)
    refused(lambda: remote_append.append_remote(url, [staged], budget=FAST), errors.REMOTE_OBJECT_CHANGED,
            f"{url}/meta.json was replaced since this append read it", "nothing was published")
    now = object_store.objects(bucket, prefix)
    assert now["meta.json"] == other and ".lock" not in now
    assert TokenStore.open(staged).verify()["samples"] == 14  # back where it was


def test_a_5xx_during_a_shard_put_is_retried_then_refused_without_changing_the_index(world, published,
                                                                                       object_store):
    url, bucket, prefix, staged = published
    index = object_store.objects(bucket, prefix)["meta.json"]
    shard_put = lambda request: request.method == "PUT" and "/shards/00002/" in request.key  # noqa: E731
    object_store.proxy.inject("error500", count=FAST.attempts, match=shard_put)
    try:
        refused(lambda: remote_append.append_remote(url, [staged], budget=FAST), errors.REMOTE_REQUEST_FAILED,
                f"{url}/shards/00002/", f"failed {FAST.attempts} times")
    finally:
        object_store.proxy.clear()
    now = object_store.objects(bucket, prefix)
    assert now["meta.json"] == index and ".lock" not in now
    assert TokenStore.open(staged).verify()["samples"] == 14
    object_store.proxy.inject("error500", count=1, match=shard_put)  # one 500: retried, and the append succeeds
    try:
        remote_append.append_remote(url, [staged], budget=FAST)
    finally:
        object_store.proxy.clear()
    assert object_store.objects(bucket, prefix) == files(world / "appended")


def test_an_id_already_in_the_store_fetches_only_the_shard_holding_its_hash(world, published, object_store,
                                                                            tmp_path):
    url, bucket, prefix, _ = published
    again = tmp_path / "again"
    shutil.copytree(world / "sharded" / "shards" / "00001", again)  # shard 1's rows, adopted a second time
    object_store.proxy.reset()
    refused(lambda: remote_append.append_remote(url, [again], budget=FAST), errors.SHARDED_STORE_MISMATCH,
            "is already in")
    fetched = {r.key.split("/")[3] for r in object_store.proxy.gets() if "/shards/" in r.key}
    assert fetched == {"00001"}
    assert writes(object_store) == [("PUT", f"{prefix}/.lock"), ("POST", "")]  # the lock taken and removed alone
    assert ".lock" not in object_store.objects(bucket, prefix) and again.is_dir()


def test_tokenize_append_into_a_bucket_puts_what_it_writes_on_disk(world, object_store, tmp_path, capsys):
    """``data tokenize --append --output URL``: the same disk path (tokenize_sharded with append) on the private
    folder, then the same publish."""
    bucket = object_store.bucket()
    url = object_store.upload_folder(world / "sharded", bucket, "grown")
    shutil.copytree(world / "sharded", tmp_path / "disk")
    args = ["--dataset", str(world / "part-2.jsonl"), "--tokenizer", str(world / "model"), "--append", "--quiet"]
    assert main(["data", "tokenize", *args, "--output", str(tmp_path / "disk")]) == 0
    disk_said = capsys.readouterr().out.splitlines()
    assert main(["data", "tokenize", *args, "--output", url]) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[0] == disk_said[0].replace(str(tmp_path / "disk"), url) and said[1:3] == disk_said[1:3]
    assert object_store.objects(bucket, "grown") == files(tmp_path / "disk")
    assert object_store.objects(bucket, "grown")["meta.json"] == (world / "appended" / "meta.json").read_bytes()
    with pytest.raises(SystemExit) as usage:
        main(["data", "tokenize", *args, "--output", url, "--break-lock", "--engine", "ray"])
    assert usage.value.code == 2 and "no --engine ray yet" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["data", "tokenize", *args, "--output", str(tmp_path / "disk"), "--break-lock"])
    assert "--break-lock goes with --append to a sharded store in an object store" in capsys.readouterr().err
