"""The length cache's fast reads (docs/batching.md, "Length cache files"): the same answers as the plain
definition, one ``json.loads`` per line with the documented checks.

* rows.parse_block reads a block whole only when every row is in the writer's shape, and then gives
  what the plain definition gives; any other block (hypothesis, and hand-made near misses) is None.
* LengthCache.load gives the plain definition's ids and lengths, and refuses what it refuses with the
  same code and message, whatever the block size (so rows read whole and rows read one by one mix).
* files/reader.line_blocks joins back to the file, counts lines as iter_lines does and refuses the
  same over-long line with the same message.
* ``read_ids=True`` gives the ids of a lazy load, and a forged sidecar is still refused.
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring_ascii
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from batching_cases import expect
from umlos_cuda import errors
from umlos_cuda.batching import LengthCache
from umlos_cuda.batching.lengths import cache as cache_module, rows as rows_module
from umlos_cuda.errors import UmlosError
from umlos_cuda.files import reader

HASH = "ab" * 32
TAIL = rows_module.row_tail(HASH)


def plain_rows(path: str) -> tuple[list[str], list[int], str]:
    """The definition: one json.loads per line, a dict with a string id, a non-empty string hash (one for
    all rows), an integer length in [0, 2^32 - 1]; unique ids; at least one row."""
    ids, lengths, hashes = [], [], set()
    for line in Path(path).read_bytes().split(b"\n")[:-1] if Path(path).read_bytes().endswith(b"\n") \
            else Path(path).read_bytes().split(b"\n"):
        row = json.loads(line)
        assert isinstance(row, dict) and isinstance(row["sample_id"], str) and isinstance(row["tokenizer_hash"], str)
        assert row["tokenizer_hash"] and type(row["length"]) is int and 0 <= row["length"] < 1 << 32
        ids.append(row["sample_id"])
        lengths.append(row["length"])
        hashes.add(row["tokenizer_hash"])
    assert len(hashes) == 1 and len(set(ids)) == len(ids) and ids
    return ids, lengths, hashes.pop()


def writer_row(sample_id: str, length: int, tokenizer_hash: str = HASH) -> bytes:
    return (f'{{"sample_id": {encode_basestring_ascii(sample_id)}, "tokenizer_hash": '
            f'{encode_basestring_ascii(tokenizer_hash)}, "length": {length}}}\n').encode("ascii")


# ---------------------------------------------------------------------- parse_block
ids_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
plain_text = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters='"\\'),
                     max_size=12)
lengths = st.integers(0, (1 << 32) - 1)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.one_of(plain_text, ids_text), lengths), min_size=1, max_size=20))
def test_parse_block_reads_writer_rows_as_json_does(rows):
    data = b"".join(writer_row(i, n) for i, n in rows)
    parsed = rows_module.parse_block(data, TAIL)
    plain = all(not ("\\" in json.dumps(i) or '"' in i) for i, _ in rows)
    assert (parsed is not None) == plain
    if parsed is not None:
        assert parsed[0].tolist() == [i for i, _ in rows] == list(parsed[0])
        assert parsed[1].dtype == np.uint32 and parsed[1].tolist() == [n for _, n in rows]
        assert parsed[0].tolist() == [json.loads(line)["sample_id"] for line in data.splitlines()]


NEAR_MISSES = [
    b'{"sample_id": "a", "tokenizer_hash": "H", "length": 1", "tokenizer_hash": "H", "length": 2}\n'
    b'{"sample_id": "123}\n',  # two tails on one line, none on the next: the counts alone would agree
    b'{"sample_id": "a", "tokenizer_hash": "H", "length": 01}\n',  # a leading zero
    b'{"sample_id": "a", "tokenizer_hash": "H", "length": 4294967296}\n',  # past uint32
    b'{"sample_id": "a", "tokenizer_hash": "H", "length": 18446744073709551616}\n',  # past 64 bits
    b'{"sample_id": "a", "tokenizer_hash": "H", "length": -1}\n',
    b'{"sample_id": "a", "tokenizer_hash": "H", "length": 1.0}\n',
    b'{"sample_id": "a", "tokenizer_hash": "H", "length": 1e3}\n',
    b'{"sample_id": "a", "tokenizer_hash": "H", "length": }\n',
    b'{"sample_id": "a", "tokenizer_hash": "H", "length":  1}\n',
    b'{"sample_id": "a", "tokenizer_hash": "H", "length": 1}',  # no line end
    b'{"sample_id": "a\x00", "tokenizer_hash": "H", "length": 1}\n',  # a byte the proof uses
    b'{"sample_id": "a\x01", "tokenizer_hash": "H", "length": 1}\n',
    b'{"sample_id": "a\tb", "tokenizer_hash": "H", "length": 1}\n',  # a raw control character: not JSON
    b'{"sample_id": "caf\xc3\xa9", "tokenizer_hash": "H", "length": 1}\n',  # raw UTF-8 (another writer)
    b'{"sample_id": "a\\"b", "tokenizer_hash": "H", "length": 1}\n',  # an escape
    b'{"sample_id": "a", "tokenizer_hash": "G", "length": 1}\n',  # another tokenizer
    b'{"sample_id": "a", "tokenizer_hash": "H", "length": 1}\n\n',  # a blank line
    b'{"sample_id":"a", "tokenizer_hash": "H", "length": 1}\n',  # another spacing
    b'{"sample_id": "a", "length": 1, "tokenizer_hash": "H"}\n',  # another key order
    b'{"sample_id": "a", "tokenizer_hash": "H", "length": 1} \n',
    b"",
]


@pytest.mark.parametrize("data", NEAR_MISSES)
def test_parse_block_leaves_every_other_block_to_the_row_parser(data):
    assert rows_module.parse_block(data, rows_module.row_tail("H")) is None
    ids, values = rows_module.parse_block(b'{"sample_id": "a", "tokenizer_hash": "H", "length": 1}\n',
                                          rows_module.row_tail("H"))
    assert ids.tolist() == ["a"] and values.tolist() == [1]


# ---------------------------------------------------------------------- load
def _variant(draw_kind: str, sample_id: str, length: int) -> bytes:
    """A row as the writer writes it, or as another tool might (same JSON value)."""
    if draw_kind == "writer":
        return writer_row(sample_id, length)
    if draw_kind == "compact":
        return json.dumps({"sample_id": sample_id, "tokenizer_hash": HASH, "length": length},
                          separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n"
    return json.dumps({"length": length, "tokenizer_hash": HASH, "sample_id": sample_id}).encode() + b"\n"


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["writer", "writer", "compact", "reordered"]),
                          st.one_of(plain_text, ids_text), lengths), min_size=1, max_size=30, unique_by=lambda r: r[1]),
       st.sampled_from([1, 7, 64, 1 << 22]), st.booleans())
def test_load_equals_the_plain_definition(tmp_path_factory, rows, block, last_line_end):
    path = str(tmp_path_factory.mktemp("cache") / "l.jsonl")
    data = b"".join(_variant(kind, i, n) for kind, i, n in rows)
    Path(path).write_bytes(data if last_line_end else data[:-1])
    ids, want, _ = plain_rows(path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(reader.line_blocks.__kwdefaults__, "block_bytes", block)
        cache = LengthCache.load(path)
    assert cache.sample_ids == ids and cache.lengths.tolist() == want


def _slow_error(path):
    """The code and message the row-by-row reader (every block refused by parse_block) gives."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cache_module, "parse_block", lambda data, tail: None)
        with pytest.raises(UmlosError) as info:
            LengthCache.load(path)
    return info.value.code, info.value.message


