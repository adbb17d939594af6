"""The batched read path: ``arrays_many(rows)`` on the planned cache (umlos_cuda/remote/planned.py) and the flat
token store, and ``TokenDataset.__getitems__``, which a ``DataLoader`` with a ``batch_sampler`` calls once per
microbatch.

What is checked: the rows read a microbatch at a time are the rows read one at a time (and the store's bytes on
disk), with the same bytes fetched, the same ranged GETs (the proxy's spans), the same Belady count and the same
``unplanned_rows``, in memory alone, with a disk tier, across an epoch's end, with rows out of plan order mixed
in; a row not in the store is refused as one at a time refuses it; a DataLoader with 0 and 2 (spawn) workers
gives the batches collated from the rows one at a time.
"""

from __future__ import annotations

import numpy as np
import pytest

from token_cases import make_store
from umlos_cuda import errors
from umlos_cuda.errors import UmlosError
from umlos_cuda.remote import PlannedTokenSource, RemoteTokenStore, RetryBudget, belady
from umlos_cuda.remote.planned import block_refs

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from umlos_cuda.torch import PlanBatchSampler, PlanCollator, TokenDataset  # noqa: E402

BLOCK = 1 << 10
FAST = RetryBudget(attempts=4, first_delay_s=0.01, max_delay_s=0.05, timeout_s=10.0)


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    from umlos_cuda.batching import BatchingConfig
    from umlos_cuda.batching.plans.windows import ArrayLengths, WindowDefinition, WindowedPlan

    store = make_store(tmp_path_factory.mktemp("remote-batched"), 300, seed=9)
    config = BatchingConfig.throughput(256, (16, 32, 64, 128), 256, seed=4)
    return store, WindowedPlan.build(WindowDefinition(config, len(store), 64), ArrayLengths(store.lengths), 2)


@pytest.fixture(scope="module")
def remote(local, object_store):
    store, _ = local
    return object_store.upload_folder(store.root, object_store.bucket(), "batched/v1")


def epoch_steps(plan, rank: int = 0, world: int = 1) -> list[list[int]]:
    """Every step of the sampler's two epochs, as dataset rows."""
    return [[int(key) for key in keys] for epoch in range(2)
            for keys in PlanBatchSampler(plan, rank, world, epoch=epoch)]


def data_spans(proxy) -> list[tuple[str, tuple[int, int]]]:
    return sorted((r.key, r.span) for r in proxy.gets() if r.key.endswith(("tokens.npy", "loss_mask.npy")))


def assert_rows(store, rows, got) -> None:
    assert len(got) == len(rows)
    for row, (ids, mask) in zip(rows, got):
        assert ids.dtype == store.tokens.dtype and mask.dtype == np.uint8
        assert np.array_equal(ids, store.input_ids(row)) and np.array_equal(mask, store.loss_mask(row)), row


