"""Caps on the arguments that size the work of Jinja's filters and of ``str`` methods, checked before they run.

What goes in: the filters of a chat environment (umlos_cuda/batching/chat/environment.py),
and each sandboxed call of a ``str`` method or ``str.format`` string. What
comes out: the filters wrapped (:func:`guarded_filters`), and nothing, or
:class:`~.limits.RenderLimitExceeded` for an argument over its cap.

Each of these is one step of template code whose work happens in Python
library code or in C, where the step counter of umlos_cuda/batching/chat/steps.py
does not look: ``[1]|slice(1000000000)`` loops 10^9 times, ``|wordwrap(1)``
over 60 M characters is quadratic in ``textwrap``, ``|center(10**12)`` and
``'%1000000000d' % 1`` allocate what they are told, ``|round(1, 10**9,
'floor')`` computes ``10 ** 10**9``. The caps are far above what a chat
template needs (limits.py: :data:`~.limits.MAX_ITEMS` items,
:data:`~.limits.MAX_RENDERED_CHARS` characters of output,
:data:`~.limits.MAX_FORMAT_WIDTH` for a width, precision or ``round``'s
digits, :data:`~.limits.MAX_JSON_INDENT` for ``tojson``'s indent), so a
template a model ships renders as transformers renders it. A filter given a
value of another type is left to fail as it would.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Mapping
from functools import wraps
from typing import Any

from .limits import (MAX_FORMAT_WIDTH, MAX_ITEMS, MAX_JSON_INDENT, MAX_RENDERED_CHARS, RenderLimitExceeded,
                     check_printf, over)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _cap(what: str, value: Any, cap: int) -> None:
    if _number(value) and abs(value) > cap:
        raise RenderLimitExceeded(f"the chat template asks {what} for {value:,}, over the cap of {cap:,} "
                                  "(umlos_cuda/batching/chat/guards.py)")


def _output(what: str, chars: int) -> None:
    if chars > MAX_RENDERED_CHARS:
        raise RenderLimitExceeded(f"the chat template's {what} would write {chars:,} characters, over the limit of "
                                  f"{MAX_RENDERED_CHARS:,}")


def _replaced_size(text: str, old: Any, new: Any, count: Any = -1) -> int:
    """The length of ``text.replace(old, new, count)``, computed without making it."""
    old, new = str(old), str(new)
    found = len(text) + 1 if not old else text.count(old)
    if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        found = min(found, count)
    return len(text) + found * (len(new) - len(old))


def _indent_size(text: str, width: Any) -> int:
    indent = len(width) if isinstance(width, str) else width if _number(width) else 0
    return len(text) + (text.count("\n") + 1) * max(int(indent), 0)


# The checks, one per filter, with the filter's own parameters (after the value).
def _slice(value: Any, slices: Any = None, fill_with: Any = None) -> None:
    _cap("|slice", slices, MAX_ITEMS)


def _batch(value: Any, linecount: Any = None, fill_with: Any = None) -> None:
    _cap("|batch", linecount, MAX_ITEMS)


def _wordwrap(s: Any, width: Any = 79, *args: Any, **kwargs: Any) -> None:
    lines = len(str(s)) // int(width) if _number(width) and width >= 1 else 0
    if lines > MAX_ITEMS:  # textwrap breaks a long word line by line, copying the rest: quadratic in the lines
        raise RenderLimitExceeded(f"the chat template wraps {len(str(s)):,} characters at width {width}: {lines:,} "
                                  f"lines, over the cap of {MAX_ITEMS:,} (umlos_cuda/batching/chat/guards.py)")


def _center(value: Any, width: Any = 80) -> None:
    _cap("|center", width, MAX_RENDERED_CHARS)


def _indent(s: Any, width: Any = 4, first: Any = False, blank: Any = False) -> None:
    _output("|indent", _indent_size(str(s), width))


def _format(value: Any, *args: Any, **kwargs: Any) -> None:
    check_printf(str(value))


def _round(value: Any, precision: Any = 0, method: Any = "common") -> None:
    _cap("|round", precision, MAX_FORMAT_WIDTH)


def _replace(s: Any, old: Any = "", new: Any = "", count: Any = None) -> None:
    _output("|replace", _replaced_size(str(s), old, new, -1 if count is None else count))


CHECKS: dict[str, Callable[..., None]] = {"slice": _slice, "batch": _batch, "wordwrap": _wordwrap, "center": _center,
                                          "indent": _indent, "format": _format, "round": _round, "replace": _replace}


def guarded_filters(filters: Mapping[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """The filters of :data:`CHECKS`, each checking its arguments before it runs (the context Jinja passes
    first to some filters is passed on untouched)."""
    return {name: _guarded(filters[name], check) for name, check in CHECKS.items()}


def _guarded(original: Callable[..., Any], check: Callable[..., None]) -> Callable[..., Any]:
    passes_context = hasattr(original, "jinja_pass_arg")  # pass_environment, pass_eval_context, async variants

    @wraps(original)  # keeps jinja_pass_arg: Jinja passes the wrapper what it passed the filter
    def guarded(*args: Any, **kwargs: Any) -> Any:
        check(*(args[1:] if passes_context else args), **kwargs)
        return original(*args, **kwargs)

    return guarded


def check_json_indent(indent: Any) -> None:
    """``tojson``'s indent: at most :data:`~.limits.MAX_JSON_INDENT` spaces, or a string that long."""
    _cap("tojson's indent", len(indent) if isinstance(indent, str) else indent, MAX_JSON_INDENT)


