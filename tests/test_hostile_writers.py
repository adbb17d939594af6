"""Hostile writers: the "Data loss" class of issue 20, one fenced child per case.

Every command and API that writes is tried where a careless writer loses
data: ``--force`` over an artifact of another kind or over a folder this
project did not write, an output that is (or holds, or sits inside) an input
of the same command, a symbolic link where the output or one of its members
goes, a planted temp name, the modes under two umasks, and a retry after a
failure. The verdicts are those of tests/hostile_support.py: a refusal with a
documented code that names the path, or a success, inside the limits, and
nothing changed outside the case's own output.

The artifacts (tokenizer, dataset, length cache, plan, token store, batch
folder, Megatron files) are built once in-process; each case copies what it
needs into its own folder, so a case that writes where it must not shows up
in :func:`hostile_support.tree_state` of that folder.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
from pathlib import Path

import pytest

import hostile_support as hs
from batching_cases import train_tokenizer, write_model_dir
from token_cases import random_sequences, write_dataset, write_megatron
from umlos_cuda import errors

PLAN_ARGS = ("--token-budget", "4096", "--bucket-edges", "64,128,256", "--overflow-max", "512", "--quiet")
CASES: dict[str, object] = {}


def case(name: str):
    def register(function):
        CASES[f"loss/{name}"] = function
        return function
    return register


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    """model/, ds.jsonl, lengths.jsonl (+ .u32), plan/, store/, batches/, mega.idx/.bin, mixed/ (a mixed plan of two
    components over the store): each of its kind."""
    from umlos_cuda import cli
    from umlos_cuda.batching.batches.writer import write_batches
    from umlos_cuda.batching.lengths.builder import build_lengths
    from umlos_cuda.batching.tokens.writer import tokenize_dataset

    root = tmp_path_factory.mktemp("artifacts")
    write_model_dir(root / "model", train_tokenizer(), {"eos_token": "</s>"})
    (root / "model" / "model.safetensors").write_bytes(b"weights that must survive")
    write_dataset(root / "ds.jsonl", 40)
    build_lengths(root / "ds.jsonl", root / "model", root / "lengths.jsonl")
    assert cli.main(["plan", "build", "--lengths", str(root / "lengths.jsonl"), "--output", str(root / "plan"),
                     *PLAN_ARGS]) == 0
    tokenize_dataset(root / "ds.jsonl", root / "model", root / "store")
    write_batches(str(root / "plan"), root / "batches", str(root / "store"), workers=1)
    assert cli.main(["plan", "build", "--window", "16", "--mix", f"{root / 'store'}:0.5", f"{root / 'store'}:0.5",
                     "--num-samples", "60", "--output", str(root / "mixed"), *PLAN_ARGS]) == 0
    write_megatron(root / "mega", random_sequences(12, seed=3))
    from umlos_cuda.batching.tokens.sharded import tokenize_shard, tokenize_sharded

    parts = [str(root / f"part-{i}.jsonl") for i in range(3)]
    for i, part in enumerate(parts):
        write_dataset(part, 8 + i, seed=20 + i, ids=False)
    tokenize_sharded(parts[:2], root / "model", root / "sharded")
    tokenize_shard(parts, 2, root / "model", root / "staged")
    return root


@pytest.fixture(scope="module")
def gym_server(tmp_path_factory):
    from streams_support import puzzle_server

    with puzzle_server(tmp_path_factory.mktemp("server")) as address:
        yield address


class Workspace:
    """One case's folder: copies of the artifacts, and the fenced commands run in it."""

    def __init__(self, root: Path, artifacts: Path, request) -> None:
        self.root = root
        self.artifacts = artifacts
        self.request = request

    def server(self) -> int:
        """The port of a live puzzle server (started on first use; skipped without the gym extra)."""
        return self.request.getfixturevalue("gym_server")[1]

    def copy(self, name: str, as_name: str | None = None) -> str:
        source, target = self.artifacts / name, self.root / (as_name or name)
        if source.is_dir():
            shutil.copytree(source, target, symlinks=True)
        else:
            shutil.copy2(source, target)
            if name.endswith(".jsonl") and Path(str(source) + ".u32").exists():
                shutil.copy2(str(source) + ".u32", str(target) + ".u32")
        return str(target)

    def path(self, name: str) -> str:
        return str(self.root / name)

    def state(self) -> dict:
        return hs.tree_state(self.root)

    def cli(self, *args: str) -> hs.Outcome:
        return hs.cli(*map(str, args), cwd=self.root)

    def cli_with_umask(self, umask: int, *args: str) -> hs.Outcome:
        code = ("import os, sys\nos.umask(int(sys.argv[1], 8))\nfrom umlos_cuda.cli import main\n"
                "sys.exit(main(sys.argv[2:]))")
        return hs.python(code, oct(umask), *map(str, args), cwd=self.root)

    def cli_with_file_limit(self, limit: int, *args: str) -> hs.Outcome:
        code = ("import resource, sys\nresource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]),) * 2)\n"
                "from umlos_cuda.cli import main\nsys.exit(main(sys.argv[2:]))")
        return hs.python(code, str(limit), *map(str, args), cwd=self.root)

    def refused(self, code, names, *args: str) -> None:
        """``umlos-cuda ARGS`` is refused with ``code`` naming ``names``, and nothing in the case's folder changed."""
        before = self.state()
        hs.assert_refused(self.cli(*args), code, names=names)
        hs.assert_untouched(before, self.state())


def victim(w: Workspace) -> str:
    """A file outside every output that a write through a link would change."""
    path = w.path("victim.txt")
    Path(path).write_text("keep me\n")
    return path


def assert_modes(folder: str, umask: int) -> None:
    """Every folder and file under ``folder`` has the mode the umask gives."""
    for base, _, files in os.walk(folder):
        assert stat.S_IMODE(os.stat(base).st_mode) == 0o777 & ~umask, base
        for name in files:
            path = os.path.join(base, name)
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~umask, path


def leftovers(folder: str) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.startswith((".tmp", ".old")))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------------- plan build
@case("plan-build/force-over-token-store")
def _(w):
    w.refused(errors.OUTPUT_PATH_INVALID, w.copy("store"), "plan", "build", "--lengths", w.copy("lengths.jsonl"),
              "--output", w.path("store"), "--force", *PLAN_ARGS)


@case("plan-build/force-over-model-folder")
def _(w):
    model = w.copy("model")
    Path(model, "meta.json").write_text('{"format": "someone else\'s"}\n')
    w.refused(errors.OUTPUT_PATH_INVALID, model, "plan", "build", "--lengths", w.copy("lengths.jsonl"),
              "--output", model, "--force", *PLAN_ARGS)


@case("plan-build/force-over-folder-holding-its-lengths")
def _(w):
    plan = w.copy("plan")
    shutil.copy2(w.artifacts / "lengths.jsonl", Path(plan) / "lengths.jsonl")
    w.refused(errors.OUTPUT_IS_INPUT, plan, "plan", "build", "--lengths", os.path.join(plan, "lengths.jsonl"),
              "--output", plan, "--force", *PLAN_ARGS)


