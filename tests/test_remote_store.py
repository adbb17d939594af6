"""Token stores in an object store (umlos_cuda/remote/), against a real S3-compatible server.

moto's server runs on a free loopback port behind the counting proxy of tests/objstore_support.py (the
``object_store`` fixture): the proxy's counts are what the reader fetched, and its faults are what the
reader must survive or refuse. A token store is written on disk by ``data tokenize``, copied into a
bucket as it is, and read back: every row equal to the local store's, tensors through a DataLoader equal
bit for bit at two ranks, an epoch fetching each stored byte at most once with a large cache and exactly
what an offline Belady simulation of the same references counts with a small one, a resume fetching only
what the steps after it need, each fault retried then refused with its code, a changed object refused.
"""

from __future__ import annotations

import itertools
import os
from functools import cache

import numpy as np
import pytest

from token_cases import make_store
from umlos_cuda import errors
from umlos_cuda.errors import UmlosError
from umlos_cuda.remote import PlannedTokenSource, RemoteTokenStore, RetryBudget, belady
from umlos_cuda.remote.belady import next_uses

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from umlos_cuda.batching import BatchingConfig  # noqa: E402
from umlos_cuda.torch import PlanBatchSampler, PlanCollator, TokenDataset  # noqa: E402

#: Small blocks, so that a store of a few hundred rows spans many of them.
BLOCK = 1 << 10
#: A budget that keeps the fault tests short: 4 tries, 10 ms then 20 then 40 between them.
FAST = RetryBudget(attempts=4, first_delay_s=0.01, max_delay_s=0.05, timeout_s=10.0)
#: For the stalls: each try given up after a second (the proxy stalls for 2.5 s; a reply comes in milliseconds).
STALLS = RetryBudget(attempts=3, first_delay_s=0.01, max_delay_s=0.05, timeout_s=1.0)


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """A token store on disk (400 prompt/response records: loss masks with zeros) and a windowed plan of it."""
    from umlos_cuda.batching.plans.windows import ArrayLengths, WindowDefinition, WindowedPlan

    store = make_store(tmp_path_factory.mktemp("remote-store"), 400, seed=3)
    config = BatchingConfig.throughput(256, (16, 32, 64, 128), 256, seed=11)
    plan = WindowedPlan.build(WindowDefinition(config, len(store), 64), ArrayLengths(store.lengths), 2)
    return store, plan


@pytest.fixture(scope="module")
def remote(local, object_store):
    """The local store copied into a bucket: ``(url, bucket, prefix)``."""
    store, _ = local
    bucket = object_store.bucket()
    return object_store.upload_folder(store.root, bucket, "corpus/v1"), bucket, "corpus/v1"


def stored_bytes(store) -> int:
    return sum(store.objects[name].size for name in ("tokens", "loss_mask"))


def data_gets(proxy):
    return [r for r in proxy.gets() if r.key.endswith(("tokens.npy", "loss_mask.npy"))]


# ---------------------------------------------------------------------- reading
def test_every_row_reads_as_on_disk(local, remote, object_store):
    from umlos_cuda.batching.sources import open_source, source_kind

    store, plan = local
    url = remote[0]
    opened = RemoteTokenStore.open(url)
    assert len(opened) == len(store) and opened.num_tokens == store.num_tokens
    assert np.array_equal(opened.lengths, store.lengths)
    assert opened.identity() == store.identity() and opened.tokenizer_hash == store.tokenizer_hash
    for row in (0, 1, 199, len(store) - 1):
        ids, mask = opened.arrays(row)
        assert ids.dtype == store.tokens.dtype and np.array_equal(ids, store.input_ids(row))
        assert np.array_equal(mask, store.loss_mask(row))
    assert source_kind(url).name == "remote token store"
    source = open_source(url, tokens=True)
    assert source.origin == url and np.array_equal(source.take(np.arange(len(store))), store.lengths)
    dataset = TokenDataset(url, plan=plan)  # the plan's lengths checked against the remote store's
    row, ids, mask = dataset[5]
    assert row == 5 and np.array_equal(ids, store.input_ids(5)) and np.array_equal(mask, store.loss_mask(5))


