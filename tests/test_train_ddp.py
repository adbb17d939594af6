"""examples/train_ddp.py under torchrun (gloo, CPU): a 2-rank DDP run killed with SIGKILL
mid-step and resumed from the engine's checkpoint store repeats the uninterrupted run's loss
trace byte for byte and consumes the same microbatches; resumed on 1 rank it consumes the
identical global microbatch sequence (two microbatches per step, accumulated) and its losses
stay within a stated bound of the 2-rank run's (measured: equal, see docs/training.md); each run's
checkpoint store's tape records every step of the plan once, each the plan's rows (``plan.step``
records, ``plan explain --check-tape``).

One module-scoped fixture runs the four launches (uninterrupted; killed; resumed on 2 ranks;
resumed on 1 rank from a copy of the killed run's folder) and the tests read their folders. They are the
launches docs/training.md's "torchrun" section shows, in its folders' names (``runs/ddp``, ...): that block
and the check after it are skipped by tests/test_docs.py, whose documents run one after another, and run
here instead, the commands compared with the document's and its check run on these runs' folders.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from dist_scripts.torchrun import ROOT, environment, finish
from test_docs import fenced_blocks, snippet_env

EXAMPLE = os.path.join(ROOT, "examples", "train_ddp.py")
#: The default data give 65 microbatches per epoch and 2 epochs: 33 steps an epoch (the last one short).
STEPS, PER_EPOCH, MICROBATCHES = 66, 33, 65
CHECKPOINT_EVERY = 10
#: Mid-step in epoch 1, three checkpoints in: the resume starts at step 30, cursor (0, 60), and
#: crosses an epoch's short last step and the epoch boundary.
KILL_AT = 37
RESUME_FROM = 30
#: Bound on |loss(1 rank) - loss(2 ranks)| / loss after the resume: the two differ only in how
#: the two microbatches' gradients are summed (DDP's all-reduce, or accumulation on one rank).
#: Measured: 0.0 (the sums are of two addends, each scaled by a power of two: exact either way).
LOSS_REL_BOUND = 1e-4
#: How long the killed job's processes may take to disappear after the launcher's exit.
GONE_WITHIN_S = 30
#: The launches, in order: (ranks, run folder under the fixture's folder, arguments), as docs/training.md
#: writes them: ``--checkpoint-every`` is left at the example's default, CHECKPOINT_EVERY (the resume from
#: RESUME_FROM says so).
FULL, KILLED, ONE_RANK = "runs/ddp", "runs/ddp-killed", "runs/ddp-one-rank"
LAUNCHES = ((2, FULL, ()), (2, KILLED, ("--kill-at-step", str(KILL_AT))), (2, KILLED, ("--resume",)),
            (1, ONE_RANK, ("--resume",)))
DOCUMENT = os.path.join("docs", "training.md")


def launch(nproc: int, workdir, args: tuple[str, ...]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", EXAMPLE,
           "--workdir", str(workdir), *args]
    return subprocess.Popen(cmd, env=environment(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def trace(workdir) -> list[dict]:
    with open(os.path.join(workdir, "trace.jsonl"), encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def live_processes_naming(text: str) -> list[int]:
    """Pids of processes (not zombies) whose command line holds ``text``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                cmdline = handle.read().decode(errors="replace")
            with open(f"/proc/{name}/stat", encoding="utf-8") as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(int(name))
    return found


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("train-ddp")
    full, killed, one = (base / name for name in (FULL, KILLED, ONE_RANK))
    (nproc_full, _, args_full), (nproc_kill, _, args_kill), (nproc_resume2, _, args_resume2), \
        (nproc_resume1, _, args_resume1) = LAUNCHES
    outputs = {"full_log": finish(launch(nproc_full, full, args_full), "the uninterrupted 2-rank run")}
    proc = launch(nproc_kill, killed, args_kill)
    outputs["kill"] = finish(proc, "the 2-rank run killed at a step", expect_success=False)
    outputs["kill_code"] = proc.returncode
    deadline = time.monotonic() + GONE_WITHIN_S
    while live_processes_naming(str(killed)) and time.monotonic() < deadline:
        time.sleep(0.2)
    outputs["survivors"] = live_processes_naming(str(killed))
    outputs["killed_trace"] = trace(killed)
    shutil.copytree(killed, one)  # the state the kill left, for the 1-rank resume
    outputs["resume2"] = finish(launch(nproc_resume2, killed, args_resume2), "the 2-rank resume")
    outputs["resume1"] = finish(launch(nproc_resume1, one, args_resume1), "the 1-rank resume")
    return {"base": base, "full": full, "killed": killed, "one": one, **outputs}


def test_the_uninterrupted_run_reads_every_microbatch_of_the_plan_once_an_epoch_and_learns(runs):
    from umlos_cuda.batching import TokenStore, load_plan
    from umlos_cuda.batching.batches.fingerprint import microbatch_digest, plan_batches
    from umlos_cuda.checkpoint import verify_store

    steps = trace(runs["full"])
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    for epoch in (0, 1):
        mine = steps[epoch * PER_EPOCH:(epoch + 1) * PER_EPOCH]
        assert {s["epoch"] for s in mine} == {epoch}
        assert [i for s in mine for i in s["microbatches"]] == list(range(MICROBATCHES))
        assert [len(s["microbatches"]) for s in mine] == [2] * (PER_EPOCH - 1) + [1]  # a short last step
    # what the ranks collated is what the plan says, microbatch for microbatch
    plan = load_plan(runs["full"] / "plan")
    expected = [microbatch_digest(batch.input_ids, batch.loss_mask)
                for _, _, batch in plan_batches(plan, TokenStore.open(runs["full"] / "store"))]
    assert [d for s in steps for d in s["digests"]] == expected
    losses = [float(s["loss"]) for s in steps]
    assert losses[-1] < 0.5 * losses[0], losses  # the model learns
    summary = verify_store(str(runs["full"] / "checkpoints"))
    assert summary["checkpoints"] >= 1
    assert "trained 66 steps on 2 rank(s)" in runs["full_log"]


