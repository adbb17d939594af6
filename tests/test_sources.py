"""The source layer (umlos_cuda/batching/sources/): one opener for every kind, a registry a new kind joins.

``open_source`` recognises each built-in kind, reads it by rows and binds it as the same lengths held in
memory would bind; a list opens as one source; a plan records where it read and reopens it with no
argument, whatever the kind; and a toy kind (tests/toy_source.py: one module and its registration)
is taken by ``plan build --window``, ``--mix``, ``plan info``, ``plan verify`` and the loaders alike.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from batching_cases import expect
from token_cases import make_store, random_sequences, write_megatron

from umlos_cuda import errors
from umlos_cuda.batching.lengths.cache import LengthCache
from umlos_cuda.batching.lengths.sources import ArrayLengths, MappedLengths
from umlos_cuda.batching.plans.windows import load_windowed_plan
from umlos_cuda.batching.plans.windows.io import load_mixed_plan
from umlos_cuda.batching.sources import (SourceKind, SourceList, open_source, register_source_kind, source_kind,
                                         source_kinds, unregister_source_kind)
from umlos_cuda.batching.tokens.mapped import MappedMegatron
from umlos_cuda.batching.tokens.offsets import StoreLengths
from umlos_cuda.cli import main
from umlos_cuda.errors import UmlosError

WINDOWED = ("plan", "build", "--window", "16", "--bucket-edges", "64,128", "--overflow-max", "1024",
            "--token-budget", "2048", "--quiet")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("sources")
    store = make_store(root / "s", 70, seed=4)
    prefix = write_megatron(root / "meg", random_sequences(50, seed=5, high=200), np.int32)
    folder = str(store.root)
    return {"store": folder, "cache": f"{folder}/lengths.jsonl", "sidecar": f"{folder}/lengths.jsonl.u32",
            "megatron": prefix}


@pytest.fixture
def toy():
    import toy_source

    if toy_source.KIND not in source_kinds():
        register_source_kind(toy_source.KIND)
    yield toy_source
    unregister_source_kind(toy_source.KIND.name)


def test_each_built_in_kind_is_recognised_and_opened_by_rows(inputs):
    expected = {"store": ("token store", StoreLengths), "megatron": ("Megatron prefix", MappedMegatron),
                "sidecar": ("length sidecar", MappedLengths), "cache": ("length cache", MappedLengths)}
    whole = np.asarray(LengthCache.load(inputs["cache"]).lengths, dtype=np.uint32)
    for name, (kind, cls) in expected.items():
        assert source_kind(inputs[name]).name == kind
        source = open_source(inputs[name])
        assert type(source) is cls and source.origin is not None
    for name in ("store", "sidecar", "cache"):  # one dataset, three ways in: one binding
        assert open_source(inputs[name]).binding() == ArrayLengths(whole).binding()
    assert open_source(inputs["cache"]).origin == inputs["sidecar"]  # what a plan records: the sidecar
    assert source_kind(inputs["megatron"] + ".idx").name == "Megatron prefix"


def test_a_source_already_opened_is_returned_and_tokens_are_asked_for_by_kind(inputs):
    source = open_source(inputs["store"])
    assert open_source(source) is source
    assert open_source(inputs["store"], tokens=True).arrays(0)[0].size > 0
    error = expect(errors.TOKEN_STORE_NOT_FOUND, open_source, inputs["cache"], tokens=True, mention="length cache")
    assert "token store" in error.message and "Megatron prefix" in error.message
    # plan cut --tokens st/lengths.jsonl did not say what to give instead: the store's folder
    folder = inputs["store"]
    for inside in (inputs["cache"], inputs["sidecar"]):
        error = expect(errors.TOKEN_STORE_NOT_FOUND, open_source, inside, tokens=True)
        assert error.message.endswith(f"; it is a file of the token store {folder}: give the folder, {folder}")


def test_a_list_opens_as_one_source_with_global_rows(inputs):
    listed = open_source([inputs["megatron"], inputs["megatron"]])
    single = open_source(inputs["megatron"])
    assert isinstance(listed, SourceList) and listed.count == 2 * single.count
    both = np.concatenate([single.take(np.arange(single.count))] * 2)
    assert listed.binding() == ArrayLengths(both).binding()
    rows = np.asarray([0, single.count - 1, single.count, 2 * single.count - 1])
    assert listed.take(rows).tolist() == both[rows].tolist()
    assert np.array_equal(listed.arrays(single.count + 3)[0], single.arrays(3)[0])
    expect(errors.BATCH_STORE_MISMATCH, open_source, [inputs["megatron"], inputs["store"]], mention="tokenizers")


def test_the_registry_refuses_a_name_twice_and_an_unknown_removal():
    built_in = source_kinds()[-1]
    expect(errors.INVALID_ARGUMENT, register_source_kind, built_in, mention="already registered")
    expect(errors.INVALID_ARGUMENT, unregister_source_kind, built_in.name, mention="no source kind")
    expect(errors.INVALID_ARGUMENT, register_source_kind, "not a kind", mention="SourceKind")
    assert isinstance(built_in, SourceKind) and built_in.name == "length cache"


@pytest.mark.parametrize("kind", ["store", "megatron", "sidecar"])
def test_a_windowed_plan_reopens_what_it_records_with_no_argument(inputs, tmp_path, kind):
    out = tmp_path / "plan"
    assert main([*WINDOWED, "--lengths", inputs[kind], "--output", str(out)]) == 0
    recorded = json.loads((out / "meta.json").read_text())["lengths_path"]
    plan = load_windowed_plan(out)
    assert recorded == plan.source.origin
    held = load_windowed_plan(out, lengths=ArrayLengths(plan.source.take(np.arange(plan.source.count))))
    assert plan.fingerprint == held.fingerprint and plan.microbatch(0, 0) == held.microbatch(0, 0)


def test_a_toy_kind_is_taken_by_every_command_and_loader(inputs, tmp_path, toy, capsys):
    lengths = np.random.default_rng(7).integers(1, 900, size=300)
    path = toy.write(tmp_path / "corpus.toylen", lengths)
    assert source_kind(path) is toy.KIND and source_kinds()[0] is toy.KIND
    out = tmp_path / "toy-plan"
    assert main([*WINDOWED, "--lengths", path, "--output", str(out)]) == 0
    plan = load_windowed_plan(out)  # reopened through the registry: no lengths= needed
    assert isinstance(plan.source, toy.ToyLengths)
    assert plan.fingerprint == load_windowed_plan(out, lengths=ArrayLengths(lengths)).fingerprint
    mixed = tmp_path / "toy-mix"
    assert main([*WINDOWED, "--mix", f"{path}:0.6", f"{inputs['cache']}:0.4", "--num-samples", "200",
                 "--output", str(mixed)]) == 0
    assert isinstance(load_mixed_plan(mixed).definition.sources[0], toy.ToyLengths)
    capsys.readouterr()
    assert main(["plan", "verify", str(out), "--windows", "2"]) == 0
    assert main(["plan", "verify", str(mixed), "--windows", "2"]) == 0
    assert main(["plan", "info", str(mixed)]) == 0
    assert "corpus: weight 0.6" in capsys.readouterr().out


@pytest.mark.parametrize("forged", [[1, 2], [], [["nested"]], 7, {"path": "x"}])
def test_a_forged_recorded_path_is_a_format_error(inputs, tmp_path, forged):
    out = tmp_path / "plan"
    assert main([*WINDOWED, "--lengths", inputs["sidecar"], "--output", str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    meta["lengths_path"] = forged  # outside the fingerprint: the loader reaches the reopening
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UmlosError) as info:
        load_windowed_plan(out)
    assert info.value.code == errors.PLAN_FORMAT_INVALID and "lengths_path" in info.value.message


def test_a_recorded_list_is_reopened_as_one_source(inputs, tmp_path):
    out = tmp_path / "plan"
    assert main([*WINDOWED, "--lengths", inputs["megatron"], "--output", str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    single = load_windowed_plan(out)
    meta["lengths_path"] = [meta["lengths_path"]]  # a list of one part binds as the part
    (out / "meta.json").write_text(json.dumps(meta))
    reopened = load_windowed_plan(out)
    assert isinstance(reopened.source, SourceList) and reopened.fingerprint == single.fingerprint
