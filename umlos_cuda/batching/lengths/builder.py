"""Build a length cache from a dataset and a tokenizer (or a column of token counts).

What goes in: the dataset (JSONL, gzip or zstd JSONL, Parquet, Arrow IPC, a
``save_to_disk`` folder, a ``datasets.Dataset``, or shards of them:
umlos_cuda/batching/records/), a tokenizer and what to count: one text
field, a prompt and a response field put through the instruction template
(umlos_cuda/batching/templates.py, end-of-sequence token included), a
prompt, a chosen and a rejected field: a preference record, two rows
(umlos_cuda/batching/lengths/pairs.py), a messages field rendered with the
tokenizer's chat template (umlos_cuda/batching/chat/), or an integer field
that already holds each record's token count (``length_field``: nothing is
tokenized; without a tokenizer the tokenizer hash is ``unknown``, as for
``data megatron``), or preference records in TRL's other forms: implicit-prompt pairs, unpaired
(KTO) records of a prompt, a completion and a label (lengths/preference.py), and each kind's fields
as lists of messages rendered with the chat template (``conversational``:
umlos_cuda/batching/chat/preference.py). What comes out: ``lengths.jsonl`` and its sidecar
(umlos_cuda/batching/lengths/cache.py), in dataset order, and the
:class:`~umlos_cuda.batching.lengths.cache.LengthCache`.

The dataset is streamed in chunks (:class:`DatasetEncoding`, which the token
store of umlos_cuda/batching/tokens/store.py reads through as well): this
thread reads the chunks in order, while ``workers`` encode them
(umlos_cuda/batching/lengths/workers.py: one worker is a thread, as
``encode_batch_fast`` runs in Rust outside the GIL; N workers are processes,
each with the tokenizer, results taken back in dataset order), so memory
holds O(workers) chunks plus 12 bytes a sample (the length, and a 64-bit hash
of the id to find a repeated id at the end; a repeat raises
DATASET_RECORD_INVALID naming both records, and nothing is written). The
dataset's fingerprint (records/fingerprint.py) is computed in this thread
from the values read, and every output byte is the same whatever the number
of workers and the chunk size.

Chat records and conversational preference records are rendered by the
workers that encode them (umlos_cuda/batching/chat/chunks.py ``ChatWork``
running ``ChatRender`` or chat/preference.py's ``PreferenceRender``), in
processes under the render budget (umlos_cuda/batching/chat/limits.py
``render_budget``; one worker is then one process too), because a chat
template is code that came with the model. The reader hands their
conversations on unchecked, and each chunk comes back with the records that
did not render, which the reader names, raises or skips in line order before
the fingerprint and the ids take the rest (records/source.py
``Records.accept``): the same records, lines and first error as if this
thread had rendered them. The render then names the rows of the records
kept (a preference record's one or two rows, ``RecordRender.rows``).
"""

from __future__ import annotations

import os
from contextlib import closing
from dataclasses import replace
from collections.abc import Callable, Generator, Iterator
from typing import Any, TypeVar

import numpy as np

from ... import errors
from ...errors import UmlosError
from ..records.chunk import RecordChunk, RowIds, SkippedLines
from ..records.jsonl import DEFAULT_ID_FIELD
from ..records.source import Records
from .fields import DEFAULT_TEXT_FIELD, record_fields
from .fingerprints import UNKNOWN_TOKENIZER, tokenizer_fingerprint, tokenizer_parts
from .cache import LengthCache, LengthCacheWriter, check_length_cache_output
from ..templates import sft_length
from .tokenizer import load_tokenizer
from .encoder import ChunkEncoder
from .budget import Budget
from .workers import check_workers, in_order
from .pairs import pair_rows
from .preference import PreferenceKind, preference_kind
from .unpaired import unpaired_rows
from ..chat.chunks import ChatRender, ChatWork, RecordRender
from ..chat.encode import chat_encoder
from ..chat.limits import render_budget
from ..chat.preference import PreferenceRender
from ..chat.template import chat_template_of

DEFAULT_CHUNK = 4096
#: The most records in a chunk of chat or conversational preference records: a chunk is about 0.65 s of one
#: worker's rendering and encoding, so that N workers share even a small dataset evenly (20,000 records
#: are 20 chunks, where chunks of 4,096 made five, which two workers shared three to two) and the first
#: chunk reaches a worker soon; a chunk costs one round trip of its pipe.
RENDER_CHUNK = 1024
T = TypeVar("T")


