"""The interfaces a sample source and a player implement.

A :class:`SampleStream` is anything iterable over
:class:`~umlos_cuda.streams.types.StreamSample` (an offline dataset, the
puzzle server, a test double); an :class:`AsyncSampleStream` the same for
``async for``. A :class:`Player` plays a puzzle: given an observation and a
:class:`PlayerContext`, it returns the next command (``"place 1 5 7"``) or
None to give up. An LLM is a player; :mod:`.gym.players` ships ``hint`` and
``random`` for data collection and tests. (The curriculum's sampling
policies, :mod:`.curriculum.policies`, are another thing: they choose
samples, not moves.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from .gym.telnet_client import PuzzleObservation
from .types import StreamSample


@runtime_checkable
class SampleStream(Protocol):
    def __iter__(self) -> Iterator[StreamSample]: ...


@runtime_checkable
class AsyncSampleStream(Protocol):
    def __aiter__(self) -> AsyncIterator[StreamSample]: ...


@dataclass(frozen=True)
class PlayerContext:
    """What a player may use besides the observation.

    ``hint()`` asks the server for its hint (None when it gives none);
    ``draws(k)`` returns the next ``k`` uint32 random draws of this
    episode's Philox stream (deterministic: the same episode draws the same
    numbers); ``step`` counts the moves sent so far; ``rules`` is the game's
    rules text."""

    hint: Callable[[], str | None]
    draws: Callable[[int], np.ndarray]
    step: int
    rules: str
    game: str


@runtime_checkable
class Player(Protocol):
    name: str

    def __call__(self, observation: PuzzleObservation, context: PlayerContext) -> str | None: ...
