"""Token quotas (docs/batching.md, "Token quotas"): the blend whose weights count tokens against a plain Python
greedy that gives each place of a window, one by one, to the live component with the smallest (tokens taken in the
window + its next sample's) / weight; the stated bound per window; every stream read once in order under schedules
and caps; a sample mixture's rows once per component epoch; resume at any world size; the fingerprint and the folder;
the skew at 1:1 sample weights fixed; the command line."""

from __future__ import annotations

import json
import shutil
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from test_mixture_schedules import as_schedule, assert_resumes_at_any_step, plain_weights, plain_windows, scheduled

from umlos_cuda import errors
from umlos_cuda.batching.plans.config import BatchingConfig
from umlos_cuda.batching.plans.windows import ArrayLengths
from umlos_cuda.batching.plans.windows.blend import MAX_TOKEN_WINDOWS, Blend, Part, token_quotas
from umlos_cuda.batching.plans.windows.io import load_mixed_plan, save_mixed_plan
from umlos_cuda.batching.plans.windows.mixed import MixedPlan
from umlos_cuda.batching.plans.windows.mixture import Component, MixtureDefinition
from umlos_cuda.errors import UmlosError


def plain_window(size, weights, left, lengths, starts):
    """One window's quotas, place by place: among the components with a weight > 0 and a sample left, the one with
    the smallest (tokens taken + next sample's length) / weight (exact), ties to the lower index, takes its next."""
    taken = [0] * len(weights)
    tokens = [0] * len(weights)
    for _ in range(size):
        best = None
        for i, w in enumerate(weights):
            if w > 0 and (left[i] is None or taken[i] < left[i]):
                key = Fraction(tokens[i] + lengths(i, starts[i] + taken[i])) / Fraction(w)
                if best is None or key < best[0]:
                    best = (key, i)
        if best is None:
            break
        i = best[1]
        tokens[i] += lengths(i, starts[i] + taken[i])
        taken[i] += 1
    return taken


def plain_walk(weights_of, supplies, window, num_samples, lengths):
    """Every window's quotas by :func:`plain_window`, the windows one by one (sized as every mixture's)."""
    return plain_windows(weights_of, supplies, window, num_samples,
                         lambda size, weights, left, live, starts: plain_window(size, weights, left, lengths, starts))


def stream_lengths(arrays):
    """A blend's ``lengths``: stream position ``t`` of component ``i`` is ``arrays[i][t mod N_i]``."""
    def lengths(i, start, count):
        return arrays[i][(start + np.arange(count)) % arrays[i].shape[0]]
    return lengths


@st.composite
def token_case(draw):
    pieces, per_epoch, caps, window, num_samples = draw(scheduled())
    arrays = [np.asarray(draw(st.lists(st.integers(0, draw(st.sampled_from([3, 40, 1000]))), min_size=n,
                                       max_size=n)), dtype=np.int64) for n in per_epoch]
    fixed = draw(st.booleans()) and all(w > 0 for w in pieces[0][1])
    if fixed:  # the first piece's weights as the components' own, no schedule; floats exercise the exact path
        pieces = [(0, [draw(st.sampled_from([w, 0.3, 0.7, 1e-3])) for w in pieces[0][1]], False)]
    return pieces, per_epoch, caps, window, num_samples, arrays, fixed