BAD_ROWS = [
    b'{"sample_id": "b", "tokenizer_hash": "ab", "length": 01}\n',
    b'{"sample_id": "b", "tokenizer_hash": "ab", "length": 4294967296}\n',
    b'{"sample_id": "b", "tokenizer_hash": "ab", "length": 18446744073709551616}\n',
    b'{"sample_id": "b", "tokenizer_hash": "ab", "length": -1}\n',
    b'{"sample_id": "b", "tokenizer_hash": "ab", "length": true}\n',
    b'{"sample_id": "b", "tokenizer_hash": "ab", "length": NaN}\n',
    b'{"sample_id": "b", "tokenizer_hash": "cd", "length": 1}\n',
    b'{"sample_id": "a", "tokenizer_hash": "ab", "length": 1}\n',  # a repeated id
    b'{"sample_id": 5, "tokenizer_hash": "ab", "length": 1}\n',
    b'{"sample_id": "b", "tokenizer_hash": "", "length": 1}\n',
    b'{"id": "b", "text": "hello"}\n',
    b'[1, 2]\n',
    b'\n',
    b'{"sample_id": "b\xff", "tokenizer_hash": "ab", "length": 1}\n',
    b'{"sample_id": ' + b"[" * 70 + b"]" * 70 + b', "tokenizer_hash": "ab", "length": 1}\n',
    b'{"sample_id": "b", "tokenizer_hash": "ab", "length": 1',
]


