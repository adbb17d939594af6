"""``umlos-cuda data tokenize``, ``data megatron`` and ``data megatron-export``: token sources for batch files.

``tokenize`` encodes a JSONL dataset once into a token store folder (flat
memory-mapped tokens, loss masks and offsets, and the length cache as a
by-product; docs/batching.md, "Token store"). ``megatron`` writes the
length cache of an existing Megatron-LM indexed dataset from its ``.idx``
sizes, so a plan is built over it without re-tokenizing; ``megatron-export``
goes the other way, writing a token store as a Megatron ``.bin``/``.idx``
pair. All are actions of the ``data`` command (umlos_cuda/commands/data.py registers them).
"""

from __future__ import annotations

from ._dataset_args import add_dataset_arguments, run_with_progress


def register_actions(actions) -> None:
    tokenize = actions.add_parser(
        "tokenize", help="encode a JSONL dataset into a token store (tokens, loss masks, offsets, lengths)",
        description="Encode every record of a JSONL dataset with a local tokenizer and write the token store folder "
        "OUTPUT: tokens.npy, loss_mask.npy and offsets.npy (memory-mappable), lengths.jsonl and its .u32 sidecar "
        "(the length cache), meta.json. What is encoded and the sample ids are as for `data lengths build`.",
    )
    add_dataset_arguments(tokenize, output_metavar="DIR", output_help="the token store folder to create",
                          verb="encode", force_help="replace an existing token store")
    tokenize.set_defaults(func=lambda args: run_tokenize(args, tokenize))

    megatron = actions.add_parser(
        "megatron", help="write the length cache of a Megatron-LM indexed dataset (.idx sizes)",
        description="Read PREFIX.idx and PREFIX.bin (Megatron-LM's MMapIndexedDataset format), check them, and write "
        "the length cache of their sequences (ids: row numbers), from which `plan build` makes a plan and "
        "`batch generate --store PREFIX` collates batches.",
    )
    megatron.add_argument("prefix", metavar="PREFIX", help="the dataset's path prefix (PREFIX.idx, PREFIX.bin)")
    megatron.add_argument("--output", required=True, metavar="LENGTHS.jsonl", help="the length cache to write")
    megatron.add_argument("--tokenizer", metavar="PATH", help="the tokenizer the dataset was made with: its "
                          "fingerprint is recorded (default: 'unknown')")
    megatron.add_argument("--force", action="store_true", help="replace existing output files")
    megatron.set_defaults(func=run_megatron)

    export = actions.add_parser(
        "megatron-export", help="write a token store as a Megatron-LM indexed dataset (PREFIX.bin, PREFIX.idx)",
        description="Write the token store STORE as PREFIX.bin and PREFIX.idx in Megatron-LM's MMapIndexedDataset "
        "layout, one document per sample, for megatron-core's IndexedDataset. uint16 stores stay uint16, uint32 "
        "stores become int32 (int64 if an id needs it); loss masks and sample ids are not carried.",
    )
    export.add_argument("store", metavar="STORE", help="the token store folder")
    export.add_argument("--output", required=True, metavar="PREFIX", help="the pair to write: PREFIX.bin, PREFIX.idx")
    export.add_argument("--force", action="store_true", help="replace an existing Megatron pair (never other files)")
    export.set_defaults(func=run_megatron_export)


def run_tokenize(args, parser) -> int:
    from ..batching.tokens.writer import tokenize_dataset

    store, elapsed = run_with_progress(args, parser, f"tokenize {args.output}", tokenize_dataset)
    print(f"wrote token store {args.output}: {len(store)} samples, {store.num_tokens} tokens "
          f"({store.meta['token_dtype']}), {int(store.loss_mask_array.sum(dtype='u8'))} trained on")
    print(f"tokenizer_hash {store.tokenizer_hash}")
    print(f"dataset_hash {store.dataset_hash}")
    print(f"{store.num_tokens / max(elapsed, 1e-9):.0f} tokens/s ({elapsed:.2f} s)")
    return 0


def run_megatron(args) -> int:
    from ..batching.lengths.fingerprints import tokenizer_fingerprint
    from ..batching.tokens.megatron import UNKNOWN_TOKENIZER, MegatronDataset

    tokenizer_hash = tokenizer_fingerprint(args.tokenizer) if args.tokenizer else UNKNOWN_TOKENIZER
    dataset = MegatronDataset.open(args.prefix, tokenizer_hash=tokenizer_hash)
    cache = dataset.length_cache()
    cache.write(args.output, force=args.force, inputs=(f"{args.prefix}.idx", f"{args.prefix}.bin", args.tokenizer))
    documents = max(int(dataset.document_indices.shape[0]) - 1, 0)
    print(f"wrote {args.output} and {args.output}.u32: {len(cache)} sequences ({documents} documents), "
          f"{dataset.num_tokens} tokens ({dataset.dtype}), tokenizer_hash {tokenizer_hash}")
    return 0


def run_megatron_export(args) -> int:
    from ..batching.tokens.export import export_megatron
    from ..batching.tokens.store import TokenStore

    store = TokenStore.open(args.store)
    dataset = export_megatron(store, args.output, force=args.force)
    masked = len(store.loss_mask_array) - int(store.loss_mask_array.sum(dtype="u8"))
    print(f"wrote {dataset.prefix}.bin and {dataset.prefix}.idx: {len(dataset)} sequences (one document each), "
          f"{dataset.num_tokens} tokens ({dataset.dtype})" + (f"; {masked} tokens the store masks are trained on "
                                                              "by Megatron (it has no loss mask)" if masked else ""))
    return 0
