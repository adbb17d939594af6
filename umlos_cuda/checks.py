"""Checks of values that come from callers, files and servers: integers (and
integers written as text), ranges, finite numbers, text, names from a fixed
set, typed (and sized) values, and records of named fields.

Why one module: these rules are easy to get subtly wrong when each reader
and constructor writes them by hand. ``True`` is an ``int`` in Python
(``drop_last: true`` written where a size belongs is a mistake, not the
number 1); NumPy integers are not ``int`` although users pass them naturally;
``math.isfinite(10**400)`` raises OverflowError and ``str()`` of a 5000-digit
integer raises ValueError, so a message that echoes the value can itself
crash; a record read from a file must name its unknown and missing keys; and
text is not an integer because ``int()`` takes it: ``int()`` reads ``'٣'``
(an Arabic-Indic three), ``'1_000'`` and ``' 7 '``, ``str.isdigit()`` accepts
``'²'``, which ``int()`` refuses, and ``int()`` of 5000 digits raises
ValueError. Every integer read from text (a flag, an environment variable, a
field of a line, a file name, a server's line) goes through
:func:`integer_text`. Here each rule is written once.

Each caller keeps its own failure and its own words. ``fail`` is a function
from a message to the :class:`~umlos_cuda.errors.UmlosError` the caller
raises (its code, its operator, any prefix such as a file and line;
:func:`raising` makes one from a code and an operator), and ``message`` is
the caller's wording as a template with the fields ``{name}``, ``{value}``
(the value given, or for an integer out of range the integer itself; shown
bounded: "an integer of N bits" past 128 bits, other values cut at 200
characters), ``{type}`` (the value's type name)
and the bounds (``{low}``, ``{high}``, ``{at_least}``, ``{above}``). An
integer wording is one template, or a pair: (not an integer, out of range);
so is the wording of :func:`instance` (not of the type, the wrong size).
Every check returns the value as the type it promises (a plain ``int``, a
``float``): store what it returns.

Example::

    from umlos_cuda import checks, errors

    fail = checks.raising(errors.PLAN_FORMAT_INVALID, operator=errors.BATCH_PLAN_OPERATOR)
    epochs = checks.integer(data["num_epochs"], "num_epochs", 1, None, fail=fail, message=checks.AT_LEAST)

    LINE = {"index": checks.field(checks.integer),
            "max_len": checks.field(checks.integer, 1, message=checks.AT_LEAST),
            "note": checks.nullable(checks.field(checks.text))}
    line = checks.record(json.loads(text), LINE, fail=fail)   # {"index": 3, "max_len": 512, "note": None}

A record's fields are :func:`field` checks (which return the typed value and
word their own failures) or plain predicates (a function of the value that
returns a bool, as the trace tape's record schemas are; a failure says
``invalid``).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass, field as dataclass_field, replace
from typing import Any

import numpy as np

from .errors import UINT64_MAX, UmlosError

#: A value shown in a message is cut to this many characters.
SHOWN_CHARS = 200
#: What a caller passes as ``fail``: its message -> its error (an UmlosError; a checkpoint
#: kind's decode refuses with ValueError, which the container words with its own code).
Fail = Callable[[str], Exception]
#: An integer wording: one template for both failures, or (not an integer, out of range).
Wording = str | tuple[str, str]

#: The wording of an integer in a closed interval (the default).
IN_RANGE = ("{name} must be an integer in [{low}, {high}], got {type} {value!r}",
            "{name} must be in [{low}, {high}], got {value}")
#: The same, where an out-of-range integer reads "NAME VALUE is outside [LOW, HIGH]".
OUTSIDE = (IN_RANGE[0], "{name} {value} is outside [{low}, {high}]")
#: The wording of :func:`uint64`.
UINT64 = ("{name} must be an integer in [0, 2^64 - 1], got {type} {value!r}",
          "{name} must be in [0, 2^64 - 1], got {value}")
#: Wordings of an integer with a lower bound only.
AT_LEAST = "{name} must be an integer >= {low}, got {value!r}"
NON_NEGATIVE = "{name} must be a non-negative integer, got {value!r}"
POSITIVE = "{name} must be a positive integer, got {value!r}"


def literal(text: str) -> str:
    """``text`` as a template that formats to itself (its braces doubled): for a message
    that holds a pattern, a path or other text of the caller's own."""
    return text.replace("{", "{{").replace("}", "}}")


