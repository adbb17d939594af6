"""The bounded input layer (umlos_cuda/files/reader.py), in-process: regular files only, sizes,
JSON depth, JSONL lines, .npy headers against the bytes, .npz members.

The same inputs through every command are in tests/test_hostile_readers.py (fenced children);
here each rule is checked directly, with the bounds that make it fail and the cases next to them
that must pass."""

from __future__ import annotations

import io
import json
import os
import socket
import zipfile

import numpy as np
import pytest
from hypothesis import given, strategies as st

from umlos_cuda.errors import UmlosError
from umlos_cuda.files import reader


def error(message: str) -> UmlosError:
    return UmlosError("PLAN_FORMAT_INVALID", message, operator="test")


def refused(function, *args, mention: str = "", **kwargs) -> str:
    with pytest.raises(UmlosError) as info:
        function(*args, **kwargs)
    assert info.value.code == "PLAN_FORMAT_INVALID"
    assert mention in info.value.message, info.value.message
    return info.value.message


# ---------------------------------------------------------------------- regular files
def test_a_fifo_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    for function in (lambda p: reader.read_bytes(p, error, max_bytes=10), lambda p: reader.read_json(p, error),
                     lambda p: list(reader.iter_lines(p, error)), lambda p: reader.map_file(p, error),
                     lambda p: reader.load_npy(p, error, mmap=True), lambda p: reader.read_npz(p, ("a",), error)):
        message = refused(function, tmp_path / "pipe", mention="is a FIFO, not a regular file")
        assert str(tmp_path / "pipe") in message


def test_folders_sockets_and_devices_are_refused(tmp_path):
    refused(reader.read_bytes, tmp_path, error, max_bytes=10, mention="is a folder")
    refused(reader.read_bytes, "/dev/zero", error, max_bytes=10, mention="is a character device")
    with socket.socket(socket.AF_UNIX) as sock:
        path = tmp_path / "s"
        sock.bind(str(path))
        refused(reader.read_bytes, path, error, max_bytes=10, mention="")  # a socket cannot even be opened


def test_a_link_to_a_regular_file_is_read_and_a_link_to_a_fifo_refused(tmp_path):
    (tmp_path / "data").write_bytes(b"abc")
    os.symlink(tmp_path / "data", tmp_path / "link")
    assert reader.read_bytes(tmp_path / "link", error, max_bytes=3) == b"abc"
    os.mkfifo(tmp_path / "pipe")
    os.symlink(tmp_path / "pipe", tmp_path / "pipe-link")
    refused(reader.read_bytes, tmp_path / "pipe-link", error, max_bytes=3, mention="is a FIFO")


def test_a_missing_file_passes_through_for_the_caller_to_name(tmp_path):
    with pytest.raises(FileNotFoundError):
        reader.read_json(tmp_path / "missing.json", error)
    with pytest.raises(FileNotFoundError):
        reader.load_npy(tmp_path / "missing.npy", error, mmap=False)
    refused(reader.read_npy, tmp_path / "missing.npy", "<u4", None, False, error, mention="missing.npy is missing")


def test_size_is_checked_before_reading(tmp_path):
    path = tmp_path / "big"
    with open(path, "wb") as handle:
        handle.truncate(64 << 30)  # sparse: reading it would take minutes and all memory
    refused(reader.read_bytes, path, error, max_bytes=1 << 20, mention="over the 1,048,576")
    assert reader.same_bytes(path, b"\0" * 10, error) is False  # sizes differ: nothing is read
    (tmp_path / "small").write_bytes(b"12345")
    assert reader.read_bytes(tmp_path / "small", error, max_bytes=5) == b"12345"
    refused(reader.read_bytes, tmp_path / "small", error, max_bytes=4)
    assert reader.same_bytes(tmp_path / "small", b"12345", error)
    assert not reader.same_bytes(tmp_path / "small", b"12346", error)


# ---------------------------------------------------------------------- JSON
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(alphabet='ab"\\[]{}\n', max_size=6),
                    lambda children: st.lists(children, max_size=3) | st.dictionaries(
                        st.text(alphabet='k"\\[{', max_size=3), children, max_size=3), max_leaves=30))
def test_json_depth_is_exact_on_valid_json(value):
    def depth(v) -> int:
        if isinstance(v, list):
            return 1 + max((depth(x) for x in v), default=0)
        if isinstance(v, dict):
            return 1 + max((depth(x) for x in v.values()), default=0)
        return 0

    for text in (json.dumps(value), json.dumps(value, indent=1), json.dumps(value, ensure_ascii=False)):
        assert reader.json_depth(text.encode()) == depth(value)


