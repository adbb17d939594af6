"""Weighted mixtures (docs/batching.md, "Weighted mixtures"): against a plain Python definition that walks
the windows one by one, each component's stream from whole epochs of the engine's order, the quotas by an
independent largest-remainder rule and the merge by sorting per-sample keys; every window at its quotas,
every sample of a component once per its epoch, caps, random access, resume, seeds, errors."""

from __future__ import annotations

import json
import os
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from test_batching_windows_packed import packed_configs, reference_window, window_microbatches

from umlos_cuda import errors
from umlos_cuda.batching.plans.config import BatchingConfig, PadPolicy
from umlos_cuda.batching.plans.planner import plan_manifest
from umlos_cuda.batching.plans.windows import ArrayLengths
from umlos_cuda.batching.plans.windows.mixed import MixedPlan
from umlos_cuda.batching.plans.windows.mixture import (MIXTURE_DOMAIN, Component, MixtureDefinition,
                                                       mixture_key_words)
from umlos_cuda.errors import UmlosError
from umlos_cuda.nextbatch import epoch_indices
from umlos_cuda.philox import philox_draws


def plain_quotas(size, weights, remaining):
    """Largest remainder, written out: a capped component asked for more than it has gives what it has."""
    quotas = {}
    active = [i for i in range(len(weights)) if remaining[i] is None or remaining[i] > 0]
    while active and size:
        total = sum(Fraction(weights[i]) for i in active)
        ideal = [(size * Fraction(weights[i]) / total, i) for i in active]
        share = {i: int(x) for x, i in ideal}
        ranked = sorted(ideal, key=lambda pair: (-(pair[0] - int(pair[0])), pair[1]))
        for _, i in ranked[:size - sum(share.values())]:
            share[i] += 1
        over = [i for i in active if remaining[i] is not None and share[i] > remaining[i]]
        if not over:
            quotas.update(share)
            break
        for i in over:
            quotas[i] = remaining[i]
            size -= remaining[i]
            active.remove(i)
    return [quotas.get(i, 0) for i in range(len(weights))]


