"""Golden checkpoint bytes (docs/checkpoint-format.md §15): the store in
golden/checkpoint_store_v1/ is what golden/make_checkpoint_golden.py writes,
byte for byte; it verifies, and it restores to the generator's state."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

import umlos_cuda as uc
from umlos_cuda.checkpoint import restore_latest, verify_store
from umlos_cuda.bundled import bundled_folder
from umlos_cuda.checkpoint.summary import verify_path

ROOT = Path(__file__).resolve().parent.parent
# golden/ is no package (umlos_cuda/bundled.py says why): the generator is loaded from its file.
_spec = importlib.util.spec_from_file_location("make_checkpoint_golden", ROOT / "golden" / "make_checkpoint_golden.py")
generator = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(generator)


@pytest.fixture(scope="module")
def golden_dir():
    with resources.as_file(bundled_folder("golden").joinpath(generator.NAME)) as path:
        yield str(path)


@pytest.fixture(scope="module")
def summary():
    return json.loads(bundled_folder("golden").joinpath(generator.NAME + ".json").read_text())


def listing(root):
    out = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            out[os.path.relpath(path, root).replace(os.sep, "/")] = Path(path).read_bytes()
    return out


def test_regenerating_gives_the_same_bytes(golden_dir, tmp_path):
    fresh = str(tmp_path / "store")
    summary = generator.build(fresh)
    golden, regenerated = listing(golden_dir), listing(fresh)
    assert sorted(golden) == sorted(regenerated)
    for rel in sorted(golden):
        assert golden[rel] == regenerated[rel], f"{rel} differs from the golden bytes"
    assert len(golden) == 37
    assert summary["files"] == {rel: hashlib.sha256(data).hexdigest() for rel, data in sorted(golden.items())}


def test_summary_matches_the_files(golden_dir, summary):
    files = listing(golden_dir)
    assert summary["files"] == {rel: hashlib.sha256(data).hexdigest() for rel, data in sorted(files.items())}
    assert summary["generator"] == {"script": "golden/make_checkpoint_golden.py",
                                    "version": generator.GENERATOR_VERSION}
    assert summary["checkpoint_hashes"] == [
        "32dea46eaab6d584055c47b5106441b556c63505afeda244744dc76ec4bee553",
        "e215c6efda489b85ee6b3b0e1681662135aab30bcdb90fa0d3b2ac2eb90022eb",
    ]


def test_golden_store_verifies_with_its_published_key(golden_dir, summary):
    result = verify_store(golden_dir, summary["public_key"])
    assert result["commits"] == 2 and result["latest_checkpoint_hash"] == summary["checkpoint_hashes"][-1]
    container = os.path.join(golden_dir, "checkpoints", "commit=1")
    assert verify_path(container, summary["public_key"])["checkpoint_hash"] == summary["checkpoint_hashes"][0]


def test_golden_store_restores_the_generator_state(golden_dir, summary):
    manifest = uc.Manifest.from_dict(generator.MANIFEST)
    from umlos_cuda.checkpoint import RunIdentity

    restored = restore_latest(golden_dir, RunIdentity(generator.TENANT, generator.RUN, manifest),
                              public_key=summary["public_key"])
    cursor = uc.Cursor(**summary["final_cursor"])
    assert restored.cursors == {"train": cursor}
    want = generator.golden_state(restored.t, cursor)
    for rank, shards in want.tensors.items():
        for got, expected in zip(restored.tensors[rank], shards):
            for name, array in expected.items():
                assert got[name].dtype == array.dtype and np.array_equal(got[name], array), name
    assert restored.user_state["rng"] == want.user_state["rng"]
    assert restored.dp_accountant == want.dp_accountant and restored.tmmu_plan == want.tmmu_plan
