"""``umlos-cuda next-batch`` and ``umlos-cuda indices`` (R10): what they print
and write, compared with the independent oracle; their errors and exit
statuses; the help texts. Most run ``umlos_cuda.cli.main`` in-process; a few
run the real command in a child process for exit statuses as a shell sees
them. ``--out`` targets, full disks and signals are in test_cli_output.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import oracle
from nbcases import raw_manifest
from umlos_cuda import cli, errors
from umlos_cuda.commands import nextbatch as nextbatch_command

RAW = raw_manifest(1000, 64, 48, seed=11)
MODEL = oracle.Oracle(RAW)


@pytest.fixture
def manifest(tmp_path) -> str:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(RAW))
    return str(path)


def run(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def usage_error(capsys, *argv) -> str:
    """Run an invocation argparse must refuse; return its stderr."""
    with pytest.raises(SystemExit) as info:
        cli.main([str(a) for a in argv])
    assert info.value.code == 2
    return capsys.readouterr().err


# --------------------------------------------------------------- next-batch
@pytest.mark.parametrize(
    "world_size,rank,stage,cursor",
    [(1, 0, "train", (0, 0)), (4, 3, "train", (2, 96)), (8, 5, "eval", (1, 960)), (2, 1, "infer", (0, 984)),
     (6, 0, "train", (7, 984))],
)
def test_next_batch_json_matches_the_oracle(capsys, manifest, world_size, rank, stage, cursor):
    code, out, err = run(capsys, "next-batch", manifest, "--dataset", "train", "--world-size", world_size,
                         "--rank", rank, "--stage", stage, "--epoch", cursor[0], "--global-index", cursor[1],
                         "--backend", "numpy", "--json")
    assert code == 0 and err == ""
    document = json.loads(out)
    assert set(document) == {"indices", "cursor", "metadata"}
    want = MODEL.next_batch("train", world_size, rank, stage, *cursor)
    assert document["indices"] == want.indices
    assert (document["cursor"]["epoch"], document["cursor"]["global_index"]) == want.cursor
    meta = document["metadata"]
    assert meta["sampling_mode"] == want.sampling_mode
    assert meta["sampler_config_hash"] == want.sampler_config_hash
    assert meta["data_replay_t"] == want.data_replay_t
    assert (meta["world_size"], meta["rank"], meta["stage"]) == (world_size, rank, stage)
    assert meta["effective_batch_size"] == 48 and meta["effective_q"] == 48 / 1000


def test_next_batch_preset(capsys, manifest):
    code, out, _ = run(capsys, "next-batch", manifest, "--dataset", "train", "--preset", "streaming_infinite",
                       "--global-index", 984, "--backend", "numpy", "--json")
    document = json.loads(out)
    want = MODEL.next_batch("train", 1, 0, "train", 0, 984, streaming=True)
    assert code == 0 and document["indices"] == want.indices and document["cursor"] == {"epoch": 1, "global_index": 32}


def test_next_batch_summary(capsys, manifest):
    code, out, err = run(capsys, "next-batch", manifest, "--dataset", "train", "--world-size", 2, "--rank", 1,
                         "--backend", "numpy")
    assert code == 0 and err == ""
    want = MODEL.next_batch("train", 2, 1, "train", 0, 0)
    lines = out.splitlines()
    assert lines[0] == "indices       " + " ".join(map(str, want.indices[:16])) + " ... (24 in all)"
    assert lines[1].startswith("cursor        {'epoch': 0, 'global_index': 48}")
    assert f"data_replay_t {want.data_replay_t}" in lines
    assert "backend       numpy" in lines


def test_next_batch_out_writes_the_indices(capsys, manifest, tmp_path):
    target = tmp_path / "batch.npy"
    code, out, err = run(capsys, "next-batch", manifest, "--dataset", "train", "--world-size", 4, "--rank", 2,
                         "--backend", "numpy", "--out", target)
    assert code == 0 and err == ""
    assert out == f"wrote 12 indices to {target}; next cursor {{'epoch': 0, 'global_index': 48}}\n"
    written = np.load(target)
    assert written.dtype == np.dtype("<u8")
    assert written.tolist() == MODEL.next_batch("train", 4, 2, "train", 0, 0).indices
    with open(target, "rb") as handle:  # byte for byte what np.save writes
        raw = handle.read()
    assert raw == nextbatch_command.npy_header(12) + written.tobytes()
    assert sorted(os.listdir(tmp_path)) == ["batch.npy", "run.json"]  # no temp file left


def test_json_and_out_are_exclusive(capsys, manifest, tmp_path):
    err = usage_error(capsys, "next-batch", manifest, "--dataset", "train", "--json", "--out", tmp_path / "x.npy")
    assert "not allowed with argument" in err
    assert not (tmp_path / "x.npy").exists()


# --------------------------------------------------------------- indices
@pytest.mark.parametrize("start,count", [(0, None), (100, 357), (999, 1), (1000, None), (5, 0)])
def test_indices_writes_the_oracle_window(capsys, manifest, tmp_path, monkeypatch, start, count):
    monkeypatch.setattr(nextbatch_command, "INDICES_CHUNK", 64)  # many chunks, one partial
    target = tmp_path / "window.npy"
    argv = ["indices", manifest, "--dataset", "train", "--epoch", 3, "--start", start, "--backend", "numpy",
            "--out", target, "--quiet"]
    if count is not None:
        argv += ["--count", count]
    code, out, err = run(capsys, *argv)
    length = 1000 - start if count is None else count
    assert code == 0 and err == ""
    assert out == f"wrote {length} indices (epoch 3, positions [{start}, {start + length})) to {target}\n"
    written = np.load(target)
    assert written.dtype == np.dtype("<u8") and written.shape == (length,)
    assert written.tolist() == MODEL.epoch("train", 3).window(start, length)
    with open(target, "rb") as handle:
        assert handle.read() == nextbatch_command.npy_header(length) + written.tobytes()


def test_indices_progress_goes_to_stderr(capsys, manifest, tmp_path):
    code, out, err = run(capsys, "indices", manifest, "--dataset", "train", "--epoch", 0, "--out",
                         tmp_path / "w.npy", "--backend", "numpy")
    assert code == 0 and out.startswith("wrote 1000 indices") and f"indices {tmp_path / 'w.npy'}: 100%" in err


# --------------------------------------------------------------- errors and exit statuses
@pytest.mark.parametrize(
    "argv,code",
    [
        (["next-batch", "{m}", "--dataset", "validation"], errors.INVALID_DATASET_KEY),
        (["next-batch", "{m}", "--dataset", "train", "--world-size", 4, "--rank", 4], errors.INVALID_RANK),
        (["next-batch", "{m}", "--dataset", "train", "--world-size", 5], errors.BATCH_SIZE_INCONSISTENT),
        (["next-batch", "{m}", "--dataset", "train", "--global-index", 1000],
         errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY),
        (["next-batch", "{m}", "--dataset", "train", "--epoch", 2**64], errors.INVALID_MANIFEST),
        (["next-batch", "{missing}", "--dataset", "train"], errors.INVALID_MANIFEST),
        (["indices", "{m}", "--dataset", "train", "--epoch", 0, "--start", 1001, "--out", "{out}"],
         errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY),
        (["indices", "{m}", "--dataset", "train", "--epoch", 0, "--count", 1001, "--out", "{out}"],
         errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY),
        (["indices", "{m}", "--dataset", "nope", "--epoch", 0, "--out", "{out}"], errors.INVALID_DATASET_KEY),
    ],
)
def test_failures_print_one_line_and_exit_2(capsys, manifest, tmp_path, argv, code):
    names = {"m": manifest, "missing": tmp_path / "missing.yaml", "out": tmp_path / "out.npy"}
    argv = [str(a).format(**names) for a in argv]
    status, out, err = run(capsys, *argv, "--backend", "numpy")
    assert status == cli.EXIT_UMLOS_ERROR == 2
    assert out == "" and err.startswith(f"error {code}: ") and err.count("\n") == 1
    assert sorted(os.listdir(tmp_path)) == ["run.json"]  # nothing written, no temp file


def test_a_batch_too_large_to_allocate_is_refused(capsys, tmp_path):
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(raw_manifest(2**64 - 1, 1 << 63, 2**40)))
    status, _, err = run(capsys, "next-batch", path, "--dataset", "train", "--stage", "eval", "--backend", "numpy")
    assert status == 2 and err.startswith(
        f"error {errors.REQUEST_TOO_LARGE}: this call would return 1099511627776 indices")


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--rank", "-1"], "argument --rank: rank must be a non-negative integer, got '-1'"),
        (["--rank", "one"], "argument --rank: rank must be a non-negative integer, got 'one'"),
        (["--world-size", "0"], "argument --world-size: world size must be a positive integer, got '0'"),
        (["--epoch", "-3"], "argument --epoch: epoch must be a non-negative integer, got '-3'"),
        (["--global-index", "1.5"], "argument --global-index: global index must be a non-negative integer, got '1.5'"),
        # int() reads these, or raises ValueError past 4300 digits; the one integer parser refuses them all
        (["--rank", "\u00b2"], "argument --rank: rank must be a non-negative integer, got '\u00b2'"),
        (["--rank", "\u0663"], "argument --rank: rank must be a non-negative integer, got '\u0663'"),
        (["--rank", "1_0"], "argument --rank: rank must be a non-negative integer, got '1_0'"),
        (["--epoch", "9" * 5000], "argument --epoch: epoch must be a non-negative integer, got '99999"),
        (["--stage", "test"], "argument --stage: invalid choice: 'test'"),
        (["--backend", "tpu"], "argument --backend: invalid choice: 'tpu'"),
    ],
)
def test_bad_arguments_are_named_in_the_users_words(capsys, manifest, argv, message):
    err = usage_error(capsys, "next-batch", manifest, "--dataset", "train", *argv)
    assert message in err and "INVALID_MANIFEST" not in err


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--start", "-1"], "argument --start: start must be a non-negative integer, got '-1'"),
        (["--count", "-5"], "argument --count: count must be a non-negative integer, got '-5'"),
        (["--epoch", "x"], "argument --epoch: epoch must be a non-negative integer, got 'x'"),
    ],
)
def test_bad_indices_arguments(capsys, manifest, tmp_path, argv, message):
    err = usage_error(capsys, "indices", manifest, "--dataset", "train", "--epoch", "0", "--out",
                      str(tmp_path / "o.npy"),
                      *argv)
    assert message in err
    assert not (tmp_path / "o.npy").exists()


def test_main_leaves_signal_handlers_as_it_found_them(capsys, manifest):
    before = {s: signal.getsignal(s) for s in cli.TERMINATING_SIGNALS}
    assert run(capsys, "next-batch", manifest, "--dataset", "train", "--backend", "numpy")[0] == 0
    assert run(capsys, "next-batch", manifest, "--dataset", "nope", "--backend", "numpy")[0] == 2
    assert {s: signal.getsignal(s) for s in cli.TERMINATING_SIGNALS} == before


def test_terminating_signals_raise_only_where_left_at_default():
    """A signal the parent ignores (nohup ignores SIGHUP) stays ignored."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with cli._terminating_signals_raise():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)
            with pytest.raises(cli.Terminated) as info:
                signal.raise_signal(signal.SIGTERM)
            assert info.value.signum == signal.SIGTERM
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGHUP, previous)


