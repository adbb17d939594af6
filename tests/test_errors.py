"""R8: every invalid input aborts with its code and R8's failure record
(t, failure_code, failure_operator, dataset_key, data_replay_t); plus the codes
this project adds (errors.py)."""

from __future__ import annotations

import ast
import collections
import math
import pathlib
import re

import pytest
from hypothesis import given, settings, strategies as st

import oracle
import umlos_cuda as uc
from nbcases import indices_list, raw_manifest
from umlos_cuda import errors
from umlos_cuda.backends import get_backend

RECORD_FIELDS = {"t", "failure_code", "failure_operator", "dataset_key", "data_replay_t"}


def expect(code, function, *args, operator=errors.NEXTBATCH_OPERATOR, **kwargs) -> uc.UmlosError:
    with pytest.raises(uc.UmlosError) as info:
        function(*args, **kwargs)
    error = info.value
    assert error.code == code, f"expected {code}, got {error.code}: {error.message}"
    assert set(error.record) >= RECORD_FIELDS
    assert error.record["failure_code"] == code
    assert error.record["failure_operator"] == operator
    assert str(error).startswith(code)
    return error


def call(raw, key="train", world_size=1, rank=0, stage="train", cursor=(0, 0), **kwargs):
    return uc.next_batch(raw, key, world_size, rank, stage, uc.Cursor(*cursor) if isinstance(cursor, tuple) else cursor,
                         backend="numpy", t=41, **kwargs)


GOOD = raw_manifest(1000, 64, 48)


# --------------------------------------------------------------- R8 codes
def test_invalid_dataset_key():
    error = expect(errors.INVALID_DATASET_KEY, call, GOOD, key="validation")
    assert error.record["dataset_key"] == "validation" and error.record["t"] == 41
    assert "train" in error.message  # names the keys that exist
    expect(errors.INVALID_DATASET_KEY, call, GOOD, key=3)
    expect(errors.INVALID_DATASET_KEY, uc.epoch_indices, GOOD, "nope", backend="numpy")


@pytest.mark.parametrize("stage", ["test", "TRAIN", "", None, 1])
def test_invalid_stage_type(stage):
    error = expect(errors.INVALID_STAGE_TYPE, call, GOOD, stage=stage)
    assert error.record["t"] == 41 and error.record["dataset_key"] == "train"


def test_unknown_preset_is_invalid_stage_type():
    error = expect(errors.INVALID_STAGE_TYPE, call, GOOD, preset="shuffle_forever")
    assert "streaming_infinite" in error.message  # says what the choices are


@pytest.mark.parametrize(
    "raw,world_size,stage",
    [
        (raw_manifest(1000, 64, 0), 1, "train"),        # G = 0
        (raw_manifest(1000, 64, 0), 1, "eval"),
        (raw_manifest(1000, 64, 48), 5, "train"),       # G % W != 0
        (raw_manifest(1000, 64, 48), 96, "eval"),       # W > G
        (raw_manifest(1000, 0, 48), 1, "train"),        # block size 0
        (raw_manifest(1000, 0, 48), 1, "infer"),
        (raw_manifest(40, 8, 48, drop_last=True), 1, "train"),  # train + drop_last + G > N
    ],
)
def test_batch_size_inconsistent(raw, world_size, stage):
    error = expect(errors.BATCH_SIZE_INCONSISTENT, call, raw, world_size=world_size, stage=stage)
    assert error.record["dataset_key"] == "train" and error.record["t"] == 41


def test_drop_last_with_g_above_n_is_fine_for_eval():
    batch = call(raw_manifest(40, 8, 48, drop_last=True), stage="eval")
    assert indices_list(batch) == list(range(40))


def test_cardinality_mismatch():
    error = expect(errors.CARDINALITY_MISMATCH, call, raw_manifest(0, 64, 48))
    assert error.record["dataset_key"] == "train"
    expect(errors.CARDINALITY_MISMATCH, call, raw_manifest(0, 64, 48), stage="eval")
    manifest = uc.Manifest.from_dict(GOOD)
    uc.check_dataset_length(manifest, "train", 1000)  # equal: no error
    expect(errors.CARDINALITY_MISMATCH, uc.check_dataset_length, manifest, "train", 999)


