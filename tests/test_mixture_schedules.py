"""Mixture schedules (docs/batching.md, "Mixture schedules"): the blend under a schedule
against a plain Python walk over the windows that evaluates the pieces itself (held and ramped weights at
each window's first position, a weight of 0 taking nothing), every stream read once in order across weight
changes, joins and retirements, the sample mixture's rows per component epoch, resume at any world size,
the fingerprint, the folder, the file a user writes and the command line."""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from test_batching_mixtures import plain_quotas

from umlos_cuda import errors
from umlos_cuda.batching.plans.config import BatchingConfig
from umlos_cuda.batching.plans.windows import ArrayLengths
from umlos_cuda.batching.plans.windows.blend import Blend, Part
from umlos_cuda.batching.plans.windows.io import load_mixed_plan, save_mixed_plan
from umlos_cuda.batching.plans.windows.mixed import MixedPlan
from umlos_cuda.batching.plans.windows.mixture import Component, MixtureDefinition
from umlos_cuda.batching.plans.windows.resume import WindowedRankReader
from umlos_cuda.batching.plans.windows.schedule import (MAX_RAMP_WINDOWS, MixSchedule, Piece, read_schedule,
                                                         schedule_from_spec)
from umlos_cuda.errors import UmlosError


def plain_weights(pieces, position):
    """The weights at ``position``, written out: the last piece starting at or before it, a ramp interpolated."""
    k = max(i for i, (at, _, _) in enumerate(pieces) if at <= position)
    at, weights, ramp = pieces[k]
    if not ramp:
        return [Fraction(w) for w in weights]
    nxt, after, _ = pieces[k + 1]
    t = Fraction(position - at, nxt - at)
    return [Fraction(a) + (Fraction(b) - Fraction(a)) * t for a, b in zip(weights, after)]


def plain_scheduled(pieces, per_epoch, caps, window, num_samples):
    """Each window's quotas, walking the windows one by one: weights at the window's first position, a component
    of weight 0 or with nothing left takes nothing, a short window is the last."""
    def share(size, weights, left, live, starts):
        masked = [left[i] if i in live else 0 for i in range(len(weights))]
        return plain_quotas(size, [w if w > 0 else 1 for w in weights], masked)
    return plain_windows(lambda m: plain_weights(pieces, m * window),
                         [None if c is None else c * n for c, n in zip(caps, per_epoch)], window, num_samples, share)


def plain_windows(weights_of, supplies, window, num_samples, share):
    """The windows one by one, each sized as every mixture's (``min(W, samples left, supply left)``, a short window
    the last) and shared by ``share(size, weights, left, live, starts)`` (the quotas, given what each stream has
    left and where it stands); a component of weight 0 or with nothing left is not live."""
    left = list(supplies)
    starts = [0] * len(left)
    out, done, m = [], 0, 0
    while True:
        weights = weights_of(m)
        live = [i for i, w in enumerate(weights) if w > 0 and (left[i] is None or left[i] > 0)]
        if not live:
            break
        size = window if num_samples is None else min(window, num_samples - done)
        if all(left[i] is not None for i in live):
            size = min(size, sum(left[i] for i in live))
        if size <= 0:
            break
        q = share(size, weights, left, live, starts)
        out.append(q)
        for i, qi in enumerate(q):
            starts[i] += qi
            if left[i] is not None:
                left[i] -= qi
        done += size
        m += 1
        if size < window:
            break
    return out


@st.composite
def scheduled(draw):
    d = draw(st.integers(1, 4))
    per_epoch = [draw(st.integers(1, 30)) for _ in range(d)]
    capped = draw(st.booleans())
    caps = [draw(st.integers(1, 3)) if capped else draw(st.one_of(st.none(), st.integers(1, 3))) for _ in range(d)]
    window = draw(st.integers(1, 40))
    num_samples = draw(st.one_of(st.none(), st.integers(1, 400))) if capped else draw(st.integers(1, 400))
    count = draw(st.integers(1, 5))
    ats = [0] + sorted(draw(st.sets(st.integers(1, 400), min_size=count - 1, max_size=count - 1)))
    pieces = []
    for k, at in enumerate(ats):
        weights = draw(st.lists(st.sampled_from([0, 0, 1, 2, 3, 0.5, 7]), min_size=d, max_size=d))
        if not any(weights):
            weights[draw(st.integers(0, d - 1))] = 1
        pieces.append((at, weights, k + 1 < len(ats) and draw(st.booleans())))
    return pieces, per_epoch, caps, window, num_samples


