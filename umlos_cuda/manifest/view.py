"""Deep read-only views of plain data: what ``Manifest.canonical`` and ``Manifest.datasets`` are.

A manifest is bound by its hash: ``manifest_hash`` is computed once, when the
manifest is built, from a private plain copy, and every engine call reads the
typed fields computed at the same time. What a reader is shown must not be
able to drift from what was hashed, so the mappings and lists it sees refuse
every change.

The views subclass ``dict`` and ``list`` rather than being
``types.MappingProxyType`` and tuples, so that everything that read a
manifest's plain data before still reads it: ``json.dumps``, ``cbor2`` (the
same bytes; tests/test_manifest_frozen.py checks ``hash_canonical(m.canonical)
== m.hash``), ``isinstance(x, dict)``, and comparisons with plain data
(``m.canonical["extra"]["tags"] == [1, 2]`` holds; a tuple would not equal
the list). PyYAML's ``safe_dump`` accepts only exact ``dict`` and ``list``:
give it ``Manifest.to_dict()``.

Every method that would change a view raises ``TypeError``, the error Python
itself raises for a tuple or a mappingproxy: trying to edit a manifest is a
mistake in the calling code, not bad input data, so it is a plain Python error
rather than an ``UmlosError`` with a failure code. Python cannot stop a caller
who goes around a view on purpose (``dict.__setitem__(view, key, value)``);
that is why the engine never reads the views.

``copy.copy`` and ``copy.deepcopy`` of a view return plain, mutable data (a
copy is the caller's to edit and turn into a new manifest); ``pickle`` keeps a
view read-only.
"""

from __future__ import annotations

from typing import Any, NoReturn

__all__ = ["HOW_TO_CHANGE", "ReadOnlyDict", "ReadOnlyList", "freeze", "thaw"]

HOW_TO_CHANGE = (
    "a Manifest is read-only once hashed (its manifest_hash would no longer describe it); "
    "build a new one: m.with_overrides(key=value), or Manifest.from_dict(edited m.to_dict())"
)


def _refuse(name: str):
    def refuse(self: Any, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(f"{type(self).__name__}.{name}: {HOW_TO_CHANGE}")

    refuse.__name__ = name
    return refuse


class _ReadOnly:
    """What both views share: ``__init__`` only once, plain copies, read-only pickles."""

    __slots__ = ()
    _plain_type: type  # dict or list, the type a copy is

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if self:  # a second __init__ would replace the content
            _refuse("__init__")(self)
        super().__init__(*args, **kwargs)

    def __reduce__(self) -> tuple:
        return type(self), (self._plain_type(self),)

    def __copy__(self) -> Any:
        return self._plain_type(self)

    def __deepcopy__(self, memo: dict) -> Any:
        return thaw(self)


def _refusing(*names: str):
    """Class decorator: each named method raises ``TypeError`` instead."""

    def decorate(cls: type) -> type:
        for name in names:
            setattr(cls, name, _refuse(name))
        return cls

    return decorate


@_refusing("__setitem__", "__delitem__", "__ior__", "clear", "pop", "popitem", "setdefault", "update")
class ReadOnlyDict(_ReadOnly, dict):
    """A ``dict`` whose every mutating method raises ``TypeError``."""

    __slots__ = ()
    _plain_type = dict


@_refusing(
    "__setitem__", "__delitem__", "__iadd__", "__imul__",
    "append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse",
)
class ReadOnlyList(_ReadOnly, list):
    """A ``list`` whose every mutating method raises ``TypeError``."""

    __slots__ = ()
    _plain_type = list


def freeze(value: Any) -> Any:
    """A deep read-only copy of plain data: every dict and list becomes a view; leaves are shared."""
    if isinstance(value, dict):
        return ReadOnlyDict({key: freeze(item) for key, item in value.items()})
    if isinstance(value, list):
        return ReadOnlyList([freeze(item) for item in value])
    return value


def thaw(value: Any) -> Any:
    """A deep plain copy: exact ``dict`` and ``list`` all the way down; leaves (immutable) are shared."""
    if isinstance(value, dict):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, list):
        return [thaw(item) for item in value]
    return value