@case("plan-build/output-symlink-to-plan")
def _(w):
    os.symlink(w.copy("plan"), w.path("link"))
    w.refused(errors.OUTPUT_PATH_INVALID, w.path("link"), "plan", "build", "--lengths", w.copy("lengths.jsonl"),
              "--output", w.path("link"), "--force", *PLAN_ARGS)


@case("plan-build/output-dangling-symlink")
def _(w):
    os.symlink(w.path("elsewhere"), w.path("link"))
    w.refused(errors.OUTPUT_PATH_INVALID, w.path("link"), "plan", "build", "--lengths", w.copy("lengths.jsonl"),
              "--output", w.path("link"), *PLAN_ARGS)


@case("plan-build/force-replaces-a-plan")
def _(w):
    plan, lengths = w.copy("plan"), w.copy("lengths.jsonl")
    before = w.state()
    hs.assert_ok(w.cli("plan", "build", "--lengths", lengths, "--output", plan, "--force", "--seed", "7", *PLAN_ARGS))
    hs.assert_untouched(before, w.state(), owned=["plan"])
    assert json.loads(Path(plan, "meta.json").read_text())["seed"] == 7 and leftovers(w.path(".")) == []


def _plan_umask(w, umask):
    hs.assert_ok(w.cli_with_umask(umask, "plan", "build", "--lengths", w.copy("lengths.jsonl"), "--output",
                                  w.path("plan"), *PLAN_ARGS))
    assert_modes(w.path("plan"), umask)


case("plan-build/umask-022")(lambda w: _plan_umask(w, 0o022))
case("plan-build/umask-027")(lambda w: _plan_umask(w, 0o027))


@case("plan-build/retry-after-a-failed-write")
def _(w):
    lengths = w.copy("lengths.jsonl")
    args = ("plan", "build", "--lengths", lengths, "--output", w.path("plan"), *PLAN_ARGS)
    hs.assert_refused(w.cli_with_file_limit(200, *args), errors.OUTPUT_WRITE_FAILED, names=w.path("plan"))
    assert not os.path.lexists(w.path("plan")) and leftovers(w.path(".")) == []
    hs.assert_ok(w.cli(*args))  # no --force: the failure left nothing in the way


@case("plan-build-window/force-over-a-plan")
def _(w):
    w.refused(errors.OUTPUT_PATH_INVALID, w.copy("plan"), "plan", "build", "--lengths", w.copy("lengths.jsonl"),
              "--output", w.path("plan"), "--force", "--window", "16", *PLAN_ARGS)


@case("plan-build-window/force-over-folder-holding-its-lengths")
def _(w):
    lengths = w.copy("lengths.jsonl")
    hs.assert_ok(w.cli("plan", "build", "--lengths", lengths, "--output", w.path("windowed"), "--window", "16",
                       *PLAN_ARGS))
    shutil.copy2(w.artifacts / "lengths.jsonl", Path(w.path("windowed")) / "lengths.jsonl")
    shutil.copy2(w.artifacts / "lengths.jsonl.u32", Path(w.path("windowed")) / "lengths.jsonl.u32")
    w.refused(errors.OUTPUT_IS_INPUT, w.path("windowed"), "plan", "build", "--lengths",
              os.path.join(w.path("windowed"), "lengths.jsonl"), "--output", w.path("windowed"), "--force",
              "--window", "16", *PLAN_ARGS)


@case("plan-build-window/force-over-folder-holding-its-u32-lengths")
def _(w):
    """Named by its .u32 sidecar alone, the lengths are still an input the output may not hold."""
    lengths = w.copy("lengths.jsonl")
    hs.assert_ok(w.cli("plan", "build", "--lengths", lengths + ".u32", "--output", w.path("windowed"), "--window",
                       "16", *PLAN_ARGS))
    shutil.copy2(w.artifacts / "lengths.jsonl.u32", Path(w.path("windowed")) / "lengths.jsonl.u32")
    w.refused(errors.OUTPUT_IS_INPUT, w.path("windowed"), "plan", "build", "--lengths",
              os.path.join(w.path("windowed"), "lengths.jsonl.u32"), "--output", w.path("windowed"), "--force",
              "--window", "16", *PLAN_ARGS)


@case("plan-build-window/force-replaces-a-windowed-plan")
def _(w):
    lengths = w.copy("lengths.jsonl")
    args = ("plan", "build", "--lengths", lengths, "--output", w.path("windowed"), "--window", "16", *PLAN_ARGS)
    hs.assert_ok(w.cli(*args))
    before = w.state()
    hs.assert_ok(w.cli(*args, "--force", "--seed", "7"))
    hs.assert_untouched(before, w.state(), owned=["windowed"])
    assert json.loads(Path(w.path("windowed"), "meta.json").read_text())["config"]["seed"] == 7
    assert leftovers(w.path(".")) == []


@case("plan-build-window/retry-after-a-failed-write")
def _(w):
    lengths = w.copy("lengths.jsonl")
    args = ("plan", "build", "--lengths", lengths, "--output", w.path("windowed"), "--window", "16", *PLAN_ARGS)
    hs.assert_refused(w.cli_with_file_limit(200, *args), errors.OUTPUT_WRITE_FAILED, names=w.path("windowed"))
    assert not os.path.lexists(w.path("windowed")) and leftovers(w.path(".")) == []
    hs.assert_ok(w.cli(*args))


@case("plan-build-mix/force-over-a-windowed-plan")
def _(w):
    lengths = w.copy("lengths.jsonl")
    hs.assert_ok(w.cli("plan", "build", "--lengths", lengths, "--output", w.path("windowed"), "--window", "16",
                       *PLAN_ARGS))
    w.refused(errors.OUTPUT_PATH_INVALID, w.path("windowed"), "plan", "build", "--mix", f"{lengths}:1:2",
              "--output", w.path("windowed"), "--force", "--window", "16", *PLAN_ARGS)


@case("plan-build-mix/force-over-folder-holding-its-lengths")
def _(w):
    lengths = w.copy("lengths.jsonl")
    args = ("plan", "build", "--mix", f"{lengths}:0.5:2", "--output", w.path("mixed"), "--window", "16", *PLAN_ARGS)
    hs.assert_ok(w.cli(*args))
    shutil.copy2(w.artifacts / "lengths.jsonl", Path(w.path("mixed")) / "lengths.jsonl")
    shutil.copy2(w.artifacts / "lengths.jsonl.u32", Path(w.path("mixed")) / "lengths.jsonl.u32")
    w.refused(errors.OUTPUT_IS_INPUT, w.path("mixed"), "plan", "build", "--mix",
              os.path.join(w.path("mixed"), "lengths.jsonl") + ":1:2", "--output", w.path("mixed"), "--force",
              "--window", "16", *PLAN_ARGS)


