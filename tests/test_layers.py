"""The package's imports follow the layer table of docs/architecture.md.

The table ("Layers") gives every module of ``umlos_cuda/`` a layer, from the
foundation (errors, hashing, files) at the bottom to the command line at the
top. Every import is read from the source, wherever it is written (at module
level, inside a function, under ``if TYPE_CHECKING``), relative or absolute,
and so is every ``importlib.import_module`` of a name written in the code.
The imports must form no cycle, and none may reach a layer above its own
module's. The table must place every module and name nothing that is not
there, so the table and the code cannot drift apart.

The checker's functions take any package folder and any table; the tests at
the end run them on small packages written to ``tmp_path`` to show that they
find a planted cycle, a planted upward import and a module the table forgets.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "umlos_cuda")
ARCHITECTURE = os.path.join(ROOT, "docs", "architecture.md")


# ------------------------------------------------------------------ the modules and their imports
def package_modules(package_dir: str) -> dict[str, str]:
    """Dotted module name -> source path, for every ``.py`` file of the package
    (a package is named by its ``__init__.py``)."""
    base = os.path.dirname(os.path.abspath(package_dir))
    modules = {}
    for folder, dirs, files in os.walk(package_dir):
        dirs[:] = sorted(d for d in dirs if d.isidentifier() and os.path.isfile(os.path.join(folder, d, "__init__.py")))
        for name in sorted(files):
            if name.endswith(".py") and name[:-3].isidentifier():
                parts = os.path.relpath(os.path.join(folder, name), base)[:-3].split(os.sep)
                modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = os.path.join(folder, name)
    return modules


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int

    def __str__(self) -> str:
        return f"{self.importer} -> {self.imported} (line {self.line})"


def _top_level_names(tree: ast.Module) -> set[str]:
    """Names a module binds at its top level (what ``from package import name`` can find there)."""
    names: set[str] = set()
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            pending += [child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt)]
            for handler in getattr(node, "handlers", ()):
                pending += handler.body
    return names


def _string_constants(tree: ast.Module, name: str) -> list[str]:
    """The strings written in the module-level assignment of ``name`` (a registry of module names)."""
    found = []
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value is not None:
                found += [c.value for c in ast.walk(node.value)
                          if isinstance(c, ast.Constant) and isinstance(c.value, str)]
    return found


def _dynamic_targets(call: ast.Call, tree: ast.Module) -> list[str]:
    """The names ``importlib.import_module(...)`` / ``__import__(...)`` may import, when the code writes them."""
    func = call.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if called not in ("import_module", "__import__") or not call.args:
        return []
    argument = call.args[0]
    if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
        return [argument.value]
    if isinstance(argument, ast.Subscript):  # import_module(REGISTRY[name])
        argument = argument.value
    if isinstance(argument, ast.Name):
        return _string_constants(tree, argument.id)
    return []


def module_imports(package_dir: str) -> list[Import]:
    """Every import of one module of the package by another, anywhere in its code."""
    modules = package_modules(package_dir)
    trees = {}
    for name, path in modules.items():
        with open(path, encoding="utf-8") as handle:
            trees[name] = ast.parse(handle.read(), path)
    found = []
    for importer, tree in trees.items():
        is_package = modules[importer].endswith("__init__.py")
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = importer.split(".")[:len(importer.split(".")) - node.level + is_package]
                    base = ".".join(parts + ([node.module] if node.module else []))
                for alias in node.names:
                    child = f"{base}.{alias.name}"
                    if child in modules or base not in modules:
                        targets.append(child)
                    elif (modules[base].endswith("__init__.py") and alias.name != "*"
                          and alias.name not in _top_level_names(trees[base])):
                        targets.append(child)  # a compiled extension module (umlos_cuda._native): outside the graph
                    else:
                        targets.append(base)
            elif isinstance(node, ast.Call):
                targets = _dynamic_targets(node, tree)
            for target in targets:
                if target in modules and target != importer:  # others: outside the package, or compiled
                    found.append(Import(importer, target, node.lineno))
    return list(dict.fromkeys(found))  # one per line, however many names it imports


# ------------------------------------------------------------------ cycles
def import_cycles(imports: list[Import]) -> list[list[Import]]:
    """Every strongly connected group of two or more modules, as the imports inside it (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for edge in imports:
        graph.setdefault(edge.importer, set()).add(edge.imported)
        graph.setdefault(edge.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(start: str) -> None:  # iterative, so a long chain cannot overflow the recursion limit
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [sorted((e for e in imports if e.importer in g and e.imported in g), key=str) for g in groups]


# ------------------------------------------------------------------ the layer table
@dataclass(frozen=True)
class Row:
    layer: int
    entries: tuple[str, ...]  # "batching/plans/" (a package and all below it), "errors" (one module)


def read_layer_table(markdown: str) -> list[Row]:
    """The rows of the table of the "## Layers" section: a layer number, then the
    modules and packages of that layer in backquotes."""
    section = re.search(r"^## Layers\n(.*?)(?=^## )", markdown, re.S | re.M)
    assert section, "docs/architecture.md has no '## Layers' section"
    rows = []
    for line in section.group(1).splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) >= 2 and re.match(r"\d+\b", cells[0]):
            rows.append(Row(int(re.match(r"\d+", cells[0]).group()), tuple(re.findall(r"`([^`]+)`", cells[1]))))
    assert rows, "the Layers section has no table rows"
    return rows


def _entry_module(root: str, entry: str) -> tuple[str, bool]:
    """``(dotted name, covers everything below it)`` of a table entry."""
    below = entry.endswith("/")
    parts = [p for p in entry.strip("/").split("/") if p != "__init__"]
    return ".".join([root] + parts), below


def assign_layers(modules: list[str], rows: list[Row], root: str) -> tuple[dict[str, int], list[str]]:
    """The layer of each module (its own entry, else its closest package entry),
    and the table's problems: a module no row places, an entry named twice or
    naming nothing."""
    exact: dict[str, int] = {}
    below: dict[str, int] = {}
    problems = []
    for row in rows:
        for entry in row.entries:
            name, covers = _entry_module(root, entry)
            table = below if covers else exact
            if name in table:
                problems.append(f"the table names {entry} twice")
            table[name] = row.layer
            if not any(m == name or (covers and m.startswith(name + ".")) for m in modules):
                problems.append(f"the table names {entry}, which is not a module or package of {root}")
    layers = {}
    for module in modules:
        if module in exact:
            layers[module] = exact[module]
            continue
        prefix = module
        while prefix not in below and "." in prefix:
            prefix = prefix.rsplit(".", 1)[0]
        if prefix in below:
            layers[module] = below[prefix]
        else:
            problems.append(f"{module} is in no row of the layer table")
    return layers, problems


def upward_imports(imports: list[Import], layers: dict[str, int]) -> list[str]:
    return [f"{e} imports layer {layers[e.imported]} from layer {layers[e.importer]}" for e in imports
            if e.importer in layers and e.imported in layers and layers[e.imported] > layers[e.importer]]


def check_package(package_dir: str, markdown: str) -> list[str]:
    """Every problem: cycles, upward imports, the table's own."""
    root = os.path.basename(os.path.abspath(package_dir))
    imports = module_imports(package_dir)
    layers, problems = assign_layers(sorted(package_modules(package_dir)), read_layer_table(markdown), root)
    problems += ["import cycle: " + "; ".join(map(str, cycle)) for cycle in import_cycles(imports)]
    return problems + upward_imports(imports, layers)


# ------------------------------------------------------------------ the package itself
def _architecture() -> str:
    with open(ARCHITECTURE, encoding="utf-8") as handle:
        return handle.read()


def test_umlos_cuda_has_no_cycle_and_no_upward_import():
    assert check_package(PACKAGE, _architecture()) == []


def test_the_table_orders_the_layers_as_the_architecture_describes():
    rows = read_layer_table(_architecture())
    assert [row.layer for row in rows] == sorted((row.layer for row in rows), reverse=True)  # top to bottom
    modules = sorted(package_modules(PACKAGE))
    layers, _ = assign_layers(modules, rows, "umlos_cuda")
    order = ["umlos_cuda.errors", "umlos_cuda.reference", "umlos_cuda.modes.base", "umlos_cuda.manifest.core",
             "umlos_cuda.sampler", "umlos_cuda.backends.native", "umlos_cuda.nextbatch", "umlos_cuda.checkpoint.store",
             "umlos_cuda.batching.plans.plan", "umlos_cuda.streams.window.rolling", "umlos_cuda.torch._plan_sampler",
             "umlos_cuda.cli"]
    assert [layers[m] for m in order] == sorted(layers[m] for m in order)
    assert len({layers[m] for m in order}) == len(order)


def test_the_sampler_layers_sit_below_the_entry_points_and_the_backends():
    """presets, sampler and the mode registry never import nextbatch or a backend,
    not even inside a function: resolving a sampler computes nothing."""
    modules = sorted(package_modules(PACKAGE))
    layers, _ = assign_layers(modules, read_layer_table(_architecture()), "umlos_cuda")
    lower = ["umlos_cuda.presets", "umlos_cuda.sampler"] + [m for m in modules if m.startswith("umlos_cuda.modes")]
    higher = [m for m in modules if m == "umlos_cuda.nextbatch" or m.startswith("umlos_cuda.backends")]
    assert max(layers[m] for m in lower) < min(layers[m] for m in higher)


def test_the_reader_sees_lazy_relative_and_dynamic_imports():
    """Known imports of the package, one of each kind the reader must see."""
    imports = {(e.importer, e.imported) for e in module_imports(PACKAGE)}
    assert ("umlos_cuda.checkpoint.tape", "umlos_cuda.backends") in imports  # inside a function
    assert ("umlos_cuda.backends", "umlos_cuda.backends.cupy_backend") in imports  # import_module(_MODULES[name])
    assert ("umlos_cuda.batching", "umlos_cuda.batching.plans.plan") in imports  # from .plans.plan import ...
    assert not any(imported == "umlos_cuda" for importer, imported in imports
                   if importer == "umlos_cuda.backends.native")  # from .. import _native: the extension


# ------------------------------------------------------------------ the checker finds what it must
def _write_package(tmp_path, files: dict[str, str]) -> str:
    package = tmp_path / "toy"
    for name, source in {"__init__.py": "", **files}.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return str(package)


TOY_TABLE = """# Toy

## Layers

| layer | home | what |
|---|---|---|
| 3 | `__init__`, `cli` | the top |
| 2 | `stages/` | the middle |
| 1 | `errors`, `math` | the bottom |

## Next
"""


def test_a_clean_toy_package_passes(tmp_path):
    package = _write_package(tmp_path, {
        "errors.py": "",
        "math.py": "from . import errors\n",
        "stages/__init__.py": "from .one import run\n",
        "stages/one.py": "from ..math import x\nimport toy.errors\n",
        "cli.py": "import importlib\n\ndef main():\n    importlib.import_module('toy.stages.one')\n",
    })
    assert check_package(package, TOY_TABLE) == []
    imports = {(e.importer, e.imported) for e in module_imports(package)}
    assert imports == {("toy.math", "toy.errors"), ("toy.stages", "toy.stages.one"), ("toy.stages.one", "toy.math"),
                       ("toy.stages.one", "toy.errors"), ("toy.cli", "toy.stages.one")}


def test_the_checker_fails_on_a_cycle_hidden_in_a_function(tmp_path):
    package = _write_package(tmp_path, {
        "errors.py": "", "math.py": "",
        "stages/__init__.py": "",
        "stages/one.py": "from .two import b\n",
        "stages/two.py": "def b():\n    from . import one\n",
        "cli.py": "",
    })
    assert check_package(package, TOY_TABLE) == [
        "import cycle: toy.stages.one -> toy.stages.two (line 1); toy.stages.two -> toy.stages.one (line 2)"]


def test_the_checker_fails_on_an_upward_import(tmp_path):
    package = _write_package(tmp_path, {
        "errors.py": "", "cli.py": "",
        "math.py": "def f():\n    from .stages.one import run\n",
        "stages/__init__.py": "",
        "stages/one.py": "",
    })
    assert check_package(package, TOY_TABLE) == [
        "toy.math -> toy.stages.one (line 2) imports layer 2 from layer 1"]


def test_the_checker_fails_on_a_dynamic_upward_import(tmp_path):
    package = _write_package(tmp_path, {
        "errors.py": "", "cli.py": "", "stages/__init__.py": "",
        "math.py": "import importlib\nMODULES = {'a': 'toy.cli'}\nimportlib.import_module(MODULES['a'])\n",
    })
    assert check_package(package, TOY_TABLE) == ["toy.math -> toy.cli (line 3) imports layer 3 from layer 1"]


def test_the_checker_fails_when_table_and_tree_differ(tmp_path):
    package = _write_package(tmp_path, {"errors.py": "", "cli.py": "", "stages/__init__.py": "", "extra.py": ""})
    assert check_package(package, TOY_TABLE) == [
        "the table names math, which is not a module or package of toy",
        "toy.extra is in no row of the layer table",
    ]
