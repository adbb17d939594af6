"""Sequence packing (docs/batching.md, "Packing"): ``pack_lengths`` in every
implementation against the plain definitions (tests/packing_reference.py),
``pack_sequences`` and its rows, the oversize policies and metrics, the
attention mask with a proof of isolation, and every failure path."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from packing_eager import eager_pack_sequences
from packing_reference import reference_pack_lengths, reference_pack_sequences
from umlos_cuda import errors
from umlos_cuda.batching import (
    PackingConfig,
    PackingMetrics,
    SequenceToPack,
    Sample,
    SampleMeta,
    compute_packing_metrics,
    create_segment_attention_mask,
    oversize_pieces,
    pack_lengths,
    pack_rows,
    pack_sequences,
)
from umlos_cuda.batching.packing import pack as packing, trees as packing_trees
from umlos_cuda.errors import UmlosError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("first_fit", "best_fit", "greedy")
NATIVE = packing.native_module()
needs_native = pytest.mark.skipif(NATIVE is None, reason="umlos_cuda._packing is not built (no C++ compiler)")


def expect(code: str, function, *args, mention: str | None = None, **kwargs) -> UmlosError:
    with pytest.raises(UmlosError) as info:
        function(*args, **kwargs)
    assert info.value.code == code, info.value
    assert info.value.record["failure_operator"] == errors.PACKING_OPERATOR
    if mention:
        assert mention in info.value.message, info.value.message
    return info.value


def backends() -> list[str]:
    return ["python"] + (["native"] if NATIVE is not None else [])


def lognormal(n: int, max_length: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(max_length / 8), 1.0, n), 1, max_length).astype(np.uint32)


# ====================================================================== pack_lengths
@st.composite
def length_cases(draw):
    max_length = draw(st.integers(1, 48))
    separator_len = draw(st.integers(0, 4))
    lengths = draw(st.lists(st.integers(0, max_length), max_size=80))
    return lengths, max_length, separator_len


@settings(max_examples=300)
@given(case=length_cases(), mode=st.sampled_from(MODES))
def test_pack_lengths_is_the_definition(case, mode):
    """Every implementation gives exactly the reference rows, for every mode,
    separator and length mix (zero-length sequences included)."""
    lengths, max_length, separator_len = case
    expected = reference_pack_lengths(lengths, max_length, mode, separator_len)
    for backend in backends():
        rows = pack_lengths(np.asarray(lengths, dtype=np.int64), max_length, mode, separator_len, backend=backend)
        assert rows.dtype == np.int64 and rows.tolist() == expected, backend


@pytest.mark.parametrize("mode", MODES)
def test_pack_lengths_on_many_lognormal_lengths(mode):
    """Thousands of rows (first-fit's tree doubles several times), a separator,
    lengths as uint32: reference, Python trees and native agree."""
    lengths = lognormal(3000, 512, seed=1)
    expected = reference_pack_lengths(lengths[:1500], 512, mode, 1)
    assert pack_lengths(lengths[:1500], 512, mode, 1, backend="python").tolist() == expected
    big = lognormal(60000, 2048, seed=2)
    python = pack_lengths(big, 2048, mode, backend="python")
    if NATIVE is not None:
        assert np.array_equal(pack_lengths(big, 2048, mode, backend="native"), python)
    rows = python.max() + 1
    assert rows >= -(-int(big.sum()) // 2048)
    assert np.array_equal(np.unique(python), np.arange(rows))  # rows are numbered 0.. without gaps
    used = np.bincount(python, weights=big.astype(np.int64), minlength=rows)
    assert used.max() <= 2048


def test_rows_are_numbered_in_opening_order():
    # first-fit in input order: 5 opens row 0, 4 row 1, 3 row 2, then 1 fits row 0
    assert pack_lengths([5, 4, 3, 1], 6, "first_fit").tolist() == [0, 1, 2, 0]
    # best-fit: 1 goes to the row with the least room that fits (row 0 has 1 left)
    assert pack_lengths([4, 5, 3, 1], 6, "best_fit").tolist() == [0, 1, 2, 1]
    # greedy: 6 (position 2) opens row 0, then 5 row 1, the two 3s row 2 in input order, 1 row 1
    assert pack_lengths([3, 5, 6, 3, 1], 6, "greedy").tolist() == [2, 1, 0, 2, 1]
    # a separator between the sequences of a row: 2 + 1 + 2 + 1 + 2 = 8
    assert pack_lengths([2, 2, 2, 2], 8, "first_fit", 1).tolist() == [0, 0, 0, 1]
    assert pack_lengths([8, 8], 8, "first_fit", 3).tolist() == [0, 1]  # alone in a row, no separator
    assert pack_lengths([], 8).tolist() == []


@pytest.mark.parametrize("backend", ["python", "native"])
def test_best_fit_without_a_dense_room_tree(backend, monkeypatch):
    """A huge max_length: best-fit's room tree is sparse in Python, and greedy's
    order is a comparison sort in C++; both still match the definition."""
    if backend == "native" and NATIVE is None:
        pytest.skip("umlos_cuda._packing is not built")
    lengths = np.random.default_rng(3).integers(1, 1 << 28, 400)
    for mode in MODES:
        expected = reference_pack_lengths(lengths, 1 << 29, mode, 7)
        assert pack_lengths(lengths, 1 << 29, mode, 7, backend=backend).tolist() == expected
    monkeypatch.setattr(packing_trees, "DENSE_ROOMS", 1)
    small = lognormal(500, 64, seed=4)
    expected = reference_pack_lengths(small, 64, "best_fit")
    assert pack_lengths(small, 64, "best_fit", backend="python").tolist() == expected


def test_pack_lengths_leaves_its_input_alone():
    lengths = np.array([3, 1, 2], dtype=np.int64)
    pack_lengths(lengths, 4, "greedy", 1)
    assert lengths.tolist() == [3, 1, 2]


# ====================================================================== pack_sequences
@st.composite
def sequence_cases(draw):
    max_length = draw(st.integers(1, 24))
    count = draw(st.integers(0, 30))
    sequences = []
    for i in range(count):
        length = draw(st.integers(1, 3 * max_length))
        ids = draw(st.lists(st.integers(0, 1000), min_size=length, max_size=length))
        mask = draw(st.lists(st.integers(0, 1), min_size=length, max_size=length))
        sequences.append((f"s{i}", ids, mask))
    separator = tuple(draw(st.lists(st.integers(0, 9), max_size=min(3, max_length - 1))))
    return sequences, max_length, separator


@settings(max_examples=200)
@given(case=sequence_cases(), mode=st.sampled_from(MODES),
       oversize=st.sampled_from(("refuse", "skip", "truncate", "split")))
def test_pack_sequences_is_the_definition(case, mode, oversize):
    """Rows, arrays, provenance and oversize counts equal the token-by-token reference."""
    sequences, max_length, separator = case
    expected = reference_pack_sequences(sequences, max_length, mode, separator, oversize)
    inputs = [SequenceToPack(s, ids, mask) for s, ids, mask in sequences]
    if expected is None:
        expect(errors.PACKING_SEQUENCE_TOO_LONG, pack_sequences, inputs, max_length, mode, separator_ids=separator,
               oversize=oversize)
        return
    rows, counts = expected
    for backend in backends():
        packed = pack_sequences(inputs, max_length, mode, separator_ids=separator, oversize=oversize, backend=backend)
        assert [r.to_dict() for r in packed] == rows
        m = packed.metrics
        assert (m.skipped, m.truncated, m.truncated_tokens, m.split, list(m.skipped_ids)) == (
            counts["skipped"], counts["truncated"], counts["truncated_tokens"], counts["split"], counts["skipped_ids"])
        assert m.rows == len(rows) and m.sequences == len(sequences)
        assert m.tokens + m.separator_tokens == sum(len(r["input_ids"]) for r in rows)
        assert m.loss_tokens == sum(sum(r["loss_mask"]) for r in rows)
        assert all(r.length <= max_length for r in packed)
        assert m == compute_packing_metrics(packed, max_length, sequences=len(sequences), skipped=m.skipped,
                                            truncated=m.truncated, truncated_tokens=m.truncated_tokens,
                                            split=m.split, skipped_ids=m.skipped_ids)


def test_packed_row_arrays():
    packed = pack_sequences([[11, 12, 13], [21, 22], [31, 32, 33, 34, 35, 36], [41]], 6, separator_ids=(0,),
                            oversize="split")
    first = packed[0]
    assert first.input_ids.tolist() == [11, 12, 13, 0, 21, 22]
    assert first.loss_mask.tolist() == [1, 1, 1, 0, 1, 1]  # never trained on the separator
    assert first.segment_ids.tolist() == [0, 0, 0, 0, 1, 1]  # the separator belongs to the segment before it
    assert first.position_ids.tolist() == [0, 1, 2, 3, 0, 1]
    assert first.cu_seqlens.tolist() == [0, 4, 6]
    assert first.sample_ids == ("0", "1") and first.num_segments == 2 and first.separator_tokens == 1
    assert [r.sample_ids for r in packed] == [("0", "1"), ("2",), ("3",)]
    for array in (first.input_ids, first.loss_mask, first.segment_ids, first.position_ids, first.cu_seqlens):
        assert array.dtype == np.int32
    m = packed.metrics
    assert (m.rows, m.tokens, m.separator_tokens, m.capacity, m.lower_bound_rows) == (3, 12, 1, 18, 2)
    assert m.packing_efficiency == pytest.approx(13 / 18) and m.segments_per_row == pytest.approx(4 / 3)


@pytest.mark.parametrize("backend", backends())
def test_layout_rows_of_one_flat_list_equal_row_by_row_layouts(backend):
    """layout_rows (all rows from one list and per-row counts, with or
    without known lengths) gives each row exactly what build_row gives it
    alone (NumPy layout), and the loss tokens of all rows in one sum; the
    native layout gives the same rows bit for bit."""
    from umlos_cuda.batching.packing.rows import SequenceToPack, build_row, layout_rows

    rng = np.random.default_rng(11)
    segments = [SequenceToPack(str(i), rng.integers(0, 50, n), rng.integers(0, 2, n), offset=i % 3)
                for i, n in enumerate(rng.integers(1, 9, 40).tolist())]
    counts = np.asarray([1, 3, 2, 5, 1, 4, 8, 2, 6, 8], dtype=np.int64)
    bounds = np.concatenate(([0], np.cumsum(counts))).tolist()
    lengths = np.asarray([s.length for s in segments], dtype=np.int64)
    for separator in ((), (7,), (7, 8)):
        for known in (None, lengths):
            rows, loss_tokens = layout_rows(segments, counts, separator, known, backend=backend)
            assert loss_tokens == sum(int(s.loss_mask.sum()) for s in segments)
            for r, row in enumerate(rows):
                alone = build_row(segments[bounds[r]:bounds[r + 1]], separator)
                assert row.to_dict() == alone.to_dict() and row.separator_tokens == alone.separator_tokens
                assert all(getattr(row, name).dtype == np.int32 for name in ARRAYS)
    assert layout_rows([], np.zeros(0, dtype=np.int64), backend=backend) == ([], 0)


ARRAYS = ("input_ids", "loss_mask", "segment_ids", "position_ids", "cu_seqlens")


# ====================================================================== the lazy view of pack_sequences
@st.composite
def lazy_cases(draw):
    """Random lengths (some above the row length), a row length, a
    separator and the seed of the tokens and masks."""
    max_length = draw(st.integers(1, 64))
    lengths = draw(st.lists(st.integers(1, 3 * max_length), max_size=120))
    separator = tuple(draw(st.lists(st.integers(0, 2**31 - 1), max_size=min(3, max_length - 1))))
    return lengths, max_length, separator, draw(st.integers(0, 2**32 - 1))


def same_rows(lazy_rows, eager_rows) -> None:
    """Row for row, array for array: values, dtypes, provenance, separators."""
    assert len(lazy_rows) == len(eager_rows)
    for a, b in zip(lazy_rows, eager_rows):
        assert (a.sample_ids, a.sample_offsets, a.separator_tokens) == (b.sample_ids, b.sample_offsets,
                                                                        b.separator_tokens)
        for name in ARRAYS:
            x, y = getattr(a, name), getattr(b, name)
            assert x.dtype == y.dtype == np.int32 and np.array_equal(x, y), name


@settings(max_examples=150, deadline=None)
@given(case=lazy_cases(), mode=st.sampled_from(MODES),
       oversize=st.sampled_from(("refuse", "skip", "truncate", "split")), data=st.data())
def test_lazy_rows_equal_the_eager_layout(case, mode, oversize, data):
    """Whatever the view lays out (all rows, a row range, one row, a
    negative index, iteration, microbatches) equals the rows of the eager
    pack_sequences it replaced (tests/packing_eager.py), array for array,
    in every backend; the metrics are the same numbers."""
    lengths, max_length, separator, seed = case
    rng = np.random.default_rng(seed)
    sequences = [SequenceToPack(f"s{i}", rng.integers(0, 2**31 - 1, n), None if i % 3 else rng.integers(0, 2, n))
                 for i, n in enumerate(lengths)]
    if oversize == "refuse" and any(n > max_length for n in lengths):
        expect(errors.PACKING_SEQUENCE_TOO_LONG, pack_sequences, sequences, max_length, mode,
               separator_ids=separator, oversize=oversize)
        return
    for backend in backends():
        eager, metrics = eager_pack_sequences(sequences, max_length, mode, separator_ids=separator,
                                              oversize=oversize, backend=backend)
        lazy = pack_sequences(sequences, max_length, mode, separator_ids=separator, oversize=oversize,
                              backend=backend)
        assert lazy.metrics == metrics and len(lazy) == len(eager)
        same_rows(lazy.materialize(), eager)
        same_rows(list(lazy), eager)
        start = data.draw(st.integers(0, len(eager)), label="start")
        stop = data.draw(st.integers(start, len(eager)), label="stop")
        same_rows(lazy.rows(start, stop), eager[start:stop])
        same_rows(lazy[start:stop], eager[start:stop])
        same_rows(lazy[::-2], eager[::-2])
        if eager:
            index = data.draw(st.integers(-len(eager), len(eager) - 1), label="index")
            same_rows([lazy[index]], [eager[index]])
        size = data.draw(st.integers(1, 5), label="rows per microbatch")
        batches = list(lazy.microbatches(size))
        assert all(len(batch) == size for batch in batches[:-1])
        same_rows([row for batch in batches for row in batch], eager)
        # The decision's flat arrays describe the same rows.
        assert lazy.row_lengths.tolist() == [row.length for row in eager]
        for r, row in enumerate(eager):
            pieces = slice(int(lazy.row_offsets[r]), int(lazy.row_offsets[r + 1]))
            assert tuple(sequences[i].sample_id for i in lazy.sources[pieces]) == row.sample_ids
            assert tuple(lazy.starts[pieces].tolist()) == row.sample_offsets
            assert int(lazy.lengths[pieces].sum()) + row.separator_tokens == row.length


def test_pack_sequences_lays_out_no_row_until_asked(monkeypatch):
    """The call decides and counts without laying out a row: with the layout
    made to fail, pack_sequences still returns its rows' count, row lengths
    and metrics (loss tokens included); asking for a row then lays it out."""
    from umlos_cuda.batching.packing import view

    sequences = [SequenceToPack("a", [1, 2, 3], [0, 1, 1]), SequenceToPack("b", list(range(9)), [1] * 4 + [0] * 5)]
    calls = []
    real = view.layout_segments
    monkeypatch.setattr(view, "layout_segments", lambda *args, **kwargs: calls.append(args) or real(*args, **kwargs))
    packed = pack_sequences(sequences, 4, oversize="split")
    assert calls == [] and len(packed) == 3 and packed.row_lengths.tolist() == [4, 4, 4]
    assert (packed.metrics.loss_tokens, packed.metrics.tokens, packed.metrics.split) == (6, 12, 1)
    assert packed[2].input_ids.tolist() == [4, 5, 6, 7] and len(calls) == 1


def test_lazy_rows_keep_the_decision_they_were_given():
    """The view copies the caller's list (a sequence replaced afterwards
    does not change its rows), its arrays are read-only, and a row out of
    range or a bad range is refused."""
    sequences = [SequenceToPack("a", [1, 2]), SequenceToPack("b", [3]), SequenceToPack("c", [4, 5, 6])]
    packed = pack_sequences(sequences, 3)
    sequences[0] = SequenceToPack("z", [9, 9])
    assert [r.sample_ids for r in packed] == [("a", "b"), ("c",)]
    assert packed[0].input_ids.tolist() == [1, 2, 3] and packed[-1].input_ids.tolist() == [4, 5, 6]
    assert packed.row_offsets.tolist() == [0, 2, 3] and packed.sources.tolist() == [0, 1, 2]
    with pytest.raises(ValueError):
        packed.sources[0] = 2
    with pytest.raises(IndexError):
        packed[2]
    with pytest.raises(IndexError):
        packed[-3]
    expect(errors.PACKING_CONFIG_INVALID, packed.rows, 1, 3, mention="stop")
    expect(errors.PACKING_CONFIG_INVALID, packed.rows, 2, 1, mention="stop")
    expect(errors.PACKING_CONFIG_INVALID, lambda: next(packed.microbatches(0)), mention="rows_per_microbatch")
    assert packed[5:9] == [] and packed.rows(1, 1) == [] and "2 rows" in repr(packed)
    assert [s.loss_tokens for s in (SequenceToPack("m", [1, 2, 3], [0, 1, 1]), sequences[1])] == [2, 1]


@needs_native
def test_native_layout_equals_numpy_layout_on_many_rows():
    """The native one-pass layout and the NumPy definition agree bit for bit
    on thousands of lognormal sequences with random masks, with and without
    a separator, for every mode; the four arrays of the native layout are
    laid out end to end (each row's views are consecutive)."""
    rng = np.random.default_rng(5)
    lengths = lognormal(3000, 512, seed=5)
    sequences = [SequenceToPack(str(i), rng.integers(0, 2**31 - 1, n), rng.integers(0, 2, n))
                 for i, n in enumerate(lengths.tolist())]
    for mode in MODES:
        for separator in ((), (2**31 - 1, 0)):
            native = pack_sequences(sequences, 512, mode, separator_ids=separator, backend="native").materialize()
            numpy_rows = pack_sequences(sequences, 512, mode, separator_ids=separator, backend="python")
            assert len(native) == len(numpy_rows)
            for a, b in zip(native, numpy_rows):
                assert a.sample_ids == b.sample_ids and a.sample_offsets == b.sample_offsets
                for name in ARRAYS:
                    x, y = getattr(a, name), getattr(b, name)
                    assert x.dtype == y.dtype == np.int32 and np.array_equal(x, y), (mode, separator, name)
            ends = [r.input_ids.__array_interface__["data"][0] + 4 * r.length for r in native[:-1]]
            assert ends == [r.input_ids.__array_interface__["data"][0] for r in native[1:]]


@needs_native
def test_native_layout_checks_its_buffers():
    """umlos_cuda._packing.layout refuses what would make it read or write
    out of bounds, before it writes anything."""
    ids = [np.arange(3, dtype=np.int32), np.arange(2, dtype=np.int32)]
    masks = [np.ones(3, dtype=np.int32), np.ones(2, dtype=np.int32)]
    lengths, first, none = np.array([3, 2]), np.array([0, 2]), np.zeros(0, dtype=np.int32)

    def outputs(n=5):
        return [np.full(n, -1, dtype=np.int32) for _ in range(4)]

    out = outputs()
    assert NATIVE.layout(ids, masks, lengths, first, none, *out) == 5
    assert [a.tolist() for a in out] == [[0, 1, 2, 0, 1], [1] * 5, [0, 0, 0, 1, 1], [0, 1, 2, 0, 1]]
    out = outputs(6)
    assert NATIVE.layout(tuple(ids), tuple(masks), lengths, first, np.array([9], dtype=np.int32), *out) == 5
    assert [a.tolist() for a in out] == [[0, 1, 2, 9, 0, 1], [1, 1, 1, 0, 1, 1], [0, 0, 0, 0, 1, 1],
                                         [0, 1, 2, 3, 0, 1]]
    cases = [
        (TypeError, "list or tuple", ("x", masks, lengths, first, none, *outputs())),
        (TypeError, r"tokens\[1\] must be a 1-D int32", ([ids[0], ids[1].astype(np.int64)], masks, lengths, first,
                                                         none, *outputs())),
        (TypeError, r"masks\[0\] must be a contiguous", (ids, [np.ones(6, dtype=np.int32)[::2], masks[1]], lengths,
                                                           first, none, *outputs())),
        (ValueError, "same length", (ids, masks[:1], lengths, first, none, *outputs())),
        (ValueError, "lengths says 4", (ids, masks, np.array([4, 2]), first, none, *outputs())),
        (ValueError, "row_first must run", (ids, masks, lengths, np.array([0, 1]), none, *outputs())),
        (ValueError, "holds no segment", (ids, masks, lengths, np.array([0, 0, 2]), none, *outputs())),
        (ValueError, "each hold 5", (ids, masks, lengths, first, none, *outputs(4))),
        (TypeError, "writable", (ids, masks, lengths, first, none, *outputs()[:3], b"\0" * 20)),
    ]
    for error, message, args in cases:
        with pytest.raises(error, match=message):
            NATIVE.layout(*args)


@needs_native
def test_native_layout_refuses_arrays_changed_behind_sequence_to_pack():
    """A SequenceToPack whose array was swapped for one the extension cannot
    read gets the project's error, and nothing is returned."""
    from umlos_cuda.batching.packing.rows import layout_rows

    odd = SequenceToPack("a", [1, 2, 3])
    object.__setattr__(odd, "input_ids", np.arange(6, dtype=np.int32)[::2])
    expect(errors.PACKING_INPUT_INVALID, layout_rows, [odd], np.ones(1, dtype=np.int64), backend="native",
           mention="not what SequenceToPack holds")


def test_layout_rows_refuses_an_unknown_backend(monkeypatch):
    from umlos_cuda.batching.packing import rows as packed_rows

    one = [SequenceToPack("a", [1, 2])]
    expect(errors.PACKING_CONFIG_INVALID, packed_rows.layout_rows, one, np.ones(1, dtype=np.int64), backend="gpu",
           mention="backend must be one of auto, native, python")
    monkeypatch.setattr(packed_rows, "native_module", lambda: None)
    expect(errors.PACKING_CONFIG_INVALID, packed_rows.layout_rows, one, np.ones(1, dtype=np.int64), backend="native",
           mention="not built")
    rows, loss = packed_rows.layout_rows(one, np.ones(1, dtype=np.int64))  # auto falls back to NumPy
    assert rows[0].input_ids.tolist() == [1, 2] and loss == 2


def test_inputs_of_every_kind():
    meta = SampleMeta("alpha", "sft")
    sample = Sample([5, 6, 7], [0, 1, 1], None, meta)
    packed = pack_sequences([sample, {"input_ids": [8, 9], "sample_id": "beta", "loss_mask": [1, 0]}, (10,)], 8)
    row = packed[0]
    assert row.sample_ids == ("alpha", "beta", "2")
    assert row.loss_mask.tolist() == [0, 1, 1, 1, 0, 1]


def test_oversize_policies_and_their_counts():
    sequences = [SequenceToPack("long", list(range(1, 11))), SequenceToPack("short", [1, 2])]
    error = expect(errors.PACKING_SEQUENCE_TOO_LONG, pack_sequences, sequences, 4, mention="'long' (10 tokens)")
    assert "split" in error.message  # says what to do
    skipped = pack_sequences(sequences, 4, oversize="skip")
    assert [r.sample_ids for r in skipped] == [("short",)]
    assert skipped.metrics.skipped == 1 and skipped.metrics.skipped_ids == ("long",)
    truncated = pack_sequences(sequences, 4, oversize="truncate")
    assert truncated[0].input_ids.tolist() == [1, 2, 3, 4]
    assert (truncated.metrics.truncated, truncated.metrics.truncated_tokens) == (1, 6)
    split = pack_sequences(sequences, 4, oversize="split")
    assert [(r.sample_ids, r.sample_offsets) for r in split] == [
        (("long",), (0,)), (("long",), (4,)), (("long", "short"), (8, 0))]
    assert split.metrics.split == 1 and split.metrics.segments == 4
    source, start, piece = oversize_pieces(np.array([10, 2]), 4, "split")
    assert (source.tolist(), start.tolist(), piece.tolist()) == ([0, 0, 0, 1], [0, 4, 8, 0], [4, 4, 2, 2])


def test_pack_rows_lays_out_decided_rows():
    rows = pack_rows([[[1, 2], {"input_ids": [3], "sample_id": "x"}], [SequenceToPack("y", [4, 5, 6], [0, 0, 1])]],
                     separator_ids=(9,))
    assert rows[0].input_ids.tolist() == [1, 2, 9, 3] and rows[0].sample_ids == ("0", "x")
    assert rows[1].loss_mask.tolist() == [0, 0, 1] and rows[1].cu_seqlens.tolist() == [0, 3]
    config = PackingConfig(max_length=3, separator_ids=(9,))
    expect(errors.PACKING_INPUT_INVALID, pack_rows, [[[1, 2], [3]]], config=config, mention="row 0 holds 4 tokens")
    expect(errors.PACKING_INPUT_INVALID, pack_rows, [[]], mention="at least one sequence")


# ====================================================================== attention
def test_attention_mask_numpy_and_torch():
    mask = create_segment_attention_mask([0, 0, 0, 1, 1, 2])
    expected = np.zeros((6, 6), dtype=bool)
    for i in range(6):
        for j in range(i + 1):
            expected[i, j] = [0, 0, 0, 1, 1, 2][i] == [0, 0, 0, 1, 1, 2][j]
    assert mask.dtype == bool and np.array_equal(mask, expected)
    batch = create_segment_attention_mask(np.array([[0, 0, 1], [0, 1, 1]]))
    assert batch.shape == (2, 3, 3) and batch[1, 2, 1] and not batch[1, 1, 0]
    torch = pytest.importorskip("torch")
    as_torch = create_segment_attention_mask(torch.tensor([0, 0, 0, 1, 1, 2]))
    assert as_torch.dtype == torch.bool and np.array_equal(as_torch.numpy(), expected)
    assert np.array_equal(create_segment_attention_mask([0, 0, 0, 1, 1, 2], framework="torch").numpy(), expected)
    assert isinstance(create_segment_attention_mask(torch.tensor([0, 1]), framework="numpy"), np.ndarray)


def test_attention_isolation_with_scaled_dot_product_attention():
    """A packed row attends within its segments only.

    1. Bit for bit: replacing every other segment's tokens leaves a segment's
       outputs identical (same shapes, so the same kernel and summation order;
       the masked positions have weight exactly 0). Without the segment mask
       (plain causal) they change.
    2. Each segment's outputs equal its sequence run alone, in float64, within
       1e-12: alone, the softmax and ``attn @ v`` reduce over a shorter row, so
       the same non-zero terms are summed in another association (observed
       differences are a few 1e-16, one or two ulps). Leakage, for contrast,
       is of order 1e-1.
    """
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(0)
    tables = [torch.randn(64, 32, generator=generator, dtype=torch.float64) for _ in range(3)]  # q, k, v per token

    def attend(ids, mask):
        ids = torch.as_tensor(np.asarray(ids), dtype=torch.long)
        q, k, v = (t[ids][None, None] for t in tables)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)[0, 0]

    def causal(n):
        return torch.ones(n, n, dtype=torch.bool).tril()

    sequences = [[1, 2, 3, 4], [5, 6], [7, 8, 9], [10], list(range(11, 40))]
    row = pack_sequences(sequences, 64, separator_ids=(63,))[0]
    assert row.num_segments == 5
    mask = create_segment_attention_mask(torch.as_tensor(row.segment_ids))
    packed = attend(row.input_ids, mask)
    cu = row.cu_seqlens.tolist()
    rng = np.random.default_rng(1)
    for k, sequence in enumerate(sequences):
        mine = slice(cu[k], cu[k + 1])
        changed = rng.integers(0, 63, row.length).astype(np.int32)
        changed[mine] = row.input_ids[mine]
        assert torch.equal(attend(changed, mask)[mine], packed[mine]), k
        if k:  # with a plain causal mask, earlier segments leak into this one
            leaky = attend(changed, causal(row.length))[mine] - attend(row.input_ids, causal(row.length))[mine]
            assert leaky.abs().max() > 1e-3
        alone = attend(sequence, causal(len(sequence)))
        assert (packed[cu[k]:cu[k] + len(sequence)] - alone).abs().max() <= 1e-12, k
        unmasked = attend(row.input_ids, causal(row.length))[cu[k]:cu[k] + len(sequence)]
        assert k == 0 or (unmasked - alone).abs().max() > 1e-3