@pytest.mark.parametrize(
    "raw,stage,cursor",
    [
        (GOOD, "train", (0, 1000)),
        (GOOD, "eval", (3, 2**64 - 1)),
        (raw_manifest(1000, 64, 48, drop_last=True), "train", (0, 960)),  # epoch_limit = 960
    ],
)
def test_global_position_exceeds_cardinality(raw, stage, cursor):
    error = expect(errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY, call, raw, stage=stage, cursor=cursor, world_size=4,
                   rank=2)
    # Inputs were valid enough to compute data_replay_t: it is the R9 value.
    expected = oracle.Oracle(raw).violations("train", 4, 2, stage, *cursor)
    assert expected == {errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY}
    token = oracle.replay_token(raw)
    assert error.record["data_replay_t"] == oracle.data_replay_t(token, "train", cursor[0], cursor[1], 4, 2).hex()
    assert error.record["t"] == 41


def test_drop_last_limit_allows_the_last_whole_batch():
    batch = call(raw_manifest(1000, 64, 48, drop_last=True), cursor=(0, 912))
    assert len(indices_list(batch)) == 48 and batch.cursor == uc.Cursor(1, 0)


def test_epoch_indices_windows_past_the_epoch():
    expect(errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY, uc.epoch_indices, GOOD, "train", start=1001, backend="numpy")
    expect(errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY, uc.epoch_indices, GOOD, "train", start=990, count=11,
           backend="numpy")
    dropped = raw_manifest(1000, 64, 48, drop_last=True)
    expect(errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY, uc.epoch_indices, dropped, "train", start=959, count=2,
           backend="numpy")
    assert len(uc.epoch_indices(dropped, "train", backend="numpy")) == 960
    assert len(uc.epoch_indices(GOOD, "train", start=1000, backend="numpy")) == 0


# --------------------------------------------------------------- R8 additions
@pytest.mark.parametrize("world_size,rank", [(0, 0), (4, 4), (4, 100), (2**32, 0)])
def test_invalid_rank(world_size, rank):
    raw = raw_manifest(1000, 64, 2**32)
    error = expect(errors.INVALID_RANK, call, raw, world_size=world_size, rank=rank)
    assert error.record["dataset_key"] == "train"
    assert str(rank) in error.message or str(world_size) in error.message


@pytest.mark.parametrize(
    "world_size,rank,cursor",
    [(-1, 0, (0, 0)), (2, -1, (0, 0)), (2.0, 0, (0, 0)), (2, True, (0, 0)), ("2", 0, (0, 0)),
     (1, 0, {"epoch": 0}), (1, 0, {"epoch": -1, "global_index": 0}), (1, 0, [0, 0])],
)
def test_wrong_types_in_a_call_are_invalid_manifest(world_size, rank, cursor):
    expect(errors.INVALID_MANIFEST, call, GOOD, world_size=world_size, rank=rank, cursor=cursor)


def _without(mapping, *path):
    import copy

    out = copy.deepcopy(mapping)
    target = out
    for name in path[:-1]:
        target = target[name]
    del target[path[-1]]
    return out


BAD_MANIFESTS = [
    ("not a mapping", [1, 2]),
    ("no batch size", _without(GOOD, "global_batch_size")),
    ("no datasets", _without(GOOD, "datasets")),
    ("datasets not a mapping", {**GOOD, "datasets": [1]}),
    ("dataset lacks hash", _without(GOOD, "datasets", "train", "hash")),
    ("dataset lacks cardinality", _without(GOOD, "datasets", "train", "cardinality")),
    ("float batch size", {**GOOD, "global_batch_size": 48.0}),
    ("bool batch size", {**GOOD, "global_batch_size": True}),
    ("negative batch size", {**GOOD, "global_batch_size": -48}),
    ("batch size 2^64", {**GOOD, "global_batch_size": 2**64}),
    ("negative seed", {**GOOD, "seed": -1}),
    ("seed 2^64", {**GOOD, "seed": 2**64}),
    ("string cardinality", raw_manifest("1000", 64, 48)),
    ("cardinality 2^64", raw_manifest(2**64, 64, 48)),
    ("float block size", raw_manifest(1000, 64.5, 48)),
    ("drop_last not bool", raw_manifest(1000, 64, 48, drop_last="yes")),
    ("data not a mapping", {**GOOD, "data": [1]}),
    ("spec_version not text", {**GOOD, "spec_version": 3}),
    ("non-text key", {**GOOD, "policy": {1: "a"}}),
    ("NaN", {**GOOD, "policy": {"x": math.nan}}),
    ("infinity", {**GOOD, "env": {"x": math.inf}}),
    ("object value", {**GOOD, "env": {"x": object()}}),
    ("dataset id a float", {**GOOD, "datasets": {"train": {**GOOD["datasets"]["train"], "id": 1.5}}}),
]


