"""``umlos-cuda info PATH`` and ``umlos-cuda verify PATH`` on every kind of artifact (umlos_cuda/artifacts.py).

Every folder and file kind the project writes is built once (golden/make_artifacts_golden.py's commands, a gym
run of a mock stream, the golden checkpoint store); each is recognised from its path alone, reported and
verified through the registry; an option a kind does not take, a path no kind recognises and a marker of an
unknown kind are refused with their codes. The hostile cases are in tests/test_hostile_readers.py.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import streams_support

from umlos_cuda import errors
from umlos_cuda.artifacts import artifact_of, artifacts, get_artifact
from umlos_cuda.bundled import bundled_folder
from umlos_cuda.cli import main
from umlos_cuda.errors import UmlosError

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("make_artifacts_golden", ROOT / "golden" / "make_artifacts_golden.py")
generator = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(generator)

#: Each artifact the fixture builds, by its path under the fixture's folder, and the kind it is.
KINDS = {
    "lengths.jsonl": "length cache", "lengths.jsonl.u32": "length cache sidecar", "store": "token store",
    "sharded": "sharded token store", "corpus": "Megatron pair", "corpus.idx": "Megatron pair", "plan": "plan",
    "packed-plan": "plan", "plan-shards": "plan shard set", "windowed": "windowed plan",
    "windowed-packed": "windowed plan", "mixed": "mixed plan", "sequences": "pretraining sequences",
    "mixed-sequences": "mixed pretraining sequences", "batches-compact": "batch folder",
    "batches-npz": "batch folder", "run": "gym run", "checkpoints": "checkpoint store",
}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("artifacts") / "all"
    generator.build(str(root))
    streams_support.write_mock_run(root / "run")
    shutil.copytree(bundled_folder("golden").joinpath("checkpoint_store_v1"), root / "checkpoints")
    return root


def test_every_kind_the_issue_names_is_registered():
    names = {artifact.name for artifact in artifacts()}
    assert set(KINDS.values()) | {"checkpoint container"} <= names


@pytest.mark.parametrize("name", sorted(KINDS))
def test_each_artifact_is_recognised_reported_and_verified(built, name, capsys):
    path = str(built / name)
    artifact = artifact_of(path)
    assert artifact.name == KINDS[name] and get_artifact(artifact.name) is artifact
    capsys.readouterr()
    assert main(["info", path, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kind"] in (artifact.name, "store")  # checkpoint inspect's own word for a store
    assert main(["info", path]) == 0
    assert capsys.readouterr().out.strip()
    assert main(["verify", path]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"{artifact.name} {path} verified")


def test_a_plan_verified_here_gives_what_plan_verify_gives(built, capsys):
    printed = []
    for command in (["verify"], ["plan", "verify"], ["info"], ["plan", "info"]):
        assert main([*command, str(built / "windowed"), *(["--windows", "2", "--seed", "3"]
                                                          if "verify" in command else [])]) == 0
        printed.append(capsys.readouterr().out)
    assert printed[0] == printed[1] and "windowed plan" in printed[0] and printed[2] == printed[3]


def test_a_batch_folder_is_verified_against_its_store(built, capsys):
    assert main(["verify", str(built / "batches-npz"), "--store", str(built / "store")]) == 0
    assert "and the token store" in capsys.readouterr().out


def test_an_option_the_kind_does_not_take_is_refused(built, capsys):
    assert main(["verify", str(built / "store"), "--windows", "2"]) == 2
    err = capsys.readouterr().err
    assert "INVALID_ARGUMENT" in err and "is a token store folder: --windows and --seed do not apply" in err
    assert main(["info", str(built / "store"), "--world-size", "2"]) == 2
    assert "--world-size does not apply" in capsys.readouterr().err
    assert main(["info", str(built / "windowed"), "--world-size", "2", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["epochs"][0]["ranks"]) == 2


def test_a_path_no_kind_recognises_is_refused_saying_what_it_is(tmp_path):
    (tmp_path / "notes.txt").write_text("hello\n")
    for path, what in ((tmp_path / "notes.txt", "is a file"), (tmp_path / "missing", "does not exist"),
                       (tmp_path, "is a folder")):
        with pytest.raises(UmlosError) as info:
            artifact_of(path)
        assert info.value.code == errors.ARTIFACT_UNKNOWN and what in info.value.message
        assert info.value.record["failure_operator"] == errors.ARTIFACTS_OPERATOR


def test_a_tampered_artifact_fails_verify_with_its_own_code(built, tmp_path, capsys):
    copy = tmp_path / "store"
    shutil.copytree(built / "store", copy)
    data = bytearray((copy / "tokens.npy").read_bytes())
    data[-1] ^= 1
    (copy / "tokens.npy").write_bytes(bytes(data))
    assert main(["verify", str(copy)]) == 2
    assert "TOKEN_STORE_INVALID" in capsys.readouterr().err
