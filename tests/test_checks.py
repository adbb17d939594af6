"""umlos_cuda.checks: the one place that decides what an integer, a finite
number, text and a record of fields are, failing with the caller's code,
operator and words."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from umlos_cuda import checks, errors
from umlos_cuda.errors import UINT64_MAX, UmlosError

FAIL = checks.raising(errors.INVALID_ARGUMENT, operator="test.Operator")


def refusal(call, *args, **kwargs) -> UmlosError:
    with pytest.raises(UmlosError) as info:
        call(*args, fail=FAIL, **kwargs)
    assert info.value.code == errors.INVALID_ARGUMENT
    assert info.value.record["failure_operator"] == "test.Operator"
    return info.value


def test_literal_text_formats_to_itself():
    pattern = "[a-z]{1,63}"
    assert (checks.literal(pattern) + " {name}").format(name="n") == "[a-z]{1,63} n"


def test_raising_builds_the_callers_error():
    error = checks.raising(errors.PLAN_FORMAT_INVALID, operator="op", dataset_key="train")("bad")
    assert (error.code, error.message, error.record["failure_operator"], error.record["dataset_key"]) == \
        (errors.PLAN_FORMAT_INVALID, "bad", "op", "train")


@pytest.mark.parametrize("value", [0, 1, UINT64_MAX, np.uint64(UINT64_MAX), np.int8(3)])
def test_uint64_accepts_integers_and_returns_plain_ints(value):
    result = checks.uint64(value, "n", fail=FAIL)
    assert type(result) is int and result == int(value)


@pytest.mark.parametrize("value,message", [
    (True, "n must be an integer in [0, 2^64 - 1], got bool True"),
    (1.0, "n must be an integer in [0, 2^64 - 1], got float 1.0"),
    ("3", "n must be an integer in [0, 2^64 - 1], got str '3'"),
    (-1, "n must be in [0, 2^64 - 1], got -1"),
    (UINT64_MAX + 1, "n must be in [0, 2^64 - 1], got 18446744073709551616"),
    (10**5000, "n must be in [0, 2^64 - 1], got an integer of 16610 bits"),  # str() would raise
], ids=["bool", "float", "text", "negative", "2^64", "5000 digits"])
def test_uint64_refusals(value, message):
    assert refusal(checks.uint64, value, "n").message == message


@pytest.mark.parametrize("text,expected", [
    ("0", 0), ("7", 7), ("007", 7), ("-3", -3), ("+5", 5), (str(UINT64_MAX), UINT64_MAX),
    ("9" * checks.MAX_INTEGER_CHARS, 10**checks.MAX_INTEGER_CHARS - 1),
], ids=["0", "7", "leading zeros", "negative", "plus", "2^64-1", "40 digits"])
def test_integer_text_reads_ascii_digits(text, expected):
    assert checks.integer_text(text, "n", None, None, fail=FAIL) == expected


@pytest.mark.parametrize("text", [
    "\u00b2",  # superscript two: str.isdigit() says yes, int() raises
    "\u0663",  # Arabic-Indic three: int() reads 3
    "\uff17",  # fullwidth seven: int() reads 7
    "1_000", " 7", "7 ", "7\n", "", "-", "+", "0x10", "1e3", "1.0", "nan", "inf", "\x00", "7\x00",
    "\ud800",  # a lone surrogate
    "9" * (checks.MAX_INTEGER_CHARS + 1), "9" * 5000,  # int() of 5000 digits raises ValueError
    None, 7, 7.0, b"7", ["7"],
], ids=lambda text: ascii(text)[:24])
def test_integer_text_refuses_anything_but_a_sign_and_ascii_digits(text):
    error = refusal(checks.integer_text, text, "n", None, None, message="{name} is no integer: {value!r}")
    assert error.message.startswith("n is no integer: ") and len(error.message) < 300


def test_integer_or_none_is_none_for_what_integer_text_refuses():
    assert checks.integer_or_none("42") == 42 and checks.integer_or_none("007", 0, 10) == 7
    assert [checks.integer_or_none(text) for text in ("\u00b2", "\u0663", "-1", "9" * 5000, None)] == [None] * 5
    assert checks.integer_or_none("11", 0, 10) is None and checks.integer_or_none("-1", None, None) == -1


def test_integer_text_checks_the_range_with_the_second_wording():
    assert refusal(checks.integer_text, "9", "rank", 0, 7).message == "rank must be in [0, 7], got 9"
    assert refusal(checks.integer_text, "x", "rank", 0, 7).message == "rank must be an integer in [0, 7], got str 'x'"
    assert refusal(checks.integer_text, "-1", "n").message == "n must be in [0, 18446744073709551615], got -1"
    parse = checks.integer_parser("port", 0, 65535, fail=FAIL)
    assert parse("80") == 80 and parse.__name__ == "port"
    assert refusal(lambda fail: parse("65536")).message == "port must be in [0, 65535], got 65536"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60) | st.from_regex(r"[+-]?[0-9]{1,45}", fullmatch=True))
def test_integer_text_is_int_of_ascii_text_and_refuses_the_rest(text):
    """Whatever the text: the integer ``int()`` reads when it is a sign and at most 40 ASCII characters of
    digits, else the caller's refusal; never another exception."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    ascii_integer = len(text) <= checks.MAX_INTEGER_CHARS and digits.isascii() and digits.isdigit()
    try:
        value = checks.integer_text(text, "n", None, None, fail=FAIL)
    except UmlosError as error:
        assert not ascii_integer and error.code == errors.INVALID_ARGUMENT
    else:
        assert ascii_integer and value == int(text)


