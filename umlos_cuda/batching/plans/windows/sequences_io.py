"""Pretraining sequences folders: the definition and the token index on disk, written atomically, read bounded.

Layout (docs/batching.md, "Pretraining sequences")::

    DIR/umlos-artifact.json   the artifact marker: {"artifact": "pretraining sequences", ...}
    DIR/meta.json             the fingerprint's header, ``tokens_path``, ``fingerprint``, ``index_digests``
    DIR/index.npy             int64 [E x (K + 1)]: each epoch's stream tokens before each window

Nothing of the documents is copied: meta.json binds their lengths (count and SHA-256, or a synthetic
source's seed) and names where the tokens were read (``tokens_path``: a token store, a sharded store or
a Megatron prefix, or a list of them; outside the fingerprint). :func:`load_sequences` reopens them from
there (``umlos_cuda.batching.sources.open_source``, read by rows), or takes
``tokens=`` (a token source) or ``lengths=`` (a length source: counts and pieces only), and refuses
lengths of another binding (PLAN_LENGTHS_MISMATCH), an index that is not running totals from 0
(PLAN_FORMAT_INVALID), another engine order (PLAN_NOT_REPRODUCIBLE) and a definition or index that do
not hash to the fingerprint (PLAN_FINGERPRINT_MISMATCH). Opening costs O(N / W) and the lengths' hash.

A mixture of pretraining sequences (:mod:`.sequence_mixture`) is a folder of its own kind, marker
``"mixed pretraining sequences"``: meta.json holds its header (each component's sequences header and
fingerprint inside), ``tokens_paths`` (one per component) and ``fingerprint``; index.npy holds the
components' indices one after another (component ``i``: ``E_i x (K_i + 1)``). Each component is checked as
a sequences folder is (:func:`_open_component`), then the mixture's header and fingerprint.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import numpy as np

from .... import checks, errors
from ....errors import UmlosError
from ....files import reader
from ....files.writer import ArtifactKind
from ...lengths.sources import identity_differences, source_identity
from ..plan import plan_error
from ..planner import order_fields
from .cut import CutDefinition
from .io import _format, absolute_paths, component_entry, reopen, save_index_folder
from .schedule import MixSchedule
from .sequence_mixture import MIXED_SEQUENCES_FORMAT, SequenceComponent, SequenceMixture
from .sequences import SEQUENCES_FORMAT, PretrainingSequences, lengths_of
from ...lengths.sources import SyntheticLengths

#: A pretraining sequences folder.
SEQUENCES = ArtifactKind("pretraining sequences")
#: A mixture of pretraining sequences folder.
MIXED_SEQUENCES = ArtifactKind("mixed pretraining sequences")
_HEADER_KEYS = ("format", "definition", "num_epochs", "lengths", "sampling_mode", "sampler_config_hash",
                "manifest_hash")
_META_KEYS = (*_HEADER_KEYS, "tokens_path", "fingerprint", "index_digests")
_DEFINITION_KEYS = ("num_documents", "sequence_length", "window", "seed", "stage", "order", "sampler_block_size",
                    "eos", "tail")
_MIXED_KEYS = ("format", "window", "num_samples", "seed", "total", "components", "tokens_paths", "fingerprint")
_COMPONENT_KEYS = ("name", "weight", "max_epochs", "sequences", "fingerprint")


def save_sequences(plan: PretrainingSequences, directory, *, tokens_path=None, force: bool = False,
                   inputs: Iterable = ()) -> str:
    """Write ``plan`` to the folder ``directory``; returns its absolute path."""
    meta = {**plan.header(), "tokens_path": absolute_paths(tokens_path), "fingerprint": plan.fingerprint,
            "index_digests": plan.index_digests()}
    identity = _identity(plan)
    if identity is not None:  # last, and only when the source keeps hashes: a folder of lengths alone is as before
        meta["tokens_identity"] = identity
    return save_index_folder(directory, SEQUENCES, meta, plan.index, force=force, inputs=inputs)


def save_mixed_sequences(mixture: SequenceMixture, directory, *, tokens_paths=None, force: bool = False,
                         inputs: Iterable = ()) -> str:
    """Write ``mixture`` to the folder ``directory`` (module docstring); ``tokens_paths``: where each component's
    tokens are found again (None each: give ``tokens=`` or ``lengths=`` to open it). Returns its absolute path."""
    paths = [None] * len(mixture.components) if tokens_paths is None else list(tokens_paths)
    if len(paths) != len(mixture.components):
        raise _format(f"tokens_paths names {len(paths)} sources for {len(mixture.components)} components")
    meta = {**mixture.header(), "tokens_paths": [absolute_paths(p) for p in paths], "fingerprint": mixture.fingerprint}
    identities = [_identity(c.sequences) for c in mixture.components]
    if any(identity is not None for identity in identities):
        meta["tokens_identities"] = identities
    index = np.concatenate([c.sequences.index.reshape(-1) for c in mixture.components])
    return save_index_folder(directory, MIXED_SEQUENCES, meta, index, force=force, inputs=inputs)


def _identity(plan: PretrainingSequences) -> dict | None:
    """What the sequences' token source keeps of its tokens and tokenizer
    (:meth:`~...lengths.sources.LengthSource.identity`), recorded so that reopening a store re-tokenized in place
    (equal lengths, other ids) is refused."""
    return source_identity(plan.tokens)


def _check_identity(recorded, tokens, root: str, where: str) -> None:
    """BATCH_STORE_MISMATCH when the reopened token source is not the one the sequences were cut from: the parts of
    its identity that differ, by name."""
    differ = identity_differences(recorded, tokens)
    if differ is None:
        return
    raise plan_error(errors.BATCH_STORE_MISMATCH, f"{where}: the token source {getattr(tokens, 'origin', None) or ''} "
                     f"is not the one these sequences were cut from: {differ}; give that source, or cut again "
                     f"(umlos-cuda plan cut) from this one ({root})")


def _read_meta(root: str, what: str) -> tuple[dict, str]:
    meta_path = os.path.join(root, "meta.json")
    if not os.path.lexists(meta_path):
        raise plan_error(errors.PLAN_NOT_FOUND, f"no {what} at {root}: {meta_path} does not exist")
    try:
        return reader.read_json(meta_path, _format), meta_path
    except FileNotFoundError:
        raise plan_error(errors.PLAN_NOT_FOUND, f"no {what} at {root}: {meta_path} does not exist") from None


def _parse_header(header, where: str) -> tuple[CutDefinition, int]:
    """A sequences header's definition and number of epochs (PLAN_FORMAT_INVALID for anything malformed)."""
    record = checks.record(header, dict.fromkeys(_HEADER_KEYS, checks.field(checks.anything)), fail=_format,
                           what=where)
    checks.equal(record["format"], f"{where} format", SEQUENCES_FORMAT, fail=_format)
    fields = checks.record(record["definition"], dict.fromkeys(_DEFINITION_KEYS, checks.field(checks.anything)),
                           fail=_format, what=f"{where} definition")
    try:
        definition = CutDefinition(**fields)
    except (UmlosError, TypeError, ValueError) as exc:
        raise _format(f"{where}: {getattr(exc, 'message', exc)}") from None
    num_epochs = checks.integer(record["num_epochs"], f"{where}: num_epochs", 1, 1 << 16, fail=_format)
    return definition, num_epochs