@pytest.mark.parametrize("bad", BAD_ROWS)
@pytest.mark.parametrize("where", [1, 40])
def test_bad_rows_are_refused_as_the_row_parser_refuses_them(tmp_path, bad, where):
    path = str(tmp_path / "l.jsonl")
    good = [b'{"sample_id": "%s", "tokenizer_hash": "ab", "length": 3}\n' % (b"a" if k == 0 else b"r%d" % k)
            for k in range(60)]
    Path(path).write_bytes(b"".join(good[:where] + [bad] + good[where:]))
    code, message = _slow_error(path)
    expect(code, LengthCache.load, path, mention=message)
    assert code == errors.LENGTHS_INVALID and (f"line {where + 1}" in message or "appears at" in message)


def test_read_ids_reads_the_ids_in_the_same_read_and_still_checks_the_sidecar(tmp_path, monkeypatch):
    path = str(tmp_path / "l.jsonl")
    ids = [f"train_{i:04d}" for i in range(50)] + ["naïve", 'q"uote']
    LengthCache.from_arrays(ids, range(52), HASH).write(path)
    def no_second_read(*args):
        raise AssertionError("read_ids reads the JSONL once")

    with monkeypatch.context() as patch:
        patch.setattr(cache_module, "scan_rows", no_second_read)
        cache = LengthCache.load(path, sidecar="require", read_ids=True)
        patch.setattr(cache_module, "_parse_jsonl", no_second_read)
        assert cache.sample_ids == ids and cache.lengths.tolist() == list(range(52))
    from test_batching_lengths import _forge

    _forge(path, [0] + list(range(1, 52))[::-1])  # another order of lengths, its header recomputed
    expect(errors.LENGTHS_SIDECAR_MISMATCH, LengthCache.load, path, sidecar="require", read_ids=True,
           mention="at row 2")


def test_read_ids_does_not_trust_a_sidecar_beside_rows_of_another_shape(tmp_path):
    import hashlib

    from test_batching_lengths import _forge

    path = str(tmp_path / "l.jsonl")
    LengthCache.from_arrays(["a", "b"], [3, 4], HASH).write(path)
    text = Path(path).read_text().replace('", "length": ', '","length": ')
    Path(path).write_text(text)
    _forge(path, jsonl_size=len(text), jsonl_sha256=hashlib.sha256(text.encode()).hexdigest())
    expect(errors.LENGTHS_SIDECAR_MISMATCH, LengthCache.load, path, sidecar="require", read_ids=True,
           mention="at row 1")


# ---------------------------------------------------------------------- line_blocks
def _error(message):
    return UmlosError(errors.LENGTHS_INVALID, message, operator=errors.BATCHING_OPERATOR)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"")), max_size=12), st.booleans(),
       st.integers(1, 16), st.integers(0, 12))
