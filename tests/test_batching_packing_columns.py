"""``pack_token_arrays`` and ``pack_token_source``: the rows of ``pack_sequences`` without its objects.

The oracle is tests/packing_eager.py (every row laid out at once from
``SequenceToPack`` objects, as ``pack_sequences`` did before it was lazy):
for the same tokens, masks and ids, every row the columnar view lays out,
whichever range or microbatch asks for it, equals that row array for array,
and the metrics are equal, for every mode, oversize policy, separator,
token dtype and backend. Then the same over a token store, a sharded store
and a Megatron dataset, and the refusals with their codes.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from packing_eager import eager_pack_sequences
from token_cases import make_store, random_sequences, write_megatron
from umlos_cuda import errors
from umlos_cuda.batching import SequenceToPack, pack_sequences, pack_token_arrays, pack_token_source
from umlos_cuda.batching.packing import pack as packing
from umlos_cuda.batching.tokens.megatron import MegatronDataset, MegatronDatasetList
from umlos_cuda.errors import UmlosError

MODES = ("first_fit", "best_fit", "greedy")
POLICIES = ("refuse", "skip", "truncate", "split")
ARRAYS = ("input_ids", "loss_mask", "segment_ids", "position_ids", "cu_seqlens")
BACKENDS = ["python"] + (["native"] if packing.native_module() is not None else [])


def same_rows(got, expected) -> None:
    """Row for row, array for array: values, dtypes, provenance, separators."""
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert (a.sample_ids, a.sample_offsets, a.separator_tokens) == (b.sample_ids, b.sample_offsets,
                                                                        b.separator_tokens)
        for name in ARRAYS:
            x, y = getattr(a, name), getattr(b, name)
            assert x.dtype == y.dtype == np.int32 and np.array_equal(x, y), name


def objects(tokens, offsets, mask, ids) -> list[SequenceToPack]:
    """The same sequences as ``SequenceToPack`` objects (what pack_sequences takes)."""
    return [SequenceToPack(ids[i], tokens[offsets[i]:offsets[i + 1]],
                           None if mask is None else mask[offsets[i]:offsets[i + 1]])
            for i in range(len(offsets) - 1)]


def expect(code: str, function, *args, mention: str | None = None, **kwargs) -> UmlosError:
    with pytest.raises(UmlosError) as info:
        function(*args, **kwargs)
    assert info.value.code == code, info.value
    if mention:
        assert mention in info.value.message, info.value.message
    return info.value


@st.composite
def flat_cases(draw):
    separator = tuple(draw(st.lists(st.integers(0, 9), max_size=2)))
    max_length = draw(st.integers(len(separator) + 1, 24))
    lengths = draw(st.lists(st.integers(1, 40), max_size=40))
    dtype = draw(st.sampled_from([np.uint16, np.int32, np.uint32, np.int64]))
    seed = draw(st.integers(0, 2**16))
    lead = draw(st.integers(0, 3))  # tokens before the first sequence: offsets need not start at 0
    rng = np.random.default_rng(seed)
    offsets = lead + np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    tokens = rng.integers(0, 1000, int(offsets[-1]) + draw(st.integers(0, 3))).astype(dtype)
    mask = draw(st.sampled_from([None, np.uint8, np.int32, np.bool_]))
    if mask is not None:
        mask = (rng.random(tokens.shape[0]) < 0.7).astype(mask)
    named = draw(st.booleans())
    ids = [f"s{i}" for i in range(len(lengths))] if named else None
    return tokens, offsets, mask, ids, max_length, separator


@settings(max_examples=200, deadline=None)
@given(case=flat_cases(), mode=st.sampled_from(MODES), oversize=st.sampled_from(POLICIES),
       backend=st.sampled_from(BACKENDS), cut=st.integers(0, 2**16), step=st.integers(1, 5))
def test_flat_arrays_give_the_rows_of_the_objects(case, mode, oversize, backend, cut, step):
    tokens, offsets, mask, ids, max_length, separator = case
    names = ids if ids is not None else [str(i) for i in range(len(offsets) - 1)]
    items = objects(tokens, offsets, mask, names)
    kwargs = dict(max_length=max_length, mode=mode, separator_ids=separator, oversize=oversize, backend=backend)
    if oversize == "refuse" and any(item.length > max_length for item in items):
        expected = expect(errors.PACKING_SEQUENCE_TOO_LONG, pack_sequences, items, **kwargs)
        got = expect(errors.PACKING_SEQUENCE_TOO_LONG, pack_token_arrays, tokens, offsets, mask, sample_ids=ids,
                     **kwargs)
        assert got.message == expected.message
        return
    eager, metrics = eager_pack_sequences(items, **kwargs)
    packed = pack_token_arrays(tokens, offsets, mask, sample_ids=ids, **kwargs)
    assert packed.metrics == metrics
    assert packed.row_lengths.tolist() == [row.length for row in eager]
    same_rows(packed.materialize(), eager)
    same_rows([row for batch in packed.microbatches(step) for row in batch], eager)
    start = cut % (len(eager) + 1)
    stop = start + (cut // 7) % (len(eager) - start + 1)
    same_rows(packed.rows(start, stop), eager[start:stop])
    if eager:
        same_rows([packed[-1]], eager[-1:])


def test_no_row_is_read_until_asked(monkeypatch):
    """The call reads the lengths and the mask's count, no token: it decides
    without gathering a span; a row then gathers only its own pieces."""
    from umlos_cuda.batching.packing import pieces

    spans = []
    real = pieces._gathered
    monkeypatch.setattr(pieces, "_gathered", lambda array, span, *rest: spans.append(span) or real(array, span, *rest))
    tokens = np.arange(12, dtype=np.int32)
    packed = pack_token_arrays(tokens, np.array([0, 3, 12]), max_length=4, oversize="split")
    assert spans == [] and len(packed) == 3 and packed.metrics.loss_tokens == 12
    assert packed[2].input_ids.tolist() == [7, 8, 9, 10] and spans == [[(7, 11)]]


# ====================================================================== token sources
@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """A token store (prompt/response: loss masks with zeros), a sharded store
    of 3 shards, a Megatron dataset (uint16) and a list of 2 (uint16, int32)."""
    import json

    from batching_cases import train_tokenizer, write_model_dir
    from token_cases import records
    from umlos_cuda.batching.tokens.sharded import tokenize_sharded

    root = tmp_path_factory.mktemp("columns")
    store = make_store(root, 80, seed=3)
    rows = records(60, seed=5)
    files = []
    for k, (a, b) in enumerate([(0, 25), (25, 26), (26, 60)]):
        files.append(str(root / f"part-{k:05d}-of-00003.jsonl"))
        with open(files[-1], "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(row) + "\n" for row in rows[a:b])
    write_model_dir(root / "sharded-model", train_tokenizer(), {"eos_token": "</s>"})
    sharded = tokenize_sharded(files, root / "sharded-model", root / "sharded", prompt_field="prompt",
                               response_field="response")
    assert sharded.num_parts == 3
    first = write_megatron(root / "mega0", random_sequences(25, seed=1, high=60))
    second = write_megatron(root / "mega1", random_sequences(15, seed=2, high=60), dtype=np.int32)
    return {"store": store, "sharded": sharded, "megatron": MegatronDataset.open(first),
            "megatron list": MegatronDatasetList.open([first, second])}


def source_objects(source) -> list[SequenceToPack]:
    out = []
    for row in range(len(source)):
        tokens, mask = source.arrays(row)
        out.append(SequenceToPack(source.sample_id(row), tokens, mask))
    return out


@pytest.mark.parametrize("kind", ["store", "sharded", "megatron", "megatron list"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("oversize", POLICIES)
def test_a_token_source_gives_the_rows_of_its_objects(sources, kind, mode, oversize):
    source = sources[kind]
    items = source_objects(source)
    assert any(item.loss_tokens < item.length for item in items) == (kind in ("store", "sharded"))
    max_length = int(np.percentile(source.lengths, 80))  # a fifth of the rows are oversize
    kwargs = dict(max_length=max_length, mode=mode, separator_ids=(1,), oversize=oversize)
    if oversize == "refuse":
        expected = expect(errors.PACKING_SEQUENCE_TOO_LONG, pack_sequences, items, **kwargs)
        got = expect(errors.PACKING_SEQUENCE_TOO_LONG, pack_token_source, source, **kwargs)
        assert got.message == expected.message
        kwargs["max_length"] = int(source.lengths.max())
    eager, metrics = eager_pack_sequences(items, **kwargs)
    packed = pack_token_source(source, **kwargs)
    assert packed.metrics == metrics
    same_rows(packed.materialize(), eager)
    same_rows([row for batch in packed.microbatches(3) for row in batch], eager)


@pytest.mark.parametrize("kind", ["megatron", "megatron list"])
def test_packing_a_megatron_source_reads_no_row(sources, kind, monkeypatch):
    """Its loss masks are all ones, so the loss tokens are the pieces' lengths: no document is read until a row
    is laid out."""
    source = sources[kind]
    reads = []
    real = source.arrays
    monkeypatch.setattr(source, "arrays", lambda row: reads.append(row) or real(row))
    packed = pack_token_source(source, max_length=int(source.lengths.max()), separator_ids=(1,))
    loss_tokens = packed.metrics.loss_tokens
    assert loss_tokens == int(source.lengths.sum()) and reads == []
    assert packed.materialize() and reads  # laying the rows out reads them


def test_a_store_is_read_as_flat_arrays(sources):
    """A token store's rows come from its flat arrays (the reader of
    pack_token_arrays), the same rows as pack_token_arrays on those arrays."""
    store = sources["store"]
    packed = pack_token_source(store, max_length=int(store.lengths.max()))
    flat = pack_token_arrays(store.tokens, store.offsets, store.loss_mask_array, sample_ids=store.sample_ids,
                             max_length=int(store.lengths.max()))
    assert type(packed._pieces).__name__ == "FlatPieces" and packed.metrics == flat.metrics
    same_rows(packed.materialize(), flat.materialize())


# ====================================================================== refusals
def test_refusals_name_the_problem():
    tokens = np.arange(10, dtype=np.int64)
    code = errors.PACKING_INPUT_INVALID
    expect(code, pack_token_arrays, tokens.reshape(2, 5), [0, 5], mention="one-dimensional")
    expect(code, pack_token_arrays, tokens.astype(float), [0, 5], mention="integers")
    expect(code, pack_token_arrays, tokens, [], mention="at least one value")
    expect(code, pack_token_arrays, tokens, [0, 11], mention="must lie in [0, 10]")
    expect(code, pack_token_arrays, tokens, [4, 2, 6], mention="must not decrease")
    expect(code, pack_token_arrays, tokens, [0, 3, 3, 9], sample_ids=["a", "b", "c"], mention="sample 'b' is empty")
    expect(code, pack_token_arrays, tokens, [0, 3], np.ones(9, dtype=np.uint8), mention="9 values for 10 tokens")
    expect(code, pack_token_arrays, tokens, [0, 3], np.full(10, 2), mention="0 or 1")
    expect(code, pack_token_arrays, tokens, [0, 3], sample_ids=["a", "b"], mention="each of the 1 sequences")
    expect(code, pack_token_arrays, tokens, [0, 3], sample_ids=[7], mention="strings")
    expect(code, pack_token_source, tokens, mention="an opened token source")


@pytest.mark.parametrize("bad", [-1, 2**31])
def test_a_token_id_out_of_range_is_refused_when_its_row_is_laid_out(bad):
    """As SequenceToPack refuses it when made; the call itself reads no token."""
    tokens = np.array([1, 2, 3, bad, 5, 6], dtype=np.int64)
    packed = pack_token_arrays(tokens, [0, 2, 4, 6], sample_ids=["a", "b", "c"], max_length=2)
    assert packed[0].input_ids.tolist() == [1, 2]
    expect(errors.PACKING_INPUT_INVALID, packed.rows, 1, 2, mention="sample 'b': token ids must lie in")
    expect(errors.PACKING_INPUT_INVALID, SequenceToPack, "b", tokens[2:4], mention="sample 'b': token ids")


def test_an_empty_row_of_a_source_is_refused(tmp_path):
    source = MegatronDataset.open(write_megatron(tmp_path / "mega", [[1, 2], [], [3]]))
    expect(errors.PACKING_INPUT_INVALID, pack_token_source, source, max_length=4, mention="sample '1' is empty")
