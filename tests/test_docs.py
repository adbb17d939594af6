"""The documentation stands on its own: its snippets run and its links resolve.

Snippets. Every fenced block of README.md and docs/**/*.md carries a language.
``python`` and ``sh`` blocks are run, the blocks of one document in order and
in one fresh temporary directory (which links to the repository's top-level
folders, so ``umlos_cuda/manifests/demo.yaml`` and ``bench/...`` resolve as
from a checkout, while whatever a snippet writes stays in the temporary
directory). Python runs with this interpreter; sh runs with ``bash -e`` and this
interpreter's ``bin`` folder first on ``PATH`` (where ``umlos-cuda``,
``python`` and ``torchrun`` are). A block that cannot run here (a GPU, a
multi-process launch, a long benchmark, a fragment of a larger program) is
preceded by ``<!-- snippet: skip (REASON) -->``; the reason is required.
``text``, ``json``, ``yaml``, ``diff`` and ``c`` blocks are shown, not run;
one preceded by ``<!-- snippet: write NAME -->`` is also written to the file
NAME of the temporary directory, for the blocks after it (a manifest that a
later command reads, say).

Links. Every relative link of every Markdown file in the repository resolves
to a file or folder inside the repository (and, for ``file.md#anchor``, to a
heading of that file); nothing in the repository points to the material it was
specified from outside it.
"""

from __future__ import annotations

import os
import re
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
def session_dir(tmp_path) -> str:
    """A directory that looks like the repository root to a snippet but keeps its writes."""
    work = tmp_path / "work"
    work.mkdir()
    for name in os.listdir(ROOT):
        if name.startswith(".") or name in IGNORED_DIRS:
            continue
        os.symlink(os.path.join(ROOT, name), work / name)
    return str(work)


def snippet_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.pop("PYTHONPATH", None)
    return env


def run_block(block: Block, cwd: str, scripts: str, number: int) -> None:
    if block.lang == "python":
        script = os.path.join(scripts, f"snippet_{number}.py")
        with open(script, "w", encoding="utf-8") as handle:
            handle.write(block.code)
        command = [sys.executable, script]
    else:
        command = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    result = subprocess.run(command, cwd=cwd, env=snippet_env(), capture_output=True, text=True,
                            timeout=SNIPPET_TIMEOUT_S)
    assert result.returncode == 0, (
        f"{block.where}: the {block.lang} snippet failed (exit {result.returncode})\n--- snippet\n{block.code}"
        f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}"
    )


def documents_with_snippets() -> list[str]:
    return [path for path in documentation_files()
            if any(b.lang in RUNNABLE and b.skip_reason is None and b.write_to is None for b in fenced_blocks(path))]


@pytest.mark.parametrize("path", documents_with_snippets())
def test_snippets_run(path, tmp_path):
    """The runnable blocks of one document, in order, in one temporary directory."""
    cwd = session_dir(tmp_path)
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    for number, block in enumerate(fenced_blocks(path)):
        if block.write_to is not None:
            assert ".." not in block.write_to.split("/"), f"{block.where}: write inside the snippet directory"
            with open(os.path.join(cwd, block.write_to), "w", encoding="utf-8") as handle:
                handle.write(block.code)
        elif block.lang in RUNNABLE and block.skip_reason is None:
            run_block(block, cwd, str(scripts), number)


def test_a_failing_snippet_fails(tmp_path):
    block = Block("t.md", 1, "sh", "umlos-cuda next-batch umlos_cuda/manifests/demo.yaml --dataset nope\n", None)
    with pytest.raises(AssertionError, match="INVALID_DATASET_KEY"):
        run_block(block, session_dir(tmp_path), str(tmp_path), 0)


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
