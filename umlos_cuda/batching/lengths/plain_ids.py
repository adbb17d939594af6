"""Sample ids kept as one array of bytes, from a length cache's parse to a plan's files.

What goes in: ids that are all *plain*, printable ASCII without ``"`` or
``\\`` (so that ``json.dumps(id)`` is the id between two quotes), as one
NumPy array of fixed-width bytes (dtype ``S<w>``, each id padded with zero
bytes, which no plain id holds, so NumPy's own stripping of trailing zeros
gives every id back exactly). What comes out: the ids as strings when a
caller asks (:meth:`PlainIds.tolist`, made once), and what ``plan build``
needs of them without making 10^6 Python strings: whether they are
distinct (:meth:`PlainIds.distinct`), the bytes of sample_ids.jsonl
(:meth:`PlainIds.lines`) and any selection of them joined by ``", "``
(:meth:`PlainIds.joined`, the ids of microbatches.jsonl).

Why: a string costs about 50 bytes and each pass over 10^6 of them (a set,
a join, in shuffled order) about 0.1 s; a plan build from a cache of 10^6
string ids made them once, put them in a set, joined them into
sample_ids.jsonl and twice into microbatches.jsonl. The bytes are the same
(tests/test_batching_plain_ids.py checks them against the string path).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import pairwise

import numpy as np

#: Multiplier of the 64-bit mix in :meth:`PlainIds.distinct` (2^64 / golden ratio, odd).
_MIX = np.uint64(0x9E3779B97F4A7C15)


def is_plain(text: str) -> bool:
    """Whether ``json.dumps(text)`` is ``text`` between two quotes (printable ASCII, no ``"`` or ``\\``)."""
    return text.isascii() and text.isprintable() and '"' not in text and "\\" not in text


class PlainIds(Sequence[str]):
    """Plain ids in one fixed-width bytes array ``array`` (dtype ``S<w>``, zero-padded); a read-only
    sequence of ``str``. Make one with :meth:`encode` (from strings) or from a parsed array."""

    __slots__ = ("array", "_list", "_table", "_padded")

    def __init__(self, array: np.ndarray) -> None:
        # Internal: every id is plain (the caller checked it), so no id holds a zero byte.
        self.array = array
        self._list: list[str] | None = None
        self._table: tuple[bytes, np.ndarray] | None = None
        self._padded: bool | None = None

    @classmethod
    def encode(cls, ids: Sequence[str]) -> PlainIds | None:
        """The ids as one array; None when one of them is not plain."""
        if not is_plain("".join(ids)):
            return None
        width = max(1, max(map(len, ids), default=0))
        return cls(np.array([i.encode("ascii") for i in ids], dtype=f"S{width}"))

    @classmethod
    def join(cls, parts: Sequence[PlainIds]) -> PlainIds:
        return cls(np.concatenate([p.array for p in parts]))

    @property
    def width(self) -> int:
        return int(self.array.dtype.itemsize)

    def __len__(self) -> int:
        return int(self.array.shape[0])

    def __getitem__(self, index):  # an int gives a str, a slice a list
        if isinstance(index, slice):
            return self.tolist()[index]
        return self.array[index].decode("ascii")

    def __iter__(self) -> Iterator[str]:
        return iter(self.tolist())

    def __repr__(self) -> str:
        return f"PlainIds({len(self)} ids of at most {self.width} bytes)"

    @property
    def padded(self) -> bool:
        """Whether some id is shorter than the width (so that zero bytes follow it)."""
        if self._padded is None:
            self._padded = bool(len(self)) and not self.grid()[:, -1].all()
        return self._padded

    def drop_padding(self, text: bytes) -> bytes:
        """``text``, made of these ids' padded bytes and bytes other than zero, without the padding."""
        return text.translate(None, b"\0") if self.padded else text

    def grid(self) -> np.ndarray:
        """The ids' bytes as a ``(len, width)`` uint8 view, zeros after each id."""
        return self.array.view(np.uint8).reshape(len(self), self.width)

    def tolist(self) -> list[str]:
        """The ids as strings (made on first use, then kept)."""
        if self._list is None:
            self._list = self._text(0, len(self), b"", b"\n").decode("ascii").split("\n")[:-1]
        return self._list

    def lines(self, start: int, stop: int) -> bytes:
        """sample_ids.jsonl of ids ``start .. stop - 1``: ``json.dumps(id)`` and a line end each."""
        return self._text(start, stop, b'"', b'"\n')

    def _text(self, start: int, stop: int, before: bytes, after: bytes) -> bytes:
        """``before + id + after`` for each id of ``start .. stop - 1``, joined: each id's row of
        the grid between the two, then every zero byte (the padding) dropped."""
        return self.drop_padding(self._cells(start, stop, before, after).tobytes())

    def _cells(self, start: int, stop: int, before: bytes, after: bytes) -> np.ndarray:
        """``(stop - start, len(before) + width + len(after))`` uint8: ``before``, the padded id, ``after``."""
        grid = self.grid()[start:stop]
        out = np.empty((grid.shape[0], len(before) + self.width + len(after)), dtype=np.uint8)
        out[:, :len(before)] = np.frombuffer(before, dtype=np.uint8)
        out[:, len(before):len(before) + self.width] = grid
        out[:, len(before) + self.width:] = np.frombuffer(after, dtype=np.uint8)
        return out

    def joined(self, rows: np.ndarray, bounds: Sequence[int], separator: bytes) -> list[bytes]:
        """For each ``a, b`` of consecutive ``bounds``: the ids of ``rows[a:b]`` joined by ``separator``
        (bytes without a zero byte), each id still followed by its padding: the caller drops it from
        what it makes of them, once (:meth:`drop_padding`)."""
        flat = self._gathered(rows, separator)
        step, cut = self.width + len(separator), len(separator)
        return [flat[a * step:max(a * step, b * step - cut)] for a, b in pairwise(bounds)]  # (a = b: empty)

    def joined_text(self, rows: np.ndarray, separator: bytes) -> tuple[str, int, int]:
        """``(text, step, cut)``: the cells of ``rows`` (each id padded, then ``separator``) as one ASCII
        string; the ids of ``rows[a:b]`` joined by ``separator`` are ``text[a * step:b * step - cut]``
        (``b > a``), padding included, as in :meth:`joined`."""
        return self._gathered(rows, separator).decode("ascii"), self.width + len(separator), len(separator)

    def _gathered(self, rows: np.ndarray, separator: bytes) -> bytes:
        """The cells of ``rows``, each id's padded bytes and ``separator``, joined (each id's cell is
        made once for all calls with the same separator)."""
        if self._table is None or self._table[0] != separator:
            self._table = (separator, self._cells(0, len(self), b"", separator))
        return np.take(self._table[1], rows, axis=0).tobytes()

    def distinct(self) -> bool:
        """Whether no two ids are equal. Exact: ids in strictly increasing order are distinct; otherwise
        a 64-bit mix of each id's bytes is sorted, and when no two mixes are equal neither are two ids
        (equal ids mix equally); two equal mixes are settled by comparing the strings themselves."""
        array = self.array
        if len(self) < 2 or bool((array[1:] > array[:-1]).all()):
            return True
        words = -(-self.width // 8)
        padded = np.zeros((len(self), 8 * words), dtype=np.uint8)
        padded[:, :self.width] = self.grid()
        mixed = np.zeros(len(self), dtype=np.uint64)
        for word in padded.view("<u8").T:
            mixed ^= word
            mixed *= _MIX
            mixed ^= mixed >> np.uint64(29)
        mixed.sort()
        if bool((mixed[1:] != mixed[:-1]).all()):
            return True
        return len(set(self.tolist())) == len(self)
