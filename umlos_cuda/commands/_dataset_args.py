"""What the commands that encode a dataset share: their arguments and
their run with a progress line (``data lengths build``, ``data tokenize``).

Both read the dataset the same way (umlos_cuda/batching/lengths/builder.py),
so they take the same options: the dataset (one or more paths or globs, in
any format of umlos_cuda/batching/records/, ``--format`` to override the
suffix), the tokenizer, one text field, a prompt and a response field, a
prompt, a chosen and a rejected field (preference pairs), a prompt, a
completion and a label field (unpaired preference records), these as lists
of messages (``--conversational``, and then pairs without a prompt field),
or a messages field (and its chat template), the id field, the end-of-sequence token, the
chunk size, the number of workers (``--workers``, default the cores this
process may run on), ``--force`` and ``--quiet``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ._args import add_option, positive_int

#: What ``data lengths build`` and ``data tokenize`` read, in the words of every help text that says so (the
#: formats of umlos_cuda/batching/records/shards.py; docs/batching.md, "Your data: Parquet, datasets, JSONL").
DATASET_FORMATS = "Parquet, JSONL, gzip or zstd JSONL, Arrow IPC, or a datasets save_to_disk folder; one file or shards"


def add_dataset_arguments(parser, *, output_metavar: str, output_help: str, verb: str, force_help: str,
                          required_tokenizer: bool = True) -> None:
    """The options of a command that encodes a dataset; ``verb`` says what it
    does to the text (``count``, ``encode``)."""
    parser.add_argument("--dataset", required=True, nargs="+", metavar="DATA",
                        help="the dataset: a Parquet file (.parquet, .pq), a JSONL file (.jsonl, .jsonl.gz, "
                        ".jsonl.zst), an Arrow IPC file (.arrow, .feather, .ipc), a folder datasets' save_to_disk "
                        "wrote, or several shards (paths or quoted globs such as 'train-*.parquet', read in the "
                        "order given, each glob's matches sorted); an s3:// (gs://, az://) URL of a file or a "
                        "folder is copied to a private temporary folder first (docs/object-stores.md)")
    parser.add_argument("--format", metavar="FORMAT",
                        help="read the dataset as this format whatever its suffix: jsonl, jsonl.gz, jsonl.zst, "
                        "parquet, arrow or hf (a save_to_disk folder)")
    parser.add_argument("--tokenizer", metavar="PATH", required=required_tokenizer,
                        help="tokenizer.json, or a directory with tokenizer.json (and tokenizer_config.json)")
    parser.add_argument("--output", required=True, metavar=output_metavar, help=output_help)
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--text-field", metavar="F", help=f"{verb} the string field F (default: text)")
    what.add_argument("--prompt-field", metavar="P",
                      help=f"with --response-field: {verb} the instruction template of P and R plus the "
                      "end-of-sequence token (docs/batching.md, 'Prompt and response records')")
    what.add_argument("--messages-field", metavar="F",
                      help=f"{verb} the chat records of field F (a list of {{role, content}} messages) rendered with "
                      "the tokenizer's chat template, in the workers, under the render budget "
                      "(UMLOS_CHAT_RENDER_CPU_S, _WALL_S, _MEMORY_MIB); the token store's loss mask is 1 on the "
                      "assistant turns (docs/batching.md, 'Chat records')")
    parser.add_argument("--response-field", metavar="R", help="the response field, with --prompt-field")
    parser.add_argument("--chosen-field", metavar="C",
                        help=f"with --prompt-field and --rejected-field: preference records, two rows each ({verb} "
                        "template(P) + C and template(P) + R, ids <id>/chosen and <id>/rejected; docs/batching.md, "
                        "'Preference pairs')")
    parser.add_argument("--rejected-field", metavar="R", help="the rejected completion's field, with --chosen-field")
    parser.add_argument("--completion-field", metavar="C",
                        help="with --prompt-field and --label-field: unpaired preference records (KTO), one row each, "
                        "id <id>/desirable when the label is true, <id>/undesirable when false (docs/batching.md, "
                        "'Preference data')")
    parser.add_argument("--label-field", metavar="L", help="the boolean label's field (true: desirable), with "
                        "--completion-field")
    parser.add_argument("--conversational", action="store_true",
                        help="the preference fields are lists of messages (TRL's conversational form), rendered with "
                        "the tokenizer's chat template and tokenized as TRL does, the loss on the completion; pairs "
                        "may then leave --prompt-field out: the messages chosen and rejected share are the prompt")
    parser.add_argument("--chat-template", metavar="FILE",
                        help="with --messages-field or --conversational: render with this Jinja template instead of "
                        "the tokenizer's own")
    parser.add_argument("--id-field", default="id", metavar="F", help="the field holding the sample id (default: id)")
    add_option(parser, "--eos", old=("--eos-token",), dest="eos_token", metavar="TOKEN",
               help="the end-of-sequence token's text, for --prompt-field when the tokenizer directory names none "
               "(a bare tokenizer.json never does)")
    parser.add_argument("--chunk-size", type=positive_int("chunk size"), default=4096, metavar="N",
                        help="records encoded together (default 4096; chat and conversational records at most "
                        "1024, so that the workers share them evenly)")
    parser.add_argument("--workers", type=positive_int("workers"), metavar="N",
                        help=f"processes that {verb} chunks side by side, the output the same byte for byte for every "
                        "N (default: the cores this process may run on; 1: one thread beside the reader)")
    parser.add_argument("--skip-bad-lines", action="store_true",
                        help="skip lines that are not a record (not JSON, not an object, a field missing or of another "
                        "type, blank between records) and report how many, instead of stopping at the first")
    parser.add_argument("--force", action="store_true", help=force_help)
    parser.add_argument("--quiet", action="store_true", help="no progress line")


def run_with_progress(args, parser, label: str, build: Callable[..., Any]) -> tuple[Any, float]:
    """``build(dataset, tokenizer, output, **options)`` with a progress line
    on stderr; returns its result and the seconds it took. With
    ``--skip-bad-lines`` it prints how many lines were skipped (and why, for
    the first few)."""
    from ..batching.lengths.preference import preference_kind
    from ..batching.records.chunk import SkippedLines
    from ..errors import UmlosError
    from ..remote.inputs import staged_dataset
    from ._progress import Progress

    preference = {"chosen_field": args.chosen_field, "rejected_field": args.rejected_field,
                  "completion_field": args.completion_field, "label_field": args.label_field}
    try:  # the library's one check of which preference fields go together, as a usage error
        kind = preference_kind(text_field=args.text_field, prompt_field=args.prompt_field,
                               response_field=args.response_field, messages_field=args.messages_field,
                               conversational=args.conversational, **preference)
    except UmlosError as exc:
        parser.error(exc.message)
    if kind is None and (args.prompt_field is None) != (args.response_field is None):
        parser.error("--prompt-field and --response-field go together")
    if args.chat_template is not None and args.messages_field is None and not args.conversational:
        parser.error("--chat-template goes with --messages-field or --conversational")
    progress = Progress(1, label, enabled=not args.quiet, unit="B")  # the builders report bytes read

    def report(done: int, total: int) -> None:
        progress.total = max(total, 1)
        progress.update(done)

    skipped = SkippedLines() if args.skip_bad_lines else None
    dataset = args.dataset[0] if len(args.dataset) == 1 else args.dataset
    extra = {"length_field": args.length_field} if getattr(args, "length_field", None) is not None else {}
    if args.tokenizer is None and not extra:
        parser.error("--tokenizer is required (only --length-field goes without one)")
    from ..batching.lengths.workers import available_cores

    workers = args.workers if args.workers is not None else available_cores()
    start = time.perf_counter()
    try:
        with staged_dataset(dataset) as local:  # object-store URLs copied to a private folder first
            result = build(local, args.tokenizer, args.output, text_field=args.text_field,
                           prompt_field=args.prompt_field, response_field=args.response_field,
                           id_field=args.id_field, eos_token=args.eos_token, force=args.force,
                           chunk_size=args.chunk_size, progress=report, skipped=skipped,
                           messages_field=args.messages_field, chat_template=args.chat_template, format=args.format,
                           workers=workers, **extra,
                           **({**preference, "conversational": args.conversational} if kind is not None else {}))
    finally:
        progress.close()
    if skipped is not None:
        print(f"skipped {skipped.count} bad line{'' if skipped.count == 1 else 's'} of {' '.join(args.dataset)}"
              + "".join(f"\n  {message}" for message in skipped.first)
              + (f"\n  ... and {skipped.count - len(skipped.first)} more"
                 if skipped.count > len(skipped.first) else ""))
    return result, time.perf_counter() - start