def _tensors(dataset, plan, rank):
    sampler = PlanBatchSampler(plan, rank=rank, world_size=2)
    loader = DataLoader(dataset(sampler), batch_sampler=sampler, collate_fn=PlanCollator(plan), num_workers=0)
    return [batch for batch in loader]


@pytest.mark.parametrize("rank", [0, 1])
def test_the_planned_cache_gives_the_tensors_of_the_local_store_bit_for_bit(local, remote, rank):
    store, plan = local
    sources = []

    def planned(sampler):
        sources.append(PlannedTokenSource(remote[0], sampler, cache_bytes=16 * BLOCK, block_bytes=BLOCK))
        return TokenDataset(sources[-1], plan=plan)

    here = _tensors(lambda sampler: TokenDataset(store.root, plan=plan), plan, rank)
    there = _tensors(planned, plan, rank)
    assert len(here) == len(there) > 0
    for a, b in zip(here, there):
        assert a.keys() == b.keys()
        assert all(torch.equal(a[name], b[name]) for name in a)
    assert sources[0].unplanned_rows == 0
    sources[0].close()


# ---------------------------------------------------------------------- what an epoch fetches
def _read_pass(source, sampler) -> None:
    for keys in sampler:
        for key in keys:
            source.arrays(int(key))


def test_an_epoch_fetches_each_stored_byte_at_most_once_with_a_cache_of_the_stores_size(local, remote,
                                                                                      object_store):
    _, plan = local
    sampler = PlanBatchSampler(plan, rank=0, world_size=1)
    opened = RemoteTokenStore.open(remote[0])
    object_store.proxy.reset()
    source = PlannedTokenSource(opened, sampler, cache_bytes=stored_bytes(opened), block_bytes=BLOCK, lookahead=2)
    _read_pass(source, sampler)
    fetched = sum(r.sent for r in data_gets(object_store.proxy))
    assert fetched == source.fetched_bytes <= stored_bytes(opened)
    assert source.unplanned_rows == 0
    # Coalesced: fewer requests than blocks fetched (adjacent blocks of one object go in one GET).
    assert len(data_gets(object_store.proxy)) == source.requests < source.schedule.fetches
    source.close()


