"""The data cursor: ``{epoch, global_index}`` per dataset (docs/spec/nextbatch-v2.md §4.3, philox-and-hashing.md §5).

NextBatch_v2 is cursor-pure: it takes a cursor and returns the next one; the
caller persists it. The CBOR form is a two-key map so a restored cursor is the
same cursor on any machine, and ``from_cbor`` validates what it reads because
a checkpoint may come from anywhere.

A malformed cursor is ``INVALID_CURSOR`` here; within a NextBatch call the
specification makes it ``INVALID_MANIFEST`` (docs/spec/nextbatch-v2.md §2,
check 9), which ``next_batch`` says itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import cbor2

from . import checks, errors
from .errors import UmlosError
from .hashing import cbor_canonical

OPERATOR = errors.CURSOR_OPERATOR

#: Bound on a cursor's CBOR size; a real one is under 30 bytes.
MAX_CURSOR_CBOR_BYTES = 1024


@dataclass(frozen=True, slots=True)
class Cursor:
    """Position in a dataset's virtual sequence: ``epoch`` and ``global_index`` (uint64)."""

    epoch: int = 0
    global_index: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "epoch", checks.uint64(self.epoch, "cursor.epoch", fail=_invalid))
        object.__setattr__(self, "global_index", checks.uint64(self.global_index, "cursor.global_index", fail=_invalid))

    def to_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "global_index": self.global_index}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> Cursor:
        state = checks.record(state, _KEYS, fail=_invalid, not_a_map=_NOT_A_CURSOR, unknown=_NOT_A_CURSOR,
                              missing=_NOT_A_CURSOR)
        return cls(state["epoch"], state["global_index"])

    def to_cbor(self) -> bytes:
        """Canonical CBOR (sorted keys): the bytes checkpoints store."""
        return cbor_canonical(self.to_dict())

    @classmethod
    def from_cbor(cls, data: bytes) -> Cursor:
        checks.instance(data, "cursor CBOR", (bytes, bytearray), max_length=MAX_CURSOR_CBOR_BYTES, fail=_invalid,
                        message="{name} must be bytes of at most 1 KiB")
        try:
            state = cbor2.loads(bytes(data))
        except Exception as exc:  # cbor2 raises several types on malformed input
            raise _invalid(f"cursor CBOR is malformed: {exc}") from exc
        return cls.from_dict(state)


def as_cursor(value: Any) -> Cursor:
    """Accept a Cursor, a ``{epoch, global_index}`` mapping, or None (the start)."""
    if value is None:
        return Cursor()
    if isinstance(value, Cursor):
        return value
    if isinstance(value, Mapping):
        return Cursor.from_dict(value)
    raise _invalid(f"cursor must be a Cursor or a mapping, got {type(value).__name__}")


#: A cursor's keys; the constructor checks their values (cursor.epoch, cursor.global_index).
_KEYS = dict.fromkeys(("epoch", "global_index"), checks.field(checks.anything))
_NOT_A_CURSOR = "a cursor is a mapping with exactly the keys epoch and global_index, got {value!r}"


def _invalid(message: str) -> UmlosError:
    return UmlosError(errors.INVALID_CURSOR, message, operator=OPERATOR)