def raising(code: str, *, operator: str, **record: Any) -> Fail:
    """The ``fail`` of a code and an operator: ``raising(code, operator=op)(message)``
    is ``UmlosError(code, message, operator=op)`` (``record``: more fields of the failure record)."""
    def fail(message: str) -> UmlosError:
        return UmlosError(code, message, operator=operator, **record)
    return fail


def is_integer(value: Any, *, strict: bool = False) -> bool:
    """An integer (``int`` or, unless ``strict``, a NumPy integer), never a bool."""
    return isinstance(value, int if strict else numbers.Integral) and not isinstance(value, bool)


def is_uint64(value: Any) -> bool:
    """An ``int`` in ``[0, 2^64 - 1]``, never a bool: a uint64 as CBOR and JSON decode it
    (a NumPy integer fails: an encoder would refuse it)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= UINT64_MAX


def is_number(value: Any) -> bool:
    """A real number (``int``, ``float``, a NumPy scalar, ...), never a bool; it may be infinite or NaN."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def integer(value: Any, name: str, low: int | None = 0, high: int | None = UINT64_MAX, *, fail: Fail,
            message: Wording = IN_RANGE, strict: bool = False) -> int:
    """``value`` as an ``int`` in ``[low, high]`` (None: no bound on that side), else ``fail``.

    bool is refused; NumPy integers are accepted and returned as ``int``,
    unless ``strict``: then only an ``int`` passes, for a value that is
    written out as it was given (CBOR and JSON encoders refuse NumPy scalars).
    """
    if not is_integer(value, strict=strict):
        raise fail(_words(message, 0).format(name=name, value=_Shown(value), type=type(value).__name__, low=low,
                                             high=high))
    number = int(value)
    if (low is not None and number < low) or (high is not None and number > high):
        raise fail(_words(message, 1).format(name=name, value=_Shown(number), type=type(value).__name__,
                                             low=low, high=high))
    return number


#: The longest text :func:`integer_text` reads: a sign and 39 digits, every integer of up to 128 bits. A longer
#: text is refused before ``int()`` sees it (``int()`` is quadratic in the digits and raises past 4300 of them).
MAX_INTEGER_CHARS = 40
#: What an integer written as text is: an optional sign and ASCII digits, nothing around them.
_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")


def integer_text(text: Any, name: str, low: int | None = 0, high: int | None = UINT64_MAX, *, fail: Fail,
                 message: Wording = IN_RANGE) -> int:
    """The integer written in ``text``, in ``[low, high]`` (None: no bound on that side), else ``fail``.

    The one parser of integers written as text (module docstring): ``text`` must be a ``str`` of an
    optional sign and ASCII digits, at most :data:`MAX_INTEGER_CHARS` characters (checked before
    ``int()`` is called), else ``fail`` with the first wording (``{value}``: the text, bounded); then
    the range, as :func:`integer` checks it, with the second. Leading zeros are read (``"007"`` is 7):
    a caller whose text must be the one spelling of its number compares ``str(value)`` with it.
    """
    if not isinstance(text, str) or len(text) > MAX_INTEGER_CHARS or not _INTEGER_TEXT.fullmatch(text):
        raise fail(_words(message, 0).format(name=name, value=_Shown(text), type=type(text).__name__, low=low,
                                             high=high))
    return integer(int(text), name, low, high, fail=fail, message=message)


def integer_or_none(text: Any, low: int | None = 0, high: int | None = UINT64_MAX) -> int | None:
    """The integer :func:`integer_text` reads in ``text`` when it is one in ``[low, high]``, else None: for text
    that may well be no number (a file name, a sample id that may be a row number), where "not a number" is an
    answer rather than a failure."""
    try:
        return integer_text(text, "", low, high, fail=ValueError)
    except ValueError:
        return None