@pytest.mark.parametrize("wording,value,message", [
    (checks.IN_RANGE, 9, "rank must be in [0, 7], got 9"),
    (checks.IN_RANGE, np.int64(9), "rank must be in [0, 7], got 9"),
    (checks.IN_RANGE, None, "rank must be an integer in [0, 7], got NoneType None"),
    (checks.OUTSIDE, 9, "rank 9 is outside [0, 7]"),
    (checks.AT_LEAST, -1, "rank must be an integer >= 0, got -1"),
    (checks.AT_LEAST, False, "rank must be an integer >= 0, got False"),
    (checks.NON_NEGATIVE, 2.5, "rank must be a non-negative integer, got 2.5"),
    ("{name}: [{low}, {high}] wanted, {value!r} ({type}) given", 8, "rank: [0, 7] wanted, 8 (int) given"),
])
def test_integer_wordings(wording, value, message):
    assert refusal(checks.integer, value, "rank", 0, 7, message=wording).message == message


def test_integer_bounds_may_be_open():
    assert checks.integer(-(10**30), "seed", None, None, fail=FAIL) == -(10**30)
    assert checks.integer(10**30, "n", 1, None, fail=FAIL) == 10**30
    refusal(checks.integer, 0, "n", 1, None)


def test_strict_integers_are_python_ints_only():
    assert checks.integer(5, "t", fail=FAIL, strict=True) == 5
    assert refusal(checks.integer, np.int64(5), "t", strict=True).message.endswith("got int64 np.int64(5)")
    assert checks.is_integer(np.int64(5)) and not checks.is_integer(np.int64(5), strict=True)
    assert not checks.is_integer(True)


@pytest.mark.parametrize("value", [0, 1, 2.5, Fraction(1, 3), np.float32(0.5)])
def test_number_returns_a_float(value):
    result = checks.number(value, "w", at_least=0, fail=FAIL)
    assert type(result) is float and result == float(value)


