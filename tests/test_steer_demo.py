"""The steering demonstration, examples/steer_tiny_lm.py: a tiny Llama on a two-component windowed mixture, a
synthetic loss spike at step 150, steps 150-160 left out by an edit derived from the parent at that step, the run
killed with SIGKILL after the edit and resumed at another world size (2 emulated ranks, then 1): its loss trace is
the uninterrupted edited run's, byte for byte (every loss as ``float.hex``, every step's global microbatches).

Three subprocesses (uninterrupted; killed at step 175, five steps after checkpoint 170; resumed on 1 rank), about
30 s of CPU on one thread.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from test_training import ok, trace  # its subprocess helpers: exit 0, the loss.jsonl lines

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "steer_tiny_lm.py")
STEPS, SPIKE, SKIP, KILL_AT, EVERY = 200, 150, 11, 175, 10
TIMEOUT_S = 300


def run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, EXAMPLE, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("steer")
    full, killed = base / "full", base / "killed"
    ok(run("--out", str(full)))
    died = run("--out", str(killed), "--kill-at-step", str(KILL_AT))
    after_kill = trace(killed)
    resumed = ok(run("--out", str(killed), "--resume", "--world-size", "1"))
    return {"full": full, "killed": killed, "died": died, "after_kill": after_kill, "resumed": resumed}


def test_the_run_leaves_the_spike_s_steps_out_and_learns(runs):
    from umlos_cuda.batching.plans.kinds import open_plan

    lines = trace(runs["full"])
    assert [line["step"] for line in lines] == list(range(STEPS))
    assert [line["plan"] for line in lines] == ["parent"] * SPIKE + ["edited"] * (STEPS - SPIKE)
    edited = open_plan(runs["full"] / "plan-edited")
    # the edited plan's unit k is the parent's unit k below the skipped ones, k + 22 from them on (11 steps of 2)
    assert edited.edit.ranges == ((0, 2 * SPIKE, 2 * (SPIKE + SKIP)),)
    assert [line["microbatches"] for line in lines] == [[2 * s, 2 * s + 1] for s in range(STEPS)]
    assert [edited.parent_index(0, k) for k in lines[SPIKE]["microbatches"]] == [2 * (SPIKE + SKIP),
                                                                               2 * (SPIKE + SKIP) + 1]
    losses = [float.fromhex(line["loss"]) for line in lines]
    assert sum(losses[-10:]) < 0.5 * sum(losses[:10]), losses  # it learns


def test_killed_after_the_edit_and_resumed_on_one_rank_it_repeats_the_trace_byte_for_byte(runs):
    assert runs["died"].returncode == -9, runs["died"].stderr[-3000:]
    assert [line["step"] for line in runs["after_kill"]] == list(range(KILL_AT - KILL_AT % EVERY))  # checkpoint 170
    assert f"resumed at step {KILL_AT - KILL_AT % EVERY} in edited plan" in runs["resumed"].stdout
    assert "1 rank(s) of 2 microbatch(es)" in runs["resumed"].stdout
    with open(runs["full"] / "loss.jsonl", "rb") as a, open(runs["killed"] / "loss.jsonl", "rb") as b:
        assert a.read() == b.read()


def test_the_edit_is_the_command_s_and_explain_names_the_parent_s_units(runs, tmp_path, capsys):
    """``plan edit --skip-steps 150:161 --world-size 2`` (the run's steps of 2 microbatches) writes the plan the run
    derived; ``plan explain`` of step 150 lists the parent's microbatches 322 and 323, their rows those of the
    parent's step 161."""
    from umlos_cuda.batching.plans.explain import explain
    from umlos_cuda.batching.plans.kinds import open_plan
    from umlos_cuda.cli import main

    parent, derived = str(runs["full"] / "plan"), open_plan(runs["full"] / "plan-edited")
    out = str(tmp_path / "edited")
    assert main(["plan", "edit", parent, "--skip-steps", f"{SPIKE}:{SPIKE + SKIP}", "--world-size", "2",
                 "--output", out]) == 0
    assert open_plan(out).fingerprint == derived.fingerprint
    step = explain(str(runs["full"] / "plan-edited"), SPIKE, world_size=2)["steps"][0]
    units = [unit for rank in step["ranks"] for unit in rank["units"]]
    assert [unit["parent_index"] for unit in units] == [2 * (SPIKE + SKIP), 2 * (SPIKE + SKIP) + 1]
    was = explain(parent, SPIKE + SKIP, world_size=2)["steps"][0]
    assert [unit["rows"] for unit in units] == [unit["rows"] for rank in was["ranks"] for unit in rank["units"]]
    capsys.readouterr()
    assert main(["plan", "explain", str(runs["full"] / "plan-edited"), "--step", str(SPIKE), "--world-size",
                 "2"]) == 0
    assert "parent's unit 322" in capsys.readouterr().out


def test_the_mixture_weights_change_at_the_first_window_from_step_100(runs):
    """The schedule's change lands at the first window whose first microbatch is at or after step 100's (a window
    keeps the weights it starts with); the windows before it hold 0.7 : 0.3 of a window of 32 (22 and 10), those
    from it on 0.3 : 0.7 (10 and 22), and each component's stream goes on where it stood (no row repeated)."""
    import json

    from umlos_cuda.batching.plans.kinds import open_plan

    with open(runs["full"] / "mixture.json", encoding="utf-8") as handle:
        change = json.load(handle)
    plan = open_plan(runs["full"] / "plan")
    blend = plan.definition.blend
    window = change["window"]
    assert change["first_microbatch"] == int(plan.index[0, window, 0]) >= 2 * 100
    assert int(plan.index[0, window - 1, 0]) < 2 * 100  # the window before it starts before step 100
    assert change["first_step"] == change["first_microbatch"] // 2
    assert {blend.quotas(m) for m in range(window)} == {(22, 10)}
    assert {blend.quotas(m) for m in range(window, blend.num_windows - 1)} == {(10, 22)}
    starts = [blend.stream_starts(m) for m in range(blend.num_windows)]
    assert all(starts[m + 1][i] == starts[m][i] + blend.quotas(m)[i] for m in range(blend.num_windows - 1)
               for i in range(2))
