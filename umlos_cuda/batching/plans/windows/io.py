"""Windowed plan folders: the definition and the index on disk, written atomically, read bounded.

Layout (docs/batching.md, "Windowed plans")::

    DIR/umlos-artifact.json   the artifact marker: {"artifact": "windowed plan", ...}
    DIR/meta.json             the fingerprint's header (``pack_config`` only in a packed plan), ``lengths_path``,
                              ``fingerprint``, ``index_digests``
    DIR/index.npy             int64 [E x (K + 1) x 5]: the index (:mod:`.index`), flattened

The lengths are not copied (4 bytes a sample is the one thing a windowed plan must not hold):
meta.json binds them (count and SHA-256, or the synthetic source's seed) and names where they
were read from (``lengths_path``: the source's ``origin``, a ``.u32`` sidecar or a token source, or a list
of them; relative to DIR's parent when it was given relative; not part of the fingerprint, so the plan
may move with or without its lengths). :func:`load_windowed_plan` reopens it there
(``umlos_cuda.batching.sources.open_source``: whatever kind it is), or takes ``lengths=`` (a path, an
array or a :class:`~umlos_cuda.batching.lengths.sources.LengthSource`), and refuses lengths of another
binding.

Written through the output layer (files/writer.py): a hidden sibling folder filled and fsynced,
then renamed to DIR; ``force`` replaces a windowed plan folder only. Read through the input layer
(files/reader.py): meta.json a regular file of at most 16 MiB and bounded depth, index.npy's
header checked against its size and the shape meta.json implies before anything is read. Opening
costs the index and the header of the sidecar, O(N / W): no window is planned and no length read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import replace

import numpy as np

from .... import checks, errors
from ....errors import UmlosError
from ....files import reader
from ....files.writer import ArtifactKind, Folder, output_folder, output_member
from ..config import BatchingConfig
from ...packing.config import PackingConfig
from ..plan import plan_error
from ..planner import order_fields
from .plan import WINDOWED_FORMAT, WindowedPlan
from ...lengths.sources import ArrayLengths, LengthSource, SyntheticLengths
from ...sources import open_source
from ....remote.urls import absolute, is_remote
from .window import COUNT_FIELDS, WindowDefinition
from .plan import index_digest
from .mixed import MIXED_FORMAT, MixedPlan
from .mixture import Component, MixtureDefinition
from .blend import UNITS
from .schedule import MixSchedule

#: A windowed plan folder (every one carries the marker: none was written before markers).
WINDOWED_PLAN = ArtifactKind("windowed plan")
#: A mixed plan folder: meta.json (the header, ``pack_config`` only when it packs, ``lengths_paths``,
#: ``fingerprint``, ``index_digest``), index.npy.
MIXED_PLAN = ArtifactKind("mixed plan")
_META_KEYS = ("format", "config", "window", "num_epochs", "lengths", "count_fields", "sampling_mode",
              "sampler_config_hash", "manifest_hash", "lengths_path", "fingerprint", "index_digests")


def save_windowed_plan(plan: WindowedPlan, directory, *, lengths_path=None, force: bool = False,
                       inputs: Iterable = ()) -> str:
    """Write ``plan`` to the folder ``directory``; returns its absolute path. ``lengths_path``: where a
    later :func:`load_windowed_plan` finds the lengths (default: the source's ``origin``, if any)."""
    return save_index_folder(directory, WINDOWED_PLAN, _windowed_meta(plan, recorded(plan.source, lengths_path)),
                             plan.index, force=force, inputs=inputs)


def save_windowed_plan_into(plan: WindowedPlan, parent: Folder, name: str, *, force: bool = False,
                            sources=None) -> None:
    """Write ``plan`` to the folder ``name`` inside ``parent``, a folder held open (a batch folder's copy of its
    plan), its lengths recorded by absolute path so that the copy reopens them wherever it is read from:
    ``sources`` (a one-item list: the token source its rows were read from, which holds the same lengths) or
    the plan's own record."""
    path = sources[0] if sources is not None and sources[0] is not None else recorded(plan.source)
    write_index_member(parent, name, WINDOWED_PLAN, _windowed_meta(plan, absolute_paths(path)), plan.index,
                       force=force)


def _windowed_meta(plan: WindowedPlan, lengths_path) -> dict:
    return {**plan.header(), "lengths_path": lengths_path, "fingerprint": plan.fingerprint,
            "index_digests": plan.index_digests()}


def save_index_folder(directory, kind: ArtifactKind, meta: dict, index: np.ndarray, *, force: bool = False,
                      inputs: Iterable = ()) -> str:
    """The one writer of every windowed folder kind (windowed and mixed plans, pretraining sequences and their
    mixtures): ``index.npy`` (``index`` flattened, int64 little-endian) then ``meta.json`` (indented ASCII JSON),
    through the output layer (files/writer.py: written aside, published in one step, marker ``kind``).
    Returns the folder's absolute path."""
    with output_folder(directory, kind, force=force, inputs=inputs, operator=errors.BATCH_PLAN_OPERATOR) as folder:
        _fill_index_folder(folder, meta, index)
    return os.path.abspath(os.fspath(directory))


def write_index_member(parent: Folder, name: str, kind: ArtifactKind, meta: dict, index: np.ndarray, *,
                       force: bool = False) -> None:
    """:func:`save_index_folder` into the folder ``name`` inside ``parent``, held open (files/writer.py
    ``output_member``: a batch folder's copy of its plan)."""
    with output_member(parent, name, kind, force=force, operator=errors.BATCH_PLAN_OPERATOR) as folder:
        _fill_index_folder(folder, meta, index)


def _fill_index_folder(folder: Folder, meta: dict, index: np.ndarray) -> None:
    _write(folder, "index.npy", lambda handle: np.save(handle, np.ascontiguousarray(index, "<i8").reshape(-1),
                                                       allow_pickle=False))
    _write(folder, "meta.json", lambda handle: handle.write((json.dumps(meta, indent=2) + "\n").encode("ascii")))


def _write(folder: Folder, name: str, fill) -> None:
    with folder.file(name) as handle:
        fill(handle)


def load_windowed_plan(directory, *, lengths=None, backend: str = "auto") -> WindowedPlan:
    """The windowed plan in ``directory`` (see the module docstring): its definition, index and
    lengths checked against meta.json (PLAN_NOT_FOUND, PLAN_FORMAT_INVALID, PLAN_LENGTHS_MISMATCH,
    PLAN_FINGERPRINT_MISMATCH, PLAN_NOT_REPRODUCIBLE)."""
    root = os.fspath(directory)
    meta_path = os.path.join(root, "meta.json")
    if not os.path.lexists(meta_path):
        raise plan_error(errors.PLAN_NOT_FOUND, f"no windowed plan at {root}: {meta_path} does not exist")
    try:
        meta = reader.read_json(meta_path, _format)
    except FileNotFoundError:
        raise plan_error(errors.PLAN_NOT_FOUND, f"no windowed plan at {root}: {meta_path} does not exist") from None
    definition, num_epochs = _definition(meta, meta_path)
    shape = (num_epochs * (definition.num_windows + 1) * len(COUNT_FIELDS),)
    index = reader.read_npy(os.path.join(root, "index.npy"), "<i8", shape, False, _format)
    index = np.asarray(index).reshape(num_epochs, definition.num_windows + 1, len(COUNT_FIELDS))
    _check_index(index, definition, os.path.join(root, "index.npy"))
    source = _source(lengths, meta, root, meta_path)
    if source.binding() != meta["lengths"]:
        raise plan_error(errors.PLAN_LENGTHS_MISMATCH, f"{root}: the lengths bind as {source.binding()}; meta.json "
                                                       f"records {meta['lengths']}")
    plan = WindowedPlan(definition, source, index, backend=backend)
    engine = order_fields(meta)
    if plan.engine != engine:
        raise plan_error(errors.PLAN_NOT_REPRODUCIBLE, f"{meta_path} records the engine order {engine}; the "
                                                       f"configuration gives {plan.engine}")
    digests = plan.index_digests()
    if plan.header() != {k: meta[k] for k in plan.header()} or digests != meta["index_digests"] \
            or plan.fingerprint != meta["fingerprint"]:
        raise plan_error(errors.PLAN_FINGERPRINT_MISMATCH,
                         f"{root}: the plan's definition and index hash to {plan.fingerprint}; "
                         f"meta.json records {meta['fingerprint']}")
    return plan


def _definition(meta, where: str) -> tuple[WindowDefinition, int]:
    record = checks.record(meta, dict.fromkeys(_META_KEYS, checks.field(checks.anything)), fail=_format,
                           optional={"pack_config": checks.field(checks.anything)}, what=where)
    checks.equal(record["format"], f"{where} format", WINDOWED_FORMAT, fail=_format)
    if record["count_fields"] != list(COUNT_FIELDS):
        raise _format(f"{where}: count_fields must be {list(COUNT_FIELDS)}")
    window = checks.record(record["window"], dict.fromkeys(("window", "edge", "num_samples"),
                                                           checks.field(checks.anything)),
                           fail=_format, what=f"{where} window")
    try:
        config = BatchingConfig.from_dict(record["config"])
        if "pack_config" in record:  # a packed windowed plan (packed.py); absent otherwise
            config = replace(config, pack=PackingConfig.from_dict(record["pack_config"]))
        definition = WindowDefinition(config, window["num_samples"], window["window"], window["edge"])
    except UmlosError as exc:
        raise _format(f"{where}: {exc.message}") from None
    num_epochs = checks.integer(record["num_epochs"], f"{where}: num_epochs", 1, 1 << 16, fail=_format)
    if not isinstance(record["lengths"], dict):
        raise _format(f"{where}: lengths must be an object")
    return definition, num_epochs


def _check_index(index: np.ndarray, definition: WindowDefinition, where: str) -> None:
    """Running totals from 0, never decreasing, every position of each epoch a sample or a skip."""
    if np.any(index[:, 0] != 0) or np.any(np.diff(index, axis=1) < 0):
        raise _format(f"{where}: the running counts must start at 0 and never decrease")
    steps = np.diff(index, axis=1)
    positions = np.full(definition.num_windows, definition.window, dtype=np.int64)
    positions[-1] = definition.num_samples - (definition.num_windows - 1) * definition.window
    if np.any(steps[:, :, 1] + steps[:, :, 2] != positions):
        raise _format(f"{where}: a window's samples and skipped samples must be its positions")
    if np.any(index[:, -1, 1] + index[:, -1, 2] != definition.num_samples):
        raise _format(f"{where}: each epoch's samples and skipped samples must be the {definition.num_samples}")


def _source(lengths, meta: dict, root: str, where: str) -> LengthSource:
    if isinstance(lengths, LengthSource):
        return lengths
    if lengths is not None and not isinstance(lengths, (str, os.PathLike)):
        return ArrayLengths(lengths)
    binding = meta["lengths"]
    if lengths is None and binding.get("kind") == "synthetic":
        try:
            return SyntheticLengths(binding.get("count"), binding.get("seed"))
        except UmlosError as exc:
            raise _format(f"{where}: lengths: {exc.message}") from None
    if lengths is not None:
        return open_source(lengths, recorded=True)
    if meta["lengths_path"] is None:
        raise plan_error(errors.PLAN_LENGTHS_MISMATCH, f"{where} names no lengths_path: give the lengths (a source's "
                                                       "path, an array, a source) to open it")
    return reopen(meta["lengths_path"], root, f"{where}: lengths_path")


def recorded(source: LengthSource, given=None):
    """What a folder records about where ``source`` was read: ``given`` (a path, or a list of paths), else the
    source's ``origin`` (a list's: each part's); None when it has none (lengths held in memory)."""
    if given is None:
        origins = getattr(source, "origins", None)
        given = origins() if callable(origins) else source.origin
    if isinstance(given, (list, tuple)):
        return [None if p is None else os.fspath(p) for p in given]
    return None if given is None else os.fspath(given)


def absolute_paths(path) -> str | list[str | None] | None:
    """A source's recorded path (or a list's paths) made absolute, for a folder that may be read from elsewhere
    (an object-store URL stays as it is; None stays None: lengths held in memory)."""
    if isinstance(path, (list, tuple)):
        return [None if item is None else absolute(item) for item in path]
    return None if path is None else absolute(path)


def reopen(path, root: str, where: str, *, tokens: bool = False) -> LengthSource:
    """The source a folder in ``root`` records at ``path`` (a path, or a non-empty list of paths: a list of
    sources), reopened by ``open_source`` whatever its kind; a relative path is read from ``root``'s parent, an
    object-store URL as it is.
    PLAN_FORMAT_INVALID when the record is neither."""
    parent = os.path.dirname(os.path.abspath(root))
    listed = path if isinstance(path, list) and path else [path]
    resolved = [_resolve(parent, checks.text(item, where, fail=_format)) for item in listed]
    return open_source(resolved if isinstance(path, list) else resolved[0], tokens=tokens, recorded=True)


def _resolve(parent: str, path: str) -> str:
    """A recorded path read from ``parent`` when relative; an object-store URL as it is."""
    return path if is_remote(path) else os.path.join(parent, path)


def component_entry(entry, keys, where: str) -> dict:
    """A mixture component's entry in meta.json (a mixed plan's, a mixture of sequences'): an object of exactly
    ``keys`` whose ``weight`` is an exact positive fraction ``[numerator, denominator]`` (PLAN_FORMAT_INVALID)."""
    entry = checks.record(entry, dict.fromkeys(keys, checks.field(checks.anything)), fail=_format, what=where)
    weight = entry["weight"]
    if (not isinstance(weight, list) or len(weight) != 2 or not all(type(v) is int for v in weight)
            or weight[0] <= 0 or weight[1] <= 0):
        raise _format(f"{where}: weight must be [numerator, denominator], positive integers")
    return entry


def _format(message: str) -> UmlosError:
    return plan_error(errors.PLAN_FORMAT_INVALID, message)



# ---------------------------------------------------------------------- mixed plans (mixture.py, mixed.py)
_MIXED_KEYS = ("format", "config", "mixture", "count_fields", "lengths_paths", "fingerprint", "index_digest")
_MIXTURE_KEYS = ("window", "num_samples", "total", "components")
_COMPONENT_KEYS = ("name", "weight", "seed", "max_epochs", "lengths", "order")


def save_mixed_plan(plan, directory, *, lengths_paths=None, force: bool = False, inputs: Iterable = ()) -> str:
    """Write the :class:`~.mixed.MixedPlan` ``plan`` to ``directory`` (the layout of a windowed plan folder,
    marker ``mixed plan``); ``lengths_paths``: where each component's lengths are found (default: each
    mapped sidecar's path, None for the others)."""

    return save_index_folder(directory, MIXED_PLAN, _mixed_meta(plan, lengths_paths), plan.index, force=force,
                             inputs=inputs)


def save_mixed_plan_into(plan, parent: Folder, name: str, *, force: bool = False, sources=None) -> None:
    """Write the mixed plan ``plan`` to the folder ``name`` inside ``parent``, a folder held open (a batch folder's
    copy of its plan), each component's lengths recorded by absolute path so that the copy reopens them wherever
    it is read from: ``sources`` (one per component: the token source its rows were read from, which holds the
    same lengths; None for one: the plan's own record) or the plan's own records."""
    given = [None] * len(plan.definition.sources) if sources is None else list(sources)
    paths = [absolute_paths(path if path is not None else recorded(source))
             for source, path in zip(plan.definition.sources, given)]
    write_index_member(parent, name, MIXED_PLAN, _mixed_meta(plan, paths), plan.index, force=force)


def _mixed_meta(plan, lengths_paths) -> dict:
    sources = plan.definition.sources
    paths = [recorded(s) for s in sources] if lengths_paths is None else [recorded(s, p) for s, p in
                                                                           zip(sources, lengths_paths)]
    if lengths_paths is not None and len(lengths_paths) != len(sources):
        raise _format(f"lengths_paths names {len(lengths_paths)} files for {len(sources)} components")
    return {**plan.header(), "lengths_paths": paths, "fingerprint": plan.fingerprint,
            "index_digest": index_digest(0, plan.index[0])}


def load_mixed_plan(directory, *, lengths=None, backend: str = "auto"):
    """The mixed plan in ``directory``: each component's lengths from ``lengths`` (a list, one per component:
    a path, an array or a source) or meta.json's ``lengths_paths``, bound as recorded, and the definition
    and index hashing to the fingerprint (PLAN_NOT_FOUND, PLAN_FORMAT_INVALID, PLAN_LENGTHS_MISMATCH,
    PLAN_FINGERPRINT_MISMATCH). O(N / W): no window planned."""

    root = os.fspath(directory)
    meta_path = os.path.join(root, "meta.json")
    try:
        meta = reader.read_json(meta_path, _format) if os.path.lexists(meta_path) else None
    except FileNotFoundError:
        meta = None
    if meta is None:
        raise plan_error(errors.PLAN_NOT_FOUND, f"no mixed plan at {root}: {meta_path} does not exist")
    record = checks.record(meta, dict.fromkeys(_MIXED_KEYS, checks.field(checks.anything)), fail=_format,
                           optional={"pack_config": checks.field(checks.anything)}, what=meta_path)
    checks.equal(record["format"], f"{meta_path} format", MIXED_FORMAT, fail=_format)
    if record["count_fields"] != list(COUNT_FIELDS):
        raise _format(f"{meta_path}: count_fields must be {list(COUNT_FIELDS)}")
    mixture = checks.record(record["mixture"], dict.fromkeys(_MIXTURE_KEYS, checks.field(checks.anything)),
                            fail=_format, what=f"{meta_path} mixture",
                            optional={"schedule": checks.field(checks.anything), "unit": checks.field(checks.anything)})
    if "unit" in mixture and mixture["unit"] not in UNITS[1:]:  # recorded only when the weights count tokens
        raise _format(f"{meta_path}: mixture.unit must be one of {', '.join(UNITS[1:])} (a mixture counted in samples "
                      "records none)")
    entries = mixture["components"]
    paths = record["lengths_paths"]
    if not isinstance(entries, list) or not isinstance(paths, list) or len(paths) != len(entries):
        raise _format(f"{meta_path}: mixture.components and lengths_paths must be lists of the same length")
    if lengths is not None and len(lengths) != len(entries):
        raise plan_error(errors.PLAN_LENGTHS_MISMATCH, f"{root}: {len(lengths)} lengths given for "
                                                       f"{len(entries)} components")
    components = []
    for i, entry in enumerate(entries):
        where = f"{meta_path} component {i}"
        entry = component_entry(entry, _COMPONENT_KEYS, where)
        if not isinstance(entry["lengths"], dict):
            raise _format(f"{where}: lengths must be an object")
        source = _source(None if lengths is None else lengths[i],
                         {"lengths": entry["lengths"], "lengths_path": paths[i]}, root, where)
        if source.binding() != entry["lengths"]:
            raise plan_error(errors.PLAN_LENGTHS_MISMATCH, f"{root}: component {i}'s lengths bind as "
                                                           f"{source.binding()}; meta.json records {entry['lengths']}")
        weight = entry["weight"]
        value = weight[0] if weight[1] == 1 else weight[0] / weight[1]
        components.append(Component(source, value, entry["seed"], entry["max_epochs"], entry["name"]))
    try:
        config = BatchingConfig.from_dict(record["config"])
        if "pack_config" in record:  # a packed mixed plan (packed.py); absent otherwise
            config = replace(config, pack=PackingConfig.from_dict(record["pack_config"]))
        schedule = None if "schedule" not in mixture else \
            MixSchedule.from_dict(mixture["schedule"], len(components), _format)
        definition = MixtureDefinition(config, tuple(components), mixture["window"], mixture["num_samples"],
                                       schedule, mixture.get("unit", "samples"))
    except UmlosError as exc:
        raise _format(f"{meta_path}: {exc.message}") from None
    windows = definition.num_windows
    index = reader.read_npy(os.path.join(root, "index.npy"), "<i8", ((windows + 1) * len(COUNT_FIELDS),), False,
                            _format)
    index = np.asarray(index).reshape(1, windows + 1, len(COUNT_FIELDS))
    sizes = np.concatenate([np.full(s.windows, s.size, dtype=np.int64) for s in definition.segments])
    steps = np.diff(index[0], axis=0)
    if np.any(index[0, 0] != 0) or np.any(steps < 0) or np.any(steps[:, 1] + steps[:, 2] != sizes):
        raise _format(f"{os.path.join(root, 'index.npy')}: the running counts must start at 0, never decrease and "
                      "cover every position of each window")
    plan = MixedPlan(definition, index, backend=backend)
    if plan.header() != {k: meta[k] for k in plan.header()} or plan.fingerprint != meta["fingerprint"]:
        raise plan_error(errors.PLAN_FINGERPRINT_MISMATCH,
                         f"{root}: the mixture's definition and index hash to {plan.fingerprint}; "
                         f"meta.json records {meta['fingerprint']}")
    return plan