def as_schedule(pieces) -> MixSchedule:
    return MixSchedule(tuple(Piece(at, tuple(Fraction(w) for w in weights), ramp) for at, weights, ramp in pieces))


def blend_of(case) -> Blend:
    pieces, per_epoch, caps, window, num_samples = case
    parts = tuple(Part(1, n, c, f"c{i}") for i, (n, c) in enumerate(zip(per_epoch, caps)))
    return Blend(parts, window, num_samples, 5, as_schedule(pieces))


@settings(max_examples=150, deadline=None)
@given(scheduled())
def test_a_scheduled_blend_equals_the_plain_walk_and_reads_every_stream_once_in_order(case):
    pieces, per_epoch, caps, window, num_samples = case
    try:
        blend = blend_of(case)
    except UmlosError as exc:  # a schedule whose first window has no live component holds no samples
        assert plain_scheduled(pieces, per_epoch, caps, window, num_samples) == [] and "no samples" in exc.message
        return
    expected = plain_scheduled(pieces, per_epoch, caps, window, num_samples)
    assert [list(blend.quotas(m)) for m in range(blend.num_windows)] == expected
    assert blend.total == sum(map(sum, expected))
    seen: list[list[int]] = [[] for _ in per_epoch]
    for m in range(blend.num_windows):
        weights = plain_weights(pieces, m * window)
        component, position = blend.merge(m)
        assert np.bincount(component, minlength=len(per_epoch)).tolist() == expected[m]
        for i in range(len(per_epoch)):
            mine = position[component == i].tolist()
            assert not mine or weights[i] > 0  # a component of weight 0 (not joined, retired) takes nothing
            seen[i] += mine
    for i, positions in enumerate(seen):  # each stream read in order from 0, nothing repeated, nothing skipped
        assert positions == list(range(len(positions)))
        assert blend.stream_ends()[i] == len(positions)
        if caps[i] is not None:
            assert len(positions) <= caps[i] * per_epoch[i]
    for m in range(blend.num_windows):  # stream starts are the running sums of the quotas
        assert list(blend.stream_starts(m)) == [sum(q[i] for q in expected[:m]) for i in range(len(per_epoch))]


def test_a_window_that_straddles_a_change_keeps_the_weights_it_started_with():
    pieces = [(0, [1, 0], False), (25, [0, 1], False)]  # a change inside window 2 (positions 20 .. 29)
    blend = blend_of((pieces, [100, 100], [None, None], 10, 60))
    assert [list(blend.quotas(m)) for m in range(6)] == [[10, 0]] * 3 + [[0, 10]] * 3
    assert [(s.first, s.windows) for s in blend.segments] == [(0, 3), (3, 3)]
    ramp = blend_of(([(0, [1, 0], True), (40, [0, 1], False)], [100, 100], [None, None], 10, 60))
    assert [list(ramp.quotas(m)) for m in range(6)] == [[10, 0], [8, 2], [5, 5], [3, 7], [0, 10], [0, 10]]


