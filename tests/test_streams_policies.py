"""Sampling policies against their definitions, and policy.yaml read strictly.

Tolerances: shares measured over 20,000 draws (fixed Philox streams, so the
numbers are the same on every run) must be within 0.02 of their definition;
a share's standard deviation at 20,000 draws is at most 0.0036, so 0.02 is
more than five of them.
"""

from __future__ import annotations

import numpy as np
import pytest

from umlos_cuda import errors
from streams_support import expect
from umlos_cuda.streams import (ComposedPolicy, DifficultyBucketPolicy, FailureReplayPolicy, LengthQuotaPolicy,
                                MockGymStream, NoveltyPolicy, ReplayBuffer, RollingBatchPlanWindow, load_policies,
                                policies_from_yaml)

TOLERANCE = 0.02
DRAWS = 20000
FOUR_POLICIES = """
policies:
  - type: difficulty_bucket
    weights:
      easy: 0.2
      medium: 0.5
      hard: 0.3
  - type: failure_replay
    failure_weight: 2.0
  - type: novelty
    novelty_window: 1000
  - type: length_quota
    quotas:
      128: 0.1
      256: 0.2
      512: 0.4
      1024: 0.3
"""


def full_buffer(n=600, seed=0, max_length=1000):
    buffer = ReplayBuffer(n, seed=seed)
    for s in MockGymStream(n, seed=seed, max_length=max_length, solve_rate=0.5):
        buffer.add(s)
    return buffer


def draw(policy, buffer, n=DRAWS):
    snapshot = buffer.snapshot()
    return snapshot, policy.select(snapshot, n, buffer.rng)



def test_a_policy_file_loads_its_policies_in_order():
    composed = policies_from_yaml(FOUR_POLICIES)
    assert [type(p) for p in composed.policies] == [DifficultyBucketPolicy, FailureReplayPolicy, NoveltyPolicy,
                                                   LengthQuotaPolicy]
    assert composed.policies[3].quotas == {128: 0.1, 256: 0.2, 512: 0.4, 1024: 0.3}
    assert composed.to_config()[2] == {"type": "novelty", "novelty_window": 1000}


def test_length_quota_shares_converge():
    buffer = full_buffer()
    policy = ComposedPolicy([LengthQuotaPolicy({128: 0.1, 256: 0.2, 512: 0.4, 1024: 0.3})])
    snapshot, rows = draw(policy, buffer)
    classes = policy.policies[0].classes(snapshot)[rows]
    shares = np.bincount(classes, minlength=4) / DRAWS
    assert np.abs(shares - [0.1, 0.2, 0.4, 0.3]).max() < TOLERANCE, shares


def test_a_quota_of_an_absent_class_is_shared_among_the_present_ones():
    buffer = full_buffer(max_length=500)  # nothing longer than 512
    policy = ComposedPolicy([LengthQuotaPolicy({128: 0.1, 256: 0.2, 512: 0.4, 1024: 0.3})])
    snapshot, rows = draw(policy, buffer)
    shares = np.bincount(policy.policies[0].classes(snapshot)[rows], minlength=4) / DRAWS
    assert np.abs(shares - np.array([0.1, 0.2, 0.4, 0.0]) / 0.7).max() < TOLERANCE, shares


def test_difficulty_weights_give_the_shares_and_unnamed_difficulties_none():
    buffer = full_buffer()
    policy = ComposedPolicy([DifficultyBucketPolicy({"easy": 0.2, "medium": 0.5})])  # hard not named
    snapshot, rows = draw(policy, buffer)
    names = [snapshot.difficulties[r] for r in rows]
    assert abs(names.count("easy") / DRAWS - 0.2 / 0.7) < TOLERANCE
    assert abs(names.count("medium") / DRAWS - 0.5 / 0.7) < TOLERANCE
    assert names.count("hard") == 0


def test_failure_replay_multiplies_the_odds_of_failed_episodes():
    buffer = full_buffer()
    policy = ComposedPolicy([FailureReplayPolicy(3.0)])
    snapshot, rows = draw(policy, buffer)
    failed = snapshot.solved == 0
    expected = 3.0 * failed.sum() / (3.0 * failed.sum() + (~failed).sum())
    assert abs(failed[rows].mean() - expected) < TOLERANCE


def test_novelty_never_repeats_within_its_window_while_the_buffer_allows():
    """Buffer of 500, window 300, 100 draws per window: 200 fresh samples
    remain at every window, so no key may come back within 300 draws."""
    buffer = full_buffer(500)
    novelty = NoveltyPolicy(300)
    policy = ComposedPolicy([novelty])
    history = []
    for _ in range(40):
        snapshot, rows = draw(policy, buffer, 100)
        assert len(set(rows.tolist())) == 100  # no repeat inside a window either
        history.extend(snapshot.keys[rows].tolist())
    for t, key in enumerate(history):
        assert key not in history[max(0, t - 300):t]
    assert len(set(history)) == 500  # and all samples get their turn


def test_novelty_repeats_only_when_the_buffer_is_too_small():
    buffer = full_buffer(150)
    policy = ComposedPolicy([NoveltyPolicy(100)])
    _, first = draw(policy, buffer, 100)
    _, second = draw(policy, buffer, 100)  # only 50 fresh: the other 50 must repeat
    assert len(set(second.tolist()) - set(first.tolist())) == 50