@pytest.mark.parametrize("what,raw", BAD_MANIFESTS, ids=[w for w, _ in BAD_MANIFESTS])
def test_invalid_manifest(what, raw):
    expect(errors.INVALID_MANIFEST, uc.Manifest.from_dict, raw, operator=errors.MANIFEST_OPERATOR)
    error = expect(errors.INVALID_MANIFEST, call, raw)  # a call names itself, whichever part found the fault
    assert error.record["t"] == 41


def test_deeply_nested_manifest_is_refused():
    value = {}
    for _ in range(200):
        value = {"x": value}
    expect(errors.INVALID_MANIFEST, uc.Manifest.from_dict, {**GOOD, "policy": value}, operator=errors.MANIFEST_OPERATOR)


@pytest.mark.parametrize("token", [b"\x00" * 31, b"\x00" * 33, "0" * 32, 5])
def test_bad_replay_token_is_invalid_manifest(token):
    expect(errors.INVALID_MANIFEST, call, GOOD, replay_token=token)
    expect(errors.INVALID_MANIFEST, uc.epoch_indices, GOOD, "train", replay_token=token, backend="numpy")


# --------------------------------------------------------------- project additions
def test_uint64_overflow():
    error = expect(errors.UINT64_OVERFLOW, call, raw_manifest(10, 4, 10), cursor=(2**64 - 1, 0))
    assert error.record["data_replay_t"] == oracle.data_replay_t(
        oracle.replay_token(raw_manifest(10, 4, 10)), "train", 2**64 - 1, 0, 1, 0).hex()


def test_block_table_too_large(monkeypatch):
    expect(errors.BLOCK_TABLE_TOO_LARGE, call, raw_manifest(2**64 - 1, 1, 48))
    monkeypatch.setenv("UMLOS_MAX_BLOCKS", "10")
    error = expect(errors.BLOCK_TABLE_TOO_LARGE, call, raw_manifest(1000, 64, 48))  # 16 blocks
    assert "UMLOS_MAX_BLOCKS" in error.message
    assert len(indices_list(call(raw_manifest(1000, 100, 48)))) == 48  # 10 blocks: allowed
    assert len(indices_list(call(raw_manifest(1000, 64, 48), stage="eval"))) == 48  # eval builds no plan


def test_backend_unavailable():
    with pytest.raises(uc.UmlosError) as info:
        get_backend("tpu")
    assert info.value.code == errors.BACKEND_UNAVAILABLE
    assert "numpy" in info.value.message  # lists the choices
    with pytest.raises(uc.UmlosError) as info:
        uc.next_batch(GOOD, "train", backend="tpu")
    assert info.value.code == errors.BACKEND_UNAVAILABLE


def test_contract_violation_is_unreachable():
    """R6's CONTRACT_VIOLATION (no coprime multiplier) cannot
    happen, since the scan reaches cand = 1. The engine's scan returns a
    multiplier in [1, m-1] coprime with m for every m up to 700, each from
    several starting points, and agrees with the oracle."""
    from math import gcd

    import numpy as np

    from umlos_cuda import reference
    from umlos_cuda.epoch import philox_key_words

    assert errors.CONTRACT_VIOLATION == "CONTRACT_VIOLATION"
    for m in range(2, 700):
        pbs = np.arange(4, dtype=np.uint64)
        seed16 = m.to_bytes(16, "little")
        key, w2, w3 = philox_key_words(seed16)
        # four blocks of size m: four different starting points of the scan
        _, ms, a, _ = reference.block_affine_params(pbs, 4 * m, m, key, w2, w3)
        for pb in range(4):
            assert int(ms[pb]) == m and 1 <= int(a[pb]) < m and gcd(int(a[pb]), m) == 1
            assert int(a[pb]) == oracle.affine_parameters(seed16, pb, m, 4 * m)[2]