def test_a_component_joins_retires_and_comes_back_where_it_stopped():
    config = BatchingConfig.throughput(token_budget=4096, bucket_edges=(), overflow_max=1024, seed=3)
    comps = (Component(ArrayLengths(np.full(50, 7)), 1, 1, None, "web"),
             Component(ArrayLengths(np.arange(1, 31)), 1, 2, None, "code"))
    schedule = as_schedule([(0, [1, 0], False), (40, [1, 1], False), (80, [1, 0], False), (120, [1, 1], False)])
    definition = MixtureDefinition(config, comps, 10, 200, schedule)
    code = []
    for m in range(definition.num_windows):
        window = definition.window_of(m, "numpy")
        mine = list(zip(window.epoch[window.component == 1].tolist(), window.row[window.component == 1].tolist()))
        assert (len(mine) > 0) == (4 <= m < 8 or m >= 12)
        code += mine
    assert len(code) == 20 + 40 and len(set(code)) == len(code)  # nothing of code's stream seen twice
    first_epoch = [r for e, r in code if e == 0]
    assert sorted(first_epoch) == list(range(30))  # its first epoch whole across the retirement: none lost
    _, rows = definition.stream_rows(1, 0, 60)
    assert [r for _, r in code] == rows.tolist()  # in its own stream's order


@settings(max_examples=20, deadline=None)
@given(scheduled(), st.integers(1, 5), st.data())
def test_a_scheduled_plan_resumes_at_any_step_and_world_size(case, world, data):
    pieces, per_epoch, caps, window, num_samples = case
    config = BatchingConfig.throughput(token_budget=2048, bucket_edges=(64,), overflow_max=1024, seed=11)
    rng = np.random.default_rng(len(per_epoch))
    comps = tuple(Component(ArrayLengths(rng.integers(1, 1024, n)), 1, i, c, f"c{i}")
                  for i, (n, c) in enumerate(zip(per_epoch, caps)))
    try:
        definition = MixtureDefinition(config, comps, window, num_samples, as_schedule(pieces))
    except UmlosError:
        return
    assert_resumes_at_any_step(definition, world, data)


def assert_resumes_at_any_step(definition, world, data):
    """A mixed plan stopped at a step drawn from ``data`` resumes on ``world`` ranks to the uninterrupted run."""
    plan = MixedPlan.build(definition, backend="numpy")
    full = [spec for _, spec in plan.iter_from(0)]
    stop = data.draw(st.integers(0, plan.num_microbatches))
    reader = WindowedRankReader(plan, 0, 1)
    steps = iter(reader)
    for _ in range(stop):
        next(steps)
    rest = [item for rank in range(world) for item in WindowedRankReader.resume(plan, reader.cursor(), rank, world)]
    assert sorted(k for _, k, _ in rest) == list(range(stop, plan.num_microbatches))
    assert all(spec == full[k] for _, k, spec in rest)


def _definition(schedule=None, window=16):
    config = BatchingConfig.throughput(token_budget=4096, bucket_edges=(128,), overflow_max=1024, seed=3)
    rng = np.random.default_rng(4)
    comps = (Component(ArrayLengths(rng.integers(1, 1024, 300)), 0.7, 1, None, "web"),
             Component(ArrayLengths(rng.integers(1, 1024, 40)), 0.3, 2, 3, "code"))
    return MixtureDefinition(config, comps, window, 400, schedule)


def test_the_fingerprint_holds_the_schedule_only_when_there_is_one(tmp_path):
    fixed = MixedPlan.build(_definition())
    assert "schedule" not in fixed.header()["mixture"]
    held = as_schedule([(0, [0.7, 0.3], False)])  # the components' own weights, as a schedule
    plans = [MixedPlan.build(_definition(s)) for s in (
        held, as_schedule([(0, [1, 0], False), (100, [1, 1], False)]),
        as_schedule([(0, [1, 0], False), (101, [1, 1], False)]),
        as_schedule([(0, [1, 0], True), (100, [1, 1], False)]))]
    assert [list(fixed.definition.quotas(m)) for m in range(25)] == [list(plans[0].definition.quotas(m))
                                                                      for m in range(25)]
    assert len({fixed.fingerprint, *(p.fingerprint for p in plans)}) == 5
    save_mixed_plan(plans[3], tmp_path / "mix", lengths_paths=[None, None])
    again = load_mixed_plan(tmp_path / "mix", lengths=[c.source for c in plans[3].definition.components])
    assert again.fingerprint == plans[3].fingerprint and again.definition.schedule == plans[3].definition.schedule
    assert again.microbatch(9) == plans[3].microbatch(9)
    meta = json.loads((tmp_path / "mix" / "meta.json").read_text())
    meta["mixture"]["schedule"]["pieces"][1]["at"] = 99
    (tmp_path / "mix" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UmlosError) as info:
        load_mixed_plan(tmp_path / "mix", lengths=[c.source for c in plans[3].definition.components])
    assert info.value.code in (errors.PLAN_FINGERPRINT_MISMATCH, errors.PLAN_FORMAT_INVALID)
    meta["mixture"]["schedule"]["pieces"][0]["weights"][0] = [2, 2]  # not in lowest terms
    (tmp_path / "mix" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UmlosError) as info:
        load_mixed_plan(tmp_path / "mix", lengths=[c.source for c in plans[3].definition.components])
    assert info.value.code == errors.PLAN_FORMAT_INVALID and "canonical" in info.value.message