def test_a_run_killed_mid_step_and_resumed_on_2_ranks_repeats_the_trace_byte_for_byte(runs):
    assert runs["kill_code"] == -signal.SIGKILL, runs["kill"][-3000:]  # the launcher itself was killed
    assert runs["survivors"] == [], f"processes of the killed job still run: {runs['survivors']}"
    full = trace(runs["full"])
    assert runs["killed_trace"] == full[:KILL_AT - 1]  # step KILL_AT died before its line
    assert f"resumed at step {RESUME_FROM}, plan cursor 0:60, on 2 rank(s)" in runs["resume2"]
    with open(runs["full"] / "trace.jsonl", "rb") as a, open(runs["killed"] / "trace.jsonl", "rb") as b:
        assert a.read() == b.read()  # losses (repr), microbatch indices and digests, every step


@pytest.mark.parametrize("run", ["full", "killed", "one"])
def test_each_run_s_tape_checks_against_its_plan(runs, run):
    """Every step of the plan on the store's tape once (the killed run's uncommitted steps gone, the resumed ones
    recorded at their world size), each the plan's rows: ``plan explain --check-tape``."""
    from umlos_cuda.batching.plans.explain import StepExplainer, check_tape

    report = check_tape(str(runs[run] / "checkpoints"), StepExplainer.open(runs[run] / "plan"))
    assert (report["steps"], report["units"]) == (STEPS, 2 * MICROBATCHES)
    assert report["first"] == {"t": 1, "epoch": 0, "cursor": 0}
    assert report["last"] == {"t": STEPS, "epoch": 1, "cursor": MICROBATCHES}


def test_a_resume_on_1_rank_consumes_the_same_global_microbatches_and_stays_within_the_bound(runs):
    full, one = trace(runs["full"]), trace(runs["one"])
    assert f"resumed at step {RESUME_FROM}, plan cursor 0:60, on 1 rank(s)" in runs["resume1"]
    assert "trained 66 steps on 1 rank(s)" in runs["resume1"]
    assert [s["step"] for s in one] == [s["step"] for s in full]
    assert [s["microbatches"] for s in one] == [s["microbatches"] for s in full]
    assert [s["digests"] for s in one] == [s["digests"] for s in full]
    assert one[:RESUME_FROM] == full[:RESUME_FROM]  # the killed run's own lines, kept
    # the first resumed step runs the restored weights on the same microbatches: equal bit for bit
    assert one[RESUME_FROM]["losses"] == full[RESUME_FROM]["losses"]
    worst = max(abs(float(a["loss"]) - float(b["loss"])) / float(b["loss"]) for a, b in zip(one, full))
    assert worst <= LOSS_REL_BOUND, f"relative loss difference {worst:.3g} after the resume on 1 rank"


def documented_blocks() -> tuple[str, str]:
    """docs/training.md's torchrun launches (sh) and the check of their traces after them (python)."""
    blocks = fenced_blocks(DOCUMENT)
    at = next(i for i, block in enumerate(blocks) if block.lang == "sh" and "examples/train_ddp.py" in block.code)
    launches, check = blocks[at], blocks[at + 1]
    assert launches.skip_reason and "tests/test_train_ddp.py" in launches.skip_reason, launches.where
    assert check.lang == "python" and check.skip_reason and "tests/test_train_ddp.py" in check.skip_reason
    return launches.code, check.code


def test_the_document_s_launches_are_these():
    """docs/training.md shows the launches this file runs: the same ranks, folders and arguments, in order,
    the 1-rank run from a copy of the killed run's folder made before its 2-rank resume."""
    code, _ = documented_blocks()
    commands = [" ".join(line.split()) for line in code.replace("\\\n", " ").splitlines()]
    torchrun = [re.match(r"torchrun --standalone --nproc-per-node (\d+) examples/train_ddp.py --workdir (\S+)"
                         r"((?: --[\w-]+(?: \d+)?)*)", command) for command in commands]
    documented = [(int(m.group(1)), m.group(2), tuple(m.group(3).split())) for m in torchrun if m]
    assert documented == list(LAUNCHES), documented
    copy = commands.index(f"cp -r {KILLED} {ONE_RANK}")
    assert [i for i, m in enumerate(torchrun) if m] == [1, 2, copy + 1, copy + 2]
    assert "--checkpoint-every" not in code  # the default, which the resume from RESUME_FROM pins


def test_the_document_s_checks_hold_on_these_runs(runs):
    """The document's ``plan explain --check-tape`` of each run and its Python check of the traces, run in the
    folder that holds this file's ``runs/``, pass."""
    code, check = documented_blocks()
    loop = code[code.index("for run in"):]
    env = snippet_env()
    explained = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", loop], cwd=runs["base"], env=env,
                               capture_output=True, text=True, timeout=300)
    assert explained.returncode == 0, explained.stderr[-3000:]
    assert explained.stdout.count(f"{STEPS} steps") == 3, explained.stdout
    printed = subprocess.run([sys.executable, "-c", check], cwd=runs["base"], env=env, capture_output=True,
                             text=True, timeout=300)
    assert printed.returncode == 0, printed.stderr[-3000:]
    assert printed.stdout.startswith(f"{STEPS} steps, loss "), printed.stdout