class DatasetEncoding:
    """A dataset opened for encoding with a tokenizer, chunk by chunk.

    ``dataset``: anything umlos_cuda/batching/records/ opens (a path, a glob,
    a list of shards, a ``save_to_disk`` folder, a ``datasets.Dataset``;
    ``format`` overrides the suffix). What to encode: ``text_field`` (default
    ``"text"``), or ``prompt_field`` and ``response_field`` through the
    instruction template, whose end-of-sequence token (``eos_id``) is
    appended after the encoded text, or ``prompt_field``, ``chosen_field``
    and ``rejected_field``: each record becomes two rows (``<id>/chosen``,
    ``<id>/rejected``) of the template, and the chunks :meth:`stream` yields
    are of rows; or ``prompt_field``, ``completion_field`` and ``label_field``
    (unpaired records, one row each, ``<id>/desirable`` or ``<id>/undesirable``);
    with ``conversational``, these preference fields hold lists of messages
    (and ``prompt_field`` may be left out for pairs: an implicit prompt),
    rendered with the chat template as TRL renders them, by the workers; or
    ``messages_field`` through the chat template; or
    ``length_field``, a column of token counts read as they are
    (``tokenizer`` may then be None: its hash is ``unknown``).
    ``sharded=True`` names the rows of a single input as those of one shard
    of a multi-file dataset (records/ids.py). ``check_outputs(paths)`` is called with the dataset's paths before the
    tokenizer loads. :meth:`stream` hands each chunk to a function run by
    the workers while the next chunk is read; :attr:`chunk_encoder` is what
    that function needs to encode (it pickles, for worker processes);
    :meth:`finish` then refuses
    repeated ids and returns the dataset fingerprint. Given ``skipped`` (a
    :class:`~umlos_cuda.batching.records.chunk.SkippedLines`), bad JSONL
    lines are skipped and counted there instead of refused.
    """

    def __init__(self, dataset: Any, tokenizer: Any, *, text_field: str | None = None,
                 prompt_field: str | None = None, response_field: str | None = None,
                 id_field: str = DEFAULT_ID_FIELD, eos_token: str | None = None,
                 chosen_field: str | None = None, rejected_field: str | None = None,
                 check_outputs: Callable[[tuple[str, ...]], object] | None = None,
                 skipped: SkippedLines | None = None,
                 messages_field: str | None = None, chat_template: str | os.PathLike[str] | None = None,
                 length_field: str | None = None, format: str | None = None,
                 sharded: bool | None = None, completion_field: str | None = None, label_field: str | None = None,
                 conversational: bool = False) -> None:
        self.length_field = length_field
        preference = {"chosen_field": chosen_field, "rejected_field": rejected_field,
                      "completion_field": completion_field, "label_field": label_field}
        self.preference: PreferenceKind | None = None
        if length_field is None:
            self.preference = preference_kind(text_field=text_field, prompt_field=prompt_field,
                                              response_field=response_field, messages_field=messages_field,
                                              conversational=conversational, **preference)
        self.pairs = self.preference is not None and self.preference.paired
        self.record_fields = record_fields(text_field, prompt_field, response_field, length_field,
                                           messages_field=messages_field, conversational=conversational,
                                           **preference)  # refuses any other field beside a length field
        if length_field is not None:
            self.fields: tuple[str, ...] = (length_field,)
            self.mode, self.appended = "text", 0
        elif self.preference is not None:  # read as record_fields says; pair_rows and the others make the rows
            self.fields = tuple(field.name for field in self.record_fields)
            self.mode, self.appended = ("completion", 0) if self.preference.conversational else \
                ("template", sft_length(0))
        else:
            self.fields, self.mode, self.appended = _mode(text_field, prompt_field, response_field, messages_field)
        if chat_template is not None and messages_field is None and not conversational:
            raise UmlosError(errors.LENGTHS_INVALID, "a chat template renders a messages field or conversational "
                             "preference records; give messages_field (--messages-field) or conversational=True "
                             "(--conversational) with it", operator=errors.BATCHING_OPERATOR)
        self.records = Records(dataset, self.record_fields, id_field=id_field, format=format, skipped=skipped,
                               sharded=sharded)
        self.dataset = self.records.name
        if check_outputs is not None:  # checked before the tokenizer loads: a wrong path fails at once
            check_outputs(self.records.paths)
        self.id_field = id_field
        self.skipped = skipped
        self.total_bytes = self.records.total_bytes
        self._id_hashes: list[np.ndarray] = []
        self.render: RecordRender | None = None  # chat records, or conversational preference records
        self.budget: Budget | None = None
        self.encoder: Any = None  # a tokenizers.Tokenizer; None for a --length-field build without one
        self.loaded: Any = None
        self.eos_id: int | None = None
        if length_field is not None and tokenizer is None:
            self.tokenizer_hash = UNKNOWN_TOKENIZER
            self.tokenizer_parts: dict[str, str] | None = None
            self.chunk_encoder = ChunkEncoder(None, self.mode, pairs=self.pairs, dataset=self.dataset)
            return
        self.loaded = load_tokenizer(tokenizer)
        self.eos_id = self.loaded.eos_token_id(eos_token) if self.appended else None  # the template appends it
        # Chat records and conversational preference records are rendered by the workers (a bad one is a bad
        # line, checked later by the reader) and encoded as apply_chat_template encodes them: no special tokens
        # added, no padding, no truncation.
        first_only = skipped is None
        if messages_field is not None:
            template = chat_template_of(self.loaded, chat_template)
            self.render = ChatRender(template, first_failure_only=first_only, field=messages_field)
        elif self.preference is not None and self.preference.conversational:
            template = chat_template_of(self.loaded, chat_template)
            self.render = PreferenceRender(template, self.preference, self.fields, first_failure_only=first_only)
        if self.render is not None:
            self.budget = render_budget()
            if chat_template is not None:  # the fingerprint names the template used
                self.loaded = replace(self.loaded, chat_template=self.render.template.source)
            self.records.checked_later = tuple(field.name for field in self.record_fields if field.kind == "json")
            self.records.screen = self._screen
        self.tokenizer_hash = tokenizer_fingerprint(self.loaded)
        self.tokenizer_parts = tokenizer_parts(self.loaded)
        self.encoder = self.loaded.tokenizer if self.render is None else chat_encoder(self.loaded)
        if self.encoder.padding is not None:  # padding would make a length depend on its chunk
            from tokenizers import Tokenizer

            self.encoder = Tokenizer.from_str(self.encoder.to_str())
            self.encoder.no_padding()
        self.chunk_encoder = ChunkEncoder(self.encoder, self.mode, self.appended, self.eos_id, self.pairs, self.dataset)

    @property
    def is_template(self) -> bool:
        """True for prompt/response records (the instruction template)."""
        return bool(self.appended)

    def texts(self, chunk: RecordChunk) -> list[str]:
        """The text each record of ``chunk`` is encoded from."""
        return self.chunk_encoder.texts(chunk)

    def prompts(self, chunk: RecordChunk) -> list[str]:
        """The prompt part of each record's template text (the loss-masked tokens)."""
        return self.chunk_encoder.prompts(chunk)

    def encode(self, texts: list[str], chunk: RecordChunk, *, offsets: bool = False) -> list:
        """:meth:`ChunkEncoder.encode <umlos_cuda.batching.lengths.encoder.ChunkEncoder.encode>`."""
        return self.chunk_encoder.encode(texts, chunk, offsets=offsets)

    def lengths(self, chunk: RecordChunk) -> list[int] | np.ndarray:
        """The token count of each record of ``chunk`` (what the length cache holds)."""
        if self.length_field is not None:
            return chunk.values[0]
        return self.chunk_encoder.lengths(chunk)

    def work(self) -> Callable[[RecordChunk], list[int] | np.ndarray]:
        """What :func:`build_lengths` runs on each chunk: a picklable function (none of this object's
        reading state travels to a worker process)."""
        return self.lengths if self.length_field is not None else self.chunk_encoder.lengths

    def stream(self, work: Callable[[RecordChunk], T], chunk_size: int = DEFAULT_CHUNK,
               workers: int = 1) -> Generator[tuple[RecordChunk, T], None, None]:
        """Yield ``(chunk, work(chunk))`` in dataset order; ``work`` runs on
        ``workers`` workers (umlos_cuda/batching/lengths/workers.py: a thread
        for 1, processes for more, to which ``work`` must pickle) while this
        thread reads and checks the next chunks. A ``--length-field`` build
        encodes nothing and takes no worker. Chat and conversational preference records are
        rendered first, in the workers, under the render budget (module docstring), in chunks of at most
        :data:`RENDER_CHUNK` records."""
        if self.render is not None:
            return self._rendered(work, chunk_size, workers)
        return in_order(work, self._chunks(chunk_size), 1 if self.length_field is not None else workers,
                        self.chunk_encoder.lines)

    def _chunks(self, chunk_size: int) -> Iterator[RecordChunk]:
        """The chunks in order, their ids' hashes kept (to refuse a repeated id), preference records made rows."""
        for chunk in self.records.chunks(chunk_size):
            self._keep_ids(chunk)
            if self.preference is None:
                yield chunk
            else:  # string preference records: rows of the instruction template
                yield pair_rows(chunk) if self.pairs else unpaired_rows(chunk)

    def _keep_ids(self, chunk: RecordChunk) -> None:
        if not isinstance(chunk.sample_ids, RowIds):  # the records' ids (row numbers never repeat)
            self._id_hashes.append(np.fromiter(map(hash, chunk.sample_ids), dtype=np.int64,
                                               count=len(chunk.sample_ids)))

    def _rendered(self, work: Callable[[RecordChunk], T], chunk_size: int, workers: int
                  ) -> Generator[tuple[RecordChunk, T], None, None]:
        """:meth:`stream` of chat and conversational preference records: each chunk rendered then encoded by a
        budgeted worker, its records that did not render handed back to the reader, which raises or skips them
        in line order and names the rows of the others."""
        assert self.render is not None
        records_lines = replace(self.chunk_encoder, pairs=False).lines  # the chunks sent are of records
        results = in_order(ChatWork(self.render, work), self.records.chunks(min(chunk_size, RENDER_CHUNK)), workers,
                           records_lines, self.budget)
        with closing(results):
            for chunk, (result, refused) in results:
                kept = self.records.accept(chunk, refused)
                self._keep_ids(kept)
                yield self.render.rows(kept), result
        self.records.accepted_all()

    def _screen(self, chunks: Iterator[RecordChunk]) -> Iterator[tuple[RecordChunk, list]]:
        """Which records of ``chunks`` render (each chunk and its failures, in order), in one budgeted worker:
        what the reader asks of a shard whose rows' ids hang on the records it keeps."""
        assert self.render is not None
        work = ChatWork(replace(self.render, first_failure_only=False))
        records_lines = replace(self.chunk_encoder, pairs=False).lines
        with closing(in_order(work, chunks, 1, records_lines, self.budget)) as results:
            for chunk, (_none, refused) in results:
                yield chunk, refused

    def finish(self, ids_are_line_numbers: bool) -> str:
        """After the stream: refuse repeated ids (DATASET_RECORD_INVALID naming
        both records) and return the dataset fingerprint."""
        if not ids_are_line_numbers and self._id_hashes:
            self.records.skipped = None if self.skipped is None else SkippedLines()
            try:
                self.records.refuse_repeated_ids(np.concatenate(self._id_hashes))
            finally:
                self.records.skipped = self.skipped
        return self.records.fingerprint(self.tokenizer_hash)


