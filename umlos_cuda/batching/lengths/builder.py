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
``data megatron``). What comes out: ``lengths.jsonl`` and its sidecar
(umlos_cuda/batching/lengths/cache.py), in dataset order, and the
:class:`~umlos_cuda.batching.lengths.cache.LengthCache`.

The dataset is streamed in chunks (:class:`DatasetEncoding`, which the token
store of umlos_cuda/batching/tokens/store.py reads through as well): while the
tokenizer encodes one chunk on every core (``encode_batch_fast`` runs in
Rust, outside the GIL), this thread reads the next, so memory holds two
chunks plus 12 bytes a sample (the length, and a 64-bit hash of the id to
find a repeated id at the end; a repeat raises DATASET_RECORD_INVALID naming
both records, and nothing is written). The dataset's fingerprint
(records/fingerprint.py) is computed from the values read.
"""

from __future__ import annotations

import os
from dataclasses import replace
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from ... import errors
from ...errors import UmlosError
from ..records.chunk import RecordChunk, RowIds, SkippedLines
from ..records.jsonl import DEFAULT_ID_FIELD
from ..records.source import Records
from .fields import DEFAULT_TEXT_FIELD, record_fields
from .fingerprints import UNKNOWN_TOKENIZER, tokenizer_fingerprint
from .cache import LengthCache, LengthCacheWriter, check_length_cache_output
from ..templates import sft_length, sft_prompt, sft_text
from .tokenizer import load_tokenizer
from .pairs import PAIR_ROWS, pair_rows
from ..chat.encode import chat_encoder
from ..chat.records import ChatRecords

DEFAULT_CHUNK = 4096
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
    are of rows; or ``messages_field`` through the chat template; or
    ``length_field``, a column of token counts read as they are
    (``tokenizer`` may then be None: its hash is ``unknown``).
    ``sharded=True`` names the rows of a single input as those of one shard
    of a multi-file dataset (records/ids.py). ``check_outputs(paths)`` is called with the dataset's paths before the
    tokenizer loads. :meth:`stream` hands each chunk to a function run in a
    worker thread while the next chunk is read; :meth:`finish` then refuses
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
                 sharded: bool | None = None) -> None:
        self.pairs = chosen_field is not None or rejected_field is not None
        self.length_field = length_field
        if length_field is not None:  # record_fields refuses any other field beside it
            self.record_fields = record_fields(text_field, prompt_field, response_field, length_field,
                                               chosen_field=chosen_field, rejected_field=rejected_field,
                                               messages_field=messages_field)
            self.fields: tuple[str, ...] = (length_field,)
            self.to_text, self.appended = _no_text, 0
        elif self.pairs:
            if messages_field is not None:
                raise UmlosError(errors.LENGTHS_INVALID, "a messages field is counted alone; got also "
                                 f"chosen_field={chosen_field!r}, rejected_field={rejected_field!r}",
                                 operator=errors.BATCHING_OPERATOR)
            self.fields, self.to_text, self.appended = _pair_mode(text_field, prompt_field, response_field,
                                                                  chosen_field, rejected_field)
        else:
            self.fields, self.to_text, self.appended = _mode(text_field, prompt_field, response_field,
                                                             messages_field)
        if chat_template is not None and messages_field is None:
            raise UmlosError(errors.LENGTHS_INVALID, "a chat template renders a messages field; give messages_field "
                             "(--messages-field) with it", operator=errors.BATCHING_OPERATOR)
        if length_field is None:
            self.record_fields = record_fields(text_field, prompt_field, response_field, chosen_field=chosen_field,
                                               rejected_field=rejected_field, messages_field=messages_field)
        self.records = Records(dataset, self.record_fields, id_field=id_field, format=format, skipped=skipped,
                               sharded=sharded)
        self.dataset = self.records.name
        if check_outputs is not None:  # checked before the tokenizer loads: a wrong path fails at once
            check_outputs(self.records.paths)
        self.id_field = id_field
        self.skipped = skipped
        self.total_bytes = self.records.total_bytes
        self._id_hashes: list[np.ndarray] = []
        self.chat: ChatRecords | None = None
        self.encoder: Any = None  # a tokenizers.Tokenizer; None for a --length-field build without one
        self.loaded: Any = None
        self.eos_id: int | None = None
        if length_field is not None and tokenizer is None:
            self.tokenizer_hash = UNKNOWN_TOKENIZER
            return
        self.loaded = load_tokenizer(tokenizer)
        self.eos_id = self.loaded.eos_token_id(eos_token) if self.appended else None  # the template appends it
        # A chat record renders its messages as it is read (a bad one is a bad line) and is encoded as
        # apply_chat_template encodes it: no special tokens added, no padding, no truncation.
        self.chat = None if messages_field is None else ChatRecords(self.loaded, chat_template)
        if self.chat is not None and chat_template is not None:  # the fingerprint names the template used
            self.loaded = replace(self.loaded, chat_template=self.chat.template.source)
        self.tokenizer_hash = tokenizer_fingerprint(self.loaded)
        if self.chat is not None and messages_field is not None:
            self.records.convert = {messages_field: self.chat}
        self.encoder = self.loaded.tokenizer if self.chat is None else chat_encoder(self.loaded)
        if self.encoder.padding is not None:  # padding would make a length depend on its chunk
            from tokenizers import Tokenizer

            self.encoder = Tokenizer.from_str(self.encoder.to_str())
            self.encoder.no_padding()

    @property
    def is_template(self) -> bool:
        """True for prompt/response records (the instruction template)."""
        return bool(self.appended)

    def texts(self, chunk: RecordChunk) -> list[str]:
        """The text each record of ``chunk`` is encoded from."""
        return self.to_text(chunk.values)

    def prompts(self, chunk: RecordChunk) -> list[str]:
        """The prompt part of each record's template text (the loss-masked tokens)."""
        return list(map(sft_prompt, chunk.values[0]))

    def encode(self, texts: list[str], chunk: RecordChunk, *, offsets: bool = False) -> list:
        """``encode_batch_fast`` with the special tokens (none for chat records,
        whose template writes them; ``encode_batch`` when the character
        ``offsets`` are wanted); a tokenizer that fails (an error, or a Rust
        panic) raises TOKENIZER_INVALID naming the chunk's lines."""
        if self.encoder is None:
            raise UmlosError(errors.TOKENIZER_INVALID, "encoding text needs a tokenizer (--tokenizer); only a "
                             "--length-field build goes without one", operator=errors.BATCHING_OPERATOR)
        try:
            encode = self.encoder.encode_batch if offsets else self.encoder.encode_batch_fast
            return encode(texts, add_special_tokens=self.chat is None)
        except BaseException as exc:  # a Rust panic arrives as pyo3's PanicException, a BaseException
            if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
                raise
            last = chunk.first_line + len(chunk.sample_ids) // (PAIR_ROWS if self.pairs else 1)
            raise UmlosError(errors.TOKENIZER_INVALID, f"the tokenizer failed on lines {chunk.first_line + 1}-{last} "
                             f"of {chunk.shard or self.dataset}: {str(exc).strip() or type(exc).__name__}",
                             operator=errors.BATCHING_OPERATOR) from exc

    def lengths(self, chunk: RecordChunk) -> list[int] | np.ndarray:
        """The token count of each record of ``chunk`` (what the length cache holds)."""
        if self.length_field is not None:
            return chunk.values[0]
        return [len(encoding) + self.appended for encoding in self.encode(self.texts(chunk), chunk)]

    def stream(self, work: Callable[[RecordChunk], T],
               chunk_size: int = DEFAULT_CHUNK) -> Iterator[tuple[RecordChunk, T]]:
        """Yield ``(chunk, work(chunk))`` in dataset order; ``work`` runs in a
        worker thread while this one reads and checks the next chunk."""
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="umlos-encode") as pool:
            pending = None
            for chunk in self.records.chunks(chunk_size):
                if not isinstance(chunk.sample_ids, RowIds):  # the records' ids (row numbers never repeat)
                    self._id_hashes.append(np.fromiter(map(hash, chunk.sample_ids), dtype=np.int64,
                                                       count=len(chunk.sample_ids)))
                if self.pairs:
                    chunk = pair_rows(chunk)
                future = pool.submit(work, chunk)
                if pending is not None:
                    yield pending[0], pending[1].result()
                pending = (chunk, future)
            assert pending is not None  # the reader raises DATASET_EMPTY rather than yield no chunk
            yield pending[0], pending[1].result()

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
                  format: str | None = None) -> LengthCache:
    """Count every record's tokens and write the length cache at ``output``.

    Give ``text_field`` (default ``"text"``) or both ``prompt_field`` and
    ``response_field``, or ``prompt_field``, ``chosen_field`` and
    ``rejected_field`` (two rows a record, chosen then rejected), or
    ``messages_field`` (chat records rendered with the tokenizer's chat
    template, or ``chat_template``, a Jinja file: umlos_cuda/batching/chat/),
    or ``length_field`` (an integer column of token counts, read as is;
    ``tokenizer`` may then be None). ``dataset`` is anything
    :class:`DatasetEncoding` opens. ``progress(bytes_read, bytes_total)`` is
    called after each chunk. Output paths are checked before any work:
    ``force`` replaces a length cache and nothing else, and never an input
    (OUTPUT_IS_INPUT). Given ``skipped`` (a
    :class:`~umlos_cuda.batching.records.chunk.SkippedLines`), bad lines are
    skipped and counted there instead of refused.
    """
    def inputs(paths: tuple[str, ...]) -> tuple[str | os.PathLike[str], ...]:
        return input_paths(*paths, tokenizer, chat_template)

    source = DatasetEncoding(dataset, tokenizer, text_field=text_field, prompt_field=prompt_field,
                             response_field=response_field, id_field=id_field, eos_token=eos_token,
                             check_outputs=lambda paths: check_length_cache_output(output, force, inputs(paths)),
                             skipped=skipped, chosen_field=chosen_field, rejected_field=rejected_field,
                             messages_field=messages_field, chat_template=chat_template, length_field=length_field,
                             format=format)
    with LengthCacheWriter(output, source.tokenizer_hash, force=force, inputs=inputs(source.records.paths)) as writer:
        for chunk, lengths in source.stream(source.lengths, chunk_size):
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


