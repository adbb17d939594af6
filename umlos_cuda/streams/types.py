"""What a stream yields: :class:`StreamSample`, and what it counts: :class:`StreamMetrics`.

A :class:`StreamSample` is a training :class:`~umlos_cuda.batching.Sample`
(token ids, loss mask, ``SampleMeta``) with its text and its provenance:
which source produced it, in which episode, at which arrival number, with
what reward, at which difficulty, in which game, and whether that episode was
solved. It is frozen and carries :attr:`StreamSample.digest`, SHA-256 of its
canonical JSON (:meth:`to_dict`), which buffer snapshots and window logs
bind, so a recorded sample that changes by one token is caught.

Difficulty names follow the puzzle server's (``very_easy`` ... ``very_hard``);
``SampleMeta.difficulty`` holds the name's rank in :data:`DIFFICULTY_ORDER`
(a number, as the batching schema wants), or None for other names.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

from .. import checks, errors
from ..batching.samples import Sample, SampleMeta
from .failures import failure

#: The puzzle server's difficulties, easiest first.
DIFFICULTY_ORDER = ("very_easy", "easy", "pretty_easy", "medium", "hard", "pretty_hard", "very_hard")
#: The fields of :meth:`StreamSample.to_dict`.
SAMPLE_FIELDS = ("input_ids", "loss_mask", "meta", "prompt", "response", "source", "episode_id", "seq", "reward",
                 "difficulty", "game", "solved", "priority")


def difficulty_rank(name: str | None) -> float | None:
    """``name``'s rank in :data:`DIFFICULTY_ORDER` (as a float), None when it has none."""
    return float(DIFFICULTY_ORDER.index(name)) if name in DIFFICULTY_ORDER else None


@dataclass(frozen=True, slots=True)
class StreamSample:
    """One sample of a stream, with where it came from.

    Args:
        sample: the training sample (its ``meta.sample_id`` is the sample's id).
        prompt, response: the text it was tokenized from ("" when it came as tokens).
        source: what produced it (``gym``, ``offline:PATH``, ``mock``).
        episode_id: the episode it belongs to, or None.
        seq: its arrival number in its stream (0, 1, 2, ...).
        reward: the episode's reward, or None.
        difficulty, game: names, or None.
        solved: whether the episode was solved, or None when that means nothing.
        priority: the replay priority it enters a buffer with (positive, finite).
    """

    sample: Sample
    prompt: str
    response: str
    source: str
    episode_id: str | None
    seq: int
    reward: float | None = None
    difficulty: str | None = None
    game: str | None = None
    solved: bool | None = None
    priority: float = 1.0
    digest: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        checked = checks.record({name: getattr(self, name) for name in _CHECKS}, _CHECKS, fail=_invalid)
        for name in ("seq", "reward", "priority"):  # as int and float (NumPy scalars would not encode)
            object.__setattr__(self, name, checked[name])
        try:
            encoded = canonical_json(self.to_dict())
        except UnicodeEncodeError:  # a lone surrogate (JSON's "\\ud800"): text no log line or digest can hold
            raise _invalid("a stream sample's text fields must be UTF-8 text, without lone surrogates") from None
        object.__setattr__(self, "digest", hashlib.sha256(encoded).hexdigest())

    @property
    def sample_id(self) -> str:
        return self.sample.meta.sample_id

    @property
    def length(self) -> int:
        return self.sample.length

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (what window logs store)."""
        return {
            "input_ids": list(self.sample.input_ids),
            "loss_mask": list(self.sample.loss_mask),
            "meta": self.sample.meta.to_dict(),
            "prompt": self.prompt,
            "response": self.response,
            "source": self.source,
            "episode_id": self.episode_id,
            "seq": self.seq,
            "reward": self.reward,
            "difficulty": self.difficulty,
            "game": self.game,
            "solved": self.solved,
            "priority": self.priority,
        }

    @classmethod
    def from_dict(cls, data: Any) -> StreamSample:
        data = checks.record(data, _STORED, fail=_invalid, not_a_map="a stream sample has exactly the fields {fields}; "
                             "got {type}", unknown=_STORED_KEYS, missing=_STORED_KEYS)
        try:
            sample = Sample(data["input_ids"], data["loss_mask"], None, SampleMeta.from_dict(data["meta"]))
        except errors.UmlosError as exc:
            raise _invalid(f"its training sample is invalid: {exc.message}") from None
        rest = {name: data[name] for name in SAMPLE_FIELDS[3:]}
        return cls(sample, **rest)

    def with_seq(self, seq: int) -> StreamSample:
        """The same sample at another arrival number."""
        values = {name: getattr(self, name) for name in ("sample", "prompt", "response", "source", "episode_id",
                                                         "reward", "difficulty", "game", "solved", "priority")}
        return StreamSample(seq=seq, **values)


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no spaces, UTF-8: the bytes digests are taken of."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


@dataclass
class StreamMetrics:
    """Counters of a stream, updated as it runs."""

    episodes: int = 0
    samples: int = 0
    solved: int = 0
    game_over: int = 0
    gave_up: int = 0
    steps: int = 0
    reconnects: int = 0
    started: float = field(default_factory=time.monotonic, repr=False)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    @property
    def episodes_per_s(self) -> float:
        elapsed = self.elapsed_s
        return self.episodes / elapsed if elapsed > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"episodes": self.episodes, "samples": self.samples, "solved": self.solved,
                "game_over": self.game_over, "gave_up": self.gave_up, "steps": self.steps,
                "reconnects": self.reconnects, "elapsed_s": round(self.elapsed_s, 3),
                "episodes_per_s": round(self.episodes_per_s, 3)}


def _invalid(message: str):
    return failure(errors.STREAM_INVALID, message)


#: The fields of :meth:`StreamSample.to_dict`; ``from_dict`` checks the keys, the constructors the values.
_STORED = dict.fromkeys(SAMPLE_FIELDS, checks.field(checks.anything))
_STORED_KEYS = "a stream sample has exactly the fields {fields}; got {keys}"
_NAME = checks.nullable(checks.field(checks.text, message="{name} must be a string or None, got {value!r}"))
#: Each field of a :class:`StreamSample` and its check, in the order failures are reported.
_CHECKS = {
    "sample": checks.field(checks.instance, Sample, message="{name} must be a batching Sample, got {type}"),
    "prompt": checks.field(checks.text),
    "response": checks.field(checks.text),
    "source": checks.field(checks.text, empty=False, message="{name} must be a non-empty string, got {value!r}"),
    "episode_id": _NAME,
    "difficulty": _NAME,
    "game": _NAME,
    "seq": checks.field(checks.integer, 0, None, message=checks.NON_NEGATIVE),
    "reward": checks.nullable(checks.field(checks.number,
                                           message="{name} must be a finite number or None, got {value!r}")),
    "solved": checks.nullable(checks.field(checks.instance, bool,
                                           message="{name} must be a bool or None, got {value!r}")),
    "priority": checks.field(checks.number, above=0, message="{name} must be a positive finite number, got {value!r}"),
}
