"""Strided windows: ``epoch_indices(..., stride=W)`` and ``epoch_window(..., stride=W)``.

Positions ``start + i * stride`` (``i < count``) of an epoch's train sequence,
computed without the positions in between: rank ``r`` of ``W`` reads
``r, r + W, ...`` of a rank-strided order (``DistributedSampler``'s layout) at
the cost of its own share. A strided window is exactly the contiguous window
with every ``stride``-th element, on every backend and for every output dtype;
its failures are those of a contiguous window, with ``data_replay_t``.
"""

from __future__ import annotations

import numpy as np
import oracle
import pytest
from hypothesis import given, settings, strategies as st

import umlos_cuda as uc
from nbcases import raw_manifest
from umlos_cuda import errors
from umlos_cuda.backends import to_numpy

U64 = (1 << 64) - 1


@settings(max_examples=150)
@given(
    n=st.one_of(st.integers(1, 400), st.sampled_from([255, 256, 257, 4095, 4096, 4097])),
    block_size=st.one_of(st.integers(1, 40), st.sampled_from([64, 1 << 20])),
    g=st.integers(1, 50),
    drop_last=st.booleans(),
    epoch=st.integers(0, 3),
    stride=st.one_of(st.integers(1, 9), st.integers(10, 5000)),
    data=st.data(),
)
def test_strided_window_is_every_stride_th_position(backend, n, block_size, g, drop_last, epoch, stride, data):
    raw = raw_manifest(n, block_size, min(g, n), seed=data.draw(st.integers(0, U64)), drop_last=drop_last)
    whole = [int(v) for v in to_numpy(uc.epoch_indices(raw, "train", epoch, backend="numpy"))]
    limit = len(whole)
    start = data.draw(st.integers(0, limit))
    room = -(-(limit - start) // stride)  # positions of this stride left in the epoch
    count = data.draw(st.integers(0, room))
    got = uc.epoch_indices(raw, "train", epoch, start, count, stride=stride, backend=backend)
    assert to_numpy(got).dtype == np.uint64
    assert [int(v) for v in to_numpy(got)] == whole[start : start + count * stride : stride]
    rest = uc.epoch_indices(raw, "train", epoch, start, stride=stride, backend=backend)  # count=None: to the end
    assert [int(v) for v in to_numpy(rest)] == whole[start::stride]
    assert uc.nextbatch.epoch_window(raw, "train", start, epoch=epoch, stride=stride) == (start, room)


@pytest.mark.parametrize("world_size", [1, 2, 3, 8, 13])
def test_rank_strided_shares_partition_the_epoch_as_the_oracle_orders_it(backend, world_size):
    raw = raw_manifest(1000, 64, 8, seed=11)
    order = oracle.Oracle(raw).epoch("train", 5).window(0, 1000)
    shares = [to_numpy(uc.epoch_indices(raw, "train", 5, rank, stride=world_size, backend=backend))
              for rank in range(world_size)]  # fmt: skip
    for rank, share in enumerate(shares):
        assert [int(v) for v in share] == order[rank::world_size]
    assert sorted(int(v) for share in shares for v in share) == list(range(1000))


@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_strided_window_into_a_typed_out(backend, dtype):
    raw = raw_manifest(2**31 - 1, 10**6 + 1, 8, seed=21)
    start, count, stride = 3, 5000, 2**18 + 7  # about one position per block
    want = uc.epoch_indices(raw, "train", 4, start, count, stride=stride, backend="numpy")
    if backend == "cupy":
        pytest.skip("a CuPy out is tested in test_cupy_backend.py")
    out = np.empty(count, dtype=dtype)
    got = uc.epoch_indices(raw, "train", 4, start, count, stride=stride, backend=backend, out=out)
    assert got is out
    np.testing.assert_array_equal(out.astype(np.uint64), want)


def test_strided_window_at_the_end_of_a_uint64_epoch(backend):
    raw = raw_manifest(U64, 2**61, 8, seed=3)
    start, count, stride = 12345, 64, (U64 - 12345) // 63 - 1
    assert start + (count - 1) * stride < U64
    got = to_numpy(uc.epoch_indices(raw, "train", 0, start, count, stride=stride, backend=backend))
    one_by_one = [int(uc.epoch_indices(raw, "train", 0, start + i * stride, 1, backend="numpy")[0])
                  for i in range(count)]
    assert [int(v) for v in got] == one_by_one


def raised(function, *args, **kwargs) -> uc.UmlosError:
    with pytest.raises(uc.UmlosError) as info:
        function(*args, **kwargs)
    return info.value


@pytest.mark.parametrize("kwargs,code,message", [
    ({"start": 0, "count": 5, "stride": 0}, errors.INVALID_ARGUMENT,
     "stride must be at least 1 (1: a contiguous window)"),
    ({"start": 0, "count": 5, "stride": -2}, errors.INVALID_ARGUMENT, "stride must be in [0, 2^64 - 1], got -2"),
    ({"start": 0, "count": 5, "stride": True}, errors.INVALID_ARGUMENT, None),
    ({"start": 1, "count": 101, "stride": 10}, errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY,
     "window 1, 11, ..., 1001 passes the end of the epoch (1000 positions)"),
    ({"start": 990, "count": 11}, errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY,
     "window [990, 1001) passes the end of the epoch (1000 positions)"),
])  # fmt: skip
def test_bad_strided_windows_are_refused_with_the_replay_token(kwargs, code, message):
    raw = raw_manifest(1000, 64, 48)
    for function in (uc.epoch_indices, uc.nextbatch.epoch_window):
        extra = {"epoch": 3, "backend": "numpy"} if function is uc.epoch_indices else {"epoch": 3}
        error = raised(function, raw, "train", **kwargs, **extra)
        assert error.code == code
        if message is not None:
            assert error.message == message
        assert error.record["data_replay_t"] == oracle.data_replay_t(
            oracle.replay_token(raw), "train", 3, kwargs["start"], 1, 0
        ).hex()
