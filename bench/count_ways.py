"""The ways ``umlos_cuda`` opens a token source or lengths and reads a plan folder, and where each is used.

**Method.** Every ``.py`` file under ``umlos_cuda/`` is parsed (``ast``). Each name of :data:`CATEGORIES` is a
function, a class (its construction is the way) or ``Class.method``; its **definitions** are the module-level
``def``/``class`` of that name (``Class.method``: the method in that class), each given as the defining module's
path. Its **call sites** are the ``ast.Call`` nodes whose callee is that name (``f(...)``, ``module.f(...)``;
``Class.method(...)`` for a method); its **references** the other loads of the name (passed as a value, say
``open_tokens=open_mapped``; ``isinstance`` checks of a class excluded), import statements never. A private name
(``_x``) is only looked for in its own module. Call sites and references are split by the module they are in:
``commands/`` (with ``cli.py``), ``batching/``, and the rest of the package (``torch/`` mostly).

It also prints the size of ``batching/``: per folder, the ``.py`` files (``__init__.py`` included) and their lines
(``\n`` counted, as ``wc -l`` does), and the total.

``--discover`` also lists the definitions under ``batching/``, ``commands/`` and ``torch/`` whose name looks like a
way (``open*``, ``load*``, ``is_*``, ``recorded_*``, ``*_lengths``, ``Mapped*``, ``*Lengths``, ``*_source``, a
method ``open``/``load``) but is in no category: after a restructuring, the new names to add (or to read).

Usage::

    PYTHONPATH=$PWD python bench/count_ways.py [--discover] [--json]
"""

from __future__ import annotations

import argparse
import ast
import collections
import json
import os
import re

#: category -> names (a function, a class, or Class.method) as the code spells them today.
CATEGORIES = {
    "open a token source or lengths from a path": [
        "open_token_source", "open_mapped", "recorded_lengths", "MegatronDataset.open", "MegatronDatasetList.open",
        "TokenStore.open", "ShardedTokenStore.open", "MappedMegatron", "StoreLengths", "ShardedLengths",
        "MappedLengths", "open_length_cache", "LengthCache.load", "load_lengths", "cut_source",
        "_mapped_token_lengths", "windowed_lengths", "mixed_lengths",
    ],
    "open lengths from a plan folder's recorded path (private)": ["_source", "_open_component"],
    "read a plan folder": [
        "load_plan", "load_windowed_plan", "load_mixed_plan", "load_microbatch_plan", "load_sequences",
        "load_mixed_sequences", "load_pretraining", "load_mixed_pretraining",
    ],
    "read a plan folder (private: torch/_sequences.py's dispatch on the folder's kind)": ["_open"],
    "is_* predicates on folders and paths": [
        "is_windowed_plan", "is_mixed_plan", "is_sequences", "is_mixed_sequences", "is_kind", "_is_plan",
        "_is_shard_set", "is_sharded_store", "names_token_source",
    ],
}

LOOKS_LIKE = re.compile(r"(open|load|is_|recorded_|Mapped).*|.*(_lengths|Lengths|_source)")
DISCOVER_IN = ("batching/", "commands/", "torch/")
SIDES = ("commands", "batching", "other")


def parse_package(root: str) -> dict[str, ast.Module]:
    """Every module of the package, by its path relative to ``root``."""
    trees = {}
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as handle:
                    trees[os.path.relpath(path, root)] = ast.parse(handle.read(), path)
    return trees


def definitions(trees: dict[str, ast.Module]) -> dict[str, list[str]]:
    """``name`` or ``Class.method`` -> the modules defining it (module level, and methods of module-level classes)."""
    found: collections.defaultdict[str, list[str]] = collections.defaultdict(list)
    for path, tree in trees.items():
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                found[node.name].append(path)
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef):
                        found[f"{node.name}.{item.name}"].append(path)
    return found


