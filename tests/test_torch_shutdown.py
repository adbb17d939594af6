"""``run_distributed`` ends every rank of a gloo job cleanly.

The failure it fixes was intermittent (a SIGABRT at interpreter exit in about
4 of 10 launches of the README's commands); its cause is deterministic: the
interpreter was finalized while gloo's worker threads were alive. So the
launch test checks that cause directly: in a DDP program whose process group
is still referenced at the end (the hazard, confirmed by counting gloo's
threads in an ``atexit`` handler), every rank exits 0, its ``atexit`` handlers
still run, and no rank finalizes the interpreter
(a module global's ``__del__`` would say so). A program ended with
``destroy_process_group()`` and a normal exit fails the last check on every
run. ``bench/torchrun_loop.py`` counts clean launches in a loop.

The exit-status rules, and the flushing of buffered output before
``os._exit``, run in one process, on a one-rank group with an in-memory store
(no launcher, no port).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the optional 'torch' extra)")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("this torch build has no gloo backend for torch.distributed", allow_module_level=True)

from dist_scripts.torchrun import LAUNCH_TIMEOUT_S, environment, finish, launch  # noqa: E402

WORLD = 2


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counting gloo's threads needs Linux's /proc")
def test_ranks_exit_zero_without_finalizing_while_gloo_threads_live():
    out = finish(launch(WORLD, "shutdown_worker.py", "--mode", "clean"), f"torchrun W={WORLD}")
    for rank in range(WORLD):
        assert f"rank {rank} trained" in out, out[-6000:]
        found = re.search(rf"rank {rank} atexit gloo_threads=(\d+)", out)  # ranks' lines may interleave
        assert found is not None, f"rank {rank}'s atexit handler did not run:\n{out[-6000:]}"
        assert int(found.group(1)) > 0, "the hazard is absent: no gloo thread alive at exit"
    assert "FINALIZING" not in out, f"a rank finalized the interpreter with gloo threads alive:\n{out[-6000:]}"
    assert "terminate called" not in out


def test_a_failing_rank_ends_the_launch_with_its_traceback():
    out = finish(launch(WORLD, "shutdown_worker.py", "--mode", "fail"), f"torchrun W={WORLD}", expect_success=False)
    assert "RuntimeError: rank 1 fails on purpose" in out, out[-6000:]


def _one_rank(body: str) -> subprocess.CompletedProcess:
    """Run ``body`` (which defines ``main``) under run_distributed in a one-rank group."""
    code = textwrap.dedent(
        """
        import sys
        import torch.distributed as dist
        from umlos_cuda.torch import run_distributed
        """
    ) + textwrap.dedent(body) + "\nrun_distributed(main, store=dist.HashStore(), rank=0, world_size=1)\n"
    return subprocess.run([sys.executable, "-c", code], env=environment(), capture_output=True, text=True,
                          timeout=LAUNCH_TIMEOUT_S)


@pytest.mark.parametrize(
    "body, status, says",
    [
        ("def main():\n    print('ran', dist.get_world_size())\n", 0, "ran 1"),  # a pipe buffers: flushed before exit
        ("def main():\n    return 3\n", 3, ""),
        ("def main():\n    sys.exit(4)\n", 4, ""),
        ("def main():\n    sys.exit('stopped: bad input')\n", 1, "stopped: bad input"),
        ("def main():\n    raise KeyError('boom')\n", 1, "KeyError: 'boom'"),
        ("def main():\n    return 'not a status'\n", 1, ""),
    ],
)
def test_exit_status_follows_main(body, status, says):
    done = _one_rank(body)
    assert done.returncode == status, done.stdout + done.stderr
    assert says in done.stdout + done.stderr


def test_atexit_handlers_run_and_the_group_is_destroyed():
    body = """
        import atexit
        def report():
            print("atexit ran; initialised:", dist.is_initialized())
        def main():
            atexit.register(report)
    """
    done = _one_rank(body)
    assert done.returncode == 0, done.stderr
    assert "atexit ran; initialised: False" in done.stdout
