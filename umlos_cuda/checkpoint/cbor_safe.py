"""A strict, bounded reader of canonical CBOR for untrusted files.

Every CBOR file of a checkpoint and every tape frame may come from anywhere, so
the reader accepts exactly the subset that :func:`umlos_cuda.hashing.cbor_canonical`
writes for plain data and nothing else:

- unsigned and negative integers, byte strings, UTF-8 text, arrays, maps with
  text keys, ``false``/``true``/``null`` and finite floats;
- definite lengths only, the shortest head for every integer and length, the
  shortest float that holds the value, map keys in canonical order (shorter
  UTF-8 first, then bytewise) and never repeated;
- no tags (so no dates, bignums, shared references or any other object that a
  general decoder would build), no ``undefined``, no other simple values;
- at most ``max_bytes`` of input, ``max_depth`` levels of nesting and
  ``max_items`` values in total; no trailing bytes.

So a decoded value re-encodes to exactly the input bytes, and two files that
decode to the same value are the same bytes. Any violation raises
``UmlosError(code)`` with the caller's code and the byte offset. Nothing is
executed, imported or unpickled: the reader builds only ``dict``, ``list``,
``str``, ``bytes``, ``int``, ``float``, ``bool`` and ``None``.
"""

from __future__ import annotations

import math
import struct
from typing import Any

from .. import checks, errors
from ..errors import UmlosError

#: Defaults for the bounds; callers pass tighter ones where they know better.
DEFAULT_MAX_BYTES = 16 << 20
DEFAULT_MAX_DEPTH = 16
DEFAULT_MAX_ITEMS = 1 << 20

_UNPACK_F16 = struct.Struct(">e").unpack_from
_UNPACK_F32 = struct.Struct(">f").unpack_from
_UNPACK_F64 = struct.Struct(">d").unpack_from
_PACK_F16 = struct.Struct(">e").pack
_PACK_F32 = struct.Struct(">f").pack
#: The smallest value each head length may carry (shortest-form rule).
_MIN_FOR_LENGTH = {1: 24, 2: 1 << 8, 4: 1 << 16, 8: 1 << 32}


