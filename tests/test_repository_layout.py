"""No folder of the repository shadows an installed distribution.

``python -m pytest``, a script started from the repository root and torchrun
ranks all put the root on ``sys.path``, ahead of site-packages. A top-level
folder with an ``__init__.py`` is then the package of that name for the whole
process: ``kernels/`` once hid Hugging Face's ``kernels``, which
``transformers`` imports, and every test that built a model failed
(docs/architecture.md, "Packaging"). A folder without one is a namespace
portion, which an installed package always wins over.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The package itself is the one folder that must be importable from the root.
PACKAGE = "umlos_cuda"
#: Folders whose names PyPI distributions use, or could: each must stay out of the way.
MUST_NOT_SHADOW = ("kernels", "golden", "bench", "examples", "tests", "docs")


def top_level_folders() -> list[str]:
    """Every folder at the root whose name ``import`` could reach, the package excepted."""
    return sorted(entry.name for entry in ROOT.iterdir()
                  if entry.is_dir() and entry.name.isidentifier() and entry.name != PACKAGE)


def _run_from_root(code: str, *extra_path: Path) -> dict:
    """``code`` in a child started from the root with the root first on ``sys.path``, then
    ``extra_path``; its last line of output, parsed as JSON."""
    path = [str(ROOT), *map(str, extra_path)]
    prelude = f"import sys; sys.path[:0] = {path!r}\n"
    result = subprocess.run([sys.executable, "-c", prelude + code], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_folders_that_must_not_shadow_are_the_ones_at_the_root():
    """The list is a floor, not the whole check: the decoy test below takes every folder."""
    assert set(MUST_NOT_SHADOW) <= set(top_level_folders())


@pytest.mark.parametrize("name", top_level_folders())
def test_no_top_level_folder_is_a_regular_package(name):
    assert not (ROOT / name / "__init__.py").exists(), (
        f"{name}/__init__.py makes the checkout's {name}/ the package {name!r} for every process that has the "
        "repository root on sys.path, hiding an installed distribution of that name")


def test_an_installed_package_of_each_folders_name_wins_over_the_folder(tmp_path):
    """Decoy distributions, one per folder name, behind the root on ``sys.path``:
    every ``import NAME`` must reach the decoy, as it would a real distribution."""
    names = top_level_folders()
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("ORIGIN = 'distribution'\n", encoding="utf-8")
    code = ("import importlib, json\n"
            f"print(json.dumps({{n: importlib.import_module(n).__file__ for n in {names!r}}}))\n")
    found = _run_from_root(code, tmp_path)
    assert found == {name: str(tmp_path / name / "__init__.py") for name in names}


def test_hugging_face_kernels_is_imported_from_its_distribution_with_the_root_on_the_path():
    """What transformers >= 5.25 does on import (``transformers.integrations.hub_kernels``)."""
    try:
        distribution = metadata.distribution("kernels")
        metadata.distribution("transformers")
    except metadata.PackageNotFoundError as exc:
        pytest.skip(f"{exc.name} is not installed (make test installs both from constraints.txt)")
    expected = os.path.realpath(distribution.locate_file("kernels/__init__.py"))
    code = ("import json, os, kernels\n"
            "from kernels import CUDAProperties\n"
            "from transformers.integrations import hub_kernels\n"
            "print(json.dumps({'kernels': os.path.realpath(kernels.__file__),"
            " 'hub_kernels': hub_kernels.__name__}))\n")
    found = _run_from_root(code)
    assert found == {"kernels": expected, "hub_kernels": "transformers.integrations.hub_kernels"}