@case("plan-build-mix/retry-after-a-failed-write")
def _(w):
    lengths = w.copy("lengths.jsonl")
    args = ("plan", "build", "--mix", f"{lengths}:1:2", "--output", w.path("mixed"), "--window", "16", *PLAN_ARGS)
    hs.assert_refused(w.cli_with_file_limit(200, *args), errors.OUTPUT_WRITE_FAILED, names=w.path("mixed"))
    assert not os.path.lexists(w.path("mixed")) and leftovers(w.path(".")) == []
    hs.assert_ok(w.cli(*args))


CUT_ARGS = ("--sequence-length", "16", "--window", "8", "--eos", "2")


@case("plan-cut-mix/force-over-pretraining-sequences")
def _(w):
    store = w.copy("store")
    hs.assert_ok(w.cli("plan", "cut", "--tokens", store, "--output", w.path("seq"), *CUT_ARGS))
    w.refused(errors.OUTPUT_PATH_INVALID, w.path("seq"), "plan", "cut", "--mix", f"{store}:1:2", "--output",
              w.path("seq"), "--force", *CUT_ARGS)


@case("plan-cut-mix/force-over-its-own-store")
def _(w):
    store = w.copy("store")
    w.refused(errors.OUTPUT_IS_INPUT, store, "plan", "cut", "--mix", f"{store}:1:2", "--output", store, "--force",
              *CUT_ARGS)


@case("plan-cut-mix/force-replaces-a-mixture")
def _(w):
    store, mega = w.copy("store"), os.path.join(w.root, "mega")
    shutil.copy2(w.artifacts / "mega.idx", mega + ".idx")
    shutil.copy2(w.artifacts / "mega.bin", mega + ".bin")
    args = ("plan", "cut", "--mix", f"{store}:0.6:2", f"{mega}:0.4:1", "--output", w.path("mix"), *CUT_ARGS)
    hs.assert_ok(w.cli(*args))
    before = w.state()
    hs.assert_ok(w.cli(*args, "--force", "--seed", "7"))
    hs.assert_untouched(before, w.state(), owned=["mix"])
    assert json.loads(Path(w.path("mix"), "meta.json").read_text())["seed"] == 7
    assert leftovers(w.path(".")) == []


@case("plan-cut-mix/retry-after-a-failed-write")
def _(w):
    store = w.copy("store")
    args = ("plan", "cut", "--mix", f"{store}:1:2", "--output", w.path("mix"), *CUT_ARGS)
    hs.assert_refused(w.cli_with_file_limit(200, *args), errors.OUTPUT_WRITE_FAILED, names=w.path("mix"))
    assert not os.path.lexists(w.path("mix")) and leftovers(w.path(".")) == []
    hs.assert_ok(w.cli(*args))


# ---------------------------------------------------------------------- plan shard
@case("plan-shard/force-over-its-own-plan")
def _(w):
    plan = w.copy("plan")
    w.refused(errors.OUTPUT_IS_INPUT, plan, "plan", "shard", plan, "--world-size", "2", "--output", plan, "--force")


@case("plan-shard/output-inside-its-plan")
def _(w):
    plan = w.copy("plan")
    w.refused(errors.OUTPUT_IS_INPUT, os.path.join(plan, "shards"), "plan", "shard", plan, "--world-size", "2",
              "--output", os.path.join(plan, "shards"))


@case("plan-shard/force-over-another-plan")
def _(w):
    plan, other = w.copy("plan"), w.copy("plan", "other")
    w.refused(errors.OUTPUT_PATH_INVALID, other, "plan", "shard", plan, "--world-size", "2", "--output", other,
              "--force")


@case("plan-shard/force-over-token-store")
def _(w):
    plan, store = w.copy("plan"), w.copy("store")
    w.refused(errors.OUTPUT_PATH_INVALID, store, "plan", "shard", plan, "--world-size", "2", "--output", store,
              "--force")


@case("plan-shard/force-replaces-shards")
def _(w):
    plan = w.copy("plan")
    hs.assert_ok(w.cli("plan", "shard", plan, "--world-size", "2", "--output", w.path("shards")))
    before = w.state()
    hs.assert_ok(w.cli("plan", "shard", plan, "--world-size", "3", "--output", w.path("shards"), "--force"))
    hs.assert_untouched(before, w.state(), owned=["shards"])
    assert json.loads(Path(w.path("shards"), "shards.json").read_text())["world_size"] == 3


# ---------------------------------------------------------------------- plan edit
def _edit_output_refused(code: str, output, *flags: str):
    """``plan edit`` of a copy of the plan to ``output(w, plan)`` with ``flags``, refused with ``code`` naming it."""
    def run(w):
        plan = w.copy("plan")
        target = output(w, plan)
        w.refused(code, target, "plan", "edit", plan, "--skip-steps", "0:1", "--output", target, *flags)
    return run


for _name, _code, _output, _flags in (
        ("force-over-its-own-plan", errors.OUTPUT_IS_INPUT, lambda w, plan: plan, ("--force",)),
        ("output-inside-its-plan", errors.OUTPUT_IS_INPUT, lambda w, plan: os.path.join(plan, "edited"), ()),
        ("force-over-another-plan", errors.OUTPUT_PATH_INVALID, lambda w, plan: w.copy("plan", "other"),
         ("--force",))):
    case(f"plan-edit/{_name}")(_edit_output_refused(_code, _output, *_flags))


@case("plan-edit/force-over-the-parent-of-the-plan-it-edits")
def _(w):
    plan = w.copy("plan")
    hs.assert_ok(w.cli("plan", "edit", plan, "--skip-steps", "0:1", "--output", w.path("edited")))
    w.refused(errors.OUTPUT_IS_INPUT, plan, "plan", "edit", w.path("edited"), "--skip-steps", "0:1", "--output",
              plan, "--force")


@case("plan-edit/output-symlink-to-plan")
def _(w):
    os.symlink(w.copy("plan", "target"), w.path("link"))
    w.refused(errors.OUTPUT_PATH_INVALID, w.path("link"), "plan", "edit", w.copy("plan"), "--skip-steps", "0:1",
              "--output", w.path("link"), "--force")


@case("plan-edit/force-replaces-an-edited-plan")
def _(w):
    plan = w.copy("plan")
    hs.assert_ok(w.cli("plan", "edit", plan, "--skip-steps", "0:1", "--output", w.path("edited")))
    before = w.state()
    hs.assert_ok(w.cli("plan", "edit", plan, "--skip-steps", "1:2", "--output", w.path("edited"), "--force"))
    hs.assert_untouched(before, w.state(), owned=["edited"])
    assert json.loads(Path(w.path("edited"), "meta.json").read_text())["edit"]["asked"]["skip_steps"] == [1, 2]


# ---------------------------------------------------------------------- data tokenize
def tokenize(w, output, *extra):
    return ("data", "tokenize", "--dataset", w.copy("ds.jsonl") if not os.path.exists(w.path("ds.jsonl"))
            else w.path("ds.jsonl"), "--tokenizer", w.path("model") if os.path.exists(w.path("model"))
            else w.copy("model"), "--output", output, "--quiet", *extra)


@case("tokenize/force-over-its-model-folder")
def _(w):
    model = w.copy("model")
    Path(model, "meta.json").write_text('{"format": "a model config"}\n')
    w.refused(errors.OUTPUT_IS_INPUT, model, *tokenize(w, model, "--force"))


