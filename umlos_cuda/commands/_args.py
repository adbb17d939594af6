"""What every command's arguments share: one spelling per concept, old spellings hidden, and argument
types checked where they are parsed.

One vocabulary (docs/cli.md): ``--source`` names what a command reads lengths or tokens from, ``--output``
what it writes, ``--order`` the engine's order, ``--eos`` the end-of-sequence token, ``--window`` a window's
size, ``--quiet`` no progress line. A renamed flag keeps its old spelling for a release as a hidden alias of
the same action (:func:`add_option`): it parses as before and the help shows only the new one
(:class:`Parser`, the parser class of every command). Integers are checked where they are parsed, so
``--rank -1`` says what is wrong in the user's words (argparse prints usage and exits with status 2)
instead of a failure code about the manifest.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable

from .. import checks

#: The most integers a comma-separated flag holds (bucket edges, separator ids): far more than any use.
MAX_LIST_ITEMS = 1 << 16


class HidingFormatter(argparse.HelpFormatter):
    """A help formatter that leaves out the old spellings :func:`add_option` marks on an action."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        hidden = getattr(action, "old_spellings", ())
        if hidden:
            action = copy.copy(action)
            action.option_strings = [text for text in action.option_strings if text not in hidden]
        return super()._format_action_invocation(action)


class Parser(argparse.ArgumentParser):
    """The parser class of every command and subcommand (its subparsers are of this class too)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HidingFormatter)
        super().__init__(*args, **kwargs)


def add_option(parser: argparse.ArgumentParser, *spellings: str, old: tuple[str, ...] = (),
               **kwargs) -> argparse.Action:
    """``parser.add_argument(*spellings, **kwargs)`` that also parses each ``old`` spelling (a renamed flag, kept
    for a release), which the help does not show."""
    action = parser.add_argument(*spellings, *old, **kwargs)
    action.old_spellings = frozenset(old)  # type: ignore[attr-defined]  # read by HidingFormatter
    return action


def non_negative_int(what: str) -> Callable[[str], int]:
    """An argparse ``type`` accepting 0, 1, 2, ...; ``what`` names the value in the error."""
    return _integer(what, 0, "a non-negative integer")


def positive_int(what: str) -> Callable[[str], int]:
    """An argparse ``type`` accepting 1, 2, 3, ...; ``what`` names the value in the error."""
    return _integer(what, 1, "a positive integer")


def any_int(what: str) -> Callable[[str], int]:
    """An argparse ``type`` accepting any integer, for a value whose range the command checks itself (with its
    own failure code); ``what`` names the value in the error."""
    return _integer(what, None, "an integer")


def _integer(what: str, lowest: int | None, kind: str) -> Callable[[str], int]:
    """The one integer flag parser: the text read by ``checks.integer_text`` (ASCII digits only, at most 40
    characters, checked before ``int()``), at least ``lowest``, failing as argparse's usage error in the user's
    words. Past 40 characters is past any count; below that, an upper bound is the command's (its own code)."""
    def parse(text: str) -> int:
        value = checks.integer_text(text, what, None, None, fail=argparse.ArgumentTypeError,
                                    message=f"{{name}} must be {kind}, got {{value!r}}")
        if lowest is not None and value < lowest:
            raise argparse.ArgumentTypeError(f"{what} must be {kind}, got {text!r}")
        return value

    parse.__name__ = kind  # argparse names the type in some messages
    return parse


def integer_list(text: str, what: str, low: int | None, high: int | None, *, fail: checks.Fail,
                 max_items: int = MAX_LIST_ITEMS) -> tuple[int, ...]:
    """The integers of a comma-separated flag (``--bucket-edges 128,256``, ``--separator-ids 1,2``), each read
    by ``checks.integer_text`` in ``[low, high]`` (None: the caller checks that side), at most ``max_items``
    of them (counted before any is read); blank text is no integers. ``fail``: the command's own failure (its
    code), with a message that names ``what`` and shows the text."""
    if not text.strip():
        return ()
    items = text.split(",", max_items)
    if len(items) > max_items:
        raise fail(f"{what} takes at most {max_items} comma-separated integers")
    bounds = f" in [{low}, {high}]" if low is not None and high is not None else ""
    shown = repr(text) if len(text) <= checks.SHOWN_CHARS else repr(text[:checks.SHOWN_CHARS]) + "..."
    words = checks.literal(f"{what} must be comma-separated integers{bounds}, got {shown}")
    return tuple(checks.integer_text(item.strip(), what, low, high, fail=fail, message=words) for item in items)


def integer_pair(what: str, *, optional_second: bool = False) -> Callable[[str], tuple[int, int | None]]:
    """An argparse ``type`` for ``A:B`` (two non-negative integers, each read as :func:`non_negative_int` reads
    one), or ``A`` alone when ``optional_second`` (then ``(A, None)``); ``what`` names the value in the error."""
    one = non_negative_int(what)

    def parse(text: str) -> tuple[int, int | None]:
        head, colon, tail = text.partition(":")
        if not colon and not optional_second:
            raise argparse.ArgumentTypeError(f"{what} must be two non-negative integers A:B, got {text!r}")
        return one(head), one(tail) if colon else None

    parse.__name__ = "A:B"
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


def add_order_argument(parser: argparse.ArgumentParser) -> None:
    """``--order ORDER`` of a plan: ``shuffle`` (default), ``sequential``, ``streaming``, a shuffle's mode
    (``block_affine``, ``feistel``, ``block_feistel``), ``KIND:MODE`` (``streaming:feistel``) or the engine's mode
    string; the former ``--sampling-mode KIND`` still parses (hidden), ``--order MODE`` then naming the mode."""
    from ..modes import mode_names

    parser.add_argument("--order", default=None, metavar="ORDER",
                        help=f"the engine order: {', '.join(MODE_ALIASES)}, a shuffle's mode ({', '.join(mode_names())}"
                        "), or KIND:MODE such as streaming:feistel (default shuffle, block_affine; "
                        "docs/sampling-modes.md)")
    parser.add_argument("--sampling-mode", default=None, help=argparse.SUPPRESS)  # before --order took both


def resolve_order(args: argparse.Namespace) -> tuple[str, str]:
    """``(stage, mode)`` of :func:`add_order_argument`'s flags: the engine's mode string and the sampling mode."""
    from ..modes import DEFAULT_MODE, mode_names

    kind, mode = args.sampling_mode, DEFAULT_MODE
    spec = args.order
    if spec is not None:
        head, _, tail = spec.partition(":")
        if tail:
            kind, mode = kind or head, tail
        elif head in mode_names():
            mode = head
        else:
            kind = kind or head
    kind = kind or "shuffle"
    return MODE_ALIASES.get(kind, kind), mode
