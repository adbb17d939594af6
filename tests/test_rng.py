"""The RNG master stream and its sub-streams (umlos_cuda.rng, docs/spec/rng.md):
known answers from an independent pure-Python model, strictly sequential
draws, independent sub-streams, and a state that restores to identical draws."""

from __future__ import annotations

import struct
from pathlib import Path

import cbor2
import numpy as np
import pytest

import oracle
import umlos_cuda as uc
from nbcases import raw_manifest
from umlos_cuda import errors
from umlos_cuda.rng.streams import STATE_FORMAT, STREAMS, RngStreams, consumes, draws_at, master_seed, resolve_backend

RAW = raw_manifest(1000, 64, 48, seed=3)


# ---------------------------------------------------------------- an independent model
def model_master_seed(raw: dict, token: bytes | None = None) -> bytes:
    token = oracle.replay_token(raw) if token is None else token
    return oracle.hash_canonical(["uml_os_rng_master_v1", token, oracle.manifest_hash(raw)])[:16]


def model_draws(seed16: bytes, stream_number: int, offset: int, count: int) -> list[int]:
    """docs/spec/rng.md §2 in plain Python over the oracle's Philox: draw n is
    word n mod 4 of block n // 4, block b's counter (lo32(b), hi32(b), w2 ^ s, w3)."""
    w0, w1, w2, w3 = struct.unpack("<4I", seed16)
    out = []
    for n in range(offset, offset + count):
        block, word = divmod(n, 4)
        counter = (block & 0xFFFFFFFF, block >> 32, w2 ^ stream_number, w3)
        out.append(oracle.philox4x32_10(counter, (w0, w1))[word])
    return out


def test_master_seed_matches_the_model_and_uses_its_own_tag():
    m = uc.Manifest.from_dict(RAW)
    assert master_seed(m.hash, m.replay_token) == model_master_seed(RAW)
    assert RngStreams.from_manifest(RAW).master_seed == model_master_seed(RAW)
    # Not the NextBatch_v2 epoch seed of any dataset key or epoch derivation: another tag.
    assert model_master_seed(RAW) != oracle.epoch_seed(m.replay_token, m.hash, "train", 0)


def rng_backend(name: str) -> str:
    """``name`` when this machine computes draws with it, else skip."""
    try:
        resolve_backend(name)
    except uc.UmlosError as exc:
        pytest.skip(exc.message)
    return name


@pytest.fixture(params=["numpy", "native"])
def draw_backend(request) -> str:
    return rng_backend(request.param)


@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("offset,count", [(0, 1), (0, 9), (3, 6), (5, 1), (2**32 * 4 - 2, 5), (2**64 - 10, 9)])
def test_draws_match_the_model(stream, offset, count, draw_backend):
    seed16 = model_master_seed(RAW)
    got = draws_at(seed16, stream, offset, count, draw_backend)
    assert got.dtype == np.uint32
    assert got.tolist() == model_draws(seed16, STREAMS.index(stream), offset, count)


def test_numpy_and_native_give_the_same_draws_and_states():
    rng_backend("native")
    for stream in STREAMS:
        for offset, count in ((0, 10**5), (7, 3), (2**40 + 1, 1001)):
            assert np.array_equal(draws_at(model_master_seed(RAW), stream, offset, count, "numpy"),
                                  draws_at(model_master_seed(RAW), stream, offset, count, "native"))
    a, b = RngStreams.from_manifest(RAW, backend="numpy"), RngStreams.from_manifest(RAW, backend="native")
    assert (a.backend, b.backend) == ("numpy", "native")
    for stream, k in (("init", 2), ("cluster", 31), ("misc", 1), ("misc", 5), ("init", 0)):
        assert a.draw(stream, k).tolist() == b.draw(stream, k).tolist()
    assert a.state_dict() == b.state_dict() and a.fingerprint() == b.fingerprint()