def spelled(node: ast.AST) -> list[str]:
    """The names a load spells: ``f`` for ``f`` and ``module.f``; ``Class.f`` too for ``Class.f``."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr] + ([f"{node.value.id}.{node.attr}"] if isinstance(node.value, ast.Name) else [])
    return []


def uses(tree: ast.Module) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """Per name: its call sites and its other references in one module (module docstring)."""
    calls: collections.Counter[str] = collections.Counter()
    refs: collections.Counter[str] = collections.Counter()
    callees, skipped = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            callees.add(id(node.func))
            calls.update(spelled(node.func))
            if isinstance(node.func, ast.Name) and node.func.id in ("isinstance", "issubclass") and len(node.args) > 1:
                checked = node.args[1]
                for item in (checked.elts if isinstance(checked, ast.Tuple) else [checked]):
                    skipped.add(id(item))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Name | ast.Attribute) and isinstance(node.ctx, ast.Load) and id(node) not in callees
                and id(node) not in skipped):
            refs.update(spelled(node))
    return calls, refs


def side_of(path: str) -> str:
    """Which of :data:`SIDES` a module is on."""
    if path.startswith("commands/") or path == "cli.py":
        return "commands"
    return "batching" if path.startswith("batching/") else "other"


def count(trees: dict[str, ast.Module]) -> dict[str, list[dict]]:
    """Per category, per name: where it is defined, its call sites and references in commands/ and elsewhere."""
    defined = definitions(trees)
    used = {path: uses(tree) for path, tree in trees.items()}
    result = {}
    for category, names in CATEGORIES.items():
        rows = []
        for name in names:
            homes = defined.get(name, [])
            private = name.split(".")[-1].startswith("_")
            row = {"name": name, "defined_in": homes,
                   **{f"{kind}_{side}": 0 for kind in ("calls", "refs") for side in SIDES}}
            for path, (calls, refs) in used.items():
                if private and path not in homes:
                    continue
                side = side_of(path)
                row[f"calls_{side}"] += calls[name]
                row[f"refs_{side}"] += refs[name]
            rows.append(row)
        result[category] = rows
    return result


def discover(trees: dict[str, ast.Module]) -> list[tuple[str, str]]:
    """Definitions that look like a way (module docstring) but are in no category: (name, module)."""
    known = {name for names in CATEGORIES.values() for name in names}
    found = []
    for name, homes in sorted(definitions(trees).items()):
        short = name.split(".")[-1]
        method = "." in name and short in ("open", "load")
        if name in known or not (method or ("." not in name and LOOKS_LIKE.fullmatch(short.lstrip("_")))):
            continue
        found += [(name, home) for home in homes if home.startswith(DISCOVER_IN)]
    return found


def sizes(root: str, under: str = "batching") -> dict[str, tuple[int, int]]:
    """Per folder under ``root/under`` (relative to ``root``): its ``.py`` files and their lines."""
    result = {}
    for folder, _, files in sorted(os.walk(os.path.join(root, under))):
        modules = [name for name in files if name.endswith(".py")]
        lines = 0
        for name in modules:
            with open(os.path.join(folder, name), "rb") as handle:
                lines += handle.read().count(b"\n")
        if modules:
            result[os.path.relpath(folder, root)] = (len(modules), lines)
    return result


def print_sizes(table: dict[str, tuple[int, int]]) -> None:
    print("\n### size of batching/\n\n| folder | .py files | lines |\n|---|---:|---:|")
    for folder, (modules, lines) in table.items():
        print(f"| {folder} | {modules} | {lines} |")
    print(f"| **total** | {sum(m for m, _ in table.values())} | {sum(n for _, n in table.values())} |")


def print_report(result: dict[str, list[dict]]) -> None:
    for category, rows in result.items():
        print(f"\n### {category}: {len(rows)} names, {sum(bool(r['defined_in']) for r in rows)} defined, "
              f"{sum(any(h.startswith('commands/') for h in r['defined_in']) for r in rows)} of them in commands/\n")
        print("| name | defined in | calls: commands/ | batching/ | other | references: commands/, batching/, other |")
        print("|---|---|---:|---:|---:|---|")
        for r in rows:
            print(f"| `{r['name']}` | {', '.join(r['defined_in']) or 'NOT FOUND'} | "
                  + " | ".join(str(r[f"calls_{side}"]) for side in SIDES) + " | "
                  + ", ".join(str(r[f"refs_{side}"]) for side in SIDES) + " |")
        print("| **total** | | " + " | ".join(str(sum(r[f"calls_{side}"] for r in rows)) for side in SIDES) + " | "
              + ", ".join(str(sum(r[f"refs_{side}"] for r in rows)) for side in SIDES) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", help="the package folder (default: umlos_cuda next to bench/)")
    parser.add_argument("--discover", action="store_true", help="also list uncategorized names that look like ways")
    parser.add_argument("--json", action="store_true", help="print the counts as one JSON object")
    args = parser.parse_args()
    root = args.root or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "umlos_cuda")
    trees = parse_package(root)
    result = count(trees)
    extra = discover(trees) if args.discover else []
    if args.json:
        print(json.dumps({"categories": result, "discovered": extra, "sizes": sizes(root)}, indent=1))
        return
    print(f"package: {root}")
    print_report(result)
    print_sizes(sizes(root))
    if args.discover:
        print(f"\n### not in a category, named like a way ({len(extra)})\n")
        print("\n".join(f"- `{name}` ({home})" for name, home in extra))


if __name__ == "__main__":
    main()
