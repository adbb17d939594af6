"""Re-exports of a package's modules, imported on first use (PEP 562).

A package ``__init__`` that only re-exports used to import every module it names, so importing any module
of the package loaded all of them: any ``umlos_cuda.batching.*`` loaded 129 modules. Such an ``__init__`` now
lists its re-exports once, as ``from .module import name`` lines under ``if TYPE_CHECKING:`` (what type
checkers and readers see), and sets ``__getattr__, __dir__ = lazy(__name__, __file__)``: :func:`lazy` reads
that block from the file and imports a name's module the first time the name is asked for.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from typing import Any


def exports(path: str) -> dict[str, tuple[str, str]]:
    """Each name the ``if TYPE_CHECKING:`` block of the module at ``path`` imports: its relative module and
    the name there (``from .a import b as c`` gives ``c -> (".a", "b")``)."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    table: dict[str, tuple[str, str]] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for item in node.body:
                if isinstance(item, ast.ImportFrom) and item.level:
                    module = "." * item.level + (item.module or "")
                    table.update({alias.asname or alias.name: (module, alias.name) for alias in item.names})
    return table


def lazy(package: str, path: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for the package ``package`` whose ``__init__`` is ``path`` (module docstring).
    A name is imported once: its value is then set on the package, so later look-ups are plain attributes."""
    table = exports(path)

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, original = table[name]
        value = getattr(importlib.import_module(module, package), original)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(table) | set(vars(sys.modules[package])))

    return __getattr__, __dir__