def plain_mixture(config, comps, window, num_samples):
    """The whole mixture as a list of (component, epoch, row), one window at a time."""
    streams = []
    for c in comps:
        own = BatchingConfig(config.token_budget, config.bucket_edges, config.overflow_max, config.pad_policy,
                             c.seed, stage=config.stage, order=config.order,
                             sampler_block_size=config.sampler_block_size)
        n = c.source.count
        manifest = plan_manifest(own, n)
        epochs = c.max_epochs if c.max_epochs is not None else 1 + (num_samples // n) + 1
        stream = []
        for e in range(epochs):
            order = (list(range(n)) if config.stage == "SEQUENTIAL_V1"
                     else [int(r) for r in epoch_indices(manifest, "train", e, 0, n, backend="numpy")])
            stream += [(e, r) for r in order]
        streams.append(stream)
    remaining = [None if c.max_epochs is None else c.max_epochs * c.source.count for c in comps]
    used = [0] * len(comps)
    out, per_window, m = [], [], 0
    key, w2, w3 = mixture_key_words(config.seed)
    while True:
        size = window if num_samples is None else min(window, num_samples - len(out))
        if all(r is not None for r in remaining):
            size = min(size, sum(remaining))
        if size <= 0:
            break
        q = plain_quotas(size, [c.weight for c in comps], remaining)
        items, t = [], 0
        for i, qi in enumerate(q):
            for j in range(qi):
                e, r = streams[i][used[i] + j]
                u = int(philox_draws(np.asarray([(m << 32) + t], dtype=np.uint64), key, w2, w3,
                                     MIXTURE_DOMAIN)[0][0]) >> 32
                items.append((((j << 32) + u) // qi, t, (i, e, r)))
                t += 1
            used[i] += qi
            if remaining[i] is not None:
                remaining[i] -= qi
        out += [item for _, _, item in sorted(items)]
        per_window.append(q)
        m += 1
    return out, per_window


@st.composite
def mixtures(draw):
    config = BatchingConfig(draw(st.integers(1024, 4096)), draw(st.sampled_from([(), (64,), (100, 300)])), 1024,
                            draw(st.sampled_from(list(PadPolicy))), draw(st.integers(0, 2**64 - 1)),
                            stage=draw(st.sampled_from(["SHUFFLE_WITHOUT_REPLACEMENT_BLOCK_AFFINE_V1",
                                                        "SEQUENTIAL_V1"])),
                            order=draw(st.sampled_from(["block_affine", "feistel"])),
                            sampler_block_size=draw(st.sampled_from([7, 64, 1 << 20])))
    d = draw(st.integers(1, 4))
    all_capped = draw(st.booleans())
    comps = []
    for i in range(d):
        n = draw(st.integers(1, 40))
        lengths = draw(st.lists(st.integers(1, 1024), min_size=n, max_size=n))
        cap = draw(st.integers(1, 3)) if all_capped else draw(st.one_of(st.none(), st.integers(1, 3)))
        weight = draw(st.one_of(st.integers(1, 10), st.floats(0.01, 5.0)))
        comps.append(Component(ArrayLengths(lengths), weight, draw(st.integers(0, 2**64 - 1)), cap, f"d{i}"))
    window = draw(st.integers(1, 50))
    num_samples = (draw(st.one_of(st.none(), st.integers(1, 300))) if all_capped else draw(st.integers(1, 300)))
    return config, tuple(comps), window, num_samples


def whole(definition):
    out = []
    for m in range(definition.num_windows):
        w = definition.window_of(m, "numpy")
        out += list(zip(w.component.tolist(), w.epoch.tolist(), w.row.tolist()))
    return out


@settings(max_examples=60, deadline=None)
@given(mixtures(), st.data())
def test_mixture_equals_the_plain_definition(case, data):
    config, comps, window, num_samples = case
    definition = MixtureDefinition(config, comps, window, num_samples)
    expected, per_window = plain_mixture(config, comps, window, num_samples)
    got = whole(definition)
    assert got == expected
    assert definition.total == len(expected) and len(definition.segments) <= 2 * len(comps) + 1
    # every window holds each component exactly at its quota
    for m, q in enumerate(per_window):
        w = definition.window_of(m, "numpy")
        assert np.bincount(w.component, minlength=len(comps)).tolist() == q == list(definition.quotas(m))
    # each component: every epoch a permutation (the last one a prefix of distinct rows); a cap never passed
    for i, c in enumerate(comps):
        mine = [(e, r) for comp, e, r in got if comp == i]
        epochs = [e for e, _ in mine]
        assert epochs == sorted(epochs)
        if c.max_epochs is not None:
            assert len(mine) <= c.max_epochs * c.source.count
            if num_samples is None:
                assert len(mine) == c.max_epochs * c.source.count  # runs to its cap
        for e in set(epochs):
            rows = [r for ee, r in mine if ee == e]
            assert len(rows) == len(set(rows)) and all(0 <= r < c.source.count for r in rows)
            if e < max(epochs):
                assert sorted(rows) == list(range(c.source.count))
    # random access equals the full pass
    for k in data.draw(st.lists(st.integers(0, len(expected) - 1), max_size=5)):
        assert definition.sample(k, "numpy") == expected[k]


@settings(max_examples=25, deadline=None)
@given(mixtures(), st.data())
def test_mixed_plan_random_access_resume_and_coverage(case, data):
    config, comps, window, num_samples = case
    definition = MixtureDefinition(config, comps, window, num_samples)
    plan = MixedPlan.build(definition, backend="numpy")
    full = list(plan.iter_from(0))
    assert [j for j, _ in full] == list(range(plan.num_microbatches))
    held = _microbatch_positions(plan)
    positions = np.concatenate(held + [np.zeros(0, np.uint64)])
    counts = plan.counts()
    assert counts["samples"] == positions.shape[0] and counts["samples"] + counts["skipped"] == definition.total
    assert np.unique(positions).shape[0] == positions.shape[0]  # each position at most once
    expected, _ = plain_mixture(config, comps, window, num_samples)
    for spec, at in zip((s for _, s in full), held):  # the mixture's samples at those positions, as rows of all
        assert spec.samples == tuple(f"d{expected[p][0]}:{expected[p][2]}" for p in at.tolist())
        assert spec.rows.tolist() == [int(definition.starts[expected[p][0]]) + expected[p][2] for p in at.tolist()]
    if plan.num_microbatches:
        j = data.draw(st.integers(0, plan.num_microbatches - 1))
        fresh = MixedPlan(definition, plan.index, backend="numpy")
        assert fresh.microbatch(j) == full[j][1]
        assert [s for _, s in fresh.iter_from(j)] == [s for _, s in full[j:]]


def _microbatch_positions(plan) -> list[np.ndarray]:
    """Each microbatch's mixture positions (``m W + local``), from the planned windows' arrays, in order."""
    held = []
    for m in range(plan.definition.num_windows):
        arrays = plan.window(m).arrays
        held += [arrays.samples[int(a):int(b)] for a, b in zip(arrays.offsets[:-1], arrays.offsets[1:])]
    return held


def test_same_seeds_same_order_and_fingerprint_covers_the_definition():
    config = BatchingConfig.throughput(token_budget=4096, bucket_edges=(128, 512), overflow_max=1024, seed=3)
    rng = np.random.default_rng(0)
    a, b = rng.integers(1, 1024, 500), rng.integers(1, 1024, 70)

    def make(seed_b=9, weight_b=0.3, cap=None, lengths_b=b):
        comps = (Component(ArrayLengths(a), 0.7, 1, None, "a"), Component(ArrayLengths(lengths_b), weight_b, seed_b,
                                                                         cap, "b"))
        return MixedPlan.build(MixtureDefinition(config, comps, 64, 2000))

    one, two = make(), make()
    assert whole(one.definition) == whole(two.definition) and one.fingerprint == two.fingerprint
    changed = [make(seed_b=10), make(weight_b=0.31), make(cap=5), make(lengths_b=b + 1)]
    assert len({one.fingerprint, *(p.fingerprint for p in changed)}) == 5
    assert whole(make(seed_b=10).definition) != whole(one.definition)
    # upsampling: b (70 rows) repeats, each epoch in a new order
    rows_b = [(e, r) for c, e, r in whole(one.definition) if c == 1]
    first, second = [r for e, r in rows_b if e == 0], [r for e, r in rows_b if e == 1]
    assert sorted(first) == sorted(second) == list(range(70)) and first != second


@pytest.mark.parametrize("kwargs, text", [
    ({"weight": 0}, "weight must be a finite number > 0"),
    ({"weight": float("nan")}, "weight must be a finite number > 0"),
    ({"max_epochs": 0}, "max_epochs"),
    ({"num_samples": None}, "needs max_epochs on every component"),
    ({"window": 0}, "window"),
])
def test_mixture_errors(kwargs, text):
    config = BatchingConfig.throughput(token_budget=4096, bucket_edges=(), overflow_max=1024)
    comp = Component(ArrayLengths([5, 6, 7]), kwargs.get("weight", 1.0), 0, kwargs.get("max_epochs"), "a")
    with pytest.raises(UmlosError) as info:
        MixtureDefinition(config, (comp,), kwargs.get("window", 4), kwargs.get("num_samples", 10))
    assert info.value.code == errors.BATCHING_CONFIG_INVALID and text in str(info.value)


@st.composite
def packed_mixtures(draw):
    """A packed config (the windowed packed tests' strategy) over 1 to 3 components of lengths near its rows."""
    config = draw(packed_configs())
    high = config.bucket_spec.overflow_max + 40
    comps = []
    for i in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 40))
        lengths = draw(st.lists(st.integers(0, high), min_size=n, max_size=n))
        weight = draw(st.one_of(st.integers(1, 10), st.floats(0.01, 5.0)))
        comps.append(Component(ArrayLengths(lengths), weight, draw(st.integers(0, 2**64 - 1)),
                               draw(st.one_of(st.none(), st.integers(1, 3))), f"d{i}"))
    return config, tuple(comps), draw(st.integers(1, 60)), draw(st.integers(1, 250))


@settings(max_examples=50, deadline=None)
@given(packed_mixtures())
def test_a_mixed_packed_window_is_the_windowed_packer_on_its_samples(case):
    """Each mixed window of a packed config is the reference packer (the windowed packed plans' definition)
    on that window's samples in position order; quotas stay exact; the index counts rows."""
    config, comps, window, num_samples = case
    definition = MixtureDefinition(config, comps, window, num_samples)
    plan = MixedPlan.build(definition, backend="numpy")
    expected, per_window = plain_mixture(config, comps, window, num_samples)
    assert [list(definition.quotas(m)) for m in range(definition.num_windows)] == per_window
    lengths = np.asarray([int(comps[c].source.take(np.asarray([r], np.uint64))[0]) for c, _, r in expected])
    for m in range(definition.num_windows):
        planned = plan.window(m)
        assert np.bincount(planned.mixed.component, minlength=len(comps)).tolist() == per_window[m]
        base = m * window
        positions = np.arange(base, base + planned.mixed.component.shape[0])
        assert window_microbatches(planned.arrays) == reference_window(lengths, positions, config)
        arrays = planned.arrays
        stored = plan.index[0, m + 1] - plan.index[0, m]
        assert int(stored[0]) == arrays.bucket_ids.shape[0]
        assert int(stored[4]) == (arrays.row_offsets.shape[0] - 1) * config.pack.max_length
    for (_, spec), at in zip(plan.iter_from(0), _microbatch_positions(plan)):  # packed rows, as a windowed plan's
        assert sum(spec.pack_sizes) == len(spec.samples) and sum(spec.packs, ()) == spec.samples
        assert spec.samples == tuple(f"d{expected[p][0]}:{expected[p][2]}" for p in at.tolist())


def test_a_packed_mixed_plan_round_trips_verifies_and_hashes_its_packing(tmp_path):
    from dataclasses import replace

    from umlos_cuda.batching.packing.config import PackingConfig
    from umlos_cuda.batching.plans.windows.io import load_mixed_plan, save_mixed_plan
    from umlos_cuda.batching.plans.windows.verify import verify_mixed_plan

    plain = BatchingConfig(4096, (), 1024, PadPolicy.PAD_TO_MAX_IN_BATCH, 0)
    rng = np.random.default_rng(3)
    comps = (Component(ArrayLengths(rng.integers(1, 1024, 300)), 0.7, 1, None, "a"),
             Component(ArrayLengths(rng.integers(1, 300, 50)), 0.3, 2, None, "b"))
    unpacked = MixedPlan.build(MixtureDefinition(plain, comps, 64, 1000))
    packed = [MixedPlan.build(MixtureDefinition(replace(plain, pack=PackingConfig(1024, mode)), comps, 64, 1000))
              for mode in ("first_fit", "best_fit")]
    assert "pack_config" not in unpacked.header() and "pack_config" in packed[0].header()
    assert len({unpacked.fingerprint, *(p.fingerprint for p in packed)}) == 3
    assert [list(unpacked.definition.quotas(m)) for m in range(16)] == [
        list(packed[0].definition.quotas(m)) for m in range(16)]  # packing moves no sample between windows
    save_mixed_plan(packed[0], tmp_path / "mix", lengths_paths=[None, None])
    again = load_mixed_plan(tmp_path / "mix", lengths=[c.source for c in comps])
    assert again.fingerprint == packed[0].fingerprint and again.definition.config.pack == PackingConfig(1024)
    assert again.microbatch(7) == packed[0].microbatch(7)
    report = verify_mixed_plan(tmp_path / "mix", lengths=[c.source for c in comps])
    assert report["fingerprint"] == packed[0].fingerprint and report["windows_checked"] == 16
    # resumed from a cursor at another world size, the ranks' microbatches are the rest of the pass, rows included
    from umlos_cuda.batching.plans.windows.resume import WindowedRankReader

    reader = WindowedRankReader(again, 0, 1)
    steps = iter(reader)
    [next(steps) for _ in range(10)]
    rest = [item for rank in range(3) for item in WindowedRankReader.resume(again, reader.cursor(), rank, 3)]
    assert sorted(k for _, k, _ in rest) == list(range(10, again.num_microbatches))
    assert all(spec == again.microbatch(k) and spec.packs for _, k, spec in rest)


def test_duplicate_names_are_refused():
    config = BatchingConfig.throughput(token_budget=4096, bucket_edges=(), overflow_max=1024)
    comps = tuple(Component(ArrayLengths([5]), 1.0, 0, None, "a") for _ in range(2))
    with pytest.raises(UmlosError, match="given twice"):
        MixtureDefinition(config, comps, 4, 10)


def _cli(*args):
    from umlos_cuda.cli import main

    return main(list(args))


def test_folder_round_trip_cli_build_and_verify(tmp_path, capsys):
    from umlos_cuda.batching import LengthCache
    from umlos_cuda.batching.plans.windows.io import load_mixed_plan, save_mixed_plan
    from umlos_cuda.batching.plans.windows.verify import verify_mixed_plan

    rng = np.random.default_rng(1)
    paths = []
    for name, n in (("web", 3000), ("code", 400), ("books", 60)):
        paths.append(str(tmp_path / f"{name}.jsonl"))
        LengthCache.from_arrays(None, rng.integers(1, 1024, n).astype(np.uint32), "t").write(paths[-1])
    out = str(tmp_path / "mixed")
    args = ("plan", "build", "--window", "256", "--bucket-edges", "128,512", "--overflow-max", "1024",
            "--token-budget", "4096", "--seed", "5", "--output", out, "--quiet")
    assert _cli(*args, "--mix", f"{paths[0]}:0.7", f"{paths[1]}:0.2:-:11", f"{paths[2]}:0.1:3",
                "--num-samples", "5000") == 0
    plan = load_mixed_plan(out)
    assert [c.name for c in plan.definition.components] == ["web", "code", "books"]
    assert [c.seed for c in plan.definition.components] == [6, 11, 8] and plan.definition.components[2].max_epochs == 3
    assert plan.definition.quotas(0) == (179, 51, 26) and plan.definition.total == 5000
    assert verify_mixed_plan(out, windows=3, seed=2)["windows_checked"] == 3
    assert _cli("plan", "verify", out) == 0 and "mixed plan" in capsys.readouterr().out
    assert _cli("plan", "info", out, "--json") == 0
    info = json.loads(capsys.readouterr().out)
    assert info["fingerprint"] == plan.fingerprint and info["segments"][0]["quotas"] == [179, 51, 26]
    assert info["counts"]["samples"] + info["counts"]["skipped"] == 5000
    assert _cli("plan", "info", out) == 0 and "quotas [179, 51, 26]" in capsys.readouterr().out
    assert _cli("plan", "info", out, "--world-size", "3", "--json") == 0
    ranks = json.loads(capsys.readouterr().out)["ranks"]
    assert [r["microbatches"] for r in ranks] == [len(range(r, plan.num_microbatches, 3)) for r in range(3)]
    assert _cli("plan", "info", out, "--world-size", "3", "--rank", "1") == 0
    assert "rank 1: " in capsys.readouterr().out
    assert _cli("plan", "info", out, "--rank", "1") == 2 and "--rank needs --world-size" in capsys.readouterr().err
    k = plan.num_microbatches // 2
    assert plan.microbatch(k) == next(MixedPlan(plan.definition, plan.index).iter_from(k))[1]
    # the same definition in Python gives the same fingerprint
    again = MixedPlan.build(plan.definition)
    save_mixed_plan(again, tmp_path / "again")
    assert load_mixed_plan(tmp_path / "again").fingerprint == plan.fingerprint
    # packed: the same mixture, each mixed window packed into rows of 1024 tokens
    packed_out = str(tmp_path / "packed")
    assert _cli("plan", "build", "--window", "256", "--token-budget", "4096", "--seed", "5", "--pack",
                "--pack-max-len", "1024", "--output", packed_out, "--quiet", "--mix", f"{paths[0]}:0.7",
                f"{paths[1]}:0.2:-:11", f"{paths[2]}:0.1:3", "--num-samples", "5000") == 0
    packed = load_mixed_plan(packed_out)
    assert packed.definition.config.pack is not None and packed.definition.quotas(0) == (179, 51, 26)
    assert packed.microbatch(0).packs is not None and packed.fingerprint != plan.fingerprint
    assert _cli("plan", "verify", packed_out) == 0
    assert _cli("plan", "info", packed_out) == 0 and "packed: first_fit, rows of 1024" in capsys.readouterr().out
    # errors: a malformed --mix, --mix without --window, --num-samples without --mix, no --lengths at all
    capsys.readouterr()
    bad = ("--output", str(tmp_path / "bad"), "--token-budget", "4096", "--bucket-edges", "128", "--overflow-max",
           "1024")
    for argv, text in ((("--window", "4", "--mix", f"{paths[0]}:x"), "--mix takes"),
                       (("--window", "4", "--mix", f"{paths[0]}:1:2:3:4"), "--mix takes"),
                       (("--mix", f"{paths[0]}:1:1"), "--mix needs --window"),
                       (("--window", "4", "--lengths", paths[0], "--num-samples", "9"), "--num-samples needs --mix"),
                       (("--window", "4", "--mix", f"{paths[0]}:1"), "needs max_epochs on every component"),
                       ((), "--source is required")):
        assert _cli("plan", "build", *bad, *argv) == 2
        err = capsys.readouterr().err
        assert "BATCHING_CONFIG_INVALID" in err and text in err and not os.path.lexists(tmp_path / "bad")
    # a changed weight no longer hashes to the fingerprint
    meta = json.loads((tmp_path / "mixed" / "meta.json").read_text())
    meta["mixture"]["components"][0]["weight"] = [3, 4]
    (tmp_path / "mixed" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UmlosError) as info:
        load_mixed_plan(out)
    assert info.value.code == errors.PLAN_FINGERPRINT_MISMATCH


def test_mix_takes_token_stores_sharded_stores_and_megatron_prefixes(tmp_path, capsys):
    """``--mix`` entries may name a token store, a sharded store or a Megatron prefix: their lengths are the
    components' (the command opens them; plans import no tokens), and plan verify/info reopen them."""
    from token_cases import make_store, write_megatron, write_two_shards

    from umlos_cuda.batching.plans.windows.io import load_mixed_plan
    from umlos_cuda.batching.tokens.sources import open_token_source

    store = make_store(tmp_path / "s", 120, seed=1)
    sharded = write_two_shards(tmp_path, 30, 70)
    rng = np.random.default_rng(4)
    prefix = write_megatron(tmp_path / "meg", [rng.integers(0, 500, int(n)) for n in rng.integers(1, 300, 50)])
    out = str(tmp_path / "mixed")
    entries = (str(store.root), str(sharded.root), prefix)
    assert _cli("plan", "build", "--window", "32", "--bucket-edges", "64", "--overflow-max", "1024",
                "--token-budget", "4096", "--output", out, "--quiet", "--mix", f"{entries[0]}:0.5:2",
                f"{entries[1]}:0.3:2", f"{entries[2]}:0.2:2") == 0
    sources = [open_token_source(p) for p in entries]
    plan = load_mixed_plan(out, lengths=[ArrayLengths(np.asarray(s.lengths)) for s in sources])
    for component, source in zip(plan.definition.components, sources):
        assert component.source.count == len(source)
        rows = np.arange(len(source), dtype=np.uint64)
        assert np.array_equal(component.source.take(rows), np.asarray(source.lengths, dtype=np.uint32))
    assert plan.definition.total == 2 * (120 + 70 + 50)
    capsys.readouterr()
    assert _cli("plan", "verify", out) == 0 and plan.fingerprint in capsys.readouterr().out
    assert _cli("plan", "info", out) == 0 and "store: weight 0.5" in capsys.readouterr().out