def integer_parser(name: str, low: int | None = 0, high: int | None = UINT64_MAX, *, fail: Fail,
                   message: Wording = IN_RANGE) -> Callable[[str], int]:
    """:func:`integer_text` with these arguments, as a function of the text alone: an argparse ``type``
    (``fail=argparse.ArgumentTypeError``: a usage error that says what was wrong), a field's reader."""
    def parse(text: str) -> int:
        return integer_text(text, name, low, high, fail=fail, message=message)

    parse.__name__ = name  # argparse names the type in some messages
    return parse


def uint64(value: Any, name: str, *, fail: Fail) -> int:
    """``value`` as an ``int`` in ``[0, 2^64 - 1]``, else ``fail`` with the :data:`UINT64` wording."""
    return integer(value, name, 0, UINT64_MAX, fail=fail, message=UINT64)


def number(value: Any, name: str, *, at_least: float | None = None, above: float | None = None,
           below: float | None = None, finite: bool = True, nan: bool = False, fail: Fail,
           message: Wording = "{name} must be a finite number, got {value!r}") -> float:
    """``value`` (an int or a float, never a bool) as a ``float`` that is finite
    (unless ``finite=False``), ``>= at_least``, ``> above`` and ``< below`` where given, else ``fail``
    (the wording: one template, or a pair: (not a number, not finite or out of bounds)).

    NaN fails unless ``nan`` (with ``finite=False``: any real number passes, for a
    statistic that may be undefined); an int too large for a float fails instead of
    raising OverflowError (and reads as NaN where ``nan`` lets it pass).
    """
    words = {"name": name, "value": _Shown(value), "type": type(value).__name__, "at_least": at_least, "above": above,
             "below": below}
    if not is_number(value):
        raise fail(_words(message, 0).format(**words))
    try:
        result = float(value)
    except OverflowError:
        result = math.nan
    if (math.isnan(result) and not nan) or (finite and math.isinf(result)) \
            or (at_least is not None and result < at_least) or (above is not None and result <= above) \
            or (below is not None and not result < below):
        raise fail(_words(message, 1).format(**words))
    return result


def utf8_length(value: str) -> int | None:
    """The UTF-8 length of ``value``, or None if it has none: a lone surrogate such as ``"\\ud800"`` (half of
    a character cut in two, which JSON's escapes and Python strings can hold and UTF-8, CBOR and every
    tokenizer cannot)."""
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def text(value: Any, name: str, *, fail: Fail, empty: bool = True, pattern: re.Pattern[str] | None = None,
         message: str = "{name} must be a string, got {value!r}") -> str:
    """``value`` if it is a ``str`` (a non-empty one unless ``empty``, the whole of it
    matching ``pattern`` where given), else ``fail``."""
    if not isinstance(value, str) or (not empty and not value) \
            or (pattern is not None and not pattern.fullmatch(value)):
        raise fail(message.format(name=name, value=_Shown(value), type=type(value).__name__))
    return value


#: What :func:`sequence` refuses although it is iterable: its items would be characters, byte values or keys.
NOT_SEQUENCES = (str, bytes, bytearray, memoryview, Mapping)


def sequence(value: Any, name: str, *, fail: Fail, empty: bool = True, iterable: bool = False,
             message: str = "{name} must be a sequence, got {type}") -> Any:
    """``value`` if it is a sequence of items (a list, a tuple, a range, a 1-D or wider NumPy
    array; with ``iterable``, anything iterable, such as a set or a generator), never
    text, bytes or a mapping (:data:`NOT_SEQUENCES`); a non-empty one unless ``empty``."""
    kinds = Iterable if iterable else (Sequence, np.ndarray)
    if not isinstance(value, kinds) or isinstance(value, NOT_SEQUENCES) \
            or (isinstance(value, np.ndarray) and value.ndim == 0) \
            or (not empty and isinstance(value, Sized) and len(value) == 0):
        raise fail(message.format(name=name, value=_Shown(value), type=type(value).__name__))
    return value


