"""StateFingerprint_v1 (docs/spec/rng.md §5): the byte layout, the item
order, value encodings that agree across array libraries,
and fingerprints that are the same in another process and on every backend."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import numpy as np
import pytest

import oracle
import umlos_cuda as uc
from nbcases import raw_manifest
from umlos_cuda import errors
from umlos_cuda.rng.nextbatch_v1 import next_batch_v1
from umlos_cuda.rng.streams import RngStreams
from umlos_cuda.rng.state_fingerprint import ITEMS, StateFingerprint, data_plane_fingerprint, encode, order_hash

RAW = raw_manifest(5000, 256, 48, seed=21)


def frame(number: int, data: bytes) -> bytes:
    return bytes([number]) + struct.pack(">Q", len(data)) + data


def test_data_plane_layout_is_items_4_and_6_framed():
    streams = RngStreams.from_manifest(RAW)
    streams.draw("misc", 3)
    order = bytes(range(32))
    expected = frame(4, struct.pack(">QQ", 2, 480) + order) + frame(6, streams.state_bytes())
    fingerprint = StateFingerprint().add_rng(streams).add_data_cursor(2, 480, order)  # any call order
    assert fingerprint.preimage() == expected
    assert fingerprint.digest() == oracle.sha256(expected)
    assert data_plane_fingerprint(streams, 2, 480, order) == oracle.sha256(expected)
    assert fingerprint.items() == ("data_cursor", "rng")


def test_every_item_is_hashed_in_the_seeds_order():
    values = {item: struct.pack(">Q", number) for number, item in enumerate(ITEMS, 1)}
    forward, backward = StateFingerprint(), StateFingerprint()
    for item in ITEMS:
        forward.add(item, values[item])
    for item in reversed(ITEMS):
        backward.add(item, values[item])
    assert forward.preimage() == backward.preimage() == b"".join(frame(n, values[i]) for n, i in enumerate(ITEMS, 1))
    assert ITEMS == ("theta", "optimizer", "latent_buffer", "data_cursor", "state", "rng", "protos", "loss_hist")


def test_items_are_framed_so_moving_bytes_between_items_changes_the_hash():
    a = StateFingerprint().add("theta", b"\x01\x02").add("optimizer", b"\x03").digest()
    b = StateFingerprint().add("theta", b"\x01").add("optimizer", b"\x02\x03").digest()
    assert a != b


@pytest.mark.parametrize("item,value", [("params", b""), ("theta", True), ("theta", -1), ("theta", 2**64),
                                        ("theta", "text"), ("theta", np.array([1 + 2j])), ("theta", {1: b""})])
def test_bad_items_are_refused(item, value):
    with pytest.raises(uc.UmlosError) as info:
        StateFingerprint().add(item, value)
    assert info.value.code == errors.FINGERPRINT_INPUT_INVALID


def test_an_item_is_added_once():
    fingerprint = StateFingerprint().add("state", 0)
    with pytest.raises(uc.UmlosError) as info:
        fingerprint.add("state", 1)
    assert info.value.code == errors.FINGERPRINT_INPUT_INVALID


def test_array_encoding():
    value = np.array([[1.5, -0.0]], dtype=np.float32)
    assert encode(value) == b"f" + struct.pack(">IQQ", 2, 1, 2) + struct.pack(">dd", 1.5, -0.0)
    assert encode(np.array([-3], dtype=np.int8)) == b"i" + struct.pack(">IQq", 1, 1, -3)
    assert encode(np.array([True, False])) == b"u" + struct.pack(">IQQQ", 1, 2, 1, 0)
    assert encode(7) == struct.pack(">Q", 7) and encode(0.25) == struct.pack(">d", 0.25)
    named = encode({"b": np.zeros(1), "a": np.ones(1)})
    assert named == struct.pack(">Q", 2) + struct.pack(">I", 1) + b"a" + encode(np.ones(1)) + \
        struct.pack(">I", 1) + b"b" + encode(np.zeros(1))
    assert encode([1, 2]) == struct.pack(">QQQ", 2, 1, 2)


def test_float_widths_and_nan_payloads_do_not_split_fingerprints():
    as32 = encode(np.array([0.1, 2.0], dtype=np.float32))
    assert as32 == encode(np.array([0.1, 2.0], dtype=np.float32).astype(np.float64))
    quiet = np.array([np.nan])
    payload = np.frombuffer(struct.pack("<Q", 0x7FF0000000000123), dtype=np.float64)
    assert encode(quiet) == encode(payload) == b"f" + struct.pack(">IQ", 1, 1) + bytes.fromhex("7ff8000000000000")


def test_torch_tensors_encode_like_numpy_arrays():
    torch = pytest.importorskip("torch")
    params = {"w": torch.tensor([[0.5, 1.25]], requires_grad=True), "step": torch.tensor([3], dtype=torch.int64)}
    as_numpy = {"w": np.array([[0.5, 1.25]]), "step": np.array([3])}
    assert encode(params) == encode(as_numpy)
    assert encode(torch.tensor([1.0], dtype=torch.bfloat16)) == encode(np.array([1.0]))


def test_order_hash_names_the_order():
    m = uc.Manifest.from_dict(RAW)
    seed16 = oracle.epoch_seed(m.replay_token, m.hash, "train", 4)
    config = oracle.sampler_config_hash("SHUFFLE_WITHOUT_REPLACEMENT_BLOCK_AFFINE_V1", 256, False)
    assert order_hash(RAW, "train", 4) == oracle.hash_canonical(["umlos_epoch_order_v1", config, 5000, seed16])
    assert order_hash(RAW, "train", 4) != order_hash(RAW, "train", 5)
    eval_config = oracle.sampler_config_hash("SEQUENTIAL_V1", 256, False)
    expected = oracle.hash_canonical(["umlos_epoch_order_v1", eval_config, 5000, None])
    assert order_hash(RAW, "train", 4, stage="eval") == expected
    assert order_hash(RAW, "train", 4, stage="eval") == order_hash(RAW, "train", 9, stage="eval")


# ---------------------------------------------------------------- across processes and backends
def compute(backend: str) -> dict:
    """The same run in any process: two v1 epochs, a state fingerprint with trainer items."""
    streams = RngStreams.from_manifest(RAW, backend="native" if backend == "native" else "numpy")
    streams.draw("init", 2)
    out = {}
    for epoch in (0, 1):
        batch = next_batch_v1(RAW, "train", 4, 1, epoch, streams=streams, backend=backend)
        out[f"indices_{epoch}"] = oracle.sha256(batch.indices.astype("<u8").tobytes()).hex()
        fingerprint = StateFingerprint().add_data_cursor(epoch, 64, batch.order_hash).add_rng(streams)
        fingerprint.add("theta", {"layer.w": np.linspace(-1, 1, 7, dtype=np.float32)}).add("state", 1)
        out[f"state_fp_{epoch}"] = fingerprint.hexdigest()
    out["rng_fp"] = streams.fingerprint().hex()
    return out


SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
import test_state_fingerprint as t
print(json.dumps(t.compute({backend!r})))
"""


def test_fingerprints_are_the_same_in_another_process_and_on_every_backend(backend):
    import os

    here = compute("numpy")
    assert compute(backend) == here
    script = SCRIPT.format(tests=os.path.dirname(os.path.abspath(__file__)), backend=backend)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert json.loads(result.stdout) == here
