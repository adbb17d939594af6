"""The proof, single process: examples/train_tiny_lm.py killed with SIGKILL and resumed trains on
exactly the microbatches, and computes exactly the losses, of the same run left alone.

The runs are small (40 steps of a 2-layer Llama with hidden size 64 on 400
synthetic records, one thread) and each is a subprocess with a timeout. The
kill step is drawn from a seeded generator, so it varies between kill
steps that fall on, just after and between checkpoints without making the
test flaky; whatever it is, the resumed trace must equal the uninterrupted
one from the restored step on, key for key: the float32 loss as
``float.hex``, the plan position and the SHA-256 of the tensors the model
was given.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "train_tiny_lm.py")
STEPS, EVERY = 40, 10
SMALL = ["--steps", str(STEPS), "--checkpoint-every", str(EVERY), "--records", "400", "--epochs", "2",
         "--log-every", "10"]
TIMEOUT_S = 240
#: The kill step: seeded, in [2, STEPS - 1] (a step past the first checkpoint's due step or before it).
KILL_AT = random.Random(23).randint(2, STEPS - 1)


def run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, EXAMPLE, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def trace(folder) -> list[dict]:
    with open(os.path.join(folder, "loss.jsonl"), encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The uninterrupted run (which makes the data) and the killed-and-resumed run over the same store and plan."""
    base = tmp_path_factory.mktemp("training")
    whole, killed = base / "whole", base / "killed"
    ok(run("--out", str(whole), *SMALL))
    data = ["--store", str(whole / "store"), "--plan", str(whole / "plan")]
    died = run("--out", str(killed), *data, *SMALL, "--kill-at-step", str(KILL_AT))
    after_kill = trace(killed) if (killed / "loss.jsonl").exists() else []
    resumed = ok(run("--out", str(killed), *data, *SMALL, "--resume"))
    return {"whole": whole, "killed": killed, "died": died, "after_kill": after_kill, "resumed": resumed}


def test_the_uninterrupted_run_trains(runs):
    lines = trace(runs["whole"])
    assert [line["step"] for line in lines] == list(range(1, STEPS + 1))
    losses = [float.fromhex(line["loss"]) for line in lines]
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5, losses  # it learns
    assert len({line["batch_sha256"] for line in lines}) == STEPS  # a new microbatch every step
    positions = [(line["epoch"], line["microbatch"]) for line in lines]
    assert positions == sorted(positions) and positions[0] == (0, 0)
    timing = json.loads((runs["whole"] / "timing.json").read_text())
    assert timing["commits"] == STEPS // EVERY and timing["cursor_bytes"] > 0 and timing["resumed_from"] == 0


def test_the_kill_is_a_sigkill_after_the_last_checkpoint(runs):
    died = runs["died"]
    assert died.returncode == -signal.SIGKILL, (died.returncode, died.stderr[-2000:])
    assert f"step {KILL_AT}: SIGKILL" in died.stdout
    committed = (KILL_AT - 1) // EVERY * EVERY  # the kill comes before the checkpoint of its own step
    # The trace the killed process left holds exactly the steps of its last checkpoint.
    assert [line["step"] for line in runs["after_kill"]] == list(range(1, committed + 1))
    assert f"resumed at step {committed}," in runs["resumed"].stdout


def test_the_resumed_trace_is_bit_identical(runs):
    whole, resumed = trace(runs["whole"]), trace(runs["killed"])
    start = (KILL_AT - 1) // EVERY * EVERY
    assert len(resumed) == STEPS
    # From the restored step on: the same loss bits, plan positions and batch fingerprints.
    assert resumed[start:] == whole[start:]
    assert [line["batch_sha256"] for line in resumed] == [line["batch_sha256"] for line in whole]
    assert json.loads((runs["killed"] / "timing.json").read_text())["resumed_from"] == start


def test_a_resume_with_another_configuration_is_refused(runs):
    data = ["--store", str(runs["whole"] / "store"), "--plan", str(runs["whole"] / "plan")]
    result = run("--out", str(runs["killed"]), *data, *SMALL, "--resume", "--lr", "1e-3")
    assert result.returncode == 2 and "another configuration" in result.stderr, result.stderr[-2000:]


def test_a_second_fresh_run_into_a_run_folder_is_refused(runs):
    result = run("--out", str(runs["whole"]), *SMALL)
    assert result.returncode == 2 and "pass --resume" in result.stderr, result.stderr[-2000:]


def test_a_resume_where_no_run_was_started_is_refused(tmp_path):
    """It started a new run at step 0 and said "resumed at step 0"; now nothing is made there."""
    result = run("--out", str(tmp_path / "typo"), *SMALL, "--resume")
    assert result.returncode == 2 and "holds no run to resume" in result.stderr, result.stderr[-2000:]
    assert "drop --resume to start a run there" in result.stderr and not (tmp_path / "typo").exists()


def test_a_resume_before_the_first_checkpoint_starts_again_saying_so(tmp_path):
    out = str(tmp_path / "early")
    small = ["--steps", "4", "--checkpoint-every", "3", "--records", "100", "--epochs", "1"]
    died = run("--out", out, *small, "--kill-at-step", "2")
    assert died.returncode == -signal.SIGKILL, died.stderr[-2000:]
    resumed = ok(run("--out", out, *small, "--resume"))
    assert "holds no committed checkpoint yet (the first is due at step 3): starting again from step 0" in \
        resumed.stdout and "starting at step 0," in resumed.stdout
    assert [line["step"] for line in trace(out)] == [1, 2, 3, 4]
