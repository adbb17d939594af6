"""The common errors, word for word: a message is the user interface of a
failure, so each row pins its code, the operator its record names and its
message (a regular expression matched against the whole message).

docs/errors.md explains the codes and operators; this table is what a user
sees for the mistakes they make most often.
"""

from __future__ import annotations

import importlib.util
import re

import numpy as np
import pytest

import umlos_cuda as uc
from nbcases import raw_manifest
from umlos_cuda import errors
from umlos_cuda.backends import get_backend

GOOD = raw_manifest(1000, 64, 48)
NB = errors.NEXTBATCH_OPERATOR
HAS_TORCH = importlib.util.find_spec("torch") is not None


def nb(**kwargs):
    return uc.next_batch(GOOD, kwargs.pop("key", "train"), backend="numpy", **kwargs)


def window(**kwargs):
    return uc.epoch_indices(GOOD, "train", backend="numpy", **kwargs)


def without(key):
    return {name: value for name, value in GOOD.items() if name != key}


def torch_samplers():
    from umlos_cuda.torch import DistributedSampler, NextBatchSampler

    return DistributedSampler, NextBatchSampler


def distributed_state(**change):
    DistributedSampler, _ = torch_samplers()
    return {**DistributedSampler(10, 2, 0, seed=5).state_dict(), **change}


def nextbatch_sampler_state(**change):
    _, NextBatchSampler = torch_samplers()
    return {**NextBatchSampler(GOOD, "train", world_size=1, rank=0).state_dict(), **change}


def dali_source(**kwargs):
    from umlos_cuda.dali import IndexSource

    return IndexSource(GOOD, "train", **{"shard_id": 0, "num_shards": 1, **kwargs})


def demo_batches(batches):
    from umlos_cuda.commands.demo import stream_and_check

    return stream_and_check(GOOD, "train", world_size=1, batches=batches, cursor=uc.Cursor(), backend="numpy",
                            show_progress=False)


def order_hash(epoch):
    from umlos_cuda.rng.state_fingerprint import order_hash

    return order_hash(GOOD, "train", epoch)


