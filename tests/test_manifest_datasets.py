"""The dataset list of the v3.8 kernel's manifest (umlos_cuda.manifest.datasets, docs/manifest.md
"The dataset list"): a list and the map it stands for are one manifest with
one hash; every map manifest keeps the hash it had; what is refused."""

from __future__ import annotations

import json
import os

import pytest

import oracle
import umlos_cuda as uc
from umlos_cuda import errors

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = {"id": "corpus", "version": "3", "hash": "sha256:00", "cardinality": 100000}
VAL = {"id": "corpus-val", "version": "3", "hash": "sha256:01", "cardinality": 5000}


def listed(*entries) -> dict:
    return {"seed": 5, "global_batch_size": 64, "datasets": list(entries)}


def test_a_list_is_the_map_keyed_by_split():
    as_list = uc.Manifest.from_dict(listed({**VAL, "split": "val"}, {**TRAIN, "split": "train"}))
    as_map = uc.Manifest.from_dict({"seed": 5, "global_batch_size": 64, "datasets": {
        "train": {**TRAIN, "split": "train"}, "val": {**VAL, "split": "val"}}})
    assert as_list.hash == as_map.hash and as_list.canonical == as_map.canonical
    assert as_list.hash == oracle.manifest_hash(as_map.to_dict())
    assert as_list.dataset("val") == uc.manifest.DatasetSpec("val", 5000, "corpus-val", "3", "sha256:01", "val")
    assert uc.epoch_indices(as_list, "train", count=100, backend="numpy").tolist() == \
        uc.epoch_indices(as_map, "train", count=100, backend="numpy").tolist()


def test_the_probe_set_reads_the_val_split():
    manifest = uc.Manifest.from_dict(listed({**TRAIN, "split": "train"}, {**VAL, "cardinality": 700, "split": "val"}))
    assert uc.probe_indices(manifest).tolist() == [i % 700 for i in range(1024)]
    only_train = uc.Manifest.from_dict(listed({**TRAIN, "cardinality": 10, "split": "train"}))
    assert uc.probe_indices(only_train).tolist() == [i % 10 for i in range(1024)]


def test_map_manifests_keep_their_hashes():
    """Every manifest of the NextBatch_v2 golden file and the specification's
    toy manifest hash as they did before the list form existed."""
    with open(os.path.join(ROOT, "golden", "nextbatch_v2.json"), encoding="utf-8") as handle:
        golden = json.load(handle)
    cases = [case for case in golden["cases"] if case["kind"] == "manifest"]
    assert len(cases) == len(golden["manifests"])
    for case in cases:
        raw = golden["manifests"][case["input"]["manifest"]]
        assert uc.Manifest.from_dict(raw).hash.hex() == case["expected"]["manifest_hash"]
    toy = {"seed": 14, "global_batch_size": 12, "data": {"sampler_block_size": 8}, "datasets": {"toy": {
        "id": "toy-corpus", "version": "1", "cardinality": 30,
        "hash": "sha256:43fad7b30c9b261852fa389f76f18575dee5d816ac770dbbea3c39ec5f4efd69"}}}
    assert uc.Manifest.from_dict(toy).hash.hex() == "a7097e118d9533784ec067b73408b2a99b54d2c5d9e1e48f713a4b07f8f9d6aa"


def test_a_split_in_a_map_entry_is_optional_and_hashed():
    plain = uc.Manifest.from_dict({"global_batch_size": 8, "datasets": {"a": TRAIN}})
    stated = uc.Manifest.from_dict({"global_batch_size": 8, "datasets": {"a": {**TRAIN, "split": "train"}}})
    assert plain.dataset("a").split is None and stated.dataset("a").split == "train"
    assert plain.hash != stated.hash


@pytest.mark.parametrize("datasets,words", [
    ([{**TRAIN}], "lacks split"),
    ([{**TRAIN, "split": "test"}], "train, val"),
    ([{**TRAIN, "split": "train"}, {**VAL, "split": "train"}], "second dataset with split 'train'"),
    ([["corpus"]], "datasets[0] must be a mapping"),
    ([{**TRAIN, "split": "train", "cardinalty": 3}], "did you mean"),
    ([{"id": "x", "version": "1", "hash": "h", "split": "val"}], "lacks cardinality"),
    ({"a": {**TRAIN, "split": "validation"}}, "train, val"),
    ({"a": {**TRAIN, "split": None}}, "train, val"),
    ("train", "got str"),
])
def test_refused(datasets, words):
    with pytest.raises(uc.UmlosError) as info:
        uc.Manifest.from_dict({"global_batch_size": 8, "datasets": datasets})
    assert info.value.code == errors.INVALID_MANIFEST
    assert words in info.value.message and info.value.message.endswith("(see docs/manifest.md)")


def test_the_list_form_loads_from_yaml(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("global_batch_size: 8\ndatasets:\n"
                    "  - {id: c, version: '1', hash: h, split: val, cardinality: 40}\n"
                    "  - {id: c, version: '1', hash: h, split: train, cardinality: 400}\n")
    manifest = uc.Manifest.load(path)
    assert {key: spec.cardinality for key, spec in manifest.datasets.items()} == {"train": 400, "val": 40}
