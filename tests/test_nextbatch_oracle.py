"""NextBatch_v2 against the independent oracle on many small configurations:
every stage, rank, world size and cursor position, plus the R5 permutation and
R6 parameters in isolation."""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given, settings, strategies as st

import oracle
import umlos_cuda as uc
from nbcases import WORLD_SIZES, indices_list, raw_manifest
from umlos_cuda import reference
from umlos_cuda.epoch import philox_key_words

SEEDS = st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 2**64 - 1]))


@st.composite
def configurations(draw):
    """A small valid manifest and a valid call on it."""
    n = draw(st.one_of(st.integers(1, 300), st.integers(301, 5000),
                       st.sampled_from([1, 2, 255, 256, 257, 4095, 4096, 4097])))
    block_size = draw(st.one_of(st.integers(1, 40), st.integers(1, n + 5),
                                st.sampled_from([1, 2, 3, 64, 100, 1 << 20])))
    world_size = draw(st.sampled_from(WORLD_SIZES))
    g = world_size * draw(st.integers(1, 12))
    stage = draw(st.sampled_from(["train", "eval", "infer"]))
    drop_last = draw(st.booleans())
    assume(not (stage == "train" and drop_last and g > n))
    raw = raw_manifest(n, block_size, g, draw(SEEDS), drop_last)
    limit = (n // g) * g if (stage == "train" and drop_last) else n
    global_index = draw(st.one_of(st.integers(0, limit - 1), st.sampled_from([0, limit - 1]),
                                  st.just(max(0, limit - g))))
    rank = draw(st.integers(0, world_size - 1))
    epoch = draw(st.one_of(st.integers(0, 3), st.integers(0, 2**64 - 2)))
    return raw, world_size, rank, stage, epoch, global_index


def assert_batch_equal(batch, expected):
    assert indices_list(batch) == expected.indices
    assert (batch.cursor.epoch, batch.cursor.global_index) == expected.cursor
    assert batch.metadata["sampling_mode"] == expected.sampling_mode
    assert batch.metadata["sampler_config_hash"] == expected.sampler_config_hash
    assert batch.metadata["data_replay_t"] == expected.data_replay_t


@settings(max_examples=250)
@given(configurations())
def test_next_batch_matches_oracle(backend, config):
    raw, world_size, rank, stage, epoch, global_index = config
    batch = uc.next_batch(uc.Manifest.from_dict(raw), "train", world_size, rank, stage,
                          uc.Cursor(epoch, global_index), backend=backend)
    expected = oracle.Oracle(raw).next_batch("train", world_size, rank, stage, epoch, global_index)
    assert_batch_equal(batch, expected)


@settings(max_examples=60)
@given(configurations())
def test_next_batch_accepts_a_plain_dict_and_a_mapping_cursor(config):
    raw, world_size, rank, stage, epoch, global_index = config
    batch = uc.next_batch(raw, "train", world_size, rank, stage, {"epoch": epoch, "global_index": global_index},
                          backend="numpy")
    expected = oracle.Oracle(raw).next_batch("train", world_size, rank, stage, epoch, global_index)
    assert_batch_equal(batch, expected)


@settings(max_examples=150)
@given(
    n=st.integers(1, 3000), block_size=st.integers(1, 3100), seed=SEEDS, epoch=st.integers(0, 5),
    data=st.data(),
)
def test_epoch_indices_windows_match_oracle(backend, n, block_size, seed, epoch, data):
    raw = raw_manifest(n, block_size, 1, seed)
    start = data.draw(st.integers(0, n), label="start")
    count = data.draw(st.integers(0, n - start), label="count")
    got = uc.epoch_indices(uc.Manifest.from_dict(raw), "train", epoch=epoch, start=start, count=count, backend=backend)
    assert indices_list(got) == oracle.Oracle(raw).epoch("train", epoch).window(start, count)


@settings(max_examples=80)
@given(num_blocks=st.one_of(st.integers(0, 70), st.integers(71, 3000)), seed16=st.binary(min_size=16, max_size=16))
def test_r5_block_permute_matches_oracle(num_blocks, seed16):
    key, w2, w3 = philox_key_words(seed16)
    order = reference.seeded_block_permute(num_blocks, key, w2, w3)
    assert order.dtype == np.uint64
    assert [int(x) for x in order.tolist()] == oracle.seeded_block_permute(seed16, num_blocks)


def test_r5_degenerate_block_counts():
    key, w2, w3 = philox_key_words(b"\x07" * 16)
    assert reference.seeded_block_permute(0, key, w2, w3).tolist() == []
    assert reference.seeded_block_permute(1, key, w2, w3).tolist() == [0]
    assert oracle.seeded_block_permute(b"\x07" * 16, 0) == []
    assert oracle.seeded_block_permute(b"\x07" * 16, 1) == [0]


@settings(max_examples=100)
@given(
    seed16=st.binary(min_size=16, max_size=16),
    block_size=st.one_of(st.integers(1, 5000), st.integers(1, 2**64 - 1), st.sampled_from([2**32, 2**32 + 1, 2**63])),
    data=st.data(),
)
def test_r6_affine_parameters_match_oracle(seed16, block_size, data):
    n = data.draw(st.integers(1, 2**64 - 1), label="n")
    num_blocks = n // block_size + (1 if n % block_size else 0)
    pbs = data.draw(st.lists(st.integers(0, num_blocks - 1), min_size=1, max_size=8), label="pbs")
    key, w2, w3 = philox_key_words(seed16)
    base, m, a, c = reference.block_affine_params(np.array(pbs, dtype=np.uint64), n, block_size, key, w2, w3)
    for i, pb in enumerate(pbs):
        start, m_o, a_o, c_o = oracle.affine_parameters(seed16, pb, block_size, n)
        assert (int(base[i]), int(m[i])) == (start, m_o)
        if m_o > 1:
            assert (int(a[i]), int(c[i])) == (a_o, c_o)


def test_r6_coprime_scan_moves_forward_from_the_start_candidate():
    """The scan starts at ``1 + k0 mod (m-1)`` and takes the first coprime at or
    after it. For m = 12 (coprimes 1, 5, 7, 11) a start of 8, 9 or 10 must land
    on 11, not on the nearest or smallest coprime. (Since m - 1 is always
    coprime with m, the scan never needs to wrap back to 1.) Seeds are searched
    until five such starts are found."""
    found = 0
    m = 12
    for s in range(4000):
        seed16 = s.to_bytes(16, "little")
        k0, _ = oracle.draw(seed16, 0, oracle.DOMAIN_INTRA)
        if 1 + k0 % (m - 1) not in (8, 9, 10):
            continue
        key, w2, w3 = philox_key_words(seed16)
        _, _, a, _ = reference.block_affine_params(np.array([0], dtype=np.uint64), m, m, key, w2, w3)
        assert int(a[0]) == oracle.affine_parameters(seed16, 0, m, m)[2] == 11
        found += 1
        if found >= 5:
            break
    assert found >= 5
