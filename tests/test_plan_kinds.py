"""The plan-kind registry (umlos_cuda/batching/plans/kinds/): every plan folder is reached through it.

Each built-in kind is recognised by its folder's marker, opens with no argument but the folder, and is
reported and verified by ``plan info`` / ``plan verify`` through its own functions; an option a kind does
not take is refused naming the ones it does; and a toy kind (tests/toy_plan_kind.py: one module and its
registration) is taken by ``open_plan``, ``plan info`` and ``plan verify`` like the built-in ones; and every
kind built by the commands over every kind of source opens, and is explained at a step, from its folder alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from token_cases import make_store

from umlos_cuda import errors
from umlos_cuda.batching.plans.explain import explain
from umlos_cuda.batching.plans.kinds import (PlanKind, get_plan_kind, open_plan, plan_kind_of, plan_kinds,
                                             register_plan_kind, unregister_plan_kind)
from umlos_cuda.batching.sources import open_source
from umlos_cuda.cli import main
from umlos_cuda.errors import UmlosError

BUDGET = ("--bucket-edges", "64,128", "--overflow-max", "1024", "--token-budget", "2048", "--quiet")


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    """One folder of each built-in kind, over one token store."""
    root = tmp_path_factory.mktemp("kinds")
    store = str(make_store(root / "s", 80, seed=6).root)
    cache = f"{store}/lengths.jsonl"
    out = {name: str(root / name) for name in ("plan", "windowed plan", "mixed plan", "pretraining sequences",
                                               "mixed pretraining sequences")}
    commands = {
        "plan": ["plan", "build", "--lengths", cache, *BUDGET],
        "windowed plan": ["plan", "build", "--window", "16", "--lengths", store, *BUDGET],
        "mixed plan": ["plan", "build", "--window", "16", "--mix", f"{store}:0.5", f"{cache}:0.5",
                       "--num-samples", "100", *BUDGET],
        "pretraining sequences": ["plan", "cut", "--tokens", store, "--sequence-length", "32", "--window", "8"],
        "mixed pretraining sequences": ["plan", "cut", "--mix", f"{store}:0.5", f"{store}:0.5", "--num-samples", "40",
                                        "--sequence-length", "32", "--window", "8"],
    }
    for name, argv in commands.items():
        assert main([*argv, "--output", out[name]]) == 0
    return {**out, "store": store}


def test_the_built_in_kinds_and_their_place_in_the_model():
    table = {k.name: (k.order, k.scope, k.unit, k.rows) for k in plan_kinds()[:5]}
    assert table == {"plan": ("dataset", "epoch", "microbatch", True),
                     "windowed plan": ("dataset", "windows", "microbatch", True),
                     "mixed plan": ("mixture", "windows", "microbatch", True),
                     "pretraining sequences": ("dataset", "windows", "sample", False),
                     "mixed pretraining sequences": ("mixture", "windows", "sample", False)}


@pytest.mark.parametrize("name", ["plan", "windowed plan", "mixed plan", "pretraining sequences",
                                  "mixed pretraining sequences"])
def test_each_kind_is_recognised_opened_reported_and_verified(folders, name, capsys):
    kind = plan_kind_of(folders[name])
    assert kind is get_plan_kind(name)
    plan = open_plan(folders[name])  # the sources reopened from what the folder records
    fingerprint = json.loads(Path(folders[name], "meta.json").read_text())["fingerprint"]
    assert plan.fingerprint == fingerprint
    report = kind.report(folders[name], world_size=2)
    assert report["fingerprint"] == fingerprint and report["kind"] == name
    assert kind.lines(report)[0].startswith(name)
    assert kind.verify(folders[name], expected_fingerprint=fingerprint)["fingerprint"] == fingerprint
    capsys.readouterr()
    assert main(["plan", "info", folders[name], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fingerprint"] == fingerprint
    assert main(["plan", "verify", folders[name]]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"{name} {folders[name]} verified: fingerprint {fingerprint}"


@pytest.mark.parametrize("name, argv, refused", [
    ("plan", ["--windows", "2"], "--windows and --seed"),
    ("mixed plan", ["--lengths", "x"], "--source does not apply"),
    ("pretraining sequences", ["--no-rebuild"], "--no-rebuild does not apply"),
])
def test_an_option_a_kind_does_not_take_is_refused_naming_those_it_takes(folders, name, argv, refused, capsys):
    assert main(["plan", "verify", folders[name], *argv]) == 2
    err = capsys.readouterr().err
    assert "BATCHING_CONFIG_INVALID" in err and refused in err and f"is a {name} folder" in err


def test_a_folder_of_another_artifact_is_not_a_plan(folders):
    with pytest.raises(UmlosError) as info:
        plan_kind_of(folders["store"])
    assert info.value.code == errors.PLAN_NOT_FOUND and "is a token store, not a plan" in info.value.message


def test_the_registry_refuses_a_name_twice_a_wrong_kind_and_a_built_in_removal():
    whole = get_plan_kind("plan")
    for call, args, mention in ((register_plan_kind, (whole,), "already registered"),
                                (register_plan_kind, ("plan",), "takes a PlanKind"),
                                (unregister_plan_kind, ("plan",), "registered at run time"),
                                (get_plan_kind, ("nope",), "unknown plan kind")):
        with pytest.raises(UmlosError) as info:
            call(*args)
        assert info.value.code == errors.INVALID_ARGUMENT and mention in info.value.message
    with pytest.raises(UmlosError, match="scope"):
        PlanKind(whole.artifact, order="dataset", scope="forever", unit="microbatch", rows=True, open=whole.open,
                 save=whole.save, verify=whole.verify, report=whole.report, lines=whole.lines, whole=whole.whole)
    with pytest.raises(UmlosError, match="whole"):  # only a kind of rows can be a whole plan
        PlanKind(whole.artifact, order="dataset", scope="epoch", unit="sample", rows=False, open=whole.open,
                 save=whole.save, verify=whole.verify, report=whole.report, lines=whole.lines, whole=whole.whole)


def test_a_toy_kind_is_one_module_and_its_registration(folders, tmp_path, capsys):
    import toy_plan_kind as toy

    if toy.KIND not in plan_kinds():
        register_plan_kind(toy.KIND)
    try:
        source = open_source(f"{folders['store']}/lengths.jsonl")
        folder = toy.KIND.save(toy.ToyPlan(source, 7), tmp_path / "toy")
        assert plan_kind_of(folder) is toy.KIND
        plan = open_plan(folder)
        assert plan.num_microbatches == -(-80 // 7) and plan.microbatch(11) == [77, 78, 79]
        assert plan.tokens(0) == int(np.sum(source.take(np.arange(7))))
        capsys.readouterr()
        assert main(["plan", "info", folder, "--world-size", "3", "--rank", "1"]) == 0
        assert capsys.readouterr().out.splitlines() == [f"toy plan {folder}: 12 microbatches of 7 rows",
                                                        "  rank 1: 4 microbatches"]
        assert main(["plan", "verify", folder]) == 0
        assert capsys.readouterr().out.splitlines()[-1].startswith(f"toy plan {folder} verified")
        assert main(["plan", "verify", folder, "--windows", "1"]) == 2
        assert "it takes --expected-fingerprint" in capsys.readouterr().err
        assert main(["info", folder]) == 0  # registered as a plan kind, it is an artifact too
        assert capsys.readouterr().out.startswith(f"toy plan {folder}: 12 microbatches")
    finally:
        unregister_plan_kind(toy.KIND.name)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, str]:
    """One source of each built-in kind: a token store and its length cache and sidecar (one dataset, three ways
    in), a sharded token store and a Megatron prefix."""
    from batching_cases import train_tokenizer, write_model_dir
    from token_cases import random_sequences, records, write_megatron

    from umlos_cuda.batching.tokens.sharded import tokenize_sharded

    root = tmp_path_factory.mktemp("every-source")
    store = str(make_store(root / "s", 80, seed=6).root)
    write_model_dir(root / "model", train_tokenizer(), {"eos_token": "</s>"})
    files = []
    for i, rows in enumerate((records(70, seed=2)[:30], records(70, seed=2)[30:])):
        files.append(str(root / f"part-{i}.jsonl"))
        Path(files[-1]).write_text("".join(json.dumps({"prompt": r["prompt"], "response": r["response"]}) + "\n"
                                           for r in rows), encoding="utf-8")
    sharded = tokenize_sharded(files, root / "model", root / "sharded", prompt_field="prompt",
                               response_field="response")
    prefix = write_megatron(root / "meg", random_sequences(50, seed=5, high=200), np.int32)
    return {"token store": store, "length cache": f"{store}/lengths.jsonl",
            "length sidecar": f"{store}/lengths.jsonl.u32", "sharded token store": str(sharded.root),
            "Megatron prefix": prefix}


def _build_argv(kind: str, source: str, other: str) -> list[str]:
    """The command that builds a plan of ``kind`` over ``source`` (a mixture: beside the token store ``other``)."""
    cut = ["--sequence-length", "32", "--window", "8", "--quiet"]
    return {"plan": ["plan", "build", "--source", source, *BUDGET],
            "windowed plan": ["plan", "build", "--window", "16", "--source", source, *BUDGET],
            "mixed plan": ["plan", "build", "--window", "16", "--mix", f"{source}:0.5", f"{other}:0.5",
                           "--num-samples", "60", *BUDGET],
            "pretraining sequences": ["plan", "cut", "--source", source, *cut],
            "mixed pretraining sequences": ["plan", "cut", "--mix", f"{source}:0.5", f"{other}:0.5",
                                            "--num-samples", "30", *cut]}[kind]


KINDS = ("plan", "windowed plan", "mixed plan", "pretraining sequences", "mixed pretraining sequences")
SOURCES = ("token store", "length cache", "length sidecar", "sharded token store", "Megatron prefix")


@pytest.mark.parametrize("source_name", SOURCES)
@pytest.mark.parametrize("kind", KINDS)
def test_open_plan_opens_every_kind_over_every_source_with_no_argument(sources, kind, source_name, tmp_path,
                                                                       capsys):
    """Built by the command from each kind of source, every plan opens from its folder alone and verifies; a cut
    needs tokens, so a length-only source is refused for it, naming the kinds that hold them."""
    out = str(tmp_path / "plan")
    argv = [*_build_argv(kind, sources[source_name], sources["token store"]), "--output", out]
    if kind.endswith("pretraining sequences") and source_name.startswith("length"):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "TOKEN_STORE_NOT_FOUND" in err and f"is a {source_name}, which holds no tokens" in err
        return
    assert main(argv) == 0
    plan = open_plan(out)
    assert plan_kind_of(out).name == kind
    assert plan.fingerprint == json.loads(Path(out, "meta.json").read_text())["fingerprint"]
    unit = explain(out, 0)["steps"][0]["ranks"][0]["units"][0]  # plan explain, from the folder alone
    assert unit["rows"] and unit["tokens"] == sum(row["tokens"] for row in unit["rows"]) > 0
    if kind != "mixed plan":  # loss tokens where the plan records tokens (a whole plan records no source)
        assert (unit["loss_tokens"] is not None) == (kind != "plan" and not source_name.startswith("length"))
    capsys.readouterr()
    assert main(["verify", out]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"{kind} {out} verified: fingerprint {plan.fingerprint}"


@pytest.mark.parametrize("kind", ["plan", "windowed plan"])
def test_one_dataset_three_ways_in_is_one_plan(sources, kind, tmp_path):
    """A token store, its length cache and the cache's sidecar hold the same rows: the same plan from each."""
    fingerprints = set()
    for name in ("token store", "length cache", "length sidecar"):
        out = str(tmp_path / name.replace(" ", "-"))
        assert main([*_build_argv(kind, sources[name], ""), "--output", out]) == 0
        fingerprints.add(open_plan(out).fingerprint)
    assert len(fingerprints) == 1


def test_a_whole_plan_of_a_sidecar_without_its_cache_says_what_to_give(sources, tmp_path, capsys):
    lone = tmp_path / "lone.jsonl.u32"
    lone.write_bytes(Path(sources["length sidecar"]).read_bytes())
    assert main([*_build_argv("plan", str(lone), ""), "--output", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert "LENGTHS_INVALID" in err and str(tmp_path / "lone.jsonl") in err and "--window" in err
    assert main([*_build_argv("windowed plan", str(lone), ""), "--output", str(tmp_path / "w")]) == 0