@case("tokenize/force-over-another-model-folder")
def _(w):
    other = w.copy("model", "other-model")
    Path(other, "meta.json").write_text('{"format": "a model config"}\n')
    w.refused(errors.OUTPUT_PATH_INVALID, other, *tokenize(w, other, "--force"))


@case("tokenize/force-over-a-plan")
def _(w):
    plan = w.copy("plan")
    w.refused(errors.OUTPUT_PATH_INVALID, plan, *tokenize(w, plan, "--force"))


@case("tokenize/output-symlink-to-store")
def _(w):
    os.symlink(w.copy("store"), w.path("link"))
    w.refused(errors.OUTPUT_PATH_INVALID, w.path("link"), *tokenize(w, w.path("link"), "--force"))


@case("tokenize/output-inside-the-model-folder")
def _(w):
    model = w.copy("model")
    w.refused(errors.OUTPUT_IS_INPUT, os.path.join(model, "store"), *tokenize(w, os.path.join(model, "store")))


@case("tokenize/force-replaces-a-store")
def _(w):
    store = w.copy("store")
    args = tokenize(w, store, "--force")
    before = w.state()
    hs.assert_ok(w.cli(*args))
    hs.assert_untouched(before, w.state(), owned=["store"])


@case("tokenize/umask-027")
def _(w):
    hs.assert_ok(w.cli_with_umask(0o027, *tokenize(w, w.path("store"))))
    assert_modes(w.path("store"), 0o027)


# ---------------------------------------------------------------------- temps a killed data tokenize left
KILLED_TOKENIZE = ("import os, signal, sys\n"
                   "from umlos_cuda.batching.tokens.{module} import {function}\n"
                   "def die(done, total):\n"
                   "    os.kill(os.getpid(), signal.SIGKILL)  # inside the write, after its first chunk\n"
                   "{function}({dataset}, sys.argv[1], sys.argv[2], progress=die)\n")


def killed_tokenize(w, output: str, sharded: bool = False) -> list[str]:
    """``data tokenize`` (``--sharded``) SIGKILLed inside its write: the hidden temps it leaves beside ``output``."""
    code = KILLED_TOKENIZE.format(module="partition" if sharded else "writer",
                                  function="tokenize_sharded" if sharded else "tokenize_dataset",
                                  dataset="['part-0.jsonl', 'part-1.jsonl']" if sharded else "'ds.jsonl'")
    for name in ("part-0.jsonl", "part-1.jsonl") if sharded else ("ds.jsonl",):
        w.copy(name)
    died = hs.python(code, w.copy("model"), output, cwd=w.root)
    assert died.returncode == -9, died.describe()
    return leftovers(w.path("."))


@case("tokenize/reaps-the-temp-a-sigkill-left")
def _(w):
    left = killed_tokenize(w, w.path("store"))
    assert len(left) == 1 and left[0].startswith(".tmp-store-"), left
    hs.assert_ok(w.cli(*tokenize(w, w.path("store"))))
    assert leftovers(w.path(".")) == [] and os.path.exists(w.path("store/meta.json"))


@case("tokenize-sharded/reaps-the-staging-folder-a-sigkill-left")
def _(w):
    left = killed_tokenize(w, w.path("sharded"), sharded=True)
    assert len(left) == 1 and left[0].startswith(".tmp-sharded-stage-"), left
    hs.assert_ok(w.cli(*sharded(w, w.path("sharded"))))
    assert leftovers(w.path(".")) == [] and os.path.exists(w.path("sharded/meta.json"))


def planted_temps(w) -> list[str]:
    """Beside the output ``store``: names a temp of a store write could have, none of them a stale one of it."""
    store_marker = '{"artifact":"token store","format":"umlos-cuda/artifact-v1"}\n'
    os.symlink(w.copy("store", "elsewhere"), w.path(".tmp-store-0123abcd"))  # a link: never followed, never removed
    os.makedirs(w.path(".tmp-store-4567abcd"))  # the temp of a plan write
    Path(w.path(".tmp-store-4567abcd/umlos-artifact.json")).write_text(
        '{"artifact":"plan","format":"umlos-cuda/artifact-v1"}\n')
    os.makedirs(w.path(".tmp-store-89abcdef"))  # a marker that is a FIFO: not read, not removed
    os.mkfifo(w.path(".tmp-store-89abcdef/umlos-artifact.json"))
    os.makedirs(w.path(".tmp-store-feedbeef"))  # no marker: not provably a temp of this kind
    os.makedirs(w.path(".tmp-storex-0badc0de"))  # a temp of another output (storex)
    Path(w.path(".tmp-storex-0badc0de/umlos-artifact.json")).write_text(store_marker)
    return leftovers(w.path("."))


@case("tokenize/keeps-temps-that-are-not-its-stale-ones")
def _(w):
    planted = planted_temps(w)
    args = tokenize(w, w.path("store"))
    before = w.state()
    hs.assert_ok(w.cli(*args))
    hs.assert_untouched(before, w.state(), owned=["store"])
    assert leftovers(w.path(".")) == planted


