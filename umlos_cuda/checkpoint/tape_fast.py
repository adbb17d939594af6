"""The tape reader's fast path: whole blocks of ``iter`` and ``checkpoint``
records proven valid by byte patterns, without decoding them in Python.

Why: the strict reader (:mod:`cbor_safe` plus ``tape.check_record``) spends
about 40 microseconds per record in Python, so a full 500,000-event segment
took tens of seconds to verify. Almost every record of a tape is an ``iter``
record whose canonical encoding is a fixed sequence of key bytes with
values of known shapes, so a compiled regular expression (C code) can check
one record in about a microsecond.

Strictness: :meth:`BlockMatcher.match_block` accepts a block only if its
bytes are exactly a canonical ``{records, block_index}`` map whose every
record matches a pattern built from the record schema
(``tape.SCHEMAS``), and whose ``seq``/``prev`` continue the chain. Every
pattern admits only canonical encodings of values the schema accepts:

- ``uint``: major type 0 in its shortest head (e.g. ``18`` only before
  ``18..ff``, ``19`` only before a non-zero high byte);
- hashes: ``58 20`` and 32 bytes; booleans: ``f4``/``f5``;
- cursors: ``{epoch, global_index}`` with two such integers;
- text and float fields: only the literal encodings of values that the strict
  reader already accepted for that field in this tape (``learn``). Texts
  need UTF-8 and floats the shortest finite form, which a pattern cannot
  check; tapes repeat a few values (dataset key, stage, modes,
  ``effective_q``), so the first block teaches them all.

Anything else (``run_header``, ``failure``, ``restore``, ``run_end``
records, a new text value, a block past ``run_end`` or at ``seq = 0``, any
malformation) makes ``match_block`` return ``None`` and the caller reads the
block with the strict reader, which raises the precise error. So a tape
is accepted, and every failure reports the same code and message, exactly as
with the strict reader alone: the fast path only ever says "valid" for
blocks the strict reader accepts, and then yields the same hashes.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from typing import Any

from ..hashing import cbor_canonical

#: The kinds of records the patterns cover (the others go to the strict reader).
FAST_KINDS = ("iter", "checkpoint")
#: Distinct values remembered per text or float field; past this, blocks with
#: new values are read by the strict reader.
MAX_LEARNED = 64
#: Nesting of a block of these records: block map, records array, record map,
#: cursor map. The strict reader needs ``max_depth > DEPTH`` to accept it.
DEPTH = 3

_UINT = (
    rb"(?:[\x00-\x17]|\x18[\x18-\xff]|\x19[\x01-\xff].|\x1a(?:[\x01-\xff].{3}|\x00[\x01-\xff].{2})"
    rb"|\x1b(?:[\x01-\xff].{7}|\x00[\x01-\xff].{6}|\x00\x00[\x01-\xff].{5}|\x00\x00\x00[\x01-\xff].{4}))"
)
_HASH = rb"\x58\x20.{32}"
_BOOL = rb"[\xf4\xf5]"
_CURSOR = b"\xa2" + re.escape(cbor_canonical("epoch")) + _UINT + re.escape(cbor_canonical("global_index")) + _UINT
_BLOCK_PREFIX = b"\xa2" + cbor_canonical("records")
_BLOCK_INDEX_KEY = cbor_canonical("block_index")


def uint_head_value(data: bytes, pos: int, major: int) -> tuple[int, int] | None:
    """``(value, end)`` of a shortest-form head of ``major`` at ``pos``; None otherwise."""
    if pos >= len(data) or data[pos] >> 5 != major:
        return None
    info = data[pos] & 0x1F
    if info < 24:
        return info, pos + 1
    if info > 27:
        return None
    length = 1 << (info - 24)
    end = pos + 1 + length
    if end > len(data):
        return None
    value = int.from_bytes(data[pos + 1:end], "big")
    if value < (24 if length == 1 else 1 << (4 * length)):
        return None
    return value, end


class BlockMatcher:
    """Verifies tape blocks by pattern (module docstring); one per tape read.

    ``checks`` maps a check function of the record schema to its kind of
    pattern; the tape module passes its own so the patterns follow the schema.
    """

    def __init__(self, schemas: Mapping[str, Mapping[str, Callable[[Any], bool]]],
                 checks: Mapping[Callable[[Any], bool], str]) -> None:
        self._fields: dict[str, list[tuple[str, str]]] = {}
        #: CBOR values per record (the strict reader's ``max_items`` counts keys and values).
        self._items = 0
        self._learned: dict[tuple[str, str], set[bytes]] = {}
        for kind in FAST_KINDS:
            names = sorted(schemas[kind], key=cbor_canonical)
            shapes = []
            for name in names:
                shape = "type" if name == "type" else checks.get(schemas[kind][name])
                if shape is None:
                    raise ValueError(f"no pattern for field {kind}.{name}")
                shapes.append((name, shape))
                if shape in ("text", "float"):
                    self._learned[(kind, name)] = set()
            self._fields[kind] = shapes
            self._items = max(self._items, 1 + 2 * len(shapes) + 4 * sum(shape == "cursor" for _, shape in shapes))
        self._patterns: list[Callable] | None = None
        self.fast_blocks = 0
        self.strict_blocks = 0

    # -- the patterns ------------------------------------------------------------------
    def learn(self, record: Mapping[str, Any]) -> None:
        """Remember the text and float values of a record the strict reader accepted."""
        kind = record["type"]
        if kind not in self._fields:
            return
        for name, shape in self._fields[kind]:
            if shape in ("text", "float"):
                known = self._learned[(kind, name)]
                if len(known) < MAX_LEARNED:
                    encoded = cbor_canonical(record[name])
                    if encoded not in known:
                        known.add(encoded)
                        self._patterns = None

    def _pattern(self, kind: str) -> bytes:
        fields = self._fields[kind]
        parts = [re.escape(bytes([0xA0 + len(fields)]))]
        for name, shape in fields:
            parts.append(re.escape(cbor_canonical(name)))
            if name == "seq":
                parts.append(b"(" + _UINT + b")")
            elif name == "prev":
                parts.append(rb"\x58\x20(.{32})")
            elif shape == "type":
                parts.append(re.escape(cbor_canonical(kind)))
            elif shape in ("text", "float"):
                known = sorted(self._learned[(kind, name)])
                parts.append(b"(?:" + b"|".join(re.escape(v) for v in known) + b")" if known else b"(?!)")
            else:
                parts.append({"uint": _UINT, "hash": _HASH, "bool": _BOOL, "cursor": _CURSOR}[shape])
        return b"".join(parts)

    def patterns(self) -> list[Callable]:
        """The compiled ``match`` functions, one per kind (``iter`` first: the common one)."""
        if self._patterns is None:
            self._patterns = [re.compile(self._pattern(kind), re.DOTALL).match for kind in FAST_KINDS]
        return self._patterns

    # -- a block -----------------------------------------------------------------------
    def match_block(self, payload: bytes, *, block_index: int, block_size: int, seq: int, tail: bytes,
                    room: int, max_depth: int, max_items: int) -> list[bytes] | None:
        """The record hashes of block ``block_index`` if the whole block is
        valid and continues the chain at ``seq`` after ``tail`` with at most
        ``room`` records, within the strict reader's bounds ``max_depth`` and
        ``max_items``; None if the strict reader must decide."""
        if seq == 0 or max_depth <= DEPTH or not payload.startswith(_BLOCK_PREFIX):
            return None
        head = uint_head_value(payload, len(_BLOCK_PREFIX), 4)
        if head is None:
            return None
        count, pos = head
        if not 1 <= count <= min(block_size, room) or 5 + count * self._items > max_items:
            return None
        match_iter, match_checkpoint = self.patterns()
        sha256 = hashlib.sha256
        view = memoryview(payload)
        hashes: list[bytes] = []
        append = hashes.append
        for expected in range(seq, seq + count):
            found = match_iter(payload, pos) or match_checkpoint(payload, pos)
            if found is None:
                return None
            seq_bytes, prev = found.group(1, 2)
            value = seq_bytes[0] if len(seq_bytes) == 1 else int.from_bytes(seq_bytes[1:], "big")
            if value != expected or prev != tail:
                return None
            end = found.end()
            tail = sha256(view[pos:end]).digest()
            append(tail)
            pos = end
        if payload[pos:] != _BLOCK_INDEX_KEY + cbor_canonical(block_index):
            return None
        self.fast_blocks += 1
        return hashes


def block_records(payload: bytes) -> list[dict]:
    """The records of a block ``match_block`` accepted, as dicts.

    cbor2's C decoder is safe here: the bytes were proven to be canonical
    plain data (maps with text keys, integers, byte and text strings, floats,
    booleans), for which it builds the same values as the strict reader.
    """
    import cbor2

    return cbor2.loads(payload)["records"]
