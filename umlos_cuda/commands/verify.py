"""``umlos-cuda verify PATH``: every check any artifact's own files allow, whatever its kind
(``umlos_cuda.artifacts``).

The kind is recognised from the path; its ``verify`` runs with the options given, each refused when the kind
does not take it. ``plan verify``, ``data verify``, ``batch check``, ``gym replay`` and ``checkpoint verify`` stay
for their own options and words.
"""

from __future__ import annotations

from ._artifacts import VERIFY_FLAGS, add_verify_arguments, check_options, given_options, print_verified


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
    parser.set_defaults(func=run_verify)


def run_verify(args) -> int:
    from .. import errors
    from ..artifacts import artifact_of

    artifact = artifact_of(args.path)
    options = given_options(args, VERIFY_FLAGS)
    options = check_options(args.path, artifact.name, options, artifact.verify_options, VERIFY_FLAGS,
                            errors.ARTIFACTS_OPERATOR)
    print_verified(artifact.name, args.path, artifact.verify(args.path, **options))
    return 0