@case("tokenize/keeps-the-temp-a-live-writer-holds")
def _(w):
    import subprocess
    import sys

    code = ("import sys\nfrom umlos_cuda.batching.tokens.writer import STORE\n"
            "from umlos_cuda.files.writer import output_folder\n"
            "with output_folder(sys.argv[1], STORE) as folder:\n"
            "    print('writing', flush=True)\n"
            "    sys.stdin.read()  # until the test closes stdin\n"
            "    raise SystemExit(0)  # an error: the temp is removed, nothing published\n")
    writer = subprocess.Popen([sys.executable, "-c", code, w.path("store")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=w.root)
    try:
        assert writer.stdout.readline() == "writing\n"
        held = leftovers(w.path("."))
        assert len(held) == 1, held
        hs.assert_ok(w.cli(*tokenize(w, w.path("other"))))  # another output: its temps are not these
        hs.assert_ok(w.cli(*tokenize(w, w.path("store"))))  # this output, written while the other writer lives
        assert leftovers(w.path(".")) == held  # the live writer's temp is left alone
    finally:
        writer.stdin.close()
        writer.wait(timeout=60)
    assert leftovers(w.path(".")) == []


# ---------------------------------------------------------------------- data tokenize --sharded, data append
def sharded(w, output, *extra):
    for name in ("part-0.jsonl", "part-1.jsonl"):
        if not os.path.exists(w.path(name)):
            w.copy(name)
    model = w.path("model") if os.path.exists(w.path("model")) else w.copy("model")
    return ("data", "tokenize", "--dataset", w.path("part-0.jsonl"), w.path("part-1.jsonl"), "--tokenizer", model,
            "--output", output, "--sharded", "--quiet", *extra)


@case("tokenize-sharded/force-over-a-token-store")
def _(w):
    store = w.copy("store")
    w.refused(errors.OUTPUT_PATH_INVALID, store, *sharded(w, store, "--force"))


@case("tokenize-sharded/force-over-its-model-folder")
def _(w):
    model = w.copy("model")
    w.refused(errors.OUTPUT_IS_INPUT, model, *sharded(w, model, "--force"))


@case("tokenize-sharded/output-symlink-to-a-sharded-store")
def _(w):
    os.symlink(w.copy("sharded"), w.path("link"))
    w.refused(errors.OUTPUT_PATH_INVALID, w.path("link"), *sharded(w, w.path("link"), "--force"))


@case("tokenize-sharded/force-replaces-a-sharded-store")
def _(w):
    store = w.copy("sharded")
    args = sharded(w, store, "--force")
    before = w.state()
    hs.assert_ok(w.cli(*args))
    hs.assert_untouched(before, w.state(), owned=["sharded"])
    assert leftovers(w.path(".")) == []


@case("tokenize-sharded/umask-027")
def _(w):
    hs.assert_ok(w.cli_with_umask(0o027, *sharded(w, w.path("sharded"))))
    assert_modes(w.path("sharded"), 0o027)
    assert sorted(os.listdir(w.path("sharded"))) == ["digests", "meta.json", "shards", "umlos-artifact.json"]


@case("tokenize-append/into-a-token-store")
def _(w):
    store = w.copy("store")
    w.refused(errors.SHARDED_STORE_INVALID, store, *sharded(w, store, "--append"))  # saying how to grow it


@case("append/create-force-over-a-token-store")
def _(w):
    store, staged = w.copy("store"), w.copy("staged")
    w.refused(errors.OUTPUT_PATH_INVALID, store, "data", "append", store, staged, "--create", "--force")


@case("append/create-over-the-folder-holding-the-staged-store")
def _(w):
    store = w.copy("store")
    staged = w.copy("staged", "store/staged")
    w.refused(errors.OUTPUT_IS_INPUT, store, "data", "append", store, staged, "--create", "--force")


@case("append/shards-folder-is-a-symlink-to-a-victim-folder")
def _(w):
    store, staged = w.copy("sharded"), w.copy("staged")
    os.makedirs(w.path("victim"))
    Path(w.path("victim"), "keep.txt").write_text("keep me\n")
    shutil.rmtree(os.path.join(store, "shards"))
    os.symlink(w.path("victim"), os.path.join(store, "shards"))
    w.refused(errors.SHARDED_STORE_INVALID, "shards", "data", "append", store, staged)


@case("append/planted-digest-symlink-is-replaced-not-followed")
def _(w):
    store, staged = w.copy("sharded"), w.copy("staged")
    target = victim(w)
    os.symlink(target, os.path.join(store, "digests", "00002.npy"))
    hs.assert_ok(w.cli("data", "append", store, staged))
    assert Path(target).read_text() == "keep me\n"
    assert not os.path.islink(os.path.join(store, "digests", "00002.npy"))
    hs.assert_ok(w.cli("data", "verify", store))


@case("append/orphan-of-an-interrupted-append-is-kept")
def _(w):
    store, staged = w.copy("sharded"), w.copy("staged")
    orphan = os.path.join(store, "shards", "00002")
    shutil.copytree(staged, orphan)
    w.refused(errors.SHARDED_STORE_INVALID, "00002", "data", "append", store, staged)
    hs.assert_ok(w.cli("data", "append", store, orphan))  # adopted in place
    assert os.path.isdir(staged)


@case("append/while-another-append-holds-the-store")
def _(w):
    import fcntl

    store, staged = w.copy("sharded"), w.copy("staged")
    with open(os.path.join(store, ".lock"), "w") as lock:  # this test's process is the other writer
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        before = w.state()
        outcome = w.cli("data", "append", store, staged)
        hs.assert_refused(outcome, errors.SHARDED_STORE_LOCKED, names=store)
        assert f"process {os.getpid()}," in outcome.stderr
        hs.assert_untouched(before, w.state())


def remote_store(w: Workspace) -> tuple:
    """``(object_store, bucket, url)``: the artifacts' sharded store copied into a fresh bucket of the tests'
    S3-compatible server (skipped without moto and obstore); the case's commands reach it through the proxy."""
    served = w.request.getfixturevalue("object_store")
    bucket = served.bucket()
    return served, bucket, served.upload_folder(w.artifacts / "sharded", bucket, "store")


@case("append/remote-while-a-lock-object-holds-the-store")
def _(w):
    served, bucket, url = remote_store(w)
    staged = w.copy("staged")
    lock = json.dumps({"host": "node-7", "pid": 4242, "started": "2026-01-01T00:00:00+00:00", "token": "x"}).encode()
    served.put(bucket, "store/.lock", lock)
    before, objects = w.state(), served.objects(bucket, "store")
    outcome = w.cli("data", "append", url, staged)
    hs.assert_refused(outcome, errors.SHARDED_STORE_LOCKED, names=f"{url}/.lock")
    assert "process 4242 on host 'node-7'" in outcome.stderr and "--break-lock" in outcome.stderr
    hs.assert_untouched(before, w.state())
    assert served.objects(bucket, "store") == objects


@case("append/remote-lock-object-over-its-cap-is-never-fetched-and-break-lock-removes-it")
def _(w):
    served, bucket, url = remote_store(w)
    staged = w.copy("staged")
    served.put(bucket, "store/.lock", b"x" * (1 << 20))
    served.proxy.reset()
    outcome = w.cli("data", "append", url, staged)
    hs.assert_refused(outcome, errors.SHARDED_STORE_LOCKED, names=f"{url}/.lock")
    assert "cannot name" in outcome.stderr and served.proxy.body_bytes("/.lock") == 0
    hs.assert_ok(w.cli("data", "append", url, staged, "--break-lock"))
    assert ".lock" not in served.objects(bucket, "store") and not os.path.exists(staged)


@case("append/remote-digest-object-over-its-cap-is-refused-before-it-is-fetched")
def _(w):
    served, bucket, url = remote_store(w)
    staged = w.copy("staged")
    served.put(bucket, "store/digests/00000.npy", b"\x93NUMPY" + b"\0" * (4 << 20))
    index = served.objects(bucket, "store")["meta.json"]
    served.proxy.reset()
    before = w.state()
    hs.assert_refused(w.cli("data", "append", url, staged), errors.SHARDED_STORE_INVALID,
                      names=f"{url}/digests/00000.npy")
    assert served.proxy.body_bytes("/digests/00000.npy") == 0
    hs.assert_untouched(before, w.state())
    now = served.objects(bucket, "store")
    assert now["meta.json"] == index and ".lock" not in now


@case("append/remote-objects-a-killed-append-left-are-replaced-never-read")
def _(w):
    served, bucket, url = remote_store(w)
    staged = w.copy("staged")
    expected = {f"shards/00002/{path.name}": path.read_bytes() for path in Path(staged).iterdir()}
    served.put(bucket, "store/shards/00002/tokens.npy", b"a killed append's bytes")
    served.put(bucket, "store/shards/00002/stray.bin", b"a killed append's bytes")
    served.put(bucket, "store/digests/00002.npy", b"a killed append's bytes")
    hs.assert_ok(w.cli("data", "append", url, staged))
    now = served.objects(bucket, "store")
    assert {key: data for key, data in now.items() if key.startswith("shards/00002/")} == expected
    assert now["digests/00002.npy"].startswith(b"\x93NUMPY")
    outcome = hs.python(hs.API_PRELUDE + "from umlos_cuda.batching.sources import open_source\n"
                        "source = open_source(sys.argv[1], tokens=True)\n"
                        "guarded(lambda: [source.arrays(row) for row in range(len(source))])\n", url, cwd=w.root)
    hs.assert_ok(outcome)


@case("append/remote-prefix-holding-a-flat-store-is-refused-and-unlocked")
def _(w):
    served = w.request.getfixturevalue("object_store")
    bucket = served.bucket()
    url = served.upload_folder(w.artifacts / "store", bucket, "flat")
    staged = w.copy("staged")
    before, objects = w.state(), served.objects(bucket, "flat")
    hs.assert_refused(w.cli("data", "append", url, staged), errors.SHARDED_STORE_INVALID, names=f"{url}/meta.json")
    hs.assert_untouched(before, w.state())
    assert served.objects(bucket, "flat") == objects


@case("append/retry-after-a-killed-append-names-the-moved-shard-and-its-command")
def _(w):
    store, staged = w.copy("sharded"), w.copy("staged")
    orphan = os.path.join(store, "shards", "00002")
    os.rename(staged, orphan)  # where a SIGKILL between the move and the index leaves it
    before = w.state()
    outcome = w.cli("data", "append", store, staged)
    hs.assert_refused(outcome, errors.SHARDED_STORE_INVALID, names=orphan)
    assert f"`umlos-cuda data append {store} {orphan}`" in outcome.stderr
    hs.assert_untouched(before, w.state())
    hs.assert_ok(w.cli("data", "append", store, orphan))
    hs.assert_ok(w.cli("data", "verify", store))


@case("append/a-shard-of-another-sharded-store-is-never-moved")
def _(w):
    store, staged = w.copy("sharded"), w.copy("staged")
    other = w.path("other")
    hs.assert_ok(w.cli("data", "append", other, staged, "--create"))  # rows the store does not hold
    w.refused(errors.SHARDED_STORE_MISMATCH, other, "data", "append", store, os.path.join(other, "shards", "00000"))
    hs.assert_ok(w.cli("data", "verify", other))


@case("append/lock-file-is-a-symlink-to-a-victim")
def _(w):
    store, staged = w.copy("sharded"), w.copy("staged")
    os.symlink(victim(w), os.path.join(store, ".lock"))
    w.refused(errors.OUTPUT_PATH_INVALID, ".lock", "data", "append", store, staged)


@case("append/lock-file-is-a-hard-link-to-a-victim")
def _(w):
    store, staged = w.copy("sharded"), w.copy("staged")
    os.link(victim(w), os.path.join(store, ".lock"))
    w.refused(errors.OUTPUT_PATH_INVALID, ".lock", "data", "append", store, staged)


@case("append/lock-file-of-a-killed-append-is-taken-over")
def _(w):
    store, staged = w.copy("sharded"), w.copy("staged")
    Path(store, ".lock").write_text("999999999\n")  # a writer that is gone: nobody holds the lock
    hs.assert_ok(w.cli("data", "append", store, staged))
    assert not os.path.lexists(os.path.join(store, ".lock"))
    hs.assert_ok(w.cli("data", "verify", store))


# ---------------------------------------------------------------------- data tokenize --engine ray
# The output is checked before Ray is imported or reached: these run without Ray and without a cluster
# (tests/test_tokenize_ray.py runs the job itself on a local cluster).
@case("tokenize-ray/force-over-a-token-store")
def _(w):
    store = w.copy("store")
    w.refused(errors.OUTPUT_PATH_INVALID, store, *sharded(w, store, "--force", "--engine", "ray"))


@case("tokenize-ray/force-over-its-model-folder")
def _(w):
    model = w.copy("model")
    w.refused(errors.OUTPUT_IS_INPUT, model, *sharded(w, model, "--force", "--engine", "ray"))


@case("tokenize-ray/output-symlink-to-a-sharded-store")
def _(w):
    os.symlink(w.copy("sharded"), w.path("link"))
    w.refused(errors.OUTPUT_PATH_INVALID, w.path("link"), *sharded(w, w.path("link"), "--force", "--engine", "ray"))


@case("tokenize-ray/append-into-a-token-store")
def _(w):
    store = w.copy("store")
    w.refused(errors.SHARDED_STORE_INVALID, store, *sharded(w, store, "--append", "--engine", "ray"))


# ---------------------------------------------------------------------- data lengths build
def lengths_build(w, output, *extra):
    return ("data", "lengths", "build", "--dataset", w.path("ds.jsonl"), "--tokenizer", w.path("model"),
            "--output", output, "--quiet", *extra)


@case("lengths/output-is-the-dataset")
def _(w):
    w.copy("ds.jsonl"), w.copy("model")
    w.refused(errors.OUTPUT_IS_INPUT, w.path("ds.jsonl"), *lengths_build(w, w.path("ds.jsonl"), "--force"))


@case("lengths/output-hard-link-of-the-dataset")
def _(w):
    w.copy("ds.jsonl"), w.copy("model")
    os.link(w.path("ds.jsonl"), w.path("alias.jsonl"))
    w.refused(errors.OUTPUT_IS_INPUT, w.path("alias.jsonl"), *lengths_build(w, w.path("alias.jsonl"), "--force"))


@case("lengths/force-over-a-file-that-is-no-length-cache")
def _(w):
    w.copy("ds.jsonl"), w.copy("model")
    Path(w.path("notes.jsonl")).write_text('{"note": "mine"}\n')
    w.refused(errors.OUTPUT_PATH_INVALID, w.path("notes.jsonl"), *lengths_build(w, w.path("notes.jsonl"), "--force"))


@case("lengths/sidecar-is-a-symlink")
def _(w):
    w.copy("ds.jsonl"), w.copy("model")
    os.symlink(victim(w), w.path("out.jsonl.u32"))
    w.refused(errors.OUTPUT_PATH_INVALID, w.path("out.jsonl.u32"), *lengths_build(w, w.path("out.jsonl"), "--force"))


@case("lengths/output-dangling-symlink")
def _(w):
    w.copy("ds.jsonl"), w.copy("model")
    os.symlink(w.path("created-through-the-link.jsonl"), w.path("out.jsonl"))
    w.refused(errors.OUTPUT_PATH_INVALID, w.path("out.jsonl"), *lengths_build(w, w.path("out.jsonl")))


@case("lengths/force-replaces-a-length-cache")
def _(w):
    w.copy("ds.jsonl"), w.copy("model"), w.copy("lengths.jsonl")
    before = w.state()
    hs.assert_ok(w.cli(*lengths_build(w, w.path("lengths.jsonl"), "--force")))
    hs.assert_untouched(before, w.state(), owned=["lengths.jsonl", "lengths.jsonl.u32"])


@case("lengths/retry-after-a-failed-write")
def _(w):
    w.copy("ds.jsonl"), w.copy("model")
    args = lengths_build(w, w.path("out.jsonl"))
    hs.assert_refused(w.cli_with_file_limit(300, *args), errors.OUTPUT_WRITE_FAILED, names="out.jsonl")
    assert not os.path.lexists(w.path("out.jsonl")) and not os.path.lexists(w.path("out.jsonl.u32"))
    assert leftovers(w.path(".")) == []
    hs.assert_ok(w.cli(*args))


@case("megatron/output-is-its-index")
def _(w):
    w.copy("mega.idx"), w.copy("mega.bin")
    w.refused(errors.OUTPUT_IS_INPUT, w.path("mega.idx"), "data", "megatron", w.path("mega"), "--output",
              w.path("mega.idx"), "--force")


def export(w, output, *extra):
    store = w.path("store") if os.path.exists(w.path("store")) else w.copy("store")
    return ("data", "megatron-export", store, "--output", output, *extra)


@case("megatron-export/output-inside-the-store")
def _(w):
    w.refused(errors.OUTPUT_IS_INPUT, w.path("store/mega.bin"), *export(w, w.path("store/mega"), "--force"))


@case("megatron-export/over-a-file-of-another-kind")
def _(w):
    w.copy("store")
    Path(w.path("notes.bin")).write_text("not a Megatron file\n")
    w.refused(errors.OUTPUT_EXISTS, w.path("notes.bin"), *export(w, w.path("notes")))
    w.refused(errors.OUTPUT_PATH_INVALID, w.path("notes.bin"), *export(w, w.path("notes"), "--force"))


@case("megatron-export/force-over-an-index-of-another-kind")
def _(w):
    w.copy("store")
    Path(w.path("out.idx")).write_text("an index of someone else's\n")
    w.refused(errors.OUTPUT_PATH_INVALID, w.path("out.idx"), *export(w, w.path("out"), "--force"))


@case("megatron-export/force-replaces-a-megatron-pair")
def _(w):
    w.copy("store"), w.copy("mega.idx"), w.copy("mega.bin")
    before = w.state()
    w.refused(errors.OUTPUT_EXISTS, w.path("mega.bin"), *export(w, w.path("mega")))
    hs.assert_ok(w.cli(*export(w, w.path("mega"), "--force")))
    hs.assert_untouched(before, w.state(), owned=["mega.idx", "mega.bin"])
    assert leftovers(w.path(".")) == []


# ---------------------------------------------------------------------- batch generate
def generate(w, output, *extra):
    plan = w.path("plan") if os.path.exists(w.path("plan")) else w.copy("plan")
    store = w.path("store") if os.path.exists(w.path("store")) else w.copy("store")
    return ("batch", "generate", "--plan", plan, "--store", store, "--output", output, "--workers", "1", "--quiet",
            *extra)


@case("batch/force-with-a-symlinked-member")
def _(w):
    batches = w.copy("batches")
    member = sorted(n for n in os.listdir(batches) if n.endswith(".npz"))[0]
    os.unlink(os.path.join(batches, member))
    os.symlink(victim(w), os.path.join(batches, member))
    w.refused((errors.BATCH_OUTPUT_MISMATCH, errors.OUTPUT_PATH_INVALID), member,
              *generate(w, batches, "--force"))


@case("batch/force-with-a-symlinked-plan-copy")
def _(w):
    batches = w.copy("batches")
    shutil.rmtree(os.path.join(batches, "plan"))
    os.symlink(w.copy("plan", "precious-plan"), os.path.join(batches, "plan"))
    w.refused((errors.BATCH_OUTPUT_MISMATCH, errors.OUTPUT_PATH_INVALID), "plan",
              *generate(w, batches, "--force"))


@case("batch/output-symlink-to-a-folder")
def _(w):
    os.mkdir(w.path("elsewhere"))
    os.symlink(w.path("elsewhere"), w.path("link"))
    w.refused(errors.OUTPUT_PATH_INVALID, w.path("link"), *generate(w, w.path("link")))


@case("batch/force-over-the-token-store")
def _(w):
    store = w.copy("store")
    w.refused(errors.OUTPUT_IS_INPUT, store, *generate(w, store, "--force"))


@case("batch/force-over-its-plan")
def _(w):
    plan = w.copy("plan")
    w.refused(errors.OUTPUT_IS_INPUT, plan, *generate(w, plan, "--force"))


@case("batch/output-inside-the-token-store")
def _(w):
    store = w.copy("store")
    w.refused(errors.OUTPUT_IS_INPUT, os.path.join(store, "batches"), *generate(w, os.path.join(store, "batches")))


@case("batch/force-over-another-plan")
def _(w):
    other = w.copy("plan", "other")
    w.refused((errors.BATCH_OUTPUT_MISMATCH, errors.OUTPUT_PATH_INVALID), other, *generate(w, other, "--force"))


def generate_mixed(w, output, *extra, second: str = "store"):
    """``batch generate`` of the mixed plan, its components read from ``store`` and ``second``."""
    plan = w.path("mixed") if os.path.exists(w.path("mixed")) else w.copy("mixed")
    stores = [w.path(name) if os.path.exists(w.path(name)) else w.copy("store", name) for name in ("store", second)]
    return ("batch", "generate", "--plan", plan, "--source", *stores, "--output", output, "--workers", "1",
            "--quiet", *extra)


@case("batch/mixed-output-inside-a-component-store")
def _(w):
    inside = os.path.join(w.copy("store", "store-b"), "batches")
    w.refused(errors.OUTPUT_IS_INPUT, inside, *generate_mixed(w, inside, second="store-b"))


@case("batch/mixed-force-with-a-symlinked-plan-copy")
def _(w):
    hs.assert_ok(w.cli(*generate_mixed(w, w.path("out"))))
    shutil.rmtree(w.path("out/plan"))
    os.symlink(w.copy("mixed", "precious-plan"), w.path("out/plan"))
    w.refused((errors.BATCH_OUTPUT_MISMATCH, errors.OUTPUT_PATH_INVALID), "plan",
              *generate_mixed(w, w.path("out"), "--force"))


@case("batch/mixed-resumed-over-its-own-folder")
def _(w):
    hs.assert_ok(w.cli(*generate_mixed(w, w.path("out"))))
    before = w.state()
    outcome = w.cli(*generate_mixed(w, w.path("out")))
    hs.assert_ok(outcome)
    assert "(0 written, 12 kept, 0 rewritten)" in outcome.stdout  # every file kept, verified byte for byte
    hs.assert_untouched(before, w.state(), owned=["out/batches.json"])


@case("batch/umask-027")
def _(w):
    hs.assert_ok(w.cli_with_umask(0o027, *generate(w, w.path("out"))))
    assert_modes(w.path("out"), 0o027)


@case("batch/umask-022")
def _(w):
    hs.assert_ok(w.cli_with_umask(0o022, *generate(w, w.path("out"))))
    assert_modes(w.path("out"), 0o022)


@case("batch/retry-after-a-failed-write")
def _(w):
    args = generate(w, w.path("out"))
    hs.assert_refused(w.cli_with_file_limit(4096, *args), errors.OUTPUT_WRITE_FAILED)
    hs.assert_ok(w.cli(*args))
    assert [n for n in os.listdir(w.path("out")) if n.startswith(".")] == []


# ---------------------------------------------------------------------- gym
def gym_run(w, port, output, *extra):
    if not os.path.exists(w.path("model")):
        w.copy("model")
    return ("gym", "run", "--port", str(port), "--timeout", "2", "--game", "sudoku", "--episodes", "2",
            "--tokenizer", w.path("model"), "--buffer-size", "2", "--window-mbs", "1", "--output", output,
            "--quiet", *extra)


@case("gym-run/server-down-then-retry")
def _(w):
    hs.assert_refused(w.cli(*gym_run(w, free_port(), w.path("run"))), errors.GYM_CONNECTION_FAILED)
    assert not os.path.lexists(w.path("run")) and leftovers(w.path(".")) == []
    hs.assert_ok(w.cli(*gym_run(w, w.server(), w.path("run"))))  # the same command, no --force
    assert json.loads(Path(w.path("run"), "run.json").read_text())["windows"]["count"] == 1


@case("gym-run/force-replaces-a-run")
def _(w):
    hs.assert_ok(w.cli(*gym_run(w, w.server(), w.path("run"))))
    w.refused(errors.OUTPUT_EXISTS, w.path("run"), *gym_run(w, w.server(), w.path("run")))
    before = w.state()
    hs.assert_ok(w.cli(*gym_run(w, w.server(), w.path("run"), "--force", "--seed", "1")))
    hs.assert_untouched(before, w.state(), owned=["run"])
    hs.assert_ok(w.cli("gym", "replay", w.path("run")))


@case("gym-run/force-over-a-plan")
def _(w):
    plan = w.copy("plan")
    w.refused(errors.OUTPUT_PATH_INVALID, plan, *gym_run(w, free_port(), plan, "--force"))


@case("gym-run/output-dangling-symlink")
def _(w):
    os.symlink(w.path("elsewhere"), w.path("run"))
    w.refused(errors.OUTPUT_PATH_INVALID, w.path("run"), *gym_run(w, free_port(), w.path("run")))


@case("gym-run/output-is-the-tokenizer-folder")
def _(w):
    model = w.copy("model")
    w.refused(errors.OUTPUT_IS_INPUT, model, *gym_run(w, free_port(), model, "--force"))


@case("gym-replay/header-only-log")
def _(w):
    from umlos_cuda.streams import ReplayBuffer, RollingBatchPlanWindow

    RollingBatchPlanWindow(ReplayBuffer(2, "fifo", seed=0), 1, log=w.path("windows.jsonl"))
    w.refused(errors.WINDOW_LOG_INVALID, "windows.jsonl", "gym", "replay", w.path("windows.jsonl"))


SERVE = (
    hs.API_PRELUDE
    + "import asyncio, os\n"
    "from umlos_cuda.streams.gym.server import serve\n"
    "port_file = sys.argv[1]\n"
    "if len(sys.argv) > 2:\n"
    "    os.symlink(sys.argv[2], f'{port_file}.tmp{os.getpid()}')  # the temp name of a guessable writer\n"
    "async def run():\n"
    "    task = asyncio.ensure_future(serve('127.0.0.1', 0, port_file))\n"
    "    while not task.done() and (os.path.islink(port_file) or not os.path.exists(port_file)):\n"
    "        await asyncio.sleep(0.02)\n"
    "    if task.done():\n"
    "        task.result()\n"
    "    task.cancel()\n"
    "guarded(lambda: asyncio.run(run()))\n"
)


@case("gym-serve/planted-temp-symlink")
def _(w):
    target = victim(w)
    before = w.state()
    hs.assert_ok(hs.python(SERVE, w.path("port"), target, cwd=w.root))
    assert all(p.startswith("port") for p in hs.changed_paths(before, w.state()))  # the port file and the planted link
    assert Path(w.path("port")).read_text().split()[0] == "127.0.0.1"


@case("gym-serve/port-file-is-a-symlink")
def _(w):
    os.symlink(victim(w), w.path("port"))
    before = w.state()
    hs.assert_refused(hs.python(SERVE, w.path("port"), cwd=w.root), errors.OUTPUT_PATH_INVALID, names="port")
    hs.assert_untouched(before, w.state())


@case("gym-serve/port-file-in-a-missing-folder")
def _(w):
    before = w.state()
    hs.assert_refused(w.cli("gym", "serve", "--port", "0", "--port-file", w.path("missing/port")),
                      errors.OUTPUT_PATH_INVALID, names="missing")
    hs.assert_untouched(before, w.state())


WINDOW_LOG = (
    hs.API_PRELUDE
    + "from umlos_cuda.streams import ReplayBuffer, RollingBatchPlanWindow\n"
    "guarded(lambda: RollingBatchPlanWindow(ReplayBuffer(2, 'fifo', seed=0), 1, log=sys.argv[1]))\n"
)


@case("window-log/dangling-symlink")
def _(w):
    os.symlink(w.path("created-through-the-link"), w.path("windows.jsonl"))
    before = w.state()
    hs.assert_refused(hs.python(WINDOW_LOG, w.path("windows.jsonl"), cwd=w.root), errors.WINDOW_LOG_INVALID,
                      names="windows.jsonl")
    hs.assert_untouched(before, w.state())


@case("window-log/append-after-the-log-became-a-symlink")
def _(w):
    code = (hs.API_PRELUDE
            + "import os\nfrom umlos_cuda.streams import WindowLog\n"
            "log = WindowLog(sys.argv[1], {'run': 1})\n"
            "os.unlink(sys.argv[1]); os.symlink(sys.argv[2], sys.argv[1])\n"
            "guarded(lambda: log.append({'window': 0}))\n")
    target = victim(w)
    outcome = hs.python(code, w.path("windows.jsonl"), target, cwd=w.root)
    hs.assert_refused(outcome, errors.WINDOW_LOG_INVALID, names="windows.jsonl")
    assert Path(target).read_text() == "keep me\n"


# ---------------------------------------------------------------------- single-file outputs
@case("next-batch/out-is-its-manifest")
def _(w):
    from nbcases import raw_manifest

    Path(w.path("run.json")).write_text(json.dumps(raw_manifest(1000, 64, 48, seed=5)))
    w.refused(errors.OUTPUT_IS_INPUT, "run.json", "next-batch", w.path("run.json"), "--dataset", "train",
              "--backend", "numpy", "--out", w.path("run.json"), "--force")


# ---------------------------------------------------------------------- the suite
@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_writer(name, artifacts, tmp_path, request):
    work = tmp_path / "case"
    work.mkdir()
    CASES[name](Workspace(work, artifacts, request))


def test_the_class_has_enough_cases():
    assert len(CASES) >= 30 and all(name.startswith("loss/") for name in CASES)
