"""``umlos-cuda data tokenize``, ``data append``, ``data verify``, ``data megatron`` and ``data megatron-export``.

``tokenize`` encodes a dataset (any format of umlos_cuda/batching/records/) once into a token store folder (flat
memory-mapped tokens, loss masks and offsets, and the length cache as a
by-product; docs/batching.md, "Token store"). ``megatron`` writes the
length cache of an existing Megatron-LM indexed dataset from its ``.idx``
sizes, so a plan is built over it without re-tokenizing; ``megatron-export``
goes the other way, writing a token store as a Megatron ``.bin``/``.idx``
pair. ``tokenize --output s3://...`` writes the store on disk aside, then
publishes it into the object store, its ``meta.json`` last
(umlos_cuda/remote/publish.py). ``tokenize --sharded`` writes a sharded
token store (one shard per input file; ``--engine ray`` writes the same store with a Ray Data job),
``tokenize --append`` adds new input files to one, ``append``
adopts token stores written elsewhere as its next shards, and ``verify``
checks any token source against its own digests. All are actions of the
``data`` command (umlos_cuda/commands/data.py registers them).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from functools import partial

from ..remote.inputs import has_remote
from ..remote.urls import is_remote
from ._dataset_args import DATASET_FORMATS, add_dataset_arguments, run_with_progress


def register_actions(actions) -> None:
    tokenize = actions.add_parser(
        "tokenize", help=f"encode a dataset's text, prompt/response, chat or preference records into a token store "
        f"({DATASET_FORMATS})",
        description=f"Encode every record of a dataset ({DATASET_FORMATS}) with a local tokenizer and write the token "
        "store folder "
        "OUTPUT: tokens.npy, loss_mask.npy and offsets.npy (memory-mappable), lengths.jsonl and its .u32 sidecar "
        "(the length cache), meta.json. What is encoded and the sample ids are as for `data lengths build`.",
    )
    add_dataset_arguments(tokenize, output_metavar="DIR", output_help="the token store folder to create (or an "
                          "s3://, gs://, az:// URL to publish it at, its meta.json last: docs/object-stores.md)",
                          verb="encode", force_help="replace an existing token store")
    tokenize.add_argument("--sharded", action="store_true",
                          help="write a sharded token store: one shard per input file, rows named as in the whole "
                          "dataset (docs/batching.md, 'Sharded token stores')")
    tokenize.add_argument("--append", action="store_true",
                          help="add the input files as new shards of the existing sharded store DIR (newly arrived "
                          "files of a growing dataset); implies --sharded")
    tokenize.add_argument("--engine", choices=("local", "ray"), default="local",
                          help="where the work runs: local (this machine; the default) or ray (a Ray Data job, one "
                          "task per input file, writing the sharded token store --sharded writes, byte for byte; "
                          "implies --sharded; needs pip install 'umlos-cuda[ray]'; docs/batching.md, 'A Ray Data job')")
    tokenize.add_argument("--ray-address", metavar="ADDRESS",
                          help="with --engine ray: the Ray cluster to run on (its head's HOST:PORT, or 'auto'); "
                          "default: the cluster RAY_ADDRESS names, else the one `ray start` started on this machine, "
                          "else a Ray started here for the job")
    tokenize.add_argument("--break-lock", action="store_true",
                          help="with --append to an object-store URL: remove the lock object a killed append left "
                          "first (give it only when that append is gone; docs/object-stores.md)")
    tokenize.set_defaults(func=lambda args: run_tokenize(args, tokenize))

    append = actions.add_parser(
        "append", help="adopt written token stores as new shards of a sharded token store",
        description="Move the token stores STORE... (written by `data tokenize`, or by workers into a staging folder "
        "on the same file system) into the sharded token store DIR as its next shards, in the order given, and "
        "replace DIR/meta.json last. Refused: another tokenizer, token dtype, vocabulary, loss-mask rule or id kind, "
        "a sample id another shard holds, and a shard folder of another sharded store. One append at a time: while "
        "another holds DIR, this one is refused at once (SHARDED_STORE_LOCKED, naming its pid). With --create, DIR is "
        "made (it must not exist, unless --force). DIR may be an s3://, gs://, az:// URL of a sharded store: the "
        "append runs on disk aside, then puts the new shards there, the index last, one writer at a time by a lock "
        "object (docs/object-stores.md).",
    )
    append.add_argument("directory", metavar="DIR", help="the sharded token store (a folder, or a URL)")
    append.add_argument("stores", nargs="+", metavar="STORE", help="token store folders to adopt (they are moved)")
    append.add_argument("--create", action="store_true", help="create DIR from these stores")
    append.add_argument("--force", action="store_true", help="with --create: replace an existing sharded store")
    append.add_argument("--break-lock", action="store_true",
                        help="DIR in an object store: remove the lock object a killed append left, then append (an "
                        "object store cannot tell a dead holder from a live one: give it only when the holder is gone;"
                        " docs/object-stores.md)")
    append.set_defaults(func=run_append)

    verify = actions.add_parser(
        "verify", help="check a token store, a sharded token store or Megatron datasets against their own digests",
        description="Open SOURCE (a token store folder, a sharded token store folder, or one or more Megatron "
        "prefixes read as one dataset) and run its verify(): a store's array digests, token ids below its vocabulary "
        "and 0/1 loss masks; a sharded store's every shard on its own, its row digests and logical dataset hash; a "
        "Megatron dataset's token ids. Exit status 0 when everything holds.",
    )
    verify.add_argument("source", nargs="+", metavar="SOURCE", help="the store folder, or Megatron prefixes")
    verify.set_defaults(func=run_verify)

    megatron = actions.add_parser(
        "megatron", help="write the length cache of a Megatron-LM indexed dataset (.idx sizes)",
        description="Read PREFIX.idx and PREFIX.bin (Megatron-LM's MMapIndexedDataset format), check them, and write "
        "the length cache of their sequences (ids: row numbers), from which `plan build` makes a plan and "
        "`batch generate --source PREFIX` collates batches.",
    )
    megatron.add_argument("prefix", metavar="PREFIX", nargs="+",
                          help="the dataset's path prefix (PREFIX.idx, PREFIX.bin); several prefixes are one dataset, "
                          "read in the order given (Megatron-LM's data path), with rows numbered across them")
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

    if args.ray_address is not None and args.engine != "ray":
        parser.error("--ray-address goes with --engine ray")
    remote = is_remote(args.output)
    if remote and (args.engine == "ray" or (args.sharded and not args.append)):
        parser.error("an object-store --output takes a token store, or --append to a sharded store there (no new "
                     "--sharded store and no --engine ray yet): docs/object-stores.md")
    if args.break_lock and not (remote and args.append):
        parser.error("--break-lock goes with --append to a sharded store in an object store (on disk, the lock is a "
                     "flock the kernel drops when its holder dies)")
    if args.engine == "ray" and has_remote(args.dataset):
        parser.error("--engine ray reads --dataset from a path its workers see; an object-store URL is copied to "
                     "this machine's disk first (docs/object-stores.md): give a shared path, or tokenize here")
    if args.sharded or args.append or args.engine == "ray":
        return run_tokenize_sharded(args, parser)
    staging = tempfile.mkdtemp(prefix="umlos-publish-") if remote else None
    try:
        build = partial(_tokenize_and_publish, staging) if staging is not None else tokenize_dataset
        store, elapsed = run_with_progress(args, parser, f"tokenize {args.output}", build)
        print(f"wrote token store {args.output}: {len(store)} samples, {store.num_tokens} tokens "
              f"({store.meta['token_dtype']}), {int(store.loss_mask_array.sum(dtype='u8'))} trained on")
        print(f"tokenizer_hash {store.tokenizer_hash}")
        print(f"dataset_hash {store.dataset_hash}")
        print(f"{store.num_tokens / max(elapsed, 1e-9):.0f} tokens/s ({elapsed:.2f} s)")
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return 0


def _tokenize_and_publish(staging: str, dataset, tokenizer, output: str, *, force: bool = False, **options):
    """The token store written into ``staging`` on disk (the writer's checks and atomic files), then published
    at the object-store URL ``output``, its meta.json last (umlos_cuda/remote/publish.py); the local store is
    returned (its arrays for the summary)."""
    from ..batching.tokens.writer import tokenize_dataset
    from ..remote.publish import publish_store

    local = tokenize_dataset(dataset, tokenizer, os.path.join(staging, "store"), **options)
    publish_store(local.root, output, force=force)
    return local


def run_tokenize_sharded(args, parser) -> int:
    from ..batching.tokens.partition import tokenize_sharded

    remote = is_remote(args.output)

    def build(dataset, tokenizer, output, **options):
        if remote:  # the disk append on a private copy of the store, then published (remote/append.py)
            from ..remote.append import tokenize_append_remote

            return tokenize_append_remote(output, dataset, tokenizer, break_lock=args.break_lock, **options).store
        if args.engine == "ray":  # the same store, written by a Ray Data job (batching/tokens/distributed.py)
            from ..batching.tokens.distributed import tokenize_on_ray

            return tokenize_on_ray(dataset, tokenizer, output, append=args.append, address=args.ray_address,
                                   **options)
        return tokenize_sharded(dataset, tokenizer, output, append=args.append, **options)

    if args.append and args.force:
        parser.error("--append adds shards and replaces nothing; --force goes with a new store")
    from ..batching.tokens.logical import ShardedFacts

    before: ShardedFacts | None = None
    if args.append and remote:
        from ..remote.sharded import RemoteShardedStore

        before = RemoteShardedStore.open(args.output)
    elif args.append:
        from ..batching.tokens.partition import open_for_append

        before = open_for_append(args.output)
    store, elapsed = run_with_progress(args, parser, f"tokenize {args.output}", build)
    added = store.num_parts - (before.num_parts if before is not None else 0)
    rows = len(store) - (len(before) if before is not None else 0)
    print(f"{'appended' if args.append else 'wrote'} {added} shard{'' if added == 1 else 's'} "
          f"({rows} samples) {'to' if args.append else 'as'} sharded token store {args.output}: {len(store)} samples "
          f"in {store.num_parts} shards, {store.num_tokens} tokens ({store.token_dtype})")
    print(f"tokenizer_hash {store.tokenizer_hash}")
    print(f"dataset_hash {store.dataset_hash}")
    print(f"{(store.num_tokens if before is None else store.num_tokens - before.num_tokens) / max(elapsed, 1e-9):.0f}"
          f" tokens/s ({elapsed:.2f} s)")
    return 0


def run_append(args) -> int:
    from ..batching.tokens.adopt import append_shards
    from ..errors import BATCHING_OPERATOR, INVALID_ARGUMENT, REMOTE_OPERATOR, REMOTE_UNAVAILABLE, UmlosError

    if args.force and not args.create:
        raise UmlosError(INVALID_ARGUMENT, "--force replaces a sharded store only with --create; an append never "
                         "replaces anything", operator=BATCHING_OPERATOR)
    if any(is_remote(path) for path in args.stores) or (is_remote(args.directory) and args.create):
        raise UmlosError(REMOTE_UNAVAILABLE, "data append adopts token store folders on disk into a sharded store on "
                         "disk or in an object store; creating one in an object store (--create) and adopting stores "
                         "from one are not built (docs/object-stores.md): create the store on disk and copy it there, "
                         "files as they are", operator=REMOTE_OPERATOR)
    if is_remote(args.directory):
        return _append_remote(args)
    if args.break_lock:
        raise UmlosError(INVALID_ARGUMENT, "--break-lock goes with a store in an object store: on disk, the lock is "
                         "a flock the kernel drops when its holder dies", operator=BATCHING_OPERATOR)
    store = append_shards(args.directory, args.stores, create=args.create, force=args.force)
    print(f"{'created' if args.create else 'appended to'} sharded token store {args.directory}: {len(store)} samples "
          f"in {store.num_parts} shards, {store.num_tokens} tokens")
    print(f"dataset_hash {store.dataset_hash}")
    return 0


def _append_remote(args) -> int:
    """``data append URL STORE...`` (umlos_cuda/remote/append.py)."""
    from ..remote.append import append_remote

    done = append_remote(args.directory, args.stores, break_lock=args.break_lock)
    if args.break_lock:
        print(f"broke the lock of {args.directory}, held by {done.broken}" if done.broken is not None
              else f"{args.directory} had no lock to break")
    store = done.store
    print(f"appended to sharded token store {args.directory}: {len(store)} samples in {store.num_parts} shards, "
          f"{store.num_tokens} tokens")
    print(f"dataset_hash {store.dataset_hash}")
    return 0


def run_verify(args) -> int:
    from ..batching.tokens.sources import open_token_source

    source = open_token_source(args.source[0] if len(args.source) == 1 else args.source)
    if not callable(getattr(source, "verify", None)):  # a token store in an object store: its digests need a pass
        from ..errors import REMOTE_OPERATOR, REMOTE_UNAVAILABLE, UmlosError

        raise UmlosError(REMOTE_UNAVAILABLE, f"data verify re-hashes a token store's arrays, which is not done in an "
                         f"object store yet ({' '.join(args.source)}): verify the store on disk before copying it "
                         "there (a Megatron prefix's ids are checked in an object store too)", operator=REMOTE_OPERATOR)
    report = source.verify()
    shards = f" in {report['shards']} shards" if "shards" in report else ""
    print(f"ok  {' '.join(args.source)}: {report['samples']} samples{shards}, {report['tokens']} tokens, "
          f"tokenizer_hash {report['tokenizer_hash']}")
    dataset_hash = getattr(source, "dataset_hash", None)
    if dataset_hash is not None:
        print(f"dataset_hash {dataset_hash}")
    return 0


def run_megatron(args) -> int:
    from ..batching.lengths.fingerprints import tokenizer_fingerprint
    from ..batching.tokens.megatron import UNKNOWN_TOKENIZER, MegatronDataset, MegatronDatasetList

    tokenizer_hash = tokenizer_fingerprint(args.tokenizer) if args.tokenizer else UNKNOWN_TOKENIZER
    dataset: MegatronDataset | MegatronDatasetList
    if len(args.prefix) == 1:
        dataset = MegatronDataset.open(args.prefix[0], tokenizer_hash=tokenizer_hash)
        documents = max(int(dataset.document_indices.shape[0]) - 1, 0)
        dtype = str(dataset.dtype)
    else:
        listed = MegatronDatasetList.open(args.prefix, tokenizer_hash=tokenizer_hash)
        documents = listed.document_count
        dtype = ", ".join(sorted({str(part.dtype) for part in listed.datasets}))
        dataset = listed
    cache = dataset.length_cache()
    inputs = [path for prefix in args.prefix for path in (f"{prefix}.idx", f"{prefix}.bin")]
    cache.write(args.output, force=args.force, inputs=(*inputs, args.tokenizer))
    print(f"wrote {args.output} and {args.output}.u32: {len(cache)} sequences ({documents} documents), "
          f"{dataset.num_tokens} tokens ({dtype}), tokenizer_hash {tokenizer_hash}")
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
