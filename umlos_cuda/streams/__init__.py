"""Online streams for training: samples from a puzzle server or a dataset, a
replay buffer, rolling batch-plan windows and curriculum policies, every
window recorded so that a run replays offline bit for bit (docs/streams.md).

    types, failures   :class:`StreamSample`, :class:`StreamMetrics`; the streams failure codes
    protocols         the stream and player interfaces
    offline           a JSONL dataset or a token store as a stream
    gym/              the puzzle gym: telnet wire and client, players, episodes, the stream, the server
    buffer/           the replay buffer, its Philox sub-streams, frozen snapshots
    curriculum/       sampling policies, ``policy.yaml``, per-window metrics and their plot
    window/           rolling batch-plan windows, the window log, offline replay, the cursor kind

This package only re-exports. Importing it registers the ``plan_window``
checkpoint cursor kind.
"""

from .buffer.rng import BufferRng, stream_manifest
from .window.checkpoint_kinds import WindowCheckpoint
from .curriculum.metrics import plot_curriculum, window_metrics
from .gym.episodes import PuzzleEpisode, episode_samples, play_episode, puzzle_seed
from .gym.stream import GymConfig, GymEpisodeStream
from .gym.mock import MockGymStream
from .offline import AsyncOfflineDatasetStream, OfflineDatasetStream, TokenStoreStream
from .gym.players import HintPlayer, RandomPlayer, hint_command, make_player
from .curriculum.config import load_policies, policies_from_data, policies_from_yaml
from .protocols import AsyncSampleStream, Player, PlayerContext, SampleStream
from .window.replay import ReplayReport, replay_log
from .buffer.replay_buffer import EvictionPolicy, ReplayBuffer
from .curriculum.policies import (ComposedPolicy, DifficultyBucketPolicy, FailureReplayPolicy, LengthQuotaPolicy,
                                  NoveltyPolicy, SamplingPolicy)
from .buffer.snapshot import BufferSnapshot
from .gym.telnet_client import GameInfo, PuzzleObservation, StepResult, TelnetClientConfig, TelnetGymClient
from .types import StreamMetrics, StreamSample
from .window.rolling import RollingBatchPlanWindow, Window
from .window.log import WindowLog, read_log

__all__ = [
    "AsyncOfflineDatasetStream", "AsyncSampleStream", "BufferRng", "BufferSnapshot", "ComposedPolicy",
    "DifficultyBucketPolicy", "EvictionPolicy", "FailureReplayPolicy", "GameInfo", "GymConfig", "GymEpisodeStream",
    "HintPlayer", "LengthQuotaPolicy", "MockGymStream", "NoveltyPolicy", "OfflineDatasetStream", "Player",
    "PlayerContext", "PuzzleEpisode", "PuzzleObservation", "RandomPlayer", "ReplayBuffer", "ReplayReport",
    "RollingBatchPlanWindow", "SampleStream", "SamplingPolicy", "StepResult", "StreamMetrics", "StreamSample",
    "TelnetClientConfig", "TelnetGymClient", "TokenStoreStream", "Window", "WindowCheckpoint", "WindowLog",
    "episode_samples",
    "hint_command", "load_policies", "make_player", "play_episode", "plot_curriculum", "policies_from_data",
    "policies_from_yaml", "puzzle_seed", "read_log", "replay_log", "stream_manifest", "window_metrics",
]
