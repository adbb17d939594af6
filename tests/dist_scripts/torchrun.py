"""Start ``torchrun --standalone`` from a test and wait for it, never forever.

Shared by the multi-process tests (tests/test_torch_*.py). ``--standalone``
picks a free port for the rendezvous, so launches can run side by side. The
environment is this one's minus any rank variables a surrounding launcher set,
with the repository first on ``PYTHONPATH`` and ``OMP_NUM_THREADS=1`` (small
machines run several ranks per core).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "tests", "dist_scripts")
#: A safety net against a hung collective, not a timing assertion.
LAUNCH_TIMEOUT_S = 300
#: How long torchrun gets to stop its ranks after SIGTERM.
STOP_GRACE_S = 30


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def launch(nproc: int, script: str, *args: str) -> subprocess.Popen:
    """Start ``torchrun`` with ``nproc`` ranks of ``tests/dist_scripts/<script>``."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
        os.path.join(SCRIPTS, script), *args,
    ]
    return subprocess.Popen(cmd, env=environment(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def finish(proc: subprocess.Popen, what: str, expect_success: bool = True) -> str:
    """Wait for ``proc`` (killing it after LAUNCH_TIMEOUT_S) and return its output;
    fail the test if it timed out, or if its exit status is not what was expected."""
    try:
        out, _ = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        out = stop(proc)
        pytest.fail(f"{what} did not finish within {LAUNCH_TIMEOUT_S} s:\n{out[-6000:]}")
    if expect_success:
        assert proc.returncode == 0, f"{what} failed (exit {proc.returncode}):\n{out[-6000:]}"
    else:
        assert proc.returncode != 0, f"{what} should have failed:\n{out[-6000:]}"
    return out


def stop(proc: subprocess.Popen) -> str:
    """End a launch and its ranks. The ranks run in sessions of their own, so a
    SIGKILL to torchrun would orphan them: SIGTERM first, which torchrun passes
    on to every rank, then SIGKILL if it has not ended within STOP_GRACE_S."""
    proc.terminate()
    try:
        out, _ = proc.communicate(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out
