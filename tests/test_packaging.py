"""Packaging: what ``pip install umlos-cuda`` gets, checked without a network.

* **pyproject.toml**: an SPDX license string (setuptools >= 77), checkpoints'
  packages as core dependencies, and GPU extras that each stay inside one CUDA
  major (``gpu-cu12`` pulls nothing built for CUDA 13, and the reverse), with
  the older names (``gpu``, ``nvrtc``, ``dali``, ``checkpoint``) kept as
  aliases. Every extra that an install command in the docs, the messages or
  the Makefile names exists.
* **The build**: the sdist, the wheel and the wheel rebuilt from the sdist are
  made by setuptools' own build backend in a copy of the sources (no isolation,
  no download, the native extension skipped: about two seconds) and must emit
  no warning; the wheel must hold every kernel file and every golden file,
  byte for byte. The one notice of an editable build is exactly the one the
  Makefile filters.
* **The installed package** finds its kernels and golden files where the
  engine looks (``umlos_cuda.bundled``): in the checkout for this editable
  install, inside the package for the wheel, unpacked and imported in a child
  process.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from importlib import resources
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
EXTRAS = PYPROJECT["project"]["optional-dependencies"]
MAJORS = (12, 13)
#: Extras that come in one flavour per CUDA major, and the older name of each
#: (an alias of its CUDA 12 flavour, which also runs under a CUDA 13 driver).
FAMILIES = {"gpu": "gpu", "nvrtc": "nvrtc", "dali": "dali"}
#: Packages that work with any CUDA major (NVML is part of the driver).
CUDA_AGNOSTIC = {"nvidia-ml-py"}
#: Packages whose name does not say the CUDA major; their version range must.
MAJOR_BY_VERSION = {"cuda-bindings", "nvidia-cuda-nvrtc"}


def requirements(extra: str) -> list[Requirement]:
    return [Requirement(text) for text in EXTRAS[extra]]


def cuda_major(requirement: Requirement) -> int | None:
    """The CUDA major a requirement is built for (None: any), from its name or its version range."""
    name = requirement.name.lower()
    if name in CUDA_AGNOSTIC:
        return None
    for pattern in (r"-cuda(\d\d)x$", r"-cuda(\d\d)0$", r"-cu(\d\d)$"):  # cupy-cuda12x, dali-cuda120, -cu12
        match = re.search(pattern, name)
        if match:
            return int(match.group(1))
    assert name in MAJOR_BY_VERSION, f"{name}: unknown CUDA package; say in this test which major it is for"
    admitted = {major for major in range(10, 20) for minor in (0, 5, 9)
                if requirement.specifier.contains(f"{major}.{minor}")}
    assert len(admitted) == 1, f"{requirement} admits CUDA majors {sorted(admitted)}; pin exactly one"
    return admitted.pop()


# --------------------------------------------------------------------------------------
# pyproject.toml
# --------------------------------------------------------------------------------------


def test_license_is_an_spdx_expression_and_setuptools_can_read_it():
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    (setuptools,) = [Requirement(r) for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")]
    assert not setuptools.specifier.contains("76.1") and setuptools.specifier.contains("77.0")


def test_checkpoint_packages_are_core():
    core = {Requirement(text).name.lower() for text in PYPROJECT["project"]["dependencies"]}
    assert {"cryptography", "safetensors", "numpy", "cbor2", "pyyaml"} <= core
    assert EXTRAS["checkpoint"] == []  # kept so that `pip install 'umlos-cuda[checkpoint]'` still works


def test_the_test_extra_brings_a_setuptools_that_builds_this_project():
    """Otherwise the build tests below would skip in a fresh venv (Python 3.11 seeds setuptools 65)."""
    (setuptools,) = [r for r in requirements("test") if r.name == "setuptools"]
    assert not setuptools.specifier.contains("76.1") and setuptools.specifier.contains("84.0")


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("major", MAJORS)
def test_each_gpu_extra_stays_within_one_cuda_major(family, major):
    extra = f"{family}-cu{major}"
    assert extra in EXTRAS, f"{extra} is missing: every family has one extra per CUDA major"
    majors = {str(r): cuda_major(r) for r in requirements(extra)}
    assert set(majors.values()) - {None} == {major}, f"{extra}: {majors}"


@pytest.mark.parametrize("alias", sorted(FAMILIES.values()))
def test_older_names_are_the_cuda_12_extras(alias):
    assert sorted(EXTRAS[alias]) == sorted(EXTRAS[f"{alias}-cu12"])


def test_the_cuda_12_and_13_gpu_extras_differ_only_in_cuda_builds():
    """Same roles on both sides: a CUDA build of CuPy, an NVRTC, NVML."""
    for family in FAMILIES:
        agnostic = [{str(r) for r in requirements(f"{family}-cu{m}") if cuda_major(r) is None} for m in MAJORS]
        counts = [len(requirements(f"{family}-cu{m}")) for m in MAJORS]
        assert agnostic[0] == agnostic[1] and counts[0] == counts[1], family


def test_make_test_installs_one_cuda_major():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    (line,) = re.findall(r"^TEST_EXTRAS\s*:?=\s*(\S+)\s*$", makefile, flags=re.M)
    extras = line.split(",")
    assert set(extras) <= set(EXTRAS), f"TEST_EXTRAS names extras that do not exist: {set(extras) - set(EXTRAS)}"
    cuda_extras = [e for e in extras if e in FAMILIES or e.rsplit("-cu", 1)[0] in FAMILIES]
    assert cuda_extras, "the tests need NVRTC and DALI"
    majors = {cuda_major(r) for extra in cuda_extras for r in requirements(extra)} - {None}
    assert len(majors) == 1, f"TEST_EXTRAS mixes CUDA majors {sorted(majors)}"
    assert not any(extra.startswith("gpu") for extra in extras)  # CuPy would need a GPU


def _files_naming_extras():
    for pattern in ("README.md", "Makefile", "docs/**/*.md", "umlos_cuda/**/*.py", "tests/*.py"):
        yield from ROOT.glob(pattern)


def test_every_extra_named_anywhere_exists():
    named = {}
    for path in _files_naming_extras():
        text = path.read_text(encoding="utf-8")
        # 'umlos-cuda[gpu-cu12]' and, from a checkout, '.[gpu-cu12]' (not Makefile variables)
        for group in re.findall(r"(?:umlos-cuda|(?<=['\"\s])\.)\[([\w\s,-]+)\]", text):
            for extra in group.split(","):
                named.setdefault(extra.strip(), []).append(str(path.relative_to(ROOT)))
    assert "gpu-cu12" in named and "gpu-cu13" in named  # the docs say which to pick
    unknown = {extra: where for extra, where in named.items() if extra not in EXTRAS}
    assert not unknown, f"extras that pyproject.toml does not define: {unknown}"


def _data_folders(package_dirs: dict[str, str]) -> set[str]:
    """Every folder below a package that setuptools would treat as a package:
    an identifier name reached through identifier names (``commit=1`` stops it)."""
    found = set()
    for package, folder in package_dirs.items():
        for directory, subdirs, _ in os.walk(ROOT / folder):
            subdirs[:] = [d for d in subdirs if d.isidentifier() and d != "__pycache__"]
            rel = Path(directory).relative_to(ROOT / folder)
            found.add(".".join((package,) + rel.parts))
    return found


def discover_packages(root: Path = ROOT) -> list[str]:
    """setup.py's package discovery (its ``setup()`` call runs only as ``__main__``)."""
    import runpy

    return runpy.run_path(str(ROOT / "setup.py"), run_name="discovery")["discover_packages"](str(root))


