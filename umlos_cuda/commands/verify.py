"""``umlos-cuda verify PATH``: every check any artifact's own files allow, whatever its kind
(``umlos_cuda.artifacts``).

The kind is recognised from the path; its ``verify`` runs with the options given, each refused when the kind
does not take it. ``plan verify``, ``data verify``, ``batch check``, ``gym replay`` and ``checkpoint verify`` stay
for their own options and words.
"""

from __future__ import annotations

from ._artifacts import add_verify_arguments, verify_kind


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "verify", help="check any artifact against its own digests and rules: plans of every kind, shard sets, "
        "token stores, sharded stores, Megatron pairs, length caches, batch folders, gym runs, checkpoints",
        description="Recognise what PATH is and run every check its files allow: a plan's fingerprint and "
        "invariants, a store's digests and vocabulary, a batch folder's files, a gym run replayed, a checkpoint "
        "store's chain. Exit 2 with the failure code on the first mismatch.",
    )
    parser.add_argument("path", metavar="PATH")
    add_verify_arguments(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    from .. import errors
    from ..artifacts import artifact_of

    return verify_kind(artifact_of(args.path), args.path, args, errors.ARTIFACTS_OPERATOR)
