"""umlos_cuda.torch.DistributedSampler's order is feistel's by default, and any
registered mode by ``sampling_mode=``: known answers from an independent path
(the epoch seed of oracle.py and the Feistel bijection that
spec_examples_feistel.py writes from docs/spec/feistel.md alone, neither using
the package), the earlier order kept bit for bit under ``block_affine``, and
states that name the order they were written with."""

from __future__ import annotations

from itertools import chain

import numpy as np
import pytest

import oracle
from spec_examples_feistel import spec_feistel, spec_key_words
from umlos_cuda import errors
from umlos_cuda.modes import mode_names
from umlos_cuda.torch import DistributedSampler, SamplerArgumentError, sampler_manifest
from umlos_cuda.torch._order import DATASET_ID, NEGATIVE_SEED_DATASET_ID

#: docs/spec/feistel.md: the round keys of mode feistel are draws 0 and 1 of R4 domain 3.
FEISTEL_DOMAIN = 3


def independent_raw(n: int, s: int, block_size: int = 1 << 20, mode: str | None = "feistel") -> dict:
    """docs/integrations.md's manifest for ``seed + epoch = s``, written out by hand."""
    data = {"sampler_block_size": block_size, "drop_last": False}
    if mode is not None:
        data["sampling_mode"] = mode
    negative = s < 0
    return {"seed": s + 2**64 if negative else s, "global_batch_size": 1, "data": data,
            "datasets": {"dataset": {"id": NEGATIVE_SEED_DATASET_ID if negative else DATASET_ID, "version": 1,
                                     "hash": "", "cardinality": n}}}


def independent_feistel_order(n: int, s: int) -> list[int]:
    raw = independent_raw(n, s)
    seed16 = oracle.epoch_seed(oracle.replay_token(raw), oracle.manifest_hash(raw), "dataset", 0)
    words = spec_key_words(seed16, FEISTEL_DOMAIN, 0)
    return [spec_feistel(p, n, words) for p in range(n)]


@pytest.mark.parametrize("n,seed,epoch", [(1, 0, 0), (2, 3, 1), (10, 5, 2), (33, 0, 7), (1000, 0, 0), (257, -12, 4),
                                          (4097, 2**64 - 2, 1)])
def test_the_default_order_is_feistel_by_the_independent_path(n, seed, epoch):
    s = DistributedSampler(n, num_replicas=1, rank=0, seed=seed)
    s.set_epoch(epoch)
    assert s.sampling_mode == "feistel"
    assert list(s) == independent_feistel_order(n, seed + epoch)


def test_a_new_users_first_indices_are_not_one_affine_stride():
    """DistributedSampler(range(1000), shuffle=True) used to yield 632, 639, 646, ... (one affine map)."""
    head = list(DistributedSampler(range(1000), num_replicas=1, rank=0, shuffle=True))[:10]
    assert head == [123, 158, 718, 774, 895, 200, 545, 651, 953, 861]
    assert len(set(np.diff(head).tolist())) > 1
    old = list(DistributedSampler(range(1000), num_replicas=1, rank=0, sampling_mode="block_affine"))[:10]
    assert old == [632, 639, 646, 653, 660, 667, 674, 681, 688, 695]


@pytest.mark.parametrize("n,seed,block_size", [(100, 5, 16), (1000, 0, 1 << 20), (257, -3, 64)])
def test_block_affine_is_the_earlier_order_bit_for_bit(n, seed, block_size):
    """The manifest naming block_affine hashes as one naming no mode (the earlier manifest),
    so the order is the independent oracle's block-affine order of that manifest."""
    manifest = sampler_manifest(n, seed, block_size, "block_affine")
    assert manifest.hash == oracle.manifest_hash(independent_raw(n, seed, block_size, mode=None))
    sampler = DistributedSampler(n, 1, 0, seed=seed, block_size=block_size, sampling_mode="block_affine")
    raw = independent_raw(n, seed, block_size, mode=None)
    seed16 = oracle.epoch_seed(oracle.replay_token(raw), oracle.manifest_hash(raw), "dataset", 0)
    assert list(sampler) == oracle.EpochOracle(seed16, n, block_size).window(0, n)


@pytest.mark.parametrize("mode", mode_names())
def test_every_registered_mode_is_selectable_and_partitions(mode):
    n, w = 103, 4
    samplers = [DistributedSampler(n, w, r, seed=9, block_size=16, pad=False, sampling_mode=mode) for r in range(w)]
    taken = sorted(chain.from_iterable(list(s) for s in samplers))
    assert taken == list(range(n))
    full = list(DistributedSampler(n, 1, 0, seed=9, block_size=16, sampling_mode=mode))
    assert [list(s) for s in samplers] == [full[r::w] for r in range(w)]


@pytest.mark.parametrize("mode", ["shuffle", "FEISTEL", "", None, 3])
def test_an_unknown_mode_is_refused_naming_the_modes(mode):
    with pytest.raises(SamplerArgumentError) as info:
        DistributedSampler(10, 1, 0, sampling_mode=mode)
    assert info.value.code == errors.INVALID_MANIFEST
    assert all(name in info.value.message for name in mode_names())
    assert isinstance(info.value, ValueError)


def test_states_name_their_order():
    sampler = DistributedSampler(40, 2, 0, seed=1)
    state = sampler.state_dict()
    assert state["sampling_mode"] == "feistel"
    DistributedSampler(40, 4, 1, seed=1).load_state_dict(state)
    with pytest.raises(SamplerArgumentError) as info:
        DistributedSampler(40, 2, 0, seed=1, sampling_mode="block_affine").load_state_dict(state)
    assert info.value.code == errors.SAMPLER_STATE_INVALID and "sampling_mode='feistel'" in info.value.message


def test_a_state_from_before_sampling_modes_is_block_affines():
    state = DistributedSampler(40, 2, 0, seed=1, sampling_mode="block_affine").state_dict()
    del state["sampling_mode"]  # what earlier releases wrote
    resumed = DistributedSampler(40, 2, 1, seed=1, sampling_mode="block_affine")
    resumed.load_state_dict(state)
    with pytest.raises(SamplerArgumentError) as info:
        DistributedSampler(40, 2, 0, seed=1).load_state_dict(state)
    assert info.value.code == errors.SAMPLER_STATE_INVALID and "block_affine" in info.value.message


def test_resume_at_another_world_size_under_feistel():
    n = 1001
    first = [DistributedSampler(n, 4, r, seed=2, pad=False) for r in range(4)]
    iterators = [iter(s) for s in first]
    for it in iterators:
        for _ in range(30):
            next(it)
    state = first[0].state_dict()
    assert state["global_position"] == 120
    rest = []
    for r in range(3):
        s = DistributedSampler(n, 3, r, seed=2, pad=False)
        s.load_state_dict(state)
        rest.append(list(s))
    order = independent_feistel_order(n, 2)
    assert sorted(chain.from_iterable(rest)) == sorted(order[120:])
    assert rest[0] == order[120::3]