@pytest.mark.parametrize("value,kwargs", [
    (True, {}), ("1", {}), (None, {}), (math.nan, {}), (math.inf, {}), (-math.inf, {}),
    (10**400, {}),  # float() overflows: refused, not OverflowError
    (-0.5, {"at_least": 0}), (0, {"above": 0}), (math.nan, {"finite": False}),
], ids=["bool", "text", "None", "nan", "inf", "-inf", "10^400", "below", "not above", "nan not finite"])
def test_number_refusals(value, kwargs):
    error = refusal(checks.number, value, "w", message="{name} must be a number, got {value!r}", **kwargs)
    assert error.message.startswith("w must be a number, got ")


def test_number_may_be_nan_when_asked():
    """A statistic that is undefined (a plan's padding waste of zero tokens) is NaN, not a type error."""
    assert math.isnan(checks.number(math.nan, "padding_waste", finite=False, nan=True, fail=FAIL))
    assert checks.number(-math.inf, "drift", finite=False, nan=True, fail=FAIL) == -math.inf
    assert refusal(checks.number, "0.5", "drift", finite=False, nan=True).message.startswith("drift must be")


def test_number_may_be_infinite_when_asked():
    assert checks.number(math.inf, "timeout", above=0, finite=False, fail=FAIL) == math.inf


def test_text_and_instance():
    assert checks.text("a", "name", fail=FAIL) == "a"
    assert refusal(checks.text, 5, "name").message == "name must be a string, got 5"
    assert refusal(checks.text, "", "name", empty=False).message == "name must be a string, got ''"
    assert checks.instance([1], "ids", list, empty=False, fail=FAIL) == [1]
    assert refusal(checks.instance, [], "ids", list, empty=False).message == "ids must be a list, got list"
    assert refusal(checks.instance, 3, "ids", (list, tuple)).message == "ids must be a list or tuple, got int"


def test_instance_refuses_bools_unless_asked_and_checks_sizes():
    assert checks.instance(5, "id", (str, int), fail=FAIL) == 5
    assert refusal(checks.instance, True, "id", (str, int)).message == "id must be a str or int, got bool"
    assert checks.instance(True, "flag", bool, fail=FAIL) is True
    token = ("{name} must be 32 bytes, got {type}", "{name} must be 32 bytes, got {type} of length {size}")
    assert checks.instance(bytes(32), "token", bytes, length=32, fail=FAIL, message=token) == bytes(32)
    assert refusal(checks.instance, bytes(31), "token", bytes, length=32, message=token).message == \
        "token must be 32 bytes, got bytes of length 31"
    assert refusal(checks.instance, "x" * 32, "token", bytes, length=32, message=token).message == \
        "token must be 32 bytes, got str"
    assert refusal(checks.instance, [1, 2, 3], "ids", list, max_length=2,
                   message="{name} must be a list of at most {max_length}").message == "ids must be a list of at most 2"
    assert checks.instance([1, 2], "ids", list, max_length=2, fail=FAIL) == [1, 2]


def test_equal_is_the_value_of_its_type():
    assert checks.equal("v1", "format", "v1", fail=FAIL) == "v1"
    assert refusal(checks.equal, "v2", "format", "v1").message == "format 'v2' is not 'v1'"
    assert refusal(checks.equal, True, "version", 1).message == "version True is not 1"
    assert refusal(checks.equal, np.array([1, 2]), "version", 1).message.startswith("version array(")


@pytest.mark.parametrize("value", [[1], (1,), range(2), np.arange(3), np.zeros((2, 2))])
def test_sequences(value):
    assert checks.sequence(value, "ids", fail=FAIL) is value


@pytest.mark.parametrize("value", ["ab", b"ab", bytearray(b"a"), memoryview(b"a"), {"a": 1}, 5, np.int64(3),
                                   np.array(3), {1, 2}, iter([1])])
def test_not_sequences(value):
    assert refusal(checks.sequence, value, "ids").message == f"ids must be a sequence, got {type(value).__name__}"


