"""Drop-in compatibility with ``torch.utils.data.DistributedSampler``.

What code written for PyTorch's sampler relies on, checked on ours: an
iterator is a snapshot of the sampler when ``iter()`` was called (for all three
samplers), the default pads every rank to ``ceil(N / W)`` samples (so DDP
ranks take equal steps), the exception types and messages callers match on,
every seed PyTorch accepts (negative ones too, mapped injectively), and the
documented fallback to world size 1 without a process group. Where torch is
installed, lengths and the unshuffled partition are compared with PyTorch's
sampler itself. The multi-process side (torchrun at W = 2, 3, 4 and 8 with the
default arguments) is tests/test_torch_ddp_defaults.py.
"""

from __future__ import annotations

import itertools
import pickle
from itertools import chain

import numpy as np
import pytest

import umlos_cuda as uc
from umlos_cuda.torch import (
    DistributedEvalSampler,
    DistributedSampler,
    NextBatchSampler,
    SamplerArgumentError,
    SamplerTypeError,
    sampler_manifest,
)
from umlos_cuda.torch._order import DATASET_ID, NEGATIVE_SEED_DATASET_ID


def ranks(n, w, **kw):
    return [DistributedSampler(n, num_replicas=w, rank=r, **kw) for r in range(w)]


def torch_sampler():
    pytest.importorskip("torch", reason="torch is not installed (the optional 'torch' extra)")
    from torch.utils.data.distributed import DistributedSampler as TorchSampler

    return TorchSampler


# -- an iterator is a snapshot ------------------------------------------------------


def test_set_epoch_after_iter_does_not_change_the_iterator():
    s = DistributedSampler(500, num_replicas=2, rank=1, seed=3, block_size=16)
    epoch0 = list(s)
    it = iter(s)
    s.set_epoch(1)
    assert list(it) == epoch0
    assert list(s) != epoch0  # the next iteration is epoch 1's


def test_set_epoch_in_the_middle_of_an_iteration_finishes_the_old_epoch():
    s = DistributedSampler(500, num_replicas=2, rank=0, seed=3, block_size=16)
    epoch0 = list(s)
    it = iter(s)
    head = list(itertools.islice(it, 7))
    s.set_epoch(1)
    assert head + list(it) == epoch0