@settings(max_examples=150, deadline=None)
@given(token_case())
def test_token_quotas_equal_the_plain_greedy_and_read_every_stream_once_in_order(case):
    pieces, per_epoch, caps, window, num_samples, arrays, fixed = case
    lengths = stream_lengths(arrays)
    parts = tuple(Part(pieces[0][1][i] if fixed else 1, n, c, f"c{i}")
                  for i, (n, c) in enumerate(zip(per_epoch, caps)))
    supplies = [None if c is None else c * n for c, n in zip(caps, per_epoch)]
    expected = plain_walk(lambda m: plain_weights(pieces, m * window), supplies, window, num_samples,
                          lambda i, t: int(arrays[i][t % per_epoch[i]]))
    try:
        blend = Blend(parts, window, num_samples, 5, None if fixed else as_schedule(pieces), lengths)
    except UmlosError as exc:
        assert expected == [] and "no samples" in exc.message
        return
    assert [list(blend.quotas(m)) for m in range(blend.num_windows)] == expected
    seen: list[list[int]] = [[] for _ in per_epoch]
    for m in range(blend.num_windows):
        component, position = blend.merge(m)
        for i in range(len(per_epoch)):
            seen[i] += position[component == i].tolist()
        assert list(blend.stream_starts(m)) == [sum(q[i] for q in expected[:m]) for i in range(len(per_epoch))]
    for i, positions in enumerate(seen):  # nothing repeated, nothing skipped, within the cap
        assert positions == list(range(len(positions))) and blend.stream_ends()[i] == len(positions)
        assert supplies[i] is None or len(positions) <= supplies[i]


@settings(max_examples=150, deadline=None)
@given(token_case())
def test_each_window_holds_each_component_within_the_stated_bound(case):
    """docs/batching.md, "Token quotas", rule 3: in a window where every live component still has a sample after
    it, with ``T`` the window's tokens, ``S`` the live weights' sum and ``n_j`` the length of stream ``j``'s first
    sample after the window: ``-n_i <= T_i - w_i T / S <= w_i / S * sum(n_j)``."""
    pieces, per_epoch, caps, window, num_samples, arrays, fixed = case
    parts = tuple(Part(pieces[0][1][i] if fixed else 1, n, c, f"c{i}")
                  for i, (n, c) in enumerate(zip(per_epoch, caps)))
    try:
        blend = Blend(parts, window, num_samples, 5, None if fixed else as_schedule(pieces), stream_lengths(arrays))
    except UmlosError:
        return
    supplies = blend.supplies
    for m in range(blend.num_windows):
        weights = [Fraction(w) for w in plain_weights(pieces, m * window)]
        starts, quotas = blend.stream_starts(m), blend.quotas(m)
        live = [i for i, w in enumerate(weights) if w > 0 and (supplies[i] is None or supplies[i] > starts[i])]
        if any(supplies[i] is not None and supplies[i] <= starts[i] + quotas[i] for i in live):
            continue  # a stream runs out in this window: it has no next sample, the bound is not stated
        at = lambda i, t: int(arrays[i][t % per_epoch[i]])  # noqa: E731
        tokens = {i: sum(at(i, t) for t in range(starts[i], starts[i] + quotas[i])) for i in live}
        after = {i: at(i, starts[i] + quotas[i]) for i in live}
        total, weight = sum(tokens.values()), sum(weights[i] for i in live)
        for i in live:
            off = tokens[i] - weights[i] * total / weight
            assert -after[i] <= off <= weights[i] / weight * sum(after.values())


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_a_window_read_from_a_hint_equals_the_plain_greedy(data):
    """The blend reads each stream for the last window's quota and an eighth more, and further while a component
    takes all it read: whatever the hint, the quotas are the greedy's over the whole window."""
    d = data.draw(st.integers(1, 3))
    size = data.draw(st.integers(1, 400))
    arrays = [np.asarray(data.draw(st.lists(st.integers(0, data.draw(st.sampled_from([2, 50, 2000]))), min_size=1,
                                            max_size=300)), dtype=np.int64) for _ in range(d)]
    weights = [Fraction(data.draw(st.sampled_from([1, 2, 5, 0.25]))) for _ in range(d)]
    remaining = [data.draw(st.one_of(st.none(), st.integers(1, 2 * size))) for _ in range(d)]
    starts = [data.draw(st.integers(0, 500)) for _ in range(d)]
    hint = [data.draw(st.integers(0, size)) for _ in range(d)]
    lengths = stream_lengths(arrays)
    got = token_quotas(size, weights, remaining, starts, lengths, hint)
    assert got == token_quotas(size, weights, remaining, starts, lengths)
    assert got == plain_window(size, weights, remaining, lambda i, t: int(arrays[i][t % arrays[i].shape[0]]), starts)


