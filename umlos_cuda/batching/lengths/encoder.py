"""What encoding a chunk of records needs, and nothing of the reading: the part a worker process receives.

What goes in: a ``tokenizers.Tokenizer`` (padding already off), how a
chunk's values become the encoded text (``mode``: ``"text"``, one string
field; ``"template"``, prompt/response rows put through the instruction
template, preference pairs and unpaired records of strings included once
split into rows; ``"chat"``, records the worker rendered with the chat
template just before, umlos_cuda/batching/chat/chunks.py; ``"completion"``,
rows of conversational preference records the worker rendered just before as
TRL renders them, umlos_cuda/batching/chat/preference.py: the row's text, its
prompt's text, its record), the tokens appended
after the text (the template's end-of-sequence token) and the dataset's name
for messages. What comes out: each record's token count (:meth:`lengths`),
or the encodings the token store writer turns into ids and masks
(umlos_cuda/batching/tokens/writer.py ``encode_chunk``).

Why a class of its own: :class:`~umlos_cuda.batching.lengths.builder.DatasetEncoding`
also holds the open dataset and its fingerprint; this object pickles (the
tokenizer pickles as its JSON), so ``--workers`` sends it once to each
worker process (umlos_cuda/batching/lengths/workers.py), and the same
methods run there as in this process: the bytes written do not depend on
where a chunk was encoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ... import errors
from ...errors import UmlosError
from ..chat.byte_offsets import ByteOffsets
from ..records.chunk import RecordChunk
from ..templates import sft_prompt, sft_text
from .pairs import PAIR_ROWS

#: How a chunk's values become text: one string field, the instruction template, rendered chat records,
#: rendered prompts and completions.
MODES = ("text", "template", "chat", "completion")


@dataclass(frozen=True)
class ChunkEncoder:
    """Encode chunks of records: ``encoder`` (a ``tokenizers.Tokenizer``, None for a
    ``--length-field`` build), ``mode`` (one of :data:`MODES`), ``appended`` (tokens
    after the text), ``eos_id`` (the token appended), ``pairs`` (rows are
    preference pairs split in two, for the lines a message names), ``dataset``
    (its name in messages)."""

    encoder: Any
    mode: str
    appended: int = 0
    eos_id: int | None = None
    pairs: bool = False
    dataset: str = ""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {', '.join(MODES)}")

    @property
    def is_template(self) -> bool:
        """True for prompt/response rows (the instruction template)."""
        return self.mode == "template"

    @property
    def is_chat(self) -> bool:
        """True for chat records (encoded without special tokens, masks from the assistant spans)."""
        return self.mode == "chat"

    @property
    def is_completion(self) -> bool:
        """True for rendered prompts and completions (encoded without special tokens, masks from the
        prompt's tokens: umlos_cuda/batching/chat/completions.py)."""
        return self.mode == "completion"

    @cached_property
    def byte_offsets(self) -> ByteOffsets | None:
        """How a chat record's token offsets follow from its ids (umlos_cuda/batching/chat/byte_offsets.py), so
        that it is encoded without the tokenizer's own; None for other records and where they do not. Found
        once, where the chunks are encoded (a worker, which receives this object before it is found)."""
        return ByteOffsets.of(self.encoder) if self.is_chat and self.encoder is not None else None

    def texts(self, chunk: RecordChunk) -> list[str]:
        """The text each record of ``chunk`` is encoded from."""
        if self.mode == "completion":  # the rows' texts, rendered by the worker first (chat/preference.py)
            return chunk.values[0]
        if self.mode == "chat":  # its values are ChatText, rendered by the worker first (chat/chunks.py ChatWork)
            return [chat.text for chat in chunk.values[0]]
        if self.mode == "template":
            return list(map(sft_text, *chunk.values))
        return chunk.values[0]

    def prompts(self, chunk: RecordChunk) -> list[str]:
        """The prompt part of each record's template text (the loss-masked tokens)."""
        return list(map(sft_prompt, chunk.values[0]))

    def encode(self, texts: list[str], chunk: RecordChunk, *, offsets: bool = False) -> list:
        """``encode_batch_fast`` with the special tokens (none for rendered chat
        records and completions, whose template writes them; ``encode_batch`` when the character
        ``offsets`` are wanted); a tokenizer that fails (an error, or a Rust
        panic) raises TOKENIZER_INVALID naming the chunk's lines."""
        if self.encoder is None:
            raise UmlosError(errors.TOKENIZER_INVALID, "encoding text needs a tokenizer (--tokenizer); only a "
                             "--length-field build goes without one", operator=errors.BATCHING_OPERATOR)
        try:
            encode = self.encoder.encode_batch if offsets else self.encoder.encode_batch_fast
            return encode(texts, add_special_tokens=not (self.is_chat or self.is_completion))
        except BaseException as exc:  # a Rust panic arrives as pyo3's PanicException, a BaseException
            if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
                raise
            raise UmlosError(errors.TOKENIZER_INVALID, f"the tokenizer failed on {self.lines(chunk)}: "
                             f"{str(exc).strip() or type(exc).__name__}", operator=errors.BATCHING_OPERATOR) from exc

    def lines(self, chunk: RecordChunk) -> str:
        """``lines A-B of DATASET``: the records of ``chunk`` as a message names them (1-based)."""
        last = chunk.first_line + len(chunk.sample_ids) // (PAIR_ROWS if self.pairs else 1)
        return f"lines {chunk.first_line + 1}-{last} of {chunk.shard or self.dataset}"

    def lengths(self, chunk: RecordChunk) -> list[int]:
        """The token count of each record of ``chunk`` (what the length cache holds)."""
        return [len(encoding) + self.appended for encoding in self.encode(self.texts(chunk), chunk)]