def test_pyproject_lists_no_packages_and_maps_the_three_roots():
    """A new subpackage ships without an edit to pyproject.toml: the list is discovered."""
    setuptools = PYPROJECT["tool"]["setuptools"]
    assert "packages" not in setuptools
    assert setuptools["package-dir"] == {"umlos_cuda": "umlos_cuda", "umlos_cuda._kernels": "kernels",
                                         "umlos_cuda._golden": "golden"}


def test_discovered_packages_are_every_shipped_folder(tmp_path):
    """Every folder of identifiers below a root, data folders included; a new folder is found."""
    setuptools = PYPROJECT["tool"]["setuptools"]
    mapped = setuptools["package-dir"]
    discovered = discover_packages()
    assert set(discovered) == _data_folders(mapped) and len(discovered) == len(set(discovered))
    assert {"umlos_cuda._kernels", "umlos_cuda._golden.checkpoint_store_v1.trace",
            "umlos_cuda.manifests"} <= set(discovered)
    assert not any("__pycache__" in name or "=" in name for name in discovered)
    for package in discovered:
        root = max((p for p in mapped if package == p or package.startswith(p + ".")), key=len)
        folder = ROOT / mapped[root] / Path(*package[len(root):].split(".")[1:])
        files = [p for p in folder.iterdir() if p.is_file()]
        if files and not any(p.suffix == ".py" for p in files):  # modules ship with their package; data needs globs
            assert package in setuptools["package-data"], f"{package} holds only data but declares none"
    # a new subpackage in a copy of the layout is discovered without any edit
    for folder in ("umlos_cuda/newpkg/inner", "kernels", "golden"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "pyproject.toml").write_bytes((ROOT / "pyproject.toml").read_bytes())
    assert discover_packages(tmp_path) == ["umlos_cuda", "umlos_cuda._golden", "umlos_cuda._kernels",
                                           "umlos_cuda.newpkg", "umlos_cuda.newpkg.inner"]


