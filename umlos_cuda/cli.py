"""The ``umlos-cuda`` command line.

Each subcommand lives in its own module under ``umlos_cuda.commands`` and
exposes ``register(subparsers)``, which adds a parser whose ``func`` default
runs the command and returns an exit code. Adding a command is adding a file.

Exit status: 0 on success, 1 when a check or verification fails, 2 on a usage
error (argparse) and on every ``UmlosError``, which becomes one line on stderr,
``error CODE: message``, so scripts can branch on the code. Ctrl-C exits with
130 and SIGTERM or SIGHUP (what schedulers and closing terminals send) with
128 + the signal number, after the same clean-up as any failure: a
half-written output file never stays behind.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import pkgutil
import signal
import sys
import threading
from collections.abc import Iterator

from . import __version__, commands
from .commands._args import Parser
from .commands._config import expand_config
from .errors import UmlosError

EXIT_UMLOS_ERROR = 2
#: Signals turned into a clean exit (SIGINT already is: KeyboardInterrupt).
TERMINATING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Terminated(BaseException):
    """Raised in the main thread when a terminating signal arrives, so that
    ``finally`` blocks and context managers clean up as for Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command; with ``command``, the name of a command module that registers
    the command of its own name (``plan``, ``data``, ...), of that command alone (its module is
    the only one imported: ``umlos-cuda plan build`` starts without importing what the other
    commands use). What it parses, and its usage and error lines, are the same: the top-level
    usage names ``COMMAND``, not the list of commands."""
    parser = Parser(
        prog="umlos-cuda",
        description="Reproducible, world-size-independent sample order for ML data loaders (NextBatch_v2).",
        epilog="Every command takes --config FILE: its flags from a YAML or JSON file (docs/cli.md).",
    )
    parser.add_argument("--version", action="version", version=f"umlos-cuda {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    names = sorted(info.name for info in pkgutil.iter_modules(commands.__path__) if not info.name.startswith("_"))
    if command in names:
        names = [command]
    for name in names:
        module = importlib.import_module(f"{commands.__name__}.{name}")
        module.register(subparsers)
    if len(names) == 1 and command not in subparsers.choices:  # (no module registers another name than its own)
        return build_parser()
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(item == "--config" or item.startswith("--config=") for item in argv):
        try:
            argv = expand_config(argv)  # the file's flags, where --config stands (commands/_config.py)
        except UmlosError as exc:
            print(f"error {exc.code}: {exc.message}", file=sys.stderr)
            return EXIT_UMLOS_ERROR
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    try:
        with _terminating_signals_raise():
            return int(args.func(args) or 0)
    except UmlosError as exc:
        print(f"error {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_UMLOS_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except Terminated as exc:
        print(f"terminated by {signal.Signals(exc.signum).name}", file=sys.stderr)
        return 128 + exc.signum
    except BrokenPipeError:  # `umlos-cuda ... | head`
        return 0


@contextlib.contextmanager
def _terminating_signals_raise() -> Iterator[None]:
    """While a command runs, make SIGTERM and SIGHUP raise :class:`Terminated`.

    Only signals left at their default action are taken over (a signal the
    parent ignores, as ``nohup`` does with SIGHUP, stays ignored), only in the
    main thread (where Python delivers signals), and the previous handlers
    come back afterwards, so calling ``main`` in-process changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}

    def handler(signum, frame):
        raise Terminated(signum)

    for signum in TERMINATING_SIGNALS:
        if signal.getsignal(signum) == signal.SIG_DFL:
            previous[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
