"""The replay buffer against its definitions: each eviction policy, priority
sampling, its own Philox sub-streams keyed by the manifest, snapshots, and
state that restores the same draws; every refusal has its code."""

from __future__ import annotations

import numpy as np
import pytest

from umlos_cuda import errors
from streams_support import expect
from umlos_cuda.hashing import hash_canonical
from umlos_cuda.rng.streams import RngStreams, substream_blocks
from umlos_cuda.streams import BufferRng, MockGymStream, ReplayBuffer, stream_manifest
from umlos_cuda.streams.buffer.replay_buffer import check_state

SAMPLES = list(MockGymStream(400, seed=2, max_length=64))



def keys_of(buffer):
    return buffer.snapshot().keys.tolist()


# ------------------------------------------------------------------ the RNG
def test_the_key_has_its_own_derivation_and_the_engines_philox():
    manifest = stream_manifest(5)
    rng = BufferRng.from_manifest(manifest)
    token = manifest.resolve_replay_token(None)
    assert rng.seed16 == hash_canonical(["umlos_replay_buffer_v1", token, manifest.hash])[:16]
    assert rng.seed16 != RngStreams.from_manifest(manifest).master_seed  # never the trainer's streams
    first = rng.draw("policy", 7)
    assert first.tolist() == substream_blocks(rng.seed16, 2, 0, 2).reshape(-1)[:7].tolist()
    assert rng.draw("policy", 3).tolist() == substream_blocks(rng.seed16, 2, 1, 2).reshape(-1)[3:6].tolist()
    assert rng.offsets == {"eviction": 0, "sample": 0, "policy": 10, "window": 0}
    other = BufferRng.from_manifest(stream_manifest(6))
    expect(errors.REPLAY_BUFFER_INVALID, other.load_state_dict, rng.state_dict(), mention="another run")
    expect(errors.REPLAY_BUFFER_INVALID, rng.draw, "init", 1, mention="eviction, sample, policy, window")


# ------------------------------------------------------------------ eviction
def test_fifo_keeps_the_newest():
    buffer = ReplayBuffer(50, "fifo", seed=1)
    for s in SAMPLES[:173]:
        assert buffer.add(s)
    assert keys_of(buffer) == list(range(123, 173)) and len(buffer) == 50 and buffer.added == 173


def test_lowest_priority_keeps_the_highest_and_drops_a_lower_newcomer():
    buffer = ReplayBuffer(40, "lowest_priority", seed=1)
    priorities = [1 + (7 * k) % 13 for k in range(200)]
    stored = [buffer.add(s, p) for s, p in zip(SAMPLES, priorities)]
    # model: keep the 40 largest (priority, key); a newcomer below every kept one is dropped
    kept: list[tuple[float, int]] = []
    expected_stored = []
    for key, p in enumerate(priorities):
        if len(kept) < 40:
            kept.append((p, key))
            expected_stored.append(True)
            continue
        low = min(kept, key=lambda item: (item[0], item[1]))
        if p < low[0]:
            expected_stored.append(False)
            continue
        kept.remove(low)
        kept.append((p, key))
        expected_stored.append(True)
    assert stored == expected_stored
    assert keys_of(buffer) == sorted(key for _, key in kept)
    assert buffer.snapshot().priorities.tolist() == [float(priorities[k]) for k in keys_of(buffer)]


def test_reservoir_is_algorithm_r_on_the_eviction_stream():
    buffer = ReplayBuffer(30, "reservoir", seed=1)
    for s in SAMPLES[:300]:
        buffer.add(s)
    model_rng = BufferRng.from_manifest(stream_manifest(1))
    slots = list(range(30))
    for k in range(30, 300):
        j = int(model_rng.words64("eviction", 1)[0] % (k + 1))
        if j < 30:
            slots[j] = k
    assert keys_of(buffer) == sorted(slots)
    assert buffer.rng.offsets["eviction"] == 2 * 270


def test_reservoir_inclusion_is_uniform():
    """Each of 200 offered samples ends up in a 20-slot reservoir with
    probability 1/10; over 300 seeds the counts stay within 5 sigma."""
    counts = np.zeros(200)
    for seed in range(300):
        buffer = ReplayBuffer(20, "reservoir", seed=seed)
        for s in SAMPLES[:200]:
            buffer.add(s)
        counts[keys_of(buffer)] += 1
    sigma = np.sqrt(300 * 0.1 * 0.9)
    assert np.abs(counts - 30).max() < 5 * sigma