def build_lengths(dataset: Any, tokenizer: Any, output: str | os.PathLike[str], *,
                  text_field: str | None = None, prompt_field: str | None = None,
                  response_field: str | None = None, id_field: str = DEFAULT_ID_FIELD,
                  eos_token: str | None = None, force: bool = False, chunk_size: int = DEFAULT_CHUNK,
                  progress: Callable[[int, int], None] | None = None,
                  skipped: SkippedLines | None = None, chosen_field: str | None = None,
                  rejected_field: str | None = None, messages_field: str | None = None,
                  chat_template: str | os.PathLike[str] | None = None, length_field: str | None = None,
                  format: str | None = None, workers: int = 1, completion_field: str | None = None,
                  label_field: str | None = None, conversational: bool = False) -> LengthCache:
    """Count every record's tokens and write the length cache at ``output``.

    Give ``text_field`` (default ``"text"``) or both ``prompt_field`` and
    ``response_field``, or ``prompt_field``, ``chosen_field`` and
    ``rejected_field`` (two rows a record, chosen then rejected), or
    ``prompt_field``, ``completion_field`` and ``label_field`` (unpaired
    records, one row each), these preference fields as lists of messages
    with ``conversational`` (then ``prompt_field`` may be left out of pairs),
    or
    ``messages_field`` (chat records rendered with the tokenizer's chat
    template, or ``chat_template``, a Jinja file: umlos_cuda/batching/chat/),
    or ``length_field`` (an integer column of token counts, read as is;
    ``tokenizer`` may then be None). ``dataset`` is anything
    :class:`DatasetEncoding` opens. ``progress(bytes_read, bytes_total)`` is
    called after each chunk. Output paths are checked before any work:
    ``force`` replaces a length cache and nothing else, and never an input
    (OUTPUT_IS_INPUT). Given ``skipped`` (a
    :class:`~umlos_cuda.batching.records.chunk.SkippedLines`), bad lines are
    skipped and counted there instead of refused. ``workers`` encode the
    chunks (1: a thread beside this one; N: N processes, umlos_cuda/batching/lengths/workers.py);
    the cache is the same, byte for byte, for every number of workers and
    every chunk size.
    """
    check_workers(workers)

    def inputs(paths: tuple[str, ...]) -> tuple[str | os.PathLike[str], ...]:
        return input_paths(*paths, tokenizer, chat_template)

    source = DatasetEncoding(dataset, tokenizer, text_field=text_field, prompt_field=prompt_field,
                             response_field=response_field, id_field=id_field, eos_token=eos_token,
                             check_outputs=lambda paths: check_length_cache_output(output, force, inputs(paths)),
                             skipped=skipped, chosen_field=chosen_field, rejected_field=rejected_field,
                             messages_field=messages_field, chat_template=chat_template, length_field=length_field,
                             format=format, completion_field=completion_field, label_field=label_field,
                             conversational=conversational)
    with LengthCacheWriter(output, source.tokenizer_hash, force=force, inputs=inputs(source.records.paths)) as writer:
        with closing(source.stream(source.work(), chunk_size, workers)) as stream:
            for chunk, lengths in stream:
                writer.add(written_ids(chunk), lengths)
                if progress is not None:
                    progress(chunk.bytes_read, source.total_bytes)
        writer.dataset_hash = source.finish(writer.ids_are_line_numbers)
    return writer.cache()


