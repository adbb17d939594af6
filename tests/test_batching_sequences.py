"""Concatenate-and-cut pretraining sequences (docs/batching.md, "Pretraining sequences"): exactness against a
plain Python definition over small N, random access against the pass, and the folder's refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from token_cases import make_store, random_sequences, swapped_vocabulary, write_megatron

from umlos_cuda import errors
from umlos_cuda.batching.plans.windows import ArrayLengths, SyntheticLengths
from umlos_cuda.batching.plans.windows.cut import CutDefinition
from umlos_cuda.batching.plans.windows.sequences import IGNORE_INDEX, PretrainingSequences
from umlos_cuda.batching.plans.windows.sequences_io import load_sequences, save_sequences
from umlos_cuda.errors import UmlosError
from umlos_cuda.nextbatch import MODE_SEQUENTIAL, MODE_SHUFFLE, epoch_indices

EOS = 7


class Tokens:
    """A token source whose token ``i`` of row ``r`` is ``1000 r + i + 10`` (so EOS 7 is never a document token);
    the loss mask is 1 on odd tokens."""

    def __init__(self, lengths) -> None:
        self.lengths = np.asarray(lengths, dtype=np.uint32)

    def arrays(self, row: int):
        n = int(self.lengths[row])
        return np.arange(n, dtype=np.int64) + 1000 * row + 10, (np.arange(n) % 2).astype(np.uint8)


def plain_stream(definition: CutDefinition, lengths, epoch: int) -> list[tuple[int, int]]:
    """Every stream token of an epoch as ``(row, offset)``, offset == length for an appended EOS: the rows of
    the whole epoch's order, each document's tokens, joined; nothing windowed."""
    n = definition.num_documents
    if definition.stage == MODE_SEQUENTIAL:
        order = list(range(n))
    else:
        order = epoch_indices(definition.manifest, "train", epoch, 0, n, backend="numpy").tolist()
    stream = []
    for row in order:
        stream += [(row, i) for i in range(int(lengths[row]) + definition.extra)]
    return stream


def value(tokens: Tokens, row: int, offset: int) -> int:
    return EOS if offset == int(tokens.lengths[row]) else 1000 * row + offset + 10


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 40), min_size=1, max_size=30), window=st.integers(1, 12),
       length=st.integers(1, 24), eos=st.booleans(), tail=st.sampled_from(["drop", "pad"]),
       seed=st.integers(0, 50), epochs=st.integers(1, 2), stage=st.sampled_from([MODE_SHUFFLE, MODE_SEQUENTIAL]))
def test_every_token_once_in_engine_order(lengths, window, length, eos, tail, seed, epochs, stage):
    if sum(lengths) + (len(lengths) if eos else 0) < 2:
        lengths = lengths[:-1] + [2]
    tokens = Tokens(lengths)
    definition = CutDefinition(len(lengths), length, window=window, seed=seed, stage=stage,
                               eos=EOS if eos else None, tail=tail)
    plan = PretrainingSequences.build(definition, tokens, epochs)
    for epoch in range(epochs):
        stream = plain_stream(definition, tokens.lengths, epoch)
        total = len(stream)
        samples = -(-total // length) if tail == "pad" else (total - 1) // length
        assert plan.epoch_tokens(epoch) == total and plan.epoch_samples(epoch) == samples
        inputs = []
        for k in range(samples):
            pieces = plan.pieces(epoch, k)
            got = [(p.row, p.offset + i) for p in pieces for i in range(p.count)]
            assert got == stream[k * length:k * length + length + 1]  # the plain cut, L + 1 tokens
            sample = plan.sample(epoch, k)
            real = [value(tokens, r, o) for r, o in got]
            pad = length + 1 - len(real)
            ids = real + [0] * pad
            assert sample["input_ids"].tolist() == ids[:length]
            assert sample["labels"].tolist() == ids[1:len(real)] + [IGNORE_INDEX] * (length + 1 - len(real))
            assert len(sample["documents"]) == len(pieces)
            inputs += got[:length]
        if tail == "pad":
            assert inputs == stream  # every token of every document is an input exactly once, in order
        else:
            assert inputs == stream[:samples * length] and 1 <= total - len(inputs) <= length


@settings(max_examples=30, deadline=None)
@given(lengths=st.lists(st.integers(1, 30), min_size=2, max_size=25), window=st.integers(1, 9),
       length=st.integers(1, 16), seed=st.integers(0, 9))
def test_random_access_equals_the_pass(lengths, window, length, seed):
    from umlos_cuda.batching.plans.windows import cut

    chunk, cut.INDEX_CHUNK = cut.INDEX_CHUNK, 4  # a lazy plan counts chunks of a window or a few
    try:
        _random_access_equals_the_pass(lengths, window, length, seed)
    finally:
        cut.INDEX_CHUNK = chunk


def _random_access_equals_the_pass(lengths, window, length, seed):
    tokens = Tokens(lengths)
    plan = PretrainingSequences.build(CutDefinition(len(lengths), length, window=window, seed=seed, eos=EOS),
                                      tokens, 2)
    passed = [(e, k, s) for e, k, s in plan.iter_from(0, 0)]
    assert [(e, k) for e, k, _ in passed] == [(e, k) for e in range(2) for k in range(plan.epoch_samples(e))]
    rng = np.random.default_rng(seed)
    for i in rng.permutation(len(passed))[:10].tolist():
        e, k, want = passed[i]
        fresh = PretrainingSequences(plan.definition, plan.lengths, plan.index, tokens=tokens)  # nothing cached
        got = fresh.sample(e, k)
        for key in ("input_ids", "labels", "loss_mask", "position_ids", "segment_ids"):
            assert np.array_equal(got[key], want[key]), key
        resumed = next(fresh.iter_from(e, k))
        assert resumed[:2] == (e, k) and np.array_equal(resumed[2]["input_ids"], want["input_ids"])
        lazy = PretrainingSequences.build(plan.definition, tokens, 2, lazy=True)  # counts chunks as asked
        assert np.array_equal(lazy.sample(e, k)["labels"], want["labels"])
        assert lazy.fingerprint == plan.fingerprint  # the fingerprint completes the pass


def test_boundaries_positions_segments_and_mask():
    tokens = Tokens([3, 2])
    plan = PretrainingSequences.build(CutDefinition(2, 8, window=1, stage=MODE_SEQUENTIAL, eos=EOS, tail="pad"),
                                      tokens)
    sample = plan.sample(0, 0)  # 10 11 12 EOS 1010 1011 EOS, then padding
    assert sample["input_ids"].tolist() == [10, 11, 12, EOS, 1010, 1011, EOS, 0]
    assert sample["labels"].tolist() == [11, 12, EOS, 1010, 1011, EOS, IGNORE_INDEX, IGNORE_INDEX]
    assert sample["position_ids"].tolist() == [0, 1, 2, 3, 0, 1, 2, 0]
    assert sample["segment_ids"].tolist() == [0, 0, 0, 0, 1, 1, 1, -1]
    assert sample["loss_mask"].tolist() == [1, 0, 1, 0, 1, 1, 0, 0]  # the label token's mask, 1 on EOS
    assert sample["documents"] == [0, 1]


def test_megatron_count_and_fingerprint_covers_the_definition():
    lengths = SyntheticLengths(5000, 3)
    base = PretrainingSequences.build(CutDefinition(5000, 2048, window=512), lengths)
    total = int(lengths.take(np.arange(5000)).sum(dtype=np.uint64))
    assert base.epoch_samples(0) == (total - 1) // 2048  # GPTDataset's samples for one epoch
    prints = {base.fingerprint}
    for change in ({"window": 256}, {"seed": 1}, {"eos": 2}, {"tail": "pad"}, {"sequence_length": 1024}):
        fields = {"window": 512, "sequence_length": 2048} | change
        length = fields.pop("sequence_length")
        prints.add(PretrainingSequences.build(CutDefinition(5000, length, **fields), lengths).fingerprint)
    assert len(prints) == 6


def test_folder_round_trip_and_refusals(tmp_path: Path):
    tokens = Tokens(np.arange(1, 60) % 17 + 1)
    plan = PretrainingSequences.build(CutDefinition(59, 16, window=8, eos=EOS), tokens, 2)
    folder = tmp_path / "seq"
    save_sequences(plan, folder)
    opened = load_sequences(folder, tokens=tokens)
    assert opened.fingerprint == plan.fingerprint
    assert np.array_equal(opened.sample(1, 5)["input_ids"], plan.sample(1, 5)["input_ids"])
    with pytest.raises(UmlosError) as caught:
        load_sequences(folder)
    assert caught.value.code == errors.PLAN_LENGTHS_MISMATCH  # no tokens_path recorded
    with pytest.raises(UmlosError) as caught:
        load_sequences(folder, lengths=ArrayLengths(np.arange(1, 60) % 17 + 2))
    assert caught.value.code == errors.PLAN_LENGTHS_MISMATCH
    meta = json.loads((folder / "meta.json").read_text())
    meta["definition"]["tail"] = "pad"
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UmlosError) as caught:
        load_sequences(folder, tokens=tokens)
    assert caught.value.code == errors.PLAN_FINGERPRINT_MISMATCH
    meta["definition"]["tail"] = "sideways"
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UmlosError) as caught:
        load_sequences(folder, tokens=tokens)
    assert caught.value.code == errors.PLAN_FORMAT_INVALID
    index = folder / "index.npy"
    index.write_bytes(index.read_bytes()[:-8])
    with pytest.raises(UmlosError) as caught:
        load_sequences(folder, tokens=tokens)
    assert caught.value.code == errors.PLAN_FORMAT_INVALID
    with pytest.raises(UmlosError) as caught:
        load_sequences(tmp_path / "absent")
    assert caught.value.code == errors.PLAN_NOT_FOUND


def test_cursor_and_definition_refusals():
    plan = PretrainingSequences.build(CutDefinition(4, 4, window=2, eos=EOS), Tokens([5, 5, 5, 5]))
    with pytest.raises(UmlosError) as caught:
        plan.sample(0, plan.epoch_samples(0))
    assert caught.value.code == errors.PLAN_CURSOR_INVALID
    for bad in ({"sequence_length": 0}, {"tail": "x"}, {"window": 0}, {"eos": -1}):
        fields = {"sequence_length": 4} | bad
        with pytest.raises(UmlosError) as caught:
            CutDefinition(4, fields.pop("sequence_length"), **fields)
        assert caught.value.code == errors.BATCHING_CONFIG_INVALID
    with pytest.raises(UmlosError) as caught:
        PretrainingSequences.build(CutDefinition(5, 4), Tokens([5, 5, 5, 5]))
    assert caught.value.code == errors.PLAN_LENGTHS_MISMATCH


def _plain_ids(definition: CutDefinition, source, epoch: int) -> list[int]:
    ids: list[int] = []
    for row, offset in plain_stream(definition, np.asarray(source.lengths), epoch):
        doc = source.arrays(row)[0]
        ids.append(int(doc[offset]) if offset < doc.shape[0] else int(definition.eos))
    return ids


@pytest.mark.parametrize("kind", ["store", "megatron"])
def test_collated_from_a_token_store_and_megatron(tmp_path: Path, kind: str):
    from umlos_cuda.batching.tokens.sources import open_token_source

    if kind == "store":
        make_store(tmp_path, 40, seed=3)
        path = tmp_path / "store"
    else:
        path = write_megatron(tmp_path / "mega", random_sequences(40, seed=3, high=60))
    source = open_token_source(path)
    definition = CutDefinition(len(source), 32, window=7, seed=5, eos=2, tail="pad")
    save_sequences(PretrainingSequences.build(definition, source, 2), tmp_path / "seq", tokens_path=path)
    opened = load_sequences(tmp_path / "seq")  # the tokens reopened from tokens_path
    for epoch in range(2):
        want = _plain_ids(definition, source, epoch)
        got = [int(t) for e, _, s in opened.iter_from(epoch) if e == epoch for t in s["input_ids"]]
        assert got[:len(want)] == want and set(got[len(want):]) <= {0}


def test_plan_cut_command(tmp_path: Path, capsys):
    from umlos_cuda.cli import main

    prefix = write_megatron(tmp_path / "mega", random_sequences(120, seed=2, high=50))
    out = tmp_path / "seq"
    assert main(["plan", "cut", "--tokens", prefix, "--sequence-length", "16", "--window", "16", "--eos", "0",
                 "--epochs", "2", "--output", str(out), "--show", "2"]) == 0
    printed = capsys.readouterr().out.splitlines()
    opened = load_sequences(out)
    assert printed[1] == f"fingerprint {opened.fingerprint}"
    shown = json.loads(printed[-1])
    assert shown["input_ids"] == opened.sample(0, 2)["input_ids"].tolist()
    assert main(["plan", "cut", "--tokens", prefix, "--sequence-length", "16", "--output", str(out)]) != 0
    assert "OUTPUT_EXISTS" in capsys.readouterr().err  # an existing folder is refused without --force


@pytest.mark.parametrize("kind,dtype,top", [("store", None, None), ("megatron", np.uint16, 1 << 16),
                                             ("megatron", np.int32, 1 << 31), ("megatron", np.uint8, 1 << 8)],
                         ids=["store vocab_size", "megatron uint16", "megatron int32", "megatron uint8"])
def test_an_eos_past_what_the_source_holds_is_refused_before_the_pass(tmp_path: Path, capsys, kind, dtype, top):
    """``plan cut --eos`` takes only an id the source can hold: below a store's vocab_size, inside a Megatron
    pair's dtype (the model would fail on it hours later, on a device-side assert); nothing is written."""
    from umlos_cuda.batching.tokens.sources import open_token_source
    from umlos_cuda.cli import main

    if kind == "store":
        path = str(tmp_path / "store")
        top = make_store(tmp_path, 20, seed=3).vocab_size
    else:
        path = write_megatron(tmp_path / "mega", random_sequences(20, seed=3, vocab=200, high=40), dtype=dtype)
    base = ["plan", "cut", "--source", path, "--sequence-length", "16", "--window", "8", "--quiet"]
    assert main([*base, "--eos", str(top - 1), "--output", str(tmp_path / "ok")]) == 0
    assert main([*base, "--eos", str(top), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error {errors.BATCHING_CONFIG_INVALID}: eos {top} is not a token id of {path}: its ids "
                          f"are 0 to {top - 1}") and not (tmp_path / "out").exists()
    with pytest.raises(UmlosError) as caught:  # the API refuses it as the command does, before the index pass
        PretrainingSequences.build(CutDefinition(20, 16, eos=top), open_token_source(path), lazy=True)
    assert caught.value.code == errors.BATCHING_CONFIG_INVALID


def test_id_limits_of_every_token_source_kind(tmp_path: Path):
    """What each source says its ids are: a store's vocab_size, a Megatron dtype, the narrowest of several
    prefixes, a length source over a store; a caller's own source says nothing (and takes any id)."""
    from umlos_cuda.batching.sources import open_source
    from umlos_cuda.batching.tokens.sources import check_token_ids, id_limit, open_token_source

    vocab = make_store(tmp_path, 10, seed=1).vocab_size
    narrow = write_megatron(tmp_path / "narrow", random_sequences(5, seed=1, vocab=200), dtype=np.uint8)
    wide = write_megatron(tmp_path / "wide", random_sequences(5, seed=2, vocab=200), dtype=np.int32)
    assert id_limit(open_token_source(tmp_path / "store")) == (vocab, "its vocab_size")
    assert id_limit(open_source(str(tmp_path / "store"), tokens=True)) == (vocab, "its vocab_size")
    assert id_limit(open_token_source(wide)) == (1 << 31, "its token type int32")
    assert id_limit(open_token_source([narrow, wide])) == (256, "its token type uint8")
    assert id_limit(open_source([narrow, wide], tokens=True)) == (256, "its token type uint8")
    assert id_limit(Tokens([3])) is None and check_token_ids((1 << 40,), Tokens([3]), "id", fail=ValueError)
    with pytest.raises(ValueError, match=f"separator id 256 is not a token id of {narrow} \\+ {wide}"):
        check_token_ids((255, 256), open_token_source([narrow, wide]), "separator id", fail=ValueError)


def test_index_pass_in_chunks_of_windows(monkeypatch):
    from umlos_cuda.batching.plans.windows import cut

    lengths = SyntheticLengths(997, 4)
    for window in (1, 3, 8, 50):
        definition = CutDefinition(997, 64, window=window, seed=2, eos=1)
        whole = cut.build_cut_index(definition, lengths, 2)
        monkeypatch.setattr(cut, "INDEX_CHUNK", 7)  # chunk edges inside every few windows
        chunked = cut.build_cut_index(definition, lengths, 2)
        monkeypatch.undo()
        plain = np.zeros((2, definition.num_windows + 1), dtype=np.int64)
        for e in range(2):
            for w in range(definition.num_windows):
                plain[e, w + 1] = plain[e, w] + int(cut.window_documents(definition, lengths, e, w)[1].sum())
        assert np.array_equal(whole, plain) and np.array_equal(chunked, plain)


def test_mapped_megatron_binds_and_reads_like_megatron_dataset(tmp_path: Path):
    from umlos_cuda.batching.tokens.mapped import MappedMegatron
    from umlos_cuda.batching.tokens.megatron import MegatronDataset

    prefix = write_megatron(tmp_path / "mega", random_sequences(90, seed=4, high=40))
    mapped, whole = MappedMegatron(prefix), MegatronDataset.open(prefix)
    assert mapped.binding() == ArrayLengths(whole.lengths).binding()
    for row in (0, 44, 89):
        assert np.array_equal(mapped.arrays(row)[0], whole.arrays(row)[0])
        assert np.array_equal(mapped.arrays(row)[1], whole.arrays(row)[1])
    definition = CutDefinition(90, 24, window=10, eos=3)
    built = PretrainingSequences.build(definition, mapped, 1)
    save_sequences(built, tmp_path / "seq", tokens_path=prefix)
    reopened = load_sequences(tmp_path / "seq")  # MegatronDataset from tokens_path: the same binding
    assert reopened.fingerprint == built.fingerprint
    for k in (0, built.epoch_samples(0) - 1):
        assert built.sample(0, k)["input_ids"].tolist() == reopened.sample(0, k)["input_ids"].tolist()
    (tmp_path / "bad.idx").write_bytes(b"not an index at all, longer than the header is")
    (tmp_path / "bad.bin").write_bytes(b"")
    with pytest.raises(UmlosError) as caught:
        MappedMegatron(tmp_path / "bad")
    assert caught.value.code == errors.MEGATRON_INDEX_INVALID


def test_a_lazy_plan_counts_only_the_chunks_a_sample_needs(monkeypatch):
    from umlos_cuda.batching.plans.windows import cut

    monkeypatch.setattr(cut, "INDEX_CHUNK", 64)
    lengths = SyntheticLengths(4000, 1)
    definition = CutDefinition(4000, 512, window=16)
    lazy = PretrainingSequences.build(definition, lengths, lazy=True)
    lazy.pieces(0, 0)
    assert lazy._counted[0] == 4  # one chunk of 64 documents: 4 windows of 16
    whole = PretrainingSequences.build(definition, lengths)
    assert lazy.pieces(0, 1000) == whole.pieces(0, 1000) and lazy._counted[0] < definition.num_windows
    assert np.array_equal(lazy.index, whole.index) and lazy.epoch_samples(0) == whole.epoch_samples(0)


@pytest.mark.parametrize("mixed", [False, True], ids=["sequences", "mixed sequences"])
def test_a_store_tokenized_again_in_place_is_refused_naming_what_changed(tmp_path: Path, capsys, mixed):
    """The lengths bind the documents, the recorded identity their tokens: a store re-tokenized in place by a
    tokenizer of equal lengths is refused when the folder reopens it, naming the hashes that differ."""
    from umlos_cuda.batching.plans.kinds import open_plan
    from umlos_cuda.batching.tokens.store import TokenStore
    from umlos_cuda.batching.tokens.writer import tokenize_dataset
    from umlos_cuda.cli import main

    make_store(tmp_path, 60, seed=4)
    store = tmp_path / "store"
    before = TokenStore.open(store)
    out = tmp_path / "seq"
    cut = ["--mix", f"{store}:1", "--num-samples", "20"] if mixed else ["--source", str(store)]
    assert main(["plan", "cut", *cut, "--sequence-length", "32", "--window", "8", "--eos", "2", "--quiet",
                 "--output", str(out)]) == 0
    key = "tokens_identities" if mixed else "tokens_identity"
    recorded = json.loads((out / "meta.json").read_text())[key]
    assert (recorded[0] if mixed else recorded)["tokens_sha256"] == before.meta["tokens_sha256"]
    fingerprint = open_plan(out).fingerprint
    other = swapped_vocabulary(tmp_path / "model", tmp_path / "other-model")
    tokenize_dataset(tmp_path / "train.jsonl", other, store, prompt_field="prompt", response_field="response",
                     force=True)
    after = TokenStore.open(store)
    assert np.array_equal(after.lengths, before.lengths)  # what the fingerprint binds is unchanged
    assert not np.array_equal(np.asarray(after.tokens), np.asarray(before.tokens))
    with pytest.raises(UmlosError) as caught:
        open_plan(out)
    assert caught.value.code == errors.BATCH_STORE_MISMATCH
    assert "tokens_sha256" in caught.value.message and "tokenizer_hash" in caught.value.message
    capsys.readouterr()
    assert main(["verify", str(out)]) != 0 and "BATCH_STORE_MISMATCH" in capsys.readouterr().err
    tokenize_dataset(tmp_path / "train.jsonl", tmp_path / "model", store, prompt_field="prompt",
                     response_field="response", force=True)
    assert open_plan(out).fingerprint == fingerprint  # the same tokens again: it opens as it was cut
