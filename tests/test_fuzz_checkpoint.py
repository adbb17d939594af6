"""Fuzzing the readers of untrusted checkpoint input: whatever the bytes, the
strict CBOR reader, the manifest parser, the container reader and restore, the
safetensors checks and the tape reader raise ``UmlosError`` and nothing else."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

import umlos_cuda as uc
from umlos_cuda.checkpoint import cbor_safe, restore_checkpoint, schema, tensors, verify_container
from umlos_cuda.checkpoint.container import parse_manifest
from umlos_cuda.checkpoint.tape import read_segment_bytes
from umlos_cuda.hashing import cbor_canonical
from test_checkpoint_support import identity, state
from test_tape import chain, segment

HEADER_FIELDS = set(schema.FIELDS["1.1"][0])
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

plain = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 64), (1 << 64) - 1) | st.binary(max_size=40)
    | st.text(max_size=20) | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=30,
)


def only_umlos_errors(function, *args, **kwargs):
    try:
        return function(*args, **kwargs)
    except uc.UmlosError as exc:
        assert exc.code and exc.message
        return None


@FUZZ
@given(st.binary(max_size=300))
@example(b"\x9f" * 50)  # indefinite arrays
@example(b"\x81" * 5000)  # deep nesting
@example(b"\x5b\xff\xff\xff\xff\xff\xff\xff\xff")  # a byte string claiming 2^64 bytes
@example(b"\xd8\x1c\x81\xd8\x1d\x00")  # shared-reference tags
@example(b"\xc1\x1a\x51\x4b\x67\xb0")  # a date tag
def test_cbor_reader_on_arbitrary_bytes(data):
    value = only_umlos_errors(cbor_safe.decode, data)
    if value is not None or data == b"\xf6":
        assert cbor_canonical(value) == data  # whatever it accepts is canonical


@FUZZ
@given(plain)
def test_cbor_reader_accepts_every_canonical_encoding(value):
    data = cbor_canonical(value)
    try:
        decoded = cbor_safe.decode(data, max_depth=64)
    except uc.UmlosError as exc:
        # Only bignums (tags 2 and 3) are refused among cbor2's canonical outputs of plain data.
        assert "tags" in exc.message
        return
    assert decoded == value and cbor_canonical(decoded) == data


@pytest.fixture(scope="module")
def good_container():
    root = tempfile.mkdtemp(prefix="umlos-fuzz-")
    path = os.path.join(root, "c")
    from umlos_cuda.checkpoint import save_checkpoint

    save_checkpoint(path, identity(), state(2, shards=1, ranks=1))
    yield path
    shutil.rmtree(root, ignore_errors=True)


mutation = st.lists(
    st.tuples(st.sampled_from(["flip", "insert", "delete", "truncate"]), st.integers(0, 1 << 16), st.integers(0, 255)),
    min_size=1, max_size=4,
)


def mutate(data: bytes, steps) -> bytes:
    out = bytearray(data)
    for kind, position, value in steps:
        position %= max(1, len(out))
        if kind == "flip" and out:
            out[position] ^= value or 1
        elif kind == "insert":
            out[position:position] = bytes([value])
        elif kind == "delete" and out:
            del out[position]
        elif kind == "truncate":
            del out[position:]
    return bytes(out)


@FUZZ
@given(mutation)
def test_manifest_parser_on_mutated_manifests(good_container, steps):
    data = Path(os.path.join(good_container, "checkpoint_manifest.cbor")).read_bytes()
    changed = mutate(data, steps)
    info = only_umlos_errors(parse_manifest, changed)
    if info is not None:
        assert changed == data or cbor_canonical(cbor_safe.decode(changed)) == changed


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(["format", "header", "entries", "checkpoint_hash", "x"]), plain, max_size=5),
       st.dictionaries(st.sampled_from(sorted(HEADER_FIELDS)) | st.text(max_size=12), plain, max_size=12))
def test_manifest_parser_on_random_structures(top, header):
    if "header" in top and isinstance(top["header"], dict):
        top["header"] = header
    only_umlos_errors(parse_manifest, cbor_canonical(top))


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.data())
def test_container_reader_and_restore_on_fuzzed_files(good_container, tmp_path_factory, data):
    work = os.path.join(str(tmp_path_factory.mktemp("fuzz")), "c")
    shutil.copytree(good_container, work)
    names = sorted(os.path.relpath(os.path.join(d, f), work) for d, _, fs in os.walk(work) for f in fs)
    target = data.draw(st.sampled_from(names))
    original = Path(os.path.join(work, target)).read_bytes()
    replacement = data.draw(st.one_of(mutation.map(lambda s: mutate(original, s)), st.binary(max_size=200)))
    Path(os.path.join(work, target)).write_bytes(replacement)
    for profile in ("train_full", "data_cursors", "eval_params"):
        only_umlos_errors(restore_checkpoint, work, profile=profile)
    result = only_umlos_errors(verify_container, work)
    assert (result is None) == (replacement != original)


SHARD = tensors.encode({"a": np.arange(6.0), "b": np.zeros((2, 2), dtype="int32")}, "t")


@FUZZ
@given(st.one_of(st.binary(max_size=400),
                 mutation.map(lambda s: mutate(SHARD, s))))
@example(b"\xff" * 8 + b"{}")
@example((10).to_bytes(8, "little") + b"[" * 10)
@example((2000).to_bytes(8, "little") + b"[" * 2000)
def test_safetensors_checks_on_arbitrary_bytes(data):
    only_umlos_errors(tensors.decode, data, "shard")


def header_file(header: bytes) -> bytes:
    return len(header).to_bytes(8, "little") + header + bytes(range(48))


json_header = st.recursive(
    st.sampled_from(['"F32"', '"U8"', '"I64"', '[0,8]', '[-0,8]', '[0,48]', '[8,48]', '[2]', '[2.0]', '[1e1]',
                     '[]', '"w"', '"\\ud800"', 'NaN', '0', '-0', 'null', '{}']),
    lambda children: st.one_of(
        st.lists(children, max_size=3).map(lambda items: "[" + ",".join(items) + "]"),
        st.lists(st.tuples(st.sampled_from(['"dtype"', '"shape"', '"data_offsets"', '"w"', '"x"', '"__metadata__"',
                                            '"\\ud800"', '"w"']), children), max_size=4)
        .map(lambda pairs: "{" + ",".join(f"{k}:{v}" for k, v in pairs) + "}"),
    ),
    max_leaves=12,
)


@FUZZ
@given(st.one_of(mutation.map(lambda s: mutate(SHARD, s)), json_header.map(lambda h: header_file(h.encode()))))
@example(header_file(b'{"w":{"dtype":"F32","shape":[2],"data_offsets":[-0,8]},"x":{"dtype":"U8","shape":[40],'
                     b'"data_offsets":[8,48]}}'))
@example(header_file(b'{"\\ud800":{"dtype":"U8","shape":[48],"data_offsets":[0,48]}}'))
@example(header_file(b'{"__metadata__":{"k":"\\udfff"},"w":{"dtype":"U8","shape":[48],"data_offsets":[0,48]}}'))
def test_what_the_safetensors_checks_accept_the_library_reads(data):
    """Verify (describe) and restore (the library's reader) accept the same files."""
    import safetensors.numpy

    described = only_umlos_errors(tensors.describe, data, "shard")
    if described is not None:
        loaded = safetensors.numpy.load(data)
        assert sorted(loaded) == sorted(described)


@FUZZ
@given(mutation)
def test_tape_reader_on_mutated_segments(steps):
    good = segment([chain(6)[:4], chain(6)[4:]])
    changed = mutate(good, steps)
    records = only_umlos_errors(read_segment_bytes, changed)
    if records is not None:  # accepted: then it is a well-formed chain from a run_header
        assert records[0]["type"] == "run_header" and [r["seq"] for r in records] == list(range(len(records)))


@FUZZ
@given(st.binary(max_size=300))
def test_tape_reader_on_arbitrary_bytes(data):
    only_umlos_errors(read_segment_bytes, data)
