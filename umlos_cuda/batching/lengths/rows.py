"""Read what a length cache's JSONL says without parsing JSON, row by row: the check behind
its sidecar (:func:`scan_rows`) and the fast path of its parser (:func:`parse_block`).

What goes in: the JSONL of a length cache, what its ``.u32`` sidecar claims
(the lengths, the tokenizer hash, whether the ids are the line numbers).
What comes out: the JSONL's size and SHA-256, and the first row where the
JSONL says otherwise (None when every row agrees).

Why: the sidecar's header binds the JSONL's size and SHA-256 and its own
length bytes' SHA-256, but anyone who rewrites the sidecar can recompute
all three, so a forged sidecar with the honest JSONL's hash would be
believed over the JSONL, the source of truth. Comparing the sidecar with
the rows closes that gap at little cost: the JSONL is read once anyway
for its SHA-256, and the rows the writer (``LengthCacheWriter``) produces
have one fixed shape::

    {"sample_id": <id as JSON>, "tokenizer_hash": "<hash>", "length": <digits>}\\n

so each block's rows are found and their trailing ``length`` digits and
``tokenizer_hash`` read with whole-array NumPy operations (a few passes over
the block's bytes and one gather of the fixed tail per row). Ids the
sidecar calls line numbers are read the same way. A row of any other shape
cannot have been written beside this sidecar, so it counts as a
disagreement; the caller then falls back to parsing the JSONL.

:func:`parse_block` reads the ids and lengths of a block of such rows the
same way (no ``json.loads`` per row), when every row of the block has this
shape, one tokenizer hash and a *plain* id (printable ASCII without ``"``
or ``\\``, so that its JSON text is the id between two quotes). Any other block is
left to the row-by-row parser (cache.py), which accepts or refuses it as it
always did; both give the same ids and lengths for a block this function
reads (tests/test_batching_lengths_fast.py).
"""

from __future__ import annotations

import hashlib
from json.encoder import encode_basestring_ascii
from collections.abc import Callable

import numpy as np

from ...errors import UINT32_MAX, UmlosError
from ...files import reader
from .plain_ids import PlainIds

_BLOCK = 1 << 20
#: Blocks of JSONL read between two releases of the sidecar's mapped pages (64 MiB of JSONL).
_RELEASE_BLOCKS = 64
_PREFIX = b'{"sample_id": '
#: What a plain id may hold: every printable ASCII byte but the quote and the backslash.
_PLAIN = bytes(b for b in range(0x20, 0x7F) if b not in b'"\\')
_QUOTED_PREFIX = _PREFIX + b'"'
_PLAIN_BYTE = np.zeros(256, dtype=bool)
_PLAIN_BYTE[np.frombuffer(_PLAIN, dtype=np.uint8)] = True
#: Decimal digits of the longest length (2^32 - 1) and of the longest line-number id read here (10^19 - 1 rows).
_LENGTH_DIGITS = 10
_ID_DIGITS = 19


def scan_rows(path: str, lengths: np.ndarray, tokenizer_hash: str, line_numbers: bool,
              error: Callable[[str], UmlosError], *,
              release: Callable[[], None] | None = None) -> tuple[int, str, int | None]:
    """``(size, sha256 hex, first disagreeing row or None)`` of the JSONL at ``path``
    against the sidecar's ``lengths``, ``tokenizer_hash`` and id kind.
    A read that fails raises ``error(message)``. ``release``, when given, is called every
    :data:`_RELEASE_BLOCKS` blocks: ``lengths`` may be a memory map whose pages read so far it drops,
    so the scan's memory stays a few blocks whatever the cache's size."""
    tail = np.frombuffer((", \"tokenizer_hash\": " + encode_basestring_ascii(tokenizer_hash)
                          + ", \"length\": ").encode("ascii"), dtype=np.uint8)
    digest = hashlib.sha256()
    size, row, carry, bad = 0, 0, b"", None
    try:
        with reader.open_regular(path, error) as handle:
            while block := handle.read(_BLOCK):
                digest.update(block)
                size += len(block)
                data = carry + block
                cut = data.rfind(b"\n") + 1
                carry = data[cut:]
                if len(carry) > reader.MAX_LINE_BYTES:  # one line may not grow without bound (files/reader.py)
                    raise error(f"{path} line {row + 1} is longer than {reader.MAX_LINE_BYTES:,} bytes, the "
                                "longest line read")
                if bad is None and cut:
                    rows = _block_rows(data[:cut], tail, line_numbers, row)
                    count = rows.shape[0]
                    if row + count > lengths.shape[0]:
                        bad = lengths.shape[0]
                    else:
                        differ = np.flatnonzero(rows != lengths[row:row + count])
                        bad = row + int(differ[0]) if differ.size else None
                    row += count
                if release is not None and size % (_RELEASE_BLOCKS * _BLOCK) < len(block):
                    release()
    except FileNotFoundError:
        raise error(f"cannot read {path}: it does not exist") from None
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror or exc}") from exc
    if bad is None and (carry or row != lengths.shape[0]):
        bad = row  # a last line without its newline, or fewer rows than the sidecar holds
    return size, digest.hexdigest(), bad


