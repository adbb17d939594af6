"""Mixtures of pretraining sequences (docs/batching.md, "Mixtures of pretraining sequences"): exactness against a
plain Python definition over small N (quotas per window, each dataset's cut stream in order, caps), random access
and resume against the pass, the fingerprint, the folder, and ``plan cut --mix`` / ``plan info`` / ``plan verify``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from test_batching_mixtures import plain_quotas
from test_batching_sequences import EOS, Tokens, plain_stream
from token_cases import random_sequences, write_megatron

from umlos_cuda import errors
from umlos_cuda.batching.plans.config import BatchingConfig
from umlos_cuda.batching.plans.windows import ArrayLengths, Component, MixedPlan, MixtureDefinition
from umlos_cuda.batching.plans.windows.blend import MIXTURE_DOMAIN, mixture_key_words
from umlos_cuda.batching.plans.windows.cut import CutDefinition
from umlos_cuda.batching.plans.windows.resume import WindowedRankReader
from umlos_cuda.batching.plans.windows.sequence_mixture import SequenceMixture
from umlos_cuda.batching.plans.windows.sequences_io import load_mixed_sequences, save_mixed_sequences
from umlos_cuda.batching.plans.windows.verify import verify_mixed_sequences
from umlos_cuda.errors import UmlosError
from umlos_cuda.nextbatch import MODE_SEQUENTIAL, MODE_SHUFFLE
from umlos_cuda.philox import philox_draws


def plain_cut(definition: CutDefinition, lengths, epoch: int) -> list[list[tuple[int, int]]]:
    """Epoch ``epoch``'s samples as lists of stream tokens ``(row, offset)``: the plain stream cut in L + 1 tokens."""
    stream = plain_stream(definition, lengths, epoch)
    length = definition.sequence_length
    count = -(-len(stream) // length) if definition.tail == "pad" else (len(stream) - 1) // length
    return [stream[k * length:k * length + length + 1] for k in range(count)]


def plain_mixture(parts, window, num_samples, seed):
    """The whole mixture as ``(component, epoch, sample, tokens)``, one window at a time: each stream the
    component's plain cut epoch after epoch, the plain largest remainder, the jittered keys sorted."""
    streams = []
    for definition, tokens, _, cap, _ in parts:
        epochs = cap if cap is not None else 1 + num_samples
        stream = []
        for e in range(epochs):
            stream += [(e, k, s) for k, s in enumerate(plain_cut(definition, tokens.lengths, e))]
            if cap is None and len(stream) > num_samples:
                break
        streams.append(stream)
    remaining = [None if part[3] is None else len(stream) for part, stream in zip(parts, streams)]
    used, out, per_window, m = [0] * len(parts), [], [], 0
    key, w2, w3 = mixture_key_words(seed)
    while True:
        size = window if num_samples is None else min(window, num_samples - len(out))
        if all(r is not None for r in remaining):
            size = min(size, sum(remaining))
        if size <= 0:
            break
        q = plain_quotas(size, [part[2] for part in parts], remaining)
        items, t = [], 0
        for i, qi in enumerate(q):
            for j in range(qi):
                u = int(philox_draws(np.asarray([(m << 32) + t], dtype=np.uint64), key, w2, w3,
                                     MIXTURE_DOMAIN)[0][0]) >> 32
                items.append((((j << 32) + u) // qi, t, (i, *streams[i][used[i] + j])))
                t += 1
            used[i] += qi
            if remaining[i] is not None:
                remaining[i] -= qi
        out += [item for _, _, item in sorted(items)]
        per_window.append(q)
        m += 1
    return out, per_window, streams


@st.composite
def mixtures(draw):
    d = draw(st.integers(1, 3))
    all_capped = draw(st.booleans())
    stage = draw(st.sampled_from([MODE_SHUFFLE, MODE_SEQUENTIAL]))
    length, tail = draw(st.integers(1, 12)), draw(st.sampled_from(["drop", "pad"]))
    parts = []
    for i in range(d):
        lengths = draw(st.lists(st.integers(1, 30), min_size=1, max_size=12))
        eos = draw(st.booleans())
        if tail == "drop" and sum(lengths) + (len(lengths) if eos else 0) <= length:
            lengths = lengths + [length + 1]  # at least one sample an epoch
        definition = CutDefinition(len(lengths), length, window=draw(st.integers(1, 5)), seed=draw(st.integers(0, 99)),
                                   stage=stage, eos=EOS if eos else None, tail=tail)
        cap = draw(st.integers(1, 3)) if all_capped else draw(st.one_of(st.none(), st.integers(1, 3)))
        weight = draw(st.one_of(st.integers(1, 10), st.floats(0.01, 5.0)))
        parts.append((definition, Tokens(lengths), weight, cap, f"d{i}"))
    window = draw(st.integers(1, 30))
    num_samples = draw(st.one_of(st.none(), st.integers(1, 150))) if all_capped else draw(st.integers(1, 150))
    return parts, window, num_samples, draw(st.integers(0, 2**64 - 1))


def tokens_of(pieces) -> list[tuple[int, int]]:
    return [(p.row, p.offset + i) for p in pieces for i in range(p.count)]


@settings(max_examples=60, deadline=None)
@given(mixtures())
def test_mixture_equals_the_plain_definition(case):
    parts, window, num_samples, seed = case
    mixture = SequenceMixture.build(parts, window, num_samples, seed)
    expected, per_window, streams = plain_mixture(parts, window, num_samples, seed)
    got = []
    for k in range(mixture.total):
        i, e, j = mixture.locate(k)
        got.append((i, e, j, tokens_of(mixture.pieces(k))))
    assert got == expected and mixture.total == len(expected)
    for m, q in enumerate(per_window):  # every window holds each component exactly at its quota
        component, _ = mixture.blend.merge(m)
        assert np.bincount(component, minlength=len(parts)).tolist() == q == list(mixture.blend.quotas(m))
    for i, (_, _, _, cap, _) in enumerate(parts):
        mine = [(e, j) for c, e, j, _ in got if c == i]
        assert mine == [(e, j) for e, j, _ in streams[i][:len(mine)]]  # its own cut's stream, in order, once
        per_epoch = mixture.per_epoch[i]
        assert cap is None or len(mine) <= cap * per_epoch  # never past its cap
        sequences = mixture.components[i].sequences
        assert {sequences.epoch_samples(e) for e in range(sequences.num_epochs)} == {per_epoch}  # same every epoch
        assert sequences.num_epochs == max(1, -(-len(mine) // per_epoch))  # exactly the epochs read
    if num_samples is None:  # all capped: every capped stream runs out
        assert all(len([g for g in got if g[0] == i]) == part[3] * mixture.per_epoch[i]
                   for i, part in enumerate(parts))


@settings(max_examples=25, deadline=None)
@given(mixtures(), st.data())
def test_random_access_and_resume_equal_the_pass(tmp_path_factory, case, data):
    parts, window, num_samples, seed = case
    mixture = SequenceMixture.build(parts, window, num_samples, seed)
    passed = list(mixture.iter_from(0))
    assert [k for k, _ in passed] == list(range(mixture.total))
    folder = tmp_path_factory.mktemp("mix") / "m"
    save_mixed_sequences(mixture, folder)
    tokens = [part[1] for part in parts]
    for k in data.draw(st.lists(st.integers(0, mixture.total - 1), max_size=6)):
        fresh = load_mixed_sequences(folder, tokens=tokens)  # nothing merged, nothing cached
        got, want = fresh.sample(k), passed[k][1]
        for key in ("input_ids", "labels", "loss_mask", "position_ids", "segment_ids", "component",
                    "component_epoch", "component_sample"):
            assert np.array_equal(got[key], want[key]), key
        assert next(fresh.iter_from(k))[1]["component_name"] == want["component_name"]
    # ranks interrupted at a random sample and resumed at another world size continue the same sequence
    world, other = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    readers = [WindowedRankReader(mixture, r, world) for r in range(world)]
    steps = data.draw(st.integers(0, -(-mixture.total // world)))
    iters = [iter(reader) for reader in readers]
    seen = [next(it, None) for _ in range(steps) for it in iters]
    cursor = readers[0].cursor()
    assert all(reader.cursor() == cursor for reader in readers)
    reopened = load_mixed_sequences(folder, tokens=tokens)
    rest = [item for r in range(other) for item in WindowedRankReader.resume(reopened, cursor, r, other)]
    order = sorted([s for s in seen if s is not None] + rest, key=lambda item: item[1])
    assert [k for _, k, _ in order] == list(range(mixture.total))
    assert all(np.array_equal(s["input_ids"], passed[k][1]["input_ids"]) for _, k, s in order)


def _parts(weights=(0.7, 0.3), caps=(None, 2), seeds=(1, 2)):
    rng = np.random.default_rng(5)
    lengths = [rng.integers(1, 40, 30).tolist(), rng.integers(1, 40, 9).tolist()]
    return [(CutDefinition(len(ls), 8, window=4, seed=s, eos=EOS), Tokens(ls), w, c, f"d{i}")
            for i, (ls, w, c, s) in enumerate(zip(lengths, weights, caps, seeds))]


def test_fingerprint_covers_weights_seeds_caps_and_the_definition():
    base = SequenceMixture.build(_parts(), 10, 120, 3)
    assert SequenceMixture.build(_parts(), 10, 120, 3).fingerprint == base.fingerprint
    others = [SequenceMixture.build(_parts(weights=(0.6, 0.4)), 10, 120, 3),
              SequenceMixture.build(_parts(seeds=(1, 5)), 10, 120, 3),
              SequenceMixture.build(_parts(caps=(None, 3)), 10, 120, 3),
              SequenceMixture.build(_parts(), 10, 120, 4),  # the mixture seed
              SequenceMixture.build(_parts(), 11, 120, 3),
              SequenceMixture.build(_parts(), 10, 121, 3)]
    assert len({base.fingerprint, *(o.fingerprint for o in others)}) == 1 + len(others)


def pinned_sample_mixture() -> MixtureDefinition:
    """Three components, one uncapped, W = 16, 150 samples, mixture seed 7."""
    config = BatchingConfig.predictable(token_budget=512, bucket_edges=(32, 64, 128), overflow_max=256, seed=7)
    rng = np.random.default_rng(3)
    comps = (Component(ArrayLengths(rng.integers(1, 200, 50)), 0.7, 1, None, "a"),
             Component(ArrayLengths(rng.integers(1, 200, 13)), 0.2, 2, 2, "b"),
             Component(ArrayLengths(rng.integers(1, 200, 5)), 1, 3, 1, "c"))
    return MixtureDefinition(config, comps, 16, 150)


def test_sample_mixtures_are_unchanged_by_the_shared_blend():
    """Pinned from main before blend.py took the quotas and the merge out of mixture.py."""
    definition = pinned_sample_mixture()
    assert definition.fingerprint == "3b08f40fc2b504583b0323c19194a250b770d2dce5bae8fcd17bed3227a65ab0"
    assert MixedPlan.build(definition).fingerprint == \
        "5abfbdb240303ecffc4862ca1983d42af5ede7b761237eff741d2742f442fed5"
    window = definition.window_of(3)
    assert window.component.tolist() == [0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0]
    assert window.row.tolist() == [8, 10, 19, 30, 41, 5, 2, 13, 24, 0, 35, 46, 7, 2, 18, 29]


def test_folder_round_trip_and_refusals(tmp_path: Path):
    parts = _parts()
    mixture = SequenceMixture.build(parts, 10, 120, 3)
    tokens = [part[1] for part in parts]
    save_mixed_sequences(mixture, tmp_path / "m")
    again = load_mixed_sequences(tmp_path / "m", tokens=tokens)
    assert again.fingerprint == mixture.fingerprint and again.total == 120
    report = verify_mixed_sequences(tmp_path / "m", tokens=tokens, expected_fingerprint=mixture.fingerprint)
    assert report["windows_checked"] == mixture.num_windows
    with pytest.raises(UmlosError) as caught:  # no tokens_paths recorded, nothing given
        load_mixed_sequences(tmp_path / "m")
    assert caught.value.code == errors.PLAN_LENGTHS_MISMATCH
    with pytest.raises(UmlosError) as caught:  # the components' tokens swapped
        load_mixed_sequences(tmp_path / "m", tokens=tokens[::-1])
    assert caught.value.code == errors.PLAN_LENGTHS_MISMATCH
    index = np.load(tmp_path / "m" / "index.npy")
    index[-1] += 1  # the last running count of the last component, still increasing
    np.save(tmp_path / "m" / "index.npy", index)
    with pytest.raises(UmlosError) as caught:
        load_mixed_sequences(tmp_path / "m", tokens=tokens)
    assert caught.value.code == errors.PLAN_FINGERPRINT_MISMATCH
    meta = json.loads((tmp_path / "m" / "meta.json").read_text())
    meta["components"][0]["weight"] = [3, 5]
    (tmp_path / "m" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UmlosError) as caught:
        load_mixed_sequences(tmp_path / "m", tokens=tokens)
    assert caught.value.code in (errors.PLAN_FINGERPRINT_MISMATCH, errors.PLAN_FORMAT_INVALID)


@pytest.mark.parametrize("kwargs, text", [
    ({"num_samples": None}, "needs max_epochs on every component"),
    ({"window": 0}, "window"),
    ({"weights": (0.7, -1)}, "weight"),
])
def test_definition_refusals(kwargs, text):
    weights = kwargs.pop("weights", (0.7, 0.3))
    args = {"window": 10, "num_samples": 50, **kwargs}
    with pytest.raises(UmlosError) as caught:
        SequenceMixture.build(_parts(weights=weights), args["window"], args["num_samples"], 3)
    assert caught.value.code == errors.BATCHING_CONFIG_INVALID and text in caught.value.message


def test_a_dataset_without_a_sample_is_refused():
    short = (CutDefinition(2, 64, window=2, eos=None), Tokens([3, 4]), 1.0, None, "short")
    with pytest.raises(UmlosError) as caught:
        SequenceMixture.build([short, *_parts()], 10, 50, 3)
    assert caught.value.code == errors.BATCHING_CONFIG_INVALID and "no sample" in caught.value.message


def test_plan_cut_mix_info_verify_and_show(tmp_path: Path, capsys):
    from umlos_cuda.cli import main

    web = write_megatron(tmp_path / "web", random_sequences(120, seed=2, high=50))
    code = write_megatron(tmp_path / "code", random_sequences(30, seed=3, high=50))
    out = tmp_path / "mix"
    assert main(["plan", "cut", "--mix", f"{web}:0.7", f"{code}:0.3:2", "--num-samples", "300", "--sequence-length",
                 "16", "--window", "16", "--eos", "0", "--output", str(out), "--show", "5"]) == 0
    printed = capsys.readouterr().out.splitlines()
    opened = load_mixed_sequences(out)  # the tokens reopened from tokens_paths
    assert printed[1] == f"fingerprint {opened.fingerprint}" and "window 0: web 11, code 5" in printed[0]
    shown, want = json.loads(printed[-1]), opened.sample(5)
    assert shown["input_ids"] == want["input_ids"].tolist() and shown["component_name"] == want["component_name"]
    assert main(["plan", "info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["samples"] == 300 and [c["max_epochs"] for c in info["components"]] == [None, 2]
    assert sum(c["samples_read"] for c in info["components"]) == 300
    assert main(["plan", "info", str(out), "--world-size", "4", "--rank", "1"]) == 0
    assert "rank 1: 75 samples" in capsys.readouterr().out
    assert main(["plan", "verify", str(out), "--windows", "3", "--expected-fingerprint", opened.fingerprint]) == 0
    assert "mixed pretraining sequences" in capsys.readouterr().out
    assert main(["plan", "cut", "--mix", f"{web}:1", "--tokens", web, "--sequence-length", "16", "--num-samples",
                 "5", "--output", str(tmp_path / "x")]) != 0
    assert errors.BATCHING_CONFIG_INVALID in capsys.readouterr().err
    assert main(["plan", "cut", "--sequence-length", "16", "--output", str(tmp_path / "x")]) != 0
    assert "--source is required" in capsys.readouterr().err
    assert main(["plan", "cut", "--mix", f"{web}:1", "--sequence-length", "16", "--num-samples", "5", "--output",
                 str(out)]) != 0  # an existing folder is refused without --force
    assert "OUTPUT_EXISTS" in capsys.readouterr().err


def test_resume_through_the_checkpoint_store_and_a_foreign_cursor(tmp_path: Path):
    import dataclasses

    import umlos_cuda as uc
    from test_checkpoint_support import DATASET, KEY, identity, state
    from umlos_cuda.batching.plans.checkpoint_kinds import PlanCursor
    from umlos_cuda.checkpoint import CheckpointStore, restore_latest

    mixture = SequenceMixture.build(_parts(), 10, 120, 3)
    readers = [WindowedRankReader(mixture, r, 4) for r in range(4)]
    iterators = [iter(r) for r in readers]
    seen: dict[int, np.ndarray] = {}
    with CheckpointStore.open(str(tmp_path / "store"), identity(), KEY) as store:
        store.start_run(DATASET, world_size=4)
        for _ in range(5):
            for it in iterators:
                _, k, sample = next(it)
                seen[k] = sample["input_ids"]
        store.commit(dataclasses.replace(state(1, uc.Cursor(0, 8)), extra_cursors={"plan": readers[0].cursor()}))
    cursor = restore_latest(str(tmp_path / "store"), identity()).extra_cursors["plan"]
    assert cursor == PlanCursor(mixture.fingerprint, 0, 20)
    for reader in [WindowedRankReader.resume(mixture, cursor, r, 3) for r in range(3)]:
        for _, k, sample in reader:
            seen[k] = sample["input_ids"]
    assert sorted(seen) == list(range(mixture.total))
    assert all(np.array_equal(seen[k], mixture.sample(k)["input_ids"]) for k in range(mixture.total))
    other = SequenceMixture.build(_parts(), 10, 121, 3)
    with pytest.raises(UmlosError) as caught:
        WindowedRankReader.resume(mixture, PlanCursor(other.fingerprint, 0, 0))
    assert caught.value.code == errors.PLAN_FINGERPRINT_MISMATCH


def test_sample_k_merges_one_mixed_window(monkeypatch):
    """Random access costs one mixed window merged (and the component's cut windows), never the ones before it."""
    from umlos_cuda.batching.plans.windows.blend import Blend

    mixture = SequenceMixture.build(_parts(), 10, 120, 3)
    merged: list[int] = []
    original = Blend.merge
    monkeypatch.setattr(Blend, "merge", lambda self, m: merged.append(m) or original(self, m))
    fresh = load_mixed_sequences_from(mixture)
    fresh.sample(117)
    fresh.sample(115)  # the same window, kept
    assert merged == [11]


def load_mixed_sequences_from(mixture: SequenceMixture) -> SequenceMixture:
    """The same mixture, nothing merged or cached."""
    return SequenceMixture(mixture.components, mixture.window, mixture.num_samples, mixture.seed)
