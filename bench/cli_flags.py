"""Census of the ``umlos-cuda`` command line's options: every command's flags, and the spellings of one concept.

**Method.** ``umlos_cuda.cli.build_parser()`` (every command module registered, as ``umlos-cuda --help`` builds it)
is walked recursively through its ``argparse`` sub-parsers; a sub-parser reached under two names (an alias) is
walked once, under its first name, the other names listed. A **command** is every parser reached, the top-level
one (``umlos-cuda``, whose one option is ``--version``) and the groups (``plan``, ``data lengths``) included. Its
**options** are the option strings (``--output``; a short ``-o`` counts as its own string) of its actions other than
``-h/--help``; its **positionals** the ``metavar`` (else ``dest``) of the actions without option strings, sub-parser
choices excepted.

The summary gives: the commands (and the leaves: commands without sub-commands), the option strings over all
commands (one command's ``--output`` and another's count twice), the distinct option strings, those used by one
command only, the actions with several option strings (synonyms), and for each concept of :data:`CONCEPTS` the
spellings found (option strings matching the concept's pattern) with the commands that use each; ``--quiet`` also
lists the leaf commands without it. Patterns, not lists, so that a spelling added later is found too.

With ``--visible`` the census counts only what ``--help`` shows: an option hidden from the help
(``help=SUPPRESS``) and the old spellings a renamed flag keeps as hidden aliases (an action's ``old_spellings``,
umlos_cuda/commands/_args.py) are left out, so a rename is counted once.

Usage::

    PYTHONPATH=$PWD python bench/cli_flags.py [--json] [--visible]
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys

#: concept -> pattern an option string of that concept matches (``re.fullmatch``).
CONCEPTS = {
    "output": r"--(out|output)(-dir|-folder|-path|-file)?|--workdir",
    "window": r"--.*window.*",
    "token source": r"--(lengths|tokens|store|source|sources|mix)",
    "end of sequence": r"--eos.*",
    "quiet": r"--(quiet|silent|verbose|no-progress)|-q",
    "sample order": r"--(sampling-mode|order|mode|modes)",
    "seed": r"--.*seed",
    "epoch": r"--epochs?",
}


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """``(path, parser, aliases, has_sub_commands)`` for ``parser`` and, depth first, every sub-parser under it."""
    subparsers = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    yield path, parser, subparsers
    for action in subparsers:
        seen: dict[int, str] = {}
        for name, child in action.choices.items():
            if id(child) not in seen:
                seen[id(child)] = name
                yield from walk(child, (*path, name))


def shown(action: argparse.Action, visible: bool) -> list[str]:
    """The option strings of ``action`` that count: all, or (``visible``) those ``--help`` shows."""
    if not visible:
        return list(action.option_strings)
    if action.help == argparse.SUPPRESS:
        return []
    hidden = getattr(action, "old_spellings", ())
    return [s for s in action.option_strings if s not in hidden]


def census(visible: bool = False) -> list[dict]:
    """One row per command: its name, aliases, options, synonyms (actions of several strings), positionals."""
    from umlos_cuda.cli import build_parser

    rows = []
    for path, parser, subparsers in walk(build_parser()):
        actions = [a for a in parser._actions if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)]
        aliases = sorted(name for action in subparsers for name, child in action.choices.items()
                         if name != next(n for n, c in action.choices.items() if c is child))
        rows.append({
            "command": " ".join(("umlos-cuda", *path)), "leaf": not subparsers, "aliases": aliases,
            "options": [s for a in actions for s in shown(a, visible)],
            "synonyms": [shown(a, visible) for a in actions if len(shown(a, visible)) > 1],
            "positionals": [a.metavar if isinstance(a.metavar, str) else a.dest
                            for a in actions if not a.option_strings],
        })
    return rows


def summary(rows: list[dict]) -> dict:
    """The counts of the module docstring's summary."""
    uses: collections.defaultdict[str, list[str]] = collections.defaultdict(list)
    for row in rows:
        for option in row["options"]:
            uses[option].append(row["command"].removeprefix("umlos-cuda").strip() or "umlos-cuda")
    concepts = {concept: {option: uses[option] for option in sorted(uses) if re.fullmatch(pattern, option)}
                for concept, pattern in CONCEPTS.items()}
    return {
        "commands": len(rows), "leaves": sum(row["leaf"] for row in rows),
        "option_strings": sum(len(row["options"]) for row in rows), "distinct_options": len(uses),
        "single_use": sorted(option for option, commands in uses.items() if len(commands) == 1),
        "synonyms": [synonym for row in rows for synonym in row["synonyms"]],
        "concepts": concepts,
        "leaves_without_quiet": [row["command"].removeprefix("umlos-cuda ") for row in rows
                                 if row["leaf"] and "--quiet" not in row["options"]],
    }


def print_report(rows: list[dict], totals: dict) -> None:
    """The per-command table, the summary table and the concepts' spellings, as markdown."""
    print("| command | options | option strings | positionals |\n|---|---:|---|---|")
    for row in rows:
        name = row["command"] + (f" ({', '.join(row['aliases'])})" if row["aliases"] else "")
        print(f"| `{name}` | {len(row['options'])} | {' '.join(row['options']) or '-'} "
              f"| {' '.join(row['positionals']) or '-'} |")
    print("\n| summary | count |\n|---|---:|")
    for key, label in (("commands", "commands (parsers, groups included)"), ("leaves", "leaf commands"),
                       ("option_strings", "option strings over all commands"),
                       ("distinct_options", "distinct option strings")):
        print(f"| {label} | {totals[key]} |")
    print(f"| option strings used by one command | {len(totals['single_use'])} |")
    print(f"| actions with several option strings | {len(totals['synonyms'])} |")
    print("\n| concept | spellings | spelling: commands |\n|---|---:|---|")
    for concept, spellings in totals["concepts"].items():
        listed = "; ".join(f"`{option}` ({len(commands)}): {', '.join(commands)}" for option, commands in
                           spellings.items())
        print(f"| {concept} | {len(spellings)} | {listed or '-'} |")
    print(f"\nleaf commands without --quiet ({len(totals['leaves_without_quiet'])}): "
          f"{', '.join(totals['leaves_without_quiet'])}")
    if totals["synonyms"]:
        print(f"synonyms: {'; '.join(' = '.join(synonym) for synonym in totals['synonyms'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the rows and the summary as one JSON object")
    parser.add_argument("--visible", action="store_true", help="count only the option strings --help shows")
    args = parser.parse_args()
    rows = census(args.visible)
    totals = summary(rows)
    if args.json:
        json.dump({"commands": rows, "summary": totals}, sys.stdout, indent=1)
        print()
    else:
        print_report(rows, totals)


if __name__ == "__main__":
    main()
