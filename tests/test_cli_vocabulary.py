"""One vocabulary on the command line (docs/cli.md): a flag per concept, the old spellings parsed but never
shown, ``--order`` as the one choice of order, and ``--config FILE`` for long invocations."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from umlos_cuda import errors
from umlos_cuda.cli import build_parser, main
from umlos_cuda.commands._args import resolve_order
from umlos_cuda.commands._config import expand_config
from umlos_cuda.errors import UmlosError

#: Each old spelling and the new one that replaced it (docs/cli.md).
RENAMED = {"--lengths": "--source", "--tokens": "--source", "--store": "--source", "--out": "--output",
           "--eos-token": "--eos", "--window-mbs": "--window", "--samples-per-window": "--window-samples",
           "--sampling-mode": "--order"}


def leaf_parsers(parser: argparse.ArgumentParser, path=()):
    """``(command words, parser)`` of every command that runs something."""
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers:
        yield path, parser
    for action in subparsers:
        for name, child in action.choices.items():
            yield from leaf_parsers(child, (*path, name))


LEAVES = dict(leaf_parsers(build_parser()))


@pytest.mark.parametrize("command", sorted(" ".join(words) for words in LEAVES))
def test_no_help_shows_an_old_spelling(command):
    parser = LEAVES[tuple(command.split())]
    text = parser.format_help()
    for old in RENAMED:
        assert not re.search(rf"(?<![\w-]){re.escape(old)}(?![\w-])", text), (command, old)


def test_every_old_spelling_is_still_an_option_of_the_same_action():
    found = {}
    for words, parser in LEAVES.items():
        for action in parser._actions:
            for old in getattr(action, "old_spellings", ()):
                assert RENAMED[old] in action.option_strings, (words, old)
                found.setdefault(old, []).append(" ".join(words))
    assert set(found) == set(RENAMED), set(RENAMED) - set(found)


def test_one_spelling_of_each_concept_remains():
    shown = {text for parser in LEAVES.values() for action in parser._actions if action.help != argparse.SUPPRESS
             for text in action.option_strings if text not in getattr(action, "old_spellings", ())}
    assert not shown & set(RENAMED)
    assert {"--source", "--output", "--order", "--eos", "--window", "--quiet"} <= shown


@pytest.mark.parametrize("old, new", [
    (["plan", "build", "--lengths", "x.jsonl"], ["plan", "build", "--source", "x.jsonl"]),
    (["plan", "cut", "--tokens", "store"], ["plan", "cut", "--source", "store"]),
    (["batch", "generate", "--plan", "p", "--store", "a", "b"], ["batch", "generate", "--plan", "p", "--source", "a",
                                                                "b"]),
    (["indices", "m.yaml", "--dataset", "d", "--epoch", "0", "--out", "x.npy"],
     ["indices", "m.yaml", "--dataset", "d", "--epoch", "0", "--output", "x.npy"]),
    (["data", "tokenize", "--eos-token", "</s>"], ["data", "tokenize", "--eos", "</s>"]),
])
def test_an_old_spelling_parses_to_what_the_new_one_does(old, new):
    required = {"plan build": ["--token-budget", "8", "--output", "o"], "plan cut": ["--sequence-length", "8",
                                                                                   "--output", "o"],
                "batch generate": ["--output", "o"], "data tokenize": ["--dataset", "d", "--tokenizer", "t",
                                                                       "--output", "o"]}
    extra = required.get(" ".join(old[:2]), [])
    parser = build_parser()
    assert vars(parser.parse_args(old + extra)) == vars(parser.parse_args(new + extra))


@pytest.mark.parametrize("flags, expected", [
    ({}, ("SHUFFLE_WITHOUT_REPLACEMENT_BLOCK_AFFINE_V1", "block_affine")),
    ({"order": "feistel"}, ("SHUFFLE_WITHOUT_REPLACEMENT_BLOCK_AFFINE_V1", "feistel")),
    ({"order": "sequential"}, ("SEQUENTIAL_V1", "block_affine")),
    ({"order": "streaming:block_feistel"}, ("STREAMING_SHUFFLE_BLOCK_AFFINE_V1", "block_feistel")),
    ({"sampling_mode": "streaming", "order": "feistel"}, ("STREAMING_SHUFFLE_BLOCK_AFFINE_V1", "feistel")),
    ({"sampling_mode": "sequential"}, ("SEQUENTIAL_V1", "block_affine")),
])
def test_order_is_one_choice_and_the_old_pair_means_the_same(flags, expected):
    assert resolve_order(argparse.Namespace(**{"order": None, "sampling_mode": None, **flags})) == expected


def test_a_plan_built_with_the_old_flags_is_the_one_built_with_the_new(tmp_path):
    from token_cases import make_store

    store = str(make_store(tmp_path / "s", 40, seed=2).root)
    common = ["plan", "build", "--token-budget", "1024", "--bucket-edges", "64,128", "--overflow-max", "512",
              "--quiet"]
    assert main([*common, "--lengths", store, "--sampling-mode", "streaming", "--order", "feistel",
                 "--output", str(tmp_path / "old")]) == 0
    assert main([*common, "--source", store, "--order", "streaming:feistel", "--output", str(tmp_path / "new")]) == 0
    assert (tmp_path / "old" / "meta.json").read_bytes() == (tmp_path / "new" / "meta.json").read_bytes()


def test_a_config_file_gives_its_flags_where_it_stands(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("source: x\nbucket_edges: 1,2\nmix: [a:1, b:2]\npack: true\nforce: false\nseed: null\n")
    assert expand_config(["plan", "build", "--seed", "1", "--config", str(path), "--output", "o"]) == [
        "plan", "build", "--seed", "1", "--source", "x", "--bucket-edges", "1,2", "--mix", "a:1", "b:2", "--pack",
        "--output", "o"]
    (tmp_path / "c.json").write_text(json.dumps({"token-budget": 8}))
    assert expand_config([f"--config={tmp_path / 'c.json'}"]) == ["--token-budget", "8"]


@pytest.mark.parametrize("text, mention", [
    ("- a\n- b\n", "mapping"),
    ("--source: x\n", "not a flag name"),
    ("source: {a: 1}\n", "a value is"),
    ("mix: [[1]]\n", "a list holds"),
    ("a: [" * 40 + "]" * 40 + "\n", "not YAML or JSON"),
])
def test_a_config_file_that_is_not_a_mapping_of_flags_is_refused(tmp_path, text, mention):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(UmlosError) as info:
        expand_config(["--config", str(path)])
    assert info.value.code == errors.INVALID_ARGUMENT and mention in info.value.message
    assert info.value.record["failure_operator"] == errors.CLI_OPERATOR


def test_a_config_that_is_not_a_regular_file_is_refused_by_the_command(tmp_path, capsys):
    import os

    os.mkfifo(tmp_path / "fifo.yaml")
    assert main(["plan", "build", "--config", str(tmp_path / "fifo.yaml")]) == 2
    assert "INVALID_ARGUMENT" in capsys.readouterr().err
