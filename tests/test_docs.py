"""The documentation stands on its own: its snippets run and its links resolve.

Snippets. Every fenced block of README.md and docs/**/*.md carries a language.
``python`` and ``sh`` blocks are run, the blocks of one document in order,
from the repository's root, as a reader of a checkout runs them: with this
checkout's package first on the path (``PYTHONPATH`` is the root, as an
editable install of it gives), so ``umlos_cuda/manifests/demo.yaml`` and
``examples/data/...`` are the files of the tree the test runs in. Python runs
with this interpreter; sh runs with ``bash -e`` and this interpreter's ``bin``
folder first on ``PATH`` (where ``umlos-cuda``, ``python`` and ``torchrun``
are). A block that cannot run here (a GPU, a multi-process launch, a long
benchmark, a fragment of a larger program) is preceded by
``<!-- snippet: skip (REASON) -->``; the reason is required. ``text``,
``json``, ``yaml``, ``diff`` and ``c`` blocks are shown, not run; one preceded
by ``<!-- snippet: write NAME -->`` is also written to the file NAME (relative
to the root; never one that was there before the document ran), for the blocks
after it (a manifest that a later command reads, say).

What a document writes does not stay in the tree: before its first block the
test lists every path under the root (:func:`tree_state`; not inside ``.git``,
a virtual environment or a ``__pycache__`` folder, which any import fills),
and after its last (or its failure) removes exactly the paths that are new,
never one that existed. A path that existed and changed (a tracked file
included) or is gone fails the document, naming it: a snippet must write only
new paths, and documents keep their outputs under ``runs/`` (ignored by git)
or in names of their own. Nothing else may write into the tree while the test
runs, or its new files are taken for the document's: ``make test`` runs this
file whole in one process (``--dist loadfile``), its documents one after
another, and every other test writes under its own temporary folder. What a document's blocks
print is checked too where :data:`OUTPUT_CHECKS` says so (docs/quickstart.md:
the validation losses of its Trainer runs).

Links. Every relative link of every Markdown file in the repository resolves
to a file or folder inside the repository (and, for ``file.md#anchor``, to a
heading of that file); nothing in the repository points to the material it was
specified from outside it.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RUNNABLE = ("python", "sh")
SHOWN = ("text", "json", "yaml", "diff", "c")
#: Folders never searched for Markdown or text (tools, builds, local runs).
IGNORED_DIRS = {".git", ".venv", "build", "dist", "node_modules", "__pycache__", "demo-workdir", "umlos_cuda.egg-info"}
SNIPPET_TIMEOUT_S = 900

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<lang>[^`\s]*)\s*$")
SKIP = re.compile(r"^<!--\s*snippet:\s*skip\s*(?:\((?P<reason>[^)]*)\))?\s*-->$")
WRITE = re.compile(r"^<!--\s*snippet:\s*write\s+(?P<name>[\w.-]+(?:/[\w.-]+)*)\s*-->$")
INLINE_LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)"
                         r"|!\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


@dataclass(frozen=True)
class Block:
    path: str  # relative to ROOT
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip_reason: str | None  # None: no marker; "": a marker without a reason
    write_to: str | None = None  # a file name in the snippet directory

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def markdown_files() -> list[str]:
    """Every Markdown file of the repository, relative to ROOT."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if d not in IGNORED_DIRS and not d.startswith("."))
        found += [os.path.relpath(os.path.join(folder, name), ROOT) for name in files if name.endswith(".md")]
    return sorted(found)


def documentation_files() -> list[str]:
    """The documents whose snippets must run: README.md and docs/**/*.md."""
    return [path for path in markdown_files() if path == "README.md" or path.startswith("docs" + os.sep)]


def read(path: str) -> str:
    with open(os.path.join(ROOT, path), encoding="utf-8") as handle:
        return handle.read()


