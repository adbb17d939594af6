"""Golden traces (docs/spec/README.md, "The golden file"): the packaged file verifies on every available
backend, a changed value is caught, the CLI reports per case, and the
independent oracle reproduces golden entries (so the file pins R1-R9 and not
just whatever the engine did when it was generated). Never regenerates."""

from __future__ import annotations

import hashlib
import json

import pytest

import oracle
import umlos_cuda as uc
from umlos_cuda import errors
from umlos_cuda.bundled import bundled_folder
from umlos_cuda.commands import _golden_vectors as golden
from umlos_cuda.cli import main


@pytest.fixture(scope="module")
def document():
    return golden.load_golden()


def cases_by_id(document):
    return {case["id"]: case for case in document["cases"]}


def test_packaged_file_is_found_where_the_package_looks(document):
    resource = bundled_folder("golden").joinpath("nextbatch_v2.json")
    assert resource.is_file()
    assert json.loads(resource.read_text(encoding="utf-8")) == document
    assert document["format"] == golden.FORMAT and document["format_version"] == golden.FORMAT_VERSION
    assert document["generator"]["script"] == "golden/make_nextbatch_golden.py" and document["generator"]["version"]


def test_golden_file_covers_the_equivalence_matrix(document):
    ids = set(cases_by_id(document))
    for seed_number in range(5):
        for world_size in (1, 8, 12):
            for stage in ("train", "eval"):
                assert f"n1e6/s{seed_number}/w{world_size}/{stage}" in ids
                assert f"n1e9/s{seed_number}/w{world_size}/{stage}/last" in ids
        for label in ("start", "middle", "end"):
            assert f"n1e9/s{seed_number}/window/{label}" in ids
        assert f"n1e9/s{seed_number}/positions" in ids
    seeds = {document["manifests"][f"n1e6_s{i}"]["seed"] for i in range(5)}
    assert len(seeds) == 5
    for case in document["cases"]:  # self-describing: every case names a manifest the file holds
        assert case["input"]["manifest"] in document["manifests"]
        if case["kind"] == "epoch_run":
            n = document["manifests"][case["input"]["manifest"]]["datasets"]["train"]["cardinality"]
            assert case["expected"]["count"] >= n - n % 3072 and len(case["expected"]["first_64"]) == 64


def test_golden_verifies(backend):
    report = golden.verify(backend=backend)
    assert report.results and report.backend == backend
    assert report.ok, "\n".join(f"{f.id}: {'; '.join(f.mismatches)}" for f in report.failures)
    report.raise_for_failures()  # does not raise


def test_progress_callback_sees_every_case():
    seen = []
    report = golden.verify(backend="numpy", only="manifest/", progress=lambda *a: seen.append(a))
    assert [s[0] for s in seen] == list(range(1, len(report.results) + 1))
    assert all(total == len(report.results) and passed for _, total, _, passed in seen)
    assert {s[2] for s in seen} == {r.id for r in report.results}


@pytest.fixture()
def tampered(tmp_path, document):
    changed = json.loads(json.dumps(document))
    cases = cases_by_id(changed)
    cases["n1e9/s2/window/end"]["expected"]["sha256"] = "0" * 64
    cases["n1e9/s3/positions"]["expected"]["indices"][5] += 1
    cases["manifest/n1e6_s2"]["expected"]["replay_token"] = "ff" * 32
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(changed))
    return str(path)


def test_a_changed_value_is_reported(tampered):
    report = golden.verify(path=tampered, backend="numpy",
                           only=["n1e9/s2/window", "n1e9/s3/positions", "manifest/n1e6_s2"])
    assert not report.ok
    assert {f.id for f in report.failures} == {"n1e9/s2/window/end", "n1e9/s3/positions", "manifest/n1e6_s2"}
    assert len(report.results) == 5
    mismatches = report.failures[0].mismatches + report.failures[1].mismatches + report.failures[2].mismatches
    assert any(line.startswith("sha256: expected") for line in mismatches)
    with pytest.raises(uc.UmlosError) as info:
        report.raise_for_failures()
    assert info.value.code == errors.GOLDEN_MISMATCH
    assert "n1e9/s2/window/end" in info.value.message


def test_cli_verify_passes(capsys):
    assert main(["golden", "verify", "--backend", "numpy", "--only", "n1e9/s1/positions", "--only",
                 "n1e6/s0/w8/eval"]) == 0
    out = capsys.readouterr().out
    assert "PASS n1e9/s1/positions" in out and "PASS n1e6/s0/w8/eval" in out
    assert "2/2 golden cases pass" in out


def test_cli_verify_fails_on_a_mismatch(capsys, tampered):
    assert main(["golden", "verify", "--backend", "numpy", "--file", tampered, "--only", "n1e9/s2/window"]) == 1
    out = capsys.readouterr().out
    assert "FAIL n1e9/s2/window/end" in out and "PASS n1e9/s2/window/start" in out
    assert "1/3 golden cases pass" not in out and "2/3 golden cases pass" in out


