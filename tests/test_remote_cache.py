"""The planned cache's disk tier, DataLoader workers, resumes and faults (umlos_cuda/remote/blockfiles.py,
umlos_cuda/remote/planned.py), against moto's S3 server behind the counting proxy (tests/objstore_support.py).

What is checked, each from the proxy's counts or the files themselves, never from the reader's own word alone:
the disk tier serves what the store holds and a second reader of the folder fetches nothing; with a small
memory and a larger disk the blocks fetched are exactly the disk schedule's misses and the folder never holds
more than ``disk_bytes``; two processes sharing a folder fetch each block once; a process killed by SIGKILL in
the middle of a fetch leaves only files that verify, and the next one reads through; DataLoader workers each
fetch only their own steps and give the batches of ``num_workers=0``; a rank resumed at another world size
fetches only what its remaining steps need; each fault is retried or refused with its code and nothing of it
is cached. The fetch policy: a cap on one request (``request_bytes``) splits the merged requests and changes
neither the rows nor the blocks fetched; the first requests carry the first step's blocks and nothing else;
Belady's schedule evicts the block used furthest ahead, and among those never used again the one used
earliest; rows mode (``block_bytes=0``) fetches each row's bytes once (every request a run of rows adjacent
in the store), with the batches of block mode and of the store on disk, with spawned workers and after a
resume at another world size, and checks its arguments.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from token_cases import make_store
from umlos_cuda import errors
from umlos_cuda.errors import UmlosError
from umlos_cuda.remote import PlannedTokenSource, RemoteTokenStore, RetryBudget, belady
from umlos_cuda.remote.blockfiles import BLOCK_CACHE, block_length, block_name, decode
from umlos_cuda.remote.planned import block_refs

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from umlos_cuda.torch import PlanBatchSampler, PlanCollator, TokenDataset  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BLOCK = 1 << 10
PREFIX = "cached/v1"
FAST = RetryBudget(attempts=4, first_delay_s=0.01, max_delay_s=0.05, timeout_s=10.0)
#: Seconds a child of these tests may run: they finish in a few; this only stops a hang.
CHILD_LIMIT_S = 300


def plan_of(store):
    """The windowed plan of two epochs the tests read (the children build the same one)."""
    from umlos_cuda.batching import BatchingConfig
    from umlos_cuda.batching.plans.windows import ArrayLengths, WindowDefinition, WindowedPlan

    config = BatchingConfig.throughput(256, (16, 32, 64, 128), 256, seed=11)
    return WindowedPlan.build(WindowDefinition(config, len(store), 64), ArrayLengths(store.lengths), 2)


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    store = make_store(tmp_path_factory.mktemp("remote-cache"), 400, seed=5)
    return store, plan_of(store)


@pytest.fixture(scope="module")
def remote(local, object_store):
    store, _ = local
    return object_store.upload_folder(store.root, object_store.bucket(), PREFIX)


def data_gets(proxy):
    return [r for r in proxy.gets() if r.key.endswith(("tokens.npy", "loss_mask.npy"))]


def sample_gets(proxy):
    """The data GETs of this module's store that a reader made for samples, in the order the proxy saw them:
    not the GETs of the ``.npy`` headers that opening a store makes (in a child process), nor another module's
    (a source those tests left may still be fetching)."""
    from umlos_cuda.files.reader import MAX_NPY_HEADER_BYTES

    return [r for r in data_gets(proxy) if r.key.startswith(f"{PREFIX}/") and r.span is not None
            and r.span != (0, 12 + MAX_NPY_HEADER_BYTES)]


def blocks_of(request) -> list[int]:
    """The blocks (object number << 40 | block) one data GET carried."""
    number = 0 if request.key.endswith("tokens.npy") else 1
    return [(number << 40) | b for b in range(request.span[0] // BLOCK, (request.span[1] - 1) // BLOCK + 1)]


def fetched_blocks(proxy) -> list[int]:
    """Every block the proxy's sample GETs carried, one entry per fetch."""
    return [block for request in sample_gets(proxy) for block in blocks_of(request)]


def pass_of(sampler) -> list[list[int]]:
    fresh = PlanBatchSampler(sampler.plan, sampler.rank, sampler.world_size, epoch=sampler.epoch,
                             microbatch_index=sampler.microbatch_index)
    return [[int(k) for k in keys] for keys in fresh]


def read_rows(source, store, steps) -> None:
    """Read ``steps`` through ``source``, each row checked against the store on disk."""
    for step in steps:
        for row in step:
            ids, mask = source.arrays(row)
            assert np.array_equal(ids, store.input_ids(row)) and np.array_equal(mask, store.loss_mask(row))


