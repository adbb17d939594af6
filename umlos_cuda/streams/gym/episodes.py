"""One episode of a puzzle, played by a player, and the samples it becomes.

What goes in: a connected :class:`~.telnet_client.TelnetGymClient`, the
game, difficulty and puzzle seed, a :class:`~..protocols.Player` and a step
limit. What comes out: a :class:`PuzzleEpisode` (every command with the
grid it answered, and how the episode ended: ``solved``, ``game_over`` or
``gave_up``), and from it, :func:`episode_samples`: training samples whose
prompt is the game's rules and grid and whose response is the player's
commands, tokenized with the batching template (``sft_sample``: loss on
the response only). The reward is 1.0 for a solved episode, else 0.0.

A sample's id is ``SOURCE/GAME/DIFFICULTY/seedPUZZLE_SEED/epINDEX`` (plus
``/sK`` per step): derived from what the episode is, so the same run
configuration gives the same ids on any server address.

``output="episode"`` gives one sample per episode (the first grid, then
every command, one per line); ``output="steps"`` one per command (the grid
it saw, then the command).

Randomness of a player comes from :func:`episode_seed`: a Philox key derived
from the run seed and the episode number alone (its own derivation tag), so
replaying episode ``e`` after a reconnect draws the same numbers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from ... import checks, errors
from ...batching.samples import SampleMeta
from ...batching.templates import sft_sample
from ...hashing import hash_canonical
from ...rng.streams import draws_at
from ..failures import failure
from ..protocols import Player, PlayerContext
from .telnet_client import MAX_PUZZLE_SEED, PuzzleObservation, TelnetGymClient
from ..types import StreamSample, difficulty_rank

EPISODE_DERIVATION = "umlos_gym_episode_v1"
PUZZLE_DERIVATION = "umlos_gym_puzzle_v1"
OUTPUT_MODES = ("episode", "steps")
#: A command: text with something besides whitespace.
_NOT_BLANK = re.compile(r".*\S.*", re.DOTALL)


def episode_seed(run_seed: int, episode: int) -> bytes:
    """The 16-byte Philox key of episode ``episode`` of the run ``run_seed``."""
    return hash_canonical([EPISODE_DERIVATION, run_seed, episode])[:16]


def puzzle_seed(run_seed: int, episode: int) -> int:
    """The server's puzzle seed for episode ``episode`` (in [0, 2^31 - 1])."""
    return int.from_bytes(hash_canonical([PUZZLE_DERIVATION, run_seed, episode])[:4], "little") & MAX_PUZZLE_SEED


@dataclass
class EpisodeDraws:
    """The sequential draws of one episode's stream (``draws_at`` on its key)."""

    key: bytes
    offset: int = 0

    def __call__(self, k: int) -> np.ndarray:
        values = draws_at(self.key, "misc", self.offset, int(k), backend="numpy")
        self.offset += int(k)
        return values


@dataclass
class PuzzleEpisode:
    """A played episode: what was sent, what was seen, how it ended."""

    index: int
    game: str
    difficulty: str
    seed: int
    rules: str
    first_grid: str
    grids: list[str] = field(default_factory=list)  # the grid each command saw
    commands: list[str] = field(default_factory=list)
    accepted: list[bool | None] = field(default_factory=list)
    outcome: str = "gave_up"

    @property
    def reward(self) -> float:
        return 1.0 if self.outcome == "solved" else 0.0

    @property
    def solved(self) -> bool:
        return self.outcome == "solved"


def play_episode(client: TelnetGymClient, index: int, game: str, difficulty: str, seed: int, player: Player,
                 max_steps: int, run_seed: int) -> PuzzleEpisode:
    """Play one episode to its end (solved, game over, or given up at ``max_steps``)."""
    observation: PuzzleObservation = client.start(game, difficulty, seed)
    episode = PuzzleEpisode(index, game, difficulty, seed, client.rules, observation.grid_display)
    draws = EpisodeDraws(episode_seed(run_seed, index))
    while not observation.is_complete and len(episode.commands) < max_steps:
        context = PlayerContext(client.hint, draws, len(episode.commands), client.rules, game)
        command = player(observation, context)
        if command is None:
            break
        checks.text(command, repr(getattr(player, "name", player)), pattern=_NOT_BLANK,
                    fail=partial(failure, errors.GYM_CONFIG_INVALID),
                    message="player {name} returned {value!r}; a player returns a command string or None")
        result = client.step(command.strip())
        episode.grids.append(observation.grid_display)
        episode.commands.append(command.strip())
        episode.accepted.append(result.accepted)
        if result.observation is not None:
            observation = result.observation
        if result.game_over:
            episode.outcome = "game_over"
            break
        if result.solved:
            episode.outcome = "solved"
            break
    else:
        if observation.is_complete:
            episode.outcome = "solved"
    client.menu()
    return episode


def prompt_text(episode: PuzzleEpisode, grid: str) -> str:
    return f"Game: {episode.game} ({episode.difficulty})\n{episode.rules}\n\n{grid}"


def episode_samples(episode: PuzzleEpisode, tokenizer: Any, *, source: str, first_seq: int, output: str = "episode",
                    eos_token: str | None = None) -> list[StreamSample]:
    """The samples of ``episode`` (see the module docstring), numbered from ``first_seq``."""
    if output not in OUTPUT_MODES:
        raise failure(errors.GYM_CONFIG_INVALID, f"output must be one of {', '.join(OUTPUT_MODES)}, got {output!r}")
    # What the episode is (puzzle and position in the run), not where its server listened.
    episode_id = f"{source}/{episode.game}/{episode.difficulty}/seed{episode.seed}/ep{episode.index}"
    if output == "episode":
        texts = [(episode_id, prompt_text(episode, episode.first_grid), "\n".join(episode.commands))]
    else:
        texts = [(f"{episode_id}/s{k}", prompt_text(episode, grid), command)
                 for k, (grid, command) in enumerate(zip(episode.grids, episode.commands))]
    out = []
    for offset, (sample_id, prompt, response) in enumerate(texts):
        meta = SampleMeta(sample_id, "gym", episode_id, episode.reward, difficulty_rank(episode.difficulty), source)
        sample = sft_sample(tokenizer, prompt, response, meta, eos_token=eos_token)
        out.append(StreamSample(sample, prompt, response, source, episode_id, first_seq + offset, episode.reward,
                                episode.difficulty, episode.game, episode.solved))
    return out