def fenced_blocks(path: str, text: str | None = None) -> list[Block]:
    """The fenced code blocks of a Markdown file, with the skip marker before each."""
    lines = (read(path) if text is None else text).splitlines()
    blocks = []
    number = 0
    while number < len(lines):
        opening = FENCE.match(lines[number])
        if not opening:
            number += 1
            continue
        indent, fence = len(opening.group("indent")), opening.group("fence")
        body = []
        end = number + 1
        while end < len(lines):
            closing = FENCE.match(lines[end])
            if closing and closing.group("fence")[0] == fence[0] and len(closing.group("fence")) >= len(fence) \
                    and not closing.group("lang"):
                break
            body.append(lines[end][indent:] if lines[end][:indent].strip() == "" else lines[end].lstrip())
            end += 1
        else:
            raise AssertionError(f"{path}:{number + 1}: a fenced block is not closed")
        previous = number - 1
        while previous >= 0 and not lines[previous].strip():
            previous -= 1
        marker_line = lines[previous].strip() if previous >= 0 else ""
        marker, write = SKIP.match(marker_line), WRITE.match(marker_line)
        reason = None if marker is None else (marker.group("reason") or "").strip()
        blocks.append(Block(path, number + 1, opening.group("lang").lower(), "\n".join(body) + "\n", reason,
                            write.group("name") if write else None))
        number = end + 1
    return blocks


def outside_fences(text: str, strip_inline_code: bool = True) -> str:
    """``text`` with the content of fenced blocks blanked (links there are code, not links)."""
    out = []
    fence = None
    for line in text.splitlines():
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group("fence")
            out.append("")
        elif fence is not None:
            if match and match.group("fence")[0] == fence[0] and len(match.group("fence")) >= len(fence):
                fence = None
            out.append("")
        else:
            out.append(re.sub(r"`[^`]*`", "", line) if strip_inline_code else line)  # inline code is no link
    return "\n".join(out)


def links_in(text: str) -> list[tuple[int, str]]:
    """``(line, target)`` of every inline, image and reference-style link outside code."""
    found = []
    for number, line in enumerate(outside_fences(text).splitlines(), 1):
        found += [(number, match.group(1) or match.group(2)) for match in INLINE_LINK.finditer(line)]
        reference = REFERENCE_LINK.match(line)
        if reference:
            found.append((number, reference.group(1)))
    return found