# ====================================================================== failures
@pytest.mark.parametrize("kwargs, mention", [
    (dict(max_length=0), "max_length"),
    (dict(max_length=1 << 31), "max_length"),
    (dict(max_length=True), "max_length"),
    (dict(mode="next_fit"), "first_fit, best_fit, greedy"),
    (dict(separator_len=-1), "separator_len"),
    (dict(backend="gpu"), "auto, native, python"),
    (dict(lengths=[[1, 2]]), "one-dimensional"),
    (dict(lengths=[1.5, 2.0]), "one-dimensional"),
    (dict(lengths=[3, -1]), "non-negative"),
    (dict(lengths="abc"), "one-dimensional"),
])
def test_pack_lengths_refuses(kwargs, mention):
    args = dict(lengths=[1, 2, 3], max_length=8, mode="first_fit", separator_len=0, backend="auto") | kwargs
    expect(errors.PACKING_CONFIG_INVALID, pack_lengths, args.pop("lengths"), **args, mention=mention)


def test_pack_lengths_refuses_a_sequence_longer_than_a_row():
    error = expect(errors.PACKING_SEQUENCE_TOO_LONG, pack_lengths, [3, 9, 2, 12], 8,
                   mention="2 sequence(s) longer than max_length 8: position 1 (9 tokens), position 3 (12 tokens)")
    assert "oversize" in error.message