# --------------------------------------------------------------- any invalid mix
@settings(max_examples=300)
@given(
    n=st.sampled_from([0, 1, 5, 40, 100]), g=st.sampled_from([0, 1, 6, 24, 48, 200]),
    block_size=st.sampled_from([0, 1, 7, 64]), drop_last=st.booleans(),
    key=st.sampled_from(["train", "train", "other"]), stage=st.sampled_from(["train", "eval", "infer", "bogus"]),
    world_size=st.sampled_from([0, 1, 2, 3, 5, 8]), rank=st.integers(0, 9), gi=st.integers(0, 260),
)
def test_any_call_either_matches_the_oracle_or_fails_with_a_violated_code(n, g, block_size, drop_last, key, stage,
                                                                            world_size, rank, gi):
    raw = raw_manifest(n, block_size, g, seed=n + g, drop_last=drop_last)
    model = oracle.Oracle(raw)
    violated = model.violations(key, world_size, rank, stage, 1, gi)
    if violated:
        with pytest.raises(uc.UmlosError) as info:
            call(raw, key=key, world_size=world_size, rank=rank, stage=stage, cursor=(1, gi))
        assert info.value.code in violated
        assert info.value.record["t"] == 41
    else:
        batch = call(raw, key=key, world_size=world_size, rank=rank, stage=stage, cursor=(1, gi))
        expected = model.next_batch(key, world_size, rank, stage, 1, gi)
        assert indices_list(batch) == expected.indices
        assert (batch.cursor.epoch, batch.cursor.global_index) == expected.cursor


# --------------------------------------------------------------- failure record values
def _replay_hex(raw, key, epoch, position, world_size, rank):
    return oracle.data_replay_t(oracle.replay_token(raw), key, epoch, position, world_size, rank).hex()


@pytest.mark.parametrize(
    "code,raw,key,world_size,rank,stage",
    [
        (errors.BATCH_SIZE_INCONSISTENT, raw_manifest(1000, 64, 48), "train", 5, 1, "train"),  # G % W
        (errors.BATCH_SIZE_INCONSISTENT, raw_manifest(1000, 0, 48), "train", 4, 1, "train"),   # block size 0
        (errors.BATCH_SIZE_INCONSISTENT, raw_manifest(40, 8, 48, drop_last=True), "train", 4, 3, "train"),
        (errors.CARDINALITY_MISMATCH, raw_manifest(0, 64, 48), "train", 4, 1, "eval"),
        (errors.INVALID_RANK, raw_manifest(1000, 64, 48), "train", 4, 4, "train"),
        (errors.INVALID_RANK, raw_manifest(1000, 64, 48), "train", 0, 0, "train"),
        (errors.INVALID_DATASET_KEY, raw_manifest(1000, 64, 48), "validation", 4, 1, "train"),
        (errors.INVALID_STAGE_TYPE, raw_manifest(1000, 64, 48), "train", 4, 1, "test"),
    ],
)
def test_failure_record_carries_data_replay_t_when_the_inputs_are_well_typed(code, raw, key, world_size, rank, stage):
    """R8: the record's data_replay_t is the R9 value of the failed
    call (cursor before it) whenever the call's inputs are well-typed."""
    error = expect(code, call, raw, key=key, world_size=world_size, rank=rank, stage=stage, cursor=(6, 17))
    assert error.record["data_replay_t"] == _replay_hex(raw, key, 6, 17, world_size, rank)
    assert error.record["t"] == 41