#: A run of ASCII digits in a format spec (a width, a precision, a fill that is a digit).
_DIGITS = re.compile(r"[0-9]+")
#: The ``str`` methods whose first argument sizes the string they make.
_WIDTH_METHODS = frozenset(("center", "ljust", "rjust", "zfill"))


def check_call(function: Any, args: tuple, kwargs: Mapping[str, Any]) -> None:
    """A sandboxed call of a ``str`` method that sizes its result (``center``, ``ljust``, ``rjust``,
    ``zfill``, ``expandtabs``, ``replace``) or formats (``format``, ``format_map``): refused over the caps."""
    text = getattr(function, "__self__", None)
    if not isinstance(text, str):
        return
    name = getattr(function, "__name__", "")
    if name in _WIDTH_METHODS:
        _cap(f"str.{name}", args[0] if args else kwargs.get("width"), MAX_RENDERED_CHARS)
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if _number(size):
            _output("str.expandtabs", len(text) + text.count("\t") * max(int(size), 0))
    elif name == "replace":
        if len(args) >= 2:
            _output("str.replace", _replaced_size(text, args[0], args[1], args[2] if len(args) > 2 else
                                                  kwargs.get("count", -1)))
    elif name in ("format", "format_map"):
        check_format(text)


def check_format(text: str) -> None:
    """A ``str.format`` string: refused with a width or precision over :data:`~.limits.MAX_FORMAT_WIDTH`,
    or one taken from the arguments (a nested ``{}`` in a format spec)."""
    if "{" not in text:
        return
    try:
        fields = list(string.Formatter().parse(text))
    except ValueError:  # not a format string: str.format raises the same, as it would
        return
    for _literal, _name, spec, _conversion in fields:
        if not spec:
            continue
        if "{" in spec:
            raise RenderLimitExceeded(f"the chat template formats with the spec {spec!r}, whose width comes from the "
                                      "arguments; give the width in the template")
        if any(over(number, MAX_FORMAT_WIDTH) for number in _DIGITS.findall(spec)):
            raise RenderLimitExceeded(f"the chat template formats with the spec {spec!r}: a width or precision over "
                                      f"{MAX_FORMAT_WIDTH:,}")