def _config(seed=11):
    return BatchingConfig.throughput(token_budget=4096, bucket_edges=(64, 512), overflow_max=4096, seed=seed)


def test_two_datasets_ten_times_apart_in_length_at_one_to_one_give_one_to_one_tokens():
    """The skew Megatron Energon#212 reports: 1:1 sample weights give 10:1 tokens; 1:1 token weights give 1:1 in
    every window, within the bound."""
    rng = np.random.default_rng(3)
    short, long = ArrayLengths(rng.integers(90, 111, 3000)), ArrayLengths(rng.integers(900, 1101, 3000))
    comps = (Component(short, 1, 1, None, "short"), Component(long, 1, 2, None, "long"))
    ratios = {}
    for unit in ("samples", "tokens"):
        mixture = MixtureDefinition(_config(), comps, 1024, 4096, unit=unit)
        ratios[unit] = []
        for m in range(mixture.num_windows):
            window = mixture.window_of(m)
            got = window.lengths(mixture.sources).astype(np.int64)
            t_short, t_long = (int(got[window.component == i].sum()) for i in (0, 1))
            ratios[unit].append(t_long / t_short)
            if unit == "tokens":  # within the bound: each side off its half by at most one long sample
                assert abs(t_long - (t_short + t_long) / 2) <= 1100
    assert all(9 < r < 11 for r in ratios["samples"])
    assert all(0.97 < r < 1.03 for r in ratios["tokens"])


