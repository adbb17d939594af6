"""Write a token store from a dataset (``umlos-cuda data tokenize``).

What goes in: the dataset (any format umlos_cuda/batching/records/ reads:
JSONL plain or compressed, Parquet, Arrow IPC, ``datasets``, shards), a
tokenizer and what to encode, exactly as for
the length cache (one text field, a prompt and a response field through
the instruction template, or a messages field through the chat template). What comes out: the store folder of
umlos_cuda/batching/tokens/store.py, its length cache included, in dataset order.

The dataset is read through the length builder's
:class:`~umlos_cuda.batching.lengths.builder.DatasetEncoding` (same chunks,
same workers, same checks and fingerprints), so the store's lengths are
what ``data lengths build`` counts; a chunk's tokens and masks are
:func:`encode_chunk` of its records alone, so the store is the same, byte
for byte, whatever the number of workers (``--workers``) and the chunk size. Loss masks: 1 on every token of a text
record; for a prompt/response record, the rule of ``sft_sample``: 0 over the
first ``len(encode(prompt part))`` tokens, 1 over the rest; a preference
record (prompt, chosen, rejected) is two such rows, chosen then rejected, and an
unpaired one (prompt, completion, label) one such row; for a conversational
preference record, 1 from where its tokens and its prompt's first differ
(umlos_cuda/batching/chat/completions.py, TRL's rule); for
a chat record, 1 on the tokens of the assistant's turns
(umlos_cuda/batching/chat/turns.py says which characters,
umlos_cuda/batching/chat/masks.py which tokens). Tokens and masks
stream to disk chunk by chunk, in dataset order; memory holds O(workers)
chunks plus 20 bytes a sample (offset, length, id hash).

Written through the output layer (umlos_cuda/files/writer.py): everything,
with the artifact marker (``"artifact": "token store"``), is written and
fsynced in a hidden sibling folder, then renamed to the target in one step;
``force`` replaces a token store and nothing else, never the dataset or the
tokenizer's folder.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from contextlib import closing
from functools import partial
from itertools import chain
from typing import Any, Literal, cast

import numpy as np

from ... import errors
from ...errors import UmlosError
from ..records.chunk import RecordChunk, SkippedLines
from ..records.jsonl import DEFAULT_ID_FIELD
from ..records.source import dataset_paths
from ...files.artifacts import json_field
from ...files.writer import ArtifactKind, Folder, check_output_folder, output_folder, remove_stale_temps
from ..lengths.builder import DEFAULT_CHUNK, DatasetEncoding, input_paths, written_ids
from ..lengths.cache import LengthCacheWriter
from ..lengths.fingerprints import PARTS_KEY
from ..lengths.encoder import ChunkEncoder
from ..lengths.workers import check_workers
from ...hashing import sha256_array
from .store import LENGTHS_FILE, STORE_FORMAT, TokenStore
from ..chat.completions import completion_masks, completion_starts, shared_prompts
from ..chat.masks import chunk_masks, stacked_masks
from ..chat.turns import ChatText

#: Bytes reserved for a streamed .npy header (the shape is known only at the end).
NPY_HEADER_BYTES = 128
#: Vocabularies up to this size store token ids as uint16.
UINT16_VOCAB = 1 << 16
#: The artifact kind of a token store; one written before markers is known by its meta.json's format.
STORE = ArtifactKind("token store", lambda folder: json_field(folder, "meta.json", "format") == STORE_FORMAT)


def tokenize_dataset(dataset: Any, tokenizer: Any, output: str | os.PathLike[str], *,
                     text_field: str | None = None, prompt_field: str | None = None,
                     response_field: str | None = None, id_field: str = DEFAULT_ID_FIELD,
                     eos_token: str | None = None, force: bool = False, chunk_size: int = DEFAULT_CHUNK,
                     progress: Callable[[int, int], None] | None = None,
                     skipped: SkippedLines | None = None, chosen_field: str | None = None,
                     rejected_field: str | None = None, messages_field: str | None = None,
                     chat_template: str | os.PathLike[str] | None = None, format: str | None = None,
                     sharded: bool | None = None, workers: int = 1, completion_field: str | None = None,
                     label_field: str | None = None, conversational: bool = False) -> TokenStore:
    """Encode every record and write the token store folder ``output``.

    ``progress(bytes_read, bytes_total)`` is called after each chunk. The
    output is checked before any work: an existing folder raises
    OUTPUT_EXISTS unless ``force`` (which replaces only a token store), and
    the output is never the dataset or the tokenizer's folder (OUTPUT_IS_INPUT).
    Given ``skipped`` (a :class:`~umlos_cuda.batching.records.chunk.SkippedLines`),
    bad lines are skipped and counted there instead of refused. ``sharded=True``
    gives the rows of a single file the ids of a shard of a multi-file
    dataset (tokens/partition.py tokenizes one input file this way). ``workers``
    encode the chunks (1: a thread beside this one; N: N processes,
    umlos_cuda/batching/lengths/workers.py); the store is the same, byte for
    byte, for every number of workers and every chunk size.
    """
    check_workers(workers)
    inputs = input_paths(*dataset_paths(dataset, format), tokenizer, chat_template)
    target = check_output_folder(output, STORE, force=force, inputs=inputs, operator=errors.BATCHING_OPERATOR)
    source = DatasetEncoding(dataset, tokenizer, text_field=text_field, prompt_field=prompt_field,
                             response_field=response_field, id_field=id_field, eos_token=eos_token,
                             skipped=skipped, chosen_field=chosen_field, rejected_field=rejected_field,
                             messages_field=messages_field, chat_template=chat_template, format=format,
                             sharded=sharded, completion_field=completion_field, label_field=label_field,
                             conversational=conversational)
    vocab = source.encoder.get_vocab_size(with_added_tokens=True)
    token_dtype = np.dtype("<u2" if vocab <= UINT16_VOCAB else "<u4")
    remove_stale_temps(target, STORE, errors.BATCHING_OPERATOR)  # what a run killed while writing it left
    with output_folder(target, STORE, force=force, inputs=inputs, operator=errors.BATCHING_OPERATOR) as folder:
        _write_store(source, folder, token_dtype, chunk_size, progress, vocab, workers)
    return TokenStore.open(target)


def _write_store(source: DatasetEncoding, root: Folder, token_dtype: np.dtype, chunk_size: int, progress,
                 vocab_size: int, workers: int = 1) -> None:
    encode = partial(encode_chunk, source.chunk_encoder, token_dtype=token_dtype, vocab_size=vocab_size)  # pickles
    sizes: list[np.ndarray] = []
    with NpyStream(root, "tokens.npy", token_dtype) as tokens, \
            NpyStream(root, "loss_mask.npy", np.dtype("|u1")) as masks, \
            LengthCacheWriter(LENGTHS_FILE, source.tokenizer_hash, folder=root) as lengths, \
            closing(source.stream(encode, chunk_size, workers)) as stream:
        for chunk, (chunk_lengths, ids, mask) in stream:
            tokens.write(ids)
            masks.write(mask)
            lengths.add(written_ids(chunk), chunk_lengths)
            sizes.append(chunk_lengths)
            if progress is not None:
                progress(chunk.bytes_read, source.total_bytes)
        lengths.dataset_hash = source.finish(lengths.ids_are_line_numbers)
    offsets = np.zeros(sum(s.shape[0] for s in sizes) + 1, dtype="<i8")
    np.cumsum(np.concatenate(sizes), out=offsets[1:])
    with root.file("offsets.npy") as handle:
        np.save(handle, offsets, allow_pickle=False)
    meta = {
        "format": STORE_FORMAT,
        "num_samples": int(offsets.shape[0] - 1),
        "num_tokens": int(offsets[-1]),
        "token_dtype": token_dtype.str,
        "tokenizer_hash": source.tokenizer_hash,
        "dataset_hash": lengths.dataset_hash,
        "loss_mask": loss_mask_rule(source),
        "sample_ids": "line_numbers" if lengths.ids_are_line_numbers else "jsonl",
        "tokens_sha256": tokens.sha256,
        "loss_mask_sha256": masks.sha256,
        "offsets_sha256": sha256_array(offsets),
        "vocab_size": int(vocab_size),
    }
    if source.tokenizer_parts is not None:  # last: a store's meta.json before it is these bytes without it
        meta[PARTS_KEY] = source.tokenizer_parts
    with root.file("meta.json") as handle:  # last: the store is complete
        handle.write((json.dumps(meta, indent=2) + "\n").encode("ascii"))


def encode_chunk(source: ChunkEncoder, chunk: RecordChunk, token_dtype: np.dtype, vocab_size: int | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(lengths, token ids, loss mask)`` of one chunk, the ids and masks
    of its records concatenated (run by a worker: ``source`` is what it received)."""
    texts = source.texts(chunk)
    from_ids = source.byte_offsets  # chat records whose token offsets follow from their ids (chat/byte_offsets.py)
    from_ids = from_ids if from_ids is not None and from_ids.covers(texts) else None
    encodings = source.encode(texts, chunk, offsets=source.is_chat and from_ids is None)
    encoded = np.fromiter((len(e) for e in encodings), dtype=np.int64, count=len(encodings))
    total = int(encoded.sum())
    ids = np.fromiter(chain.from_iterable(e.ids for e in encodings), dtype=np.int64, count=total)
    if source.is_chat:  # the assistant spans of each record (umlos_cuda/batching/chat/masks.py)
        spans = [chat.spans for chat in cast(list[ChatText], chunk.values[0])]  # rendered first (ChatWork)
        tokens = from_ids.offsets(ids, encoded, texts) if from_ids is not None else None
        if tokens is not None:
            return encoded, _as_tokens(ids, token_dtype, vocab_size), stacked_masks(tokens, encoded, spans)
        if from_ids is not None:  # the ids do not spell the texts (unreachable: chat/byte_offsets.py); the
            encodings = source.encode(texts, chunk, offsets=True)  # tokenizer's own offsets, as without it
        return encoded, _as_tokens(ids, token_dtype, vocab_size), chunk_masks([e.offsets for e in encodings], spans)
    if source.is_completion:  # TRL's prompt length (umlos_cuda/batching/chat/completions.py)
        _texts, prompt_texts, records = chunk.values  # each row's text, its prompt's, its record (chat/preference.py)
        firsts, prompt_of_row = shared_prompts(records)
        prompts = source.encode([prompt_texts[row] for row in firsts], chunk)
        starts = completion_starts([e.ids for e in encodings], [e.ids for e in prompts], prompt_of_row)
        return encoded, _as_tokens(ids, token_dtype, vocab_size), completion_masks(encoded, starts)
    if not source.is_template:
        return encoded, _as_tokens(ids, token_dtype, vocab_size), np.ones(total, dtype=np.uint8)
    lengths = encoded + source.appended
    ends = np.cumsum(encoded)
    assert source.eos_id is not None  # a template source appends it (DatasetEncoding.__init__)
    ids = np.insert(ids, ends, source.eos_id)  # the end-of-sequence token after each record's text
    prompts = source.encode(source.prompts(chunk), chunk)
    masked = np.minimum(np.fromiter((len(e) for e in prompts), dtype=np.int64, count=len(prompts)), lengths)
    return lengths, _as_tokens(ids, token_dtype, vocab_size), completion_masks(lengths, masked)