def test_native_unavailable(monkeypatch):
    monkeypatch.setattr(packing, "native_module", lambda: None)
    expect(errors.PACKING_CONFIG_INVALID, pack_lengths, [1, 2], 4, backend="native", mention="not built")
    assert pack_lengths([3, 2, 1], 4, "best_fit").tolist() == [0, 1, 0]  # auto falls back to Python


@needs_native
def test_native_entry_point_checks_its_buffers():
    rows = np.empty(2, dtype=np.int64)
    with pytest.raises(TypeError, match="int64"):
        NATIVE.pack(np.array([1, 2], dtype=np.int32), 4, 0, rows)
    with pytest.raises(TypeError, match="writable"):
        NATIVE.pack(np.array([1, 2]), 4, 0, b"x" * 16)
    with pytest.raises(ValueError, match="as long as"):
        NATIVE.pack(np.array([1, 2, 3]), 4, 0, rows)
    with pytest.raises(ValueError, match="outside"):
        NATIVE.pack(np.array([1, 5]), 4, 0, rows)
    with pytest.raises(ValueError, match="mode"):
        NATIVE.pack(np.array([1, 2]), 4, 3, rows)
    assert NATIVE.pack(np.array([3, 2]), 4, 0, rows) == 2 and rows.tolist() == [0, 1]


