"""A consumer of puzzle-server episodes, run as a process by tests/test_streams_gym.py.

``python stream_consumer.py PORT STORE LOG EPISODES [KILL_AFTER_WINDOW]``:
plays hint-player episodes from the server on 127.0.0.1:PORT into a replay
buffer, builds a window every 4 episodes, and commits a checkpoint (the
``plan_window`` cursor kind) after each. If the store holds a checkpoint it
resumes from it (the window builder from the checkpoint and LOG, the stream
from the buffer's sample count). With KILL_AFTER_WINDOW it kills itself
with SIGKILL two samples after that window's checkpoint, mid-run.
"""

from __future__ import annotations

import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import umlos_cuda as uc
from umlos_cuda.batching import BatchingConfig
from umlos_cuda.checkpoint import CheckpointState, CheckpointStore
from umlos_cuda.streams import (GymConfig, GymEpisodeStream, ReplayBuffer, RollingBatchPlanWindow,
                                policies_from_yaml)
from streams_support import EOS, tokenizer
from test_checkpoint_support import DATASET, KEY, identity

EVERY = 4
POLICY = """policies:
  - type: difficulty_bucket
    weights: {easy: 0.4, medium: 0.6}
  - type: failure_replay
    failure_weight: 2.0
  - type: novelty
    novelty_window: 8
"""


def gym_config(port: int, episodes: int) -> GymConfig:
    return GymConfig(port=port, games=("sudoku", "lights", "knapsack", "kenken"), difficulties=("easy", "medium"),
                     player="hint", episodes=episodes, seed=11, name="gym")


def new_window(log: str) -> RollingBatchPlanWindow:
    buffer = ReplayBuffer(10, "reservoir", manifest=identity().manifest)
    return RollingBatchPlanWindow(buffer, 3, batching=BatchingConfig.throughput(8192, (512, 1024, 2048), 4096),
                                  policy=policies_from_yaml(POLICY), samples_per_window=6, log=log)


def main(port: int, store_dir: str, log: str, episodes: int, kill_after: int | None) -> None:
    with CheckpointStore.open(store_dir, identity(), KEY) as store:
        restored = store.restore_latest()
        if restored is None:
            store.start_run(DATASET, world_size=1)
            window = new_window(log)
        else:
            window = restored.extra_cursors["plan_window"].resume(log)
        start = window.buffer.added  # one sample per episode
        stream = GymEpisodeStream(gym_config(port, episodes), tokenizer(), eos_token=EOS, start_episode=start,
                                  start_seq=start)
        pending_kill = None
        for sample in stream:
            window.add(sample)
            if pending_kill is not None and window.buffer.pending >= pending_kill:
                os.kill(os.getpid(), signal.SIGKILL)
            if stream.next_episode % EVERY == 0:
                built = window.next_window()
                store.commit(CheckpointState(built.index + 1, {DATASET: uc.Cursor()},
                                             extra_cursors={"plan_window": window}))
                if built.index == kill_after:
                    pending_kill = 2


if __name__ == "__main__":
    port, store_dir, log, episodes = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    main(port, store_dir, log, episodes, int(sys.argv[5]) if len(sys.argv) > 5 else None)