def test_iterables_and_empty_sequences():
    assert checks.sequence({1, 2}, "edges", iterable=True, fail=FAIL) == {1, 2}
    refusal(checks.sequence, "12", "edges", iterable=True)
    refusal(checks.sequence, {"a": 1}, "edges", iterable=True)
    refusal(checks.sequence, [], "rows", empty=False)
    refusal(checks.sequence, np.zeros(0), "rows", empty=False)


def test_text_patterns_match_the_whole_text():
    import re

    hex64 = re.compile("[0-9a-f]{64}")
    assert checks.text("a" * 64, "fp", pattern=hex64, fail=FAIL) == "a" * 64
    assert refusal(checks.text, "a" * 64 + "\n", "fp", pattern=hex64).message.startswith("fp must be a string, got")
    refusal(checks.text, "A" * 64, "fp", pattern=hex64)


def test_choice_names_the_choices():
    assert checks.choice("val", "split", ("train", "val"), fail=FAIL) == "val"
    assert refusal(checks.choice, "test", "split", ("train", "val")).message == \
        "split must be one of train, val, got 'test'"
    assert refusal(checks.choice, ["train"], "split", {"train": 0}).message == \
        "split must be one of train, got ['train']"  # an unhashable value is refused, not a TypeError
    assert refusal(checks.choice, "x", "key", (), message="{name} {value!r}; known: {choices}").message == \
        "key 'x'; known: (none)"


LINE = {
    "index": checks.field(checks.integer),
    "max_len": checks.field(checks.integer, 1, message=checks.AT_LEAST),
    "note": checks.nullable(checks.field(checks.text)),
}


def test_record_returns_the_typed_fields_in_order():
    data = {"note": None, "max_len": np.int32(512), "index": 3}
    line = checks.record(data, LINE, fail=FAIL)
    assert line == {"index": 3, "max_len": 512, "note": None} and list(line) == ["index", "max_len", "note"]
    assert type(line["max_len"]) is int


@pytest.mark.parametrize("data,message", [
    ([1], "the record must be a mapping, got list"),
    ({"index": 1, "max_len": 2, "note": None, "colour": 1, 7: 0}, "the record has unknown field(s) 7, colour; "
                                                                   "its fields: index, max_len, note"),
    ({"index": 1, "colour": 1}, "the record has unknown field(s) colour; its fields: index, max_len, note"),
    ({"index": 1}, "the record lacks the field(s) max_len, note"),
    ({"index": 1, "max_len": 0, "note": 5}, "max_len must be an integer >= 1, got 0"),  # the first bad field
    ({"index": 1, "max_len": 1, "note": 5}, "note must be a string, got 5"),
])
def test_record_refusals(data, message):
    assert refusal(checks.record, data, LINE).message == message


def test_record_key_wordings_and_optional_fields():
    both = "missing {missing_list}, unknown {unknown_list}"
    fields = {"t": checks.is_integer}
    error = refusal(checks.record, {"u": 1}, fields, unknown=both, missing=both, what="a record")
    assert error.message == "missing ['t'], unknown ['u']"
    optional = {"note": checks.field(checks.text)}
    assert checks.record({"t": 1}, fields, optional=optional, fail=FAIL) == {"t": 1}
    assert checks.record({"t": 1, "note": "x"}, fields, optional=optional, fail=FAIL) == {"t": 1, "note": "x"}


def test_record_key_wordings_may_show_the_data_and_its_keys():
    fields = {"epoch": checks.is_integer, "global_index": checks.is_integer}
    both = "a cursor has exactly epoch and global_index, got {value!r} (keys {keys})"
    error = refusal(checks.record, {"epoch": 0, 1: 2}, fields, unknown=both, missing=both)
    assert error.message == "a cursor has exactly epoch and global_index, got {'epoch': 0, 1: 2} (keys [1, 'epoch'])"
    assert refusal(checks.record, [0], fields, not_a_map="got {value!r}, a {type}").message == "got [0], a list"
    assert len(refusal(checks.record, dict.fromkeys(range(10**4)), fields, unknown=both).message) < 500


