"""``MockGymStream``: synthetic episodes without a server, for unit tests only.

Each episode is one sample: token ids and a length drawn from the episode's
Philox stream (:func:`~.episodes.episode_seed`), games and difficulties in
the same cycle as :class:`~.stream.GymConfig`, solved with probability
``solve_rate``. The integration tests and every real run use the puzzle
server (:class:`~.stream.GymEpisodeStream`).
"""

from __future__ import annotations

from collections.abc import Iterator

from ...batching.samples import Sample, SampleMeta
from .episodes import EpisodeDraws, episode_seed
from ..types import StreamSample, difficulty_rank


class MockGymStream:
    def __init__(self, episodes: int, *, seed: int = 0, games=("sudoku", "kenken"),
                 difficulties=("easy", "medium", "hard"),
                 solve_rate: float = 0.6, min_length: int = 16, max_length: int = 600, vocab: int = 1000,
                 start_episode: int = 0) -> None:
        self.episodes, self.seed = episodes, seed
        self.games, self.difficulties = tuple(games), tuple(difficulties)
        self.solve_rate, self.min_length, self.max_length, self.vocab = solve_rate, min_length, max_length, vocab
        self.start_episode = start_episode

    def __iter__(self) -> Iterator[StreamSample]:
        for e in range(self.start_episode, self.episodes):
            draws = EpisodeDraws(episode_seed(self.seed, e))
            length_draw, solve_draw = (int(x) for x in draws(2))
            length = self.min_length + length_draw % (self.max_length - self.min_length + 1)
            ids = (draws(length) % self.vocab).tolist()
            solved = solve_draw / 2**32 < self.solve_rate
            game = self.games[e % len(self.games)]
            difficulty = self.difficulties[(e // len(self.games)) % len(self.difficulties)]
            episode_id = f"mock/ep{e}"
            reward = 1.0 if solved else 0.0
            meta = SampleMeta(episode_id, "mock", episode_id, reward, difficulty_rank(difficulty), "mock")
            half = length // 2
            sample = Sample(ids, [0] * half + [1] * (length - half), None, meta)
            yield StreamSample(sample, "", "", "mock", episode_id, e, reward, difficulty, game, solved)
