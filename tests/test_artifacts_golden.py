"""Every folder kind, byte for byte as release 308cbf1 wrote it (golden/make_artifacts_golden.py), but for the
meta.json keys added since, each named with its issue in ADDED_SINCE_RELEASE and left out of the comparison.

The listing in golden/artifacts_308cbf1/artifacts.json was written with the
code of that release; here today's code runs the same commands on the same
inputs, and every file must have the same SHA-256. A restructuring that moves
one hashed string, one field of a meta.json or one byte of an index is caught
against what users' folders hold, not against the tree being changed.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# golden/ is no package (umlos_cuda/bundled.py says why): the generator is loaded from its file.
_spec = importlib.util.spec_from_file_location("make_artifacts_golden", ROOT / "golden" / "make_artifacts_golden.py")
generator = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(generator)

PINNED = json.loads((Path(generator.GOLDEN) / generator.LISTING).read_text(encoding="utf-8"))
#: Each kind the issue that introduced the pin names, and the folder or file the commands write it to.
KINDS = {
    "length cache": "lengths.jsonl", "length cache sidecar": "lengths.jsonl.u32",
    "token store": "store/", "sharded token store": "sharded/", "Megatron pair": "corpus.idx",
    "whole plan": "plan/", "packed plan": "packed-plan/", "plan shards": "plan-shards/",
    "windowed plan": "windowed/", "windowed packed plan": "windowed-packed/", "mixed plan": "mixed/",
    "pretraining sequences": "sequences/", "mixed sequences": "mixed-sequences/",
    "compact batch folder": "batches-compact/", "npz batch folder": "batches-npz/",
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    """The commands run by today's code."""
    out = str(tmp_path_factory.mktemp("release") / "artifacts")
    generator.build(out)
    return out


@pytest.fixture(scope="module")
def built(folder) -> dict[str, str]:
    return generator.listing(folder)


def test_the_pin_was_written_by_the_release_with_todays_commands():
    assert PINNED["release"] == generator.RELEASE == "308cbf1"
    assert PINNED["commands"] == generator.COMMANDS


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_pin_covers_each_kind(kind):
    where = KINDS[kind]
    files = [name for name in PINNED["files"] if name == where or (where.endswith("/") and name.startswith(where))]
    assert files, f"{kind}: nothing pinned at {where}"
    if where.endswith("/"):  # every folder this project writes carries its marker
        assert where + "umlos-artifact.json" in files


def test_the_additions_since_the_release_are_written(folder):
    """What the listing leaves out of a file (ADDED_SINCE_RELEASE) is there, last: nothing else may differ."""
    for name, keys in generator.ADDED_SINCE_RELEASE.items():
        meta = json.loads(Path(folder, name).read_text(encoding="ascii"))
        assert list(meta)[-len(keys):] == list(keys), name
        assert all(meta[key] for key in keys), name


def test_every_file_is_byte_identical_to_the_release(built):
    pinned = PINNED["files"]
    changed = sorted(name for name in pinned if name in built and built[name] != pinned[name])
    missing = sorted(set(pinned) - set(built))
    added = sorted(set(built) - set(pinned))
    assert (changed, missing, added) == ([], [], []), (
        f"{len(changed)} changed, e.g. {changed[:5]}; {len(missing)} no longer written, e.g. {missing[:5]}; "
        f"{len(added)} new, e.g. {added[:5]} (python golden/make_artifacts_golden.py --keep DIR writes them)")