def block_files(folder: Path) -> list[Path]:
    return sorted(path for path in folder.iterdir() if path.name.endswith(".block"))


def held(opened: RemoteTokenStore, root, **changed: bytes) -> list[tuple]:
    """The data objects of ``opened`` with the bytes each holds: the files of the store on disk at ``root``, or
    the bytes given for an object put again since (``tokens=...``)."""
    return [(opened.objects[name], changed.get(name, (Path(root) / f"{name}.npy").read_bytes()))
            for name in ("tokens", "loss_mask")]


def assert_every_file_verifies(folder: Path, objects: list[tuple]) -> int:
    """Each block file in ``folder`` is whole, verifies, and holds the bytes of the block it names in one of
    ``objects`` (:func:`held`); nothing else but the marker is there. Returns the number of block files."""
    names = {}
    for obj, data in objects:
        for index in range(-(-obj.size // BLOCK)):
            names[block_name(obj, BLOCK, index)] = (obj, data, index)
    entries = sorted(os.listdir(folder))
    assert set(entries) - {path.name for path in block_files(folder)} == {"umlos-artifact.json"}, entries
    for name in entries:
        if not name.endswith(".block"):
            continue
        obj, data, index = names[name]
        length = block_length(obj, BLOCK, index)
        payload = decode(name, (folder / name).read_bytes(), length)
        assert payload is not None, f"{name} does not verify"
        assert payload == data[index * BLOCK:index * BLOCK + length]
    return len(entries) - 1


# ---------------------------------------------------------------------- the disk tier
def test_a_second_reader_of_the_folder_fetches_nothing_and_every_file_verifies(local, remote, object_store,
                                                                              tmp_path):
    store, plan = local
    opened = RemoteTokenStore.open(remote)
    stored = sum(opened.objects[name].size for name in ("tokens", "loss_mask"))
    sampler = PlanBatchSampler(plan, rank=0, world_size=2)
    steps = pass_of(sampler)
    object_store.proxy.reset()
    first = PlannedTokenSource(opened, sampler, cache_bytes=8 * BLOCK, block_bytes=BLOCK, cache_dir=tmp_path / "c",
                               disk_bytes=stored + 4 * BLOCK)
    read_rows(first, store, steps)
    first.close()
    assert first.unplanned_rows == 0 and first.fetched_bytes == object_store.proxy.body_bytes() > 0
    assert sorted(fetched_blocks(object_store.proxy)) == sorted(set(fetched_blocks(object_store.proxy)))
    files = assert_every_file_verifies(tmp_path / "c", held(opened, local[0].root))
    assert files == first.blocks.fetched_blocks == len(set(first._refs.tolist()))  # each block referenced, once
    object_store.proxy.reset()
    second = PlannedTokenSource(opened, PlanBatchSampler(plan, rank=0, world_size=2), cache_bytes=8 * BLOCK,
                                block_bytes=BLOCK, cache_dir=tmp_path / "c", disk_bytes=stored + 4 * BLOCK)
    read_rows(second, store, steps)
    second.close()
    assert data_gets(object_store.proxy) == [] and second.fetched_bytes == 0
    assert second.blocks.found_blocks == second.schedule.fetches  # every memory miss read back from disk
    assert json.loads((tmp_path / "c" / "umlos-artifact.json").read_text())["artifact"] == BLOCK_CACHE.name


def test_a_small_memory_over_a_larger_disk_fetches_exactly_the_disk_schedules_misses(local, remote, object_store,
                                                                                      tmp_path):
    store, plan = local
    opened = RemoteTokenStore.open(remote)
    sampler = PlanBatchSampler(plan, rank=1, world_size=2)
    steps = pass_of(sampler)
    memory, disk = 3, 24
    object_store.proxy.reset()
    source = PlannedTokenSource(opened, sampler, cache_bytes=memory * BLOCK, block_bytes=BLOCK, lookahead=2,
                                cache_dir=tmp_path / "c", disk_bytes=disk * BLOCK)
    most = 0
    for step in steps:
        read_rows(source, store, [step])
        most = max(most, len(block_files(tmp_path / "c")))
    source.close()
    refs, _ = block_refs(opened, [row for step in steps for row in step], BLOCK)
    on_disk, in_memory = belady(refs, disk), belady(refs, memory)
    assert not (on_disk.misses & ~in_memory.misses).any()  # a stack algorithm: disk misses are memory misses
    assert sorted(fetched_blocks(object_store.proxy)) == sorted(refs[on_disk.misses].tolist())
    assert on_disk.fetches < in_memory.fetches  # the disk saved fetches a memory of 3 blocks would make
    assert source.blocks.found_blocks == in_memory.fetches - on_disk.fetches
    assert most <= disk  # never more than disk_bytes, even with fetches ahead
    assert len(block_files(tmp_path / "c")) == len(source._disk_resident())


def test_the_next_epoch_keeps_the_disk_within_its_bound(local, remote, object_store, tmp_path):
    store, plan = local
    opened = RemoteTokenStore.open(remote)
    sampler = PlanBatchSampler(plan, rank=0, world_size=2)
    disk = 20
    source = PlannedTokenSource(opened, sampler, cache_bytes=4 * BLOCK, block_bytes=BLOCK,
                                cache_dir=tmp_path / "c", disk_bytes=disk * BLOCK)
    for _ in range(2):
        for keys in sampler:
            read_rows(source, store, [[int(k) for k in keys]])
            assert len(block_files(tmp_path / "c")) <= disk
    assert source.epoch == 1 and source.unplanned_rows == 0
    source.close()
    assert_every_file_verifies(tmp_path / "c", held(opened, local[0].root))


# ---------------------------------------------------------------------- processes sharing a folder
CHILD = """
import json, sys
sys.path.insert(0, {tests!r})
from test_remote_cache import child_read
print(json.dumps(child_read(*sys.argv[1:])), flush=True)
"""


def child_read(root: str, url: str, cache_dir: str, rank: str, world: str, disk: str) -> dict:
    """What a child process does: read one rank's pass of the plan through a planned cache on ``cache_dir``,
    every row checked against the store on disk; its counts."""
    from umlos_cuda.batching.tokens.store import TokenStore

    store = TokenStore.open(root)
    sampler = PlanBatchSampler(plan_of(store), rank=int(rank), world_size=int(world))
    source = PlannedTokenSource(url, sampler, cache_bytes=4 * BLOCK, block_bytes=BLOCK, cache_dir=cache_dir,
                                disk_bytes=int(disk))
    read_rows(source, store, pass_of(sampler))
    source.close()
    return {"fetched": source.blocks.fetched_blocks, "found": source.blocks.found_blocks,
            "unplanned": source.unplanned_rows}


def start_child(local, url, cache_dir, rank, world, disk) -> subprocess.Popen:
    store, _ = local
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-c", CHILD.format(tests=HERE), str(store.root), url, str(cache_dir),
                             str(rank), str(world), str(disk)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=ROOT)


def finished(child: subprocess.Popen) -> dict:
    out, err = child.communicate(timeout=CHILD_LIMIT_S)
    assert child.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_two_processes_sharing_a_folder_fetch_each_block_once(local, remote, object_store, tmp_path):
    opened = RemoteTokenStore.open(remote)
    stored = sum(opened.objects[name].size for name in ("tokens", "loss_mask"))
    object_store.proxy.reset()
    object_store.proxy.latency = 0.005  # slow enough that the two overlap
    try:
        children = [start_child(local, remote, tmp_path / "shared", rank, 1, stored + 4 * BLOCK) for rank in (0, 0)]
        counts = [finished(child) for child in children]
    finally:
        object_store.proxy.latency = 0.0
    blocks = fetched_blocks(object_store.proxy)
    assert len(blocks) == len(set(blocks))  # no block fetched twice, by either
    files = assert_every_file_verifies(tmp_path / "shared", held(opened, local[0].root))
    assert sum(c["fetched"] for c in counts) == len(blocks) == files
    assert all(c["unplanned"] == 0 for c in counts)
    assert counts[0]["fetched"] + counts[0]["found"] >= len(blocks)  # each read every block it needs


def test_a_process_killed_in_the_middle_of_a_fetch_leaves_only_files_that_verify(local, remote, object_store,
                                                                                 tmp_path):
    opened = RemoteTokenStore.open(remote)
    stored = sum(opened.objects[name].size for name in ("tokens", "loss_mask"))
    folder = tmp_path / "killed"
    proxy = object_store.proxy
    proxy.reset()
    proxy.stall_s = 30.0  # the stalled request is in flight when the kill comes
    proxy.inject("stall", count=1, match=lambda r: r.method == "GET" and r.span is not None
                 and r.key.endswith("tokens.npy") and r.span[0] >= 8 * BLOCK)
    child = start_child(local, remote, folder, 0, 1, stored + 4 * BLOCK)
    try:
        deadline = time.monotonic() + CHILD_LIMIT_S
        # Killed once the stalled fetch is in flight and some block is written (the writes of the fetches sent
        # beside it may still be under way: the kill may fall in the middle of one).
        while (not any(r.fault == "stall" for r in proxy.gets()) or not (folder.exists() and block_files(folder))) \
                and child.poll() is None:
            assert time.monotonic() < deadline, "the child never reached the stalled fetch"
            time.sleep(0.05)
        assert child.poll() is None, child.communicate()[1][-3000:]
        os.kill(child.pid, signal.SIGKILL)
        child.communicate(timeout=CHILD_LIMIT_S)
    finally:
        proxy.clear()
        proxy.stall_s = 5.0
    assert child.returncode == -signal.SIGKILL
    left = os.listdir(folder)
    assert any(name.endswith(".lock") for name in left)  # it died holding a claim
    assert assert_every_file_verifies_or_claims(folder, held(opened, local[0].root)) > 0
    after = finished(start_child(local, remote, folder, 0, 1, stored + 4 * BLOCK))  # no wait on the dead claim
    assert after["found"] > 0 and after["unplanned"] == 0
    # Every file verifies, and no lock or temp file is left.
    assert assert_every_file_verifies(folder, held(opened, local[0].root)) >= after["fetched"]


def assert_every_file_verifies_or_claims(folder: Path, objects: list[tuple]) -> int:
    """:func:`assert_every_file_verifies` on a copy of ``folder`` without its lock files and temp files (what a
    killed process leaves besides whole files: claims, which the kernel released, and hidden temps of writes it
    did not finish, which no reader opens)."""
    import shutil

    copy = folder.parent / (folder.name + "-files")
    shutil.copytree(folder, copy, ignore=lambda _, names: [n for n in names if n.endswith(".lock")
                                                          or n.startswith(".tmp-")])
    try:
        return assert_every_file_verifies(copy, objects)
    finally:
        shutil.rmtree(copy)


# ---------------------------------------------------------------------- DataLoader workers
def worker_batches(url, plan, workers: int, **options) -> list:
    """Rank 1 of 2's batches of ``plan`` from a planned cache of ``url`` (``options``: its own; blocks of
    ``BLOCK`` unless they say otherwise) through a DataLoader with ``workers`` workers (started by spawn)."""
    sampler = PlanBatchSampler(plan, rank=1, world_size=2)
    source = PlannedTokenSource(url, sampler, **{"block_bytes": BLOCK, **options})
    extra = {"multiprocessing_context": "spawn"} if workers else {}
    loader = DataLoader(TokenDataset(source, plan=plan), batch_sampler=sampler, collate_fn=PlanCollator(plan),
                        num_workers=workers, **extra)
    out = list(loader)
    source.close()
    return out


@pytest.mark.parametrize("disk", [False, True])
def test_workers_fetch_only_their_own_steps_and_give_the_batches_of_no_workers(local, remote, object_store, tmp_path,
                                                                               disk):
    plan = local[1]
    opened = RemoteTokenStore.open(remote)
    stored = sum(opened.objects[name].size for name in ("tokens", "loss_mask"))
    options = {"cache_dir": tmp_path / "c", "disk_bytes": stored + 4 * BLOCK} if disk else {}

    def batches(workers):
        return worker_batches(remote, plan, workers, cache_bytes=stored + 4 * BLOCK, **options)

    here = batches(0)
    steps = pass_of(PlanBatchSampler(plan, rank=1, world_size=2))
    if disk:
        for path in block_files(tmp_path / "c"):
            path.unlink()
    object_store.proxy.reset()
    there = batches(2)
    assert len(here) == len(there) == len(steps) > 2
    for a, b in zip(here, there):
        assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)
    fetched = fetched_blocks(object_store.proxy)
    own = [set(block_refs(opened, [row for step in steps[w::2] for row in step], BLOCK)[0].tolist())
           for w in range(2)]
    if disk:  # the two workers share the folder: each block once, whichever fetched it
        assert sorted(fetched) == sorted(own[0] | own[1])
    else:  # each worker its own steps' blocks, once each (a worker planning every step would fetch them all)
        assert sorted(fetched) == sorted(list(own[0]) + list(own[1]))
        assert own[0] != own[1]