def test_rng_backends_are_named():
    assert resolve_backend("numpy") == "numpy"
    assert resolve_backend("auto") in ("numpy", "native")
    for name in ("cupy", "tpu", None):
        with pytest.raises(uc.UmlosError) as info:
            RngStreams.from_manifest(RAW, backend=name)
        assert info.value.code == errors.BACKEND_UNAVAILABLE and "numpy, native, auto" in info.value.message


def test_sub_streams_differ_and_do_not_disturb_each_other():
    streams = RngStreams.from_manifest(RAW)
    first = {name: draws_at(streams.master_seed, name, 0, 8).tolist() for name in STREAMS}
    assert len({tuple(v) for v in first.values()}) == 3
    streams.draw("init", 5)
    streams.draw("cluster", 31)
    assert streams.draw("misc", 8).tolist() == first["misc"]
    assert streams.offsets == {"init": 5, "cluster": 31, "misc": 8}


def test_draws_are_strictly_sequential():
    streams = RngStreams.from_manifest(RAW)
    pieces = [streams.draw("misc", k) for k in (1, 0, 3, 2, 7, 4)]
    assert np.concatenate(pieces).tolist() == draws_at(streams.master_seed, "misc", 0, 17).tolist()
    assert streams.offset("misc") == 17 and streams.offset("init") == 0


def test_master_depends_on_the_manifest_and_the_replay_token():
    base = RngStreams.from_manifest(RAW).master_seed
    assert RngStreams.from_manifest(raw_manifest(1000, 64, 48, seed=4)).master_seed != base
    assert RngStreams.from_manifest({**RAW, "extra": {"note": 1}}).master_seed != base
    token = bytes(range(32))
    assert RngStreams.from_manifest(RAW, replay_token=token).master_seed == model_master_seed(RAW, token)
    with pytest.raises(uc.UmlosError) as info:
        RngStreams.from_manifest(RAW, replay_token=b"short")
    assert info.value.code == errors.INVALID_MANIFEST


def test_golden_draws():
    import json
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "golden", "nextbatch_v1.json")
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    cases = [case for case in data["cases"] if case["kind"] == "draws"]
    assert len(cases) == 4 * len(data["manifests"])
    for case in cases:
        raw = data["manifests"][case["input"]["manifest"]]
        seed16 = model_master_seed(raw)
        assert seed16.hex() == case["expected"]["master_seed"]
        got = draws_at(seed16, case["input"]["stream"], case["input"]["offset"], case["input"]["count"])
        assert got.tolist() == case["expected"]["draws"], case["id"]


# ---------------------------------------------------------------- state
def test_state_round_trips_through_canonical_cbor_to_identical_draws():
    streams = RngStreams.from_manifest(RAW)
    streams.draw("init", 2)
    streams.draw("cluster", 31)
    streams.draw("misc", 3)
    saved = cbor2.dumps(streams.state_dict(), canonical=True)
    expected = {name: streams.draw(name, 10).tolist() for name in STREAMS}

    restored = RngStreams.from_manifest(RAW)
    restored.load_state_dict(cbor2.loads(saved))
    assert restored.offsets == {"init": 2, "cluster": 31, "misc": 3}
    assert {name: restored.draw(name, 10).tolist() for name in STREAMS} == expected
    assert restored.state_dict() == streams.state_dict()
    assert restored.fingerprint() == streams.fingerprint()


def test_state_bytes_and_fingerprint_layout():
    streams = RngStreams.from_manifest(RAW)
    streams.draw("cluster", 7)
    streams.draw("misc", 1)
    expected = streams.master_seed + struct.pack(">QQQ", 0, 7, 1)
    assert streams.state_bytes() == expected
    assert streams.fingerprint() == oracle.sha256(expected)
    assert streams.state_dict() == {"format": STATE_FORMAT, "master_seed": streams.master_seed,
                                    "offsets": {"init": 0, "cluster": 7, "misc": 1}}


def _state(**changes):
    state = RngStreams.from_manifest(RAW).state_dict()
    state.update(changes)
    return state