def test_line_blocks_are_iter_lines_in_blocks(tmp_path_factory, lines, last_end, block, cap):
    path = tmp_path_factory.mktemp("blocks") / "f"
    data = b"\n".join(lines) + (b"\n" if last_end and lines else b"")
    path.write_bytes(data)

    def outcome(read):
        try:
            return "ok", read()
        except UmlosError as exc:
            return "error", exc.message

    def by_lines():
        return [raw for _, raw in reader.iter_lines(path, _error, max_line_bytes=cap)]

    def by_blocks():
        out = []
        for number, chunk in reader.line_blocks(path, _error, block_bytes=block, max_line_bytes=cap):
            assert number == len(out)
            out += _split(chunk)
        return out

    assert outcome(by_blocks) == outcome(by_lines)


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=300), st.integers(1, 64), st.integers(0, 5))
def test_line_blocks_hash_every_byte_read_in_order_even_when_stopped(tmp_path_factory, data, block, stop):
    """The digest (updated in a second thread) is the file's SHA-256 when the blocks were all read,
    that of the blocks read when the caller stopped early; no thread is left behind either way."""
    import hashlib
    import threading

    path = tmp_path_factory.mktemp("digest") / "f"
    path.write_bytes(data)
    threads = threading.active_count()
    digest = hashlib.sha256()
    assert b"".join(chunk for _, chunk in reader.line_blocks(path, _error, block_bytes=block, digest=digest)) == data
    assert digest.hexdigest() == hashlib.sha256(data).hexdigest() and threading.active_count() == threads
    digest = hashlib.sha256()
    blocks = reader.line_blocks(path, _error, block_bytes=block, digest=digest)
    taken = [chunk for _, (_, chunk) in zip(range(stop), blocks)]
    blocks.close()
    assert threading.active_count() == threads
    read = b"".join(taken)
    assert data.startswith(read) and digest.hexdigest() in {
        hashlib.sha256(data[:k]).hexdigest() for k in range(len(read), len(data) + 1)}


def test_line_blocks_raise_what_the_digest_raises_without_hanging(tmp_path):
    class Broken:
        def update(self, block):
            raise ValueError("no more")

    path = tmp_path / "f"
    path.write_bytes(b"a\n" * 100)
    with pytest.raises(ValueError, match="no more"):
        list(reader.line_blocks(path, _error, block_bytes=4, digest=Broken()))


def _split(chunk: bytes) -> list[bytes]:
    parts = chunk.split(b"\n")
    return [p + b"\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


@pytest.mark.parametrize("read_ids", [False, True])
def test_an_eleven_digit_length_is_no_row_of_the_writer(tmp_path, read_ids):
    """10000000000 is past uint32; read from the right its last ten digits are 0, which a forged
    sidecar could claim: the row is not of the writer's shape, so the sidecar is not trusted."""
    import hashlib

    from test_batching_lengths import _forge

    path = str(tmp_path / "l.jsonl")
    LengthCache.from_arrays(["a", "b"], [5, 7], HASH).write(path)
    text = Path(path).read_text().replace('"length": 7}', '"length": 10000000000}')
    Path(path).write_text(text)
    _forge(path, [5, 0], jsonl_size=len(text), jsonl_sha256=hashlib.sha256(text.encode()).hexdigest())
    expect(errors.LENGTHS_SIDECAR_MISMATCH, LengthCache.load, path, sidecar="require", read_ids=read_ids,
           mention="at row 2")
    expect(errors.LENGTHS_INVALID, LengthCache.load, path, sidecar="ignore", mention="line 2")


def test_a_line_holding_the_tail_once_in_the_wrong_place_is_no_writer_row():
    """The id ', ' then the tail without its first two bytes: the tail occurs once in the line, but
    not after the id; the line is not JSON, and parse_block must not read it."""
    tail = rows_module.row_tail("H")
    line = b'{"sample_id": "' + b", " + (b'"' + tail)[3:] + b"xyz5}\n"
    assert line.count(b'"' + tail) == 1
    assert rows_module.parse_block(line, tail) is None
    with pytest.raises(ValueError):
        json.loads(line)