@pytest.mark.parametrize("kwargs, mention", [
    (dict(max_length=0), "max_length"),
    (dict(mode="worst_fit"), "pack mode"),
    (dict(oversize="drop"), "oversize policy must be one of refuse, skip, truncate, split"),
    (dict(separator_ids="ab"), "separator_ids"),
    (dict(separator_ids=(1, -1)), "separator id"),
    (dict(separator_ids=(1, 2), max_length=2), "leave no room"),
    (dict(separator_len=2, max_length=2), "leave no room"),
    (dict(separator_len=-1), "separator_len"),
    (dict(separator_ids=(1, 2), separator_len=1), "does not match the 2 separator_ids"),
])
def test_packing_config_refuses(kwargs, mention):
    expect(errors.PACKING_CONFIG_INVALID, PackingConfig, **kwargs, mention=mention)


def test_packing_config_round_trip():
    config = PackingConfig(1024, "BEST_FIT", [2], "split")
    assert config.to_dict() == {"mode": "best_fit", "max_length": 1024, "separator_len": 1, "separator_ids": [2],
                                "oversize": "split"}
    assert config.separator_len == 1 and PackingConfig.from_dict(config.to_dict()) == config
    assert PackingConfig(1024, separator_ids=[2, 3], separator_len=2).separator_len == 2
    assert PackingConfig(1024, separator_len=2) != PackingConfig(1024, separator_ids=[2, 3])  # lengths vs ids


