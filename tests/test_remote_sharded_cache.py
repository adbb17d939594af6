"""The planned cache over a sharded store (umlos_cuda/remote/objects.py, umlos_cuda/remote/planned.py), against
moto's S3 server behind the counting proxy (tests/objstore_support.py).

A sharded store of two shards is written on disk (token_cases.write_two_shards), copied into a bucket as it is
and read through a ``PlannedTokenSource``. What is checked, from the proxy's counts and the files themselves:
the object table numbers each shard's tokens and loss mask (a shard read as a flat store has the same blocks,
renumbered); the batches equal those of the store on disk bit for bit; a small cache fetches exactly the
blocks an offline Belady simulation of the references (worked out here, a row at a time) misses; the disk
tier fetches exactly its schedule's misses and a second reader nothing, with two byte-identical shards kept
apart by their names; DataLoader workers (spawn) fetch their own steps; a rank resumed at another world size
fetches only its remaining steps' blocks; a shard rewritten under the reader is REMOTE_OBJECT_CHANGED naming
the object; a Megatron pair is refused with REMOTE_UNAVAILABLE.
"""

from __future__ import annotations

import bisect
import shutil
from pathlib import Path

import numpy as np
import pytest

from test_remote_cache import assert_every_file_verifies, pass_of, worker_batches
from token_cases import copy_shard_rehashed, random_sequences, write_megatron, write_two_shards
from umlos_cuda import errors
from umlos_cuda.errors import UmlosError
from umlos_cuda.files.reader import MAX_NPY_HEADER_BYTES
from umlos_cuda.remote import PlannedTokenSource, RemoteMegatron, RemoteShardedStore, RemoteTokenStore, belady
from umlos_cuda.remote.blockfiles import block_name
from umlos_cuda.remote.planned import block_refs

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from umlos_cuda.torch import PlanBatchSampler, PlanCollator, TokenDataset  # noqa: E402

BLOCK = 1 << 10
#: Rows of the store, and how many of them the first shard holds.
ROWS, FIRST = 160, 70


def plan_of(store):
    """A windowed plan of two epochs over ``store``, its windows across the shards' boundary."""
    from umlos_cuda.batching import BatchingConfig
    from umlos_cuda.batching.plans.windows import ArrayLengths, WindowDefinition, WindowedPlan

    config = BatchingConfig.throughput(256, (16, 32, 64, 128), 256, seed=11)
    return WindowedPlan.build(WindowDefinition(config, len(store), 48), ArrayLengths(store.lengths), 2)


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    store = write_two_shards(tmp_path_factory.mktemp("sharded-cache"), FIRST, ROWS)
    return store, plan_of(store)


@pytest.fixture(scope="module")
def remote(local, object_store):
    return object_store.upload_folder(local[0].root, object_store.bucket(), "sharded/v1")


def opened_whole(url: str) -> RemoteShardedStore:
    """The store at ``url`` with every shard opened (so that the proxy's counts after it are block fetches)."""
    opened = RemoteShardedStore.open(url)
    assert len(opened.lengths) == ROWS  # opens every shard
    return opened


def numbers(opened) -> dict[str, int]:
    """Each data object's key in its bucket, and its number in the store's object table."""
    table = opened.object_table()
    return {table[number].name.split("/", 3)[3]: number for number in range(len(table))}


