"""What ``umlos-cuda info``, ``umlos-cuda verify`` and the kind-specific ``plan info``/``plan verify`` share: the
flags of the keyword options an artifact's report and verify take, the refusal of a flag a kind does not take
(naming those it does), and the printed result.

``--source`` is the one flag for what an artifact is checked against: the lengths of a plan (its verify's
``lengths``), the token source of a batch folder (``store``).
"""

from __future__ import annotations

import json

from .. import errors
from ..errors import UmlosError

#: ``verify``'s flags, by the keyword option of an artifact's ``verify`` they set (``source``: see below).
VERIFY_FLAGS = {"windows": "--windows", "seed": "--seed", "source": "--source", "rebuild": "--no-rebuild",
                "expected_fingerprint": "--expected-fingerprint"}
#: The keyword options ``--source`` sets, the first a kind takes.
SOURCE_OPTIONS = ("lengths", "store")
#: ``info``'s flags, by the keyword option of an artifact's ``report`` they set.
INFO_FLAGS = {"world_size": "--world-size", "rank": "--rank"}


def add_verify_arguments(parser, *, store: bool = True) -> None:
    """The flags of every verify option (``store``: ``--source`` also names a batch folder's token source, and
    ``--store`` is its old spelling, as only ``umlos-cuda verify`` takes it)."""
    from ._args import add_option, non_negative_int, positive_int

    parser.add_argument("--expected-fingerprint", metavar="F", help="the fingerprint it must have")
    add_option(parser, "--source", old=("--lengths", "--store") if store else ("--lengths",), metavar="SOURCE",
               help="also check against this source: a plan's lengths (a length cache, its .u32, a token source)"
               + (", a batch folder's token source (the index layout needs it)" if store else ""))
    parser.add_argument("--no-rebuild", action="store_true", help="a whole plan: skip the rebuild check")
    parser.add_argument("--windows", metavar="N", type=positive_int("--windows"),
                        help="a windowed, mixed plan or pretraining sequences folder: replan (recount) N windows "
                        "of each epoch, chosen at random (default: all)")
    parser.add_argument("--seed", metavar="S", type=non_negative_int("--seed"), default=0,
                        help="with --windows: the seed that chooses the windows (default 0)")


def add_info_arguments(parser) -> None:
    from ._args import non_negative_int, positive_int

    parser.add_argument("--rank", type=non_negative_int("rank"), metavar="R", help="with --world-size: only this rank")
    parser.add_argument("--world-size", type=positive_int("world size"), metavar="W",
                        help="a plan: print each rank's share")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def given_options(args, flags: dict[str, str]) -> dict:
    """The options the command line set (a flag left at its default sets none; ``--seed`` only with
    ``--windows``, ``--no-rebuild`` sets ``rebuild=False``)."""
    given = {"windows": getattr(args, "windows", None), "source": getattr(args, "source", None),
             "expected_fingerprint": getattr(args, "expected_fingerprint", None),
             "rebuild": False if getattr(args, "no_rebuild", False) else None,
             "world_size": getattr(args, "world_size", None), "rank": getattr(args, "rank", None)}
    if given["windows"] is not None:
        given["seed"] = args.seed
    return {name: value for name, value in given.items() if value is not None and name in flags}


def check_options(path: str, kind: str, options: dict, accepted, flags: dict[str, str], operator: str) -> dict:
    """``options`` as the kind's keywords (``source`` renamed to the one of :data:`SOURCE_OPTIONS` it takes), or
    BATCHING_CONFIG_INVALID (INVALID_ARGUMENT outside the batching kinds) naming the flags a ``kind`` does not
    take among those given, and the ones it does."""
    takes_source = next((name for name in SOURCE_OPTIONS if name in accepted), None)
    accepted = set(accepted) | ({"source"} if takes_source else set())
    refused = [flags[name] for name in options if name not in accepted]
    if not refused:
        return {(takes_source if name == "source" else name): value for name, value in options.items()}
    takes = ", ".join(flags[name] for name in flags if name in accepted) or "no option"
    code = errors.BATCHING_CONFIG_INVALID if operator in (errors.BATCH_PLAN_OPERATOR, errors.BATCHING_OPERATOR) \
        else errors.INVALID_ARGUMENT
    raise UmlosError(code, f"{path} is a {kind} folder: {' and '.join(refused)} "
                     f"do{'es' if len(refused) == 1 else ''} not apply (it takes {takes})", operator=operator)


def report_kind(kind, path: str, args, accepted, operator: str) -> int:
    """Print ``kind``'s report of ``path`` (an :class:`~umlos_cuda.artifacts.Artifact` or a plan kind: a ``name``,
    a ``report`` and its ``lines``), as text or with ``--json`` the dict, with the options given that it takes."""
    options = check_options(path, kind.name, given_options(args, INFO_FLAGS), accepted, INFO_FLAGS, operator)
    report = kind.report(path, **options)
    print(json.dumps(report, indent=2) if args.json else "\n".join(kind.lines(report)))
    return 0


def verify_kind(kind, path: str, args, operator: str) -> int:
    """Run ``kind``'s ``verify`` on ``path`` with the options given that it takes, and print each check and the
    fingerprint."""
    options = check_options(path, kind.name, given_options(args, VERIFY_FLAGS), kind.verify_options, VERIFY_FLAGS,
                            operator)
    report = kind.verify(path, **options)
    for check in report["checks"]:
        print(f"ok  {check}")
    fingerprint = report.get("fingerprint")
    print(f"{kind.name} {path} verified" + ("" if fingerprint is None else f": fingerprint {fingerprint}"))
    return 0
