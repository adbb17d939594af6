"""Plan folders: JSON and JSONL files plus a binary form, written atomically.

Layout (docs/batching.md, "Plan files")::

    DIR/umlos-artifact.json           the artifact marker: {"artifact":"plan",...} (umlos_cuda/files/artifacts.py)
    DIR/meta.json                     BatchPlanMeta, seed, engine mode, fingerprint
    DIR/lengths.npy                   uint32 lengths the plan was built from (row order)
    DIR/sample_ids.jsonl              one JSON string per row (absent: ids are row numbers)
    DIR/epoch_<e>/microbatches.jsonl  {"index", "samples", "bucket_id", "max_len", "packs"} per line
    DIR/epoch_<e>/stats.json          counts, tokens, padding, bucket histogram, skipped ids
    DIR/epoch_<e>/offsets.npy         int64 [M + 1]
    DIR/epoch_<e>/samples.npy         uint32 (uint64 past 2^32 rows) [S]: dataset rows
    DIR/epoch_<e>/bucket_ids.npy      int16 [M]
    DIR/epoch_<e>/max_len.npy         uint32 [M]
    DIR/epoch_<e>/row_offsets.npy     packed plans: int64 [R + 1], row r is samples[row_offsets[r]:row_offsets[r+1]]
    DIR/epoch_<e>/pack_rows.npy       packed plans: int64 [M + 1], microbatch j is rows pack_rows[j]:pack_rows[j+1]
    DIR/epoch_<e>/pieces.npy          split plans (over-long policy split): uint32 [S], each entry's piece number

The binary form is always written and is what :func:`load_plan` maps into
memory. The JSONL is the interchange format: ``jsonl="always"`` writes it,
``"never"`` does not, ``"auto"`` (default) writes it unless the plan holds
more than :data:`JSONL_AUTO_LIMIT` sample entries over all its epochs (a
10^8-sample epoch is gigabytes of JSON and minutes to write). A folder with
only the JSONL (written by another tool in this layout, with
meta.json and lengths.npy) also loads.

Written through the output layer (umlos_cuda/files/writer.py): everything,
with the artifact marker ``umlos-artifact.json`` (``"artifact": "plan"``), is
written and fsynced in a hidden sibling folder (``.tmp-<name>-<random>``),
which is then renamed to ``DIR`` in one step; a crash leaves at most that
hidden folder, never a ``DIR`` that loads half a plan. ``force`` replaces an
existing plan folder (and only a plan folder, never a path the plan is read
from).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import replace

import numpy as np

from ... import checks, errors
from ...errors import UmlosError
from .lines import id_texts, microbatch_lines, parse_sample_ids, sample_ids_lines
from .config import BatchingConfig
from ...files import reader
from ...files.artifacts import json_field, write_marker
from ...files.reader import read_npy
from ...files.writer import ArtifactKind, Folder, check_output_folder, output_folder, output_member
from .integrity import check_digests, check_shard_field, check_structure, check_units
from ..lengths.fingerprints import PARTS_KEY, check_tokenizer_parts
from .plan import PLAN_FORMAT, BatchPlan, BatchPlanMeta, EpochPlan, plan_error
from ..packing.config import PackingConfig
from .sharding import shard_plan
from .sharding import check_shard_count

JSONL_MODES = ("auto", "always", "never")
#: ``jsonl="auto"`` writes microbatches.jsonl up to this many sample entries (all epochs).
JSONL_AUTO_LIMIT = 10_000_000
ARRAYS = (("offsets", "<i8"), ("samples", None), ("bucket_ids", "<i2"), ("max_len", "<u4"))
#: The arrays a packed plan's epoch adds (:mod:`.packing`).
PACK_ARRAYS = (("row_offsets", "<i8"), ("pack_rows", "<i8"))
#: The array a split plan's epoch adds (:mod:`.units`).
PIECE_ARRAYS = (("pieces", "<u4"),)
_CONFIG_KEYS = ("token_budget", "bucket_edges", "overflow_max", "min_length", "pad_policy", "mode", "seed",
                "sampling_mode", "sampler_block_size")
#: Config keys meta.json holds only when not at their default (plans before them keep their bytes).
_DEFAULTED_CONFIG_KEYS = ("group_size", "window")


# ---------------------------------------------------------------------- writing
def _is_plan(folder: Folder) -> bool:
    """A plan folder written before artifact markers: its meta.json has the plan format."""
    return json_field(folder, "meta.json", "format") == PLAN_FORMAT


def _is_shard_set(folder: Folder) -> bool:
    """A shard set written before artifact markers: shards.json and rank_0, a plan."""
    if json_field(folder, "shards.json", "world_size") is None:
        return False
    try:
        with folder.sub("rank_0") as rank:
            return _is_plan(rank)
    except OSError:
        return False


#: A plan folder (also each rank of a shard set, and a batch folder's copy of its plan).
PLAN = ArtifactKind("plan", _is_plan)
#: The folder ``plan shard`` writes: ``rank_<r>`` plans and ``shards.json``.
SHARDS = ArtifactKind("plan shard set", _is_shard_set)


def save_plan(plan: BatchPlan, directory, *, jsonl: str = "auto", force: bool = False,
              progress: Callable[[int, int], None] | None = None, inputs: Iterable = ()) -> str:
    """Write ``plan`` to the folder ``directory`` (see the module docstring); returns its path.

    ``inputs``: the paths the plan was made from, which ``directory`` must not
    be, hold or sit inside (OUTPUT_IS_INPUT)."""
    write_jsonl = _wants_jsonl(plan, jsonl)
    with output_folder(directory, PLAN, force=force, inputs=inputs, operator=errors.BATCH_PLAN_OPERATOR) as folder:
        _write_contents(plan, folder, write_jsonl, progress)
    return os.path.abspath(os.fspath(directory))


def save_plan_into(plan: BatchPlan, parent: Folder, name: str, *, jsonl: str = "auto", force: bool = False) -> None:
    """Write ``plan`` to the folder ``name`` inside ``parent``, a folder held
    open (a batch folder's copy of its plan)."""
    write_jsonl = _wants_jsonl(plan, jsonl)
    with output_member(parent, name, PLAN, force=force, operator=errors.BATCH_PLAN_OPERATOR) as folder:
        _write_contents(plan, folder, write_jsonl, None)


def save_shards(plan: BatchPlan, world_size: int, directory, *, jsonl: str = "auto", force: bool = False,
                inputs: Iterable = ()) -> list[dict]:
    """Write ``directory/rank_<r>`` (the shard of rank ``r``) for every rank and
    ``directory/shards.json``, all in one atomic step; returns one row per rank."""

    world_size = check_shard_count(world_size)
    rows = []
    with output_folder(directory, SHARDS, force=force, inputs=inputs, operator=errors.BATCH_PLAN_OPERATOR) as folder:
        for rank in range(world_size):
            shard = shard_plan(plan, rank, world_size)
            with folder.mkdir(f"rank_{rank}") as rank_folder:
                write_marker(rank_folder, PLAN)
                _write_contents(shard, rank_folder, _wants_jsonl(shard, jsonl), None)
            rows.append({"rank": rank, "fingerprint": shard.fingerprint, "microbatches": shard.total_microbatches})
        index = {"world_size": world_size, "source_fingerprint": plan.fingerprint, "shards": rows}
        _write_json(folder, "shards.json", index)
    return rows


def _wants_jsonl(plan: BatchPlan, jsonl: str) -> bool:
    if jsonl not in JSONL_MODES:
        raise plan_error(errors.BATCHING_CONFIG_INVALID,
                         f"jsonl must be one of {', '.join(JSONL_MODES)}, got {jsonl!r}")
    entries = sum(int(e.samples.shape[0]) for e in plan.epochs)
    return jsonl == "always" or (jsonl == "auto" and entries <= JSONL_AUTO_LIMIT)


def _write_contents(plan: BatchPlan, root: Folder, write_jsonl: bool, progress) -> None:
    _write_npy(root, "lengths.npy", np.asarray(plan.lengths, dtype="<u4"))
    plain = plan.plain_ids
    ids = plain if plain is not None else plan.sample_ids  # plain ids stay bytes (lengths/plain_ids.py)
    texts = None if ids is None else id_texts(ids)  # each id encoded once (lines.py)
    if ids is not None:
        with root.file("sample_ids.jsonl") as handle:
            for chunk in sample_ids_lines(ids, texts):
                handle.write(chunk)
    table = None if texts is None or not write_jsonl else texts if plain is not None \
        else np.asarray(texts, dtype=object)
    for done, epoch in enumerate(plan.epochs):
        with root.mkdir(f"epoch_{epoch.epoch}") as folder:
            for name, _ in ARRAYS + (PACK_ARRAYS if epoch.pack_rows is not None else ()) \
                    + (PIECE_ARRAYS if epoch.pieces is not None else ()):
                _write_npy(folder, f"{name}.npy", np.asarray(getattr(epoch, name)))
            _write_json(folder, "stats.json", epoch.stats)
            if write_jsonl:
                with folder.file("microbatches.jsonl") as handle:
                    for chunk in _microbatch_chunks(plan, epoch, table):
                        handle.write(chunk)
            folder.sync()
        if progress is not None:
            progress(done + 1, len(plan.epochs))
    _write_json(root, "meta.json", plan.meta.to_json())  # last: the plan is complete
    root.sync()


def _microbatch_chunks(plan: BatchPlan, epoch: EpochPlan, table) -> Iterable[bytes]:
    """microbatches.jsonl of ``epoch``: a chunk of lines at a time (lines.py), or, in a plan with an
    over-long policy (whose lines add pieces, and whose entries are checked against its units as
    they are written), one :meth:`~.plan.BatchPlan.microbatch` per line."""
    if epoch.pieces is None and plan.config.overlong is None:
        return microbatch_lines(epoch, table)
    return ((json.dumps(plan.microbatch(epoch.epoch, j).to_json()) + "\n").encode("ascii") for j in range(len(epoch)))


def check_output_dir(directory, force: bool, inputs: Iterable = ()) -> str:
    """The absolute path of a plan folder to write, refused before any work
    (OUTPUT_PATH_INVALID, OUTPUT_EXISTS, OUTPUT_IS_INPUT) when it cannot be written."""
    return check_output_folder(directory, PLAN, force=force, inputs=inputs, operator=errors.BATCH_PLAN_OPERATOR)


def check_shards_dir(directory, force: bool, inputs: Iterable = ()) -> str:
    """:func:`check_output_dir` for the folder of a shard set."""
    return check_output_folder(directory, SHARDS, force=force, inputs=inputs, operator=errors.BATCH_PLAN_OPERATOR)


def _write_npy(folder: Folder, name: str, array: np.ndarray) -> None:
    with folder.file(name) as handle:
        np.save(handle, np.ascontiguousarray(array), allow_pickle=False)


def _write_json(folder: Folder, name: str, value) -> None:
    with folder.file(name) as handle:
        handle.write((json.dumps(value, indent=2) + "\n").encode("ascii"))


# ---------------------------------------------------------------------- reading
def load_plan(directory, *, mmap: bool = True, verify: bool = False) -> BatchPlan:
    """The plan in ``directory``; arrays are memory-mapped unless ``mmap=False``.

    Every load checks the structure the reader relies on
    (:func:`~.integrity.check_structure`); ``verify=True`` also re-hashes
    the content against meta.json (:func:`~.integrity.check_digests`), as
    the commands that derive new artifacts from a plan do by default."""
    root = os.fspath(directory)
    meta_path = os.path.join(root, "meta.json")
    if not os.path.lexists(meta_path):  # anything else there is refused by the reader, saying what it is
        raise plan_error(errors.PLAN_NOT_FOUND, f"no batch plan at {root}: {meta_path} does not exist "
                                                "(build one with `umlos-cuda plan build`)")
    try:
        meta = meta_from_json(read_json(meta_path))
    except UmlosError as exc:
        if exc.code != errors.PLAN_FORMAT_INVALID or exc.message.startswith(meta_path):
            raise
        raise _format(f"{root}/{exc.message}") from None  # "meta.json ..." names the folder too
    lengths = read_npy(os.path.join(root, "lengths.npy"), "<u4", (meta.num_samples,), mmap, _format)
    sample_ids = None
    if meta.sample_ids_sha256 is not None:
        sample_ids = read_sample_ids(os.path.join(root, "sample_ids.jsonl"), meta.num_samples)
    epochs = [_load_epoch(root, e, meta, lengths, sample_ids, mmap) for e in range(meta.num_epochs)]
    plan = BatchPlan(meta, epochs, lengths, sample_ids)
    check_units(plan, root)
    if verify:
        check_digests(plan, root)
    return plan


def _load_epoch(root: str, epoch: int, meta: BatchPlanMeta, lengths, sample_ids, mmap: bool) -> EpochPlan:
    folder = os.path.join(root, f"epoch_{epoch}")
    stats = check_stats(read_json(os.path.join(folder, "stats.json")), f"{folder}/stats.json",
                        meta.config.pack is not None, meta.config.overlong is not None)
    split = splits_pieces(meta.config)
    base, step = (meta.shard["rank"], meta.shard["world_size"]) if meta.shard else (0, 1)
    if os.path.exists(os.path.join(folder, "offsets.npy")):
        arrays = {}
        for name, dtype in ARRAYS + (PACK_ARRAYS if meta.config.pack is not None else ()) \
                + (PIECE_ARRAYS if split else ()):
            arrays[name] = read_npy(os.path.join(folder, f"{name}.npy"), dtype or meta.index_dtype, None, mmap, _format)
    elif os.path.exists(os.path.join(folder, "microbatches.jsonl")):
        arrays = read_microbatches_jsonl(os.path.join(folder, "microbatches.jsonl"), meta, sample_ids, base, step,
                                         stats["microbatches"])
    else:
        raise _format(f"{folder} holds neither offsets.npy nor microbatches.jsonl")
    check_structure(folder, arrays, stats, meta.num_samples, meta.config.bucket_spec.num_buckets, meta.shard)
    offsets = arrays["offsets"]
    return EpochPlan(epoch, offsets, arrays["samples"], arrays["bucket_ids"], arrays["max_len"], stats, base, step,
                     arrays.get("row_offsets"), arrays.get("pack_rows"), arrays.get("pieces"))


def splits_pieces(config: BatchingConfig) -> bool:
    """Whether a plan of ``config`` has ``pieces`` (over-long policy ``split``)."""
    return config.overlong is not None and config.overlong.policy.value == "split"


def meta_from_json(data) -> BatchPlanMeta:
    checks.instance(data, "meta.json", dict, fail=_format, message=_META_FORMAT.replace("{value!r}", "{type!r}"))
    checks.equal(data.get("format"), "format", PLAN_FORMAT, fail=_format, message=_META_FORMAT)
    try:
        _check_meta_types(data)
        # written only when not the default
        optional = {k: data[k] for k in ("order", "overlong", "split") + _DEFAULTED_CONFIG_KEYS if k in data}
        config = BatchingConfig.from_dict({**{k: data[k] for k in _CONFIG_KEYS}, **optional})
        if data["pack_config"] is not None:
            config = replace(config, pack=PackingConfig.from_dict(data["pack_config"]))
        shard = data["shard"]
        if shard is not None:
            checks.record(shard, _SHARD_KEYS, fail=_format, not_a_map=_SHARD_SHAPE, unknown=_SHARD_SHAPE,
                          missing=_SHARD_SHAPE)
        check_shard_field(shard, "meta.json")
        meta = BatchPlanMeta(
            config=config,
            num_epochs=checks.integer(data["num_epochs"], "num_epochs", 1, None, fail=_meta,
                                      message=checks.AT_LEAST),
            num_samples=checks.integer(data["num_samples"], "num_samples", 1, None, fail=_meta,
                                       message=checks.AT_LEAST),
            tokenizer_hash=data["tokenizer_hash"],
            dataset_hash=data["dataset_hash"], lengths_sha256=data["lengths_sha256"],
            sample_ids_sha256=data["sample_ids_sha256"], sampling_mode=config.sampling_mode,
            sampler_config_hash=data["sampler_config_hash"], manifest_hash=data["manifest_hash"],
            index_dtype=data["index_dtype"], shard=shard, fingerprint=data["fingerprint"],
            epoch_digests=tuple(data["epoch_digests"]), units=_units_field(data.get("units"), config),
            tokenizer_parts=None if PARTS_KEY not in data else check_tokenizer_parts(data[PARTS_KEY], PARTS_KEY,
                                                                                     _meta),
        )
    except KeyError as exc:
        raise _format(f"meta.json lacks the field {exc.args[0]!r}") from None
    except UmlosError as exc:
        if exc.code == errors.PLAN_FORMAT_INVALID:
            raise
        raise _format(f"meta.json: {exc.message}") from None
    if meta.num_samples % config.group_size:
        raise _format(f"meta.json: a plan of pairs (group_size {config.group_size}) holds an even number of rows, "
                      f"not num_samples {meta.num_samples}")
    if meta.index_dtype not in ("<u4", "<u8"):
        raise _format(f"meta.json index_dtype must be <u4 or <u8, got {meta.index_dtype!r}")
    checks.record(data, dict.fromkeys(meta.to_json(), checks.field(checks.anything)), fail=_format,
                  unknown="meta.json has unknown fields {unknown_list}", missing="meta.json has unknown fields []")
    return meta


def _units_field(units, config: BatchingConfig) -> dict | None:
    """meta.json ``units``: present exactly when the config splits or has an over-long policy."""
    wanted = config.split is not None or config.overlong is not None
    if units is None and not wanted:
        return None
    shape = "meta.json units must be {samples, units} (two counts) exactly when the plan has a split or an " \
            "over-long policy"
    units = checks.record(units, _UNITS_KEYS, fail=_format, not_a_map=checks.literal(shape),
                          unknown=checks.literal(shape), missing=checks.literal(shape))
    if not wanted:
        raise _format(shape)
    return units


_UNITS_KEYS = dict.fromkeys(("samples", "units"), checks.field(checks.integer, 0, None, strict=True))
_META_FORMAT = f"meta.json has format {{value!r}}; this reader reads {PLAN_FORMAT!r}"
#: A shard's fields (their types: :func:`_check_meta_types` and check_shard_field).
_SHARD_KEYS = dict.fromkeys(("rank", "world_size", "source_fingerprint"), checks.field(checks.anything))
_SHARD_SHAPE = "meta.json shard must be null or {{rank, world_size, source_fingerprint}}, got {value!r}"


def _meta(message: str) -> UmlosError:
    return _format(f"meta.json: {message}")


#: meta.json's text fields: True where null is allowed.
_TEXT_FIELDS = (("tokenizer_hash", False), ("dataset_hash", True), ("lengths_sha256", False),
                ("sample_ids_sha256", True), ("sampler_config_hash", False), ("manifest_hash", False),
                ("fingerprint", False))


def _check_meta_types(data: dict) -> None:
    """The types of the fields that reach code beyond the configuration (which checks its own):
    hashes are strings, epoch_digests one string per epoch (a shard's numbers: check_shard_field)."""
    for name, nullable in _TEXT_FIELDS:
        value = data[name]
        if value is not None or not nullable:
            checks.text(value, name, fail=_format,
                        message=f"meta.json: {{name}} must be a string{' or null' if nullable else ''}, got {{type}}")
    digests = data["epoch_digests"]
    wrong = f"meta.json: epoch_digests must be a list of {data['num_epochs']} strings, one per epoch"
    for digest in checks.instance(digests, "epoch_digests", list, fail=_format, message=checks.literal(wrong)):
        checks.text(digest, "epoch_digests", fail=_format, message=checks.literal(wrong))
    if len(digests) != data["num_epochs"]:
        raise _format(wrong)
    shard = data["shard"]
    if isinstance(shard, dict):
        checks.text(shard.get("source_fingerprint"), "source_fingerprint", fail=_format,
                    message="meta.json: shard's source_fingerprint must be a string")


#: stats.json's counts (integers >= 0) and measures (numbers), as plan info and verify read them.
STATS_COUNTS = ("epoch", "microbatches", "samples", "skipped_samples", "tokens", "padded_tokens", "padding_tokens")
STATS_MEASURES = ("padding_waste", "bucket_mix_drift")
PACKING_COUNTS = ("rows", "lower_bound_rows")
PACKING_MEASURES = ("packing_efficiency", "segments_per_row")


def check_stats(stats, where: str, packed: bool, overlong: bool = False) -> dict:
    """``stats`` when it has the fields the commands read, of their types (PLAN_FORMAT_INVALID otherwise).
    Whether the numbers are right is :func:`~umlos_cuda.batching.plans.verify.verify_plan`'s job."""
    checks.instance(stats, where, dict, fail=_format, message="{name} is not a stats object")

    def fail(message: str) -> UmlosError:
        return _format(f"{where}: {message}")

    for name in STATS_COUNTS + (("global_microbatches",) if "global_microbatches" in stats else ()):
        checks.integer(stats.get(name), name, 0, None, fail=fail, message=checks.AT_LEAST)
    for name in STATS_MEASURES:
        _number(stats.get(name), name, where)
    for sample_id in checks.instance(stats.get("skipped"), "skipped", list, fail=fail, message=_SKIPPED):
        checks.text(sample_id, "skipped", fail=fail, message=_SKIPPED)
    for row in checks.instance(stats.get("bucket_histogram"), "bucket_histogram", list, fail=fail, message=_HISTOGRAM):
        checks.instance(row, "bucket_histogram", dict, fail=fail, message=_HISTOGRAM)
    if packed:
        packing = checks.instance(stats.get("packing"), "packing", dict, fail=fail,
                                  message="a packed plan's stats hold a packing object")
        for name in PACKING_COUNTS:
            checks.integer(packing.get(name), f"packing.{name}", 0, None, fail=fail, message=checks.AT_LEAST)
        for name in PACKING_MEASURES:
            _number(packing.get(name), f"packing.{name}", where)
    if overlong:
        counted = checks.instance(stats.get("overlong"), "overlong", dict, fail=fail,
                                  message="a plan with an over-long policy has an overlong object in its stats")
        for name in OVERLONG_COUNTS:
            checks.integer(counted.get(name), f"overlong.{name}", 0, None, fail=fail, message=checks.AT_LEAST)
    return stats


#: stats.json ``overlong``'s counts (:func:`~.overlong.overlong_counts`).
OVERLONG_COUNTS = ("max_length", "samples", "pieces", "tokens_lost")


_SKIPPED = "skipped must be a list of sample ids"
_HISTOGRAM = "bucket_histogram must be a list of objects"


def _number(value, what: str, where: str) -> float:
    """A measure: any real number (NaN and infinities are what the statistics say, not a type error)."""
    return checks.number(value, what, finite=False, nan=True, fail=_format,
                         message=checks.literal(where) + ": {name} must be a number, got {type}")


def read_json(path: str):
    """A plan file's JSON (files.reader.read_json: a regular file, bounded in size and depth),
    PLAN_FORMAT_INVALID when missing too."""
    try:
        return reader.read_json(path, _format)
    except FileNotFoundError:
        raise _format(f"{path} is missing") from None


def read_sample_ids(path: str, count: int) -> list[str]:
    """The ids in sample_ids.jsonl: ``count`` JSON strings, one per line. Blocks of plain ids are read
    whole (lines.parse_sample_ids); a file with any other line is read line by line, which says
    what is wrong where."""
    ids: list[str] = []
    try:
        for _, block in reader.line_blocks(path, _format):
            fast = parse_sample_ids(block)
            if fast is None or len(ids) + len(fast) > count:  # (more lines than ids: no more is read)
                break
            ids += fast
        else:
            if len(ids) == count:
                return ids
    except FileNotFoundError:
        pass  # worded below
    except UmlosError:
        pass  # a line over the cap: worded below, where it is
    ids = []
    try:
        for number, line in reader.iter_lines(path, _format, max_lines=count):
            where = f"{path} line {number + 1}"
            ids.append(checks.text(reader.loads_json(line, _format, where), where, fail=_format,
                                   message="{name} is not a JSON string"))
    except FileNotFoundError:
        raise _format(f"{path} is missing (meta.json says the ids are stored)") from None
    if len(ids) != count:
        raise _format(f"{path} has {len(ids)} ids for {count} samples")
    return ids


def read_microbatches_jsonl(path: str, meta: BatchPlanMeta, sample_ids, base: int, step: int,
                            max_lines: int | None = None) -> dict:
    """Arrays from a microbatches.jsonl (ids mapped back to rows); at most ``max_lines``
    microbatches when given (the count stats.json records)."""
    lookup = None if sample_ids is None else {sid: row for row, sid in enumerate(sample_ids)}
    packed = meta.config.pack is not None
    split = splits_pieces(meta.config)
    sizes, rows, bucket_ids, max_len, pack_sizes, pieces = [], [], [], [], [], []
    row_sizes: list[int] = []
    try:
        for number, line in reader.iter_lines(path, _format, max_lines=max_lines):
            where = f"{path} line {number + 1}"
            item = _microbatch(line, where, base + number * step, packed, split)
            pieces.extend(item.get("pieces", ()))
            for sid in item["samples"]:
                row = _row_of(sid, lookup, meta.num_samples)
                if row is None:
                    raise _format(f"{where}: sample {sid!r} is not a sample of this plan")
                rows.append(row)
            sizes.append(len(item["samples"]))
            bucket_ids.append(item["bucket_id"])
            max_len.append(item["max_len"])
            if packed:
                row_sizes.extend(len(p) for p in item["packs"])
                pack_sizes.append(len(item["packs"]))
    except FileNotFoundError:
        raise _format(f"{path} is missing") from None
    arrays = {"offsets": _bounds(sizes), "samples": np.asarray(rows, dtype=meta.index_dtype),
              "bucket_ids": np.asarray(bucket_ids, dtype="<i2"), "max_len": np.asarray(max_len, dtype="<u4")}
    if packed:
        arrays.update(row_offsets=_bounds(row_sizes), pack_rows=_bounds(pack_sizes))
    if split:
        arrays["pieces"] = np.asarray(pieces, dtype="<u4")
    return arrays


#: The fields of a microbatches.jsonl line; ``index`` and ``packs`` are checked
#: against the plan by :func:`_microbatch`. Bounds are those of the binary form's dtypes.
_MICROBATCH_FIELDS = {
    "index": checks.field(checks.anything),
    "samples": checks.field(checks.instance, list, empty=False,
                            message="{name} must be a non-empty list of sample ids"),
    "bucket_id": checks.field(checks.integer, 0, (1 << 15) - 1),
    "max_len": checks.field(checks.integer, 1, (1 << 32) - 1),
    "packs": checks.field(checks.anything),
}
_MICROBATCH_KEYS = "a microbatch has exactly the fields {fields}"


def _microbatch(line: bytes, where: str, index: int, packed: bool, split: bool = False) -> dict:
    """One line of microbatches.jsonl, checked: its fields, its index, its
    packs (lists of sample ids that, joined, are its samples) in a packed plan,
    and its pieces (one piece number per sample) in a split plan."""
    item = reader.loads_json(line, _format, where, not_json="is not JSON")
    fields = {**_MICROBATCH_FIELDS, "pieces": checks.field(checks.instance, list)} if split else _MICROBATCH_FIELDS
    item = checks.record(item, fields, fail=_in(where), not_a_map=_MICROBATCH_KEYS,
                         unknown=_MICROBATCH_KEYS, missing=_MICROBATCH_KEYS)
    if split:
        if len(item["pieces"]) != len(item["samples"]):
            raise _format(f"{where}: pieces must hold one piece number per sample")
        for piece in item["pieces"]:
            checks.integer(piece, "pieces", 0, (1 << 32) - 1, strict=True, fail=_in(where),
                           message="{name} must be piece numbers in [0, 2^32 - 1]")
    if item["index"] != index:
        raise _format(f"{where} has index {item['index']!r}; expected {index}")
    packs = item["packs"]
    if not packed and packs is not None:
        raise _format(f"{where} has packs but meta.json has no pack_config")
    if packed:
        for pack in checks.instance(packs, "packs", list, fail=_in(where), message=_PACKS):
            checks.instance(pack, "packs", list, empty=False, fail=_in(where), message=_PACKS)
        if [sid for p in packs for sid in p] != item["samples"]:
            raise _format(f"{where}: {_PACKS}")
    return item


_PACKS = "packs must be non-empty lists of sample ids that, joined, are samples"


def _in(where: str) -> Callable[[str], UmlosError]:
    """The ``fail`` of a line's fields: the message after the line's place."""
    return lambda message: _format(f"{where}: {message}")


def _bounds(counts: list[int]) -> np.ndarray:
    """int64 offsets ``[0, c0, c0 + c1, ...]`` of consecutive runs of these lengths."""
    bounds = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(np.asarray(counts, dtype=np.int64), out=bounds[1:])
    return bounds


def _row_of(sample_id, lookup, n: int):
    if not isinstance(sample_id, str):
        return None
    if lookup is not None:
        return lookup.get(sample_id)
    row = checks.integer_or_none(sample_id, 0, n - 1)
    return row if str(row) == sample_id else None  # the one spelling of a row number: no sign, no leading zero


def _format(message: str) -> UmlosError:
    return plan_error(errors.PLAN_FORMAT_INVALID, message)