def heading_anchors(path: str) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file."""
    anchors: set[str] = set()
    counts: dict[str, int] = {}
    for line in outside_fences(read(path), strip_inline_code=False).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).replace("`", "").lower()).replace(" ", "-")
        suffix = counts.get(slug, 0)
        counts[slug] = suffix + 1
        anchors.add(slug if suffix == 0 else f"{slug}-{suffix}")
    return anchors


# ---------------------------------------------------------------- snippet format
def all_blocks() -> list[Block]:
    return [block for path in documentation_files() for block in fenced_blocks(path)]


def test_every_block_declares_a_known_language():
    problems = [
        f"{block.where}: ```{block.lang or '(no language)'}: use python or sh (run), or {', '.join(SHOWN)} (shown only)"
        for block in all_blocks()
        if block.lang not in RUNNABLE + SHOWN
    ]
    assert not problems, "\n".join(problems)


def test_skipped_snippets_say_why():
    blocks = all_blocks()
    skipped = [block for block in blocks if block.skip_reason is not None]
    problems = [f"{block.where}: a skip marker needs a reason: <!-- snippet: skip (why) -->"
                for block in skipped if len(block.skip_reason) < 5]
    problems += [f"{block.where}: ```{block.lang} blocks are never run; remove the skip marker"
                 for block in skipped if block.lang not in RUNNABLE]
    assert not problems, "\n".join(problems)
    runnable = [block for block in blocks if block.lang in RUNNABLE]
    run = [block for block in runnable if block.skip_reason is None]
    print(f"{len(run)} snippets run, {len(runnable) - len(run)} skipped with a reason:")
    for block in runnable:
        if block.skip_reason is not None:
            print(f"  {block.where}: {block.skip_reason}")
    readme = [block for block in run if block.path == "README.md"]
    assert {block.lang for block in readme} == set(RUNNABLE), "README.md must keep runnable python and sh snippets"


def test_block_parser_reads_markers_languages_and_indented_fences():
    text = (
        "Intro\n\n<!-- snippet: skip (needs a GPU) -->\n\n```python\nimport cupy\n```\n"
        "- item\n  ```sh\n  umlos-cuda env\n  ```\n```\nplain\n```\n<!-- snippet: skip -->\n```sh\nx\n```\n"
        "<!-- snippet: write run.yaml -->\n```yaml\nseed: 1\n```\n"
    )
    blocks = fenced_blocks("t.md", text)
    assert [(b.lang, b.skip_reason, b.write_to, b.code) for b in blocks] == [
        ("python", "needs a GPU", None, "import cupy\n"),
        ("sh", None, None, "umlos-cuda env\n"),
        ("", None, None, "plain\n"),
        ("sh", "", None, "x\n"),
        ("yaml", None, "run.yaml", "seed: 1\n"),
    ]


# ---------------------------------------------------------------- running snippets
#: Folders a document's run neither lists nor cleans: git's own, and Python's bytecode caches (any import writes them).
#: Not walked: git's folder and the caches of tools that a run of the suite or a developer's lint fills
#: (imports, hypothesis's example database, pytest's, mypy's and ruff's caches), which other processes (the
#: other worker of ``make test``, a ``make lint`` beside it) write into while a document runs.
UNWATCHED_DIRS = {".git", "__pycache__", ".hypothesis", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


def tree_state(root: str = ROOT) -> dict[str, tuple]:
    """Every path under ``root`` (relative), to what says it changed: ``("file", size, mtime_ns)``,
    ``("link", target)`` or ``("dir",)``. Not walked: :data:`UNWATCHED_DIRS` and virtual environments
    (a folder holding ``pyvenv.cfg``, such as ``.venv``), which stand as one entry."""
    state: dict[str, tuple] = {}
    for folder, dirs, files in os.walk(root):
        relative = os.path.relpath(folder, root)
        kept = []
        for name in sorted(dirs):
            path = os.path.normpath(os.path.join(relative, name))
            if name in UNWATCHED_DIRS:
                continue
            if os.path.islink(os.path.join(folder, name)):
                state[path] = ("link", os.readlink(os.path.join(folder, name)))
                continue
            state[path] = ("dir",)
            if not os.path.exists(os.path.join(folder, name, "pyvenv.cfg")):
                kept.append(name)
        dirs[:] = kept
        for name in files:
            full, path = os.path.join(folder, name), os.path.normpath(os.path.join(relative, name))
            info = os.lstat(full)
            state[path] = ("link", os.readlink(full)) if os.path.islink(full) else \
                ("file", info.st_size, info.st_mtime_ns)
    return state


def remove_new_paths(before: dict[str, tuple], root: str = ROOT) -> list[str]:
    """Remove every path under ``root`` that :func:`tree_state` did not list in ``before`` (a new folder
    whole, a link itself and never its target); return what changed or went of what existed."""
    after = tree_state(root)
    for path in sorted(set(after) - set(before)):
        if os.path.dirname(path) in after and os.path.dirname(path) not in before:
            continue  # inside a new folder, removed with it
        full = os.path.join(root, path)
        if after[path] == ("dir",):
            shutil.rmtree(full)
        else:
            os.unlink(full)
    problems = [f"{path}: changed" for path in sorted(set(before) & set(after)) if before[path] != after[path]
                and before[path][0] != "dir"]
    return problems + [f"{path}: removed" for path in sorted(set(before) - set(after))]


def snippet_env() -> dict[str, str]:
    """The test's environment with this interpreter's ``bin`` first on ``PATH`` and the root as ``PYTHONPATH``."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = ROOT
    return env


def run_block(block: Block, scripts: str, number: int) -> str:
    """Run one block from the root; its standard output."""
    if block.lang == "python":
        script = os.path.join(scripts, f"snippet_{number}.py")
        with open(script, "w", encoding="utf-8") as handle:
            handle.write(block.code)
        command = [sys.executable, script]
    else:
        command = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    result = subprocess.run(command, cwd=ROOT, env=snippet_env(), capture_output=True, text=True,
                            timeout=SNIPPET_TIMEOUT_S)
    assert result.returncode == 0, (
        f"{block.where}: the {block.lang} snippet failed (exit {result.returncode})\n--- snippet\n{block.code}"
        f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}"
    )
    return result.stdout