def test_a_source_forked_into_a_worker_is_refused_saying_to_spawn(local, remote):
    plan = local[1]
    sampler = PlanBatchSampler(plan, rank=0, world_size=2)
    source = PlannedTokenSource(remote, sampler, cache_bytes=8 * BLOCK, block_bytes=BLOCK)
    loader = DataLoader(TokenDataset(source, plan=plan), batch_sampler=sampler, collate_fn=PlanCollator(plan),
                        num_workers=1, multiprocessing_context="fork")
    with pytest.raises(Exception) as info:
        next(iter(loader))
    assert errors.REMOTE_UNAVAILABLE in str(info.value) and "multiprocessing_context='spawn'" in str(info.value)
    source.close()


# ---------------------------------------------------------------------- resuming
def test_a_rank_resumed_at_another_world_size_fetches_only_its_remaining_steps(local, remote, object_store):
    store, plan = local
    opened = RemoteTokenStore.open(remote)
    stored = sum(opened.objects[name].size for name in ("tokens", "loss_mask"))
    k = 5
    before = []
    for rank in range(2):  # two ranks take k steps each: the global cursor is 2k
        before += [row for step in pass_of(PlanBatchSampler(plan, rank=rank, world_size=2))[:k] for row in step]
    after = []
    lookahead = 1
    for rank in range(4):  # resumed at four ranks
        resumed = PlanBatchSampler(plan, rank=rank, world_size=4, epoch=0, microbatch_index=2 * k)
        steps = pass_of(resumed)
        object_store.proxy.reset()
        source = PlannedTokenSource(opened, resumed, cache_bytes=stored + 4 * BLOCK, block_bytes=BLOCK,
                                    lookahead=lookahead)
        assert data_gets(object_store.proxy) == []  # building the source fetches nothing
        read_rows(source, store, steps[:1])
        # The first step waited for one window at most: what it needs and the `lookahead` steps after it (the
        # next window goes out once its rows are read).
        window = set(block_refs(opened, [row for step in steps[:lookahead + 2] for row in step], BLOCK)[0].tolist())
        assert set(fetched_blocks(object_store.proxy)) <= window
        read_rows(source, store, steps[1:])
        source.close()
        remaining = set(block_refs(opened, [row for step in steps for row in step], BLOCK)[0].tolist())
        assert sorted(fetched_blocks(object_store.proxy)) == sorted(remaining)  # only those, each once
        after += [row for step in steps for row in step]
    whole = [row for step in pass_of(PlanBatchSampler(plan, rank=0, world_size=1)) for row in step]
    assert sorted(before + after) == sorted(whole)  # one epoch, each sample as often as the plan has it


