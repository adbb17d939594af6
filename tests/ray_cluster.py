"""A local Ray cluster of two worker nodes on this machine, for the tests and the bench of the Ray job.

What it starts (:class:`LocalRayCluster`): a head node with no CPU, so it
runs no task, and two worker nodes of one CPU each, every one a
``ray start --block`` child in its own session, on free ports, with its
files in a fresh temporary folder (``RAY_TMPDIR``, so nothing is shared
with another Ray on this machine: not ``/tmp/ray``, not its "current
cluster" file). A job connects with ``ray.init(address=cluster.address)``,
the same call a real cluster takes, and its tasks can only run on the two
worker nodes: two raylets, two object stores, work spread the way a
two-machine cluster spreads it. That is what ``ray.init(num_cpus=2)``
would not show: one raylet, and the driver's own node doing the work.

Stopping (:meth:`LocalRayCluster.stop`, also on any failure while
starting): SIGTERM to each ``ray start``, which stops its raylet and
workers; whatever of a session is still alive after a grace period is
SIGKILLed by process group; then every process of the three sessions must
be gone (``leftovers()``), else :class:`RuntimeError`. Only processes this
helper started are signalled: their session ids are those of its children.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

#: Seconds to wait for the two worker nodes to join, and for a node to stop after SIGTERM.
START_TIMEOUT_S = 90
STOP_GRACE_S = 20
#: What ``ray start`` logs once its node runs.
STARTED = b"Ray runtime started."


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ray_command() -> str:
    """The ``ray`` command beside this interpreter."""
    return os.path.join(os.path.dirname(sys.executable), "ray")


class LocalRayCluster:
    """``with LocalRayCluster() as cluster:`` a head and ``workers`` worker nodes of one CPU each
    (module docstring); ``cluster.address`` for ``ray.init``, ``cluster.env`` for child processes."""

    def __init__(self, workers: int = 2) -> None:
        self.workers = workers
        self.processes: list[subprocess.Popen] = []
        # short: Ray's unix sockets live under it, and a socket path is at most 107 bytes
        self.temp = tempfile.mkdtemp(prefix="umlos-ray-", dir="/tmp")
        # Token authentication (Ray's default for a new cluster) with a token of this cluster's own, in the
        # environment: never ~/.ray/auth_token, which another cluster of this user may have written.
        # No drain on SIGTERM (Ray's default waits up to 30 s for a node's work to move elsewhere: there is
        # no elsewhere, the whole cluster stops).
        self.env = dict(os.environ, RAY_TMPDIR=self.temp, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token",
                        RAY_AUTH_TOKEN=secrets.token_hex(32), RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0")
        for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH"):
            self.env.pop(name, None)
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"

    def __enter__(self) -> LocalRayCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _node_ports(self) -> list[str]:
        ports = ("--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
                 "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port")
        args = [arg for option in ports for arg in (option, str(free_port()))]
        return args + ["--min-worker-port", "0", "--max-worker-port", "0", "--object-store-memory", str(100 << 20),
                       "--disable-usage-stats", "--block"]

    def _spawn(self, name: str, args: list[str]) -> None:
        with open(os.path.join(self.temp, f"{name}.log"), "wb") as log:
            self.processes.append(subprocess.Popen([ray_command(), "start", *args, *self._node_ports()], env=self.env,
                                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                                   start_new_session=True))

    def start(self) -> None:
        """The nodes one after the other, each once the one before it runs: two nodes starting at once on
        one machine share a session folder and race for its log files (a raylet died of it)."""
        self._spawn("head", ["--head", "--port", str(self.port), "--num-cpus", "0", "--include-dashboard", "false",
                             "--temp-dir", self.temp])
        self._wait_started("head")
        for index in range(self.workers):
            self._spawn(f"worker-{index}", ["--address", self.address, "--num-cpus", "1"])
            self._wait_started(f"worker-{index}")
        self._wait_for_workers()

    def _wait_started(self, name: str) -> None:
        """Until ``ray start`` logs that its node runs (RuntimeError if it exits or takes too long)."""
        process = self.processes[-1]
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            with open(os.path.join(self.temp, f"{name}.log"), "rb") as log:
                if STARTED in log.read():
                    return
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Ray node {name} did not start\n{self.logs()}")
            time.sleep(0.1)

    def _wait_for_workers(self) -> None:
        """Until the cluster has ``workers`` CPUs (asked in a child, so this process never joins Ray)."""
        probe = ("import ray, sys, time\n"
                 "ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False)\n"
                 "deadline = time.monotonic() + float(sys.argv[3])\n"
                 "while ray.cluster_resources().get('CPU', 0) < int(sys.argv[2]):\n"
                 "    if time.monotonic() > deadline:\n"
                 "        sys.exit(f'only {ray.cluster_resources()} joined')\n"
                 "    time.sleep(0.2)\n")
        result = subprocess.run([sys.executable, "-c", probe, self.address, str(self.workers), str(START_TIMEOUT_S)],
                                env=self.env, capture_output=True, text=True, timeout=START_TIMEOUT_S + 30)
        if result.returncode != 0:
            raise RuntimeError(f"the local Ray cluster did not start: {result.stderr[-2000:]}\n{self.logs()}")

    def logs(self) -> str:
        text = []
        for name in sorted(os.listdir(self.temp)):
            if name.endswith(".log"):
                with open(os.path.join(self.temp, name), errors="replace") as handle:
                    text.append(f"--- {name}\n{handle.read()[-1500:]}")
        return "\n".join(text)

    def sessions(self) -> set[int]:
        return {process.pid for process in self.processes}  # each a session leader (start_new_session)

    def leftovers(self) -> dict[int, str]:
        """Live processes of this cluster, pid to command: those of its sessions, and any that left them
        but carries its ``RAY_TMPDIR`` (a unique folder) in its environment."""
        marker = f"RAY_TMPDIR={self.temp}".encode() + b"\0"
        found = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            try:
                with open(f"/proc/{pid}/stat") as handle:
                    if handle.read().rsplit(")", 1)[1].split()[0] == "Z":
                        continue  # a zombie: it has exited, only its parent has not reaped it yet
                if os.getsid(pid) not in self.sessions():
                    with open(f"/proc/{pid}/environ", "rb") as handle:
                        if marker not in handle.read():
                            continue
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    found[pid] = handle.read().replace(b"\0", b" ").decode(errors="replace")[:120]
            except (OSError, IndexError):
                continue  # gone meanwhile, or another user's
        return found

    def stop(self) -> None:
        """Stop every node (module docstring); raises RuntimeError if a process of theirs survives."""
        try:
            for process in reversed(self.processes):  # the workers first, the head last
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            for process in self.processes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(max(deadline - time.monotonic(), 0.1))
            for session in self.sessions():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(session, signal.SIGKILL)
            for process in self.processes:
                process.wait(10)
            deadline = time.monotonic() + 10
            while self.leftovers() and time.monotonic() < deadline:
                time.sleep(0.2)
            left = self.leftovers()
            for pid in left:  # outside the sessions: killed one by one, each known to be this cluster's
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if left:
                raise RuntimeError("processes of the local Ray cluster survived it: "
                                   + "; ".join(f"{pid} {command}" for pid, command in left.items()))
        finally:
            shutil.rmtree(self.temp, ignore_errors=True)