def test_a_file_in_steps_scales_by_the_global_batch_and_unnamed_components_keep_their_weight():
    spec = {"unit": "steps", "global_batch": 32, "pieces": [{"at": 0, "weights": {"code": 0}},
                                                             {"at": 5, "weights": {"web": 2}, "ramp": True},
                                                             {"at": 9, "weights": {"web": 1, "code": 1}}]}
    schedule = schedule_from_spec(spec, ["web", "code"], [Fraction(7, 10), Fraction(3, 10)])
    assert [p.at for p in schedule.pieces] == [0, 160, 288]
    assert [p.weights for p in schedule.pieces] == [(Fraction(7, 10), 0), (2, Fraction(3, 10)), (1, 1)]
    assert schedule.weights_at(224) == (Fraction(3, 2), Fraction(13, 20))


@pytest.mark.parametrize("spec, text", [
    ({"pieces": []}, "pieces must be a list of 1 to"),
    ({"pieces": [{"at": 1, "weights": {}}]}, "must be 0 for the first piece"),
    ({"pieces": [{"at": 0, "weights": {}}, {"at": 0, "weights": {}}]}, "grow strictly"),
    ({"pieces": [{"at": 0, "weights": {"books": 1}}]}, "'books', which is no component"),
    ({"pieces": [{"at": 0, "weights": {"web": -1}}]}, "weight of 'web'"),
    ({"pieces": [{"at": 0, "weights": {"web": float("inf")}}]}, "weight of 'web'"),
    ({"pieces": [{"at": 0, "weights": {"web": "1"}}]}, "weight of 'web'"),
    ({"pieces": [{"at": 0, "weights": {"web": 0, "code": 0}}]}, "at least one > 0"),
    ({"pieces": [{"at": 0, "weights": {}, "ramp": True}]}, "cannot ramp"),
    ({"pieces": [{"at": 0, "weights": {}, "ramp": 1}]}, "ramp must be true or false"),
    ({"pieces": [{"at": 0.5, "weights": {}}]}, "at"),
    ({"pieces": [{"at": 0, "weights": [1, 2]}]}, "weights must be an object"),
    ({"unit": "steps", "pieces": [{"at": 0, "weights": {}}]}, "global_batch"),
    ({"unit": "samples", "global_batch": 4, "pieces": [{"at": 0, "weights": {}}]}, "global_batch"),
    ({"unit": "steps", "global_batch": 0, "pieces": [{"at": 0, "weights": {}}]}, "global_batch"),
    ({"unit": "tokens", "pieces": [{"at": 0, "weights": {}}]}, "unit must be 'samples' or 'steps'"),
    ({"pieces": [{"at": 0, "weights": {}}], "extra": 1}, "extra"),
    ([1], "schedule"),
])
def test_a_schedule_file_is_refused_with_the_reason(spec, text):
    with pytest.raises(UmlosError) as info:
        schedule_from_spec(spec, ["web", "code"], [Fraction(1), Fraction(1)], "sched.json")
    assert info.value.code == errors.BATCHING_CONFIG_INVALID and text in info.value.message
    assert info.value.message.startswith("sched.json")


