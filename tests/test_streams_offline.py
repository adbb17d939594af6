"""Offline streams: a JSONL dataset and a token store read as stream samples,
the same samples as the batching package builds, sync and async."""

from __future__ import annotations

import asyncio
import json

import pytest

from umlos_cuda import errors
from umlos_cuda.batching.samples import SampleMeta
from umlos_cuda.batching.templates import sft_sample
from umlos_cuda.batching.tokens.writer import tokenize_dataset
from umlos_cuda.errors import UmlosError
from umlos_cuda.streams import (AsyncOfflineDatasetStream, OfflineDatasetStream, ReplayBuffer, StreamSample,
                                TokenStoreStream)
from streams_support import EOS, tokenizer


@pytest.fixture
def dataset(tmp_path):
    path = tmp_path / "train.jsonl"
    with open(path, "w") as handle:
        for i in range(23):
            handle.write(json.dumps({"id": f"r{i}", "prompt": "the quick fox " * (1 + i % 3),
                                     "response": "jumps over " * (1 + i % 5), "level": ("easy", "hard")[i % 2]}) + "\n")
    return path


def test_prompt_response_records_use_the_batching_template(dataset):
    samples = list(OfflineDatasetStream(dataset, tokenizer(), prompt_field="prompt", response_field="response",
                                        difficulty_field="level", eos_token=EOS, chunk_size=5))
    assert [s.seq for s in samples] == list(range(23)) and samples[3].sample_id == "r3"
    with open(dataset) as handle:
        record = json.loads(handle.readlines()[3])
    expected = sft_sample(tokenizer(), record["prompt"], record["response"], SampleMeta("r3", "x"), eos_token=EOS)
    assert samples[3].sample.input_ids == expected.input_ids and samples[3].sample.loss_mask == expected.loss_mask
    assert samples[3].difficulty == "hard" and samples[3].sample.meta.difficulty == 4.0
    assert samples[3].source == "offline:train.jsonl"
    assert StreamSample.from_dict(samples[3].to_dict()) == samples[3]
    again = asyncio.run(_collect(AsyncOfflineDatasetStream(dataset, tokenizer(), prompt_field="prompt",
                                                           response_field="response", eos_token=EOS)))
    assert [s.sample.input_ids for s in again] == [s.sample.input_ids for s in samples]


async def _collect(stream):
    return [s async for s in stream]


def test_text_records_train_on_every_token(dataset):
    samples = list(OfflineDatasetStream(dataset, tokenizer(), text_field="response", eos_token=EOS))
    assert all(set(s.sample.loss_mask) == {1} for s in samples)
    assert samples[0].sample.input_ids[-1] == tokenizer().token_to_id(EOS)


def test_bad_fields_are_refused(dataset):
    with pytest.raises(UmlosError) as info:
        OfflineDatasetStream(dataset, tokenizer(), prompt_field="prompt", eos_token=EOS)
    assert info.value.code == errors.STREAM_INVALID
    with pytest.raises(UmlosError) as info:
        list(OfflineDatasetStream(dataset, tokenizer(), text_field="missing", eos_token=EOS))
    assert info.value.code == errors.DATASET_RECORD_INVALID


def test_a_token_store_streams_its_rows(dataset, tmp_path):
    tokenize_dataset(dataset, tokenizer(), tmp_path / "store", prompt_field="prompt", response_field="response",
                     eos_token=EOS)
    stream = TokenStoreStream(tmp_path / "store")
    samples = list(stream)
    offline = list(OfflineDatasetStream(dataset, tokenizer(), prompt_field="prompt", response_field="response",
                                        eos_token=EOS))
    assert len(stream) == 23 and [s.sample_id for s in samples] == [s.sample_id for s in offline]
    assert [s.sample.input_ids for s in samples] == [s.sample.input_ids for s in offline]
    assert [s.sample.loss_mask for s in samples] == [s.sample.loss_mask for s in offline]
    assert [s.seq for s in TokenStoreStream(tmp_path / "store", start=20)] == [20, 21, 22]
    assert len(asyncio.run(_collect(TokenStoreStream(tmp_path / "store")))) == 23
    buffer = ReplayBuffer(10, seed=0)
    for s in samples:
        buffer.add(s)
    assert buffer.snapshot().lengths.tolist() == [s.length for s in samples[13:]]
