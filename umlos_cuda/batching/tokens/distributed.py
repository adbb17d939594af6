"""Tokenize a multi-file dataset as a Ray Data job: the shards of a sharded token store.

What goes in: what :func:`~umlos_cuda.batching.tokens.sharded.tokenize_sharded`
takes (a dataset of one or more input files, a tokenizer, the output folder,
the options of ``tokenize_dataset``), plus the Ray cluster to run on
(``address``; None: the one ``ray.init()`` finds, else a new local one). What
comes out: the sharded token store ``output``, byte for byte the one
``tokenize_sharded`` writes on one machine (same files, same index, same
fingerprints).

The job (``umlos-cuda data tokenize --engine ray``; docs/batching.md, "A Ray
Data job"):

1. The driver resolves the dataset into its input files (records/shards.py:
   a glob's matches sorted, a list as given) and checks the output before
   any work, as ``tokenize_sharded`` does.
2. ``ray.data.from_items`` makes one row ``(index, path of the staged
   shard)`` per input file, one block each, and ``map`` sends them to an
   actor pool (:class:`ShardTask`, one CPU each): an actor loads the
   tokenizer once and, for each row, writes input file ``index`` alone as a
   classic token store with ``tokenize_shard`` into a hidden staging folder
   beside the output (``.tmp-NAME-ray-<random>/NNNNN``, NNNNN the input's
   index). Ray workers only write files; nothing but a few strings travels
   back.
3. The driver collects the rows, puts them in INPUT order (never the order
   they finished in), and adopts the staged stores in that order
   (tokens/adopt.py: one rename each, the index written last; an append
   holds the store's lock from before the job starts, so a second writer is
   refused at once, not after the job). A file that holds no record has no
   shard, as in ``tokenize_sharded``.

Why the bytes do not depend on the cluster: a shard depends on its input
file alone (tokens/partition.py: content ids, chunks never span two files),
each is written by the same ``tokenize_shard`` the single-machine path calls,
and the shards' order is the dataset's. The cluster's size, the worker a file
lands on and the order the tasks finish in change nothing on disk.

Failures. A task that fails with a documented error (an unreadable file, a
bad record, a tokenizer that fails) does not raise inside Ray: its row
carries the code and message, and when the job is done the driver raises the
error of the first failing input file in input order, which is the error
``tokenize_sharded`` raises for the same inputs. A worker or node that dies
is Ray Data's to handle: it restarts the actor and retries the file (which
then replaces its own half-staged store). What Ray gives up on (a lost
cluster) and any exception that is not a documented error is
DISTRIBUTED_JOB_FAILED with Ray's message. Either way the staging folder is
removed and ``output`` is left as it was: nothing half-adopted looks valid.
Ray itself is imported only here and only when the job runs; without it,
BACKEND_UNAVAILABLE names the extra: ``pip install 'umlos-cuda[ray]'``.

Every worker must see the driver's paths: the dataset, the tokenizer and
the output's folder on one file system (local for a one-machine cluster, a
shared mount such as NFS, Lustre or a FUSE bucket for several machines).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any

from ... import checks, errors
from ...errors import UmlosError
from ..lengths.tokenizer import LoadedTokenizer, load_tokenizer
from ..records.chunk import SkippedLines
from ..records.shards import resolve
from .adopt import adopting
from .partition import check_sharded_output, input_bytes, staging_folder
from .sharded import ShardedTokenStore, tokenize_shard

#: What to install when Ray is missing.
RAY_EXTRA = "pip install 'umlos-cuda[ray]'"
#: The skipped lines' messages kept (as SkippedLines keeps them).
MAX_SKIPPED_MESSAGES = 5


def ray_module() -> Any:
    """The ``ray`` module with Ray Data loaded, or BACKEND_UNAVAILABLE naming the extra."""
    try:
        import ray
        import ray.data
    except ImportError as exc:
        raise UmlosError(errors.BACKEND_UNAVAILABLE, f"the Ray engine needs Ray Data, which is not installed "
                         f"({exc}): {RAY_EXTRA}", operator=errors.BATCHING_OPERATOR) from None
    return ray


def tokenize_on_ray(dataset: Any, tokenizer: Any, output: str | os.PathLike[str], *, address: str | None = None,
                    workers: int | None = None, append: bool = False, force: bool = False, format: str | None = None,
                    progress: Callable[[int, int], None] | None = None, skipped: SkippedLines | None = None,
                    **options: Any) -> ShardedTokenStore:
    """Write the sharded token store ``output`` of ``dataset`` with a Ray Data job (module docstring).

    ``address``: the Ray cluster (``ray.init(address)``; None: the cluster
    ``RAY_ADDRESS`` names, else the one ``ray start`` started on this
    machine, else a local one started for the job and stopped after; when
    this process is already connected, that cluster is used and left
    connected). ``workers``: the actors tokenizing at once (default: the
    cluster's CPUs, at most one per input file). ``progress(bytes, total)``
    is called as each file finishes; ``skipped`` receives the bad lines the
    workers skipped, in input order. ``append`` and ``force`` are those of
    ``tokenize_sharded`` (add the files as new shards of the existing store
    ``output``; replace a sharded store). ``options`` are those of
    ``tokenize_dataset`` (fields, ``chunk_size``, ``id_field``, ...)."""
    if workers is not None:
        workers = checks.integer(workers, "workers", 1, fail=_argument,
                                 message="workers must be a positive integer, got {value!r}")
    if not isinstance(tokenizer, (str, os.PathLike)):
        raise _argument(f"the Ray engine loads the tokenizer on each worker from its path; got a "
                        f"{type(tokenizer).__name__} (save it and pass the tokenizer.json or its folder)")
    inputs = resolve(dataset, format)
    if any(item.format == "object" for item in inputs):
        raise _argument("the Ray engine reads files that every worker can open; a datasets.Dataset object lives in "
                        "this process only: save_to_disk it and pass the folder")
    root = check_sharded_output(output, dataset, format, tokenizer, options.get("chat_template"), append=append,
                                force=force)
    load_tokenizer(tokenizer)  # a wrong path or file fails here, at once, not on every worker
    ray = ray_module()  # after the checks of the arguments: a wrong path is said first, Ray or not
    files = [os.path.abspath(item.path) for item in inputs]  # workers may run in another folder
    task_options = dict(options, format=format, tokenizer=os.path.abspath(os.fspath(tokenizer)),
                        skip_bad_lines=skipped is not None, sharded=True if append else None)
    if task_options.get("chat_template") is not None:
        task_options["chat_template"] = os.path.abspath(os.fspath(task_options["chat_template"]))
    sizes = [input_bytes(item.files) for item in inputs]
    with adopting(root, create=not append, force=force) as adopt, staging_folder(root, "ray") as stage_path:
        rows = _run_job(ray, address, workers, files, stage_path, task_options, sizes, progress)
        return adopt(_staged_in_order(rows, inputs, skipped))


class ShardTask:
    """One actor of the job's pool: the tokenizer, loaded once, and the options; called with a row
    ``{"index", "folder"}`` it writes input file ``index`` to ``folder`` and returns what happened
    (``code`` and ``message`` empty on success)."""

    def __init__(self, files: list[str], options: dict[str, Any]) -> None:
        self.files = files
        self.options = dict(options)
        self.tokenizer: LoadedTokenizer | None = None

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        index = int(row["index"])
        options = dict(self.options)
        skipped = SkippedLines() if options.pop("skip_bad_lines") else None
        done = [0]

        def report(read: int, _total: int) -> None:
            done[0] = read

        result = {"index": index, "folder": row["folder"], "code": "", "message": "", "operator": "",
                  "samples": 0, "tokens": 0, "bytes": 0, "skipped": 0, "skipped_first": "[]"}
        try:
            if self.tokenizer is None:
                self.tokenizer = load_tokenizer(options.pop("tokenizer"))
            else:
                options.pop("tokenizer")
            # force: the staging folder is this job's alone, and a task Ray retries finds its own earlier output
            store = tokenize_shard(self.files, index, self.tokenizer, row["folder"], skipped=skipped,
                                   progress=report, force=True, **options)
            result.update(samples=len(store), tokens=int(store.num_tokens))
        except UmlosError as exc:
            result.update(code=exc.code, message=exc.message, operator=exc.record["failure_operator"])
        if skipped is not None:
            result.update(skipped=skipped.count, skipped_first=json.dumps(skipped.first))
        result["bytes"] = done[0]
        return result


def _run_job(ray: Any, address: str | None, workers: int | None, files: list[str], stage_path: str,
             options: dict[str, Any], sizes: list[int], progress: Callable[[int, int], None] | None
             ) -> dict[int, dict[str, Any]]:
    """The rows of the Ray Data job, by input index (connecting first, and disconnecting after when
    this call connected)."""
    connected_here = False
    if not ray.is_initialized():
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.WARNING, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = f"at {address}" if address else "to start or join"
            raise UmlosError(errors.BACKEND_UNAVAILABLE, f"no Ray cluster {where}: {_first_line(exc)}",
                             operator=errors.BATCHING_OPERATOR) from None
        connected_here = True
    context = ray.data.DataContext.get_current()
    bars, context.enable_progress_bars = context.enable_progress_bars, False  # the caller's progress is per file
    try:
        if workers is None:
            workers = max(int(ray.cluster_resources().get("CPU", 1)), 1)
        pool = min(workers, len(files))
        items = [{"index": index, "folder": os.path.join(stage_path, f"{index:05d}")} for index in range(len(files))]
        dataset = ray.data.from_items(items, override_num_blocks=len(items))
        # One file in flight per actor: a free actor takes the next file. An actor that dies (a lost node)
        # is restarted and its file retried (Ray Data's default); its staged store is then replaced (force).
        compute = ray.data.ActorPoolStrategy(size=pool, max_tasks_in_flight_per_actor=1)
        mapped = dataset.map(ShardTask, fn_constructor_kwargs={"files": files, "options": options},
                             compute=compute, num_cpus=1)
        rows: dict[int, dict[str, Any]] = {}
        total = max(sum(sizes), 1)
        done = 0
        try:
            for row in mapped.iter_rows():
                rows[int(row["index"])] = dict(row)
                done += sizes[int(row["index"])]
                if progress is not None:
                    progress(done, total)
        except UmlosError:
            raise
        except Exception as exc:  # Ray's own failures (a lost cluster), or an exception that is not a documented error
            raise UmlosError(errors.DISTRIBUTED_JOB_FAILED, f"the Ray job failed: {_first_line(exc)}",
                             operator=errors.BATCHING_OPERATOR) from exc
        missing = sorted(set(range(len(files))) - set(rows))
        if missing:
            raise UmlosError(errors.DISTRIBUTED_JOB_FAILED, f"the Ray job returned no result for input file "
                             f"{files[missing[0]]} (and {len(missing) - 1} more)", operator=errors.BATCHING_OPERATOR)
        return rows
    finally:
        context.enable_progress_bars = bars
        if connected_here:
            ray.shutdown()


def _staged_in_order(rows: dict[int, dict[str, Any]], inputs: list, skipped: SkippedLines | None) -> list[str]:
    """The staged stores to adopt, in input order; the first failed file's error raised (as
    ``tokenize_sharded`` raises it: a file without records is skipped when there are others)."""
    staged = []
    for index in range(len(inputs)):
        row = rows[index]
        if skipped is not None:
            skipped.count += int(row["skipped"])
            room = MAX_SKIPPED_MESSAGES - len(skipped.first)
            skipped.first.extend(json.loads(row["skipped_first"])[:max(room, 0)])
        if row["code"] == errors.DATASET_EMPTY and len(inputs) > 1:
            continue
        if row["code"]:
            raise UmlosError(row["code"], row["message"], operator=row["operator"] or errors.BATCHING_OPERATOR)
        staged.append(row["folder"])
    if not staged:
        raise UmlosError(errors.DATASET_EMPTY, f"no file of {inputs[0].path} and the other inputs holds a "
                         "record", operator=errors.BATCHING_OPERATOR)
    return staged


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return f"{type(exc).__name__}: {text.splitlines()[0]}"


def _argument(message: str) -> UmlosError:
    return UmlosError(errors.INVALID_ARGUMENT, message, operator=errors.BATCHING_OPERATOR)
