"""YAML for untrusted manifests: safe tags only, no duplicate keys, bounded aliases.

``yaml.safe_load`` builds only plain data, but it still lets the last of two
equal keys win, and an alias expands to a full copy of its anchor once the
document is turned into plain data: a 500-byte file of 8 levels of 10 aliases
is 10^8 values (minutes and gigabytes to copy and hash). :func:`load` keeps
PyYAML's safe constructors and adds three refusals, each a ``yaml.YAMLError``:

- a mapping that states one key twice (after YAML merge keys ``<<``, which
  may be overridden by design);
- a document whose size with every alias expanded is over ``max_nodes``
  nodes or ``max_bytes`` bytes of scalar text, measured on the node graph
  before anything is built (each distinct node is visited once, so the
  refusal is immediate however large the expansion), or that refers to
  itself through an alias, or is nested deeper than ``max_depth`` (counted
  while the document is composed, so that no depth reaches Python's recursion
  limit);
- a scalar that cannot become a Python value (an integer of more than
  Python's 4300 digits, a date like ``2001-13-01``).

The pure-Python loader is used on purpose, not libyaml's ``CSafeLoader``:
whether libyaml is present differs between machines, and a manifest must
load to the same data everywhere.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MERGE_TAG = "tag:yaml.org,2002:merge"


class StrictSafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys and oversized alias expansion."""

    max_nodes = 1_000_000
    max_bytes = 16 << 20
    max_depth = 64

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        """PyYAML's composer recurses once per level (two frames each): refuse a document nested
        deeper than ``max_depth`` while composing it, before Python's recursion limit is reached
        (a 1 MiB file of block mappings indented one more space a line is 1,400 levels deep)."""
        depth = getattr(self, "_compose_depth", -1) + 1  # the root is at depth 0, as ExpansionBound counts
        if depth > self.max_depth:
            raise ComposerError(None, None, f"nested deeper than {self.max_depth} levels", self.peek_event().start_mark)
        self._compose_depth = depth
        try:
            return super().compose_node(parent, index)
        finally:
            self._compose_depth = depth - 1

    def get_single_data(self) -> Any:
        node = self.get_single_node()
        if node is None:
            return None
        ExpansionBound(self.max_nodes, self.max_bytes, self.max_depth).measure(node)
        try:
            return self.construct_document(node)
        except (ValueError, OverflowError) as exc:  # int("9" * 5000), date(2001, 13, 1), ...
            raise ConstructorError(None, None, f"a value cannot be read: {exc}", None) from exc

    def construct_mapping(self, node: Node, deep: bool = False) -> dict:
        if isinstance(node, MappingNode):
            self._refuse_duplicate_keys(node)
        return super().construct_mapping(node, deep=deep)

    def _refuse_duplicate_keys(self, node: MappingNode) -> None:
        """Two equal keys written in one mapping are refused; keys merged in with
        ``<<`` may be overridden (that is what merging is for), but each merged
        mapping is checked on its own."""
        seen: set = set()
        for key_node, value_node in node.value:
            if key_node.tag == MERGE_TAG:
                merged = value_node.value if isinstance(value_node, SequenceNode) else [value_node]
                for item in merged:
                    if isinstance(item, MappingNode):
                        self._refuse_duplicate_keys(item)
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # unhashable: the base class says so with its mark
                return
            if duplicate:
                raise ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found duplicate key {key!r}; a key may appear only once", key_node.start_mark,
                )
            seen.add(key)


def _construct_int(loader: StrictSafeLoader, node: Node) -> int:
    """PyYAML's int constructor, with Python's 4300-digit limit reported at the scalar."""
    try:
        return yaml.SafeLoader.construct_yaml_int(loader, node)
    except ValueError as exc:
        raise ConstructorError(
            None, None, f"integer of {len(node.value)} characters cannot be read ({str(exc).split(';')[0]})",
            node.start_mark,
        ) from exc


StrictSafeLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


class ExpansionBound:
    """Measures a composed node graph as if every alias were expanded."""

    def __init__(self, max_nodes: int, max_bytes: int, max_depth: int) -> None:
        self.max_nodes, self.max_bytes, self.max_depth = max_nodes, max_bytes, max_depth
        self._sizes: dict[int, tuple[int, int, int]] = {}  # id(node) -> (nodes, bytes, height)
        self._open: set[int] = set()

    def measure(self, node: Node, depth: int = 0) -> tuple[int, int, int]:
        """``(nodes, bytes, height)`` of ``node`` expanded; raises once over a bound."""
        known = self._sizes.get(id(node))
        if known is None:
            if id(node) in self._open:
                raise ConstructorError(None, None, "an alias refers to a node that contains it", node.start_mark)
            if depth > self.max_depth:
                raise ConstructorError(None, None, f"nested deeper than {self.max_depth} levels", node.start_mark)
            self._open.add(id(node))
            known = self._measure_children(node, depth)
            self._open.discard(id(node))
            self._sizes[id(node)] = known
        nodes, size, height = known
        if nodes > self.max_nodes or size > self.max_bytes:
            over = f"{self.max_nodes} values" if nodes > self.max_nodes else f"{self.max_bytes} bytes of text"
            raise ConstructorError(
                None, None, f"with its aliases expanded the document holds more than {over}", node.start_mark
            )
        if depth + height > self.max_depth:
            raise ConstructorError(None, None, f"nested deeper than {self.max_depth} levels", node.start_mark)
        return known

    def _measure_children(self, node: Node, depth: int) -> tuple[int, int, int]:
        if isinstance(node, ScalarNode):
            return 1, len(node.value.encode("utf-8", "surrogatepass")), 0
        if isinstance(node, SequenceNode):
            children = list(node.value)
        elif isinstance(node, MappingNode):
            children = [child for pair in node.value for child in pair]
        else:  # pragma: no cover - the composer makes only these three
            raise ConstructorError(None, None, f"unexpected node {type(node).__name__}", node.start_mark)
        nodes, size, height = 1, 0, 0
        for child in children:
            child_nodes, child_size, child_height = self.measure(child, depth + 1)
            nodes, size, height = nodes + child_nodes, size + child_size, max(height, child_height + 1)
            if nodes > self.max_nodes or size > self.max_bytes:
                break  # the caller reports it; no need to count further
        return nodes, size, height


def load(text: str, *, max_nodes: int | None = None, max_bytes: int | None = None, max_depth: int | None = None) -> Any:
    """Parse one YAML document with :class:`StrictSafeLoader`; errors are ``yaml.YAMLError``."""
    loader = StrictSafeLoader(text)
    if max_nodes is not None:
        loader.max_nodes = max_nodes
    if max_bytes is not None:
        loader.max_bytes = max_bytes
    if max_depth is not None:
        loader.max_depth = max_depth
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