def _block_rows(data: bytes, tail: np.ndarray, line_numbers: bool, first_row: int) -> np.ndarray:
    """The length of each row of ``data`` (whole lines), int64; -1 where a row is not of the writer's shape."""
    a = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(a == 10)
    starts = np.concatenate(([0], ends[:-1] + 1)).astype(np.int64)
    value, digits = _digits_before(a, ends - 1, starts, _LENGTH_DIGITS)
    ok = (a[np.maximum(ends - 1, 0)] == ord("}")) & (digits >= 1) & (digits <= _LENGTH_DIGITS)
    ok &= value <= UINT32_MAX  # (an eleventh digit would leave value the last ten)
    ok &= (digits == 1) | (a[np.maximum(ends - 1 - digits, 0)] != ord("0"))  # JSON has no leading zeros
    tail_start = ends - 1 - digits - tail.shape[0]
    ok &= tail_start >= starts + len(_PREFIX) + 2  # room for the prefix and at least an empty id ""
    words = _words(data)
    ok &= _equal_at(words, np.where(ok, tail_start, 0), tail.tobytes())
    ok &= _equal_at(words, np.where(ok, starts, 0), _PREFIX)
    if line_numbers:
        ok &= _ids_are_rows(a, starts + len(_PREFIX), np.where(ok, tail_start, 0), ok, first_row)
    return np.where(ok, value, -1)


def _words(data: bytes) -> np.ndarray:
    """Every 8-byte little-endian word of ``data``, one starting at each byte (a view: no copy).

    Comparing a fixed string at many positions word by word gathers an
    eighth of the elements a byte-by-byte comparison gathers."""
    padded = data + b"\0" * 8
    return np.ndarray((len(data),), dtype="<u8", buffer=padded, strides=(1,))


def _equal_at(words: np.ndarray, positions: np.ndarray, text: bytes) -> np.ndarray:
    """Whether ``text`` (at least 8 bytes) starts at each of ``positions``."""
    last = len(text) - 8
    equal = np.ones(positions.shape[0], dtype=bool)
    for offset in list(range(0, last, 8)) + [last]:
        word = int.from_bytes(text[offset:offset + 8], "little")
        equal &= words[np.minimum(positions + offset, words.shape[0] - 1)] == np.uint64(word)
    return equal


def _digits_before(a: np.ndarray, stop: np.ndarray, floor: np.ndarray, most: int) -> tuple[np.ndarray, np.ndarray]:
    """The decimal number whose digits end just before ``stop`` (at most ``most`` of them, none below
    ``floor``), and how many digits it has; one more digit than ``most`` makes the count ``most + 1``."""
    value = np.zeros(stop.shape[0], dtype=np.uint64)
    digits = np.zeros(stop.shape[0], dtype=np.int64)
    running = np.ones(stop.shape[0], dtype=bool)
    for k in range(most + 1):
        position = stop - 1 - k
        inside = running & (position >= floor)
        byte = a[np.maximum(position, 0)]
        running = inside & (byte >= ord("0")) & (byte <= ord("9"))
        if k < most:
            value += np.where(running, (byte.astype(np.uint64) - ord("0")) * np.uint64(10 ** k), np.uint64(0))
        digits += running
        if not running.any():  # no number goes on: the later steps would add nothing
            break
    return (value.astype(np.int64) if most < 19 else value), digits