def run_document(path: str, scripts: str) -> dict[Block, str]:
    """The runnable blocks of one document, in order, from the root (its write blocks written there); the
    standard output of each. Every path they make is removed after, and a path that existed and changed or
    went fails it (see the module docstring)."""
    before = tree_state()
    outputs = {}
    try:
        for number, block in enumerate(fenced_blocks(path)):
            if block.write_to is not None:
                target = os.path.normpath(block.write_to)
                assert ".." not in block.write_to.split("/") and target not in before, (
                    f"{block.where}: a write block writes a new file inside the tree, not {block.write_to}")
                with open(os.path.join(ROOT, target), "w", encoding="utf-8") as handle:
                    handle.write(block.code)
            elif block.lang in RUNNABLE and block.skip_reason is None:
                outputs[block] = run_block(block, scripts, number)
    finally:
        problems = remove_new_paths(before)
    assert not problems, f"{path}: its snippets changed what was in the tree before it ran:\n" + "\n".join(problems)
    return outputs


def documents_with_snippets() -> list[str]:
    return [path for path in documentation_files()
            if any(b.lang in RUNNABLE and b.skip_reason is None and b.write_to is None for b in fenced_blocks(path))]


def quickstart_trains_with_a_validation_loss(outputs: dict[Block, str]) -> None:
    """docs/quickstart.md's Trainer runs print the validation loss they end with: a number, and below what a
    model that learned nothing scores (the log of the vocabulary's size, 512 ids, for a uniform guess)."""
    losses = [float(match) for output in outputs.values()
              for match in re.findall(r"^validation loss (\S+)$", output, flags=re.M)]
    assert len(losses) == 2, f"docs/quickstart.md: expected the SFT and the mixture runs' validation losses: {losses}"
    assert all(math.isfinite(loss) and 0 < loss < math.log(512) for loss in losses), losses


#: Checks of what a document's blocks print, beyond their exit status.
OUTPUT_CHECKS = {os.path.join("docs", "quickstart.md"): quickstart_trains_with_a_validation_loss}


@pytest.mark.parametrize("path", documents_with_snippets())
def test_snippets_run(path, tmp_path):
    """The runnable blocks of one document, in order, from the root, leaving the tree as it was."""
    outputs = run_document(path, str(tmp_path))
    if path in OUTPUT_CHECKS:
        OUTPUT_CHECKS[path](outputs)


def test_the_quickstart_check_refuses_a_missing_or_chance_level_loss():
    block = Block("docs/quickstart.md", 1, "python", "", None)
    for printed in ("", "validation loss 1.302\n", "validation loss nan\nvalidation loss 1.4\n",
                    "validation loss 6.5\nvalidation loss 1.4\n"):
        with pytest.raises(AssertionError):
            quickstart_trains_with_a_validation_loss({block: printed})
    quickstart_trains_with_a_validation_loss({block: "validation loss 1.302\nvalidation loss 1.439\n"})


def test_a_failing_snippet_fails(tmp_path):
    block = Block("t.md", 1, "sh", "umlos-cuda next-batch umlos_cuda/manifests/demo.yaml --dataset nope\n", None)
    with pytest.raises(AssertionError, match="INVALID_DATASET_KEY"):
        run_block(block, str(tmp_path), 0)


def test_snippets_import_this_checkout():
    """From the root, a snippet imports the package of the tree under test (not another install of it)."""
    code = "python -c 'import umlos_cuda; print(umlos_cuda.__file__)'\n"
    printed = run_block(Block("t.md", 1, "sh", code, None), ROOT, 0)
    assert printed.strip() == os.path.join(ROOT, "umlos_cuda", "__init__.py")


def test_a_document_s_new_paths_are_removed_and_what_existed_is_kept(tmp_path):
    root = tmp_path / "tree"
    (root / "kept").mkdir(parents=True)
    (root / "kept" / "old.txt").write_text("old", encoding="utf-8")
    (root / ".venv").mkdir()
    (root / ".venv" / "pyvenv.cfg").write_text("home = /usr\n", encoding="utf-8")
    (tmp_path / "outside.txt").write_text("outside", encoding="utf-8")
    before = tree_state(str(root))
    assert sorted(before) == [".venv", "kept", os.path.join("kept", "old.txt")]
    (root / "kept" / "new.txt").write_text("new", encoding="utf-8")
    (root / "runs" / "deep").mkdir(parents=True)
    (root / "runs" / "deep" / "out.bin").write_bytes(b"x")
    (root / "link").symlink_to(tmp_path / "outside.txt")
    (root / ".venv" / "inside-a-venv").write_text("not listed", encoding="utf-8")
    assert remove_new_paths(before, str(root)) == []
    assert sorted(tree_state(str(root))) == sorted(before)
    assert (tmp_path / "outside.txt").read_text(encoding="utf-8") == "outside"  # a link's target is kept
    assert (root / ".venv" / "inside-a-venv").exists()  # a virtual environment is not looked into

    (root / "kept" / "old.txt").write_text("changed", encoding="utf-8")
    (root / ".venv" / "pyvenv.cfg").unlink()  # no longer a venv: its files are new, and removed
    assert remove_new_paths(before, str(root)) == [f"{os.path.join('kept', 'old.txt')}: changed"]
    assert not (root / ".venv" / "inside-a-venv").exists()


