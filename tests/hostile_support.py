"""The hostile-input harness: run one command or reader in a fenced subprocess and judge it.

Why a subprocess per case: a hostile file's worst outcomes are a hang, a
memory blow-up or a crash of the interpreter, and none of these can be caught
in-process. Each case therefore runs in a child with an address-space limit
(``RLIMIT_AS``), a CPU-time limit and a wall-clock timeout, its own empty
working folder, and no standard input. The verdict a case must reach is the
one the issue "Nothing lost, nothing trusted blindly" asks for:

* **refused with a documented code**: exit status ``EXIT_UMLOS_ERROR``, one line
  ``error CODE: message`` on stderr naming the file, no traceback;
* **bounded**: finished inside the limits (a kill by the limits is a failure,
  reported as such, never a pass);
* **nothing outside the target touched**: :func:`tree_state` before and after
  is equal for every path the case does not own.

Test modules ``tests/test_hostile_*.py`` build their cases with these helpers;
each case id starts with its class (``loss/``, ``hang/``, ``tamper/``,
``traceback/``, ``user/``) so the suite's counts by class can be read off
``pytest --collect-only -q tests/test_hostile_*.py``.
"""

from __future__ import annotations

import hashlib
import os
import resource
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterable, Sequence

from umlos_cuda.cli import EXIT_UMLOS_ERROR

#: Address space a case may map: numpy and the CLI need about 0.6 GiB of it;
#: a reader that trusts a size field asks for far more and fails fast.
MEMORY_LIMIT = 1536 * 1024 * 1024
#: CPU seconds and wall seconds: a bounded reader of this suite's small files
#: finishes in well under a second; these limits only catch hangs and loops.
CPU_LIMIT_S = 60
WALL_LIMIT_S = 90


@dataclass(frozen=True)
class Outcome:
    """What a fenced child did."""

    argv: tuple[str, ...]
    returncode: int | None  # None: killed by the wall-clock timeout
    stdout: str
    stderr: str
    seconds: float

    @property
    def hung(self) -> bool:
        return self.returncode is None

    def describe(self) -> str:
        tail = self.stderr[-2000:]
        return (f"argv={list(self.argv)} rc={self.returncode} after {self.seconds:.1f}s\n"
                f"stderr: {tail}\nstdout: {self.stdout[-500:]}")


def _limits(memory: int, cpu_s: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.setsid()  # its own process group: a timeout kills what it started too
    return apply


def fenced(argv: Sequence[str], cwd: str | os.PathLike[str], *, memory: int = MEMORY_LIMIT, cpu_s: int = CPU_LIMIT_S,
           wall_s: float = WALL_LIMIT_S, env: dict[str, str] | None = None) -> Outcome:
    """Run ``argv`` in ``cwd`` under the suite's limits; never raises on the child's behaviour."""
    child_env = dict(os.environ if env is None else env)
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    # One thread for BLAS: its spin threads would eat the CPU limit of a slow case.
    child_env.setdefault("OPENBLAS_NUM_THREADS", "1")
    start = time.monotonic()
    process = subprocess.Popen(list(argv), cwd=str(cwd), env=child_env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=_limits(memory, cpu_s))
    try:
        out, err = process.communicate(timeout=wall_s)
        code: int | None = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        out, err = process.communicate()
        code = None
    return Outcome(tuple(argv), code, out, err, time.monotonic() - start)


def cli(*args: str, cwd: str | os.PathLike[str], **limits) -> Outcome:
    """``umlos-cuda ARGS`` in a fenced child."""
    return fenced([sys.executable, "-m", "umlos_cuda.cli", *args], cwd, **limits)


def python(code: str, *args: str, cwd: str | os.PathLike[str], **limits) -> Outcome:
    """A Python snippet in a fenced child: for readers that have no command of their own."""
    return fenced([sys.executable, "-c", code, *args], cwd, **limits)


#: What :func:`python` snippets print when a reader raises UmlosError, so that
#: API cases are judged like commands. Use: ``python(API_PRELUDE + "reader(...)")``.
API_PRELUDE = (
    "import sys\n"
    "from umlos_cuda.errors import UmlosError\n"
    "def guarded(call):\n"
    "    try:\n"
    "        call()\n"
    "    except UmlosError as exc:\n"
    "        print(f'error {exc.code}: {exc.message}', file=sys.stderr)\n"
    f"        sys.exit({EXIT_UMLOS_ERROR})\n"
)


def assert_refused(outcome: Outcome, code: str | Iterable[str], *, names: str | os.PathLike[str] | None = None) -> None:
    """The child stopped inside its limits with ``error CODE: ...`` naming ``names`` and no traceback."""
    codes = (code,) if isinstance(code, str) else tuple(code)
    assert not outcome.hung, "hung (killed at the wall-clock limit)\n" + outcome.describe()
    assert outcome.returncode == EXIT_UMLOS_ERROR, outcome.describe()
    assert "Traceback" not in outcome.stderr, outcome.describe()
    lines = [line for line in outcome.stderr.splitlines() if line.startswith("error ")]
    assert len(lines) == 1, outcome.describe()
    assert any(lines[0].startswith(f"error {c}:") for c in codes), f"expected one of {codes}\n" + outcome.describe()
    if names is not None:
        assert str(names) in lines[0] or os.path.basename(str(names)) in lines[0], \
            f"the message does not name {names}\n" + outcome.describe()


def assert_ok(outcome: Outcome) -> None:
    """The child succeeded inside its limits."""
    assert not outcome.hung, "hung (killed at the wall-clock limit)\n" + outcome.describe()
    assert outcome.returncode == 0, outcome.describe()


def tree_state(root: str | os.PathLike[str]) -> dict[str, tuple]:
    """Every path under ``root`` (``root`` itself included) with its kind, mode, size and content digest.

    Symbolic links are recorded by their target and never followed, so a
    case that writes through a planted link shows up as a change of the file
    the link points to, wherever the test put that file under ``root``.
    """
    state: dict[str, tuple] = {}
    base = Path(root)

    def visit(path: Path) -> None:
        info = os.lstat(path)
        key = os.path.relpath(path, base)
        if stat.S_ISLNK(info.st_mode):
            state[key] = ("link", os.readlink(path))
        elif stat.S_ISDIR(info.st_mode):
            state[key] = ("dir", stat.S_IMODE(info.st_mode))
            for name in sorted(os.listdir(path)):
                visit(path / name)
        elif stat.S_ISREG(info.st_mode):
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if info.st_size <= 64 << 20 else "big"
            state[key] = ("file", stat.S_IMODE(info.st_mode), info.st_size, digest)
        else:
            state[key] = ("other", stat.S_IFMT(info.st_mode))

    visit(base)
    return state


def changed_paths(before: dict[str, tuple], after: dict[str, tuple]) -> set[str]:
    """Paths added, removed or changed between two :func:`tree_state` readings."""
    return {key for key in before.keys() | after.keys() if before.get(key) != after.get(key)}


def assert_untouched(before: dict[str, tuple], after: dict[str, tuple], *, owned: Iterable[str] = ()) -> None:
    """Nothing changed but the paths under ``owned`` (relative to the same root)."""
    owned = tuple(owned)
    stray = {p for p in changed_paths(before, after)
             if not any(p == o or p.startswith(o.rstrip("/") + "/") for o in owned)}
    assert not stray, f"changed outside the target: {sorted(stray)}"
