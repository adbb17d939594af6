"""Against the real puzzle server (chuk-puzzles-gym, started on a free port
of 127.0.0.1 and stopped afterwards): the client, the policies, episodes as
samples, and the integration test: a consumer plays episodes into the
buffer and builds windows with checkpoints, is killed mid-run, resumes from
the checkpoint store, and its windows equal those of an uninterrupted run;
``umlos-cuda gym replay`` proves both recorded runs bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from umlos_cuda import cli
from umlos_cuda.batching import load_tokenizer
from umlos_cuda.batching.templates import sft_prompt
from umlos_cuda.streams import (GymConfig, GymEpisodeStream, HintPlayer, TelnetGymClient, hint_command, puzzle_seed,
                                read_log, replay_log)
from streams_support import EOS, puzzle_server, require_gym, tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.usefixtures("gym_installed")


@pytest.fixture
def gym_installed():
    require_gym()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with puzzle_server(tmp_path_factory.mktemp("server")) as address:
        yield address


def test_the_client_reads_the_menu_and_plays(server):
    host, port = server
    with TelnetGymClient(host=host, port=port) as client:
        names = [g.name for g in client.games()]
        assert {"Sudoku", "KenKen", "Lights Out"} <= set(names) and len(names) >= 20
        assert {"easy", "medium", "hard"} <= set(client.difficulties())
        first = client.start("sudoku", "easy", 7)
        assert (first.game, first.difficulty, first.seed, first.moves, first.is_complete) == \
            ("Sudoku", "easy", 7, 0, False)
        assert "SUDOKU RULES" in client.rules and len(first.grid) == 9
        command = hint_command(client.hint())
        result = client.step(command)
        assert result.accepted and result.observation.moves == 1 and not result.ended
        bad = client.step("place 1 1 1" if first.grid[0][0] else "place 1 1 99")
        assert bad.accepted is False
        again = client.start("sudoku", "easy", 7)  # the seed gives the same puzzle
        assert again.grid == first.grid


def test_hint_episodes_solve_and_random_ones_give_up(server):
    host, port = server
    config = GymConfig(host=host, port=port, games=("sudoku", "lights", "knapsack"), difficulties=("easy", "medium"),
                       episodes=6, seed=3)
    episodes = []
    samples = list(GymEpisodeStream(config, tokenizer(), eos_token=EOS, on_episode=episodes.append))
    assert [e.outcome for e in episodes] == ["solved"] * 6
    assert [(s.game, s.difficulty) for s in samples] == [("sudoku", "easy"), ("lights", "easy"), ("knapsack", "easy"),
                                                        ("sudoku", "medium"), ("lights", "medium"),
                                                        ("knapsack", "medium")]
    first = samples[0]
    assert first.reward == 1.0 and first.solved and first.seq == 0 and first.response.startswith("place ")
    assert first.response.count("\n") + 1 == len(episodes[0].commands)
    loaded = load_tokenizer(tokenizer())
    text_ids = loaded.tokenizer.encode(sft_prompt(first.prompt)).ids
    assert first.sample.input_ids[:len(text_ids)] == tuple(text_ids)  # the batching template
    assert first.sample.loss_mask[:len(text_ids)] == (0,) * len(text_ids) and first.sample.loss_mask[-1] == 1
    steps = list(GymEpisodeStream(GymConfig(host=host, port=port, episodes=1, seed=3, output="steps"), tokenizer(),
                                  eos_token=EOS))
    assert [s.response for s in steps] == episodes[0].commands
    random_config = GymConfig(host=host, port=port, episodes=2, seed=3, player="random", max_steps=15)
    gave_up = []
    list(GymEpisodeStream(random_config, tokenizer(), eos_token=EOS, on_episode=gave_up.append))
    assert [(e.outcome, len(e.commands)) for e in gave_up] == [("gave_up", 15)] * 2


def test_a_player_is_any_callable(server):
    host, port = server
    seen = []

    def cautious(observation, context):
        seen.append(observation.moves)
        return None if context.step == 3 else HintPlayer()(observation, context)

    config = GymConfig(host=host, port=port, episodes=1, player=cautious)
    episodes = []
    list(GymEpisodeStream(config, tokenizer(), eos_token=EOS, on_episode=episodes.append))
    assert seen == [0, 1, 2, 3] and episodes[0].outcome == "gave_up" and len(episodes[0].commands) == 3


def consumer(port, store, log, episodes, kill_after=None):
    command = [sys.executable, os.path.join(HERE, "stream_consumer.py"), str(port), str(store), str(log), str(episodes)]
    if kill_after is not None:
        command.append(str(kill_after))
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def test_a_killed_consumer_resumes_with_the_same_windows(server, tmp_path):
    _, port = server
    episodes = 24
    a = consumer(port, tmp_path / "store-a", tmp_path / "a.jsonl", episodes)
    assert a.returncode == 0, a.stderr
    killed = consumer(port, tmp_path / "store-b", tmp_path / "b.jsonl", episodes, kill_after=2)
    assert killed.returncode == -9, killed.stderr  # SIGKILL two samples after window 2's checkpoint
    assert len(read_log(tmp_path / "b.jsonl").windows) == 3
    resumed = consumer(port, tmp_path / "store-b", tmp_path / "b.jsonl", episodes)
    assert resumed.returncode == 0, resumed.stderr
    run_a, run_b = read_log(tmp_path / "a.jsonl"), read_log(tmp_path / "b.jsonl")
    assert len(run_a.windows) == episodes // 4 == len(run_b.windows)
    for name in ("snapshot_fingerprint", "plan_fingerprint", "window_fingerprint", "rng_offsets", "added"):
        assert [w[name] for w in run_b.windows] == [w[name] for w in run_a.windows], name
    added = [e["sample"]["episode_id"] for w in run_a.windows for e in w["added"]]
    assert [a.rsplit("/", 1)[1] for a in added] == [f"ep{e}" for e in range(episodes)]  # every episode once, in order
    assert added[0] == f"gym/sudoku/easy/seed{puzzle_seed(11, 0)}/ep0"  # what the episode is, not the server's port
    assert replay_log(tmp_path / "a.jsonl").windows == replay_log(tmp_path / "b.jsonl").windows == 6
    assert cli.main(["gym", "replay", str(tmp_path / "b.jsonl")]) == 0


def test_cli_info_and_run(server, tmp_path, capsys):
    host, port = server
    assert cli.main(["gym", "info", "--host", host, "--port", str(port), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["games"][0]["name"] == "Sudoku" and "hard" in info["difficulties"]
    tokenizer().save(str(tmp_path / "tokenizer.json"))
    out = tmp_path / "run"
    assert cli.main(["gym", "run", "--host", host, "--port", str(port), "--game", "sudoku,lights", "--episodes", "9",
                     "--tokenizer", str(tmp_path / "tokenizer.json"), "--eos-token", EOS, "--buffer-size", "6",
                     "--window-mbs", "2", "--window-every", "4", "--output", str(out), "--quiet"]) == 0
    summary = json.loads((out / "run.json").read_text())
    assert summary["episodes"]["episodes"] == 9 and summary["windows"]["count"] == 3  # after 4, 8 and the last
    assert summary["buffer"] == {"size": 6, "max_size": 6, "eviction": "fifo", "added": 9}
    capsys.readouterr()
    assert cli.main(["gym", "replay", str(out)]) == 0
    assert summary["windows"]["last_fingerprint"] in capsys.readouterr().out
    assert cli.main(["gym", "run", "--port", str(port), "--game", "sudoku", "--episodes", "1", "--tokenizer",
                     str(tmp_path / "tokenizer.json"), "--buffer-size", "2", "--window-mbs", "1",
                     "--output", str(out)]) == 2
    assert "OUTPUT_EXISTS" in capsys.readouterr().err  # like every output: --force replaces a run, nothing else
    # Packed windows: the log's header records the pack configuration and replay rebuilds them.
    packed = tmp_path / "packed"
    assert cli.main(["gym", "run", "--host", host, "--port", str(port), "--game", "sudoku", "--episodes", "4",
                     "--tokenizer", str(tmp_path / "tokenizer.json"), "--eos-token", EOS, "--buffer-size", "4",
                     "--window-mbs", "2", "--window-every", "2", "--pack", "--pack-max-len", "8192",
                     "--output", str(packed), "--quiet"]) == 0
    header = json.loads((packed / "windows.jsonl").read_text().splitlines()[0])
    assert header["pack"] == {"mode": "first_fit", "max_length": 8192, "separator_len": 0}
    capsys.readouterr()
    assert cli.main(["gym", "replay", str(packed)]) == 0