def _check_running(index: np.ndarray, where: str) -> None:
    if np.any(index[:, 0] != 0) or np.any(np.diff(index, axis=1) < 0):
        raise _format(f"{where}: the running token counts must start at 0 and never decrease")


def _open_component(definition: CutDefinition, index: np.ndarray, header: dict, tokens_path, root: str, where: str,
                    *, tokens, lengths, backend: str, identity=None) -> PretrainingSequences:
    """Pretraining sequences from a parsed header (:func:`_parse_header`) and their index: the lengths or tokens
    given, else the recorded ``tokens_path`` reopened (a synthetic binding opens itself), bound as recorded
    (PLAN_LENGTHS_MISMATCH), the same tokens as recorded (``identity``; BATCH_STORE_MISMATCH) and ordered as
    recorded (PLAN_NOT_REPRODUCIBLE)."""
    if tokens is None and lengths is None:
        binding = header["lengths"]
        if isinstance(binding, dict) and binding.get("kind") == "synthetic":
            lengths = SyntheticLengths(binding.get("count", 0), binding.get("seed", 0))
        elif tokens_path is None:
            raise plan_error(errors.PLAN_LENGTHS_MISMATCH, f"{where} names no tokens_path: give tokens= or "
                                                           "lengths= to open it")
        else:
            tokens = reopen(tokens_path, root, f"{where}: tokens_path", tokens=True)
    source = lengths_of(lengths if lengths is not None else tokens)
    if source.binding() != header["lengths"]:
        raise plan_error(errors.PLAN_LENGTHS_MISMATCH, f"{root}: the lengths bind as {source.binding()}; meta.json "
                                                       f"records {header['lengths']}")
    _check_identity(identity, tokens, root, where)
    plan = PretrainingSequences(definition, source, index, tokens=tokens, backend=backend)
    engine = order_fields(header)
    if plan.engine != engine:
        raise plan_error(errors.PLAN_NOT_REPRODUCIBLE, f"{where} records the engine order {engine}; the "
                                                       f"definition gives {plan.engine}")
    return plan


