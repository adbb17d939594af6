"""A Manifest cannot change once hashed (umlos_cuda/manifest/core.py, manifest/view.py).

``manifest_hash`` binds a run: the metadata of every batch carries it. If
``m.canonical["global_batch_size"] = 8`` were allowed, ``next_batch`` would
return 8 indices per step while ``m.hash`` still named the manifest as
loaded. Every way to change a manifest raises ``TypeError`` (its mappings and
lists) or ``AttributeError`` (its attributes), and the engine never reads the
views, so even a view changed behind its back does not change a batch.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import pickle

import pytest

import umlos_cuda as uc
from umlos_cuda import errors
from umlos_cuda.hashing import hash_canonical
from umlos_cuda.manifest.core import as_manifest

RAW = {
    "seed": 7,
    "global_batch_size": 4,
    "data": {"sampler_block_size": 16, "drop_last": False},
    "datasets": {"train": {"id": "corpus", "version": "3", "hash": "sha256:00", "cardinality": 100}},
    "policy": {"precision": "bf16", "stages": ["a", "b"]},
    "extra": {"owner": "a", "tags": [1, {"x": None}]},
}


def manifest() -> uc.Manifest:
    return uc.Manifest.from_dict(RAW)


def first_batch(m: uc.Manifest) -> uc.Batch:
    return uc.next_batch(m, "train", backend="numpy")


# ------------------------------------------------------------------ refusals
DICT_EDITS = {
    "item assignment": lambda d: d.__setitem__("global_batch_size", 8),
    "new key": lambda d: d.__setitem__("new", 1),
    "del": lambda d: d.__delitem__("seed"),
    "update": lambda d: d.update(seed=1),
    "setdefault": lambda d: d.setdefault("new", 1),
    "pop": lambda d: d.pop("seed"),
    "popitem": lambda d: d.popitem(),
    "clear": lambda d: d.clear(),
    "|=": lambda d: d.__ior__({"seed": 1}),
    "__init__ again": lambda d: d.__init__({"seed": 1}),
}


@pytest.mark.parametrize("edit", DICT_EDITS.values(), ids=DICT_EDITS.keys())
def test_canonical_refuses_every_edit(edit):
    m = manifest()
    with pytest.raises(TypeError, match="read-only once hashed"):
        edit(m.canonical)
    assert m.canonical == m.to_dict() and hash_canonical(m.canonical) == m.hash


@pytest.mark.parametrize(
    "path",
    [("datasets",), ("datasets", "train"), ("data",), ("policy",), ("extra",), ("extra", "tags", 1)],
    ids=lambda path: ".".join(map(str, path)),
)
def test_nested_mappings_refuse_edits(path):
    m = manifest()
    target = m.canonical
    for step in path:
        target = target[step]
    with pytest.raises(TypeError):
        target["cardinality"] = 5
    with pytest.raises(TypeError):
        target.update({"x": 1})


def test_the_dataset_entry_of_the_issue_cannot_grow():
    m = manifest()
    with pytest.raises(TypeError):
        m.canonical["datasets"]["train"]["cardinality"] = 5
    with pytest.raises(TypeError):
        m.canonical["data"]["drop_last"] = True
    assert m.dataset("train").cardinality == 100 and m.canonical["datasets"]["train"]["cardinality"] == 100


LIST_EDITS = {
    "append": lambda seq: seq.append(3),
    "extend": lambda seq: seq.extend([3]),
    "insert": lambda seq: seq.insert(0, 3),
    "item assignment": lambda seq: seq.__setitem__(0, 3),
    "slice assignment": lambda seq: seq.__setitem__(slice(0, 1), [3]),
    "del": lambda seq: seq.__delitem__(0),
    "pop": lambda seq: seq.pop(),
    "remove": lambda seq: seq.remove(1),
    "clear": lambda seq: seq.clear(),
    "sort": lambda seq: seq.sort(),
    "reverse": lambda seq: seq.reverse(),
    "+=": lambda seq: seq.__iadd__([3]),
    "*=": lambda seq: seq.__imul__(2),
}


@pytest.mark.parametrize("edit", LIST_EDITS.values(), ids=LIST_EDITS.keys())
def test_lists_refuse_every_edit(edit):
    m = manifest()
    tags = m.canonical["extra"]["tags"]
    with pytest.raises(TypeError, match="read-only once hashed"):
        edit(tags)
    assert tags == [1, {"x": None}] and m.canonical["policy"]["stages"] == ["a", "b"]


def test_augmented_assignment_through_the_mapping_is_refused():
    m = manifest()
    with pytest.raises(TypeError):
        m.canonical["extra"]["tags"] += [3]
    assert m.canonical["extra"]["tags"] == [1, {"x": None}]


@pytest.mark.parametrize(
    "name", ["hash", "replay_token", "canonical", "datasets", "seed", "global_batch_size", "drop_last", "new_field"]
)
def test_attributes_cannot_be_set_or_deleted(name):
    m = manifest()
    with pytest.raises(AttributeError, match="read-only once hashed"):
        setattr(m, name, 8)
    with pytest.raises(AttributeError):
        delattr(m, name)
    assert m == manifest()


def test_datasets_mapping_and_entries_are_frozen():
    m = manifest()
    with pytest.raises(TypeError):
        m.datasets["train"] = m.datasets["train"]
    with pytest.raises(TypeError):
        m.datasets.pop("train")
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.datasets["train"].cardinality = 5
    assert m.datasets["train"] == uc.manifest.DatasetSpec("train", 100, "corpus", "3", "sha256:00")


# ------------------------------------------- the engine uses the hashed values
def test_next_batch_after_refused_edits_uses_the_hashed_values():
    m = manifest()
    reference = first_batch(manifest())
    for edit in (
        lambda: m.canonical.__setitem__("global_batch_size", 8),
        lambda: m.canonical["data"].__setitem__("sampler_block_size", 1),
        lambda: m.canonical["datasets"]["train"].__setitem__("cardinality", 10),
        lambda: setattr(m, "global_batch_size", 8),
    ):
        with pytest.raises((TypeError, AttributeError)):
            edit()
    batch = first_batch(m)
    assert batch.indices.tolist() == reference.indices.tolist() and len(batch.indices) == 4
    assert batch.metadata == reference.metadata
    assert batch.metadata["manifest_hash"] == m.hash.hex()


def test_a_view_changed_behind_its_back_does_not_change_a_batch():
    """Python cannot stop ``dict.__setitem__(view, ...)``; the engine reads the private copy, not the view."""
    m = manifest()
    reference = first_batch(manifest())
    dict.__setitem__(m.canonical, "global_batch_size", 8)
    dict.__setitem__(m.canonical["datasets"]["train"], "cardinality", 10)
    batch = first_batch(m)
    assert batch.indices.tolist() == reference.indices.tolist() and len(batch.indices) == 4
    assert batch.metadata["manifest_hash"] == m.hash.hex() == manifest().hash.hex()
    assert m.to_dict() == RAW_CANONICAL and m.global_batch_size == 4


def test_the_input_is_copied_not_kept():
    raw = copy.deepcopy(RAW)
    m = uc.Manifest.from_dict(raw)
    raw["global_batch_size"] = 8
    raw["extra"]["tags"].append(3)
    assert m.global_batch_size == 4 and m.canonical["extra"]["tags"] == [1, {"x": None}] and m == manifest()


# ------------------------------------------------------ reading stays the same
RAW_CANONICAL = {**RAW, "spec_version": "UML_OS-v3.8-OS"}


def test_views_read_like_the_plain_data_they_show():
    m = manifest()
    assert m.canonical == RAW_CANONICAL and isinstance(m.canonical, dict)
    assert m.canonical["extra"] == {"owner": "a", "tags": [1, {"x": None}]}
    assert isinstance(m.canonical["extra"]["tags"], list)
    assert json.dumps(m.canonical, sort_keys=True) == json.dumps(RAW_CANONICAL, sort_keys=True)
    assert (m.seed, m.global_batch_size, m.spec_version, m.sampler_block_size, m.drop_last) == (
        7, 4, "UML_OS-v3.8-OS", 16, False,
    )
    assert sorted(m.datasets) == ["train"] and m.datasets["train"].cardinality == 100


def test_views_hash_to_the_same_bytes():
    """The CBOR encoder sees the views as the dicts and lists they subclass: same bytes, same hash."""
    m = manifest()
    assert hash_canonical(m.canonical) == hash_canonical(m.to_dict()) == hash_canonical(RAW_CANONICAL) == m.hash
    assert hash_canonical(m.canonical["datasets"]) == hash_canonical(RAW["datasets"])


def _exact_plain(value) -> bool:
    if type(value) is dict:
        return all(_exact_plain(item) for item in value.values())
    if type(value) is list:
        return all(_exact_plain(item) for item in value)
    return not isinstance(value, (dict, list))


def test_to_dict_is_new_plain_mutable_data():
    m = manifest()
    plain = m.to_dict()
    assert _exact_plain(plain) and plain == RAW_CANONICAL
    plain["global_batch_size"] = 8
    plain["extra"]["tags"].append(3)
    assert m.global_batch_size == 4 and m.to_dict() == RAW_CANONICAL
    assert uc.Manifest.from_dict(plain).global_batch_size == 8


def test_with_overrides_is_the_way_to_change_a_manifest():
    m = manifest()
    changed = m.with_overrides(global_batch_size=8)
    assert changed.global_batch_size == 8 and len(first_batch(changed).indices) == 8
    assert changed.hash != m.hash and changed.hash == uc.Manifest.from_dict({**RAW, "global_batch_size": 8}).hash
    assert m.global_batch_size == 4


# ----------------------------------------------------- equality, copy, pickle
def test_equality_and_hash_follow_manifest_hash():
    a, b = manifest(), manifest()
    assert a is not b and a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != a.with_overrides(seed=8) and a != a.to_dict()


def test_copies_of_a_manifest_are_the_manifest():
    m = manifest()
    assert copy.copy(m) is m and copy.deepcopy(m) is m
    assert copy.deepcopy({"m": m})["m"] is m


def test_copies_of_a_view_are_plain_mutable_data():
    m = manifest()
    deep = copy.deepcopy(m.canonical)
    assert _exact_plain(deep) and deep == RAW_CANONICAL
    shallow = copy.copy(m.canonical)
    assert type(shallow) is dict and shallow == RAW_CANONICAL
    shallow["seed"] = 1
    assert m.canonical["seed"] == 7


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickle_round_trip_keeps_the_hash_and_stays_frozen(protocol):
    m = manifest()
    restored = pickle.loads(pickle.dumps(m, protocol=protocol))
    assert restored == m and restored.hash == m.hash and restored.replay_token == m.replay_token
    assert restored.canonical == m.canonical and restored.datasets == m.datasets
    with pytest.raises(TypeError):
        restored.canonical["extra"]["tags"].append(3)
    with pytest.raises(AttributeError):
        restored.seed = 1
    assert first_batch(restored).indices.tolist() == first_batch(m).indices.tolist()


def test_pickled_views_stay_read_only():
    view = pickle.loads(pickle.dumps(manifest().canonical))
    assert view == RAW_CANONICAL
    with pytest.raises(TypeError):
        view["seed"] = 1
    with pytest.raises(TypeError):
        view["policy"]["stages"].append("c")


def test_a_sampler_holding_a_manifest_pickles_for_dataloader_workers():
    pytest.importorskip("torch")
    from umlos_cuda.torch import NextBatchSampler

    m = manifest()
    sampler = NextBatchSampler(m, "train", rank=0, world_size=1, backend="numpy")
    restored = pickle.loads(pickle.dumps(sampler))
    assert restored.manifest == m and restored.manifest.hash == m.hash
    assert list(restored) == list(sampler)


# ------------------------------------------------------------------ as_manifest
def test_as_manifest_accepts_a_manifest_a_mapping_and_a_path(tmp_path):
    m = manifest()
    path = tmp_path / "run.json"
    path.write_text(json.dumps(RAW))
    assert as_manifest(m) is m
    assert as_manifest(RAW) == m
    assert as_manifest(path) == m and as_manifest(os.fspath(path)) == m


@pytest.mark.parametrize("value", [None, 5, b"run.yaml", ["a"], object()])
def test_as_manifest_refuses_anything_else_naming_what_it_accepts(value):
    with pytest.raises(uc.UmlosError) as info:
        as_manifest(value)
    assert info.value.code == errors.INVALID_MANIFEST
    assert "a Manifest, a mapping or the path of a YAML or JSON file" in info.value.message