def _expected_refs(store, rows, block) -> list[int]:
    """The blocks ``rows`` reference, worked out here one row at a time (not with the reader's code)."""
    refs = []
    for row in rows:
        start, stop = int(store.offsets[row]), int(store.offsets[row + 1])
        size = store.token_dtype.itemsize
        for number, (a, b) in enumerate(((store.starts["tokens"] + start * size, store.starts["tokens"] + stop * size),
                                         (store.starts["loss_mask"] + start, store.starts["loss_mask"] + stop))):
            refs += [(number << 40) | k for k in range(a // block, (b - 1) // block + 1)] if b > a else []
    return refs


def _belady_bytes(store, refs, capacity, block) -> int:
    schedule = belady(np.asarray(refs, dtype=np.int64), capacity)
    sizes = {0: store.objects["tokens"].size, 1: store.objects["loss_mask"].size}
    missed = np.asarray(refs, dtype=np.int64)[schedule.misses]
    return sum(min(block, sizes[int(b) >> 40] - (int(b) & ((1 << 40) - 1)) * block) for b in missed)


@pytest.mark.parametrize("blocks", [3, 8])
def test_a_small_cache_fetches_exactly_what_belady_counts(local, remote, object_store, blocks):
    _, plan = local
    opened = RemoteTokenStore.open(remote[0])
    sampler = PlanBatchSampler(plan, rank=1, world_size=2)
    rows = [int(k) for keys in PlanBatchSampler(plan, rank=1, world_size=2) for k in keys]
    expected = _belady_bytes(opened, _expected_refs(opened, rows, BLOCK), blocks, BLOCK)
    object_store.proxy.reset()
    source = PlannedTokenSource(opened, sampler, cache_bytes=blocks * BLOCK, block_bytes=BLOCK, lookahead=3)
    _read_pass(source, sampler)
    assert sum(r.sent for r in data_gets(object_store.proxy)) == source.fetched_bytes == expected
    assert expected > stored_bytes(opened)  # the cache is too small to hold what is reused: blocks come twice
    source.close()


def test_a_resumed_rank_fetches_only_what_its_remaining_steps_need(local, remote, object_store):
    _, plan = local
    opened = RemoteTokenStore.open(remote[0])
    whole = PlanBatchSampler(plan, rank=0, world_size=2)
    steps = [[int(k) for k in keys] for keys in whole]
    k = len(steps) // 2
    resumed = PlanBatchSampler(plan, rank=0, world_size=2, epoch=0, microbatch_index=2 * k)
    object_store.proxy.reset()
    source = PlannedTokenSource(opened, resumed, cache_bytes=stored_bytes(opened), block_bytes=BLOCK)
    _read_pass(source, resumed)
    after = set(_expected_refs(opened, [row for step in steps[k:] for row in step], BLOCK))
    fetched = set()
    for request in data_gets(object_store.proxy):
        number = 0 if request.key.endswith("tokens.npy") else 1
        fetched |= {(number << 40) | b for b in range(request.span[0] // BLOCK, (request.span[1] - 1) // BLOCK + 1)}
    assert fetched == after  # nothing of the steps before the resume
    before_only = set(_expected_refs(opened, [row for step in steps[:k] for row in step], BLOCK)) - after
    assert before_only  # (the steps before it did reference other blocks)
    source.close()


def test_the_next_epoch_is_planned_when_the_reader_reaches_it(local, remote, object_store):
    store, plan = local  # a plan of two epochs
    opened = RemoteTokenStore.open(remote[0])
    sampler = PlanBatchSampler(plan, rank=0, world_size=2)
    source = PlannedTokenSource(opened, sampler, cache_bytes=stored_bytes(opened) + 4 * BLOCK, block_bytes=BLOCK)
    object_store.proxy.reset()
    for epoch in range(2):
        for keys in sampler:
            for key in keys:
                ids, mask = source.arrays(int(key))
                assert np.array_equal(ids, store.input_ids(int(key)))
                assert np.array_equal(mask, store.loss_mask(int(key)))
        assert source.epoch == epoch and sampler.epoch == min(epoch + 1, 1)
    assert source.unplanned_rows == 0
    assert sum(r.sent for r in data_gets(object_store.proxy)) == source.fetched_bytes <= 2 * stored_bytes(opened)
    source.close()


# ---------------------------------------------------------------------- Belady against a brute force
@cache
def _fewest_fetches(refs: tuple[int, ...], capacity: int, i: int = 0, resident: frozenset = frozenset()) -> int:
    if i == len(refs):
        return 0
    block = refs[i]
    if block in resident:
        return _fewest_fetches(refs, capacity, i + 1, resident)
    if len(resident) < capacity:
        return 1 + _fewest_fetches(refs, capacity, i + 1, resident | {block})
    return 1 + min(_fewest_fetches(refs, capacity, i + 1, (resident - {victim}) | {block}) for victim in resident)


def test_belady_fetches_the_fewest_blocks_on_every_small_sequence():
    checked = 0
    for length in range(1, 8):
        for refs in itertools.product(range(4), repeat=length):
            if refs[0] != 0 or any(b > max(refs[:j], default=-1) + 1 for j, b in enumerate(refs)):
                continue  # one sequence per renaming of the blocks
            for capacity in (1, 2, 3):
                schedule = belady(np.asarray(refs), capacity)
                assert schedule.fetches == _fewest_fetches(refs, capacity), (refs, capacity)
                checked += 1
    assert checked > 1000


def test_belady_evicts_the_block_used_furthest_ahead_and_never_holds_more_than_its_room():
    refs = np.array([1, 2, 3, 1, 2, 4, 1, 2, 3])
    schedule = belady(refs, 2)
    assert schedule.misses.tolist() == [True, True, True, False, True, True, False, True, True]
    assert schedule.victims[2] == 2  # at the first 3: 1 comes back at 3, 2 only at 4
    assert next_uses(refs).tolist() == [3, 4, 8, 6, 7, 9, 9, 9, 9]
    resident = set()
    for block, miss, victim in zip(refs.tolist(), schedule.misses, schedule.victims.tolist()):
        assert miss == (block not in resident)
        resident.discard(victim)
        resident.add(block)
        assert len(resident) <= 2
    with pytest.raises(ValueError):
        belady(refs, 0)


# ---------------------------------------------------------------------- faults
def _only(name):
    return lambda request: request.method == "GET" and request.key.endswith(name) and request.span is not None


@pytest.mark.parametrize("fault", ["slowdown", "error500", "reset", "short", "stall"])
def test_a_fault_is_retried_within_the_budget(remote, object_store, fault, local):
    store, _ = local
    budget = STALLS if fault == "stall" else FAST
    opened = RemoteTokenStore.open(remote[0], budget=budget)
    proxy = object_store.proxy
    proxy.stall_s = 2.5  # past STALLS' timeout
    proxy.reset()
    proxy.inject(fault, count=budget.attempts - 1, match=_only("tokens.npy"))
    try:
        ids, _ = opened.arrays(7)
    finally:
        proxy.clear()
        proxy.stall_s = 5.0
    assert np.array_equal(ids, store.input_ids(7))
    tries = [r for r in proxy.gets("tokens.npy")]
    assert [r.fault for r in tries] == [fault] * (budget.attempts - 1) + [None]


@pytest.mark.parametrize("fault", ["slowdown", "reset"])
def test_a_fault_past_the_budget_is_refused_naming_the_object(remote, object_store, fault):
    opened = RemoteTokenStore.open(remote[0], budget=FAST)
    proxy = object_store.proxy
    proxy.reset()
    proxy.inject(fault, count=FAST.attempts, match=_only("loss_mask.npy"))
    try:
        with pytest.raises(UmlosError) as info:
            opened.arrays(3)
    finally:
        proxy.clear()
    assert info.value.code == errors.REMOTE_REQUEST_FAILED
    assert info.value.record["failure_operator"] == errors.REMOTE_OPERATOR
    assert f"{remote[0]}/loss_mask.npy" in info.value.message and f"failed {FAST.attempts} times" in info.value.message
    assert len(proxy.gets("loss_mask.npy")) == FAST.attempts


def test_a_changed_object_is_refused_and_nothing_of_it_is_cached(local, object_store):
    store, plan = local
    bucket = object_store.bucket()
    url = object_store.upload_folder(store.root, bucket, "changing")
    opened = RemoteTokenStore.open(url, budget=FAST)
    sampler = PlanBatchSampler(plan, rank=0, world_size=1)
    source = PlannedTokenSource(opened, sampler, cache_bytes=4 * BLOCK, block_bytes=BLOCK, lookahead=0)
    rows = [int(k) for keys in PlanBatchSampler(plan, rank=0, world_size=1) for k in keys]
    source.arrays(rows[0])
    with open(f"{store.root}/loss_mask.npy", "rb") as handle:
        data = bytearray(handle.read())
    data[-1] ^= 1  # same size, other bytes: another ETag
    object_store.put(bucket, "changing/loss_mask.npy", bytes(data))
    with pytest.raises(UmlosError) as info:
        for row in rows[1:]:
            source.arrays(row)
    assert info.value.code == errors.REMOTE_OBJECT_CHANGED
    assert f"{url}/loss_mask.npy" in info.value.message
    original = {0: (store.root + "/tokens.npy"), 1: (store.root + "/loss_mask.npy")}
    for block, held in list(source._resident.items()):  # what stays: bytes checked before the change, or none
        if not isinstance(held, bytes):  # a fetch in flight (a block read is held as its bytes)
            assert held.exception(timeout=10) is None, "a failed fetch stayed in the cache"
            held = held.result()[block]
        number, index = block >> 40, block & ((1 << 40) - 1)
        with open(original[number], "rb") as handle:
            handle.seek(index * BLOCK)
            assert held == handle.read(BLOCK)
    with pytest.raises(UmlosError) as again:  # a direct read is refused too
        opened.arrays(rows[0])
    assert again.value.code == errors.REMOTE_OBJECT_CHANGED
    source.close()


# ---------------------------------------------------------------------- refusals at opening
def test_no_store_at_the_url_is_token_store_not_found(object_store):
    bucket = object_store.bucket()
    with pytest.raises(UmlosError) as info:
        RemoteTokenStore.open(f"s3://{bucket}/nothing", budget=FAST)
    assert info.value.code == errors.TOKEN_STORE_NOT_FOUND
    assert f"s3://{bucket}/nothing/meta.json" in info.value.message


def test_a_json_object_over_its_cap_is_refused_before_its_body_is_fetched(remote, object_store):
    from umlos_cuda.remote.bounded import read_json_object
    from umlos_cuda.remote.client import RemoteObject
    from umlos_cuda.remote.urls import parse_url

    url = parse_url(remote[0])
    obj = RemoteObject.open(url, url.key("meta.json"), FAST)
    object_store.proxy.reset()

    def invalid(message):
        return UmlosError(errors.TOKEN_STORE_INVALID, message, operator=errors.BATCHING_OPERATOR)

    with pytest.raises(UmlosError) as info:
        read_json_object(obj, invalid, max_bytes=obj.size - 1)
    assert info.value.code == errors.TOKEN_STORE_INVALID and "meta.json" in info.value.message
    assert object_store.proxy.gets("meta.json") == []


def test_a_missing_array_and_offsets_that_do_not_rise_are_token_store_invalid(local, object_store):
    store, _ = local
    bucket = object_store.bucket()
    url = object_store.upload_folder(store.root, bucket, "broken")
    offsets = np.load(f"{store.root}/offsets.npy")
    offsets[5], offsets[6] = offsets[6], offsets[5]
    import io

    buffer = io.BytesIO()
    np.save(buffer, offsets)
    object_store.put(bucket, "broken/offsets.npy", buffer.getvalue())
    with pytest.raises(UmlosError) as info:
        RemoteTokenStore.open(url, budget=FAST)
    assert info.value.code == errors.TOKEN_STORE_INVALID and "offsets.npy" in info.value.message
    other = object_store.upload_folder(store.root, bucket, "no-mask")
    object_store.delete(bucket, "no-mask/loss_mask.npy")
    with pytest.raises(UmlosError) as missing:
        RemoteTokenStore.open(other, budget=FAST)
    assert missing.value.code == errors.TOKEN_STORE_INVALID and f"{other}/loss_mask.npy is missing" in \
        missing.value.message


def test_a_whole_plan_naming_samples_by_id_is_refused_saying_what_is_not_read_yet(local, remote):
    from umlos_cuda.batching import BatchPlanBuilder

    store, _ = local
    whole = BatchPlanBuilder(store.lengths, BatchingConfig.throughput(256, (16, 32, 64, 128), 256, seed=11),
                             tokenizer_hash=store.tokenizer_hash, sample_ids=store.sample_ids).build(1)
    TokenDataset(store.root, plan=whole)  # on disk: its ids are compared
    with pytest.raises(UmlosError) as info:
        TokenDataset(remote[0], plan=whole)
    assert info.value.code == errors.REMOTE_UNAVAILABLE and "--window" in info.value.message
    planned = PlannedTokenSource(remote[0], PlanBatchSampler(whole, rank=0, world_size=1), cache_bytes=8 * BLOCK,
                                 block_bytes=BLOCK)
    with pytest.raises(UmlosError) as info:
        TokenDataset(planned, plan=whole)
    assert info.value.code == errors.REMOTE_UNAVAILABLE
    planned.close()


def test_arguments_are_checked(remote, local):
    _, plan = local
    sampler = PlanBatchSampler(plan, rank=0, world_size=1)
    for kwargs in ({"cache_bytes": BLOCK - 1, "block_bytes": BLOCK}, {"cache_bytes": BLOCK, "block_bytes": 10},
                   {"cache_bytes": BLOCK, "block_bytes": BLOCK, "concurrency": 0}):
        with pytest.raises(UmlosError) as info:
            PlannedTokenSource(remote[0], sampler, **kwargs)
        assert info.value.code == errors.INVALID_ARGUMENT
    import pickle

    source = PlannedTokenSource(remote[0], sampler, cache_bytes=BLOCK, block_bytes=BLOCK, lookahead=5, gap_bytes=7)
    copy = pickle.loads(pickle.dumps(source))  # what a DataLoader worker started by spawn receives
    assert (copy.root, copy.cache_bytes, copy.block_bytes, copy.lookahead, copy.gap_bytes, copy.sampler.rank) == \
        (source.root, BLOCK, BLOCK, 5, 7, 0)
    copy.close()
    source.close()
    with pytest.raises(UmlosError) as info:
        RetryBudget(attempts=0)
    assert info.value.code == errors.INVALID_ARGUMENT
    with pytest.raises(UmlosError) as info:
        RemoteTokenStore.open("s3:///no-bucket")
    assert info.value.code == errors.REMOTE_UNAVAILABLE


# ---------------------------------------------------------------------- publishing
def test_tokenize_publishes_into_an_object_store_index_last(local, object_store, capsys):
    from umlos_cuda.cli import EXIT_UMLOS_ERROR, main

    store, _ = local
    root = os.path.dirname(store.root)
    url = f"s3://{object_store.bucket()}/published"
    argv = ["data", "tokenize", "--dataset", f"{root}/train.jsonl", "--tokenizer", f"{root}/model",
            "--prompt-field", "prompt", "--response-field", "response", "--output", url, "--quiet"]
    object_store.proxy.reset()
    assert main(argv) == 0
    puts = [r.key.rsplit("/", 1)[-1] for r in object_store.proxy.requests if r.method == "PUT"]
    assert puts[-1] == "meta.json" and {"tokens.npy", "loss_mask.npy", "offsets.npy"} <= set(puts[:-1])
    published = RemoteTokenStore.open(url)
    assert published.meta == store.meta
    assert all(np.array_equal(published.arrays(row)[0], store.input_ids(row)) for row in (0, 57, len(store) - 1))
    capsys.readouterr()
    assert main(argv) == EXIT_UMLOS_ERROR  # a store is there: OUTPUT_EXISTS without --force
    assert "error OUTPUT_EXISTS" in capsys.readouterr().err
    object_store.proxy.reset()
    assert main([*argv, "--force"]) == 0
    writes = [(r.method, r.key.rsplit("/", 1)[-1] or r.query) for r in object_store.proxy.requests
              if r.method in ("PUT", "POST", "DELETE")]
    assert writes[0] in (("POST", "delete"), ("DELETE", "meta.json"))  # the old store goes first (its index)
    assert writes[-1] == ("PUT", "meta.json") and len(writes) == len(puts) + 1


def test_an_object_store_output_takes_a_flat_store_or_an_append_only(local, capsys):
    from umlos_cuda.cli import main

    store, _ = local
    root = os.path.dirname(store.root)
    with pytest.raises(SystemExit):
        main(["data", "tokenize", "--dataset", f"{root}/train.jsonl", "--tokenizer", f"{root}/model", "--sharded",
              "--output", "s3://bucket/sharded", "--quiet"])
    assert "no new --sharded store" in capsys.readouterr().err
