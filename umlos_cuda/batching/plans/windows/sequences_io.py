"""Pretraining sequences folders: the definition and the token index on disk, written atomically, read bounded.

Layout (docs/batching.md, "Pretraining sequences")::

    DIR/umlos-artifact.json   the artifact marker: {"artifact": "pretraining sequences", ...}
    DIR/meta.json             the fingerprint's header, ``tokens_path``, ``fingerprint``, ``index_digests``
    DIR/index.npy             int64 [E x (K + 1)]: each epoch's stream tokens before each window

Nothing of the documents is copied: meta.json binds their lengths (count and SHA-256, or a synthetic
source's seed) and names where the tokens were read (``tokens_path``: a token store, a sharded store or
a Megatron prefix; outside the fingerprint). :func:`load_sequences` opens them from there (through
``open_tokens``: ``tokens/pretraining.py``'s ``load_pretraining`` passes it), or takes
``tokens=`` (a token source) or ``lengths=`` (a length source: counts and pieces only), and refuses
lengths of another binding (PLAN_LENGTHS_MISMATCH), an index that is not running totals from 0
(PLAN_FORMAT_INVALID), another engine order (PLAN_NOT_REPRODUCIBLE) and a definition or index that do
not hash to the fingerprint (PLAN_FINGERPRINT_MISMATCH). Opening costs O(N / W) and the lengths' hash.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable

import numpy as np

from .... import checks, errors
from ....errors import UmlosError
from ....files import reader
from ....files.artifacts import marked_kind
from ....files.folder import Folder
from ....files.writer import ArtifactKind, output_folder
from ..plan import plan_error
from .cut import CutDefinition
from .io import _format
from .sequences import SEQUENCES_FORMAT, PretrainingSequences, lengths_of
from .sources import SyntheticLengths

#: A pretraining sequences folder.
SEQUENCES = ArtifactKind("pretraining sequences")
_META_KEYS = ("format", "definition", "num_epochs", "lengths", "sampling_mode", "sampler_config_hash",
              "manifest_hash", "tokens_path", "fingerprint", "index_digests")
_DEFINITION_KEYS = ("num_documents", "sequence_length", "window", "seed", "stage", "order", "sampler_block_size",
                    "eos", "tail")


def is_sequences(directory) -> bool:
    """Whether ``directory`` is a pretraining sequences folder, by its marker; never fails (``plan verify``
    asks before choosing its checks)."""
    try:
        with Folder.open(os.fspath(directory)) as folder:
            return marked_kind(folder) == SEQUENCES.name
    except (OSError, ValueError):
        return False


def save_sequences(plan: PretrainingSequences, directory, *, tokens_path=None, force: bool = False,
                   inputs: Iterable = ()) -> str:
    """Write ``plan`` to the folder ``directory``; returns its absolute path."""
    meta = {**plan.header(), "tokens_path": None if tokens_path is None else os.path.abspath(os.fspath(tokens_path)),
            "fingerprint": plan.fingerprint, "index_digests": plan.index_digests()}
    with output_folder(directory, SEQUENCES, force=force, inputs=inputs,
                       operator=errors.BATCH_PLAN_OPERATOR) as folder:
        with folder.file("index.npy") as handle:
            np.save(handle, np.ascontiguousarray(plan.index, "<i8").reshape(-1), allow_pickle=False)
        with folder.file("meta.json") as handle:
            handle.write((json.dumps(meta, indent=2) + "\n").encode("ascii"))
    return os.path.abspath(os.fspath(directory))


def load_sequences(directory, *, tokens=None, lengths=None, backend: str = "auto",
                   open_tokens: Callable | None = None) -> PretrainingSequences:
    """The pretraining sequences in ``directory`` (module docstring); ``open_tokens(path)`` opens the recorded
    ``tokens_path`` when neither ``tokens`` nor ``lengths`` is given (the tokens layer passes its opener:
    ``umlos_cuda.batching.tokens.pretraining.load_pretraining``)."""
    root = os.fspath(directory)
    meta_path = os.path.join(root, "meta.json")
    if not os.path.lexists(meta_path):
        raise plan_error(errors.PLAN_NOT_FOUND, f"no pretraining sequences at {root}: {meta_path} does not exist")
    meta = reader.read_json(meta_path, _format)
    record = checks.record(meta, dict.fromkeys(_META_KEYS, checks.field(checks.anything)), fail=_format,
                           what=meta_path)
    checks.equal(record["format"], f"{meta_path} format", SEQUENCES_FORMAT, fail=_format)
    fields = checks.record(record["definition"], dict.fromkeys(_DEFINITION_KEYS, checks.field(checks.anything)),
                           fail=_format, what=f"{meta_path} definition")
    try:
        definition = CutDefinition(**fields)
    except (UmlosError, TypeError, ValueError) as exc:
        raise _format(f"{meta_path}: {getattr(exc, 'message', exc)}") from None
    num_epochs = checks.integer(record["num_epochs"], f"{meta_path}: num_epochs", 1, 1 << 16, fail=_format)
    shape = (num_epochs * (definition.num_windows + 1),)
    index = np.asarray(reader.read_npy(os.path.join(root, "index.npy"), "<i8", shape, False, _format))
    index = index.reshape(num_epochs, definition.num_windows + 1)
    if np.any(index[:, 0] != 0) or np.any(np.diff(index, axis=1) < 0):
        raise _format(f"{root}/index.npy: the running token counts must start at 0 and never decrease")
    if tokens is None and lengths is None:
        binding = record["lengths"]
        if isinstance(binding, dict) and binding.get("kind") == "synthetic":
            lengths = SyntheticLengths(binding.get("count", 0), binding.get("seed", 0))
        elif record["tokens_path"] is None:
            raise plan_error(errors.PLAN_LENGTHS_MISMATCH, f"{meta_path} names no tokens_path: give tokens= or "
                                                           "lengths= to open it")
        elif open_tokens is None:
            raise plan_error(errors.PLAN_LENGTHS_MISMATCH, f"{meta_path}: give tokens= or lengths=, or open it with "
                                                           "umlos_cuda.batching.tokens.pretraining.load_pretraining, "
                                                           "which opens its tokens_path")
        else:
            tokens = open_tokens(checks.text(record["tokens_path"], "tokens_path", fail=_format))
    source = lengths_of(lengths if lengths is not None else tokens)
    if source.binding() != record["lengths"]:
        raise plan_error(errors.PLAN_LENGTHS_MISMATCH, f"{root}: the lengths bind as {source.binding()}; meta.json "
                                                       f"records {record['lengths']}")
    plan = PretrainingSequences(definition, source, index, tokens=tokens, backend=backend)
    engine = {key: record[key] for key in ("sampling_mode", "sampler_config_hash", "manifest_hash")}
    if plan.engine != engine:
        raise plan_error(errors.PLAN_NOT_REPRODUCIBLE, f"{meta_path} records the engine order {engine}; the "
                                                       f"definition gives {plan.engine}")
    if plan.header() != {k: record[k] for k in plan.header()} or plan.index_digests() != record["index_digests"] \
            or plan.fingerprint != record["fingerprint"]:
        raise plan_error(errors.PLAN_FINGERPRINT_MISMATCH, f"{root}: the definition and index hash to "
                                                           f"{plan.fingerprint}; meta.json records "
                                                           f"{record['fingerprint']}")
    return plan
