"""Hostile values in every schema a reader parses: one property per reader, run in-process.

Issue 33 ("Nothing lost, nothing trusted blindly II") found values that end in a raw exception instead of
a refusal: a digit that ``str.isdigit()`` takes and ``int()`` refuses, integers past any size (OverflowError,
MemoryError, Python's 4300-digit limit), counts that size an allocation. The hostile-input suite
(tests/test_hostile_readers.py) runs one crafted input per case in a fenced child; here hypothesis walks the
schemas instead: it takes a valid document of each kind a reader parses (a plan's meta.json, stats.json and
a JSONL-only plan's microbatch line, a windowed plan's and pretraining sequences' meta.json, a token store's
and a sharded store's meta.json, a batch folder's batches.json, a length cache row and its sidecar header,
a window log's header and record, a policy, a manifest, a ``--config`` file, a gym server's menu and answer
lines, a checkpoint tensor header, environment settings), puts one hostile value at one place of it (or
adds or drops a key there), writes it where the reader reads it, and runs the reader. The reader must
return, or refuse with an ``UmlosError`` (a ``--config`` file's bad flag: argparse's usage error,
``SystemExit(2)``); any other exception (ValueError, OverflowError, TypeError, KeyError, RecursionError,
MemoryError, ...) fails the property.

The hostile values: Unicode digits (``'²'``, ``'٣'``), digit strings ``int()`` reads differently
(``'1_000'``, ``' 7'``), integers of 2^64, 2^70, 10^30, 10^400 and 5000 digits (written into JSON as
digits), NaN and infinities, wrong types, a nesting 200 deep, lone surrogates, NUL bytes, long text, and
whatever text, integers and floats hypothesis draws. The runs are derandomised (tests/conftest.py) and
bounded by ``max_examples``: the whole file takes well under a minute on two cores.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import shutil
import struct
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from umlos_cuda.errors import UmlosError

#: Examples per reader (two readers take twice as many): ten times as many under UMLOS_HYPOTHESIS=thorough.
EXAMPLES = 300 if os.environ.get("UMLOS_HYPOTHESIS") == "thorough" else 30
#: Stands for an integer of 5000 digits in a JSON text (``json.dumps`` cannot write one: Python's limit).
HUGE = "\x01huge-integer\x01"
DEEP: Any = "bottom"
for _ in range(200):
    DEEP = [DEEP]
HOSTILE_VALUES = ["\u00b2", "\u0663", "\uff17", "1_000", " 7", "-0", "0x10", "", "nan", "\x00", "7\x00", "\ud800",
                  "x" * 10_000, 1 << 64, 1 << 70, 10**30, 10**400, -1, -(1 << 63), float("nan"), float("inf"),
                  float("-inf"), 1e308, -0.0, 1.5, True, False, None, [], {}, [1, 2], {"a": 1}, DEEP, HUGE]
HOSTILE = st.one_of(st.sampled_from(HOSTILE_VALUES), st.text(max_size=24), st.integers(),
                    st.floats(allow_nan=True, allow_infinity=True))
KEYS = ("\u00b2", "x", "\ud800", "1", "")


# ---------------------------------------------------------------------- documents and their mutations
def places(doc: Any, path: tuple = ()) -> Iterator[tuple]:
    """Every place in ``doc`` (a path of keys and indices), the root first; a long list's first three items and
    its last."""
    yield path
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from places(value, (*path, key))
    elif isinstance(doc, list):
        for index in sorted({*range(min(3, len(doc))), len(doc) - 1} - {-1}):
            yield from places(doc[index], (*path, index))


def mutated(doc: Any, path: tuple, how: str, value: Any, key: str) -> Any:
    """A copy of ``doc`` with ``value`` at ``path`` (``replace``), ``key: value`` added to the mapping there
    (``add``), or the item there dropped (``drop``); the root is replaced whatever ``how`` says."""
    out = copy.deepcopy(doc)
    if not path:
        return value
    parent = out
    for step in path[:-1]:
        parent = parent[step]
    target = parent[path[-1]]
    if how == "add" and isinstance(target, dict):
        target[key] = value
    elif how == "drop":
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return out


def to_json(doc: Any) -> str:
    """``doc`` as JSON text, NaN and infinities as Python writes them, :data:`HUGE` as 5000 digits."""
    return json.dumps(doc, allow_nan=True).replace(json.dumps(HUGE), "9" * 5000)


def raw(doc: Any) -> Any:
    """``doc`` with :data:`HUGE` as the integer itself (for readers of Python values)."""
    if doc == HUGE:
        return 10**5000 - 1
    if isinstance(doc, dict):
        return {key: raw(value) for key, value in doc.items()}
    if isinstance(doc, list):
        return [raw(value) for value in doc]
    return doc


def read_or_refuse(call: Callable[[], Any]) -> None:
    """The property: ``call`` returns, or refuses with an UmlosError (or argparse's usage error)."""
    try:
        call()
    except UmlosError:
        pass
    except SystemExit as exit_:  # a --config file's flag that the command's parser refuses: a usage error
        assert exit_.code == 2


def hostile_document(data, doc: Any) -> tuple:
    path = data.draw(st.sampled_from(list(places(doc))), label="place")
    how = data.draw(st.sampled_from(("replace", "add", "drop")), label="how")
    return path, how, data.draw(HOSTILE, label="value"), data.draw(st.sampled_from(KEYS), label="key")


# ---------------------------------------------------------------------- what the readers read
@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """The hostile suite's artifacts (tests/test_hostile_readers.py ``build_world``: a token store and its
    length cache, a plan and its batch folders, a windowed plan, a Megatron pair and pretraining sequences over
    it, a sharded store, a mock gym run's window log), and the plan kept as JSONL only (``plan-jsonl``)."""
    from test_hostile_readers import build_world

    root = build_world(tmp_path_factory.mktemp("hostile-values"))
    shutil.copytree(root / "plan", root / "plan-jsonl")
    for npy in (root / "plan-jsonl" / "epoch_0").glob("*.npy"):
        npy.unlink()
    return root


class JsonFile:
    """A reader of one JSON document in a file of an artifact: ``read(folder)`` runs the reader over the copy
    ``folder`` of ``artifact``; ``line``: the document is that line of a JSONL file."""

    def __init__(self, artifact: str, name: str, read: Callable[[Path], Any], line: int | None = None) -> None:
        self.artifact, self.name, self.read, self.line = artifact, name, read, line

    def check(self, world: Path, tmp_path: Path, data) -> None:
        folder = tmp_path / "copy"
        source = world / self.artifact
        if not folder.exists() and source.is_dir():
            shutil.copytree(source, folder)
        elif not folder.exists():
            shutil.copy2(source, folder)
        path = folder / self.name if self.name else folder
        original = path.read_bytes()
        lines = original.decode().splitlines(keepends=True)
        doc = json.loads(original if self.line is None else lines[self.line])
        text = to_json(mutated(doc, *hostile_document(data, doc)))
        if self.line is not None:
            lines[self.line] = text + "\n"
            text = "".join(lines)
        path.write_text(text)
        try:
            read_or_refuse(lambda: self.read(folder))
        finally:
            path.write_bytes(original)


def _open_plan(folder: Path) -> None:
    from umlos_cuda.batching.plans.kinds import open_plan

    open_plan(folder)


def _sequences(folder: Path) -> None:
    from umlos_cuda.batching.plans.windows.sequences_io import load_sequences

    load_sequences(folder).sample(0, 0)


def _store(folder: Path) -> None:
    from umlos_cuda.batching.tokens.store import TokenStore

    TokenStore.open(folder).arrays(0)


def _sharded(folder: Path) -> None:
    from umlos_cuda.batching.tokens.sharded import ShardedTokenStore

    ShardedTokenStore.open(folder).length_cache()


def _batches(folder: Path) -> None:
    from umlos_cuda.batching.batches.reader import BatchReader

    BatchReader(folder).verify()


def _length_cache(path: Path) -> None:
    from umlos_cuda.batching import LengthCache

    LengthCache.load(path)


def _replay(folder: Path) -> None:
    from umlos_cuda.streams.window.replay import replay_log

    replay_log(folder)


JSON_FILES = {
    "plan meta.json": JsonFile("plan", "meta.json", _open_plan),
    "plan stats.json": JsonFile("plan", "epoch_0/stats.json", _open_plan),
    "JSONL-only plan microbatch": JsonFile("plan-jsonl", "epoch_0/microbatches.jsonl", _open_plan, line=0),
    "windowed plan meta.json": JsonFile("windowed", "meta.json", _open_plan),
    "pretraining sequences meta.json": JsonFile("sequences", "meta.json", _sequences),
    "token store meta.json": JsonFile("store", "meta.json", _store),
    "sharded store meta.json": JsonFile("sharded", "meta.json", _sharded),
    "batches.json": JsonFile("batches", "batches.json", _batches),
    "length cache row": JsonFile("lengths.jsonl", "", _length_cache, line=1),
    "window log header": JsonFile("run", "windows.jsonl", _replay, line=0),
    "window log record": JsonFile("run", "windows.jsonl", _replay, line=1),
}


@pytest.mark.parametrize("reader", JSON_FILES, ids=list(JSON_FILES))
@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data())
def test_a_hostile_value_in_a_json_file_is_read_or_refused(reader, world, tmp_path, data):
    JSON_FILES[reader].check(world, tmp_path, data)


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data())
def test_a_hostile_value_in_a_sidecar_header_is_read_or_refused(world, tmp_path, data):
    from umlos_cuda.batching import LengthCache

    shutil.copy2(world / "lengths.jsonl", tmp_path / "lengths.jsonl")
    blob = (world / "lengths.jsonl.u32").read_bytes()
    (size,) = struct.unpack("<I", blob[8:12])
    header = json.loads(blob[12:12 + size])
    lengths = blob[-4 * header["count"]:]
    text = to_json(mutated(header, *hostile_document(data, header))).encode()
    prefix = b"UMLOSLEN" + struct.pack("<I", len(text)) + text
    (tmp_path / "lengths.jsonl.u32").write_bytes(prefix + b"\0" * (-len(prefix) % 16) + lengths)
    read_or_refuse(lambda: LengthCache.load(tmp_path / "lengths.jsonl", sidecar="require"))