def test_a_length_only_config_lays_out_no_tokens():
    """A plan's config knows the separator's length, not its ids: packing tokens with it is refused."""
    plan_config = PackingConfig(8, separator_len=1)
    expect(errors.PACKING_CONFIG_INVALID, pack_sequences, [[1, 2], [3]], config=plan_config, mention="no separator_ids")
    expect(errors.PACKING_CONFIG_INVALID, pack_rows, [[[1, 2], [3]]], config=plan_config, mention="no separator_ids")


@pytest.mark.parametrize("args, mention", [
    (("a", []), "is empty"),
    (("a", [1, -2]), "[0, 2147483647]"),
    (("a", [1, 1 << 31]), "[0, 2147483647]"),
    (("a", np.array([1, 1 << 32], dtype=np.uint64)), "[0, 2147483647]"),
    (("a", [1, 2], [1]), "loss_mask has 1 values for 2 tokens"),
    (("a", [1, 2], [1, 2]), "0 or 1"),
    (("a", [[1, 2]]), "one-dimensional"),
    (("a", ["x"]), "one-dimensional"),
    ((7, [1]), "sample_id must be a string"),
    (("a", [1], None, -1), "offset"),
])
def test_sequence_to_pack_refuses(args, mention):
    expect(errors.PACKING_INPUT_INVALID, SequenceToPack, *args, mention=mention)