def choice(value: Any, name: str, choices: Collection[str], *, fail: Fail,
           message: str = "{name} must be one of {choices}, got {value!r}") -> str:
    """``value`` if it is text and one of ``choices``, else ``fail``; ``{choices}`` reads
    them joined by ", " ("(none)" when there are none)."""
    if not isinstance(value, str) or value not in choices:
        raise fail(message.format(name=name, value=_Shown(value), type=type(value).__name__,
                                  choices=", ".join(choices) or "(none)"))
    return value


def equal(value: Any, name: str, expected: Any, *, fail: Fail,
          message: str = "{name} {value!r} is not {expected!r}") -> Any:
    """``value`` if it is ``expected`` (of its very type: ``True`` is not ``1``), else ``fail``:
    a record's ``format`` or ``kind``."""
    if type(value) is not type(expected) or value != expected:
        raise fail(message.format(name=name, value=_Shown(value), type=type(value).__name__, expected=expected))
    return value


def instance(value: Any, name: str, kind: type | tuple[type, ...], *, fail: Fail, empty: bool = True,
             length: int | None = None, max_length: int | None = None,
             message: Wording = "{name} must be a {kind}, got {type}") -> Any:
    """``value`` if it is an instance of ``kind`` (a non-empty one unless ``empty``,
    of ``length`` items or bytes, of at most ``max_length``, where given), else ``fail``.

    A bool passes only where ``kind`` names ``bool`` (it is an ``int`` too).
    The wording is one template, or a pair: (not a ``kind``, the wrong size);
    besides the common fields it may use ``{kind}`` (the type names, joined by
    " or "), ``{length}``, ``{max_length}`` and ``{size}`` (the value's length).
    """
    kinds = kind if isinstance(kind, tuple) else (kind,)
    wrong = not isinstance(value, kind) or (isinstance(value, bool) and bool not in kinds)
    if wrong or (not empty and not value) or (length is not None and len(value) != length) \
            or (max_length is not None and len(value) > max_length):
        raise fail(_words(message, 0 if wrong else 1).format(
            name=name, value=_Shown(value), type=type(value).__name__, kind=" or ".join(k.__name__ for k in kinds),
            length=length, max_length=max_length, size=None if wrong else len(value)))
    return value


def anything(value: Any, name: str, *, fail: Fail) -> Any:
    """Any value: a field whose value the caller checks itself (it must still be present)."""
    return value


# -- records ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """A field of a record: ``check(value, name, *args, fail=fail, **kwargs)``,
    or None when the field is :func:`nullable`. Make one with :func:`field`."""

    check: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = dataclass_field(default_factory=dict)
    allows_none: bool = False

    def read(self, value: Any, name: str, fail: Fail) -> Any:
        """The field's typed value, else ``fail``."""
        if value is None and self.allows_none:
            return None
        return self.check(value, name, *self.args, fail=fail, **self.kwargs)


def field(check: Callable[..., Any], *args: Any, **kwargs: Any) -> Field:
    """A record field checked by ``check`` (:func:`integer`, :func:`number`, :func:`text`, ...,
    or any function ``(value, name, *args, fail, **kwargs)``) with these arguments:
    ``field(integer, 1, message=AT_LEAST)``."""
    return Field(check, args, dict(kwargs))


def nullable(checked: Field) -> Field:
    """``checked``, or None."""
    return replace(checked, allows_none=True)


#: A wording of a record's keys: a template, or a function of the template's fields that returns the message.
KeyWording = str | Callable[[dict[str, Any]], str]
#: How a record's keys are refused; the fields: ``{what}``, ``{value}`` (the data, bounded), ``{type}`` (its
#: type name), ``{fields}`` (the required names), ``{unknown}`` and ``{missing}`` (names joined by ", "),
#: ``{unknown_list}``, ``{missing_list}`` (lists) and ``{keys}`` (the data's keys, a sorted list, bounded).
NOT_A_MAP = "{what} must be a mapping, got {type}"
UNKNOWN = "{what} has unknown field(s) {unknown}; its fields: {fields}"
MISSING = "{what} lacks the field(s) {missing}"


