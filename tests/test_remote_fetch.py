"""The planned cache's fetch policy (umlos_cuda/remote/planned.py): requests capped at ``request_bytes``, the
first step's blocks requested first, and rows mode (``block_bytes=0``), each row's own extents.

What is checked, against moto's server behind the counting proxy: a cap splits the merged requests (none longer
than the cap unless one block alone is) and changes neither the rows nor the blocks fetched (Belady's, each
once); the first requests carry the first step's blocks and nothing else; Belady's schedule evicts, among the
blocks it will not use again, the one used earliest, and otherwise the one used furthest ahead; in rows mode
the bytes fetched are the rows' bytes (each row's tokens and mask once, every request a run of rows adjacent in
the store: at most the stored bytes), with the batches of block mode and of the store on disk bit for bit,
with 2 spawned workers, and after a resume at another world size; its arguments are checked.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from token_cases import make_store
from umlos_cuda import errors
from umlos_cuda.errors import UmlosError
from umlos_cuda.remote import PlannedTokenSource, RemoteTokenStore, belady
from umlos_cuda.remote.planned import block_refs

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from umlos_cuda.torch import PlanBatchSampler, PlanCollator, TokenDataset  # noqa: E402

BLOCK = 1 << 10
PREFIX = "fetch/v1"


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    from umlos_cuda.batching import BatchingConfig
    from umlos_cuda.batching.plans.windows import ArrayLengths, WindowDefinition, WindowedPlan

    store = make_store(tmp_path_factory.mktemp("remote-fetch"), 300, seed=13)
    config = BatchingConfig.throughput(256, (16, 32, 64, 128), 256, seed=7)
    return store, WindowedPlan.build(WindowDefinition(config, len(store), 64), ArrayLengths(store.lengths), 1)


@pytest.fixture(scope="module")
def remote(local, object_store):
    store, _ = local
    return object_store.upload_folder(store.root, object_store.bucket(), PREFIX)


def data_gets(proxy):
    """The GETs of this module's store's sample bytes (the ranges the cache asked for), in the order the proxy saw
    them (not another module's: a source those tests left may still be fetching)."""
    from umlos_cuda.files.reader import MAX_NPY_HEADER_BYTES

    return [r for r in proxy.gets() if r.key in (f"{PREFIX}/tokens.npy", f"{PREFIX}/loss_mask.npy")
            and r.span is not None and r.span != (0, 12 + MAX_NPY_HEADER_BYTES)]


def blocks_of(request) -> list[int]:
    number = 0 if request.key.endswith("tokens.npy") else 1
    return [(number << 40) | b for b in range(request.span[0] // BLOCK, (request.span[1] - 1) // BLOCK + 1)]


def steps_of(sampler) -> list[list[int]]:
    fresh = PlanBatchSampler(sampler.plan, sampler.rank, sampler.world_size, epoch=sampler.epoch,
                             microbatch_index=sampler.microbatch_index)
    return [[int(k) for k in keys] for keys in fresh]


def read_all(source, store, steps) -> None:
    """Read ``steps`` a microbatch at a time, each row checked against the store on disk."""
    for step in steps:
        for row, (ids, mask) in zip(step, source.arrays_many(step)):
            assert np.array_equal(ids, store.input_ids(row)) and np.array_equal(mask, store.loss_mask(row)), row


def row_extents(opened, rows) -> list[tuple[int, tuple[int, int]]]:
    """``(object number, (start, stop))`` of every non-empty row's tokens and loss mask."""
    out = []
    for row in rows:
        tokens, mask = opened.spans(row)
        if tokens[1] > tokens[0]:
            out += [(0, tokens), (1, mask)]
    return out


# ---------------------------------------------------------------------- the cap on one request
@pytest.mark.parametrize("cap", [BLOCK, 3 * BLOCK, 1 << 30])
def test_a_request_cap_splits_requests_and_changes_no_byte_and_no_block(local, remote, object_store, cap):
    store, plan = local
    opened = RemoteTokenStore.open(remote)
    stored = sum(opened.objects[name].size for name in ("tokens", "loss_mask"))
    sampler = PlanBatchSampler(plan, rank=0, world_size=1)
    steps = steps_of(sampler)
    object_store.proxy.reset()
    source = PlannedTokenSource(opened, sampler, cache_bytes=stored + 4 * BLOCK, block_bytes=BLOCK,
                                lookahead=len(steps), request_bytes=cap)
    read_all(source, store, steps)
    source.close()
    gets = data_gets(object_store.proxy)
    assert all(r.span[1] - r.span[0] <= max(cap, BLOCK) for r in gets)
    fetched = sorted(b for r in gets for b in blocks_of(r))
    refs = block_refs(opened, [row for step in steps for row in step], BLOCK)[0]
    assert fetched == sorted(set(refs.tolist()))  # every block once, whatever the cap
    if cap == BLOCK:
        assert len(gets) == len(fetched)  # one block a request
    if cap == 1 << 30:  # uncapped, the first pump merged the rest of the pass into a few requests
        assert len(gets) < len(fetched) // 4


def test_the_first_requests_carry_the_first_steps_blocks_and_nothing_else(local, remote, object_store):
    store, plan = local
    opened = RemoteTokenStore.open(remote)
    stored = sum(opened.objects[name].size for name in ("tokens", "loss_mask"))
    sampler = PlanBatchSampler(plan, rank=0, world_size=1)
    steps = steps_of(sampler)
    object_store.proxy.reset()
    # One request in flight, so the proxy sees them in the order they were sent.
    source = PlannedTokenSource(opened, sampler, cache_bytes=stored + 4 * BLOCK, block_bytes=BLOCK,
                                lookahead=len(steps), concurrency=1, request_bytes=1 << 30)
    read_all(source, store, steps)  # the whole pass (closing earlier would cancel the requests queued)
    first = set(block_refs(opened, steps[0], BLOCK)[0].tolist())
    source.close()
    gets = data_gets(object_store.proxy)
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
def test_rows_mode_fetches_each_rows_bytes_once_in_runs_of_adjacent_rows(local, remote, object_store):
    store, plan = local
    opened = RemoteTokenStore.open(remote)
    stored = sum(opened.objects[name].size for name in ("tokens", "loss_mask"))
    sampler = PlanBatchSampler(plan, rank=0, world_size=1)
    steps = steps_of(sampler)
    longest = int(np.diff(opened.offsets).max()) * opened.token_dtype.itemsize
    object_store.proxy.reset()
    # A cache of 4 rows' extents at most, far fewer than one step's: every row is still fetched once.
    source = PlannedTokenSource(opened, sampler, cache_bytes=4 * longest, block_bytes=0, lookahead=3)
    assert source.capacity == 4
    read_all(source, store, steps)
    source.close()
    rows = [row for step in steps for row in step]
    extents = row_extents(opened, rows)
    gets = data_gets(object_store.proxy)
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


def collated(remote, plan, workers: int, **options) -> list[dict]:
    sampler = PlanBatchSampler(plan, rank=1, world_size=2)
    source = PlannedTokenSource(remote, sampler, **options)
    extra = {"multiprocessing_context": "spawn"} if workers else {}
    loader = DataLoader(TokenDataset(source, plan=plan), batch_sampler=sampler, collate_fn=PlanCollator(plan),
                        num_workers=workers, **extra)
    out = list(loader)
    source.close()
    return out


def test_rows_mode_gives_the_batches_of_block_mode_and_of_the_local_store_with_workers(local, remote,
                                                                                       object_store):
    store, plan = local
    opened = RemoteTokenStore.open(remote)
    longest = int(np.diff(opened.offsets).max()) * opened.token_dtype.itemsize
    sampler = PlanBatchSampler(plan, rank=1, world_size=2)
    on_disk = list(DataLoader(TokenDataset(store, plan=plan), batch_sampler=sampler, collate_fn=PlanCollator(plan)))
    blocks = collated(remote, plan, 0, cache_bytes=16 * BLOCK, block_bytes=BLOCK)
    rows = collated(remote, plan, 0, cache_bytes=8 * longest, block_bytes=0)
    object_store.proxy.reset()
    spawned = collated(remote, plan, 2, cache_bytes=8 * longest, block_bytes=0)
    assert len(on_disk) == len(blocks) == len(rows) == len(spawned) > 2
    for batch in zip(on_disk, blocks, rows, spawned):
        for other in batch[1:]:
            assert batch[0].keys() == other.keys() and all(torch.equal(batch[0][k], other[k]) for k in batch[0])
    # The two workers fetched their own rows, each once: together the rank's rows' bytes.
    mine = [row for step in steps_of(PlanBatchSampler(plan, rank=1, world_size=2)) for row in step]
    assert sum(r.sent for r in data_gets(object_store.proxy)) == \
        sum(b - a for _, (a, b) in row_extents(opened, mine))


def test_rows_mode_resumed_at_another_world_size_fetches_only_its_remaining_rows(local, remote, object_store):
    store, plan = local
    opened = RemoteTokenStore.open(remote)
    longest = int(np.diff(opened.offsets).max()) * opened.token_dtype.itemsize
    for rank in range(3):
        resumed = PlanBatchSampler(plan, rank=rank, world_size=3, epoch=0, microbatch_index=5)
        steps = steps_of(resumed)
        object_store.proxy.reset()
        source = PlannedTokenSource(opened, resumed, cache_bytes=8 * longest, block_bytes=0, lookahead=2)
        assert data_gets(object_store.proxy) == []  # building it fetches nothing
        read_all(source, store, steps)
        source.close()
        rows = [row for step in steps for row in step]
        assert sum(r.sent for r in data_gets(object_store.proxy)) == source.fetched_bytes == \
            sum(b - a for _, (a, b) in row_extents(opened, rows))


def test_rows_mode_arguments_are_checked(local, remote):
    _, plan = local
    sampler = PlanBatchSampler(plan, rank=0, world_size=1)
    opened = RemoteTokenStore.open(remote)
    longest = int(np.diff(opened.offsets).max()) * opened.token_dtype.itemsize
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