# ---------------------------------------------------------------------- readers of Python values and of text
POLICY = {"policies": [{"type": "novelty", "novelty_window": 10},
                       {"type": "length_quota", "quotas": {"128": 0.5, "256": 0.5}},
                       {"type": "difficulty_bucket", "weights": {"easy": 1, "hard": 2}},
                       {"type": "failure_replay", "failure_weight": 2.0}]}
MANIFEST = {"global_batch_size": 4,
            "datasets": {"train": {"id": "c", "version": "1", "hash": "sha256:00", "cardinality": 100}}}
OBSERVATION = {"type": "observation", "game": "sudoku", "difficulty": "easy", "seed": 5, "moves": 0,
               "is_complete": False, "grid_display": "..."}


@settings(max_examples=EXAMPLES * 2, deadline=None)
@given(data=st.data())
def test_a_hostile_value_in_a_policy_is_read_or_refused(data):
    """As window logs hand them over (Python values, integers of any size) and as a policy.yaml file holds them."""
    from umlos_cuda.streams import policies_from_data, policies_from_yaml

    doc = mutated(POLICY, *hostile_document(data, POLICY))
    read_or_refuse(lambda: policies_from_data(raw(doc)))
    read_or_refuse(lambda: policies_from_yaml(to_json(doc)))


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data())
def test_a_hostile_value_in_a_window_log_header_is_read_or_refused(world, data):
    from umlos_cuda.streams.window.rolling import RollingBatchPlanWindow

    header = json.loads((world / "run" / "windows.jsonl").read_text().splitlines()[0])
    doc = raw(mutated(header, *hostile_document(data, header)))
    read_or_refuse(lambda: RollingBatchPlanWindow.from_header(doc))


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data())
def test_a_hostile_value_in_a_manifest_is_read_or_refused(tmp_path, data):
    from umlos_cuda.manifest.core import Manifest

    doc = mutated(MANIFEST, *hostile_document(data, MANIFEST))
    read_or_refuse(lambda: Manifest.from_dict(raw(doc)))
    (tmp_path / "m.json").write_text(to_json(doc))
    read_or_refuse(lambda: Manifest.load(tmp_path / "m.json"))


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data())
def test_a_hostile_value_in_a_config_file_is_a_usage_error_or_a_refusal(world, tmp_path, data):
    """``plan build --config FILE``: the file's flags, each checked as if typed (messages go to a stream that
    writes what it cannot encode as escapes, as Python's own stderr does)."""
    from umlos_cuda.cli import main

    config = {"source": str(world / "lengths.jsonl"), "token-budget": 512, "bucket-edges": "32,64,128",
              "overflow-max": 256, "window": 16, "epochs": 1, "seed": 3, "quiet": True}
    (tmp_path / "config.json").write_text(to_json(mutated(config, *hostile_document(data, config))))
    stderr = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace")
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        read_or_refuse(lambda: main(["plan", "build", "--config", str(tmp_path / "config.json"), "--output",
                                     str(tmp_path / "out"), "--force"]))


