"""``umlos-cuda checkpoint inspect | verify | recover`` and the checkpoint demo
function the ``demo --workdir`` command runs."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

import umlos_cuda as uc
from umlos_cuda import errors
from umlos_cuda.checkpoint import signing
from umlos_cuda.commands._checkpoint_demo import DEMO_KEY_SEED, demo_public_key, run_checkpoint_demo
from umlos_cuda.cli import main
from test_checkpoint_support import KEY, OTHER_KEY, manifest, write_container
from test_checkpoint_store import build_store


def run(capsys, *argv):
    capsys.readouterr()
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_inspect_container(tmp_path, capsys):
    path = str(tmp_path / "c")
    info = write_container(path)
    code, out, _ = run(capsys, "checkpoint", "inspect", path)
    assert code == 0
    assert info.checkpoint_hash.hex() in out and "tenant_id" in out and "trace_tail_hash_at_checkpoint" in out
    assert "tensors/rank=1/shard=1.bin" in out and "weight F32 [2, 3]" in out
    assert "train: {'epoch': 0, 'global_index': 24}" in out and "(none: first checkpoint)" in out
    code, out, _ = run(capsys, "checkpoint", "inspect", path, "--json")
    document = json.loads(out)
    assert document["checkpoint_hash"] == info.checkpoint_hash.hex()
    assert {e["path"]: e["size"] for e in document["entries"]}["tmmu/plan.cbor"] == os.path.getsize(
        os.path.join(path, "tmmu/plan.cbor"))


def test_inspect_store(tmp_path, capsys):
    store = str(tmp_path / "s")
    build_store(store)
    code, out, _ = run(capsys, "checkpoint", "inspect", store)
    assert code == 0 and "commits     3" in out and "checkpoints/commit=3" in out
    document = json.loads(run(capsys, "checkpoint", "inspect", store, "--json")[1])
    assert [c["t"] for c in document["commits"]] == [2, 4, 6]
    assert document["collected_through"] == 0 and not any(c["collected"] for c in document["commits"])
    assert "collected" not in out


def test_inspect_store_marks_collected_checkpoints(tmp_path, capsys):
    """After ``checkpoint gc``, inspect says which commits' containers were
    collected (their certificates still list them) and which remain."""
    store = str(tmp_path / "s")
    build_store(store)
    assert run(capsys, "checkpoint", "gc", store, "--keep-last", "1")[0] == 0
    code, out, _ = run(capsys, "checkpoint", "inspect", store)
    assert code == 0 and "checkpoints of commits 1..2 collected" in out
    lines = [line for line in out.splitlines() if "checkpoints/commit=" in line]
    assert [line.endswith("(collected)") for line in lines] == [True, True, False]
    document = json.loads(run(capsys, "checkpoint", "inspect", store, "--json")[1])
    assert document["collected_through"] == 2
    assert [c["collected"] for c in document["commits"]] == [True, True, False]
    assert [os.path.isdir(os.path.join(store, c["checkpoint"])) for c in document["commits"]] == [False, False, True]


def test_verify_with_trusted_keys(tmp_path, capsys):
    store = str(tmp_path / "s")
    build_store(store)
    public = signing.public_key_bytes(KEY)
    assert run(capsys, "checkpoint", "verify", store)[0] == 0
    assert run(capsys, "checkpoint", "verify", store, "--public-key", public.hex())[0] == 0
    key_file = tmp_path / "key.pem"
    from cryptography.hazmat.primitives import serialization

    key_file.write_bytes(signing.load_private_key(KEY).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    code, out, _ = run(capsys, "checkpoint", "verify", os.path.join(store, "checkpoints", "commit=2"),
                       "--public-key", str(key_file))
    assert code == 0 and "certified by commit 2" in out and "trusted key" in out
    code, _, err = run(capsys, "checkpoint", "verify", store, "--public-key", signing.public_key_bytes(OTHER_KEY).hex())
    assert code == 2 and err.startswith("error CHECKPOINT_SIGNATURE_INVALID")
    code, _, err = run(capsys, "checkpoint", "verify", store, "--public-key", "not-a-key")
    assert code == 2 and err.startswith("error CHECKPOINT_SIGNATURE_INVALID")
    path = str(tmp_path / "loose")
    write_container(path)
    code, _, err = run(capsys, "checkpoint", "verify", path, "--public-key", public.hex())
    assert code == 2 and err.startswith("error CHECKPOINT_SIGNATURE_INVALID")
    assert run(capsys, "checkpoint", "verify", path)[0] == 0
    code, _, err = run(capsys, "checkpoint", "verify", str(tmp_path / "absent"))
    assert code == 2 and err.startswith("error CHECKPOINT_NOT_FOUND")


def test_recover_command(tmp_path, capsys):
    store = str(tmp_path / "s")
    build_store(store)
    Path(os.path.join(store, "trace", "segment=4.tape.tmp")).write_bytes(b"torn")
    code, _, err = run(capsys, "checkpoint", "verify", store)
    assert code == 2 and err.startswith("error CHECKPOINT_UNCOMMITTED")
    code, out, _ = run(capsys, "checkpoint", "recover", store)
    assert code == 0 and "rolled back trace/segment=4.tape.tmp" in out
    assert run(capsys, "checkpoint", "verify", store)[0] == 0


def small_manifest_file(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(manifest().to_dict()))
    return str(path)


def test_demo_continuation_is_identical_and_verifies(tmp_path, capsys):
    workdir = str(tmp_path / "work")
    lines = []
    result = run_checkpoint_demo(workdir, small_manifest_file(tmp_path), "train", world_size=4, steps=20, every_k=4,
                                 backend="numpy", log=lines.append)
    assert result["identical"] is True and result["steps_compared"] == 20 - result["restored_from_step"] > 0
    assert result["restored_from_step"] == 12 and result["crash_after_step"] == 14
    assert result["rolled_back"] == ["trace/segment=4.tape.tmp"]
    assert result["iter_records_compared"] == 20 * 4 and result["commits"] == 5  # steps 4, 8, 12, 16, 20
    assert result["public_key"] == signing.public_key_bytes(DEMO_KEY_SEED).hex() == demo_public_key()
    assert any("restored checkpoint" in line for line in lines)
    assert any(result["head"] in line for line in lines if "final checkpoint" in line)  # printed at commit time
    assert run(capsys, "checkpoint", "verify", workdir, "--public-key", result["public_key"])[0] == 0
    code, out, _ = run(capsys, "checkpoint", "verify", workdir, "--expect-head", result["head"])
    assert code == 0 and result["head"] in out
    assert run(capsys, "checkpoint", "verify", result["container"], "--public-key", result["public_key"])[0] == 0
    # Any byte changed in the store (a sample of 150 over all its files) is refused.
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(workdir) for f in fs if f != ".lock")
    rng = random.Random(7)
    for _ in range(150):
        path = rng.choice(files)
        data = Path(path).read_bytes()
        position = rng.randrange(len(data))
        changed = bytearray(data)
        changed[position] ^= rng.randrange(1, 256)
        Path(path).write_bytes(changed)
        code, _, err = run(capsys, "checkpoint", "verify", workdir)
        assert code == 2 and err.startswith("error "), (path, position)
        Path(path).write_bytes(data)
    assert run(capsys, "checkpoint", "verify", workdir)[0] == 0
    # Running the demo again replaces its own store.
    again = run_checkpoint_demo(workdir, small_manifest_file(tmp_path), "train", world_size=4, steps=20, every_k=4,
                                backend="numpy", log=lambda line: None)
    assert again["checkpoint_hash"] == result["checkpoint_hash"]


def test_demo_command_prints_the_head_to_keep(tmp_path, capsys):
    workdir = str(tmp_path / "w")
    code, out, _ = run(capsys, "demo", "--manifest", small_manifest_file(tmp_path), "--workdir", workdir,
                       "--world-size", "2", "--steps", "8", "--every-k", "4", "--batches", "2", "--quiet")
    head = [line.split()[1] for line in out.splitlines() if line.strip().startswith("head ")]
    assert code == 0 and len(head) == 1 and f"--expect-head {head[0]}" in out
    assert run(capsys, "checkpoint", "verify", workdir, "--expect-head", head[0])[0] == 0


def test_demo_on_the_bundled_manifest(tmp_path):
    from umlos_cuda.commands.demo import default_manifest_path

    result = run_checkpoint_demo(str(tmp_path / "w"), default_manifest_path(), "train", world_size=8, steps=24,
                                 every_k=8, backend="numpy", log=lambda line: None)
    assert result["identical"] and result["final_cursor"] == {"epoch": 0, "global_index": 24 * 4096}


def test_demo_refuses_bad_arguments_and_foreign_stores(tmp_path):
    with pytest.raises(uc.UmlosError) as info:
        run_checkpoint_demo(str(tmp_path / "w"), manifest(), steps=4, every_k=4, log=lambda line: None)
    assert info.value.code == errors.INVALID_ARGUMENT
    assert info.value.message == "every_k (4) must be smaller than steps (4)"
    assert info.value.record["failure_operator"] == errors.DEMO_OPERATOR
    store = str(tmp_path / "foreign")
    build_store(store)
    with pytest.raises(uc.UmlosError) as info:
        run_checkpoint_demo(store, manifest(), steps=8, every_k=2, log=lambda line: None)
    assert info.value.code == errors.CHECKPOINT_STATE_INVALID and "choose another --workdir" in info.value.message


def test_the_demo_lives_with_its_command_not_in_the_library():
    """The checkpoint package holds the format and the store; the demo job is a user of it."""
    import importlib.util
    from pathlib import Path

    import umlos_cuda.checkpoint as package

    assert importlib.util.find_spec("umlos_cuda.checkpoint.demo") is None
    for module in Path(package.__file__).parent.glob("*.py"):
        assert "commands" not in module.read_text(encoding="utf-8").split('"""', 2)[-1], module.name  # no import of it
    assert "_checkpoint_demo" not in main.__globals__["build_parser"]()._subparsers._group_actions[0].choices