# --------------------------------------------------------------------------------------
# The build, in a copy of the sources
# --------------------------------------------------------------------------------------

BUILD = """
import json, sys, warnings
from setuptools import build_meta
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    name = getattr(build_meta, sys.argv[1])(sys.argv[2])
print(json.dumps({"name": name, "warnings": [f"{w.category.__name__}: {w.message}" for w in caught]}))
"""
SOURCES = ("pyproject.toml", "setup.py", "README.md", "umlos_cuda", "kernels", "golden")


def _build(hook: str, source: Path, out: Path) -> tuple[Path, list[str]]:
    """Run one PEP 517 hook of setuptools in ``source``: the artefact and every warning it raised."""
    env = dict(os.environ, UMLOS_NO_NATIVE="1")  # the extension is tested elsewhere; skip its compile
    result = subprocess.run([sys.executable, "-c", BUILD, hook, str(out)], cwd=source, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    return out / report["name"], report["warnings"]


@pytest.fixture(scope="module")
def source_copy(tmp_path_factory) -> Path:
    import setuptools

    if int(setuptools.__version__.split(".")[0]) < 77:  # the test extra installs a recent one
        pytest.skip(f"setuptools {setuptools.__version__} is older than the build requires (>= 77)")
    copy = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.pyd", "*.egg-info")
    for name in SOURCES:
        target = ROOT / name
        if target.is_dir():
            shutil.copytree(target, copy / name, ignore=ignore)
        else:
            shutil.copy2(target, copy / name)
    return copy


@pytest.fixture(scope="module")
def built(source_copy, tmp_path_factory):
    """sdist, wheel, and the wheel rebuilt from the unpacked sdist, with their warnings."""
    out = tmp_path_factory.mktemp("dist")
    sdist, sdist_warnings = _build("build_sdist", source_copy, out)
    wheel, wheel_warnings = _build("build_wheel", source_copy, out)
    unpacked = tmp_path_factory.mktemp("sdist")
    with tarfile.open(sdist) as archive:
        if hasattr(tarfile, "data_filter"):  # Python 3.11.4+
            archive.extractall(unpacked, filter="data")
        else:
            archive.extractall(unpacked)
    (top,) = unpacked.iterdir()
    again = tmp_path_factory.mktemp("from-sdist")
    wheel_from_sdist, again_warnings = _build("build_wheel", top, again)
    return {
        "sdist": (sdist, sdist_warnings),
        "wheel": (wheel, wheel_warnings),
        "wheel from sdist": (wheel_from_sdist, again_warnings),
    }


@pytest.mark.parametrize("artefact", ["sdist", "wheel", "wheel from sdist"])
def test_build_emits_no_warning(built, artefact):
    _, warnings = built[artefact]
    assert warnings == [], "\n\n".join(warnings)


def _shipped_data() -> dict[str, bytes]:
    """Repository file -> the wheel path it must have, for every kernel and golden file."""
    files = {}
    for folder, package in (("kernels", "umlos_cuda/_kernels"), ("golden", "umlos_cuda/_golden")):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".md",):
                files[f"{package}/{path.relative_to(ROOT / folder).as_posix()}"] = path.read_bytes()
    files["umlos_cuda/manifests/demo.yaml"] = (ROOT / "umlos_cuda/manifests/demo.yaml").read_bytes()
    files["umlos_cuda/py.typed"] = (ROOT / "umlos_cuda/py.typed").read_bytes()
    return files