@settings(max_examples=EXAMPLES * 2, deadline=None)
@given(data=st.data())
def test_a_hostile_gym_server_line_is_read_or_refused(data):
    """A menu line's number (any text) and an answer line's JSON fields."""
    from umlos_cuda.streams.gym.telnet_client import parse_answer, parse_menu

    number = data.draw(st.one_of(st.sampled_from([v for v in HOSTILE_VALUES if isinstance(v, str)]), st.text()))
    read_or_refuse(lambda: parse_menu([f"  {number}) Sudoku - a logic puzzle"]))
    doc = mutated(OBSERVATION, *hostile_document(data, OBSERVATION))
    read_or_refuse(lambda: parse_answer([to_json(doc)]))


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data())
def test_a_hostile_value_in_a_checkpoint_tensor_header_is_read_or_refused(data):
    from umlos_cuda.checkpoint import tensors

    blob = tensors.encode({"a": np.arange(6, dtype=np.int32).reshape(2, 3), "b": np.ones(2)}, "t")
    (size,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + size])
    text = to_json(mutated(header, *hostile_document(data, header))).encode()
    read_or_refuse(lambda: tensors.describe(struct.pack("<Q", len(text)) + text + blob[8 + size:], "t"))


#: Text an environment variable can hold (no NUL, no lone surrogate: the operating system refuses those).
ENVIRONMENT_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                           max_size=50)