def _ids_are_rows(a: np.ndarray, id_start: np.ndarray, tail_start: np.ndarray, ok: np.ndarray,
                  first_row: int) -> np.ndarray:
    """Each id is ``"<its row number>"``: quotes around the decimal digits, no leading zero."""
    quote = ord('"')
    close = tail_start - 1
    value, digits = _digits_before(a, close, id_start + 1, _ID_DIGITS)
    rows = np.arange(first_row, first_row + id_start.shape[0], dtype=np.uint64)
    good = ok & (a[np.where(ok, id_start, 0)] == quote) & (a[np.where(ok, close, 0)] == quote)
    good &= (digits >= 1) & (close - digits - 1 == id_start) & (value == rows)
    return good & ((digits == 1) | (a[np.where(ok, id_start + 1, 0)] != ord("0")))


def row_tail(tokenizer_hash: str) -> bytes:
    """What follows a row's id in the writer's shape, up to its length's digits."""
    return (", \"tokenizer_hash\": " + encode_basestring_ascii(tokenizer_hash) + ", \"length\": ").encode("ascii")


def parse_block(data: bytes, tail: bytes) -> tuple[PlainIds, np.ndarray] | None:
    """The ids and the lengths (uint32) of ``data``, whole lines each ending in a line end, when every
    line is ``{"sample_id": "<plain id>"`` + ``tail`` + ``<digits>}``; None otherwise.

    Why it is exact: a line is read from both ends, as :func:`scan_rows` reads it. It must end in
    ``}`` and a line end after 1 to 10 digits without a leading zero (at most 2^32 - 1), ``"`` +
    ``tail`` must end where the digits start, the prefix ``{"sample_id": "`` start the line, and
    every byte between the prefix and the tail (the id) be plain. Such a line is the JSON object of
    that id (a plain id is its own JSON text between quotes), ``tail``'s hash and that integer, and
    nothing else is. (Counting the tail's occurrences instead of comparing it at each place would
    not do: an id ``, `` followed by the tail without its first two bytes holds it once too.) Ids
    are gathered into one fixed-width byte array, each followed by a line end and padded with zero
    bytes (no plain id holds either), so a block whose longest id would make that array larger than
    the block itself is left to the row parser.
    """
    a = np.frombuffer(data, dtype=np.uint8)
    if not data.endswith(b"\n"):
        return None
    ends = np.flatnonzero(a == 10)
    rows = ends.shape[0]
    starts = np.concatenate(([0], ends[:-1] + 1)).astype(np.int64)
    value, digits = _digits_before(a, ends - 1, starts, _LENGTH_DIGITS)
    ok = (a[np.maximum(ends - 1, 0)] == ord("}")) & (digits >= 1) & (digits <= _LENGTH_DIGITS)
    ok &= (value <= UINT32_MAX) & ((digits == 1) | (a[np.maximum(ends - 1 - digits, 0)] != ord("0")))
    id_start = starts + len(_QUOTED_PREFIX)
    sizes = ends - 1 - digits - (len(tail) + 1) - id_start
    ok &= sizes >= 0
    if not ok.all():
        return None
    # Every word compared lies inside its line now (its prefix, id, tail and digits fit in it), so the
    # words need no padding past the block's end (and the block is not copied to add it).
    words = np.ndarray((len(data) - 7,), dtype="<u8", buffer=data, strides=(1,))
    if not (_equal_at(words, id_start + sizes, b'"' + tail).all() and _equal_at(words, starts, _QUOTED_PREFIX).all()):
        return None
    width = max(int(sizes.max()), 1)
    if rows * width > len(data):
        return None
    column = np.arange(width)
    grid = a[np.minimum(id_start[:, None] + column, a.shape[0] - 1)]
    inside = column < sizes[:, None]
    if not (_PLAIN_BYTE[grid] | ~inside).all():
        return None
    grid[~inside] = 0
    return PlainIds(grid.view(f"S{width}").reshape(rows)), value.astype(np.uint32)
