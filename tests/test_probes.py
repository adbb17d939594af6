"""The functional probe set and fingerprint (docs/spec/rng.md §6; umlos_cuda.rng.probes)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

import oracle
import umlos_cuda as uc
from nbcases import raw_manifest
from umlos_cuda import errors
from umlos_cuda.rng.probes import PROBE_SIZE, functional_fp, functional_fp_preimage, probe_dataset, probe_indices


def two_datasets(train_n: int = 5000, val_n: int = 300) -> dict:
    raw = raw_manifest(train_n, 64, 48)
    raw["datasets"]["val"] = {"id": "val-set", "version": "1", "hash": "sha256:" + "1" * 64, "cardinality": val_n}
    return raw


def test_the_first_1024_samples_in_ascending_order():
    probes = probe_indices(raw_manifest(5000, 64, 48))
    assert probes.dtype == np.uint64 and probes.tolist() == list(range(PROBE_SIZE))


@pytest.mark.parametrize("n", [1, 2, 30, 1023])
def test_small_datasets_repeat_from_the_start(n):
    assert probe_indices(raw_manifest(n, 64, 48)).tolist() == [i % n for i in range(PROBE_SIZE)]


def test_a_dataset_is_named_when_the_manifest_has_several():
    raw = two_datasets()
    assert probe_indices(raw, "val").tolist() == [i % 300 for i in range(PROBE_SIZE)]
    assert probe_indices(raw, "train").tolist() == list(range(PROBE_SIZE))
    with pytest.raises(uc.UmlosError) as info:
        probe_dataset(raw)
    assert info.value.code == errors.INVALID_DATASET_KEY and "train, val" in info.value.message
    with pytest.raises(uc.UmlosError) as info:
        probe_indices(raw, "test")
    assert info.value.code == errors.INVALID_DATASET_KEY


def test_an_empty_dataset_has_no_probe_set():
    with pytest.raises(uc.UmlosError) as info:
        probe_indices(raw_manifest(0, 64, 48))
    assert info.value.code == errors.CARDINALITY_MISMATCH


def test_functional_fp_bytes():
    preimage = struct.pack(">d", 0.6931471805599453) + struct.pack(">d", 0.5) + b"multiclass" + b"UML_OS-v3.8-OS"
    assert functional_fp_preimage(0.6931471805599453, 0.5, "multiclass", "UML_OS-v3.8-OS") == preimage
    assert functional_fp(0.6931471805599453, 0.5, "multiclass", "UML_OS-v3.8-OS") == oracle.sha256(preimage)
    assert functional_fp(np.float64(0.25), 1, "regression", "v") == oracle.sha256(
        struct.pack(">dd", 0.25, 1.0) + b"regressionv")


@pytest.mark.parametrize("loss,metric,task,spec", [
    (float("nan"), 0.5, "binary", "v"), (0.1, float("inf"), "binary", "v"), ("0.1", 0.5, "binary", "v"),
    (True, 0.5, "binary", "v"), (0.1, 0.5, "classification", "v"), (0.1, 0.5, "binary", ""),
])
def test_bad_functional_inputs_are_refused(loss, metric, task, spec):
    with pytest.raises(uc.UmlosError) as info:
        functional_fp(loss, metric, task, spec)
    assert info.value.code == errors.FINGERPRINT_INPUT_INVALID
    if task == "classification":
        assert "multiclass, binary, regression" in info.value.message