@settings(max_examples=EXAMPLES * 2, deadline=None)
@given(text=st.one_of(st.sampled_from(["\u00b2", "\u0663", "1_000", " 7 ", "9" * 5000, "-1", "+7", "0x10"]),
                      ENVIRONMENT_TEXT))
def test_a_hostile_environment_setting_is_read_or_refused(text):
    from umlos_cuda import errors
    from umlos_cuda.epoch import limit_setting
    from umlos_cuda.world import env_int

    saved = {name: os.environ.get(name) for name in ("WORLD_SIZE", "UMLOS_MAX_BLOCKS")}
    try:
        os.environ["WORLD_SIZE"] = os.environ["UMLOS_MAX_BLOCKS"] = text
        read_or_refuse(lambda: env_int("WORLD_SIZE", operator=errors.CLI_OPERATOR))
        read_or_refuse(lambda: limit_setting("UMLOS_MAX_BLOCKS", 1, operator=errors.CLI_OPERATOR))
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# ---------------------------------------------------------------------- what these properties found, pinned
def test_what_the_properties_found_is_refused_with_a_code(tmp_path):
    """Each raised a raw exception before: a ragged token list (NumPy's ValueError), a path with a NUL byte or
    a lone surrogate read from a file or a --config (ValueError, UnicodeEncodeError from the operating system
    call), a stream sample whose text holds a lone surrogate (UnicodeEncodeError while hashing it)."""
    from umlos_cuda import checks, errors
    from umlos_cuda.batching.samples import Sample, SampleMeta
    from umlos_cuda.cli import main
    from umlos_cuda.files import reader
    from umlos_cuda.files.folder import Folder
    from umlos_cuda.streams.types import StreamSample

    def code(call) -> str:
        with pytest.raises(UmlosError) as caught:
            call()
        return caught.value.code

    assert code(lambda: Sample([1, [2, 3]], [1, 1], None, SampleMeta("a", "t"))) == errors.SAMPLE_INVALID
    fail = checks.raising(errors.PLAN_FORMAT_INVALID, operator="t")
    for path in ("a\x00b", "\ud800"):
        assert code(partial(reader.read_json, path, fail)) == errors.PLAN_FORMAT_INVALID
        with pytest.raises(OSError):
            Folder.open(path)
    (tmp_path / "c.yaml").write_text('source: "\\ud800"\n')
    assert main(["plan", "build", "--config", str(tmp_path / "c.yaml"), "--output", str(tmp_path / "out")]) == 2
    sample = Sample([1, 2], [1, 1], None, SampleMeta("a", "t"))
    assert code(lambda: StreamSample(sample, "\ud800", "", "mock", None, 0)) == errors.STREAM_INVALID