@pytest.mark.parametrize(
    "raw,world_size,rank,cursor,token",
    [
        ({**GOOD, "global_batch_size": -1}, 1, 0, (0, 0), None),  # no manifest, no token
        (GOOD, 1, 0, (0, 0), b"short"),                           # no token
        (GOOD, -1, 0, (0, 0), None),                              # world size not a uint
        (GOOD, 1, 0, {"epoch": -1, "global_index": 0}, None),     # no cursor
    ],
)
def test_failure_record_has_no_data_replay_t_when_it_cannot_be_computed(raw, world_size, rank, cursor, token):
    error = expect(errors.INVALID_MANIFEST, call, raw, world_size=world_size, rank=rank, cursor=cursor,
                   replay_token=token)
    assert error.record["data_replay_t"] is None


# --------------------------------------------------------------- one table of codes, operators named
ROOT = pathlib.Path(__file__).resolve().parent.parent
#: Every failure code: the constants of errors.py whose value is their name.
CODES = {name for name, value in vars(errors).items() if isinstance(value, str) and value == name and name.isupper()}
#: A backticked word shaped like a code: the last part of some code's name, or INVALID_ first.
CODE_SHAPED = re.compile(
    r"`((?:INVALID_[A-Z0-9_]+)|(?:[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*_(?:{})))`"
    .format("|".join(sorted({code.rsplit("_", 1)[1] for code in CODES if "_" in code})))
)


def table_codes() -> list[str]:
    """The first column of docs/errors.md's table of every code, in order."""
    text = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")
    table = text.split("\n## Every code\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \|", table, flags=re.M)


def test_docs_errors_md_lists_every_code_exactly_once():
    rows = table_codes()
    repeated = sorted(code for code, count in collections.Counter(rows).items() if count > 1)
    assert not repeated, f"docs/errors.md lists these codes more than once: {repeated}"
    missing = sorted(CODES - set(rows))
    assert not missing, f"add a row to docs/errors.md, 'Every code', for each code of umlos_cuda/errors.py: {missing}"
    unknown = sorted(set(rows) - CODES)
    assert not unknown, f"docs/errors.md lists codes that umlos_cuda/errors.py does not define: {unknown}"


def documented_code_names(text: str) -> set[str]:
    return set(CODE_SHAPED.findall(text))


def test_the_code_finder_sees_codes_and_only_codes():
    text = ("`CHECKPOINT_FOO_INVALID`, `INVALID_THING`, `PLAN_NOT_FOUND`; "
            "not `UMLOS_MAX_BLOCKS`, `WORLD_SIZE`, `SEQUENTIAL_V1`")
    assert documented_code_names(text) == {"CHECKPOINT_FOO_INVALID", "INVALID_THING", "PLAN_NOT_FOUND"}


def test_documents_name_only_codes_that_exist():
    documents = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    wrong = {
        str(path.relative_to(ROOT)): sorted(documented_code_names(path.read_text(encoding="utf-8")) - CODES)
        for path in documents
    }
    assert not {path: names for path, names in wrong.items() if names}, "codes that umlos_cuda/errors.py lacks"


def raises_without_an_operator() -> list[str]:
    """``UmlosError(...)`` (or a subclass) constructed in the package without ``operator=``."""
    trees = {path: ast.parse(path.read_text(encoding="utf-8")) for path in sorted((ROOT / "umlos_cuda").rglob("*.py"))}
    classes = {"UmlosError"}
    for tree in trees.values():  # subclasses, as SamplerArgumentError(UmlosError, ValueError)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(getattr(base, "id", None) in classes for base in node.bases):
                classes.add(node.name)
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            keywords = {keyword.arg for keyword in node.keywords}  # None: **kwargs, passed on
            if name in classes and "operator" not in keywords and None not in keywords:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_raise_names_its_operator():
    """UmlosError has no default operator (a NextBatch default made a cursor's
    error claim NextBatch_v2); every place that builds one names it."""
    assert raises_without_an_operator() == []
    with pytest.raises(TypeError, match="operator"):
        errors.UmlosError(errors.INVALID_ARGUMENT, "no operator")  # type: ignore[call-arg]
    error = errors.UmlosError(errors.INVALID_ARGUMENT, "x", operator="test.Op_v1")
    assert error.record["failure_operator"] == "test.Op_v1"