@pytest.mark.parametrize("artefact", ["wheel", "wheel from sdist"])
def test_wheel_holds_every_kernel_and_golden_file(built, artefact):
    wheel, _ = built[artefact]
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        expected = _shipped_data()
        assert len([n for n in expected if "checkpoint_store_v1/" in n]) >= 30
        missing = sorted(set(expected) - names)
        assert not missing, f"{len(missing)} files missing from the wheel, e.g. {missing[:5]}"
        for name, data in expected.items():
            assert archive.read(name) == data, name
        assert not any(name.startswith(("tests/", "kernels/", "golden/")) for name in names)
        # every module of every subpackage, whichever folder it is in (none is listed anywhere)
        modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "umlos_cuda").rglob("*.py")
                   if "__pycache__" not in p.parts}
        assert len(modules) > 50 and not sorted(modules - names), sorted(modules - names)[:5]


def test_wheel_metadata(built):
    wheel, _ = built["wheel"]
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        text = archive.read(metadata).decode()
    assert "License-Expression: Apache-2.0" in text
    core = [line.split(": ", 1)[1] for line in text.splitlines()
            if line.startswith("Requires-Dist:") and ";" not in line]
    assert {Requirement(r).name for r in core} >= {"cryptography", "safetensors"}
    for extra in ("gpu-cu12", "gpu-cu13", "checkpoint"):
        assert f"Provides-Extra: {extra}" in text


def test_editable_build_notice_is_the_one_the_makefile_filters(source_copy, tmp_path):
    """An editable install of mapped folders makes setuptools emit one
    information-only warning; the Makefile filters exactly that message."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    (prefix,) = re.findall(r'PYTHONWARNINGS="ignore:([^":]+)"', makefile)
    _, warnings = _build("build_editable", source_copy, tmp_path)
    for warning in warnings:
        category, message = warning.split(": ", 1)
        assert category == "InformationOnly" and message.lower().startswith(prefix.lower()), warning


# --------------------------------------------------------------------------------------
# The installed package
# --------------------------------------------------------------------------------------


def test_installed_package_finds_kernels_and_golden_files():
    from umlos_cuda.bundled import bundled_folder

    for name in ("nextbatch_kernels.cu", "nextbatch.cuh", "philox.cuh", "platform.cuh"):
        shipped = bundled_folder("kernels").joinpath(name)
        assert shipped.read_bytes() == (ROOT / "kernels" / name).read_bytes()
    golden = bundled_folder("golden")
    store = ROOT / "golden" / "checkpoint_store_v1"
    files = [p for p in store.rglob("*") if p.is_file()]
    assert len(files) >= 30
    for path in files + [ROOT / "golden" / "nextbatch_v2.json", ROOT / "golden" / "checkpoint_store_v1.json"]:
        rel = path.relative_to(ROOT / "golden").as_posix()
        assert golden.joinpath(rel).read_bytes() == path.read_bytes(), rel
    assert resources.files("umlos_cuda").joinpath("manifests/demo.yaml").is_file()


WHEEL_CHILD = """
import hashlib, json, sys
import umlos_cuda
from umlos_cuda.bundled import bundled_folder
from umlos_cuda.commands._golden_vectors import load_golden
from umlos_cuda.kernel_source import kernel_source
print(json.dumps({"package": umlos_cuda.__file__, "kernels": str(bundled_folder("kernels")),
                  "golden": str(bundled_folder("golden")), "cases": len(load_golden()["cases"]),
                  "source": hashlib.sha256(kernel_source().encode()).hexdigest()}))
