"""Samples from the puzzle server: :class:`GymEpisodeStream` and its :class:`GymConfig`.

Episode ``e`` of a run plays ``games[e % G]`` at ``difficulties[(e // G) %
D]`` with the puzzle seed :func:`~.episodes.puzzle_seed` ``(seed, e)``: the
same run asks the server for the same puzzles, whatever happens to the
connection. Iterating yields each episode's samples once it has ended,
numbered by arrival (``seq``) across the run.

Reconnects. A connection that closes or stalls (``GYM_CONNECTION_FAILED``,
``GYM_TIMEOUT``) in the middle of an episode loses only that episode's
moves, never a sample: samples leave the stream only for finished episodes.
The stream reconnects after ``backoff_s * 2^(k-1)`` seconds (at most
``backoff_max_s``) and plays the same episode again from its start (same
puzzle, same player draws); after ``max_reconnects`` failures in a row the
last error is raised. A line the protocol does not allow
(``GYM_PROTOCOL_ERROR``) is raised at once: a server that speaks something
else does not heal by reconnecting. Episode numbers and ``seq`` therefore
run without gaps or repeats; :meth:`GymEpisodeStream.state_dict` is the
position to resume from.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ... import checks, errors
from ...batching.lengths.tokenizer import load_tokenizer
from ...errors import UmlosError
from .episodes import OUTPUT_MODES, PuzzleEpisode, episode_samples, play_episode, puzzle_seed
from ..failures import failure
from .players import make_player
from .telnet_client import TelnetClientConfig, TelnetGymClient
from ..types import StreamMetrics, StreamSample

#: The failures a reconnect may cure.
TRANSIENT = (errors.GYM_CONNECTION_FAILED, errors.GYM_TIMEOUT)


@dataclass(frozen=True)
class GymConfig:
    """Which episodes a :class:`GymEpisodeStream` plays, and how it talks.

    Args:
        host, port, timeout: the server and the seconds one command may take.
        games: game names (the server's short names, menu names or numbers).
        difficulties: difficulty names of the server.
        player: ``"hint"``, ``"random"`` or a :class:`~..protocols.Player` (``gym run --policy``).
        episodes: how many episodes (None: without end).
        max_steps: commands per episode before the player gives up.
        seed: the run seed (puzzle seeds and player draws derive from it).
        output: ``"episode"`` (one sample per episode) or ``"steps"``.
        max_reconnects, backoff_s, backoff_max_s: the reconnect budget (see the module).
        name: the samples' ``source`` (default ``gym``); sample ids start with it. The rest of an
            id is what the episode is, ``GAME/DIFFICULTY/seedPUZZLE_SEED/epINDEX``, never where the
            server listens, so two runs of the same configuration give the same samples.
    """

    host: str = "127.0.0.1"
    port: int = 8023
    games: tuple[str, ...] = ("sudoku",)
    difficulties: tuple[str, ...] = ("easy",)
    player: Any = "hint"
    episodes: int | None = None
    max_steps: int = 200
    seed: int = 0
    output: str = "episode"
    timeout: float = 10.0
    max_reconnects: int = 5
    backoff_s: float = 0.05
    backoff_max_s: float = 2.0
    name: str | None = None

    def __post_init__(self) -> None:
        TelnetClientConfig(self.host, self.port, self.timeout)
        for name in ("games", "difficulties"):
            object.__setattr__(self, name, _names(getattr(self, name), name))
        lowest = {"max_steps": 1, "seed": 0, "max_reconnects": 0} | ({} if self.episodes is None else {"episodes": 0})
        for name, low in lowest.items():
            object.__setattr__(self, name, checks.integer(getattr(self, name), name, low, None, fail=_config_invalid,
                                                          message=checks.AT_LEAST))
        checks.choice(self.output, "output", OUTPUT_MODES, fail=_config_invalid)
        for name in ("backoff_s", "backoff_max_s"):
            value = getattr(self, name)
            checks.number(value, name, at_least=0, finite=False, fail=_config_invalid,
                          message="{name} must be a non-negative number, got {value!r}")
        make_player(self.player)
        if self.name is not None:
            checks.text(self.name, "name", empty=False, fail=_config_invalid,
                        message="{name} must be a non-empty string or None, got {value!r}")

    @property
    def source(self) -> str:
        return self.name or "gym"

    def episode_plan(self, index: int) -> tuple[str, str, int]:
        """``(game, difficulty, puzzle seed)`` of episode ``index``."""
        g = len(self.games)
        return (self.games[index % g], self.difficulties[(index // g) % len(self.difficulties)],
                puzzle_seed(self.seed, index))


class GymEpisodeStream:
    """A :class:`~..protocols.SampleStream` of puzzle episodes (see the module docstring).

    Args:
        config: a :class:`GymConfig`.
        tokenizer: a path, ``tokenizers.Tokenizer`` or ``LoadedTokenizer``.
        eos_token: the end-of-sequence token's text (needed for a bare tokenizer.json).
        start_episode, start_seq: where to resume (``state_dict()`` of an earlier stream).
        on_episode: called with each finished :class:`~.episodes.PuzzleEpisode`.
        sleep: how to wait between reconnects (tests pass a recorder).
    """

    def __init__(self, config: GymConfig, tokenizer: Any, *, eos_token: str | None = None, start_episode: int = 0,
                 start_seq: int = 0, on_episode: Callable[[PuzzleEpisode], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.config = config
        self.tokenizer = load_tokenizer(tokenizer)
        self.eos_token = eos_token
        self.tokenizer.eos_token_id(eos_token)  # refuse a tokenizer without one now, not after the first episode
        self.player = make_player(config.player)
        self.next_episode, self.next_seq = (
            checks.integer(value, name, 0, None, fail=_config_invalid, message=checks.AT_LEAST)
            for value, name in ((start_episode, "start_episode"), (start_seq, "start_seq")))
        self.on_episode = on_episode
        self.sleep = sleep
        self.metrics = StreamMetrics()
        self._client: TelnetGymClient | None = None

    def state_dict(self) -> dict[str, int]:
        """``{next_episode, next_seq}``: where a new stream resumes this one."""
        return {"next_episode": self.next_episode, "next_seq": self.next_seq}

    def __iter__(self) -> Iterator[StreamSample]:
        try:
            while self.config.episodes is None or self.next_episode < self.config.episodes:
                episode = self._play(self.next_episode)
                samples = episode_samples(episode, self.tokenizer, source=self.config.source, first_seq=self.next_seq,
                                          output=self.config.output, eos_token=self.eos_token)
                self.next_episode += 1
                self.next_seq += len(samples)
                self._count(episode, len(samples))
                if self.on_episode is not None:
                    self.on_episode(episode)
                yield from samples
        finally:
            self.close()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _play(self, index: int) -> PuzzleEpisode:
        game, difficulty, seed = self.config.episode_plan(index)
        failures = 0
        while True:
            try:
                if self._client is None:
                    self._client = TelnetGymClient(TelnetClientConfig(self.config.host, self.config.port,
                                                                      self.config.timeout))
                return play_episode(self._client, index, game, difficulty, seed, self.player, self.config.max_steps,
                                    self.config.seed)
            except UmlosError as exc:
                if exc.code not in TRANSIENT:
                    raise
                self.close()
                failures += 1
                if failures > self.config.max_reconnects:
                    raise failure(exc.code, f"{exc.message} (gave up after {self.config.max_reconnects} reconnects "
                                            f"in episode {index})") from None
                self.metrics.reconnects += 1
                self.sleep(min(self.config.backoff_max_s, self.config.backoff_s * 2 ** (failures - 1)))

    def _count(self, episode: PuzzleEpisode, samples: int) -> None:
        m = self.metrics
        m.episodes += 1
        m.samples += samples
        m.steps += len(episode.commands)
        setattr(m, episode.outcome, getattr(m, episode.outcome) + 1)


def _config_invalid(message: str) -> UmlosError:
    return failure(errors.GYM_CONFIG_INVALID, message)


def _names(value: Any, name: str) -> tuple[str, ...]:
    """``games`` or ``difficulties``: one name or a non-empty list of non-empty names, as a tuple."""
    names = (value,) if isinstance(value, str) else tuple(value)

    def refused(message: str) -> UmlosError:  # the whole list, whichever name is wrong
        return _config_invalid(f"{name} must be a non-empty list of names, got {names!r}")

    checks.instance(names, name, tuple, empty=False, fail=refused)
    for item in names:
        checks.text(item, name, empty=False, fail=refused)
    return names
