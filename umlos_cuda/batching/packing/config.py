"""What a packing is decided by: row length, mode, separator, oversize policy.

Packing puts several sequences into one row of at most ``max_length``
tokens (docs/batching.md, "Packing"). The three modes have exact
definitions (``pack_lengths``), so that every implementation can be
checked against them:

* ``first_fit``: each sequence, in input order, goes into the
  lowest-numbered open row that has room, else into a new row;
* ``best_fit``: into the open row with the least remaining room that still
  fits, ties to the lowest-numbered, else a new row;
* ``greedy``: a stable sort by length, longest first, then first-fit.

Rows are numbered in the order they are opened. A separator of
``separator_len`` tokens goes between consecutive sequences of a row (none
after the last), so a row of ``k`` sequences uses their lengths plus
``(k - 1) x separator_len`` tokens.

A sequence longer than ``max_length`` fits no row. It is never dropped
silently: :class:`OversizePolicy` says whether it is refused (an error
naming it), skipped (left out, counted and listed by id), truncated to its
first ``max_length`` tokens, or split into pieces of ``max_length`` tokens
(each piece its own segment); the metrics count each case.

One :class:`PackingConfig` serves both places that pack: ``pack_sequences``
packs token sequences, and a packed batch plan (``BatchingConfig.pack``)
decides its rows from lengths alone. A plan records only the separator's
length (meta.json ``pack_config`` is ``{mode, max_length, separator_len}``);
its separator ids are given when its rows are collated.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Self

from ... import checks, errors
from ...errors import UmlosError

#: Longest row: positions and ``cu_seqlens`` are int32.
MAX_PACK_LENGTH = (1 << 31) - 1
#: Largest token id a packed row holds (int32 arrays).
MAX_TOKEN_ID = (1 << 31) - 1


def packing_error(code: str, message: str) -> UmlosError:
    return UmlosError(code, message, operator=errors.PACKING_OPERATOR)


def config_error(message: str) -> UmlosError:
    return packing_error(errors.PACKING_CONFIG_INVALID, message)


#: The keys of a stored config (:meth:`PackingConfig.to_dict`); the constructor checks the values.
_STORED = dict.fromkeys(("mode", "max_length", "separator_len"), checks.field(checks.anything))
_STORED_OPTIONAL = dict.fromkeys(("separator_ids", "oversize"), checks.field(checks.anything))
_NOT_STORED = "a packing config is {{{fields}}} and optionally separator_ids and oversize, got {value!r}"


class _Choice(str, enum.Enum):
    @classmethod
    def parse(cls, value: Any) -> Self:
        if isinstance(value, cls):
            return value
        for choice in cls:
            if value == choice.value or (isinstance(value, str) and value.lower() == choice.value):
                return choice
        what = (cls.__doc__ or cls.__name__).split(":")[0]
        raise config_error(f"{what} must be one of {', '.join(c.value for c in cls)}, got {value!r}")


class PackingMode(_Choice):
    """pack mode: which open row a sequence goes into."""

    FIRST_FIT = "first_fit"
    BEST_FIT = "best_fit"
    GREEDY = "greedy"


class OversizePolicy(_Choice):
    """oversize policy: what happens to a sequence longer than max_length."""

    REFUSE = "refuse"  # PACKING_SEQUENCE_TOO_LONG naming it; nothing is packed
    SKIP = "skip"  # left out of every row, counted and listed in the metrics
    TRUNCATE = "truncate"  # its first max_length tokens are packed
    SPLIT = "split"  # pieces of max_length tokens (the last shorter), each a segment


@dataclass(frozen=True, slots=True)
class PackingConfig:
    """A packing (checked on construction).

    Args:
        max_length: tokens a row may hold, in [1, 2^31 - 1].
        mode: :class:`PackingMode` or its value.
        separator_ids: token ids placed between consecutive sequences of a
            row (e.g. ``(eos_id,)``). They belong to the segment before them
            and are never trained on (loss mask 0).
        oversize: :class:`OversizePolicy` or its value (default ``refuse``).
        separator_len: tokens between consecutive sequences of a row. With
            ``separator_ids`` it is their count (0, the default, or that
            count); without them it stands alone, as in a batch plan, which
            packs lengths and is given its separator ids when collated.
    """

    max_length: int = 2048
    mode: PackingMode = PackingMode.FIRST_FIT
    separator_ids: tuple[int, ...] = ()
    oversize: OversizePolicy = OversizePolicy.REFUSE
    separator_len: int = 0

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "max_length", checks.integer(self.max_length, "max_length", 1, MAX_PACK_LENGTH, fail=config_error))
        set_(self, "mode", PackingMode.parse(self.mode))
        set_(self, "oversize", OversizePolicy.parse(self.oversize))
        checks.sequence(self.separator_ids, "separator_ids", iterable=True, fail=config_error,
                        message="{name} must be a sequence of token ids, got {value!r}")
        ids = tuple(checks.integer(t, "a separator id", 0, MAX_TOKEN_ID, fail=config_error) for t in self.separator_ids)
        set_(self, "separator_ids", ids)
        length = checks.integer(self.separator_len, "separator_len", 0, MAX_PACK_LENGTH, fail=config_error)
        if ids and length not in (0, len(ids)):
            raise config_error(f"separator_len {length} does not match the {len(ids)} separator_ids {list(ids)}")
        length = len(ids) or length
        if length >= self.max_length:
            raise config_error(f"{length} separator tokens leave no room in rows of max_length {self.max_length}")
        set_(self, "separator_len", length)

    def layout_separator(self) -> tuple[int, ...]:
        """The separator ids that rows of tokens are laid out with. A config
        with a separator length but no ids (a plan's) cannot lay out tokens."""
        if self.separator_len != len(self.separator_ids):
            raise config_error(f"this config gives separator_len {self.separator_len} but no separator_ids; "
                               "token rows need the ids (a plan's are given when it is collated)")
        return self.separator_ids

    def to_dict(self) -> dict:
        """Plain data, as a packed plan's meta.json ``pack_config`` and a window
        log's ``pack`` store it: ``{mode, max_length, separator_len}``, then
        ``separator_ids`` and ``oversize`` only when they are not the defaults
        (a plan's never are), so every plan keeps its bytes and fingerprint."""
        data: dict = {"mode": self.mode.value, "max_length": self.max_length, "separator_len": self.separator_len}
        if self.separator_ids:
            data["separator_ids"] = list(self.separator_ids)
        if self.oversize is not OversizePolicy.REFUSE:
            data["oversize"] = self.oversize.value
        return data

    @classmethod
    def from_dict(cls, data) -> PackingConfig:
        """The config :meth:`to_dict` gave."""
        data = checks.record(data, _STORED, optional=_STORED_OPTIONAL, fail=config_error, not_a_map=_NOT_STORED,
                             unknown=_NOT_STORED, missing=_NOT_STORED)
        return cls(data["max_length"], data["mode"], data.get("separator_ids", ()),
                   data.get("oversize", OversizePolicy.REFUSE), data["separator_len"])