"""


def test_the_unpacked_wheel_reads_kernels_and_golden_files_from_inside_itself(built, tmp_path):
    """A wheel installs by unpacking: imported from there (ahead of this
    editable install on the path), the package finds its kernels and golden
    file in its own folder, never in this checkout."""
    wheel, _ = built["wheel"]
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", WHEEL_CHILD], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    found = json.loads(result.stdout)
    assert found["package"] == str(tmp_path / "umlos_cuda" / "__init__.py")
    assert found["kernels"] == str(tmp_path / "umlos_cuda" / "_kernels")
    assert found["golden"] == str(tmp_path / "umlos_cuda" / "_golden")
    from umlos_cuda.commands._golden_vectors import load_golden
    from umlos_cuda.kernel_source import kernel_source

    assert found["cases"] == len(load_golden()["cases"])
    assert found["source"] == hashlib.sha256(kernel_source().encode()).hexdigest()


@pytest.mark.parametrize("hidden", ["cryptography", "safetensors"])
def test_demo_workdir_names_a_missing_core_package_before_it_starts(hidden, tmp_path):
    """Only an install made with --no-deps lacks them; the demo says what to install, without a traceback."""
    code = (
        f"import sys; sys.modules[{hidden!r}] = None\n"
        "from umlos_cuda.cli import main\n"
        f"sys.exit(main(['demo', '--workdir', {str(tmp_path / 'w')!r}, '--batches', '2', '--quiet']))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert f"pip install {hidden}" in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == "" and not (tmp_path / "w").exists()  # nothing ran


def test_core_checkpoint_packages_are_installed():
    from umlos_cuda.commands.demo import missing_checkpoint_packages

    assert missing_checkpoint_packages() == []


def test_every_module_that_registers_checkpoint_kinds_is_an_entry_point():
    """A store holding a subsystem's cursors or records must verify in a process
    that never imported the subsystem: the reader imports the entry points of
    the group umlos_cuda.checkpoint (umlos_cuda/checkpoint/plugins.py)."""
    from umlos_cuda.checkpoint import plugins

    declared = PYPROJECT["project"]["entry-points"][plugins.GROUP]
    registering = set()
    for path in (ROOT / "umlos_cuda").rglob("*.py"):
        if "checkpoint" in path.relative_to(ROOT).parts[1:-1] or "__pycache__" in path.parts:
            continue  # the checkpoint package defines the registries
        if re.search(r"\bregister_(cursor_kind|record_type)\(", path.read_text(encoding="utf-8")):
            registering.add(".".join(path.relative_to(ROOT).with_suffix("").parts))
    assert registering and registering == set(declared.values()), (registering, declared)


def test_every_module_that_registers_artifact_kinds_is_an_entry_point():
    """``umlos-cuda info`` and ``verify`` must know every kind in a process that imported no subsystem: the
    registry imports the entry points of the group umlos_cuda.artifacts (umlos_cuda/artifacts.py)."""
    from umlos_cuda import artifacts

    declared = PYPROJECT["project"]["entry-points"][artifacts.GROUP]
    registering = set()
    for path in (ROOT / "umlos_cuda").rglob("*.py"):
        if path == ROOT / "umlos_cuda" / "artifacts.py" or "__pycache__" in path.parts:
            continue  # the registry itself
        if re.search(r"\bregister_artifact\(", path.read_text(encoding="utf-8")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            registering.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    assert registering and registering == set(declared.values()), (registering, declared)


def test_wheel_declares_the_checkpoint_entry_points(built):
    wheel, _ = built["wheel"]
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        text = archive.read(name).decode()
    assert "[umlos_cuda.checkpoint]" in text and "rng = umlos_cuda.rng.checkpoint_kinds" in text