# --------------------------------------------------------------- help texts
def _parsers():
    """(name, parser) of the commands this module covers, sub-actions included."""
    import argparse

    root = cli.build_parser()
    commands = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction)).choices
    found = [("umlos-cuda", root)]
    for name in ("next-batch", "indices", "selftest", "golden", "env"):
        found.append((name, commands[name]))
        for action in commands[name]._actions:
            if isinstance(action, argparse._SubParsersAction):
                found += [(f"{name} {sub}", parser) for sub, parser in action.choices.items()]
    return found


@pytest.mark.parametrize("name,parser", _parsers(), ids=lambda value: value if isinstance(value, str) else "")
def test_help_is_plain_words(name, parser):
    text = parser.format_help()
    assert "``" not in text, "reST markup in help"
    assert "§" not in text, "spec clause numbers in help"
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            assert action.help, f"{name} {action.option_strings[0]} has no help"
    description = parser.description or ""
    assert description.rstrip().endswith((".", ")")), f"{name}: description stops mid-sentence: {description!r}"


def test_selftest_help_names_every_check():
    text = dict(_parsers())["selftest"].format_help()
    for check in ("philox-kat", "r9-self-check", "parity", "permutation", "exact"):
        assert f"\n  {check} " in text
    assert "Exit status 0 when no check failed" in text


