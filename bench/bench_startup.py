"""Start-up cost of the command line and of importing the batching package, each in fresh interpreters.

What it measures, for each case of :data:`CASES`:

* ``umlos-cuda --help`` and ``umlos-cuda plan build --help``: ``python -c MAIN ARGS``, where ``MAIN`` is what the
  console script runs (``pyproject.toml``: ``umlos-cuda = "umlos_cuda.cli:main"``), so that ``PYTHONPATH`` picks
  the checkout whose code runs;
* ``import umlos_cuda.batching`` (the package) and ``import umlos_cuda.batching.plans.plan`` (a leaf module);
* ``python -c pass``, the bare interpreter, for reference.

**Wall time**: ``--runs`` (default 15) fresh interpreters per case, each timed from ``subprocess.run`` to its
exit (``time.perf_counter``), output discarded; one untimed run per case first (so ``.pyc`` files exist), then the
cases taken in turn (round robin, so that a slow moment of a shared machine falls on all of them). The table gives
the median and the smallest of the runs, in milliseconds.

**Modules**: one more interpreter per case runs the same code and then prints, on stderr, the keys of
``sys.modules``: ``umlos_cuda`` counts the keys equal to ``umlos_cuda`` or starting with ``umlos_cuda.``; ``all``
counts every key (the standard library and third-party packages included); ``third-party`` names the top-level
packages loaded that are neither ``umlos_cuda`` nor in ``sys.stdlib_module_names`` (nor private, ``_``-prefixed).
A CLI case calls ``main`` inside ``try``/``except SystemExit`` and counts after it (``--help`` exits).

The children run in a temporary folder (``python -c`` puts the working folder first on ``sys.path``: never a
checkout's root), with ``PYTHONPATH`` the checkout to measure (default: ``$PYTHONPATH``, else the working folder),
and the path of the ``umlos_cuda/__init__.py`` they imported is printed, to show which one it was. Usage::

    PYTHONPATH=$PWD python bench/bench_startup.py [--runs 15] [--pythonpath CHECKOUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

MAIN = "import sys; from umlos_cuda.cli import main; sys.exit(main(sys.argv[1:]))"

#: Prints on stderr, after the case's code ran, the module counts (module docstring) as one JSON line.
COUNT = """
import json, sys
names = list(sys.modules)
umlos = [n for n in names if n == "umlos_cuda" or n.startswith("umlos_cuda.")]
tops = sorted({n.split(".")[0] for n in names} - set(sys.stdlib_module_names) - {"umlos_cuda", "__main__"})
root = sys.modules.get("umlos_cuda")
print(json.dumps({"umlos_cuda": len(umlos), "all": len(names), "third_party": [t for t in tops if t[0] != "_"],
                  "file": getattr(root, "__file__", None)}), file=sys.stderr)
"""

CLI_COUNT = "import sys\nfrom umlos_cuda.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"

#: name -> (code run by ``python -c``, its arguments).
CASES: dict[str, tuple[str, list[str]]] = {
    "python -c pass": ("pass", []),
    "umlos-cuda --help": (MAIN, ["--help"]),
    "umlos-cuda plan build --help": (MAIN, ["plan", "build", "--help"]),
    "import umlos_cuda.batching": ("import umlos_cuda.batching", []),
    "import umlos_cuda.batching.plans.plan": ("import umlos_cuda.batching.plans.plan", []),
}


def counting_code(code: str) -> str:
    """The case's code followed by :data:`COUNT`; a CLI case calls ``main`` without letting it exit."""
    return (CLI_COUNT if code == MAIN else code + "\n") + COUNT


def wall_ms(code: str, args: list[str], env: dict, cwd: str) -> float:
    """One fresh interpreter running ``code``: its wall time in milliseconds."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True)
    return (time.perf_counter() - started) * 1000


def modules(code: str, args: list[str], env: dict, cwd: str) -> dict:
    """The module counts of one more run of ``code`` (the last line of its stderr)."""
    child = subprocess.run([sys.executable, "-c", counting_code(code), *args], env=env, cwd=cwd,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=True)
    return json.loads(child.stderr.strip().splitlines()[-1])


def measure(runs: int, env: dict, cwd: str) -> dict[str, dict]:
    """Per case: its wall times (round robin over the cases after one untimed run each) and module counts."""
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for code, args in CASES.values():
        wall_ms(code, args, env, cwd)
    for _ in range(runs):
        for name, (code, args) in CASES.items():
            times[name].append(wall_ms(code, args, env, cwd))
    return {name: {"times": times[name], **modules(code, args, env, cwd)} for name, (code, args) in CASES.items()}


def table(results: dict[str, dict]) -> str:
    """The markdown table of :func:`measure`'s results."""
    lines = ["| case | median ms | min ms | umlos_cuda modules | all modules | third-party packages |",
             "|---|---:|---:|---:|---:|---|"]
    for name, row in results.items():
        lines.append(f"| `{name}` | {statistics.median(row['times']):.0f} | {min(row['times']):.0f} | "
                     f"{row['umlos_cuda']} | {row['all']} | {', '.join(row['third_party']) or '-'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="fresh interpreters per case (default 15)")
    parser.add_argument("--pythonpath", default=os.environ.get("PYTHONPATH", os.getcwd()),
                        help="the checkout to measure (default: $PYTHONPATH, else the working folder)")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": os.path.abspath(args.pythonpath)}
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as cwd:
        results = measure(args.runs, env, cwd)
    files = {row["file"] for row in results.values() if row["file"]}
    print(f"{args.runs} runs per case; python {sys.version.split()[0]}; umlos_cuda from {', '.join(sorted(files))}\n")
    print(table(results))


if __name__ == "__main__":
    main()