def test_json_depth_counts_what_the_parser_would_reach_before_an_error():
    assert reader.json_depth(b"[" * 100_000) == 100_000
    assert reader.json_depth(b'["\\"' + b"[" * 50 + b'"]') == 1  # brackets inside a string with an escaped quote
    assert reader.json_depth(b'"unterminated ' + b"[" * 70) == 70  # conservative: the parser stops at once
    assert reader.json_depth(b'["a"' + b"[" * 70) == 71  # after a closed string they count


def test_deep_json_is_refused_before_parsing(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    refused(reader.read_json, path, error, mention="nests 100000 levels deep; at most 64")
    path.write_text("[" * 64 + "]" * 64)
    assert reader.json_depth(json.dumps(reader.read_json(path, error)).encode()) == 64
    path.write_text('{"a": ' * 65 + "1" + "}" * 65)
    refused(reader.read_json, path, error, mention="nests 65 levels")


def test_json_that_is_not_utf8_or_not_json_names_the_file(tmp_path):
    path = tmp_path / "x.json"
    path.write_bytes(b'{"a": "\xff"}')
    refused(reader.read_json, path, error, mention=f"{path} is not UTF-8 text")
    path.write_bytes(b'{"a": ')
    refused(reader.read_json, path, error, mention=f"{path} is not valid JSON")
    path.write_bytes(b"9" * 5000)
    refused(reader.read_json, path, error, mention="is not valid JSON")
    assert reader.loads_json('{"a": [1, {"b": null}]}', error, "text") == {"a": [1, {"b": None}]}


# ---------------------------------------------------------------------- JSONL
def test_lines_are_capped_in_length_and_count(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b"1234\n12345\n123456\n")
    assert [raw for _, raw in reader.iter_lines(path, error, max_line_bytes=6)] == [b"1234\n", b"12345\n", b"123456\n"]
    message = refused(lambda: list(reader.iter_lines(path, error, max_line_bytes=5)), mention="line 3 is longer")
    assert str(path) in message
    refused(lambda: list(reader.iter_lines(path, error, max_lines=2)), mention="more than 2 lines")
    path.write_bytes(b"123456")  # no line end: the last line counts the same
    assert list(reader.iter_lines(path, error, max_line_bytes=6)) == [(0, b"123456")]
    refused(lambda: list(reader.iter_lines(path, error, max_line_bytes=5)), mention="line 1 is longer")


def test_a_huge_line_is_refused_without_reading_it(tmp_path):
    path = tmp_path / "sparse.jsonl"
    with open(path, "wb") as handle:
        handle.write(b"{}\n")
        handle.truncate(64 << 30)
    lines = reader.iter_lines(path, error, max_line_bytes=1 << 20)
    assert next(lines) == (0, b"{}\n")
    refused(next, lines, mention="line 2 is longer than 1,048,576 bytes")


def test_strip_bom_only_on_the_first_line():
    assert reader.strip_bom(0, reader.UTF8_BOM + b"{}\n") == b"{}\n"
    assert reader.strip_bom(1, reader.UTF8_BOM + b"{}\n") == reader.UTF8_BOM + b"{}\n"


# ---------------------------------------------------------------------- .npy
def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def forged_npy(shape, descr="<i8", data=b"") -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue() + data


@pytest.mark.parametrize("mmap", [True, False])
@pytest.mark.parametrize("array", [np.arange(10, dtype="<u4"), np.zeros(0, dtype="<i8"),
                                   np.arange(12, dtype="<i2").reshape(3, 4), np.asfortranarray(np.ones((3, 2))),
                                   np.array(["ab", "c"]), np.array(5)])
def test_npy_round_trip(tmp_path, array, mmap):
    path = tmp_path / "a.npy"
    path.write_bytes(npy_bytes(array))
    loaded = reader.load_npy(path, error, mmap=mmap)
    assert loaded.dtype == array.dtype and loaded.shape == array.shape and np.array_equal(loaded, array)
    assert isinstance(loaded, np.memmap) == mmap


def test_npy_header_claiming_more_than_the_file_is_refused_before_allocating(tmp_path):
    path = tmp_path / "a.npy"
    path.write_bytes(forged_npy((1 << 38,), data=b"\0" * 16))
    for mmap in (True, False):
        refused(reader.load_npy, path, error, mmap=mmap, mention="its header says <i8 of shape (274877906944,)")
    path.write_bytes(forged_npy((2,), data=b"\0" * 24))  # one element too many: also refused
    refused(reader.load_npy, path, error, mmap=False, mention="holds 24 bytes after its header")


def test_npy_objects_versions_and_garbage_are_refused(tmp_path):
    path = tmp_path / "a.npy"
    path.write_bytes(forged_npy((1,), descr="|O", data=b"\0" * 8))
    refused(reader.load_npy, path, error, mmap=False, mention="holds Python objects")
    path.write_bytes(b"\x93NUMPY\x03\x00" + b"\0" * 20)
    refused(reader.load_npy, path, error, mmap=False, mention="not a readable .npy file")
    path.write_bytes(b"hello")
    refused(reader.load_npy, path, error, mmap=True, mention="not a readable .npy file")
    path.write_bytes(b"\x93NUMPY\x01\x00\xff\xff" + b" " * 65535)
    refused(reader.load_npy, path, error, mmap=True, mention="not a readable .npy file")


def test_read_npy_checks_dtype_and_shape_from_the_header(tmp_path):
    path = tmp_path / "a.npy"
    path.write_bytes(npy_bytes(np.arange(4, dtype="<u4")))
    assert reader.read_npy(path, "<u4", (4,), True, error).tolist() == [0, 1, 2, 3]
    refused(reader.read_npy, path, "<u4", (5,), True, error,
            mention="holds <u4 of shape (4,); expected <u4 of shape (5,)")
    refused(reader.read_npy, path, "<i8", None, False, error, expected="meta.json says",
            mention="meta.json says one-dimensional <i8")


# ---------------------------------------------------------------------- .npz
def write_npz(path, members: dict, compress: dict | None = None) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            info = zipfile.ZipInfo(name)
            info.compress_type = (compress or {}).get(name, zipfile.ZIP_STORED)
            archive.writestr(info, data)


def test_npz_round_trip_and_writable_arrays(tmp_path):
    arrays = {"a": np.arange(6, dtype=np.int32).reshape(2, 3), "b": np.array(["x", "yz"]), "c": np.array(7)}
    write_npz(tmp_path / "x.npz", {f"{k}.npy": npy_bytes(v) for k, v in arrays.items()})
    loaded = reader.read_npz(tmp_path / "x.npz", ("a", "b", "c"), error)
    assert set(loaded) == {"a", "b", "c"}
    for name, array in arrays.items():
        assert loaded[name].dtype == array.dtype and np.array_equal(loaded[name], array)
        assert loaded[name].flags.writeable


def test_npz_members_must_be_exactly_the_listed_ones_and_stored(tmp_path):
    good = {"a.npy": npy_bytes(np.arange(3))}
    path = tmp_path / "x.npz"
    write_npz(path, {**good, "extra.npy": npy_bytes(np.zeros(3))})
    refused(reader.read_npz, path, ("a",), error, mention="holds members this format does not have: extra.npy")
    write_npz(path, good)
    refused(reader.read_npz, path, ("a", "b"), error, mention="lacks b")
    write_npz(path, good, compress={"a.npy": zipfile.ZIP_DEFLATED})
    refused(reader.read_npz, path, ("a",), error, mention="member a.npy is compressed")


def test_npz_member_header_is_checked_against_its_size(tmp_path):
    path = tmp_path / "x.npz"
    write_npz(path, {"a.npy": forged_npy((1 << 19, 1 << 19), descr="<i4", data=b"\0" * 64)})
    refused(reader.read_npz, path, ("a",), error, mention="its header says <i4 of shape (524288, 524288)")


def test_npz_damage_is_refused(tmp_path):
    path = tmp_path / "x.npz"
    write_npz(path, {"a.npy": npy_bytes(np.arange(100))})
    data = bytearray(path.read_bytes())
    data[200] ^= 1  # inside the member's data: its CRC-32 no longer matches
    path.write_bytes(bytes(data))
    refused(reader.read_npz, path, ("a",), error, mention="not a readable .npz file")
    path.write_bytes(b"PK\x03\x04 not a zip")
    refused(reader.read_npz, path, ("a",), error, mention="not a readable .npz file")
    with open(path, "wb") as handle:
        handle.truncate(4 << 30)
    refused(reader.read_npz, path, ("a",), error, max_bytes=1 << 20, mention="over the 1,048,576")


def test_map_file(tmp_path):
    (tmp_path / "empty").write_bytes(b"")
    assert reader.map_file(tmp_path / "empty", error).shape == (0,)
    (tmp_path / "data").write_bytes(b"abc")
    mapped = reader.map_file(tmp_path / "data", error)
    assert mapped.tobytes() == b"abc" and not mapped.flags.writeable