def written_ids(chunk: RecordChunk):
    """The ids to give a length cache writer: None for row numbers (a single columnar input's rows
    without ids are numbered from 0 across its chunks, as the writer numbers rows given None)."""
    return None if isinstance(chunk.sample_ids, RowIds) else chunk.sample_ids


def input_paths(*given: Any) -> tuple[str | os.PathLike[str], ...]:
    """The arguments that are paths (a tokenizer may be an object): what an output must not be."""
    return tuple(path for path in given if isinstance(path, (str, os.PathLike)))


def _mode(text_field, prompt_field, response_field, messages_field=None) -> tuple[tuple[str, ...], str, int]:
    """The fields to read, how they become the encoded text (a mode of
    :class:`~umlos_cuda.batching.lengths.encoder.ChunkEncoder`), and the tokens appended after it."""
    if messages_field is not None:  # its values are rendered by the workers (ChatWork), then encoded as text
        if text_field is not None or prompt_field is not None or response_field is not None:
            raise UmlosError(errors.LENGTHS_INVALID, "a messages field is counted alone; got also "
                             f"text_field={text_field!r}, prompt_field={prompt_field!r}, "
                             f"response_field={response_field!r}", operator=errors.BATCHING_OPERATOR)
        return (messages_field,), "chat", 0
    if prompt_field is None and response_field is None:
        field = DEFAULT_TEXT_FIELD if text_field is None else text_field
        return (field,), "text", 0
    if text_field is not None or prompt_field is None or response_field is None:
        raise UmlosError(errors.LENGTHS_INVALID, "count either one text field, or a prompt field and a response "
                         f"field together; got text_field={text_field!r}, prompt_field={prompt_field!r}, "
                         f"response_field={response_field!r}", operator=errors.BATCHING_OPERATOR)
    return (prompt_field, response_field), "template", sft_length(0)