def record(data: Any, fields: Mapping[str, Field | Callable[[Any], bool]], *, fail: Fail,
           optional: Mapping[str, Field | Callable[[Any], bool]] | None = None, what: str = "the record",
           not_a_map: str = NOT_A_MAP, unknown: KeyWording = UNKNOWN, missing: KeyWording = MISSING,
           invalid: str = "invalid {name}") -> dict[str, Any]:
    """The fields of the mapping ``data``, each checked, in the order of ``fields``
    (then the ``optional`` fields it holds); else ``fail``.

    ``data`` must hold every key of ``fields``, may hold those of ``optional``
    and nothing else: unknown keys are reported first (``unknown``), then missing
    ones (``missing``); give both the same template to report them together.
    Either may instead be a function of the template's fields (a dict) that
    returns the message, for words a template cannot compute (the manifest's
    "did you mean" suggestion).
    Then each field is checked in order, so the first bad field is the one
    reported. A :class:`Field` words its own failure; a predicate that returns
    false (or raises TypeError, ValueError, KeyError, IndexError or
    AttributeError on a value it did not expect) fails with ``invalid``.
    """
    if not isinstance(data, dict) and not isinstance(data, Mapping):  # dict first: the ABC check is slower
        raise fail(not_a_map.format(what=what, value=_Shown(data), type=type(data).__name__,
                                    fields=", ".join(fields)))
    present = {name: check for name, check in optional.items() if name in data} if optional else {}
    if len(data) != len(fields) + len(present) or any(name not in data for name in fields):
        raise fail(_keys_refused(data, fields, present, what, unknown, missing))
    checked = {}
    for table in (fields, present):
        for name, check in table.items():
            value = data[name]
            if isinstance(check, Field):
                checked[name] = check.read(value, name, fail)
                continue
            try:  # a predicate that raises on a value it did not expect says "invalid", never a traceback
                passed = check(value)
            except (TypeError, ValueError, KeyError, IndexError, AttributeError):
                passed = False
            if not passed:
                raise fail(invalid.format(what=what, name=name))
            checked[name] = value
    return checked


def _keys_refused(data: Mapping[Any, Any], fields: Mapping[str, Any], present: Mapping[str, Any], what: str,
                  unknown: KeyWording, missing: KeyWording) -> str:
    """The message of :func:`record` for keys that are not exactly the fields."""
    extra = sorted((key for key in data if key not in fields and key not in present), key=str)
    absent = sorted((name for name in fields if name not in data), key=str)
    words = {"what": what, "value": _Shown(data), "type": type(data).__name__, "fields": ", ".join(fields),
             "unknown": ", ".join(map(str, extra)), "missing": ", ".join(absent),
             "unknown_list": extra, "missing_list": absent, "keys": _Shown(sorted(data, key=str))}
    wording = unknown if extra else missing
    return wording.format(**words) if isinstance(wording, str) else wording(words)


def _words(message: Wording, which: int) -> str:
    return message if isinstance(message, str) else message[which]


class _Shown:
    """A value in a message, bounded: an integer past 128 bits reads "an integer
    of N bits" (``str()`` stops at 4300 digits and would raise instead), and any
    other text is cut at :data:`SHOWN_CHARS` characters (a megabyte of JSON
    where a number belongs does not become a megabyte of message)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def _text(self, show: Callable[[Any], str]) -> str:
        if isinstance(self.value, int) and self.value.bit_length() > 128:
            return f"an integer of {self.value.bit_length()} bits"
        text = show(self.value)
        return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."

    def __repr__(self) -> str:
        return self._text(repr)

    def __str__(self) -> str:
        return self._text(str)

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)
