"""Episodes/s from the puzzle server, and window build time over a large buffer.

Part 1 starts the real puzzle server (``chuk-puzzles-gym``, the ``gym``
extra) on a free port of 127.0.0.1 and plays episodes through
``GymEpisodeStream`` with the hint and random policies (client, server and
tokenizer all on this machine; the server is one asyncio process). Part 2
fills a ``ReplayBuffer`` with ``--buffer`` synthetic samples (lengths 16 to
2048) and times ``RollingBatchPlanWindow.next_window`` without a policy
(every sample once) and with the four curriculum policies, split into its
steps (snapshot, selection, plan).

    python bench/bench_streams.py [--episodes 100] [--buffer 100000] [--windows 5]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POLICY = """policies:
  - type: difficulty_bucket
    weights: {easy: 0.2, medium: 0.5, hard: 0.3}
  - type: failure_replay
    failure_weight: 2.0
  - type: novelty
    novelty_window: 1000
  - type: length_quota
    quotas: {128: 0.1, 256: 0.2, 512: 0.4, 1024: 0.3}
"""


def small_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(["place 1 2 3 row column grid sudoku rules fill each"] * 50, trainer)
    return tokenizer


def episodes_per_second(episodes: int) -> None:
    from umlos_cuda.streams import GymConfig, GymEpisodeStream

    folder = tempfile.mkdtemp()
    port_file = os.path.join(folder, "port")
    server = subprocess.Popen([sys.executable, "-m", "umlos_cuda.streams.gym.server", "--port", "0",
                               "--port-file", port_file], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(port_file):
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the puzzle server did not start")
            time.sleep(0.02)
        port = int(Path(port_file).read_text().split()[1])
        tokenizer = small_tokenizer()
        print(f"{'player':8} {'games':34} {'episodes':>8} {'steps':>7} {'solved':>6} {'episodes/s':>10} {'steps/s':>8}")
        for player, games, max_steps in (("hint", ("sudoku",), 200),
                                         ("hint", ("sudoku", "kenken", "lights", "knapsack", "binary"), 200),
                                         ("random", ("sudoku",), 50)):
            config = GymConfig(port=port, games=games, difficulties=("easy", "medium"), player=player,
                               episodes=episodes, max_steps=max_steps, seed=1)
            stream = GymEpisodeStream(config, tokenizer, eos_token="</s>")
            started = time.perf_counter()
            for _ in stream:
                pass
            elapsed = time.perf_counter() - started
            m = stream.metrics
            print(f"{player:8} {','.join(games):34} {m.episodes:8d} {m.steps:7d} {m.solved:6d} "
                  f"{m.episodes / elapsed:10.1f} {m.steps / elapsed:8.0f}")
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def window_build(size: int, windows: int) -> None:
    import numpy as np

    from umlos_cuda.batching import BatchingConfig, BatchPlanBuilder
    from umlos_cuda.batching.samples import Sample, SampleMeta
    from umlos_cuda.streams import ReplayBuffer, RollingBatchPlanWindow, StreamSample, policies_from_yaml

    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(5.5, 0.8, size).astype(int), 16, 2048)
    names = ("easy", "medium", "hard")
    started = time.perf_counter()
    samples = []
    for i, n in enumerate(lengths.tolist()):
        meta = SampleMeta(f"s{i}", "bench")
        sample = Sample(np.full(n, 7, dtype=np.int64), np.ones(n, dtype=np.int64), None, meta)
        samples.append(StreamSample(sample, "", "", "bench", f"ep{i}", i, float(i % 2), names[i % 3], "sudoku",
                                    bool(i % 2)))
    print(f"\n{size} synthetic samples made in {time.perf_counter() - started:.1f} s")
    batching = BatchingConfig.throughput(16384, (256, 512, 1024), 2048)
    for label, policy, per_window in (("no policy (all samples)", None, None),
                                      ("seed policy.yaml, 10^4 draws", POLICY, 10_000),
                                      ("seed policy.yaml, 10^5 draws", POLICY, size)):
        buffer = ReplayBuffer(size, "reservoir", seed=0)
        started = time.perf_counter()
        for s in samples:
            buffer.add(s)
        fill = time.perf_counter() - started
        window = RollingBatchPlanWindow(buffer, 1000, batching=batching, samples_per_window=per_window,
                                        policy=None if policy is None else policies_from_yaml(policy))
        times, parts = [], []
        for _ in range(windows):
            t0 = time.perf_counter()
            snapshot = buffer.snapshot()
            t1 = time.perf_counter()
            rows = np.arange(len(snapshot)) if window.policy is None else \
                window.policy.select(snapshot, per_window, buffer.rng)
            t2 = time.perf_counter()
            BatchPlanBuilder(snapshot.lengths[rows], batching, sample_ids=[snapshot.samples[r].sample_id
                                                                            for r in rows.tolist()]).build(1)
            t3 = time.perf_counter()
            parts.append((t1 - t0, t2 - t1, t3 - t2))
            w = window.next_window()
            times.append(w.build_seconds)
            for s in samples[:100]:  # a few new samples between windows
                buffer.add(s.with_seq(s.seq))
        snap, select, plan = (statistics.median(p[k] for p in parts) for k in range(3))
        print(f"{label:32} fill {fill:5.2f} s; next_window median {statistics.median(times) * 1e3:7.1f} ms "
              f"(snapshot {snap * 1e3:.1f}, selection {select * 1e3:.1f}, plan {plan * 1e3:.1f} ms), "
              f"{len(w.microbatches)} microbatches")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--buffer", type=int, default=100_000)
    parser.add_argument("--windows", type=int, default=5)
    args = parser.parse_args()
    episodes_per_second(args.episodes)
    window_build(args.buffer, args.windows)


if __name__ == "__main__":
    main()
