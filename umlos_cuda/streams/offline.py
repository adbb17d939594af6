"""``OfflineDatasetStream``: a JSONL dataset as a stream of samples (and its async twin).

What goes in: a JSONL file and a tokenizer, with either a prompt and a
response field (tokenized with the batching template: loss on the response
only, ``sft_sample``) or one text field (every token trained on, the
end-of-sequence token appended). Optional fields give the provenance that
curricula read: ``difficulty_field`` (a name), ``game_field``. What comes
out: :class:`~.types.StreamSample` objects in file order, ``seq`` the
0-based line number, ``source`` ``offline:<file name>``. Records are read in
chunks (``umlos_cuda.batching.lengths.jsonl``), so memory holds one chunk;
bad lines raise the dataset codes of the batching package naming the line.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

from .. import errors
from ..batching.records.jsonl import read_chunks
from ..batching.samples import Sample, SampleMeta
from ..batching.templates import sft_sample
from ..batching.lengths.tokenizer import load_tokenizer
from .failures import failure
from .types import StreamSample, difficulty_rank


class OfflineDatasetStream:
    def __init__(self, path: str | os.PathLike[str], tokenizer: Any, *, prompt_field: str | None = None,
                 response_field: str | None = None, text_field: str | None = None,
                 difficulty_field: str | None = None, game_field: str | None = None,
                 eos_token: str | None = None, chunk_size: int = 1024) -> None:
        if (text_field is None) == (prompt_field is None or response_field is None):
            raise failure(errors.STREAM_INVALID, "give either text_field, or prompt_field and response_field")
        if text_field is not None and (prompt_field or response_field):
            raise failure(errors.STREAM_INVALID, "text_field excludes prompt_field and response_field")
        self.path = os.fspath(path)
        self.tokenizer = load_tokenizer(tokenizer)
        self.eos_id = self.tokenizer.eos_token_id(eos_token)
        self.eos_token = eos_token
        self.fields = tuple(f for f in (prompt_field, response_field, text_field) if f is not None)
        self.extra = tuple(f for f in (difficulty_field, game_field) if f is not None)
        self.difficulty_field, self.game_field = difficulty_field, game_field
        self.chunk_size = chunk_size
        self.source = f"offline:{os.path.basename(self.path)}"

    def __iter__(self) -> Iterator[StreamSample]:
        for chunk in read_chunks(self.path, self.fields + self.extra, chunk_size=self.chunk_size):
            yield from self._chunk_samples(chunk)

    def _chunk_samples(self, chunk) -> list[StreamSample]:
        out = []
        names = self.fields + self.extra
        for i, sample_id in enumerate(chunk.sample_ids):
            values = {name: column[i] for name, column in zip(names, chunk.values)}
            difficulty = values.get(self.difficulty_field) if self.difficulty_field else None
            meta = SampleMeta(sample_id, self.source, None, None, difficulty_rank(difficulty), self.source)
            if len(self.fields) == 2:
                prompt, response = values[self.fields[0]], values[self.fields[1]]
                sample = sft_sample(self.tokenizer, prompt, response, meta, eos_token=self.eos_token)
            else:
                prompt, response = "", values[self.fields[0]]
                ids = self.tokenizer.tokenizer.encode(response).ids + [self.eos_id]
                sample = Sample(ids, [1] * len(ids), None, meta)
            game = values.get(self.game_field) if self.game_field else None
            out.append(StreamSample(sample, prompt, response, self.source, None, chunk.first_line + i,
                                    difficulty=difficulty, game=game))
        return out


class AsyncOfflineDatasetStream(OfflineDatasetStream):
    """The same samples for ``async for``; the event loop runs between chunks."""

    async def __aiter__(self) -> AsyncIterator[StreamSample]:
        for chunk in read_chunks(self.path, self.fields + self.extra, chunk_size=self.chunk_size):
            for sample in self._chunk_samples(chunk):
                yield sample
            await asyncio.sleep(0)


class TokenStoreStream:
    """A token store (``umlos-cuda data tokenize``, docs/batching.md) as a stream.

    Samples come out in row order, their token ids and loss masks read from
    the memory-mapped arrays (no tokenizer involved); ``seq`` is the row,
    ``source`` ``tokens:<folder name>``, the text fields are empty. Rows
    ``start`` onwards (a resume)."""

    def __init__(self, directory: str | os.PathLike[str], *, start: int = 0) -> None:
        from ..batching.tokens.store import TokenStore

        self.store = directory if isinstance(directory, TokenStore) else TokenStore.open(directory)
        self.start = start
        self.source = f"tokens:{os.path.basename(os.path.normpath(self.store.root))}"

    def __len__(self) -> int:
        return len(self.store)

    def __iter__(self) -> Iterator[StreamSample]:
        for row in range(self.start, len(self.store)):
            yield StreamSample(self.store.sample(row, dataset_id=self.source), "", "", self.source, None, row)

    async def __aiter__(self) -> AsyncIterator[StreamSample]:
        for row in range(self.start, len(self.store)):
            yield StreamSample(self.store.sample(row, dataset_id=self.source), "", "", self.source, None, row)
            if row % 1024 == 1023:
                await asyncio.sleep(0)