def test_ramps_over_too_many_windows_and_a_schedule_of_another_width_are_refused():
    long_ramp = as_schedule([(0, [1, 1], True), (MAX_RAMP_WINDOWS + 1, [1, 2], False)])
    with pytest.raises(UmlosError, match="ramps cover"):
        Blend((Part(1, 5, None, "a"), Part(1, 5, None, "b")), 1, 10**9, 0, long_ramp)
    assert Blend((Part(1, 5, None, "a"), Part(1, 5, None, "b")), 1, 50, 0, long_ramp).total == 50  # only to its end
    with pytest.raises(UmlosError, match="2 weights per piece"):
        Blend((Part(1, 5, None, "a"), Part(1, 5, None, "b")), 4, 50, 0, as_schedule([(0, [1], False)]))


def test_read_schedule_names_a_missing_or_malformed_file(tmp_path):
    with pytest.raises(UmlosError, match="no such schedule file"):
        read_schedule(str(tmp_path / "none.json"), ["a"], [Fraction(1)])
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(UmlosError) as info:
        read_schedule(str(tmp_path / "bad.json"), ["a"], [Fraction(1)])
    assert info.value.code == errors.BATCHING_CONFIG_INVALID and "bad.json" in info.value.message


def test_plan_build_takes_a_schedule_file_and_plan_info_shows_it(tmp_path, capsys):
    from umlos_cuda.batching import LengthCache
    from umlos_cuda.cli import main

    rng = np.random.default_rng(2)
    paths = []
    for name, n in (("web", 900), ("code", 200)):
        paths.append(str(tmp_path / f"{name}.jsonl"))
        LengthCache.from_arrays(None, rng.integers(1, 1024, n).astype(np.uint32), "t").write(paths[-1])
    (tmp_path / "s.json").write_text(json.dumps({"unit": "steps", "global_batch": 64, "pieces": [
        {"at": 0, "weights": {"code": 0}}, {"at": 4, "weights": {"code": 0.3}}]}))
    args = ["plan", "build", "--window", "128", "--bucket-edges", "128,512", "--overflow-max", "1024",
            "--token-budget", "4096", "--num-samples", "1000", "--quiet", "--mix", f"{paths[0]}:0.7", f"{paths[1]}:0.3"]
    assert main([*args, "--mix-schedule", str(tmp_path / "s.json"), "--output", str(tmp_path / "p")]) == 0
    plan = load_mixed_plan(tmp_path / "p")
    assert [list(plan.definition.quotas(m)) for m in (0, 1, 2)] == [[128, 0], [128, 0], [90, 38]]
    capsys.readouterr()
    assert main(["plan", "info", str(tmp_path / "p")]) == 0
    text = capsys.readouterr().out
    assert "schedule from sample 0: web 0.7, code 0 (held)" in text and "schedule from sample 256:" in text
    assert main(["plan", "info", str(tmp_path / "p"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["schedule"] == [
        {"at": 0, "ramp": False, "weights": {"web": 0.7, "code": 0.0}},
        {"at": 256, "ramp": False, "weights": {"web": 0.7, "code": 0.3}}]
    assert main(["plan", "verify", str(tmp_path / "p"), "--windows", "3"]) == 0
    assert main([*args, "--output", str(tmp_path / "q")]) == 0
    assert load_mixed_plan(tmp_path / "q").fingerprint != plan.fingerprint
    capsys.readouterr()
    assert main(["plan", "build", "--window", "128", "--source", paths[0], "--bucket-edges", "128",
                 "--overflow-max", "1024", "--token-budget", "4096", "--mix-schedule", str(tmp_path / "s.json"),
                 "--output", str(tmp_path / "r")]) != 0
    assert "--mix-schedule needs --mix" in capsys.readouterr().err


def test_a_mixture_of_sequences_takes_the_same_schedule(tmp_path):
    from test_batching_sequence_mixtures import _parts

    from umlos_cuda.batching.plans.windows import SequenceMixture
    from umlos_cuda.batching.plans.windows.sequences_io import load_mixed_sequences, save_mixed_sequences

    schedule = as_schedule([(0, [1, 0], False), (30, [1, 1], True), (70, [0, 1], False)])
    fixed = SequenceMixture.build(_parts(), 10, 120, 3)
    mixture = SequenceMixture.build(_parts(), 10, 120, 3, schedule=schedule)
    parts = tuple(Part(c.weight, s, c.max_epochs, c.name) for c, s in zip(mixture.components, mixture.per_epoch))
    blend = Blend(parts, 10, 120, 3, schedule)
    assert [mixture.locate(k) for k in range(mixture.total)] == [blend.locate(k) for k in range(blend.total)]
    assert mixture.blend.quotas(0) == (10, 0) and "schedule" not in fixed.header()
    assert mixture.fingerprint != fixed.fingerprint and mixture.header()["schedule"] == schedule.to_dict()
    save_mixed_sequences(mixture, tmp_path / "mix")
    again = load_mixed_sequences(tmp_path / "mix", tokens=[source for _, source, *_ in _parts()])
    assert again.fingerprint == mixture.fingerprint and again.schedule == schedule
    assert [again.locate(k) for k in (0, 55, mixture.total - 1)] == [mixture.locate(k)
                                                                     for k in (0, 55, mixture.total - 1)]


def test_plan_cut_takes_a_schedule_file(tmp_path, capsys):
    from token_cases import random_sequences, write_megatron

    from umlos_cuda.batching.plans.windows.sequences_io import load_mixed_sequences
    from umlos_cuda.cli import main

    web = write_megatron(tmp_path / "web", random_sequences(120, seed=2, high=50))
    code = write_megatron(tmp_path / "code", random_sequences(30, seed=3, high=50))
    (tmp_path / "s.json").write_text(json.dumps({"pieces": [{"at": 0, "weights": {"code": 0}},
                                                            {"at": 64, "weights": {"web": 0}}]}))
    out = tmp_path / "mix"
    assert main(["plan", "cut", "--mix", f"{web}:0.7", f"{code}:0.3", "--num-samples", "128", "--sequence-length",
                 "16", "--window", "16", "--eos", "0", "--mix-schedule", str(tmp_path / "s.json"), "--quiet",
                 "--output", str(out)]) == 0
    mixture = load_mixed_sequences(out)
    assert [mixture.blend.quotas(m) for m in (0, 3, 4, 7)] == [(16, 0), (16, 0), (0, 16), (0, 16)]
    capsys.readouterr()
    assert main(["plan", "info", str(out)]) == 0
    assert "schedule from sample 64: web 0, code 0.3 (held)" in capsys.readouterr().out


def test_pieces_take_ints_floats_and_numpy_numbers_exactly_and_refuse_the_rest():
    schedule = MixSchedule((Piece(np.int64(0), (1, 0.5)), Piece(10, (np.float32(0.25), Fraction(1, 3)))))
    assert schedule.pieces[1].weights == (Fraction(1, 4), Fraction(1, 3)) and type(schedule.pieces[0].at) is int
    assert schedule.to_dict()["pieces"][0]["weights"] == [[1, 1], [1, 2]]
    for pieces, text in [((Piece(0, [1]),), "tuple of weights"), ((Piece(0, (True,)),), "finite numbers >= 0"),
                         ((Piece(0, (float("nan"),)),), "finite numbers >= 0"), ((Piece(0, ("1",)),), "finite"),
                         ((Piece(0, (1,)), Piece(5, (1, 2))), "has 2 weights"), ((Piece(0, (1,), ramp=None),), "ramp"),
                         ((Piece(0, (1,)), Piece(2**64, (1,))), "below 2^64"), ((), "1 to 4096 pieces")]:
        with pytest.raises(UmlosError) as info:
            MixSchedule(pieces)
        assert info.value.code == errors.BATCHING_CONFIG_INVALID and text in info.value.message
