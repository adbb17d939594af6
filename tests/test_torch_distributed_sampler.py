"""umlos_cuda.torch.DistributedSampler in one process: the partition of docs/spec/nextbatch-v2.md §8,
the engine's order, PyTorch compatibility, validation and O(1) resume.

The sampler's logic needs no torch; the tests that use DataLoader, PyTorch's
own sampler or torchdata skip with a reason when those are absent.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from itertools import chain

import cbor2
import numpy as np
import pytest

import umlos_cuda as uc
from umlos_cuda.torch import DistributedSampler, SamplerArgumentError, SamplerTypeError, sampler_manifest

EDGE_N = [0, 1, 2, 3, 7, 8, 9, 31, 32, 33, 100]
WORLDS = [1, 2, 3, 4, 8]


def ranks(n, w, **kw):
    return [DistributedSampler(n, num_replicas=w, rank=r, **kw) for r in range(w)]


def interleave(per_rank):
    w = len(per_rank)
    out = [None] * sum(len(x) for x in per_rank)
    for r, values in enumerate(per_rank):
        out[r::w] = values
    return out


# -- the global order ---------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 17, 100, 1000])
def test_w1_order_is_the_engine_sequence_of_seed_plus_epoch(n):
    s = DistributedSampler(n, num_replicas=1, rank=0, seed=5, block_size=16)
    s.set_epoch(3)
    got = list(s)
    engine = uc.epoch_indices(sampler_manifest(n, 8, 16), "dataset", epoch=0, backend="numpy")
    assert got == engine.tolist()
    assert sorted(got) == list(range(n))


def test_seed_plus_epoch_rule():
    a = DistributedSampler(200, num_replicas=1, rank=0, seed=5, block_size=16)
    a.set_epoch(2)
    b = DistributedSampler(200, num_replicas=1, rank=0, seed=7, block_size=16)
    assert list(a) == list(b)
    b.set_epoch(1)
    assert list(a) != list(b)


def test_different_epochs_and_seeds_give_different_orders():
    orders = set()
    for seed, epoch in [(0, 0), (0, 1), (0, 2), (10, 0)]:
        s = DistributedSampler(500, num_replicas=1, rank=0, seed=seed, block_size=32)
        s.set_epoch(epoch)
        orders.add(tuple(s))
    assert len(orders) == 4


def test_same_configuration_is_deterministic_across_instances_and_backends(backend):
    a = DistributedSampler(300, num_replicas=3, rank=1, seed=9, block_size=16, backend=backend)
    b = DistributedSampler(300, num_replicas=3, rank=1, seed=9, block_size=16, backend="numpy")
    a.set_epoch(4)
    b.set_epoch(4)
    assert list(a) == list(b)


def test_shuffle_false_is_sequential():
    per_rank = [list(s) for s in ranks(10, 4, shuffle=False, pad=False)]
    assert per_rank == [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]
    per_rank = [list(s) for s in ranks(10, 4, shuffle=False)]  # the default pads, as PyTorch does
    assert per_rank == [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]]


# -- partition (docs/spec/nextbatch-v2.md §8) --------------------------------------


@pytest.mark.parametrize("n", EDGE_N)
@pytest.mark.parametrize("w", WORLDS)
def test_partition_without_padding(n, w):
    samplers = ranks(n, w, seed=3, block_size=8, pad=False)
    per_rank = [list(s) for s in samplers]
    assert [len(s) for s in samplers] == [len(x) for x in per_rank] == [len(range(r, n, w)) for r in range(w)]
    assert [s.num_samples for s in samplers] == [len(x) for x in per_rank]
    flat = list(chain.from_iterable(per_rank))
    assert sorted(flat) == list(range(n))  # disjoint and complete
    assert interleave(per_rank) == list(DistributedSampler(n, 1, 0, seed=3, block_size=8))


@pytest.mark.parametrize("n", EDGE_N)
@pytest.mark.parametrize("w", WORLDS)
def test_drop_last_takes_floor(n, w):
    full = list(DistributedSampler(n, 1, 0, seed=3, block_size=8))
    samplers = ranks(n, w, seed=3, block_size=8, drop_last=True)
    per_rank = [list(s) for s in samplers]
    assert all(len(x) == n // w == s.num_samples for x, s in zip(per_rank, samplers))
    assert all(s.total_size == (n // w) * w for s in samplers)
    assert interleave(per_rank) == full[: (n // w) * w]


@pytest.mark.parametrize("n", EDGE_N)
@pytest.mark.parametrize("w", WORLDS)
def test_pad_repeats_the_head_like_pytorch(n, w):
    full = list(DistributedSampler(n, 1, 0, seed=3, block_size=8))
    samplers = ranks(n, w, seed=3, block_size=8, pad=True)
    per_rank = [list(s) for s in samplers]
    if n == 0:
        assert per_rank == [[]] * w
        return
    size = -(-n // w)
    assert all(len(x) == size for x in per_rank)
    padded = full + (full * (1 + size * w // n))[: size * w - n]  # torch's padding rule
    assert interleave(per_rank) == padded


@pytest.mark.parametrize("w", [1, 3, 8])
def test_each_rank_maps_only_its_own_positions(monkeypatch, w):
    """A rank reads its share through strided engine windows: the positions the
    engine maps, over the whole epoch, are the rank's samples, not W times as many."""
    from umlos_cuda.torch import _order

    mapped = []

    def counting(*args, **kwargs):
        mapped.append(args[4] if len(args) > 4 else kwargs["count"])
        return uc.epoch_indices(*args, **kwargs)

    monkeypatch.setattr(_order, "epoch_indices", counting)
    n = 10_001
    full = uc.epoch_indices(sampler_manifest(n, 3, 64), "dataset", backend="numpy").tolist()
    padded = full + full[: -(-n // w) * w - n]  # one sample of padding at most here
    for r, sampler in enumerate(ranks(n, w, seed=3, block_size=64)):
        mapped.clear()
        taken = list(sampler)
        assert taken == padded[r::w]
        assert sum(mapped) == len(taken) == sampler.num_samples


def test_empty_dataset_is_empty():
    s = DistributedSampler([], num_replicas=4, rank=2)
    assert len(s) == 0 and list(s) == [] and s.get_indices().tolist() == [] and s.get_num_batches(8) == 0
    with pytest.raises(uc.UmlosError, match="has no samples"):
        s.get_batch(0, 8)


def test_fewer_samples_than_ranks():
    per_rank = [list(s) for s in ranks(3, 8, seed=1, pad=False)]
    assert [len(x) for x in per_rank] == [1, 1, 1, 0, 0, 0, 0, 0]
    assert sorted(chain.from_iterable(per_rank)) == [0, 1, 2]
    padded = [list(s) for s in ranks(3, 8, seed=1)]  # the default: one sample each, the order repeated
    assert padded[:3] == per_rank[:3] and padded[3:] == (per_rank[:3] * 2)[:5]


# -- batches and windows (docs/integrations.md) -----------------------------------


@pytest.mark.parametrize("batch_size", [1, 3, 7, 50])
def test_get_batch_get_indices_get_num_batches(batch_size):
    s = DistributedSampler(101, num_replicas=4, rank=3, seed=2, block_size=16)
    s.set_epoch(1)
    everything = list(s)
    assert s.get_indices().tolist() == everything
    assert s.get_indices().dtype == np.int64
    batches = [s.get_batch(i, batch_size).tolist() for i in range(s.get_num_batches(batch_size))]
    assert s.get_num_batches(batch_size) == -(-len(everything) // batch_size)
    assert list(chain.from_iterable(batches)) == everything
    assert all(len(b) == batch_size for b in batches[:-1]) and 1 <= len(batches[-1]) <= batch_size


def test_get_batch_range_errors_name_the_range():
    s = DistributedSampler(10, num_replicas=2, rank=0)
    with pytest.raises(SamplerArgumentError, match=r"batch_index 3 is outside \[0, 2\]") as exc:
        s.get_batch(3, 2)
    assert exc.value.code == "GLOBAL_POSITION_EXCEEDS_CARDINALITY"
    with pytest.raises(SamplerArgumentError, match=r"batch_size 0 is outside \[1, "):
        s.get_batch(0, 0)
    with pytest.raises(SamplerArgumentError, match=r"batch_size"):
        s.get_num_batches(0)


def test_huge_dataset_needs_no_order_array():
    """N = 10^11: an O(N) permutation would need 800 GB; windows cost O(window)."""
    n = 10**11
    s = DistributedSampler(n, num_replicas=8, rank=5, seed=1)
    assert len(s) == n // 8
    head = list(itertools.islice(iter(s), 5))
    assert head == s.get_batch(0, 5).tolist()
    far = s.get_batch(10**9, 4).tolist()
    m = sampler_manifest(n, 1)
    window = uc.epoch_indices(m, "dataset", 0, 5 + 10**9 * 4 * 8, 3 * 8 + 1, backend="numpy")
    assert far == window[::8].tolist()
    assert all(0 <= i < n for i in head + far)


# -- validation -------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, code, message",
    [
        ({"num_replicas": 8, "rank": 9}, "INVALID_RANK", r"Invalid rank 9, rank should be in the interval \[0, 7\]"),
        ({"num_replicas": 8, "rank": -1}, "INVALID_RANK", r"Invalid rank -1, rank should be in the interval \[0, 7\]"),
        ({"num_replicas": 0, "rank": 0}, "INVALID_RANK", r"Invalid num_replicas 0, num_replicas should be in the "
                                                         r"interval \[1, 4294967295\]"),
        ({"num_replicas": 2.0, "rank": 0}, "INVALID_RANK", r"Invalid num_replicas 2.0 \(float\), num_replicas should "
                                                           r"be an integer in the interval \[1, 4294967295\]"),
        ({"num_replicas": 2, "rank": 0, "seed": 2**64}, "INVALID_ARGUMENT", r"seed = 18446744073709551616 is outside "
                                                                            r"\[-2\^63, 2\^64 - 1\]"),
        ({"num_replicas": 2, "rank": 0, "seed": -(2**63) - 1}, "INVALID_ARGUMENT", r"seed = -9223372036854775809 is "
                                                                                   r"outside \[-2\^63, 2\^64 - 1\]"),
        ({"num_replicas": 2, "rank": 0, "seed": 1.0}, "INVALID_ARGUMENT",
         r"seed must be an integer in \[-2\^63, 2\^64 - 1\], got float"),
        ({"num_replicas": 2, "rank": 0, "block_size": 0}, "BATCH_SIZE_INCONSISTENT", r"block_size 0 is outside \[1, "),
        ({"num_replicas": 2, "rank": 0, "backend": "tpu"}, "BACKEND_UNAVAILABLE", r"choose one of"),
    ],
)
def test_constructor_errors_name_the_allowed_range(kwargs, code, message):
    with pytest.raises(SamplerArgumentError, match=message) as exc:
        DistributedSampler(10, **kwargs)
    assert exc.value.code == code
    assert isinstance(exc.value, ValueError) and isinstance(exc.value, uc.UmlosError)


def test_dataset_without_length_is_refused():
    with pytest.raises(SamplerTypeError, match=r"object of type 'list_iterator' has no len\(\)") as exc:
        DistributedSampler(iter([1, 2]), num_replicas=1, rank=0)
    assert exc.value.code == "CARDINALITY_MISMATCH"
    assert isinstance(exc.value, TypeError) and isinstance(exc.value, uc.UmlosError)
    assert not isinstance(exc.value, ValueError)


def test_set_epoch_range():
    s = DistributedSampler(10, num_replicas=1, rank=0, seed=2**64 - 3)
    s.set_epoch(2)
    with pytest.raises(SamplerArgumentError,
                       match=r"epoch 3 is outside \[0, 2\]: seed \+ epoch must be in \[-2\^63, 2\^64 - 1\]"):
        s.set_epoch(3)
    with pytest.raises(SamplerArgumentError, match=r"epoch -1 is outside"):
        s.set_epoch(-1)


def test_rank_and_world_size_from_the_environment(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "6")
    monkeypatch.setenv("RANK", "4")
    s = DistributedSampler(60)
    assert (s.num_replicas, s.rank) == (6, 4)
    monkeypatch.setenv("RANK", "6")
    with pytest.raises(SamplerArgumentError, match=r"Invalid rank 6, rank should be in the interval \[0, 5\]"):
        DistributedSampler(60)
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(SamplerArgumentError, match="RANK='x' is not an integer"):
        DistributedSampler(60)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    s = DistributedSampler(60)
    assert (s.num_replicas, s.rank) == (1, 0)


# -- state_dict / load_state_dict ---------------------------------------------------


def run_ranks(samplers, per_rank_count):
    """Every rank takes `per_rank_count` samples (lock-step), returns them and rank 0's state."""
    iters = [iter(s) for s in samplers]
    taken = [list(itertools.islice(it, per_rank_count)) for it in iters]
    return taken, samplers[0].state_dict()


@pytest.mark.parametrize("w_before, w_after", [(4, 2), (4, 3), (4, 1), (2, 4), (3, 5), (4, 4)])
@pytest.mark.parametrize("taken_each", [0, 1, 6])
def test_resume_at_another_world_size_continues_the_global_order(w_before, w_after, taken_each):
    n, kw = 103, {"seed": 4, "block_size": 16, "pad": False}
    full = list(DistributedSampler(n, 1, 0, **kw))
    before = ranks(n, w_before, **kw)
    taken, state = run_ranks(before, taken_each)
    position = state["global_position"]
    assert position == taken_each * w_before
    assert interleave(taken) == full[:position]
    json.loads(json.dumps(state))  # plain data
    assert cbor2.loads(cbor2.dumps(state)) == state
    after = ranks(n, w_after, **kw)
    rests = []
    for s in after:
        s.load_state_dict(state)
        s.set_epoch(state["epoch"])  # the usual loop keeps the restored position
        rests.append(list(s))
    merged = [None] * (n - position)
    for r, values in enumerate(rests):
        first = (r - position) % w_after
        merged[first :: w_after] = values
    assert merged == full[position:]


def test_resume_then_state_again_and_next_epoch():
    kw = {"seed": 4, "block_size": 16}
    a = DistributedSampler(50, 2, 0, **kw)
    a.set_epoch(3)
    it = iter(a)
    head = [next(it) for _ in range(5)]
    state = a.state_dict()
    assert state["epoch"] == 3 and state["global_position"] == 10 and state["yielded"] == 5
    b = DistributedSampler(50, 2, 0, **kw)
    b.load_state_dict(state)
    assert b.state_dict()["global_position"] == 10  # before iterating, the restored position
    rest = list(b)
    c = DistributedSampler(50, 2, 0, **kw)
    c.set_epoch(3)
    assert head + rest == list(c)
    assert b.state_dict()["global_position"] == 50  # the epoch is done
    b.set_epoch(4)  # another epoch: starts at its beginning
    c.set_epoch(4)
    assert list(b) == list(c)


def test_set_epoch_to_another_epoch_drops_a_restored_position():
    a = DistributedSampler(40, 1, 0, seed=1)
    a.set_epoch(2)
    it = iter(a)
    [next(it) for _ in range(7)]
    b = DistributedSampler(40, 1, 0, seed=1)
    b.load_state_dict(a.state_dict())
    b.set_epoch(5)
    fresh = DistributedSampler(40, 1, 0, seed=1)
    fresh.set_epoch(5)
    assert list(b) == list(fresh)


def test_samples_consumed_overrides_what_was_yielded():
    a = DistributedSampler(40, 4, 1, seed=1)
    it = iter(a)
    [next(it) for _ in range(6)]  # a loader's prefetch ran ahead
    assert a.state_dict()["global_position"] == 24
    assert a.state_dict(samples_consumed=2)["global_position"] == 8


@pytest.mark.parametrize(
    "change, code",
    [
        ({"seed": 5}, "SAMPLER_STATE_INVALID"),
        ({"shuffle": False}, "SAMPLER_STATE_INVALID"),
        ({"block_size": 8}, "SAMPLER_STATE_INVALID"),
        ({"sampling_mode": "block_affine"}, "SAMPLER_STATE_INVALID"),
        ({"dataset_length": 41}, "CARDINALITY_MISMATCH"),
        ({"format": "other"}, "SAMPLER_STATE_INVALID"),
        ({"global_position": -1}, "SAMPLER_STATE_INVALID"),
    ],
)
def test_load_state_dict_refuses_another_order(change, code):
    state = DistributedSampler(40, 2, 0, seed=1, block_size=16).state_dict()
    state.update(change)
    with pytest.raises(SamplerArgumentError) as exc:
        DistributedSampler(40, 2, 0, seed=1, block_size=16).load_state_dict(state)
    assert exc.value.code == code


# -- PyTorch ------------------------------------------------------------------------


def test_import_umlos_cuda_does_not_import_torch():
    code = "import sys, umlos_cuda; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_samplers_work_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from umlos_cuda.torch import DistributedSampler, NextBatchSampler, DistributedEvalSampler\n"
        "s = DistributedSampler(10, num_replicas=2, rank=1, seed=3)\n"
        "assert sorted(list(s) + list(DistributedSampler(10, 2, 0, seed=3))) == list(range(10))\n"
        "assert len(list(DistributedEvalSampler(10, 2, num_replicas=2, rank=0))) == 3\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_is_a_torch_sampler_and_drives_a_dataloader():
    torch = pytest.importorskip("torch", reason="torch is not installed (the optional 'torch' extra)")
    from torch.utils.data import DataLoader, Sampler, TensorDataset

    data = TensorDataset(torch.arange(23) * 10)
    s = DistributedSampler(data, num_replicas=3, rank=2, seed=8, block_size=4)
    assert isinstance(s, Sampler)
    loader = DataLoader(data, batch_size=4, sampler=s)
    s.set_epoch(1)
    read = torch.cat([b[0] for b in loader]).tolist()
    assert read == [10 * i for i in s.get_indices().tolist()]
    assert len(loader) == s.get_num_batches(4)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n, w", [(10, 4), (12, 4), (7, 3), (3, 5)])
def test_unshuffled_matches_pytorch_exactly(n, w, drop_last):
    """shuffle=False leaves only the partition: with the defaults it is PyTorch's, index for index."""
    pytest.importorskip("torch", reason="torch is not installed (the optional 'torch' extra)")
    from torch.utils.data.distributed import DistributedSampler as TorchSampler

    for r in range(w):
        theirs = TorchSampler(list(range(n)), num_replicas=w, rank=r, shuffle=False, drop_last=drop_last)
        ours = DistributedSampler(list(range(n)), num_replicas=w, rank=r, shuffle=False, drop_last=drop_last)
        assert list(ours) == list(theirs) and len(ours) == len(theirs)


def test_same_positional_arguments_as_pytorch():
    pytest.importorskip("torch", reason="torch is not installed (the optional 'torch' extra)")
    import inspect

    from torch.utils.data.distributed import DistributedSampler as TorchSampler

    theirs = list(inspect.signature(TorchSampler.__init__).parameters.items())
    ours = list(inspect.signature(DistributedSampler.__init__).parameters.items())
    assert [(k, p.default) for k, p in ours[: len(theirs)]] == [(k, p.default) for k, p in theirs]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_resumes_mid_epoch(num_workers):
    torch = pytest.importorskip("torch", reason="torch is not installed (the optional 'torch' extra)")
    tdl = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed")
    from torch.utils.data import TensorDataset

    data = TensorDataset(torch.arange(61))

    def loader():
        s = DistributedSampler(data, num_replicas=2, rank=1, seed=6, block_size=8)
        return s, tdl.StatefulDataLoader(data, batch_size=4, sampler=s, num_workers=num_workers)

    s, full_loader = loader()
    s.set_epoch(2)
    uninterrupted = [b[0].tolist() for b in full_loader]
    s, first = loader()
    s.set_epoch(2)
    it = iter(first)
    head = [next(it)[0].tolist() for _ in range(3)]
    state = first.state_dict()
    del it
    assert "umlos_cuda.torch.DistributedSampler/1" in repr(state)  # restored by our state, not fast-forward
    s2, second = loader()
    second.load_state_dict(state)
    s2.set_epoch(2)
    rest = [b[0].tolist() for b in second]
    assert head + rest == uninterrupted