# (what, call, code, operator, message)
COMMON = [
    # -- the manifest, on its own and in a call
    ("manifest without global_batch_size", lambda: uc.Manifest.from_dict(without("global_batch_size")),
     errors.INVALID_MANIFEST, errors.MANIFEST_OPERATOR, r"manifest lacks global_batch_size \(see docs/manifest\.md\)"),
    ("a float batch size", lambda: uc.Manifest.from_dict({**GOOD, "global_batch_size": 48.0}),
     errors.INVALID_MANIFEST, errors.MANIFEST_OPERATOR,
     r"global_batch_size must be an integer in \[0, 2\^64 - 1\], got float 48\.0 \(see docs/manifest\.md\)"),
    ("a misspelt key", lambda: uc.Manifest.from_dict({**without("global_batch_size"), "global_batchsize": 48}),
     errors.INVALID_MANIFEST, errors.MANIFEST_OPERATOR,
     r"unknown key 'global_batchsize' \(did you mean 'global_batch_size'\?\); allowed at the top level: .*; "
     r"put your own fields under 'extra' \(see docs/manifest\.md\)"),
    ("a manifest file that is not there", lambda: uc.Manifest.load("/nonexistent/run.yaml"),
     errors.INVALID_MANIFEST, errors.MANIFEST_OPERATOR, r"cannot read manifest '/nonexistent/run\.yaml': .*"),
    ("a bad manifest in a call", lambda: uc.next_batch(without("global_batch_size"), "train", backend="numpy"),
     errors.INVALID_MANIFEST, NB, r"manifest lacks global_batch_size \(see docs/manifest\.md\)"),
    # -- NextBatch_v2's checks (docs/spec/nextbatch-v2.md §2)
    ("an unknown dataset key", lambda: nb(key="validation"),
     errors.INVALID_DATASET_KEY, NB, r"dataset_key 'validation' is not in the manifest; known keys: train"),
    ("an unknown stage", lambda: nb(stage="test"),
     errors.INVALID_STAGE_TYPE, NB, r"stage 'test' is not one of train, eval, infer"),
    ("an unknown preset", lambda: nb(preset="forever"),
     errors.INVALID_STAGE_TYPE, NB, r"unknown preset 'forever'; choose one of train_shuffle, eval_sequential, "
     r"streaming_infinite"),
    ("an empty dataset", lambda: uc.next_batch(raw_manifest(0, 64, 48), "train", backend="numpy"),
     errors.CARDINALITY_MISMATCH, NB, r"dataset 'train' has cardinality 0; a sampler needs at least one sample"),
    ("a world size that does not divide G", lambda: nb(world_size=5),
     errors.BATCH_SIZE_INCONSISTENT, NB, r"global_batch_size 48 is not divisible by world_size 5"),
    ("a rank past the world", lambda: nb(world_size=4, rank=4),
     errors.INVALID_RANK, NB, r"rank 4 is outside \[0, 3\]"),
    ("world size 0", lambda: nb(world_size=0),
     errors.INVALID_RANK, NB, r"world_size 0 is outside \[1, 4294967295\]"),
    ("a negative world size", lambda: nb(world_size=-1),
     errors.INVALID_MANIFEST, NB, r"world_size must be in \[0, 2\^64 - 1\], got -1"),
    ("a cursor past the epoch", lambda: nb(cursor=uc.Cursor(0, 1000)),
     errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY, NB, r"cursor\.global_index 1000 is outside the epoch \[0, 999\]"),
    ("a malformed cursor in a call", lambda: nb(cursor={"epoch": 0}),
     errors.INVALID_MANIFEST, NB,
     r"a cursor is a mapping with exactly the keys epoch and global_index, got \{'epoch': 0\}"),
    ("a short replay token", lambda: nb(replay_token=bytes(31)),
     errors.INVALID_MANIFEST, NB, r"replay_token must be 32 bytes, got bytes of length 31"),
    ("a dataset of another length", lambda: uc.check_dataset_length(uc.Manifest.from_dict(GOOD), "train", 999),
     errors.CARDINALITY_MISMATCH, NB, r"dataset 'train' has 999 samples but the manifest declares cardinality 1000"),
    # -- cursors on their own
    ("a cursor mapping without global_index", lambda: uc.Cursor.from_dict({"epoch": 0}),
     errors.INVALID_CURSOR, errors.CURSOR_OPERATOR,
     r"a cursor is a mapping with exactly the keys epoch and global_index, got \{'epoch': 0\}"),
    ("a negative epoch", lambda: uc.Cursor(-1, 0),
     errors.INVALID_CURSOR, errors.CURSOR_OPERATOR, r"cursor\.epoch must be in \[0, 2\^64 - 1\], got -1"),
    ("a float position", lambda: uc.Cursor(0, 1.0),
     errors.INVALID_CURSOR, errors.CURSOR_OPERATOR,
     r"cursor\.global_index must be an integer in \[0, 2\^64 - 1\], got float 1\.0"),
    ("cursor bytes that are not CBOR", lambda: uc.Cursor.from_cbor(b"\xff"),
     errors.INVALID_CURSOR, errors.CURSOR_OPERATOR, r"cursor CBOR is malformed: .+"),
    # -- windows and outputs
    ("a window past the epoch", lambda: window(start=990, count=11),
     errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY, NB,
     r"window \[990, 1001\) passes the end of the epoch \(1000 positions\)"),
    ("an output dtype that is not an index type", lambda: window(dtype="int8"),
     errors.INVALID_ARGUMENT, NB, r"dtype must be one of uint64, int64, int32, got int8"),
    ("an out array of another length", lambda: window(count=3, out=np.empty(4, np.uint64)),
     errors.INVALID_ARGUMENT, NB, r"out must be an array of shape \(3,\), got \(4,\)"),
    ("stride 0", lambda: window(count=3, stride=0),
     errors.INVALID_ARGUMENT, NB, r"stride must be at least 1 \(1: a contiguous window\)"),
    ("int32 for an epoch it cannot index",
     lambda: uc.epoch_indices(raw_manifest(2**40, 64, 48), "train", count=3, dtype="int32", backend="numpy"),
     errors.OUTPUT_DTYPE_OVERFLOW, NB, r"an epoch of N = 1099511627776 reaches index 1099511627775, which does not fit "
     r"in int32 \(largest 2147483647\); use uint64, int64"),
    ("an unknown backend", lambda: get_backend("tpu"),
     errors.BACKEND_UNAVAILABLE, errors.BACKEND_OPERATOR,
     r"unknown backend 'tpu'; choose one of numpy, native, cupy, auto"),
    ("an out array a backend cannot write", lambda: get_backend("numpy").sequential(0, 3, np.empty(4, np.uint64)),
     errors.INVALID_ARGUMENT, errors.BACKEND_OPERATOR,
     r"out must be a writable, contiguous NumPy array of shape \(3,\), got ndarray \(4,\)"),
    # -- integrations
    ("the DALI source on an unknown device", lambda: dali_source(device="tpu"),
     errors.INVALID_ARGUMENT, errors.DALI_OPERATOR, r"device 'tpu' is not one of cpu, gpu"),
    ("a DALI shard past the shard count", lambda: dali_source(shard_id=4, num_shards=4),
     errors.INVALID_RANK, errors.DALI_OPERATOR, r"Invalid rank 4, rank should be in the interval \[0, 3\]"),
    ("the demo with no batches", lambda: demo_batches(0),
     errors.INVALID_ARGUMENT, errors.DEMO_OPERATOR, r"--batches must be at least 1, got 0"),
    ("an order hash of a negative epoch", lambda: order_hash(-1),
     errors.FINGERPRINT_INPUT_INVALID, "UML_OS.StateFingerprint_v1", r"epoch must be in \[0, 2\^64 - 1\], got -1"),
]