# ---------------------------------------------------------------- links
def test_relative_links_resolve_inside_the_repository():
    problems = []
    for path in markdown_files():
        folder = os.path.dirname(os.path.join(ROOT, path))
        for line, target in links_in(read(path)):
            if SCHEME.match(target) or target.startswith("#"):
                if target.startswith("#") and target[1:] not in heading_anchors(path):
                    problems.append(f"{path}:{line}: no heading for anchor {target}")
                continue
            file_part, _, anchor = target.partition("#")
            resolved = os.path.realpath(os.path.join(folder, file_part))
            if os.path.commonpath([resolved, ROOT]) != ROOT:
                problems.append(f"{path}:{line}: {target} points outside the repository")
            elif not os.path.exists(resolved):
                problems.append(f"{path}:{line}: {target} does not exist")
            elif anchor and resolved.endswith(".md") and anchor not in heading_anchors(os.path.relpath(resolved, ROOT)):
                problems.append(f"{path}:{line}: {file_part} has no heading for anchor #{anchor}")
    assert not problems, "\n".join(problems)


def test_link_finder_sees_inline_reference_and_image_links_but_not_code(tmp_path):
    text = "See [a](x.md#b), ![i](img.png) and `[c](no.md)`.\n\n[ref]: ../up.md\n\n```text\n[d](no.md)\n```\n"
    assert [target for _, target in links_in(text)] == ["x.md#b", "img.png", "../up.md"]



#: Names of the source material the specification was written from, which the
#: repository must neither link to nor cite by file name or by number ("seed 000
#: §5"): docs/spec/ is its own, and code cites its sections (docs/spec/README.md).
OUTSIDE_MATERIAL = re.compile(r"\.\./shared\b|\bshared/(?:spec|seeds)\b|\b00[0-4]_[0-9a-f]{16}\b"
                              r"|nextbatch-v2-resolutions|\b[Ss]eeds? 00[0-4]\b|\b[Ss]eed §")


def text_files() -> list[str]:
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if d not in IGNORED_DIRS and not d.startswith("."))
        for name in files:
            if name.endswith((".md", ".py", ".cuh", ".cu", ".cpp", ".h", ".json", ".yaml", ".toml", ".txt", ".cfg")) \
                    or name == "Makefile":
                found.append(os.path.relpath(os.path.join(folder, name), ROOT))
    return sorted(found)


def test_nothing_points_outside_the_repository_for_its_specification():
    this_file = os.path.relpath(os.path.abspath(__file__), ROOT)
    problems = []
    for path in text_files():
        if path == this_file:
            continue
        for number, line in enumerate(read(path).splitlines(), 1):
            if OUTSIDE_MATERIAL.search(line):
                problems.append(f"{path}:{number}: {line.strip()[:120]}")
    assert not problems, "cite docs/spec/ instead:\n" + "\n".join(problems)


def test_the_readme_lists_every_document():
    """README.md's "Documentation" section links every docs/*.md and docs/spec/*.md."""
    text = read("README.md")
    section = re.search(r"^## Documentation\n(.*?)(?=^## )", text, flags=re.S | re.M)
    assert section, "README.md has no '## Documentation' section"
    linked = {os.path.normpath(target.partition("#")[0]) for _, target in links_in(section.group(1))}
    documents = [path for path in markdown_files()
                 if os.path.dirname(path) in ("docs", os.path.join("docs", "spec"))]
    missing = [path for path in documents if path not in linked]
    assert documents and not missing, "README.md, Documentation: add a line for " + ", ".join(missing)
