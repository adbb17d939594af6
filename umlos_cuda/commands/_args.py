"""Argument types shared by the commands: integers checked where they are
parsed, so ``--rank -1`` says what is wrong in the user's words (argparse
prints usage and exits with status 2) instead of a failure code about the
manifest."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def non_negative_int(what: str) -> Callable[[str], int]:
    """An argparse ``type`` accepting 0, 1, 2, ...; ``what`` names the value in the error."""
    return _integer(what, 0, "a non-negative integer")


def positive_int(what: str) -> Callable[[str], int]:
    """An argparse ``type`` accepting 1, 2, 3, ...; ``what`` names the value in the error."""
    return _integer(what, 1, "a positive integer")


def _integer(what: str, lowest: int, kind: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            value = None
        if value is None or value < lowest:
            raise argparse.ArgumentTypeError(f"{what} must be {kind}, got {text!r}")
        return value

    parse.__name__ = kind  # argparse names the type in some messages
    return parse


def add_pack_arguments(parser: argparse.ArgumentParser, *, what: str, default_max_len: int) -> None:
    """``--pack``, ``--pack-mode``, ``--pack-max-len`` and ``--pack-separator-len``
    (a :class:`~umlos_cuda.batching.packing.config.PackingConfig`), one spelling
    for every command that builds packed plans; ``what`` says what packs."""
    parser.add_argument("--pack", action="store_true",
                        help=f"{what}: microbatches of token-budget // pack-max-len rows, each row several samples")
    parser.add_argument("--pack-mode", choices=("first_fit", "best_fit", "greedy"), default="first_fit",
                        help="which row a sample goes into (default first_fit)")
    parser.add_argument("--pack-max-len", type=positive_int("pack max len"), default=default_max_len, metavar="L",
                        help=f"tokens per packed row (default {default_max_len})")
    parser.add_argument("--pack-separator-len", type=non_negative_int("pack separator len"), default=0, metavar="K",
                        help="separator tokens between the samples of a row (default 0)")


def add_no_verify_argument(parser: argparse.ArgumentParser, *, reads: str) -> None:
    """``--no-verify``: one spelling for every command that derives new files
    from a plan or a token store, which re-hashes ``reads`` against their
    recorded digests by default (docs/batching.md, "What is checked when")."""
    parser.add_argument("--no-verify", action="store_true",
                        help=f"skip re-hashing {reads} against the digests recorded beside them (default: check, "
                        "so that a file changed after it was written is refused; the structure is always checked)")


#: Short names for the engine's sampling modes.
MODE_ALIASES = {
    "shuffle": "SHUFFLE_WITHOUT_REPLACEMENT_BLOCK_AFFINE_V1",
    "sequential": "SEQUENTIAL_V1",
    "streaming": "STREAMING_SHUFFLE_BLOCK_AFFINE_V1",
}