def test_large_dataset_partition_survives_set_epoch_mid_iteration():
    """N = 2^21 + 123 spans three windows per rank at W = 3: an iterator that
    re-read the epoch per window mixed epochs (about 1.57M unique of 2.1M)."""
    n, w = 2**21 + 123, 3
    samplers = ranks(n, w, seed=0, block_size=1024)
    per_rank = []
    for s in samplers:
        it = iter(s)
        head = list(itertools.islice(it, 10))
        s.set_epoch(1)
        per_rank.append(np.fromiter(itertools.chain(head, it), dtype=np.int64))
    assert [len(x) for x in per_rank] == [-(-n // w)] * w
    everything = np.concatenate(per_rank)
    assert np.array_equal(np.unique(everything), np.arange(n))  # every index, none lost
    assert len(everything) - n == (-n) % w  # the only repeats are the padding
    fresh = [np.asarray(list(s)) for s in ranks(n, w, seed=0, block_size=1024)]  # epoch 0 from scratch
    assert all(np.array_equal(a, b) for a, b in zip(per_rank, fresh))


def test_two_iterators_are_independent():
    s = DistributedSampler(300, num_replicas=3, rank=2, seed=1, block_size=8)
    a, b = iter(s), iter(s)
    first = [next(a) for _ in range(5)]
    assert list(b) == first + list(a)


def test_state_follows_the_current_epoch_not_a_detached_iterator():
    s = DistributedSampler(100, num_replicas=2, rank=0, seed=1, block_size=8)
    it = iter(s)
    [next(it) for _ in range(6)]
    assert s.state_dict()["global_position"] == 12
    s.set_epoch(1)
    [next(it) for _ in range(4)]  # the epoch-0 iterator goes on
    state = s.state_dict()
    assert (state["epoch"], state["global_position"], state["yielded"]) == (1, 0, 0)


def nb_manifest(n=50, g=12):
    return {"seed": 11, "global_batch_size": g, "data": {"sampler_block_size": 8},
            "datasets": {"train": {"id": "toy", "version": 1, "hash": "", "cardinality": n}}}


def test_nextbatch_iterator_keeps_its_epoch_and_leaves_the_new_cursor_alone():
    def epoch_batches(epoch):
        s = NextBatchSampler(nb_manifest(), "train", rank=1, world_size=2)
        s.set_epoch(epoch)
        return list(s)

    s = NextBatchSampler(nb_manifest(), "train", rank=1, world_size=2)
    it = iter(s)
    head = next(it)
    s.set_epoch(1)
    assert [head] + list(it) == epoch_batches(0)
    assert s.cursor == uc.Cursor(1, 0)  # the detached iterator did not move it
    assert list(s) == epoch_batches(1)


def test_nextbatch_load_state_dict_detaches_a_running_iterator():
    s = NextBatchSampler(nb_manifest(), "train", rank=0, world_size=2)
    saved = s.state_dict()
    it = iter(s)
    next(it)
    s.load_state_dict(saved)
    rest = list(it)
    assert len(rest) == len(s) - 1
    assert s.cursor == uc.Cursor(0, 0)


def test_eval_iterators_are_whole_evaluations():
    ev = DistributedEvalSampler(50, 4, num_replicas=3, rank=1)
    whole = list(ev)
    a = iter(ev)
    head = next(a)
    assert list(ev) == whole  # another pass after a partial one starts from the beginning
    b = iter(ev)
    assert [next(b), next(a)] == whole[:2]  # interleaved iterators do not share a cursor
    assert [head] + [whole[1]] + list(a) == whole and [whole[0]] + list(b) == whole


# -- the default pads, as PyTorch does --------------------------------------------------


@pytest.mark.parametrize("w", range(1, 9))
@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 100, 103, 110])
def test_default_gives_every_rank_ceil_n_over_w(n, w):
    samplers = ranks(n, w, seed=2, block_size=8)
    per_rank = [list(s) for s in samplers]
    size = -(-n // w)
    assert [len(s) for s in samplers] == [len(x) for x in per_rank] == [size] * w
    assert all(s.num_samples == size and s.total_size == size * w for s in samplers)
    flat = list(chain.from_iterable(per_rank))
    assert set(flat) == set(range(n))  # nothing skipped
    assert len(flat) - n == size * w - n  # repeated: only the padding


@pytest.mark.parametrize("batch_size", [1, 4, 8])
@pytest.mark.parametrize("n, w", [(33, 4), (17, 8), (10, 3), (2**10 + 1, 2)])
def test_default_gives_every_rank_the_same_number_of_batches(n, w, batch_size):
    assert len({s.get_num_batches(batch_size) for s in ranks(n, w)}) == 1


def test_pad_false_is_exactly_once_with_uneven_steps():
    """The explicit option: each sample on one rank; here rank 0 takes a step more."""
    n, w, batch = 33, 4, 4  # 33 // 4 = 8 = 2 batches of 4, and rank 0 has a 9th sample
    samplers = ranks(n, w, pad=False)
    assert sorted(chain.from_iterable(list(s) for s in samplers)) == list(range(n))
    assert [s.get_num_batches(batch) for s in samplers] == [3, 2, 2, 2]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("w", range(1, 9))
@pytest.mark.parametrize("n", [1, 3, 8, 13, 105])
def test_defaults_match_pytorch_lengths_and_unshuffled_indices(n, w, drop_last):
    TorchSampler = torch_sampler()
    data = list(range(n))
    for r in range(w):
        theirs = TorchSampler(data, num_replicas=w, rank=r, drop_last=drop_last)
        ours = DistributedSampler(data, num_replicas=w, rank=r, drop_last=drop_last)
        assert (len(ours), ours.num_samples, ours.total_size) == (len(theirs), theirs.num_samples, theirs.total_size)
        theirs = TorchSampler(data, num_replicas=w, rank=r, shuffle=False, drop_last=drop_last)
        ours = DistributedSampler(data, num_replicas=w, rank=r, shuffle=False, drop_last=drop_last)
        assert list(ours) == list(theirs)


def test_padded_state_resumes_at_another_world_size():
    n, kw = 103, {"seed": 4, "block_size": 16}
    full = list(DistributedSampler(n, 1, 0, **kw))
    before = ranks(n, 4, **kw)
    iters = [iter(s) for s in before]
    head = [list(itertools.islice(it, 6)) for it in iters]
    state = before[0].state_dict()
    assert state["global_position"] == 24
    after = ranks(n, 3, **kw)
    for s in after:
        s.load_state_dict(state)
        s.set_epoch(0)
    rest = [list(s) for s in after]
    seen = list(chain.from_iterable(head)) + list(chain.from_iterable(rest))
    assert set(seen) == set(range(n))
    assert [len(x) for x in rest] == [len(range(24 + r, 105, 3)) for r in range(3)]  # up to ceil(103 / 3) * 3
    assert rest[0][:3] == full[24:33:3]


# -- errors callers match on -----------------------------------------------------------


@pytest.mark.parametrize("rank", [3, -1])
def test_invalid_rank_is_a_value_error_in_pytorch_words(rank):
    with pytest.raises(ValueError, match="Invalid rank") as exc:
        DistributedSampler(10, num_replicas=3, rank=rank)
    assert str(exc.value) == f"INVALID_RANK: Invalid rank {rank}, rank should be in the interval [0, 2]"
    assert exc.value.code == "INVALID_RANK"
    TorchSampler = torch_sampler()
    with pytest.raises(ValueError) as theirs:
        TorchSampler(list(range(10)), num_replicas=3, rank=rank)
    assert str(theirs.value) in str(exc.value)  # PyTorch's message, word for word


def test_invalid_num_replicas_is_a_value_error_in_the_same_words():
    with pytest.raises(ValueError,
                       match=r"Invalid num_replicas 0, num_replicas should be in the interval \[1, 4294967295\]"):
        DistributedSampler(10, num_replicas=0, rank=0)


@pytest.mark.parametrize("dataset", [iter(range(3)), (i for i in range(3)), 2.5, None])
def test_dataset_without_len_is_a_type_error(dataset):
    with pytest.raises(TypeError, match=r"has no len\(\)") as exc:
        DistributedSampler(dataset, num_replicas=2, rank=0)
    assert isinstance(exc.value, SamplerTypeError) and exc.value.code == "CARDINALITY_MISMATCH"
    TorchSampler = torch_sampler()
    with pytest.raises(TypeError, match=r"has no len\(\)"):
        TorchSampler(dataset, num_replicas=2, rank=0)


# -- seeds -----------------------------------------------------------------------------


def test_non_negative_seeds_keep_their_order():
    """Known answers (docs/integrations.md, "The order"): seed 5, epoch 2, N = 10.
    The default order is feistel's, computed by tests/test_torch_sampler_modes.py's
    independent path (oracle.py's epoch seed, spec_examples_feistel.py's bijection);
    block_affine's is the order of releases before sampling_mode, unchanged."""
    s = DistributedSampler(10, num_replicas=1, rank=0, seed=5)
    s.set_epoch(2)
    assert list(s) == [5, 9, 6, 3, 1, 4, 7, 0, 8, 2]
    s = DistributedSampler(10, num_replicas=1, rank=0, seed=5, sampling_mode="block_affine")
    s.set_epoch(2)
    assert list(s) == [8, 1, 4, 7, 0, 3, 6, 9, 2, 5]
    assert sampler_manifest(10, 7).datasets["dataset"].id == DATASET_ID


@pytest.mark.parametrize("seed", [-1, -2, -12345, -(2**63)])
def test_negative_seeds_give_permutations(seed):
    s = DistributedSampler(257, num_replicas=1, rank=0, seed=seed, block_size=16)
    assert sorted(s) == list(range(257))
    m = sampler_manifest(257, seed, 16)
    assert (m.seed, m.datasets["dataset"].id) == (seed + 2**64, NEGATIVE_SEED_DATASET_ID)


def test_seed_map_is_injective_where_pytorch_collides():
    """PyTorch gives -1 and 2^64 - 1 the same order (two's complement); here every
    seed in [-2^63, 2^64 - 1] has its own manifest, so its own order."""
    seeds = [-(2**63), -(2**63) + 1, -2, -1, 0, 1, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1]
    hashes = {sampler_manifest(100, s, 16).hash for s in seeds}
    assert len(hashes) == len(seeds)
    orders = {tuple(DistributedSampler(100, 1, 0, seed=s, block_size=16)) for s in (-1, 2**64 - 1, -2, 2**64 - 2)}
    assert len(orders) == 4


def test_seed_plus_epoch_crosses_zero():
    a = DistributedSampler(60, 1, 0, seed=-3, block_size=8)
    b = DistributedSampler(60, 1, 0, seed=2, block_size=8)
    a.set_epoch(5)
    assert list(a) == list(b)  # -3 + 5 == 2 + 0
    c = DistributedSampler(60, 1, 0, seed=-1, block_size=8)
    a.set_epoch(2)
    assert list(a) == list(c)


def test_seed_range_is_pytorchs():
    DistributedSampler(10, 1, 0, seed=-(2**63))
    s = DistributedSampler(10, 1, 0, seed=2**64 - 1)
    with pytest.raises(SamplerArgumentError, match=r"seed \+ epoch must be in \[-2\^63, 2\^64 - 1\]") as exc:
        s.set_epoch(1)
    assert exc.value.code == "INVALID_ARGUMENT"
    for seed in (-(2**63) - 1, 2**64):
        with pytest.raises(ValueError, match=r"outside \[-2\^63, 2\^64 - 1\]"):
            DistributedSampler(10, 1, 0, seed=seed)
    for seed in (2**100, -(2**100)):  # unshuffled, PyTorch never uses the seed: any int
        s = DistributedSampler(10, 2, 1, shuffle=False, seed=seed)
        s.set_epoch(3)
        assert list(s) == [1, 3, 5, 7, 9]


def test_negative_seed_state_round_trips():
    a = DistributedSampler(40, 2, 0, seed=-7, block_size=8)
    it = iter(a)
    head = [next(it) for _ in range(5)]
    b = DistributedSampler(40, 2, 0, seed=-7, block_size=8)
    b.load_state_dict(pickle.loads(pickle.dumps(a.state_dict())))
    assert head + list(b) == list(DistributedSampler(40, 2, 0, seed=-7, block_size=8))


# -- no process group ---------------------------------------------------------------------


def test_without_arguments_or_process_group_it_is_rank_0_of_1(monkeypatch):
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    s = DistributedSampler(list(range(9)))
    assert (s.num_replicas, s.rank, len(s)) == (1, 0, 9)
    assert sorted(s) == list(range(9))
    TorchSampler = torch_sampler()
    with pytest.raises((ValueError, RuntimeError)):  # PyTorch needs a process group here
        TorchSampler(list(range(9)))


# -- pickling and DataLoader workers ------------------------------------------------------


def test_pickles_mid_iteration():
    s = DistributedSampler(90, 3, 1, seed=4, block_size=8)
    it = iter(s)
    [next(it) for _ in range(4)]
    copy = pickle.loads(pickle.dumps(s))
    assert copy.state_dict() == s.state_dict()
    assert list(copy) == list(DistributedSampler(90, 3, 1, seed=4, block_size=8))


def test_persistent_workers_follow_set_epoch():
    torch = pytest.importorskip("torch", reason="torch is not installed (the optional 'torch' extra)")
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.arange(37))
    s = DistributedSampler(data, num_replicas=2, rank=0, seed=9, block_size=4)
    loader = DataLoader(data, batch_size=5, sampler=s, num_workers=2, persistent_workers=True)
    for epoch in range(3):
        s.set_epoch(epoch)
        read = torch.cat([b[0] for b in loader]).tolist()
        assert read == s.get_indices().tolist() and len(read) == 19