# ---------------------------------------------------------------------- faults
def stormed(remote, plan, proxy, tmp_path, fault, count, name):
    """A planned source with a disk tier in ``tmp_path/c`` over a store whose next ``count`` ranged GETs of
    ``name`` meet ``fault``: ``(opened store, sampler, source)``."""
    opened = RemoteTokenStore.open(remote, budget=FAST)
    sampler = PlanBatchSampler(plan, rank=0, world_size=2)
    proxy.reset()
    proxy.inject(fault, count=count, match=lambda r: r.method == "GET" and r.key.endswith(name)
                 and r.span is not None)
    return opened, sampler, PlannedTokenSource(opened, sampler, cache_bytes=8 * BLOCK, block_bytes=BLOCK,
                                               cache_dir=tmp_path / "c", disk_bytes=64 * BLOCK)


@pytest.mark.parametrize("fault", ["slowdown", "reset", "short"])
def test_a_fault_within_the_budget_is_retried_and_what_is_cached_verifies(local, remote, object_store, tmp_path,
                                                                          fault):
    store, plan = local
    proxy = object_store.proxy
    opened, sampler, source = stormed(remote, plan, proxy, tmp_path, fault, FAST.attempts - 1, "tokens.npy")
    try:
        read_rows(source, store, pass_of(sampler)[:3])
    finally:
        proxy.clear()
        source.close()
    assert [r.fault for r in proxy.gets("tokens.npy")][:FAST.attempts] == [fault] * (FAST.attempts - 1) + [None]
    assert assert_every_file_verifies(tmp_path / "c", held(opened, local[0].root)) > 0


