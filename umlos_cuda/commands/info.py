"""``umlos-cuda info PATH``: what any artifact holds, whatever its kind (``umlos_cuda.artifacts``).

The kind is recognised from the path (a folder's marker, a file's content, a prefix's name); its report is
printed as text or, with ``--json``, as the dict. ``plan info``, ``checkpoint inspect`` and friends stay for
their own options and words.
"""

from __future__ import annotations

from ._artifacts import add_info_arguments, report_kind


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "info", help="describe any artifact: a plan of any kind, a shard set, a token store, a sharded store, a "
        "Megatron pair, a length cache, a batch folder, a gym run, a checkpoint",
        description="Recognise what PATH is (a folder's umlos-artifact.json marker, a file's content, a Megatron "
        "prefix) and print what it holds. Exit 2 with ARTIFACT_UNKNOWN when no kind recognises it.",
    )
    parser.add_argument("path", metavar="PATH")
    add_info_arguments(parser)
    parser.set_defaults(func=run_info)


def run_info(args) -> int:
    from .. import errors
    from ..artifacts import artifact_of

    artifact = artifact_of(args.path)
    return report_kind(artifact, args.path, args, artifact.info_options, errors.ARTIFACTS_OPERATOR)