def _no_text(values: list) -> list[str]:
    raise AssertionError("a --length-field build encodes no text")


def _mode(text_field, prompt_field, response_field, messages_field=None) -> tuple[tuple[str, ...], Callable, int]:
    """The fields to read, how they become the encoded text, and the tokens
    appended after it."""
    if messages_field is not None:  # its values are ChatText, rendered as read (the converter of Records)
        if text_field is not None or prompt_field is not None or response_field is not None:
            raise UmlosError(errors.LENGTHS_INVALID, "a messages field is counted alone; got also "
                             f"text_field={text_field!r}, prompt_field={prompt_field!r}, "
                             f"response_field={response_field!r}", operator=errors.BATCHING_OPERATOR)
        return (messages_field,), lambda values: [chat.text for chat in values[0]], 0
    if prompt_field is None and response_field is None:
        field = DEFAULT_TEXT_FIELD if text_field is None else text_field
        return (field,), lambda values: values[0], 0
    if text_field is not None or prompt_field is None or response_field is None:
        raise UmlosError(errors.LENGTHS_INVALID, "count either one text field, or a prompt field and a response "
                         f"field together; got text_field={text_field!r}, prompt_field={prompt_field!r}, "
                         f"response_field={response_field!r}", operator=errors.BATCHING_OPERATOR)
    return (prompt_field, response_field), lambda values: list(map(sft_text, *values)), sft_length(0)


def _pair_mode(text_field, prompt_field, response_field, chosen_field, rejected_field
               ) -> tuple[tuple[str, ...], Callable, int]:
    """:func:`_mode` for preference records: the three fields read; after :func:`~.pairs.pair_rows`
    each row is a prompt/response row of the template."""
    if text_field is not None or response_field is not None or None in (prompt_field, chosen_field, rejected_field):
        raise UmlosError(errors.LENGTHS_INVALID, "count preference records from a prompt, a chosen and a rejected "
                         "field together, without a text or response field; got "
                         f"text_field={text_field!r}, prompt_field={prompt_field!r}, "
                         f"response_field={response_field!r}, chosen_field={chosen_field!r}, "
                         f"rejected_field={rejected_field!r}",
                         operator=errors.BATCHING_OPERATOR)
    return (prompt_field, chosen_field, rejected_field), lambda values: list(map(sft_text, *values)), sft_length(0)