def test_pack_sequences_refuses_bad_inputs():
    expect(errors.PACKING_INPUT_INVALID, pack_sequences, [{"tokens": [1]}], 4, mention="without input_ids")
    expect(errors.PACKING_INPUT_INVALID, pack_sequences, [[1], []], 4, mention="sample '1' is empty")
    expect(errors.PACKING_CONFIG_INVALID, pack_sequences, [[1]], 4, oversize="never")
    expect(errors.PACKING_CONFIG_INVALID, create_segment_attention_mask, [0, 1], framework="jax")
    expect(errors.PACKING_CONFIG_INVALID, create_segment_attention_mask, 3)


def test_metrics_of_nothing():
    empty = pack_sequences([], 8)
    assert list(empty) == [] and empty.metrics.rows == 0 and empty.metrics.packing_efficiency == 0.0
    assert PackingMetrics(8, 0, 0, 0, 0).to_dict()["loss_token_efficiency"] is None


def test_every_packing_code_is_documented():
    source = Path(os.path.join(ROOT, "umlos_cuda", "errors.py")).read_text(encoding="utf-8")
    block = source.split("#: Sequence packing (", 1)[1].split("\n\n", 1)[0]
    codes = set(re.findall(r'^([A-Z_]+) = "\1"', block, re.M)) | {errors.PLAN_PACKS_INVALID}
    assert codes == {"PACKING_CONFIG_INVALID", "PACKING_SEQUENCE_TOO_LONG", "PACKING_INPUT_INVALID",
                     "PLAN_PACKS_INVALID"}
    doc = Path(os.path.join(ROOT, "docs", "batching.md")).read_text(encoding="utf-8")
    table = doc.split("## Failure codes", 1)[1].split("\n## ", 1)[0]
    for code in codes:
        assert re.search(rf"^\| `{code}` \|", table, re.M), code
