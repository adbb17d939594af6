"""The ``umlos-cuda`` command line.

Each subcommand lives in its own module under ``umlos_cuda.commands`` and
exposes ``register(subparsers)``, which adds a parser whose ``func`` default
runs the command and returns an exit code. Adding a command is adding a file.
Every ``UmlosError`` becomes one line on stderr, ``error CODE: message``, and
exit status 2, so scripts can branch on the code.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from . import __version__, commands
from .errors import UmlosError

EXIT_UMLOS_ERROR = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="umlos-cuda",
        description="Reproducible, world-size-independent sample order for ML data loaders (NextBatch_v2).",
    )
    parser.add_argument("--version", action="version", version=f"umlos-cuda {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    try:
        return int(args.func(args) or 0)
    except UmlosError as exc:
        print(f"error {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_UMLOS_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `umlos-cuda ... | head`
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