@pytest.mark.parametrize("fault", ["slowdown", "short"])
def test_a_fault_past_the_budget_names_the_object_and_caches_nothing_of_it(local, remote, object_store, tmp_path,
                                                                           fault):
    proxy = object_store.proxy
    opened, sampler, source = stormed(remote, local[1], proxy, tmp_path, fault, 1 << 30, "loss_mask.npy")  # no end
    try:
        with pytest.raises(UmlosError) as info:
            source.arrays(pass_of(sampler)[0][0])
    finally:
        source.close()  # the fetches still in flight end in the storm too
        proxy.clear()
    assert info.value.code == errors.REMOTE_REQUEST_FAILED
    assert f"{remote}/loss_mask.npy" in info.value.message and f"failed {FAST.attempts} times" in info.value.message
    mask = opened.objects["loss_mask"]
    assert not any((tmp_path / "c" / block_name(mask, BLOCK, i)).exists() for i in range(-(-mask.size // BLOCK)))
    assert_every_file_verifies(tmp_path / "c", held(opened, local[0].root))  # and no claim or temp file is left


def test_an_object_changed_mid_epoch_is_refused_and_nothing_of_it_is_cached(local, object_store, tmp_path):
    store, plan = local
    bucket = object_store.bucket()
    url = object_store.upload_folder(store.root, bucket, "changing")
    opened = RemoteTokenStore.open(url, budget=FAST)
    sampler = PlanBatchSampler(plan, rank=0, world_size=1)
    steps = pass_of(sampler)
    source = PlannedTokenSource(opened, sampler, cache_bytes=4 * BLOCK, block_bytes=BLOCK, lookahead=0,
                                cache_dir=tmp_path / "c", disk_bytes=8 * BLOCK)
    read_rows(source, store, steps[:1])
    data = bytearray((Path(store.root) / "tokens.npy").read_bytes())
    data[-1] ^= 1  # same size, other bytes: another ETag
    object_store.put(bucket, "changing/tokens.npy", bytes(data))
    with pytest.raises(UmlosError) as info:
        read_rows(source, store, steps[1:])
    source.close()
    assert info.value.code == errors.REMOTE_OBJECT_CHANGED and f"{url}/tokens.npy" in info.value.message
    # What stays holds the bytes read before the change, under the old ETag's names; none of the new object.
    assert assert_every_file_verifies(tmp_path / "c", held(opened, local[0].root)) > 0
    reopened = RemoteTokenStore.open(url, budget=FAST)
    new = reopened.objects["tokens"]
    assert not any((tmp_path / "c" / block_name(new, BLOCK, i)).exists() for i in range(-(-new.size // BLOCK)))
    again = PlannedTokenSource(reopened, PlanBatchSampler(plan, rank=0, world_size=1), cache_bytes=4 * BLOCK,
                               block_bytes=BLOCK, cache_dir=tmp_path / "c", disk_bytes=8 * BLOCK)
    import io

    tokens = np.load(io.BytesIO(bytes(data)))  # what the object holds now
    for row in [row for step in steps for row in step]:  # the old blocks are never served for the new object
        ids, _ = again.arrays(row)
        assert np.array_equal(ids, tokens[int(store.offsets[row]):int(store.offsets[row + 1])])
    again.close()
    assert_every_file_verifies(tmp_path / "c", held(opened, store.root) + held(reopened, store.root,
                                                                              tokens=bytes(data)))


def test_the_disk_tier_arguments_are_checked(local, remote, tmp_path):
    _, plan = local
    sampler = PlanBatchSampler(plan, rank=0, world_size=1)
    for kwargs in ({"cache_dir": tmp_path / "c"}, {"disk_bytes": 8 * BLOCK},
                   {"cache_dir": tmp_path / "c", "disk_bytes": 2 * BLOCK}):
        with pytest.raises(UmlosError) as info:
            PlannedTokenSource(remote, sampler, cache_bytes=4 * BLOCK, block_bytes=BLOCK, **kwargs)
        assert info.value.code == errors.INVALID_ARGUMENT
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    source = PlannedTokenSource(remote, sampler, cache_bytes=4 * BLOCK, block_bytes=BLOCK,
                                cache_dir=tmp_path / "other", disk_bytes=8 * BLOCK)
    with pytest.raises(UmlosError) as info:  # a folder of someone else's: refused when the reader starts
        source.arrays(pass_of(sampler)[0][0])
    assert info.value.code == errors.OUTPUT_PATH_INVALID and str(tmp_path / "other") in info.value.message
    assert os.listdir(tmp_path / "other") == ["notes.txt"]
    source.close()


# ---------------------------------------------------------------------- the cap on one request
def one_rank(local, remote, proxy):
    """``(store on disk, store opened, its stored bytes, a sampler of rank 0 of 1, its steps)``, the proxy's
    counts reset."""
    store, plan = local
    opened = RemoteTokenStore.open(remote)
    sampler = PlanBatchSampler(plan, rank=0, world_size=1)
    proxy.reset()
    return store, opened, sum(opened.objects[name].size for name in ("tokens", "loss_mask")), sampler, \
        pass_of(sampler)


@pytest.mark.parametrize("cap", [BLOCK, 3 * BLOCK, 1 << 30])
def test_a_request_cap_splits_requests_and_changes_no_byte_and_no_block(local, remote, object_store, cap):
    store, opened, stored, sampler, steps = one_rank(local, remote, object_store.proxy)
    source = PlannedTokenSource(opened, sampler, cache_bytes=stored + 4 * BLOCK, block_bytes=BLOCK,
                                lookahead=len(steps), request_bytes=cap)
    read_rows(source, store, steps)
    source.close()
    gets = sample_gets(object_store.proxy)
    assert all(r.span[1] - r.span[0] <= max(cap, BLOCK) for r in gets)
    fetched = sorted(b for r in gets for b in blocks_of(r))
    refs = block_refs(opened, [row for step in steps for row in step], BLOCK)[0]
    assert fetched == sorted(set(refs.tolist()))  # every block once, whatever the cap
    if cap == BLOCK:
        assert len(gets) == len(fetched)  # one block a request
    if cap == 1 << 30:  # uncapped, the first pump merged the rest of the pass into a few requests
        assert len(gets) < len(fetched) // 4


def test_the_first_requests_carry_the_first_steps_blocks_and_nothing_else(local, remote, object_store):
    store, opened, stored, sampler, steps = one_rank(local, remote, object_store.proxy)
    # One request in flight, so the proxy sees them in the order they were sent.
    source = PlannedTokenSource(opened, sampler, cache_bytes=stored + 4 * BLOCK, block_bytes=BLOCK,
                                lookahead=len(steps), concurrency=1, request_bytes=1 << 30)
    read_rows(source, store, steps)  # the whole pass (closing earlier would cancel the requests queued)
    first = set(block_refs(opened, steps[0], BLOCK)[0].tolist())
    source.close()
    gets = sample_gets(object_store.proxy)
    carried = [set(blocks_of(r)) for r in gets]
    opening = next(i for i, blocks in enumerate(carried) if not blocks <= first)  # the first beyond step 0
    assert set().union(*carried[:opening]) == first  # every block of step 0, before any other
    assert len(gets) > opening  # and then the rest of the pass, which the cap did not hold back


# ---------------------------------------------------------------------- Belady's victims
def test_belady_evicts_the_furthest_next_use_and_among_the_dead_the_earliest_used():
    rng = np.random.default_rng(5)
    for _ in range(400):
        refs = rng.integers(0, int(rng.integers(1, 9)), int(rng.integers(0, 40)))
        capacity = int(rng.integers(1, 8))
        schedule = belady(refs, capacity)
        n, resident, last = len(refs), set(), {}
        for i, block in enumerate(refs.tolist()):
            nxt = {b: next((j for j in range(i, n) if refs[j] == b), n) for b in resident}
            assert schedule.misses[i] == (block not in resident)
            victim = int(schedule.victims[i])
            if schedule.misses[i] and len(resident) == capacity:
                assert nxt[victim] == max(nxt.values())
                if nxt[victim] == n:  # never used again: the one whose last use is earliest
                    assert last[victim] == min(last[b] for b in resident if nxt[b] == n)
                resident.discard(victim)
            else:
                assert victim == -1
            resident.add(block)
            last[block] = i


# ---------------------------------------------------------------------- rows mode
def row_extents(opened, rows) -> list[tuple[int, tuple[int, int]]]:
    """``(object number, (start, stop))`` of every non-empty row's tokens and loss mask."""
    out = []
    for row in rows:
        tokens, mask = opened.spans(row)
        if tokens[1] > tokens[0]:
            out += [(0, tokens), (1, mask)]
    return out


def longest_row(opened) -> int:
    """The longest row's token bytes: a rows-mode cache holds ``cache_bytes`` over this many units."""
    return int(np.diff(opened.offsets).max()) * opened.token_dtype.itemsize


def test_rows_mode_fetches_each_rows_bytes_once_in_runs_of_adjacent_rows(local, remote, object_store):
    store, plan = local
    opened = RemoteTokenStore.open(remote)
    stored = sum(opened.objects[name].size for name in ("tokens", "loss_mask"))
    sampler = PlanBatchSampler(plan, rank=0, world_size=1)
    steps = pass_of(sampler)
    longest = longest_row(opened)
    object_store.proxy.reset()
    # A cache of 4 rows' extents at most, far fewer than one step's: every row is still fetched once.
    source = PlannedTokenSource(opened, sampler, cache_bytes=4 * longest, block_bytes=0, lookahead=3)
    assert source.capacity == 4
    read_rows(source, store, steps)
    source.close()
    rows = [row for step in steps for row in step]
    extents = row_extents(opened, rows)
    gets = sample_gets(object_store.proxy)
    assert source.fetched_bytes == sum(r.sent for r in gets) == sum(b - a for _, (a, b) in extents) <= stored
    assert source.unplanned_rows == 0
    pieces = []
    for request in gets:  # each request is whole rows' extents, adjacent in the store
        number = 0 if request.key.endswith("tokens.npy") else 1
        inside = sorted(span for n, span in extents if n == number and request.span[0] <= span[0] < request.span[1])
        assert inside[0][0] == request.span[0] and inside[-1][1] == request.span[1]
        assert all(a[1] == b[0] for a, b in itertools.pairwise(inside))
        pieces += [(number, span) for span in inside]
    assert sorted(pieces) == sorted(extents)  # each extent in exactly one request


def test_rows_mode_gives_the_batches_of_block_mode_and_of_the_local_store_with_workers(local, remote,
                                                                                       object_store):
    store, plan = local
    opened = RemoteTokenStore.open(remote)
    longest = longest_row(opened)
    sampler = PlanBatchSampler(plan, rank=1, world_size=2)
    on_disk = list(DataLoader(TokenDataset(store, plan=plan), batch_sampler=sampler, collate_fn=PlanCollator(plan)))
    blocks = worker_batches(remote, plan, 0, cache_bytes=16 * BLOCK, block_bytes=BLOCK)
    rows = worker_batches(remote, plan, 0, cache_bytes=8 * longest, block_bytes=0)
    object_store.proxy.reset()
    spawned = worker_batches(remote, plan, 2, cache_bytes=8 * longest, block_bytes=0)
    assert len(on_disk) == len(blocks) == len(rows) == len(spawned) > 2
    for batch in zip(on_disk, blocks, rows, spawned):
        for other in batch[1:]:
            assert batch[0].keys() == other.keys() and all(torch.equal(batch[0][k], other[k]) for k in batch[0])
    # The two workers fetched their own rows, each once: together the rank's rows' bytes.
    mine = [row for step in pass_of(PlanBatchSampler(plan, rank=1, world_size=2)) for row in step]
    assert sum(r.sent for r in sample_gets(object_store.proxy)) == \
        sum(b - a for _, (a, b) in row_extents(opened, mine))


def test_rows_mode_resumed_at_another_world_size_fetches_only_its_remaining_rows(local, remote, object_store):
    store, plan = local
    opened = RemoteTokenStore.open(remote)
    longest = longest_row(opened)
    for rank in range(3):
        resumed = PlanBatchSampler(plan, rank=rank, world_size=3, epoch=0, microbatch_index=5)
        steps = pass_of(resumed)
        object_store.proxy.reset()
        source = PlannedTokenSource(opened, resumed, cache_bytes=8 * longest, block_bytes=0, lookahead=2)
        assert sample_gets(object_store.proxy) == []  # building it fetches nothing
        read_rows(source, store, steps)
        source.close()
        rows = [row for step in steps for row in step]
        assert sum(r.sent for r in sample_gets(object_store.proxy)) == source.fetched_bytes == \
            sum(b - a for _, (a, b) in row_extents(opened, rows))


def test_rows_mode_arguments_are_checked(local, remote):
    _, plan = local
    sampler = PlanBatchSampler(plan, rank=0, world_size=1)
    opened = RemoteTokenStore.open(remote)
    longest = longest_row(opened)
    for kwargs, says in (({"cache_bytes": longest - 1}, "longest row"),
                         ({"cache_bytes": longest, "gap_bytes": 8}, "only adjacent rows merge"),
                         ({"cache_bytes": longest, "cache_dir": "c", "disk_bytes": 2 * longest}, "disk tier"),
                         ({"cache_bytes": longest, "request_bytes": 0}, "request_bytes")):
        with pytest.raises(UmlosError) as info:
            PlannedTokenSource(opened, sampler, block_bytes=0, **kwargs)
        assert info.value.code == errors.INVALID_ARGUMENT and says in info.value.message, info.value.message
    import pickle

    source = PlannedTokenSource(opened, sampler, cache_bytes=longest, block_bytes=0, request_bytes=5000)
    copy = pickle.loads(pickle.dumps(source))  # what a spawned DataLoader worker receives
    assert (copy.block_bytes, copy.request_bytes, copy.capacity) == (0, 5000, 1)
    copy.close()
    source.close()
