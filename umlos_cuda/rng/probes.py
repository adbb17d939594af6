"""The functional probe set and fingerprint (docs/spec/rng.md §6, Fingerprint.Functional_v1).

A trainer measures its model on a fixed probe set and hashes the two means,
so that two runs can be compared by one 32-byte value. The data plane owns
which samples are probed: the first 1024 of the dataset, in ascending index
order, never shuffled, repeating from the start when the dataset has fewer
than 1024. Which dataset: the one named, else the first (by key) whose
``split`` is ``val``, else the first whose ``split`` is ``train``, else the
manifest's only dataset. The trainer computes ``probe_loss`` and
``probe_metric`` (binary64 means over the probe set) and
:func:`functional_fp` hashes them with the task type and the spec version.
The bytes are in docs/spec/rng.md §6.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from .. import checks, errors
from ..errors import UmlosError
from ..hashing import sha256
from ..manifest.core import as_manifest

#: Samples in the probe set (docs/spec/rng.md §6).
PROBE_SIZE = 1024
#: The task types of the v3.8 kernel's manifest (docs/manifest.md, "The dataset list").
TASK_TYPES = ("multiclass", "binary", "regression")
OPERATOR = "UML_OS.Fingerprint.Functional_v1"


def probe_dataset(manifest: Any, dataset_key: str | None = None) -> str:
    """The key of the dataset the probe set is drawn from (module docstring)."""
    manifest = as_manifest(manifest)
    if dataset_key is not None:
        manifest.dataset(dataset_key)  # INVALID_DATASET_KEY naming the keys
        return dataset_key
    keys = sorted(manifest.datasets)
    for split in ("val", "train"):
        for key in keys:
            if getattr(manifest.datasets[key], "split", None) == split:
                return key
    if len(keys) == 1:
        return keys[0]
    raise UmlosError(
        errors.INVALID_DATASET_KEY,
        f"the manifest has {len(keys)} datasets and none declares split val or train; "
        f"name the probe dataset: one of {', '.join(keys) or '(none)'}",
        operator=OPERATOR,
    )


def probe_indices(manifest: Any, dataset_key: str | None = None) -> np.ndarray:
    """The canonical probe set: ``[i mod N for i in 0..1023]`` of the probe
    dataset, as uint64 (ascending, repeating from 0 when ``N < 1024``)."""
    manifest = as_manifest(manifest)
    key = probe_dataset(manifest, dataset_key)
    n = manifest.datasets[key].cardinality
    if n == 0:
        raise UmlosError(errors.CARDINALITY_MISMATCH, f"dataset {key!r} has cardinality 0: it has no sample to probe",
                         operator=OPERATOR, dataset_key=key)
    return np.arange(PROBE_SIZE, dtype=np.uint64) % np.uint64(n)


def functional_fp_preimage(probe_loss: float, probe_metric: float, task_type: str, spec_version: str) -> bytes:
    """``binary64_be(probe_loss) || binary64_be(probe_metric) || utf8(task_type) || utf8(spec_version)``."""
    parts: list[bytes] = []
    for name, value in (("probe_loss", probe_loss), ("probe_metric", probe_metric)):
        value = checks.number(value, name, fail=_invalid, message=(
            "{name} must be a binary64 number, got {type}",
            "{name} is {value}: a non-finite probe result aborts the run, it is not fingerprinted"))
        parts.append(struct.pack(">d", value))
    if task_type not in TASK_TYPES:
        raise _invalid(f"task_type {task_type!r} is not one of {', '.join(TASK_TYPES)}")
    checks.text(spec_version, "spec_version", empty=False, fail=_invalid,
                message="{name} must be non-empty text, got {value!r}")
    return b"".join(parts) + task_type.encode("utf-8") + spec_version.encode("utf-8")


def functional_fp(probe_loss: float, probe_metric: float, task_type: str, spec_version: str) -> bytes:
    """``functional_fp = SHA-256(probe_loss_bytes || probe_metric_bytes || task_type || spec_version)`` (32 bytes)."""
    return sha256(functional_fp_preimage(probe_loss, probe_metric, task_type, spec_version))


def _invalid(message: str) -> UmlosError:
    return UmlosError(errors.FINGERPRINT_INPUT_INVALID, message, operator=OPERATOR)