def test_cli_bad_file_and_no_match(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    assert main(["golden", "verify", "--backend", "numpy", "--file", str(bad)]) == 2
    assert "GOLDEN_MISMATCH" in capsys.readouterr().err
    assert main(["golden", "verify", "--backend", "numpy", "--only", "no-such-case"]) == 1


def test_unknown_case_kind_is_a_mismatch(tmp_path, document):
    changed = json.loads(json.dumps(document))
    changed["cases"] = [{"id": "x", "kind": "mystery", "input": {"manifest": "n1e6_s0"}, "expected": {}}]
    path = tmp_path / "kind.json"
    path.write_text(json.dumps(changed))
    report = golden.verify(path=str(path), backend="numpy")
    assert not report.ok and "GOLDEN_MISMATCH" in report.failures[0].mismatches[0]


# ------------------------------------------------- the oracle reproduces golden entries
def test_oracle_reproduces_every_manifest_hash_and_token(document):
    cases = cases_by_id(document)
    for name, raw in document["manifests"].items():
        expected = cases[f"manifest/{name}"]["expected"]
        assert oracle.manifest_hash(raw).hex() == expected["manifest_hash"]
        assert oracle.replay_token(raw).hex() == expected["replay_token"]


def test_oracle_reproduces_sampled_positions_at_1e9(document):
    for case in document["cases"]:
        if case["kind"] != "positions":
            continue
        spec = case["input"]
        model = oracle.Oracle(document["manifests"][spec["manifest"]]).epoch(spec["dataset"], spec["epoch"])
        assert [model.index(p) for p in spec["positions"]] == case["expected"]["indices"]


def oracle_run(model, spec):
    """The golden epoch_run / batch computation, on the oracle."""
    digest, replay = hashlib.sha256(), hashlib.sha256()
    streaming = spec.get("preset") == "streaming_infinite"
    indices_all = []
    cursor = (spec["epoch"], 0) if "cursor" not in spec else (spec["cursor"]["epoch"], spec["cursor"]["global_index"])
    epoch = cursor[0]
    steps = 0
    while cursor[0] == epoch and (steps == 0 or "cursor" not in spec):
        for rank in range(spec["world_size"]):
            batch = model.next_batch(spec["dataset"], spec["world_size"], rank, spec["stage"], *cursor,
                                     streaming=streaming)
            digest.update(oracle.indices_le_bytes(batch.indices))
            replay.update(bytes.fromhex(batch.data_replay_t))
            indices_all.extend(batch.indices)
            after = batch
        cursor = after.cursor
        steps += 1
    return digest.hexdigest(), replay.hexdigest(), indices_all, cursor, steps, after


@pytest.mark.slow
@pytest.mark.parametrize("case_id", ["n1e6/s4/w12/train", "n1e6/b1000_drop_last/w12/train", "n1e6/s2/w8/eval",
                                     "n1e6/s1/w12/streaming_infinite"])
def test_oracle_reproduces_a_whole_epoch_run(document, case_id):
    case = cases_by_id(document)[case_id]
    spec = case["input"]
    sha, replay, indices, cursor, steps, last = oracle_run(oracle.Oracle(document["manifests"][spec["manifest"]]), spec)
    expected = case["expected"]
    assert sha == expected["sha256"] and replay == expected["data_replay_t_sha256"]
    assert indices[:64] == expected["first_64"] and indices[-64:] == expected["last_64"]
    assert {"epoch": cursor[0], "global_index": cursor[1]} == expected["final_cursor"]
    assert steps == expected["steps"] and len(indices) == expected["count"]
    assert last.sampler_config_hash == expected["sampler_config_hash"]


@pytest.mark.parametrize("case_id", ["n1e9/s4/w12/train/last", "n1e9/s0/w8/eval/middle", "n1e9/s3/w1/train/middle",
                                     "n1e6/s1/w8/streaming_infinite/boundary"])
def test_oracle_reproduces_batch_cases(document, case_id):
    case = cases_by_id(document)[case_id]
    spec = case["input"]
    sha, replay, _, cursor, _, last = oracle_run(oracle.Oracle(document["manifests"][spec["manifest"]]), spec)
    assert sha == case["expected"]["sha256"] and replay == case["expected"]["data_replay_t_sha256"]
    assert {"epoch": cursor[0], "global_index": cursor[1]} == case["expected"]["cursor_after"]
    assert last.sampling_mode == case["expected"]["sampling_mode"]


@pytest.mark.slow
def test_oracle_reproduces_a_1e9_window(document):
    case = cases_by_id(document)["n1e9/s1/window/end"]
    spec = case["input"]
    model = oracle.Oracle(document["manifests"][spec["manifest"]]).epoch(spec["dataset"], spec["epoch"])
    window = model.window(spec["start"], spec["count"])
    assert hashlib.sha256(oracle.indices_le_bytes(window)).hexdigest() == case["expected"]["sha256"]
    assert window[:8] == case["expected"]["first_8"] and window[-8:] == case["expected"]["last_8"]


def test_pyproject_ships_golden_json_as_umlos_cuda_golden():
    """The wheel maps golden/ to umlos_cuda/_golden and includes *.json (the
    checkout above proves the lookup; this guards the wheel's mapping)."""
    import os
    import tomllib

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pyproject.toml")
    if not os.path.exists(path):
        pytest.skip("not running from a source checkout")
    with open(path, "rb") as handle:
        config = tomllib.load(handle)["tool"]["setuptools"]
    assert config["package-dir"]["umlos_cuda._golden"] == "golden"
    assert "*.json" in config["package-data"]["umlos_cuda._golden"]