TORCH = [
    ("a rank past num_replicas", lambda: torch_samplers()[0](10, 8, 9),
     errors.INVALID_RANK, errors.TORCH_OPERATOR, r"Invalid rank 9, rank should be in the interval \[0, 7\]"),
    ("a seed PyTorch refuses", lambda: torch_samplers()[0](10, 2, 0, seed=2**64),
     errors.INVALID_ARGUMENT, errors.TORCH_OPERATOR,
     r"seed = 18446744073709551616 is outside \[-2\^63, 2\^64 - 1\], the seeds PyTorch accepts"),
    ("a negative epoch", lambda: torch_samplers()[0](10, 2, 0).set_epoch(-1),
     errors.INVALID_ARGUMENT, errors.TORCH_OPERATOR, r"epoch -1 is outside \[0, 18446744073709551615\]"),
    ("a dataset without a length", lambda: torch_samplers()[0](object(), 2, 0),
     errors.CARDINALITY_MISMATCH, errors.TORCH_OPERATOR,
     r"object of type 'object' has no len\(\): the dataset must be a map-style dataset with a length, or the length "
     r"itself \(an int\)"),
    ("something that is not a sampler state", lambda: torch_samplers()[0](10, 2, 0).load_state_dict({"format": "x"}),
     errors.SAMPLER_STATE_INVALID, errors.TORCH_OPERATOR,
     r"not a DistributedSampler state \(expected format 'umlos_cuda\.torch\.DistributedSampler/1'\)"),
    ("a state of another seed", lambda: torch_samplers()[0](10, 2, 0).load_state_dict(distributed_state()),
     errors.SAMPLER_STATE_INVALID, errors.TORCH_OPERATOR,
     r"the state was written with seed=5 but this sampler has seed=0"),
    ("a state of another manifest",
     lambda: torch_samplers()[1](GOOD, "train", world_size=1, rank=0).load_state_dict(
         nextbatch_sampler_state(manifest_hash="00" * 32)),
     errors.SAMPLER_STATE_INVALID, errors.TORCH_OPERATOR,
     r"the state was written with manifest_hash='0{64}' but this sampler has manifest_hash='[0-9a-f]{64}'"),
    ("a state with a malformed cursor",
     lambda: torch_samplers()[1](GOOD, "train", world_size=1, rank=0).load_state_dict(
         nextbatch_sampler_state(cursor={"epoch": 0})),
     errors.SAMPLER_STATE_INVALID, errors.TORCH_OPERATOR,
     r"the state's cursor: a cursor is a mapping with exactly the keys epoch and global_index, got \{'epoch': 0\}"),
]


def check(call, code, operator, message):
    with pytest.raises(uc.UmlosError) as info:
        call()
    error = info.value
    assert (error.code, error.record["failure_operator"]) == (code, operator), error.message
    assert error.record["failure_code"] == code
    assert re.fullmatch(message, error.message), error.message
    assert str(error) == f"{code}: {error.message}"  # what the command line prints after "error "


@pytest.mark.parametrize("what,call,code,operator,message", COMMON, ids=[row[0] for row in COMMON])
def test_common_errors(what, call, code, operator, message):
    check(call, code, operator, message)


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (the optional 'torch' extra)")
@pytest.mark.parametrize("what,call,code,operator,message", TORCH, ids=[row[0] for row in TORCH])
def test_common_sampler_errors(what, call, code, operator, message):
    check(call, code, operator, message)


@pytest.mark.parametrize("setting,name", [("lots", "UMLOS_MAX_INDICES"), ("-1", "UMLOS_MAX_BLOCKS")])
def test_settings_that_are_not_counts(monkeypatch, setting, name):
    monkeypatch.setenv(name, setting)
    check(lambda: window(), errors.INVALID_ARGUMENT, NB,
          rf"{name} must be a non-negative integer, got '{re.escape(setting)}'")