def fetched_blocks(proxy, opened, opens: int = 0) -> list[int]:
    """Every block the proxy's GETs of ``opened``'s data objects carried (object number << 40 | block), one entry
    per fetch. ``opens``: how often each shard was opened meanwhile (to check a plan, in a worker), each opening
    one GET of each object's ``.npy`` header, which is no block fetch (where a block fetch has the same span, it
    carries the same blocks: which of the two is left out does not matter)."""
    keys, table = numbers(opened), opened.object_table()
    headers = dict.fromkeys(keys, opens)
    out = []
    for request in proxy.gets():
        if request.key not in keys:
            continue
        number, (start, stop) = keys[request.key], request.span
        if headers[request.key] and (start, stop) == (0, min(table[number].size, 12 + MAX_NPY_HEADER_BYTES)):
            headers[request.key] -= 1
            continue
        out += [(number << 40) | b for b in range(start // BLOCK, (stop - 1) // BLOCK + 1)]
    assert not any(headers.values()), headers
    return out


def expected_refs(opened: RemoteShardedStore, rows, block=BLOCK) -> list[int]:
    """The blocks ``rows`` reference, worked out here a row at a time (not with the reader's code): a row's shard
    by the starts, its bytes by the shard's offsets, its objects ``2 shard`` and ``2 shard + 1``."""
    refs = []
    for row in rows:
        shard = bisect.bisect_right(opened.starts, row) - 1
        store, here = opened.shard(shard), row - opened.starts[shard]
        start, stop = int(store.offsets[here]), int(store.offsets[here + 1])
        size = store.token_dtype.itemsize
        for column, (a, b) in enumerate(((store.starts["tokens"] + start * size, store.starts["tokens"] + stop * size),
                                         (store.starts["loss_mask"] + start, store.starts["loss_mask"] + stop))):
            refs += [((2 * shard + column) << 40) | k for k in range(a // block, (b - 1) // block + 1)] if b > a else []
    return refs


def read_rows(source, store, steps) -> None:
    """Read ``steps`` through ``source`` a microbatch at a time, each row checked against the store on disk."""
    for step in steps:
        for row, (ids, mask) in zip(step, source.arrays_many(step)):
            want_ids, want_mask = store.arrays(row)
            assert np.array_equal(ids, want_ids) and np.array_equal(mask, want_mask), row


def held(opened, root) -> list[tuple]:
    """The data objects of ``opened`` with the bytes each holds: the files of the store on disk at ``root``."""
    table = opened.object_table()
    return [(table[n], (Path(root) / "/".join(table[n].name.rsplit("/", 3)[1:])).read_bytes())
            for n in range(len(table))]


# ---------------------------------------------------------------------- the object table
def test_the_table_numbers_each_shards_tokens_and_loss_mask(local, remote):
    store, _ = local
    opened = opened_whole(remote)
    table = opened.object_table()
    assert len(table) == 4
    assert [table[n].name for n in range(4)] == [f"{remote}/shards/{name}/{column}.npy" for name in ("00000", "00001")
                                                 for column in ("tokens", "loss_mask")]
    # A shard read as a flat store has the blocks its rows have in the sharded store, its objects renumbered.
    for shard in range(2):
        flat = RemoteTokenStore.open(f"{remote}/shards/0000{shard}")
        flat_table = flat.object_table()
        assert len(flat_table) == 2 and flat_table[0].name == table[2 * shard].name
        rows = list(range(len(flat)))[::-1]
        flat_refs, flat_starts = block_refs(flat, rows, BLOCK)
        refs, starts = block_refs(opened, [opened.starts[shard] + row for row in rows], BLOCK)
        assert np.array_equal(flat_starts, starts) and np.array_equal(flat_refs + ((2 * shard) << 40), refs)
    # Rows of both shards interleaved: the reader's references are the ones worked out a row at a time.
    rows = [int(r) for r in np.random.default_rng(0).permutation(ROWS)[:90]] + [FIRST - 1, FIRST, 0, ROWS - 1]
    refs, starts = block_refs(opened, rows, BLOCK)
    assert refs.tolist() == expected_refs(opened, rows)
    assert [refs[starts[i]:starts[i + 1]].tolist() for i in range(3)] == [expected_refs(opened, [r]) for r in rows[:3]]
    assert {int(r) >> 40 for r in refs} == {0, 1, 2, 3}
    spans = table.spans(rows)
    assert np.array_equal(spans.tokens, store.lengths[rows])


# ---------------------------------------------------------------------- reading
@pytest.mark.parametrize("rank", [0, 1])
def test_the_batches_are_those_of_the_store_on_disk_bit_for_bit(local, remote, rank):
    store, plan = local

    def tensors(dataset):
        sampler = PlanBatchSampler(plan, rank=rank, world_size=2)
        loader = DataLoader(dataset(sampler), batch_sampler=sampler, collate_fn=PlanCollator(plan))
        return list(loader)

    sources = []

    def planned(sampler):
        sources.append(PlannedTokenSource(remote, sampler, cache_bytes=12 * BLOCK, block_bytes=BLOCK))
        return TokenDataset(sources[-1], plan=plan)

    here = tensors(lambda sampler: TokenDataset(store.root, plan=plan))
    there = tensors(planned)
    assert len(here) == len(there) > 4
    for a, b in zip(here, there):
        assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)
    source = sources[0]
    assert isinstance(source.store, RemoteShardedStore) and source.unplanned_rows == 0
    assert {int(r) >> 40 for r in source._refs} == {0, 1, 2, 3}  # both shards read
    assert source.identity() == store.identity() and np.array_equal(source.lengths, store.lengths)
    source.close()


@pytest.mark.parametrize("blocks", [3, 8])
def test_a_small_cache_fetches_exactly_the_blocks_belady_misses(local, remote, object_store, blocks):
    store, plan = local
    opened = opened_whole(remote)
    sampler = PlanBatchSampler(plan, rank=1, world_size=2)
    refs = np.asarray(expected_refs(opened, [row for step in pass_of(sampler) for row in step]), dtype=np.int64)
    schedule = belady(refs, blocks)
    table = opened.object_table()
    sizes = [table[n].size for n in range(len(table))]
    expected = sum(min(BLOCK, sizes[int(b) >> 40] - (int(b) & ((1 << 40) - 1)) * BLOCK) for b in refs[schedule.misses])
    object_store.proxy.reset()
    source = PlannedTokenSource(opened, sampler, cache_bytes=blocks * BLOCK, block_bytes=BLOCK, lookahead=3)
    read_rows(source, store, pass_of(sampler))
    source.close()
    assert sorted(fetched_blocks(object_store.proxy, opened)) == sorted(refs[schedule.misses].tolist())
    assert object_store.proxy.body_bytes() == source.fetched_bytes == expected > sum(sizes)  # blocks come twice
    assert source.unplanned_rows == 0


# ---------------------------------------------------------------------- the disk tier
def test_the_disk_tier_fetches_exactly_its_schedules_misses_and_a_second_reader_nothing(local, remote, object_store,
                                                                                       tmp_path):
    store, plan = local
    opened = opened_whole(remote)
    sampler = PlanBatchSampler(plan, rank=0, world_size=2)
    steps = pass_of(sampler)
    memory, disk = 3, 24
    object_store.proxy.reset()
    source = PlannedTokenSource(opened, sampler, cache_bytes=memory * BLOCK, block_bytes=BLOCK, lookahead=2,
                                cache_dir=tmp_path / "c", disk_bytes=disk * BLOCK)
    read_rows(source, store, steps)
    source.close()
    refs = np.asarray(expected_refs(opened, [row for step in steps for row in step]), dtype=np.int64)
    on_disk, in_memory = belady(refs, disk), belady(refs, memory)
    assert sorted(fetched_blocks(object_store.proxy, opened)) == sorted(refs[on_disk.misses].tolist())
    assert source.blocks.found_blocks == in_memory.fetches - on_disk.fetches > 0
    files = assert_every_file_verifies(tmp_path / "c", held(opened, store.root))
    assert files == len(source._disk_resident()) <= disk
    # A second reader of a folder that holds every block: nothing fetched.
    every = sum(obj.size for obj, _ in held(opened, store.root)) + 4 * BLOCK
    first = PlannedTokenSource(opened, PlanBatchSampler(plan, rank=0, world_size=2), cache_bytes=4 * BLOCK,
                               block_bytes=BLOCK, cache_dir=tmp_path / "all", disk_bytes=every)
    read_rows(first, store, steps)
    first.close()
    object_store.proxy.reset()
    second = PlannedTokenSource(opened, PlanBatchSampler(plan, rank=0, world_size=2), cache_bytes=4 * BLOCK,
                                block_bytes=BLOCK, cache_dir=tmp_path / "all", disk_bytes=every)
    read_rows(second, store, steps)
    second.close()
    assert fetched_blocks(object_store.proxy, opened) == [] and second.fetched_bytes == 0
    assert second.blocks.found_blocks == second.schedule.fetches > 0


def test_two_byte_identical_shards_never_share_a_block_file(local, object_store, tmp_path):
    """Shard 1 replaced by a copy of shard 0 (the index rewritten to agree): the two shards' objects have one ETag
    and one size, and their blocks are still two sets of files, by their URLs, each read back as its own."""
    store = local[0]
    shutil.copytree(store.root, tmp_path / "twins")
    copy_shard_rehashed(tmp_path / "twins", 0, 1)
    from umlos_cuda.batching.tokens.logical import ShardedTokenStore

    twins = ShardedTokenStore.open(tmp_path / "twins")
    url = object_store.upload_folder(tmp_path / "twins", object_store.bucket(), "twins")
    opened = RemoteShardedStore.open(url)
    table = opened.object_table()
    assert len(opened.lengths) == 2 * FIRST
    for column in range(2):
        a, b = table[column], table[2 + column]
        assert (a.info.etag, a.size) == (b.info.etag, b.size) and a.name != b.name
        assert {block_name(a, BLOCK, i) for i in range(-(-a.size // BLOCK))}.isdisjoint(
            block_name(b, BLOCK, i) for i in range(-(-b.size // BLOCK)))
    twin_plan = plan_of(twins)
    sampler = PlanBatchSampler(twin_plan, rank=0, world_size=1)
    every = sum(table[n].size for n in range(4)) + 4 * BLOCK
    source = PlannedTokenSource(opened, sampler, cache_bytes=4 * BLOCK, block_bytes=BLOCK, cache_dir=tmp_path / "c",
                                disk_bytes=every)
    read_rows(source, twins, pass_of(sampler))
    source.close()
    files = assert_every_file_verifies(tmp_path / "c", held(opened, tmp_path / "twins"))
    assert files == len(set(source._refs.tolist())) == source.blocks.fetched_blocks
    assert {int(r) >> 40 for r in source._refs} == {0, 1, 2, 3}


# ---------------------------------------------------------------------- workers and resuming
def test_spawned_workers_fetch_their_own_steps_and_give_the_batches_of_no_workers(local, remote, object_store):
    plan = local[1]
    opened = opened_whole(remote)
    every = sum(opened.object_table()[n].size for n in range(4)) + 4 * BLOCK

    here = worker_batches(remote, plan, 0, cache_bytes=every)
    steps = pass_of(PlanBatchSampler(plan, rank=1, world_size=2))
    object_store.proxy.reset()
    there = worker_batches(remote, plan, 2, cache_bytes=every)
    assert len(here) == len(there) == len(steps) > 2
    for a, b in zip(here, there):
        assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)
    own = [set(expected_refs(opened, [row for step in steps[w::2] for row in step])) for w in range(2)]
    assert own[0] != own[1]
    # Each shard opened three times: to check the plan (TokenDataset) and in each worker.
    assert sorted(fetched_blocks(object_store.proxy, opened, opens=3)) == sorted(list(own[0]) + list(own[1]))


def test_a_rank_resumed_at_another_world_size_fetches_only_its_remaining_steps(local, remote, object_store):
    store, plan = local
    opened = opened_whole(remote)
    every = sum(opened.object_table()[n].size for n in range(4)) + 4 * BLOCK
    k = 3
    before = []
    for rank in range(2):  # two ranks take k steps each: the global cursor is 2k
        before += [row for step in pass_of(PlanBatchSampler(plan, rank=rank, world_size=2))[:k] for row in step]
    after = []
    for rank in range(3):  # resumed at three ranks
        resumed = PlanBatchSampler(plan, rank=rank, world_size=3, epoch=0, microbatch_index=2 * k)
        steps = pass_of(resumed)
        object_store.proxy.reset()
        source = PlannedTokenSource(opened, resumed, cache_bytes=every, block_bytes=BLOCK, lookahead=1)
        read_rows(source, store, steps)
        source.close()
        remaining = set(expected_refs(opened, [row for step in steps for row in step]))
        assert sorted(fetched_blocks(object_store.proxy, opened)) == sorted(remaining)  # only those, each once
        after += [row for step in steps for row in step]
    whole = [row for step in pass_of(PlanBatchSampler(plan, rank=0, world_size=1)) for row in step]
    assert sorted(before + after) == sorted(whole)  # one epoch, each sample as often as the plan has it


# ---------------------------------------------------------------------- refusals
def test_a_shard_rewritten_under_the_reader_is_remote_object_changed_naming_it(local, object_store, tmp_path):
    store, plan = local
    bucket = object_store.bucket()
    url = object_store.upload_folder(store.root, bucket, "changing")
    sampler = PlanBatchSampler(plan, rank=0, world_size=1)
    steps = pass_of(sampler)
    source = PlannedTokenSource(url, sampler, cache_bytes=4 * BLOCK, block_bytes=BLOCK, lookahead=0,
                                cache_dir=tmp_path / "c", disk_bytes=8 * BLOCK)
    read_rows(source, store, steps[:1])
    opened = source.store
    original = held(opened, store.root)
    data = bytearray((Path(store.root) / "shards" / "00001" / "tokens.npy").read_bytes())
    data[-1] ^= 1  # same size, other bytes: another ETag
    object_store.put(bucket, "changing/shards/00001/tokens.npy", bytes(data))
    with pytest.raises(UmlosError) as info:
        read_rows(source, store, steps[1:])
    source.close()
    assert info.value.code == errors.REMOTE_OBJECT_CHANGED
    assert f"{url}/shards/00001/tokens.npy" in info.value.message
    assert assert_every_file_verifies(tmp_path / "c", original) > 0  # what stays is the bytes read before


def test_a_megatron_pair_is_refused_saying_what_the_planned_cache_reads(local, object_store, tmp_path):
    _, plan = local
    prefix = write_megatron(tmp_path / "meg", random_sequences(ROWS, seed=3, high=60), np.int32)
    url = object_store.upload_folder(Path(prefix).parent, object_store.bucket(), "meg") + "/meg"
    sampler = PlanBatchSampler(plan, rank=0, world_size=1)
    for given in (url, RemoteMegatron.open(url)):
        with pytest.raises(UmlosError) as info:
            PlannedTokenSource(given, sampler, cache_bytes=4 * BLOCK, block_bytes=BLOCK)
        assert info.value.code == errors.REMOTE_UNAVAILABLE
        assert url in info.value.message and "token stores (flat or sharded)" in info.value.message


def test_rows_mode_over_the_shards_fetches_each_rows_bytes_once(local, remote, object_store):
    """Rows mode (``block_bytes=0``) numbers a row's extents by the object table too: each shard's rows are
    fetched from that shard's objects, each row's bytes once, and the rows equal the store's on disk."""
    store, plan = local
    opened = opened_whole(remote)
    sampler = PlanBatchSampler(plan, rank=0, world_size=1)
    steps = pass_of(sampler)
    rows = [row for step in steps for row in step]
    longest = int(np.asarray(opened.lengths).max()) * np.dtype(opened.token_dtype).itemsize
    keys = numbers(opened)
    object_store.proxy.reset()
    source = PlannedTokenSource(opened, sampler, cache_bytes=6 * longest, block_bytes=0, lookahead=2)
    read_rows(source, store, steps)
    source.close()
    wanted = {}  # each data object: the bytes its rows of the pass hold, worked out from the shards' offsets
    for row in rows:
        shard = bisect.bisect_right(opened.starts, row) - 1
        part, here = opened.shard(shard), row - opened.starts[shard]
        tokens = int(part.offsets[here + 1] - part.offsets[here])
        wanted[2 * shard] = wanted.get(2 * shard, 0) + tokens * part.token_dtype.itemsize
        wanted[2 * shard + 1] = wanted.get(2 * shard + 1, 0) + tokens
    sent: dict[int, int] = {}
    for request in object_store.proxy.gets():
        if request.key in keys:
            sent[keys[request.key]] = sent.get(keys[request.key], 0) + request.sent
    assert sent == {number: size for number, size in wanted.items() if size} and set(sent) == {0, 1, 2, 3}
    assert source.fetched_bytes == sum(wanted.values()) and source.unplanned_rows == 0
