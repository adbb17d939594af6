"""Failure records carry the replay token by themselves, and requests too large
to allocate are refused before anything is allocated.

R8 (docs/spec/nextbatch-v2.md §2): a failure record includes the replay token. Every failure of
``next_batch``, ``epoch_indices`` and ``epoch_window`` raised once the manifest
and the values the token is made of are valid carries ``data_replay_t`` and
``dataset_key``, whichever helper raised it (backends, plan budget, window
checks), without the caller passing anything. ``epoch_indices`` has no world
size: its token is that of a world-size-1 call at cursor ``(epoch, start)``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import oracle
import umlos_cuda as uc
from nbcases import raw_manifest
from umlos_cuda import errors, nextbatch

GOOD = raw_manifest(1000, 64, 48)
TOKEN = bytes(range(32))


def raised(function, *args, **kwargs) -> uc.UmlosError:
    with pytest.raises(uc.UmlosError) as info:
        function(*args, **kwargs)
    return info.value


def window_token(raw, epoch, start, token=None) -> str:
    return oracle.data_replay_t(token or oracle.replay_token(raw), "train", epoch, start, 1, 0).hex()


@pytest.mark.parametrize(
    "code,kwargs,environ",
    [
        (errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY, {"start": 1001}, {}),
        (errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY, {"start": 990, "count": 11}, {}),
        (errors.INVALID_MANIFEST, {"start": 5, "count": -1}, {}),
        (errors.INVALID_ARGUMENT, {"start": 5, "dtype": "int8"}, {}),
        (errors.INVALID_ARGUMENT, {"start": 5, "count": 3, "out": np.empty(4, np.uint64)}, {}),
        (errors.BACKEND_UNAVAILABLE, {"start": 5, "backend": "tpu"}, {}),
        (errors.BLOCK_TABLE_TOO_LARGE, {"start": 5}, {"UMLOS_MAX_BLOCKS": "10"}),
        (errors.REQUEST_TOO_LARGE, {"start": 5, "count": 101}, {"UMLOS_MAX_INDICES": "100"}),
    ],
)
@pytest.mark.parametrize("token", [None, TOKEN])
def test_epoch_indices_failures_carry_the_replay_token(monkeypatch, code, kwargs, environ, token):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    kwargs = {"backend": "numpy", **kwargs}
    error = raised(uc.epoch_indices, GOOD, "train", epoch=3, replay_token=token, **kwargs)
    assert error.code == code, error.message
    assert error.record["dataset_key"] == "train"
    assert error.record["data_replay_t"] == window_token(GOOD, 3, kwargs["start"], token)


def test_epoch_window_failures_carry_the_token_of_the_epoch_asked_for():
    error = raised(nextbatch.epoch_window, GOOD, "train", 990, 11, epoch=9)
    assert error.code == errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY
    assert error.record["data_replay_t"] == window_token(GOOD, 9, 990)


@pytest.mark.parametrize(
    "raw,kwargs",
    [
        ({**GOOD, "global_batch_size": -1}, {}),  # no manifest
        (GOOD, {"epoch": -1}),                    # no epoch
        (GOOD, {"start": "0"}),                   # no start
        (GOOD, {"replay_token": b"short"}),       # no token
    ],
)
def test_epoch_indices_record_has_no_token_when_it_cannot_be_computed(raw, kwargs):
    error = raised(uc.epoch_indices, raw, "train", **{"backend": "numpy", **kwargs})
    assert error.code == errors.INVALID_MANIFEST
    assert error.record["data_replay_t"] is None


@pytest.mark.parametrize(
    "code,kwargs,environ",
    [
        (errors.BACKEND_UNAVAILABLE, {"backend": "tpu"}, {}),
        (errors.BLOCK_TABLE_TOO_LARGE, {}, {"UMLOS_MAX_BLOCKS": "10"}),
        (errors.REQUEST_TOO_LARGE, {}, {"UMLOS_MAX_INDICES": "11"}),
    ],
)
def test_next_batch_failures_raised_by_helpers_carry_key_and_token(monkeypatch, code, kwargs, environ):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    kwargs = {"backend": "numpy", **kwargs}
    error = raised(uc.next_batch, GOOD, "train", 4, 3, "train", uc.Cursor(2, 96), t=7, **kwargs)
    assert error.code == code, error.message
    assert error.record["dataset_key"] == "train" and error.record["t"] == 7
    assert error.record["data_replay_t"] == oracle.data_replay_t(oracle.replay_token(GOOD), "train", 2, 96, 4, 3).hex()


def test_next_batch_record_names_the_key_even_without_a_token():
    error = raised(uc.next_batch, GOOD, "train", 4, -1, backend="numpy")
    assert error.code == errors.INVALID_MANIFEST
    assert error.record["dataset_key"] == "train" and error.record["data_replay_t"] is None


# --------------------------------------------------------------- REQUEST_TOO_LARGE
HUGE = raw_manifest(2**64 - 1, 1 << 63, 2**40)  # global_batch_size 2^40: 8 TiB of uint64


@pytest.mark.parametrize("stage,preset",
                         [("eval", None), ("infer", None), ("train", None), (None, "streaming_infinite")])
def test_a_batch_too_large_to_allocate_is_refused_before_allocating(backend, stage, preset):
    kwargs = {"preset": preset} if preset else {"stage": stage}
    error = raised(uc.next_batch, HUGE, "train", backend=backend, **kwargs)
    assert error.code == errors.REQUEST_TOO_LARGE
    assert str(2**40) in error.message and "UMLOS_MAX_INDICES" in error.message
    assert error.record["data_replay_t"] == oracle.data_replay_t(oracle.replay_token(HUGE), "train", 0, 0, 1, 0).hex()


def test_streaming_over_a_small_epoch_is_refused_too():
    """Streaming never clips: 2^40 positions of a 10-sample epoch is still 2^40 indices."""
    error = raised(uc.next_batch, raw_manifest(10, 4, 2**40), "train", preset="streaming_infinite", backend="numpy")
    assert error.code == errors.REQUEST_TOO_LARGE


def test_the_bound_counts_what_the_call_returns():
    """Eval clips to the epoch: a huge G over a small N returns N indices and is fine."""
    batch = uc.next_batch(raw_manifest(1000, 64, 2**40), "train", stage="eval", backend="numpy")
    assert len(batch.indices) == 1000


def test_the_bound_is_configurable_and_exact(monkeypatch):
    monkeypatch.setenv("UMLOS_MAX_INDICES", "100")
    assert len(uc.epoch_indices(GOOD, "train", count=100, backend="numpy")) == 100
    assert raised(uc.epoch_indices, GOOD, "train", count=101, backend="numpy").code == errors.REQUEST_TOO_LARGE
    assert len(uc.next_batch(raw_manifest(1000, 64, 100), "train", backend="numpy").indices) == 100
    assert raised(uc.next_batch, raw_manifest(1000, 64, 101), "train", backend="numpy").code == errors.REQUEST_TOO_LARGE
    monkeypatch.setenv("UMLOS_MAX_INDICES", "lots")
    error = raised(uc.epoch_indices, GOOD, "train", backend="numpy")
    assert error.code == errors.INVALID_ARGUMENT and "UMLOS_MAX_INDICES" in error.message


@pytest.mark.parametrize("setting", ["lots", "-1", "1.5"])
def test_a_block_bound_that_is_not_a_count_is_refused_with_a_code(monkeypatch, setting):
    """UMLOS_MAX_BLOCKS=lots raised a bare ValueError from int()."""
    monkeypatch.setenv("UMLOS_MAX_BLOCKS", setting)
    error = raised(uc.next_batch, GOOD, "train", backend="numpy")
    assert error.code == errors.INVALID_ARGUMENT
    assert error.message == f"UMLOS_MAX_BLOCKS must be a non-negative integer, got {setting!r}"
    assert error.record["failure_operator"] == errors.NEXTBATCH_OPERATOR and error.record["dataset_key"] == "train"


def test_default_bound():
    assert nextbatch.DEFAULT_MAX_INDICES == 2**32
    error = raised(uc.epoch_indices, raw_manifest(2**64 - 1, 1 << 63, 1), "train", count=2**32 + 1, backend="numpy")
    assert error.code == errors.REQUEST_TOO_LARGE


def test_running_out_of_memory_under_the_bound_is_request_too_large():
    """A request under the bound that this machine still cannot allocate (here:
    16 GiB under a 4 GiB address-space limit, in a child process) fails with the
    code, not with NumPy's MemoryError."""
    script = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n"
        "import umlos_cuda as uc\n"
        "m = {'global_batch_size': 2**31, 'datasets': {'train': {'id': 'x', 'version': '1', 'hash': 'h',"
        " 'cardinality': 2**64 - 1}}}\n"
        "try:\n"
        "    uc.next_batch(m, 'train', stage='eval', backend='numpy')\n"
        "except uc.UmlosError as e:\n"
        "    print(e.code, e.record['data_replay_t'] is not None, e.message)\n"
    )
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("REQUEST_TOO_LARGE True this machine could not allocate"), done.stdout