def _decode_value(data: bytes, max_depth: int, max_items: int, fail) -> tuple[Any, int]:
    """Decode the value at offset 0; return it and the offset after it.

    The steps are nested functions sharing local names (``data``, ``size``,
    the item budget), which keeps the per-value cost near a microsecond:
    :func:`head` reads an initial byte and its argument, :func:`value`
    dispatches on the major type and decodes integers and strings itself (the
    bulk of any file), and maps, arrays and simple values/floats have a step
    each. ``fail(reason, offset)`` builds the error to raise.
    """
    size = len(data)
    budget = [max_items]
    from_bytes = int.from_bytes

    def argument(info: int, at: int, pos: int, major: int) -> tuple[int, int]:
        """The argument of a head whose additional info is 24..27 (1, 2, 4 or 8 bytes)."""
        if info > 27:
            # 28-30 are reserved; 31 is an indefinite length or "break".
            raise fail("indefinite lengths and reserved heads are not allowed", at)
        length = 1 << (info - 24)
        end = pos + length
        if end > size:
            raise fail("unexpected end of data", at)
        # One-byte arguments (the common case) are read by indexing, which is
        # faster than slicing and never goes through a shared 1-byte bytes object.
        arg = data[pos] if length == 1 else from_bytes(data[pos:end], "big")
        if major != 7 and arg < _MIN_FOR_LENGTH[length]:
            raise fail("an integer or length is not in its shortest form", at)
        return arg, end

    def value(pos: int, depth: int) -> tuple[Any, int]:
        """One value of any type: count it, read its head, dispatch on the major type."""
        budget[0] -= 1
        if budget[0] < 0:
            raise fail(f"more than {max_items} values", pos)
        if pos >= size:
            raise fail("unexpected end of data", pos)
        at = pos
        initial = data[pos]
        major = initial >> 5
        info = initial & 0x1F
        pos += 1
        if info < 24:
            arg = info
        else:
            arg, pos = argument(info, at, pos, major)
        if major == 0:
            return arg, pos
        if major == 3 or major == 2:
            end = pos + arg
            if end > size:
                raise fail("a string runs past the end of the data", at)
            if major == 2:
                return data[pos:end], end
            try:
                return data[pos:end].decode("utf-8"), end
            except UnicodeDecodeError:
                raise fail("text is not valid UTF-8", at) from None
        if major == 5:
            return map_value(arg, at, pos, depth)
        if major == 4:
            return array_value(arg, at, pos, depth)
        if major == 1:
            return -1 - arg, pos
        if major == 6:
            raise fail("tags are not allowed", at)
        return simple_value(info, at, pos)

    def map_value(count: int, at: int, pos: int, depth: int) -> tuple[dict[str, Any], int]:
        """A map of ``count`` entries: text keys, in canonical order, never repeated."""
        if depth >= max_depth:
            raise fail(f"nested deeper than {max_depth} levels", at)
        # Every entry takes at least two bytes: a count beyond the
        # remaining data is refused before anything is allocated.
        if 2 * count > size - pos:
            raise fail("a map claims more entries than the data holds", at)
        out: dict[str, Any] = {}
        previous = b""
        depth += 1
        for _ in range(count):
            key_at = pos
            if pos >= size:
                raise fail("unexpected end of data", pos)
            if data[pos] >> 5 != 3:
                raise fail("map keys must be text", key_at)
            key, pos = value(pos, depth)
            encoded = data[key_at:pos]
            # Canonical order compares the encoded keys bytewise, which for
            # text is: shorter first, then by UTF-8 bytes (RFC 7049 §3.9 and
            # RFC 8949 §4.2.1 agree on text keys).
            if encoded <= previous:
                if encoded == previous:
                    raise fail(f"duplicate map key {key!r}", key_at)
                raise fail("map keys are not in canonical order", key_at)
            previous = encoded
            out[key], pos = value(pos, depth)
        return out, pos

    def array_value(count: int, at: int, pos: int, depth: int) -> tuple[list[Any], int]:
        """An array of ``count`` items."""
        if depth >= max_depth:
            raise fail(f"nested deeper than {max_depth} levels", at)
        if count > size - pos:
            raise fail("an array claims more items than the data holds", at)
        items: list[Any] = []
        append = items.append
        depth += 1
        for _ in range(count):
            item, pos = value(pos, depth)
            append(item)
        return items, pos

    def simple_value(info: int, at: int, pos: int) -> tuple[Any, int]:
        """Major type 7: false, true, null, or a finite float in its shortest form."""
        if info == 20:
            return False, pos
        if info == 21:
            return True, pos
        if info == 22:
            return None, pos
        if info == 25:
            number = _UNPACK_F16(data, at + 1)[0]
        elif info == 26:
            number = _UNPACK_F32(data, at + 1)[0]
            if _fits_f16(number):
                raise fail("a float is not in its shortest form", at)
        elif info == 27:
            number = _UNPACK_F64(data, at + 1)[0]
            if _fits_f32(number):
                raise fail("a float is not in its shortest form", at)
        else:
            raise fail("only false, true, null and floats are allowed as simple values", at)
        if not math.isfinite(number):
            raise fail("NaN and infinities are not allowed", at)
        return number, pos

    return value(0, 0)


def _fits_f16(value: float) -> bool:
    try:
        return _UNPACK_F16(_PACK_F16(value), 0)[0] == value and math.isfinite(value)
    except (OverflowError, struct.error):
        return False


def _fits_f32(value: float) -> bool:
    try:
        return _UNPACK_F32(_PACK_F32(value), 0)[0] == value and math.isfinite(value)
    except (OverflowError, struct.error):
        return False


def decode(
    data: Any,
    *,
    code: str = errors.CHECKPOINT_CBOR_INVALID,
    what: str = "CBOR",
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_items: int = DEFAULT_MAX_ITEMS,
    operator: str = errors.CHECKPOINT_VALIDATE_OPERATOR,
) -> Any:
    """Decode one canonical CBOR value from ``data`` (see the module docstring).

    ``what`` names the input in messages (a file name); ``code`` is the failure
    code raised for every violation.
    """
    data = bytes(checks.instance(data, what, (bytes, bytearray, memoryview),
                                 fail=checks.raising(code, operator=operator),
                                 message="{name}: expected bytes, got {type}"))
    if len(data) > max_bytes:
        raise UmlosError(code, f"{what}: {len(data)} bytes exceeds the limit of {max_bytes}", operator=operator)
    def fail(reason: str, at: int) -> UmlosError:
        return UmlosError(code, f"{what}: {reason} (byte {at})", operator=operator)

    try:
        value, end = _decode_value(data, max_depth, max_items, fail)
    except RecursionError:  # pragma: no cover - max_depth keeps recursion shallow
        raise fail("nested too deeply", 0) from None
    if end != len(data):
        raise fail(f"{len(data) - end} trailing bytes after the value", end)
    return value