def test_a_sample_mixture_counted_in_tokens_reads_each_row_once_per_component_epoch():
    rng = np.random.default_rng(5)
    comps = (Component(ArrayLengths(rng.integers(1, 60, 70)), 2, 1, None, "a"),
             Component(ArrayLengths(rng.integers(100, 900, 50)), 1, 2, 3, "b"))
    mixture = MixtureDefinition(_config(), comps, 32, 900, unit="tokens")
    held: list[list[tuple[int, int]]] = [[], []]
    for m in range(mixture.num_windows):
        window = mixture.window_of(m)
        assert np.bincount(window.component, minlength=2).tolist() == list(mixture.quotas(m))
        for c, e, r in zip(window.component.tolist(), window.epoch.tolist(), window.row.tolist()):
            held[c].append((e, r))
        assert all(mixture.sample(m * 32 + k) == (c, e, r) for k, (c, e, r) in
                   enumerate(zip(window.component.tolist(), window.epoch.tolist(), window.row.tolist())))
    for i, pairs in enumerate(held):
        epochs, rows = mixture.stream_rows(i, 0, len(pairs))
        assert pairs == list(zip(epochs.tolist(), rows.tolist()))  # the stream in order
        assert len(set(pairs)) == len(pairs)  # no (epoch, row) twice
        n = comps[i].source.count
        for e in range(len(pairs) // n):  # every whole epoch holds every row
            assert sorted(r for ep, r in pairs if ep == e) == list(range(n))
    assert mixture.stream_starts(mixture.num_windows - 1)[1] + mixture.quotas(mixture.num_windows - 1)[1] <= 150


@settings(max_examples=20, deadline=None)
@given(scheduled(), st.integers(1, 5), st.data())
def test_a_token_quota_plan_resumes_at_any_step_and_world_size(case, world, data):
    pieces, per_epoch, caps, window, num_samples = case
    rng = np.random.default_rng(len(per_epoch))
    comps = tuple(Component(ArrayLengths(rng.integers(1, 1024, n)), 1, i, c, f"c{i}")
                  for i, (n, c) in enumerate(zip(per_epoch, caps)))
    try:
        definition = MixtureDefinition(_config(), comps, window, num_samples, as_schedule(pieces), "tokens")
    except UmlosError:
        return
    assert_resumes_at_any_step(definition, world, data)


def _mixture(unit="samples", num_samples=400):
    rng = np.random.default_rng(4)
    comps = (Component(ArrayLengths(rng.integers(1, 100, 300)), 0.7, 1, None, "web"),
             Component(ArrayLengths(rng.integers(100, 1024, 40)), 0.3, 2, 3, "code"))
    return MixtureDefinition(_config(3), comps, 16, num_samples, unit=unit)


def test_the_fingerprint_holds_the_unit_only_when_it_is_not_samples(tmp_path):
    plans = {unit: MixedPlan.build(_mixture(unit)) for unit in ("samples", "tokens")}
    assert "unit" not in plans["samples"].header()["mixture"]
    assert plans["tokens"].header()["mixture"]["unit"] == "tokens"
    assert plans["samples"].fingerprint != plans["tokens"].fingerprint
    quotas = [plans[u].definition.quotas(3) for u in plans]  # the same window sizes, shared otherwise
    assert quotas[0] != quotas[1] and sum(quotas[0]) == sum(quotas[1]) == 16
    sources = [c.source for c in plans["tokens"].definition.components]
    save_mixed_plan(plans["tokens"], tmp_path / "mix", lengths_paths=[None, None])
    again = load_mixed_plan(tmp_path / "mix", lengths=sources)
    assert again.fingerprint == plans["tokens"].fingerprint and again.definition.unit == "tokens"
    assert again.microbatch(7) == plans["tokens"].microbatch(7)
    meta = json.loads((tmp_path / "mix" / "meta.json").read_text())
    for unit, code in (("samples", errors.PLAN_FORMAT_INVALID), ([1], errors.PLAN_FORMAT_INVALID)):
        meta["mixture"]["unit"] = unit
        (tmp_path / "mix" / "meta.json").write_text(json.dumps(meta))
        with pytest.raises(UmlosError) as info:
            load_mixed_plan(tmp_path / "mix", lengths=sources)
        assert info.value.code == code and "mixture.unit" in info.value.message
    del meta["mixture"]["unit"]  # the same folder claiming sample quotas: its index no longer hashes
    (tmp_path / "mix" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UmlosError) as info:
        load_mixed_plan(tmp_path / "mix", lengths=sources)
    assert info.value.code in (errors.PLAN_FINGERPRINT_MISMATCH, errors.PLAN_FORMAT_INVALID)


def test_an_unknown_unit_and_too_many_token_windows_are_refused():
    with pytest.raises(UmlosError) as info:
        _mixture("bytes")
    assert info.value.code == errors.BATCHING_CONFIG_INVALID and "samples, tokens, loss_tokens" in info.value.message
    parts = (Part(1, 10),)
    with pytest.raises(UmlosError) as info:  # refused before any quota is computed (no lengths read)
        Blend(parts, 1, MAX_TOKEN_WINDOWS + 1, 0, None, lambda i, s, c: pytest.fail("lengths read"))
    assert info.value.code == errors.BATCHING_CONFIG_INVALID and "larger window" in info.value.message
    assert Blend(parts, 1, MAX_TOKEN_WINDOWS, 0, None, lambda i, s, c: np.ones(c)).num_windows == MAX_TOKEN_WINDOWS


def test_plan_build_counts_tokens_with_mix_unit_and_plan_info_shows_it(tmp_path, capsys):
    from umlos_cuda.batching import LengthCache
    from umlos_cuda.cli import main

    rng = np.random.default_rng(2)
    paths = []
    for name, low in (("short", 10), ("long", 100)):
        paths.append(str(tmp_path / f"{name}.jsonl"))
        LengthCache.from_arrays(None, rng.integers(low, 10 * low, 500).astype(np.uint32), "t").write(paths[-1])
    args = ["plan", "build", "--window", "128", "--bucket-edges", "128,512", "--overflow-max", "1024",
            "--token-budget", "4096", "--num-samples", "600", "--quiet", "--mix", f"{paths[0]}:1", f"{paths[1]}:1"]
    assert main([*args, "--mix-unit", "tokens", "--output", str(tmp_path / "p")]) == 0
    plan = load_mixed_plan(tmp_path / "p")
    assert plan.definition.unit == "tokens" and plan.definition.quotas(0)[0] > 100
    capsys.readouterr()
    assert main(["plan", "info", str(tmp_path / "p")]) == 0
    assert "weights count tokens" in capsys.readouterr().out
    assert main(["plan", "info", str(tmp_path / "p"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["unit"] == "tokens"
    assert main(["plan", "verify", str(tmp_path / "p"), "--windows", "3"]) == 0
    assert main([*args, "--mix-unit", "samples", "--output", str(tmp_path / "q")]) == 0
    same = load_mixed_plan(tmp_path / "q")
    assert same.definition.unit == "samples" and same.definition.quotas(0) == (64, 64)
    assert main([*args, "--output", str(tmp_path / "r")]) == 0  # the default is samples: the same plan
    assert load_mixed_plan(tmp_path / "r").fingerprint == same.fingerprint != plan.fingerprint
    capsys.readouterr()
    assert main(["plan", "build", "--window", "128", "--source", paths[0], "--bucket-edges", "128",
                 "--overflow-max", "1024", "--token-budget", "4096", "--mix-unit", "tokens",
                 "--output", str(tmp_path / "s")]) != 0
    assert "--mix-unit needs --mix" in capsys.readouterr().err


def test_plan_cut_refuses_a_token_unit_and_takes_samples(tmp_path, capsys):
    from token_cases import random_sequences, write_megatron

    from umlos_cuda.cli import main

    store = write_megatron(tmp_path / "web", random_sequences(60, seed=2, high=50))
    args = ["plan", "cut", "--mix", f"{store}:1", f"{store}:1", "--num-samples", "20", "--sequence-length", "16",
            "--window", "16", "--eos", "0", "--quiet"]
    for unit in ("tokens", "loss-tokens"):
        assert main([*args, "--mix-unit", unit, "--output", str(tmp_path / unit)]) != 0
        err = capsys.readouterr().err
        assert errors.BATCHING_CONFIG_INVALID in err and "sample quotas are its token quotas" in err
    assert main([*args, "--mix-unit", "samples", "--output", str(tmp_path / "cut")]) == 0


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Two token stores of prompt/response records (loss masks with zeros) and a length cache of the first."""
    from token_cases import make_store

    root = tmp_path_factory.mktemp("stores")
    made = []
    for name, count, seed in (("a", 120, 1), ("b", 40, 2)):
        (root / name).mkdir()
        make_store(root / name, count, seed)
        made.append(str(root / name / "store"))
    return made


def test_loss_token_quotas_equal_the_plain_greedy_over_each_rows_loss_mask(stores):
    from umlos_cuda.batching.sources import open_source

    sources = [open_source(path) for path in stores]
    masks = [[int(np.count_nonzero(s.arrays(r)[1])) for r in range(s.count)] for s in sources]
    assert all(sum(m) < sum(s.take(np.arange(s.count)).tolist()) for m, s in zip(masks, sources))  # prompts masked
    comps = (Component(sources[0], 1, 1, None, "a"), Component(sources[1], 2, 2, 2, "b"))
    mixture = MixtureDefinition(_config(), comps, 24, 300, unit="loss_tokens")
    orders = [mixture.stream_rows(i, 0, 2 * s.count if i else 3 * s.count)[1] for i, s in enumerate(sources)]
    expected = plain_walk(lambda m: [1, 2], [None, 2 * sources[1].count], 24, 300,
                          lambda i, t: masks[i][int(orders[i][t])])
    assert [list(mixture.quotas(m)) for m in range(mixture.num_windows)] == expected
    tokens = MixtureDefinition(_config(), comps, 24, 300, unit="tokens")
    assert [tokens.quotas(m) for m in range(tokens.num_windows)] != [mixture.quotas(m)
                                                                     for m in range(mixture.num_windows)]


def test_loss_tokens_refuse_lengths_alone_and_count_a_megatron_prefix_in_full(stores, tmp_path, capsys):
    from token_cases import random_sequences, write_megatron

    from umlos_cuda.batching import LengthCache
    from umlos_cuda.cli import main

    with pytest.raises(UmlosError) as info:
        MixtureDefinition(_config(), (Component(ArrayLengths(np.arange(1, 50)), 1, 1, None, "bare"),), 16, 100,
                          unit="loss_tokens")
    assert info.value.code == errors.TOKEN_STORE_NOT_FOUND and "'bare'" in info.value.message
    assert "--mix-unit tokens" in info.value.message
    mega = write_megatron(tmp_path / "mega", random_sequences(50, seed=4, high=60))
    args = ["plan", "build", "--window", "16", "--bucket-edges", "128,512", "--overflow-max", "1024",
            "--token-budget", "4096", "--num-samples", "200", "--quiet", "--mix", f"{stores[0]}:1", f"{mega}:1"]
    assert main([*args, "--mix-unit", "loss-tokens", "--output", str(tmp_path / "loss")]) == 0
    assert main([*args, "--mix-unit", "tokens", "--output", str(tmp_path / "tokens")]) == 0
    loss, tokens = load_mixed_plan(tmp_path / "loss"), load_mixed_plan(tmp_path / "tokens")
    assert loss.definition.unit == "loss_tokens" and loss.fingerprint != tokens.fingerprint
    megatron = (Component(tokens.definition.sources[1], 1, 1, None, "m0"),
                Component(tokens.definition.sources[1], 3, 2, None, "m1"))
    pair = [MixtureDefinition(_config(), megatron, 16, 200, unit=unit) for unit in ("tokens", "loss_tokens")]
    assert pair[0].segments == pair[1].segments  # every token of a Megatron prefix is a loss token
    capsys.readouterr()
    assert main(["plan", "info", str(tmp_path / "loss")]) == 0
    assert "weights count loss tokens" in capsys.readouterr().out
    cache = str(tmp_path / "a.jsonl")  # the first store's lengths, without its masks
    LengthCache.from_arrays(None, loss.definition.sources[0].take(np.arange(120)), "t").write(cache)
    assert main([*args[:-2], f"{cache}:1", f"{mega}:1", "--mix-unit", "loss-tokens",
                 "--output", str(tmp_path / "bare")]) != 0
    err = capsys.readouterr().err
    assert errors.TOKEN_STORE_NOT_FOUND in err and "no loss mask" in err and "'a'" in err


def test_loss_counts_of_a_store_a_sharded_store_and_any_token_source_are_each_rows_mask(stores, tmp_path,
                                                                                         monkeypatch):
    from umlos_cuda.batching.sources import open_source
    from umlos_cuda.batching.tokens import loss_counts
    from umlos_cuda.batching.tokens.adopt import append_shards

    monkeypatch.setattr(loss_counts, "PIECE_TOKENS", 37)  # many pieces, rows across their edges
    shutil.copytree(stores[0], tmp_path / "copy")
    append_shards(tmp_path / "sharded", [tmp_path / "copy"], create=True)  # adopts (moves) the copy
    flat, sharded = open_source(stores[0]), open_source(str(tmp_path / "sharded"))
    rows = np.random.default_rng(1).integers(0, flat.count, 500)
    expected = [int(np.count_nonzero(flat.arrays(int(r))[1])) for r in rows]

    class RowsOnly:  # a token source with neither flat masks nor shards: counted row by row
        arrays = staticmethod(flat.arrays)
    for source in (flat, sharded, RowsOnly()):
        assert loss_counts.loss_counter(source, "a")(rows).tolist() == expected


def test_windows_in_a_row_with_equal_quotas_share_a_segment():
    comps = (Component(ArrayLengths(np.full(90, 5)), 1, 1, None, "five"),
             Component(ArrayLengths(np.full(70, 20)), 1, 2, None, "twenty"))
    mixture = MixtureDefinition(_config(), comps, 10, 95, unit="tokens")  # 9 windows of 10, then one of 5
    assert [(s.first, s.windows, s.size, s.quotas) for s in mixture.segments] == [(0, 9, 10, (8, 2)),
                                                                                  (9, 1, 5, (4, 1))]
    assert [mixture.stream_starts(m) for m in (0, 4, 9)] == [(0, 0), (32, 8), (72, 18)]