# ------------------------------------------------------------------ sampling
def test_priority_sampling_matches_its_distribution():
    buffer = ReplayBuffer(8, seed=3, priority_exponent=1.0)
    for s, p in zip(SAMPLES, (1, 2, 3, 4, 1, 1, 1, 3)):
        buffer.add(s, p)
    drawn = [s.seq for s in buffer.sample(20000)]
    shares = np.bincount(drawn, minlength=8) / 20000
    expected = np.array([1, 2, 3, 4, 1, 1, 1, 3]) / 16
    assert np.abs(shares - expected).max() < 0.015
    flat = ReplayBuffer(8, seed=3, priority_exponent=0.0)
    for s, p in zip(SAMPLES, (1, 2, 3, 4, 1, 1, 1, 3)):
        flat.add(s, p)
    assert np.abs(np.bincount([s.seq for s in flat.sample(20000)], minlength=8) / 20000 - 1 / 8).max() < 0.015


def test_a_restored_buffer_draws_what_the_uninterrupted_one_would():
    for eviction in ("fifo", "lowest_priority", "reservoir"):
        a = ReplayBuffer(25, eviction, seed=9)
        for i, s in enumerate(SAMPLES[:60]):
            a.add(s, 1 + i % 5)
        a.sample(17)
        state = a.state_dict()
        b = ReplayBuffer(25, eviction, seed=9)
        b.load_state_dict(state, {k: SAMPLES[k] for k in range(60)})
        assert b.snapshot().fingerprint == a.snapshot().fingerprint
        for i, s in enumerate(SAMPLES[60:140]):
            a.add(s, 1 + i % 3)
            b.add(s, 1 + i % 3)
        assert [s.seq for s in a.sample(50)] == [s.seq for s in b.sample(50)]
        assert a.snapshot().fingerprint == b.snapshot().fingerprint and a.rng.offsets == b.rng.offsets


# ------------------------------------------------------------------ snapshots
def test_snapshots_are_immutable_and_fingerprint_their_content():
    buffer = ReplayBuffer(10, seed=0)
    for s in SAMPLES[:5]:
        buffer.add(s)
    snap = buffer.snapshot()
    with pytest.raises(ValueError):
        snap.keys[0] = 9
    with pytest.raises(AttributeError):
        snap.fingerprint = "x"
    assert snap.fingerprint == buffer.snapshot().fingerprint
    buffer.add(SAMPLES[5])
    assert buffer.snapshot().fingerprint != snap.fingerprint and len(snap) == 5
    other = ReplayBuffer(10, seed=0)
    for s in SAMPLES[:4] + [SAMPLES[4].with_seq(99)]:  # one sample differs by its arrival number only
        other.add(s)
    assert other.snapshot().fingerprint != snap.fingerprint
    reprioritised = ReplayBuffer(10, seed=0)
    for s in SAMPLES[:5]:
        reprioritised.add(s, 2.0)
    assert reprioritised.snapshot().fingerprint != snap.fingerprint


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize("kwargs,mention", [
    (dict(max_size=0), "max_size"), (dict(max_size=True), "max_size"), (dict(max_size=1 << 27), "max_size"),
    (dict(max_size=4, eviction="lifo"), "fifo, lowest_priority, reservoir"),
    (dict(max_size=4, priority_exponent=-1), "priority_exponent"),
])
def test_bad_configuration(kwargs, mention):
    expect(errors.REPLAY_BUFFER_INVALID, ReplayBuffer, **kwargs, mention=mention)


def test_bad_calls_and_states():
    buffer = ReplayBuffer(4, seed=0)
    expect(errors.REPLAY_BUFFER_INVALID, buffer.sample, 1, mention="empty")
    expect(errors.REPLAY_BUFFER_INVALID, buffer.add, {"not": "a sample"})
    expect(errors.REPLAY_BUFFER_INVALID, buffer.add, SAMPLES[0], 0.0, mention="positive")
    expect(errors.REPLAY_BUFFER_INVALID, buffer.sample, -1)
    buffer.add(SAMPLES[0])
    good = buffer.state_dict()
    check_state(good)
    for change, mention in (({"format": "x"}, "format"), ({"added": -1}, "added"),
                            ({"slots": b"\x00" * 7}, "slots"), ({"slots": (5).to_bytes(8, "little")}, "below 'added'"),
                            ({"priorities": np.array([0.0]).tobytes()}, "positive")):
        expect(errors.REPLAY_BUFFER_INVALID, check_state, {**good, **change}, mention=mention)
    expect(errors.REPLAY_BUFFER_INVALID, check_state, {**good, "extra": 1})
    expect(errors.REPLAY_BUFFER_INVALID, ReplayBuffer(5, seed=0).load_state_dict, good, {}, mention="max_size")
    expect(errors.REPLAY_BUFFER_INVALID, ReplayBuffer(4, seed=0).load_state_dict, good, {},
           mention="no recorded sample")
    expect(errors.REPLAY_BUFFER_INVALID, ReplayBuffer(4, seed=1).load_state_dict, good, {0: SAMPLES[0]},
           mention="another run")