def load_sequences(directory, *, tokens=None, lengths=None, backend: str = "auto") -> PretrainingSequences:
    """The pretraining sequences in ``directory`` (module docstring), their tokens reopened from the recorded
    ``tokens_path`` when neither ``tokens`` nor ``lengths`` is given."""
    root = os.fspath(directory)
    meta, meta_path = _read_meta(root, "pretraining sequences")
    record = checks.record(meta, dict.fromkeys(_META_KEYS, checks.field(checks.anything)), fail=_format,
                           optional={"tokens_identity": checks.field(checks.anything)}, what=meta_path)
    definition, num_epochs = _parse_header({k: record[k] for k in _HEADER_KEYS}, meta_path)
    shape = (num_epochs * (definition.num_windows + 1),)
    index = np.asarray(reader.read_npy(os.path.join(root, "index.npy"), "<i8", shape, False, _format))
    index = index.reshape(num_epochs, definition.num_windows + 1)
    _check_running(index, f"{root}/index.npy")
    plan = _open_component(definition, index, record, record["tokens_path"], root, meta_path, tokens=tokens,
                           lengths=lengths, backend=backend, identity=record.get("tokens_identity"))
    if plan.header() != {k: record[k] for k in plan.header()} or plan.index_digests() != record["index_digests"] \
            or plan.fingerprint != record["fingerprint"]:
        raise plan_error(errors.PLAN_FINGERPRINT_MISMATCH, f"{root}: the definition and index hash to "
                                                           f"{plan.fingerprint}; meta.json records "
                                                           f"{record['fingerprint']}")
    return plan


def load_mixed_sequences(directory, *, tokens=None, lengths=None, backend: str = "auto") -> SequenceMixture:
    """The mixture of pretraining sequences in ``directory`` (module docstring): ``tokens`` or ``lengths`` (a list,
    one source per component), else each recorded ``tokens_paths`` entry reopened. Refuses what
    :func:`load_sequences` refuses, per component, and a mixture that does not hash to its fingerprint."""
    root = os.fspath(directory)
    meta, meta_path = _read_meta(root, "mixed pretraining sequences")
    record = checks.record(meta, dict.fromkeys(_MIXED_KEYS, checks.field(checks.anything)), fail=_format,
                           optional={"tokens_identities": checks.field(checks.anything),
                                     "schedule": checks.field(checks.anything)}, what=meta_path)
    checks.equal(record["format"], f"{meta_path} format", MIXED_SEQUENCES_FORMAT, fail=_format)
    entries, paths = record["components"], record["tokens_paths"]
    identities = record.get("tokens_identities", [None] * len(paths) if isinstance(paths, list) else None)
    if not isinstance(entries, list) or not isinstance(paths, list) or not isinstance(identities, list) \
            or not len(paths) == len(identities) == len(entries) or not entries:
        raise _format(f"{meta_path}: components, tokens_paths and tokens_identities must be lists of the same "
                      "length, not empty")
    for given, name in ((tokens, "tokens"), (lengths, "lengths")):
        if given is not None and len(given) != len(entries):
            raise plan_error(errors.PLAN_LENGTHS_MISMATCH, f"{root}: {len(given)} {name} given for {len(entries)} "
                                                           "components")
    parsed = []
    for i, entry in enumerate(entries):
        where = f"{meta_path} component {i}"
        entry = component_entry(entry, _COMPONENT_KEYS, where)
        parsed.append((entry, *_parse_header(entry["sequences"], f"{where} sequences")))
    sizes = [epochs * (definition.num_windows + 1) for _, definition, epochs in parsed]
    flat = np.asarray(reader.read_npy(os.path.join(root, "index.npy"), "<i8", (sum(sizes),), False, _format))
    components, at = [], 0
    for i, ((entry, definition, epochs), size) in enumerate(zip(parsed, sizes)):
        index = flat[at:at + size].reshape(epochs, definition.num_windows + 1)
        at += size
        _check_running(index, f"{root}/index.npy component {i}")
        plan = _open_component(definition, index, entry["sequences"], paths[i], root, f"{meta_path} component {i}",
                               tokens=None if tokens is None else tokens[i],
                               lengths=None if lengths is None else lengths[i], backend=backend,
                               identity=identities[i])
        weight = entry["weight"]
        value = weight[0] if weight[1] == 1 else weight[0] / weight[1]
        components.append(SequenceComponent(plan, value, entry["max_epochs"], entry["name"]))
    try:
        schedule = None if "schedule" not in record else \
            MixSchedule.from_dict(record["schedule"], len(components), _format)
        mixture = SequenceMixture(components, record["window"], record["num_samples"], record["seed"], schedule)
    except UmlosError as exc:
        raise _format(f"{meta_path}: {exc.message}") from None
    if mixture.header() != {k: record[k] for k in mixture.header()} or mixture.fingerprint != record["fingerprint"]:
        raise plan_error(errors.PLAN_FINGERPRINT_MISMATCH, f"{root}: the mixture's definition and indices hash to "
                                                           f"{mixture.fingerprint}; meta.json records "
                                                           f"{record['fingerprint']}")
    return mixture