@pytest.mark.parametrize("tier", ["memory", "disk"])
def test_a_microbatch_at_a_time_reads_and_fetches_what_one_row_at_a_time_does(local, remote, object_store,
                                                                                tmp_path, tier):
    store, plan = local
    opened = RemoteTokenStore.open(remote, budget=FAST)
    stored = sum(opened.objects[name].size for name in ("tokens", "loss_mask"))
    steps = epoch_steps(plan)
    rng = np.random.default_rng(3)
    stray = {int(i): int(rng.integers(len(store))) for i in rng.choice(len(steps), 4, replace=False)}

    def read(many: bool, folder: str):
        options = {"cache_dir": tmp_path / folder, "disk_bytes": stored // 2} if tier == "disk" else {}
        source = PlannedTokenSource(opened, PlanBatchSampler(plan), cache_bytes=8 * BLOCK, block_bytes=BLOCK,
                                    lookahead=2, concurrency=4, **options)
        object_store.proxy.reset()
        out = []
        for i, step in enumerate(steps):
            # A few steps carry a row out of plan order in their middle (a retry, another sampler's row).
            rows = step[:1] + [stray[i]] + step[1:] if i in stray else step
            got = source.arrays_many(rows) if many else [source.arrays(row) for row in rows]
            assert_rows(store, rows, got)
            out.append(got)
        source.close()
        return source, data_spans(object_store.proxy)

    one, one_spans = read(False, "one")
    many, many_spans = read(True, "many")
    assert many_spans == one_spans and len(many_spans) > 10
    assert (many.fetched_bytes, many.requests, many.unplanned_rows) == \
        (one.fetched_bytes, one.requests, one.unplanned_rows)
    assert many.unplanned_rows == len(stray)
    if tier == "memory":  # each epoch starts empty: the bytes fetched are Belady's misses of its references
        expected = 0
        for epoch in range(2):
            rows = [int(key) for keys in PlanBatchSampler(plan, epoch=epoch) for key in keys]
            refs = block_refs(opened, rows, BLOCK)[0]
            for block in refs[belady(refs, 8).misses].tolist():
                size = opened.objects[("tokens", "loss_mask")[block >> 40]].size
                expected += min(BLOCK, size - (block & ((1 << 40) - 1)) * BLOCK)
        direct = sum(b - a for row in stray.values() for a, b in opened.spans(row))  # two GETs per stray row
        assert many.fetched_bytes == expected == sum(b - a for _, (a, b) in many_spans) - direct


def test_a_row_not_in_the_store_is_refused_as_one_at_a_time_refuses_it(local, remote):
    store, plan = local
    source = PlannedTokenSource(remote, PlanBatchSampler(plan), cache_bytes=8 * BLOCK, block_bytes=BLOCK)
    first = epoch_steps(plan)[0]
    codes = []
    for read in (lambda rows: source.arrays_many(rows), lambda rows: [source.arrays(row) for row in rows]):
        with pytest.raises(UmlosError) as info:
            read([len(store)])
        codes.append((info.value.code, str(info.value)))
    assert codes[0] == codes[1] and codes[0][0] == errors.TOKEN_STORE_INVALID and f"{len(store) - 1}" in codes[0][1]
    assert_rows(store, first, source.arrays_many(first))  # the planned rows still come from the cache
    assert source.unplanned_rows == 2
    source.close()


def test_the_flat_store_reads_random_rows_a_microbatch_at_a_time(local):
    store, _ = local
    rng = np.random.default_rng(5)
    for size in (0, 1, 2, 31, 32, 33):
        rows = rng.integers(0, len(store), size).tolist()
        assert_rows(store, rows, store.arrays_many(rows))
        assert_rows(store, rows, store.arrays_many(np.asarray(rows, dtype=np.int64)))
    for bad in ([len(store)], [0, -1]):
        with pytest.raises(UmlosError) as many:
            store.arrays_many(bad)
        with pytest.raises(UmlosError) as one:
            [store.arrays(row) for row in bad]
        assert (many.value.code, str(many.value)) == (one.value.code, str(one.value))


def test_the_dataset_hands_a_microbatch_to_arrays_many_and_other_keys_one_at_a_time(local):
    store, plan = local
    dataset = TokenDataset(store.root, plan=plan)
    calls = []
    read_many = dataset.source.arrays_many
    dataset.source.arrays_many = lambda rows: calls.append(list(rows)) or read_many(rows)
    rows = [5, np.int64(7), 2]
    items = dataset.__getitems__(rows)
    assert calls == [[5, 7, 2]]
    assert [item[0] for item in items] == [5, 7, 2] and all(type(item[0]) is int for item in items)
    assert_rows(store, [5, 7, 2], [item[1:] for item in items])
    packed = dataset.__getitems__([(5, 0), (7, 1)])  # a packed plan's keys: one at a time, as before
    assert calls == [[5, 7, 2]] and [item[3] for item in packed] == [0, 1]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataloader_gives_the_batches_collated_from_one_row_at_a_time(local, remote, workers):
    store, plan = local
    collator = PlanCollator(plan)
    sampler = PlanBatchSampler(plan, rank=1, world_size=2)
    source = PlannedTokenSource(remote, sampler, cache_bytes=16 * BLOCK, block_bytes=BLOCK)
    extra = {"multiprocessing_context": "spawn"} if workers else {}
    loader = DataLoader(TokenDataset(source, plan=plan), batch_sampler=sampler, collate_fn=collator,
                        num_workers=workers, **extra)
    got = list(loader)
    source.close()
    steps = [[int(key) for key in keys] for keys in PlanBatchSampler(plan, 1, 2)]
    expected = [collator([(row, *store.arrays(row)) for row in step]) for step in steps]
    assert len(got) == len(expected) > 4
    for a, b in zip(got, expected):
        assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)