def test_defaults_are_stated():
    parsers = dict(_parsers())
    text = " ".join(parsers["next-batch"].format_help().split())
    for phrase in ("must divide global_batch_size (default 1)", "0 to W-1 (default 0)",
                   "epoch before the call (default 0)", "(default auto)"):
        assert phrase in text
    text = " ".join(parsers["indices"].format_help().split())
    assert "(default 0)" in text and "to the end of the epoch" in text and "--force" in text


# --------------------------------------------------------------- real processes
def command(*argv) -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "umlos-cuda")
    prefix = [script] if os.path.exists(script) else [sys.executable, "-m", "umlos_cuda.cli"]
    return prefix + [str(a) for a in argv]


def test_exit_statuses_of_the_installed_command(manifest, tmp_path):
    done = subprocess.run(command("next-batch", manifest, "--dataset", "train", "--backend", "numpy", "--json"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    assert json.loads(done.stdout)["indices"] == MODEL.next_batch("train", 1, 0, "train", 0, 0).indices
    done = subprocess.run(command("next-batch", manifest, "--dataset", "nope"), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("error INVALID_DATASET_KEY: ") and "Traceback" not in done.stderr
    done = subprocess.run(command("next-batch", manifest, "--dataset", "train", "--rank", "-1"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "rank must be a non-negative integer" in done.stderr
    done = subprocess.run(command("indices", manifest, "--dataset", "train", "--epoch", 0, "--out", tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("error OUTPUT_PATH_INVALID: ") and "Traceback" not in done.stderr
    done = subprocess.run([sys.executable, "-m", "umlos_cuda.cli"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "usage: umlos-cuda" in done.stdout


def test_a_named_command_gets_the_same_parser_alone():
    """``main`` builds only the parser of the command it is given (its module alone is imported):
    that command's parser and every sub-action's help are the full parser's, and the top-level
    usage line is the same; a name that is no command module gets every command."""
    import argparse

    def commands(root):
        return next(a for a in root._actions if isinstance(a, argparse._SubParsersAction)).choices

    full = cli.build_parser()
    assert set(commands(cli.build_parser("next-batch"))) == set(commands(full)) == set(commands(cli.build_parser()))
    for name in ("plan", "data", "batch", "checkpoint", "env"):
        alone = cli.build_parser(name)
        assert list(commands(alone)) == [name] and alone.format_usage() == full.format_usage()
        mine, theirs = commands(alone)[name], commands(full)[name]
        assert mine.format_help() == theirs.format_help()
        for action in mine._actions:
            if isinstance(action, argparse._SubParsersAction):
                other = next(a for a in theirs._actions if isinstance(a, argparse._SubParsersAction))
                assert {k: p.format_help() for k, p in action.choices.items()} == \
                    {k: p.format_help() for k, p in other.choices.items()}