def test_record_key_wordings_may_be_functions():
    def unknown(words):
        return f"{len(words['unknown_list'])} unknown key(s), the first {words['unknown_list'][0]!r}"

    fields = {"t": checks.is_integer}
    assert refusal(checks.record, {"t": 1, "u": 2, "v": 3}, fields, unknown=unknown).message == \
        "2 unknown key(s), the first 'u'"
    assert refusal(checks.record, {}, fields, unknown=unknown, missing=lambda words: words["missing"]).message == "t"


def test_record_predicates_say_invalid_and_never_raise():
    def positive(value):
        return value > 0  # raises TypeError on text

    fields = {"t": positive}
    assert checks.record({"t": 2}, fields, fail=FAIL) == {"t": 2}
    assert refusal(checks.record, {"t": 0}, fields).message == "invalid t"
    assert refusal(checks.record, {"t": "x"}, fields, invalid="{what}: bad {name}",
                   what="step").message == "step: bad t"


def test_a_field_is_what_its_check_makes_it():
    def even(value, name, *, fail):
        if value % 2:
            raise fail(f"{name} must be even")
        return value // 2

    assert checks.record({"n": 8}, {"n": checks.field(even)}, fail=FAIL) == {"n": 4}
    assert refusal(checks.record, {"n": 3}, {"n": checks.field(even)}).message == "n must be even"


def test_values_in_messages_are_bounded():
    """A megabyte where a number belongs is refused with a short message, never echoed whole."""
    message = refusal(checks.integer, "x" * 10**6, "n").message
    assert len(message) < 300 and message.endswith("...")
    assert len(refusal(checks.number, [0] * 10**5, "w").message) < 300
    assert refusal(checks.integer, -(10**5000), "n", 0, None, message=checks.AT_LEAST).message == \
        "n must be an integer >= 0, got an integer of 16610 bits"


#: What reads an integer out of text (the call's attribute), when int() is called on what it returns.
_TEXT_CALLS = {"group", "groups", "split", "rsplit", "partition", "strip", "lstrip", "rstrip", "decode", "read",
               "readline", "getenv"}


def _reads_text(node) -> bool:
    """Whether ``node`` is text read out of a line, a match, a file or the environment: a call of one of
    :data:`_TEXT_CALLS` or an item of what one returns (``line.split(",")[0]``)."""
    import ast

    if isinstance(node, ast.Subscript):
        node = node.value
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _TEXT_CALLS


def test_no_integer_is_read_from_text_but_by_integer_text():
    """The class is closed by construction: outside checks.py nothing in umlos_cuda/ gives argparse
    ``type=int``, asks ``str.isdigit()``, ``isdecimal()`` or ``isnumeric()`` (which say yes to ``'²'``), calls
    ``int(text, base)`` or calls ``int()`` on a regex group, a split item, a stripped line, a file's text or
    an environment variable: each of those is checks.integer_text."""
    import ast
    from pathlib import Path

    package = Path(checks.__file__).parent
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "checks.py" and path.parent == package:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            where = f"{path.relative_to(package.parent)}:{node.lineno}"
            func = node.func
            if any(k.arg == "type" and isinstance(k.value, ast.Name) and k.value.id == "int" for k in node.keywords):
                found.append(f"{where}: type=int")
            if isinstance(func, ast.Attribute) and func.attr in ("isdigit", "isdecimal", "isnumeric"):
                found.append(f"{where}: str.{func.attr}()")
            if isinstance(func, ast.Name) and func.id == "int" and (len(node.args) > 1 or node.keywords):
                found.append(f"{where}: int(text, base)")
            if isinstance(func, ast.Name) and func.id == "int" and node.args and _reads_text(node.args[0]):
                found.append(f"{where}: int() of text")
    assert found == [], "\n".join(found)