@pytest.mark.parametrize("state", [
    _state(format="umlos-cuda/rng-state-v0"),
    _state(master_seed=b"\x00" * 16),
    _state(master_seed=b"\x00" * 15),
    _state(master_seed="00" * 16),
    _state(offsets={"init": 0, "cluster": 0}),
    _state(offsets={"init": 0, "cluster": 0, "misc": -1}),
    _state(offsets={"init": 0, "cluster": 0, "misc": True}),
    _state(offsets={"init": 0, "cluster": 0, "misc": 2**64}),
    _state(offsets={"init": 0, "cluster": 0, "misc": 1, "extra": 0}),
    {"format": STATE_FORMAT},
    [1, 2],
])
def test_malformed_or_foreign_states_are_refused(state):
    streams = RngStreams.from_manifest(RAW)
    streams.draw("misc", 4)
    with pytest.raises(uc.UmlosError) as info:
        streams.load_state_dict(state)
    assert info.value.code == errors.RNG_STATE_INVALID
    assert streams.offsets["misc"] == 4  # nothing changed


def test_another_runs_state_is_refused_and_named():
    other = RngStreams.from_manifest(raw_manifest(1000, 64, 48, seed=99))
    streams = RngStreams.from_manifest(RAW)
    with pytest.raises(uc.UmlosError) as info:
        streams.load_state_dict(other.state_dict())
    assert info.value.code == errors.RNG_STATE_INVALID and "another manifest" in info.value.message


def test_restore_inside_an_operator_is_refused():
    streams = RngStreams.from_manifest(RAW)
    state = streams.state_dict()
    with pytest.raises(uc.UmlosError) as info, consumes(streams, "misc", 1, operator="test.RestoreInside_v1"):
        streams.draw("misc", 1)
        streams.load_state_dict(state)
    assert info.value.code == errors.RNG_STATE_INVALID and "test.RestoreInside_v1" in info.value.message


@pytest.mark.parametrize("stream,k", [("Misc", 1), ("none", 1), (None, 1), ("misc", -1), ("misc", 1.0), ("misc", True)])
def test_bad_draws_are_refused(stream, k):
    streams = RngStreams.from_manifest(RAW)
    with pytest.raises(uc.UmlosError) as info:
        streams.draw(stream, k)
    assert info.value.code == errors.RNG_STREAM_INVALID
    assert streams.offsets == {"init": 0, "cluster": 0, "misc": 0}
    if stream != "misc":
        assert "init, cluster, misc" in info.value.message


def test_offsets_never_wrap():
    streams = RngStreams.from_manifest(RAW)
    streams.load_state_dict(_state(offsets={"init": 0, "cluster": 0, "misc": 2**64 - 3}))
    assert streams.draw("misc", 2).tolist() == draws_at(streams.master_seed, "misc", 2**64 - 3, 2).tolist()
    with pytest.raises(uc.UmlosError) as info:
        streams.draw("misc", 1)
    assert info.value.code == errors.UINT64_OVERFLOW
    assert streams.offset("misc") == 2**64 - 1


def test_the_native_entry_point_checks_its_output_buffer():
    rng_backend("native")
    from umlos_cuda import _native

    for bad in (np.empty(3, dtype=np.uint32), np.empty(4, dtype=np.uint64), np.empty((2, 4), dtype=np.uint32),
                np.empty(4, dtype=np.uint32)[::-1], b"\x00" * 16):
        with pytest.raises(TypeError):
            _native.philox_stream(1, 2, 3, 4, 0, bad)
    with pytest.raises(OverflowError):
        _native.philox_stream(1, 2, 3, 4, 2**64 - 1, np.empty(8, dtype=np.uint32))
    with pytest.raises(OverflowError):
        _native.philox_stream(2**32, 2, 3, 4, 0, np.empty(4, dtype=np.uint32))
    out = np.empty(4, dtype=np.uint32)
    _native.philox_stream(0, 0, 0, 0, 0, out)  # Random123's first known answer
    assert out.tolist() == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
