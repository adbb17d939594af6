"""The canonical training sample: token ids, a loss mask, optional segments.

What goes in: token ids and masks from a tokenizer (any sequence of
integers, NumPy arrays included) and the sample's metadata. What comes out:
frozen, validated values. Each class checks its fields once, on
construction, and stores them as tuples, so a sample that exists is a valid
one and stays valid (a list could be changed after the check). Invalid input
raises ``UmlosError`` with code ``SAMPLE_INVALID`` and a message naming the
field and what it allows.

These objects are for the edges of the pipeline (files, user callbacks,
collation of one batch); planning works on arrays of lengths, never on one
object per sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import checks, errors
from ..errors import UmlosError

#: Token ids are non-negative and below 2^32 (every vocabulary in use is far smaller).
TOKEN_ID_LIMIT = 1 << 32


@dataclass(frozen=True, slots=True)
class SampleMeta:
    """Where a sample comes from, for tracking and curricula.

    ``sample_id`` and ``dataset_id`` are non-empty strings; ``episode_id`` and
    ``source`` are strings or None; ``reward`` and ``difficulty`` are finite
    numbers (stored as float) or None.
    """

    sample_id: str
    dataset_id: str
    episode_id: str | None = None
    reward: float | None = None
    difficulty: float | None = None
    source: str | None = None

    def __post_init__(self) -> None:
        checked = checks.record({name: getattr(self, name) for name in _META_CHECKS}, _META_CHECKS, fail=_invalid)
        for name in ("reward", "difficulty"):  # as floats (NumPy scalars would not encode)
            object.__setattr__(self, name, checked[name])

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: Any) -> SampleMeta:
        return cls(**_fields_of(cls, data, required=("sample_id", "dataset_id")))


@dataclass(frozen=True, slots=True)
class Sample:
    """One training sequence.

    ``loss_mask[i]`` is 1 where token ``i`` is trained on (the completion in
    SFT) and 0 elsewhere (the prompt); ``segment_ids`` is None for a single
    sequence, and for a packed one numbers its segments ``0, 0, 0, 1, 1, 2,
    ...`` (starting at 0, each step 0 or +1). All three have the same,
    non-zero, length. Each may be given as any flat sequence or 1-D array of
    integers (the annotations say what is accepted); it is kept as a tuple of ints.
    """

    input_ids: Sequence[int] | np.ndarray
    loss_mask: Sequence[int] | np.ndarray
    segment_ids: Sequence[int] | np.ndarray | None
    meta: SampleMeta

    def __post_init__(self) -> None:
        ids = _int_tuple(self.input_ids, "Sample.input_ids")
        if not ids:
            raise _invalid("Sample.input_ids is empty; a sample holds at least one token")
        if min(ids) < 0 or max(ids) >= TOKEN_ID_LIMIT:
            raise _invalid(f"Sample.input_ids must lie in [0, 2^32 - 1], got values in [{min(ids)}, {max(ids)}]")
        mask = _int_tuple(self.loss_mask, "Sample.loss_mask")
        if len(mask) != len(ids):
            raise _invalid(f"Sample.loss_mask has {len(mask)} entries for {len(ids)} tokens; give one per token")
        if not set(mask) <= {0, 1}:
            raise _invalid(f"Sample.loss_mask holds {sorted(set(mask) - {0, 1})[:3]}; its values are 0 and 1")
        segments = None
        if self.segment_ids is not None:
            segments = _int_tuple(self.segment_ids, "Sample.segment_ids")
            if len(segments) != len(ids):
                raise _invalid(f"Sample.segment_ids has {len(segments)} entries for {len(ids)} tokens")
            steps = np.diff(np.asarray(segments, dtype=np.int64), prepend=0)
            if segments[0] != 0 or not np.isin(steps, (0, 1)).all():
                raise _invalid("Sample.segment_ids must start at 0 and step by 0 or 1 (0, 0, 1, 1, 1, 2, ...), "
                               f"got {list(segments[:8])}{'...' if len(segments) > 8 else ''}")
        checks.instance(self.meta, "Sample.meta", SampleMeta, fail=_invalid, message=_A_META)
        object.__setattr__(self, "input_ids", ids)
        object.__setattr__(self, "loss_mask", mask)
        object.__setattr__(self, "segment_ids", segments)

    @property
    def length(self) -> int:
        """The number of tokens, what the length cache records."""
        return len(self.input_ids)

    @property
    def loss_tokens(self) -> int:
        """The number of tokens trained on (``sum(loss_mask)``)."""
        return sum(self.loss_mask)

    def to_dict(self) -> dict[str, Any]:
        return {
            "input_ids": list(self.input_ids),
            "loss_mask": list(self.loss_mask),
            "segment_ids": None if self.segment_ids is None else list(self.segment_ids),
            "meta": self.meta.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Any) -> Sample:
        fields = _fields_of(cls, data, required=("input_ids", "loss_mask", "meta"))
        fields["meta"] = SampleMeta.from_dict(fields["meta"])
        fields.setdefault("segment_ids", None)
        return cls(**fields)


@dataclass(frozen=True, slots=True)
class PreferenceSample:
    """A preference pair for DPO: one prompt, a chosen and a rejected completion.

    ``prompt_ids`` may be empty; ``chosen_ids`` and ``rejected_ids`` may not,
    and must differ (an identical pair carries no preference). :meth:`chosen`
    and :meth:`rejected` give the two training sequences with the SFT loss
    mask: 0 over the prompt, 1 over the completion.
    """

    prompt_ids: tuple[int, ...]
    chosen_ids: tuple[int, ...]
    rejected_ids: tuple[int, ...]
    meta: SampleMeta

    def __post_init__(self) -> None:
        values = {}
        for name in ("prompt_ids", "chosen_ids", "rejected_ids"):
            ids = _int_tuple(getattr(self, name), f"PreferenceSample.{name}")
            if ids and (min(ids) < 0 or max(ids) >= TOKEN_ID_LIMIT):
                raise _invalid(f"PreferenceSample.{name} must lie in [0, 2^32 - 1], "
                               f"got values in [{min(ids)}, {max(ids)}]")
            if not ids and name != "prompt_ids":
                raise _invalid(f"PreferenceSample.{name} is empty; each completion holds at least one token")
            values[name] = ids
        if values["chosen_ids"] == values["rejected_ids"]:
            raise _invalid("PreferenceSample.chosen_ids and rejected_ids are identical; a pair needs two completions")
        checks.instance(self.meta, "PreferenceSample.meta", SampleMeta, fail=_invalid, message=_A_META)
        for name, ids in values.items():
            object.__setattr__(self, name, ids)

    @property
    def length(self) -> int:
        """The longer of the two sequences: what a batch holding the pair pads to."""
        return len(self.prompt_ids) + max(len(self.chosen_ids), len(self.rejected_ids))

    def chosen(self) -> Sample:
        return self._sequence(self.chosen_ids)

    def rejected(self) -> Sample:
        return self._sequence(self.rejected_ids)

    def _sequence(self, completion: tuple[int, ...]) -> Sample:
        return Sample(self.prompt_ids + completion, (0,) * len(self.prompt_ids) + (1,) * len(completion),
                      None, self.meta)

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_ids": list(self.prompt_ids),
            "chosen_ids": list(self.chosen_ids),
            "rejected_ids": list(self.rejected_ids),
            "meta": self.meta.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Any) -> PreferenceSample:
        fields = _fields_of(cls, data, required=tuple(cls.__dataclass_fields__))
        fields["meta"] = SampleMeta.from_dict(fields["meta"])
        return cls(**fields)


def _int_tuple(values: Any, what: str) -> tuple[int, ...]:
    """``values`` as a tuple of Python ints; bools, floats and text are refused."""
    checks.sequence(values, what, fail=_invalid, message="{name} must be a sequence of integers, got {type}")
    try:
        array = np.asarray(values)
    except (ValueError, TypeError):  # ragged nesting ([1, [2, 3]]): NumPy refuses to make an array of it
        array = np.empty((0, 0))
    mixed_bools = not isinstance(values, np.ndarray) and any(type(v) is bool for v in values)  # NumPy casts them
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu") or mixed_bools:
        kinds = sorted({type(v).__name__ for v in (values.tolist() if isinstance(values, np.ndarray) else values)})
        raise _invalid(f"{what} must be a flat sequence of integers, got {'/'.join(kinds) or array.dtype}")
    return tuple(array.tolist())


def _fields_of(cls, data: Any, required: Sequence[str]) -> dict[str, Any]:
    """The fields of ``data`` for ``cls(**fields)``: its ``required`` fields and any other of the
    dataclass's; the constructor checks their values."""
    fields = cls.__dataclass_fields__
    return checks.record(data, dict.fromkeys(required, _ANY),
                         optional={name: _ANY for name in fields if name not in required}, fail=_invalid,
                         what=cls.__name__, not_a_map="{what}.from_dict expects a mapping, got {type}",
                         unknown=f"{{what}} has no field {{unknown}}; its fields are {', '.join(sorted(fields))}",
                         missing="{what} lacks {missing}")


_ANY = checks.field(checks.anything)
_A_META = "{name} must be a SampleMeta, got {type}"
_ID = checks.field(checks.text, empty=False, message="SampleMeta.{name} must be a non-empty string, got {value!r}")
_NAME = checks.nullable(checks.field(checks.text,
                                     message="SampleMeta.{name} must be a string or None, got {type} {value!r}"))
_SCORE = checks.nullable(checks.field(checks.number,
                                      message="SampleMeta.{name} must be a finite number or None, got {value!r}"))
#: Each field of a :class:`SampleMeta` and its check, in the order failures are reported.
_META_CHECKS = {
    "sample_id": _ID,
    "dataset_id": _ID,
    "episode_id": _NAME,
    "source": _NAME,
    "reward": _SCORE,
    "difficulty": _SCORE,
}


def _invalid(message: str) -> UmlosError:
    return UmlosError(errors.SAMPLE_INVALID, message, operator=errors.BATCHING_OPERATOR)
