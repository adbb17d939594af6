"""Plain ids kept as bytes (umlos_cuda/batching/lengths/plain_ids.py) give what the strings give.

* PlainIds: the same ids back, the same sample_ids.jsonl bytes and SHA-256, ``distinct`` exactly
  when the strings are distinct (sorted, shuffled, with repeats, with one 64-bit mix shared).
* microbatches.jsonl made from their bytes is ``json.dumps`` per line (bucketed and packed plans, any
  chunk size), as from the strings.
* A length cache read from its JSONL keeps plain ids as bytes; its ids, a repeated id's refusal and
  message, and a whole plan folder (every file, byte for byte) are those of the row-by-row path.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from batching_cases import expect, small_plan
from umlos_cuda import errors
from umlos_cuda.batching import BatchingConfig, BatchPlanBuilder, LengthCache, save_plan
from umlos_cuda.batching.lengths import cache as cache_module, plain_ids as plain_module
from umlos_cuda.batching.lengths.plain_ids import PlainIds
from umlos_cuda.batching.packing.config import PackingConfig
from umlos_cuda.batching.plans import lines
from umlos_cuda.batching.plans.builder import sample_ids_sha256
from umlos_cuda.errors import UmlosError
from umlos_cuda.files import reader

HASH = "ab" * 32
plain_text = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters='"\\'),
                     max_size=12)
few_letters = st.text(alphabet="ab_ 9~", max_size=3)  # repeats are likely


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(plain_text, few_letters), min_size=1, max_size=40), st.booleans())
def test_plain_ids_are_the_strings(ids, ordered):
    ids = sorted(ids) if ordered else ids
    plain = PlainIds.encode(ids)
    assert plain is not None and plain.tolist() == ids == list(plain) and len(plain) == len(ids)
    assert [plain[k] for k in range(-len(ids), len(ids))] == ids + ids and plain[1:3] == ids[1:3]
    assert b"".join(lines.sample_ids_lines(plain)) == "".join(json.dumps(i) + "\n" for i in ids).encode("ascii")
    assert sample_ids_sha256(plain) == sample_ids_sha256(ids)
    assert plain.distinct() == (len(set(ids)) == len(ids))
    assert plain.padded == any(len(i) < max(1, *map(len, ids)) for i in ids)
    rows = np.arange(len(ids))[::-1].astype(np.intp)
    joined = plain.joined(rows, [0, len(ids) // 2, len(ids)], b'", "')
    assert [t.translate(None, b"\0") for t in joined] == [
        '", "'.join(ids[::-1][:len(ids) // 2]).encode(), '", "'.join(ids[::-1][len(ids) // 2:]).encode()]


@given(st.lists(st.text(max_size=4), min_size=1, max_size=10))
def test_ids_that_are_not_plain_stay_strings(ids):
    assert (PlainIds.encode(ids) is None) == any(json.dumps(i) != f'"{i}"' for i in ids)


def test_distinct_settles_a_shared_mix_by_the_strings(monkeypatch):
    """With every id mixed to the same word (as if all collided), the answer still comes from the ids."""
    monkeypatch.setattr(plain_module, "_MIX", np.uint64(0))
    assert PlainIds.encode(["b", "a", "c"]).distinct()
    assert not PlainIds.encode(["b", "a", "b"]).distinct()


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 120), st.integers(0, 2 ** 16), st.booleans(), st.integers(1, 40))
def test_microbatch_lines_of_plain_ids_are_json_dumps(monkeypatch_module, n, seed, packed, chunk):
    ids = [f"id-{i * 7919 % 1000:x}" * (1 + i % 3) for i in range(n)]  # several widths: padding is dropped
    plan = small_plan(n, seed, packed, ids)
    plain = PlainIds.encode(ids)
    monkeypatch_module.setattr(lines, "CHUNK_ENTRIES", chunk)
    for epoch in plan.epochs:
        reference = "".join(json.dumps(spec.to_json()) + "\n" for spec in plan.iter_epoch(epoch.epoch))
        assert b"".join(lines.microbatch_lines(epoch, plain)) == reference.encode("ascii")


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def _row_by_row(function, *args):
    """``function(*args)`` with every block read row by row and the ids kept as strings (the strings' path)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cache_module, "parse_block", lambda data, tail: None)
        patch.setattr(PlainIds, "encode", classmethod(lambda cls, ids: None))
        return function(*args)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(plain_text, few_letters), min_size=1, max_size=40), st.sampled_from([1, 50, 1 << 22]),
       st.booleans())
def test_a_cache_keeps_plain_ids_as_bytes_and_refuses_repeats_as_before(tmp_path_factory, ids, block, sidecar):
    path = str(tmp_path_factory.mktemp("cache") / "l.jsonl")
    data = b"".join(b'{"sample_id": "%s", "tokenizer_hash": "%s", "length": %d}\n' % (i.encode(), HASH.encode(), k)
                    for k, i in enumerate(ids))
    Path(path).write_bytes(data)
    load = (lambda p: LengthCache.load(p, sidecar="ignore")) if not sidecar else \
        (lambda p: LengthCache.load(p, read_ids=True))
    if sidecar and len(set(ids)) == len(ids):
        LengthCache.from_arrays(ids, range(len(ids)), HASH).write(path, force=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(reader.line_blocks.__kwdefaults__, "block_bytes", block)
        try:
            want = _row_by_row(load, path)
        except UmlosError as exc:
            expect(exc.code, load, path, mention=exc.message)
            assert exc.code == errors.LENGTHS_INVALID and "appears at" in exc.message and len(set(ids)) < len(ids)
            return
        cache = load(path)
    assert cache.sample_ids == want.sample_ids == ids
    assert cache.plain_ids is not None or cache.ids_are_line_numbers


def test_a_plan_folder_from_plain_ids_is_the_strings_folder_byte_for_byte(tmp_path):
    rng = np.random.default_rng(3)
    ids = [f"train_{i:05d}" for i in rng.permutation(3000)] + ["x" * 40, ""]
    path = str(tmp_path / "l.jsonl")
    LengthCache.from_arrays(ids, rng.integers(1, 300, len(ids)), HASH).write(path)
    for config in (BatchingConfig(1024, (32, 64, 128), 300, seed=5),
                   BatchingConfig(1024, (), 300, seed=5, pack=PackingConfig(300, "greedy"))):
        fast = LengthCache.load(path, read_ids=True)
        assert isinstance(fast.plain_ids, PlainIds)
        save_plan(BatchPlanBuilder(fast, config).build(2), tmp_path / "fast", force=True)
        slow = _row_by_row(lambda p: LengthCache.load(p, sidecar="ignore"), path)
        assert slow.plain_ids is None and slow.sample_ids == ids
        save_plan(BatchPlanBuilder(slow, config).build(2), tmp_path / "slow", force=True)
        names = sorted(os.path.relpath(os.path.join(d, f), tmp_path / "slow")
                       for d, _, files in os.walk(tmp_path / "slow") for f in files)
        assert "epoch_1/microbatches.jsonl" in names and "sample_ids.jsonl" in names
        for name in names:
            assert (tmp_path / "fast" / name).read_bytes() == (tmp_path / "slow" / name).read_bytes(), name
        digest = hashlib.sha256((tmp_path / "fast" / "sample_ids.jsonl").read_bytes()).hexdigest()
        assert json.loads((tmp_path / "fast" / "meta.json").read_text())["sample_ids_sha256"] == digest