def loss_mask_rule(source: DatasetEncoding) -> str:
    """``loss_mask`` in meta.json: ``assistant`` (chat records), ``completion`` (conversational preference
    records: the tokens after the prompt's, chat/completions.py), ``template`` (prompt/response) or ``all``."""
    if source.chunk_encoder.is_completion:
        return "completion"
    if source.chunk_encoder.is_chat:
        return "assistant"
    return "template" if source.is_template else "all"


def _as_tokens(ids: np.ndarray, token_dtype: np.dtype, vocab_size: int | None = None) -> np.ndarray:
    """The ids as ``token_dtype``; an id past the vocabulary (which the store's readers refuse) is refused now."""
    limit = np.iinfo(token_dtype).max + 1 if vocab_size is None else min(vocab_size, np.iinfo(token_dtype).max + 1)
    if ids.size and int(ids.max()) >= limit:
        raise UmlosError(errors.TOKENIZER_INVALID, f"token id {int(ids.max())} does not fit {token_dtype} or the "
                         f"vocabulary of {limit} ids; the tokenizer reports a smaller vocabulary than it produces",
                         operator=errors.BATCHING_OPERATOR)
    return ids.astype(token_dtype)


class NpyStream:
    """A one-dimensional ``.npy`` file ``name`` in ``folder`` written in pieces:
    the header, whose shape is known only at the end, is a fixed
    :data:`NPY_HEADER_BYTES` slot rewritten on close. ``sha256`` is that of
    the array's bytes (what :func:`~umlos_cuda.hashing.sha256_array` gives)."""

    def __init__(self, folder: Folder, name: str, dtype: np.dtype) -> None:
        self.folder = folder
        self.name = name
        self.dtype = np.dtype(dtype)
        self.count = 0
        self._digest = hashlib.sha256()
        self.sha256: str | None = None

    def __enter__(self) -> NpyStream:
        self._handle = self.folder.create(self.name)
        self._handle.write(b"\0" * NPY_HEADER_BYTES)
        return self

    def write(self, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array, dtype=self.dtype).data.cast("B")
        self._handle.write(data)
        self._digest.update(data)
        self.count += len(data) // self.dtype.itemsize

    def __exit__(self, kind, value, traceback) -> Literal[False]:
        with self._handle:
            if kind is None:
                self._handle.seek(0)
                self._handle.write(npy_header(self.dtype, self.count))
                self._handle.flush()
                os.fsync(self._handle.fileno())
                self.sha256 = self._digest.hexdigest()
        return False


def npy_header(dtype: np.dtype, count: int) -> bytes:
    """The ``.npy`` version 1.0 header of a one-dimensional array, padded to :data:`NPY_HEADER_BYTES`."""
    text = repr({"descr": np.dtype(dtype).str, "fortran_order": False, "shape": (count,)})
    prefix = b"\x93NUMPY\x01\x00"
    room = NPY_HEADER_BYTES - len(prefix) - 2
    body = (text + " " * (room - len(text) - 1) + "\n").encode("latin1")
    return prefix + len(body).to_bytes(2, "little") + body