def test_policies_are_deterministic_given_the_buffer_and_cursor():
    a, b = full_buffer(seed=4), full_buffer(seed=4)
    pa, pb = policies_from_yaml(FOUR_POLICIES), policies_from_yaml(FOUR_POLICIES)
    for _ in range(3):
        assert draw(pa, a, 200)[1].tolist() == draw(pb, b, 200)[1].tolist()
    c = full_buffer(seed=4)
    pc = policies_from_yaml(FOUR_POLICIES)
    c.rng.load_state_dict(a.rng.state_dict())
    pc.load_state_dict(pa.state_dict())
    assert draw(pa, a, 200)[1].tolist() == draw(pc, c, 200)[1].tolist()


def test_windows_log_the_curriculum_metrics():
    buffer = full_buffer(300)
    window = RollingBatchPlanWindow(buffer, 8, policy=ComposedPolicy([FailureReplayPolicy(2.0)]),
                                    samples_per_window=120)
    first, second = window.next_window(), window.next_window()
    assert first.metrics["replay_hit_rate"] == 0.0 and second.metrics["replay_hit_rate"] > 0
    assert abs(sum(second.metrics["difficulty_distribution"].values()) - 1) < 1e-5
    rates = second.metrics["success_rate_by_difficulty"]
    snapshot = second.snapshot
    for name, rate in rates.items():
        solved = [s.solved for s in snapshot.samples if s.difficulty == name]
        assert rate == round(sum(solved) / len(solved), 6)


@pytest.mark.parametrize("text,mention", [
    ("policies:\n  - type: curiosity\n", "unknown type 'curiosity'"),
    ("policies:\n  - type: novelty\n    novelty_window: 3\n    window: 2\n", "unknown key window"),
    ("policies:\n  - type: novelty\n", "lacks novelty_window"),
    ("policy: []\n", "unknown key policy"),
    ("policies: []\n", "non-empty list"),
    ("policies:\n  - type: novelty\n    novelty_window: 0\n", "novelty_window"),
    ("policies:\n  - type: failure_replay\n    failure_weight: -1\n", "failure_weight"),
    ("policies:\n  - type: difficulty_bucket\n    weights: {easy: .nan}\n", "finite"),
    ("policies:\n  - type: difficulty_bucket\n    weights: {easy: 0}\n", "positive total"),
    ("policies:\n  - type: length_quota\n    quotas: {short: 1}\n", "quota edge 'short'"),
    ("policies:\n  - type: novelty\n    novelty_window: 2\n  - type: novelty\n    novelty_window: 3\n", "at most one"),
    ("policies:\n  - type: novelty\n    novelty_window: 2\n    novelty_window: 3\n", "not valid YAML"),
    ("policies: [", "not valid YAML"),
    # integers past any size, and digits that are not ASCII (int() reads some and raises on others)
    ("policies:\n  - type: novelty\n    novelty_window: 1000000000000000000000000000000\n", "[1, 2^26]"),
    ("policies:\n  - type: novelty\n    novelty_window: 67108865\n", "[1, 2^26]"),
    ("policies:\n  - type: length_quota\n    quotas: {1180591620717411303424: 1}\n", "[1, 2^32 - 1]"),
    ("policies:\n  - type: length_quota\n    quotas: {4294967296: 1}\n", "[1, 2^32 - 1]"),
    ("policies:\n  - type: length_quota\n    quotas: {'1180591620717411303424': 1}\n", "[1, 2^32 - 1]"),
    ("policies:\n  - type: length_quota\n    quotas: {'\u00b2': 1}\n", "quota edge '\u00b2'"),
    ("policies:\n  - type: length_quota\n    quotas: {'\u0663': 1}\n", "quota edge '\u0663'"),
    ("policies:\n  - type: length_quota\n    quotas: {'0128': 1}\n", "quota edge '0128'"),
    ("policies:\n  - type: length_quota\n    quotas: {128: 1, '128': 1}\n", "quota edge 128 is given twice"),
])
def test_policy_files_are_validated_strictly(text, mention):
    expect(errors.SAMPLING_POLICY_INVALID, policies_from_yaml, text, mention=mention)


def test_load_policies_reads_a_file(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(FOUR_POLICIES)
    assert len(load_policies(path).policies) == 4
    expect(errors.SAMPLING_POLICY_INVALID, load_policies, tmp_path / "missing.yaml", mention="cannot read")


def test_a_window_logs_quota_edge_of_5000_digits_is_refused_before_int_reads_it():
    from umlos_cuda.streams import policies_from_data

    data = {"policies": [{"type": "length_quota", "quotas": {"9" * 5000: 1}}]}
    expect(errors.SAMPLING_POLICY_INVALID, policies_from_data, data, "windows.jsonl",
           mention="is not a positive integer")


def test_a_window_log_header_asking_for_more_draws_than_a_buffer_holds_is_refused():
    """A header's ``samples_per_window`` sizes one allocation of draws: 10^12 is refused when the builder is
    made from the header, before anything is drawn (it allocated until MemoryError); 2^26 still builds."""
    from umlos_cuda.streams.window.rolling import RollingBatchPlanWindow

    header = RollingBatchPlanWindow(ReplayBuffer(8), 4, samples_per_window=4).header()
    for asked in (10**12, (1 << 26) + 1):
        expect(errors.WINDOW_LOG_INVALID, RollingBatchPlanWindow.from_header, {**header, "samples_per_window": asked},
               mention="samples_per_window must be an integer in [1, 67108864]")
    assert RollingBatchPlanWindow.from_header({**header, "samples_per_window": 1 << 26}).samples_per_window == 1 << 26


def test_a_policy_with_nothing_drawable_is_refused():
    buffer = full_buffer(50)
    policy = ComposedPolicy([DifficultyBucketPolicy({"very_hard": 1.0})])
    expect(errors.SAMPLING_POLICY_INVALID, policy.select, buffer.snapshot(), 5, buffer.rng, mention="no sample")
