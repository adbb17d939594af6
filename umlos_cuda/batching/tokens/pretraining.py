"""Token sources read by rows, for plans that must stay O(window): a Megatron pair, a store's offsets, a folder's
recorded token source.

:func:`open_mapped` is what the commands open a ``--tokens``, ``--lengths`` or ``--mix`` token source with
(``plan cut``, ``plan build --window``, ``plan verify``/``plan info`` reopening a recorded path):
:class:`MappedMegatron` for a Megatron prefix, ``StoreLengths``/``ShardedLengths`` (tokens/offsets.py) for a
token store or a sharded store. Each is a
:class:`~umlos_cuda.batching.plans.windows.sources.LengthSource` and a token source at once, bound like an
``ArrayLengths`` of the same lengths, so every folder is the one the copying readers wrote.
:func:`load_pretraining` opens a pretraining sequences folder with the token source its meta.json names
(``tokens_path``), which the plans layer below cannot open itself.

:class:`MappedMegatron`: what goes in is the prefix of a pair. What comes out: a length source whose
``take`` reads the ``.idx`` sizes of the rows asked for (memory-mapped, no copy), and a token source whose
``arrays(row)`` is that row's tokens in the ``.bin`` (a read-only view) and a loss mask of ones, as
:class:`~umlos_cuda.batching.tokens.megatron.MegatronDataset` gives them.

Why not ``MegatronDataset``: opening it checks every pointer at once and copies the sizes and the
token bounds (about 30 bytes a sequence with the checks' temporaries: 300 MB at 10^7 sequences), which
is right for a dataset collated whole and wrong for a plan that must stay O(window). Here the header
is checked on opening by the one parser both readers use (megatron.py ``read_idx_header``: the same
MEGATRON_INDEX_INVALID refusals, word for word); a row's size and pointer are checked when the row is read
(negative size, a pointer outside the ``.bin`` or not aligned), and :meth:`MappedMegatron.check_rows`
checks them all, a piece at a time, as ``MegatronDataset.open`` does at once (``plan cut`` runs it); the
lengths bind like an ``ArrayLengths`` of the same sizes (SHA-256 of their uint32 little-endian bytes,
hashed a piece at a time), so a plan built from either opens with the other.
"""
from __future__ import annotations

import hashlib
import mmap
import os

import numpy as np

from ... import errors
from ...errors import UmlosError
from ...files import reader
from ..plans.windows.sequences import PretrainingSequences
from ..plans.windows.sequence_mixture import SequenceMixture
from ..plans.windows.sequences_io import load_mixed_sequences, load_sequences
from ..plans.windows.sources import LengthSource
from .logical import ShardedTokenStore
from .megatron import (HEADER_BYTES, UNKNOWN_TOKENIZER, _invalid, _map, _view, bin_path, check_rows, idx_path,
                       read_idx_header)
from .offsets import ShardedLengths, StoreLengths
from .sources import megatron_prefix, names_token_source, open_token_source
from .store import TokenStore

_HASH_PIECE = 1 << 20


class MappedMegatron(LengthSource):
    """The pair at ``prefix`` (see the module docstring)."""

    #: Its loss mask is all ones, as :class:`~.megatron.MegatronDataset`'s.
    trains_on_every_token = True

    def __init__(self, prefix, *, tokenizer_hash: str = UNKNOWN_TOKENIZER) -> None:
        prefix = os.fspath(prefix)
        self.prefix = prefix[:-4] if prefix.endswith((".idx", ".bin")) else prefix
        self.tokenizer_hash = tokenizer_hash
        index, self.dtype, count, _documents = read_idx_header(self.prefix)
        self.count = int(count)
        self.sizes = _view(index, HEADER_BYTES, "<i4", count)
        self.pointers = _view(index, HEADER_BYTES + 4 * count, "<i8", count)
        self.data = _map(bin_path(self.prefix))
        self._index = index
        self._ones = np.ones(0, dtype=np.uint8)
        self._sha256: str | None = None

    def __reduce__(self):
        return (_reopen, (self.prefix, self.tokenizer_hash))  # a pickled pair is its path: no map copied

    # ------------------------------------------------------------------ lengths
    def __len__(self) -> int:
        return self.count

    def take(self, rows: np.ndarray) -> np.ndarray:
        sizes = self.sizes[np.asarray(rows)]
        if sizes.size and int(sizes.min()) < 0:
            raise _invalid(f"{idx_path(self.prefix)}: a sequence has a negative length")
        return sizes.astype(np.uint32)

    def binding(self) -> dict:
        if self._sha256 is None:
            digest = hashlib.sha256()
            for start in range(0, self.count, _HASH_PIECE):
                piece = self.sizes[start:start + _HASH_PIECE]
                if int(piece.min()) < 0:
                    raise _invalid(f"{idx_path(self.prefix)}: a sequence has a negative length")
                digest.update(piece.data)  # int32 >= 0: the bytes of the same values as uint32
                self.release()
            self._sha256 = digest.hexdigest()
        return {"kind": "array", "count": self.count, "lengths_sha256": self._sha256}

    def release(self) -> None:
        """Drop the ``.idx`` pages read so far from this process's memory (they stay in the page cache)."""
        handle = getattr(self._index, "_mmap", None)
        if handle is not None and hasattr(mmap, "MADV_DONTNEED"):
            handle.madvise(mmap.MADV_DONTNEED)

    def check_rows(self) -> None:
        """Every sequence's size and pointer, as ``MegatronDataset.open`` checks them (not negative, aligned,
        inside the ``.bin``: MEGATRON_INDEX_INVALID naming the first that is not), a piece of the index at a
        time with the pages read dropped after each: what ``plan cut`` runs before it promises that every
        document of its sequences can be read."""
        for start in range(0, self.count, _HASH_PIECE):
            check_rows(self.prefix, self.dtype, self.sizes[start:start + _HASH_PIECE],
                       self.pointers[start:start + _HASH_PIECE], int(self.data.shape[0]), start)
            self.release()

    # ------------------------------------------------------------------ tokens
    def arrays(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """Row ``row``'s tokens (a read-only view of the ``.bin``) and a loss mask of ones."""
        size, pointer, width = int(self.sizes[row]), int(self.pointers[row]), self.dtype.itemsize
        if size < 0 or pointer < 0 or pointer % width or pointer + size * width > self.data.shape[0]:
            raise _invalid(f"{idx_path(self.prefix)}: sequence {row} points at bytes {pointer} to "
                           f"{pointer + size * width}, outside the {self.data.shape[0]}-byte {bin_path(self.prefix)} "
                           f"or not aligned to {width} bytes")
        if self._ones.shape[0] < size:
            self._ones = np.ones(size, dtype=np.uint8)
        return np.frombuffer(self.data, dtype=self.dtype, count=size, offset=pointer), self._ones[:size]


def _reopen(prefix: str, tokenizer_hash: str) -> MappedMegatron:
    return MappedMegatron(prefix, tokenizer_hash=tokenizer_hash)


def open_mapped(path):
    """The token source at ``path`` as a length source read by rows that is a token source too: a
    :class:`MappedMegatron` for a Megatron prefix, a :class:`~.offsets.StoreLengths` for a token store
    folder, a :class:`~.offsets.ShardedLengths` for a sharded one (nothing O(N) in memory; bound as
    ``ArrayLengths`` of the same lengths). What ``plan cut``, ``plan build --window`` and ``--mix`` read,
    and what a folder recording the path reopens. A list of prefixes, or a source already opened, is
    opened by :func:`~.sources.open_token_source` (held in memory)."""
    if isinstance(path, (str, os.PathLike)):
        path = os.fspath(path)
        if names_token_source(path) and not os.path.isdir(path):
            return MappedMegatron(megatron_prefix(path))
    source = open_token_source(path)
    if isinstance(source, TokenStore):
        return StoreLengths(source)
    if isinstance(source, ShardedTokenStore):
        return ShardedLengths(source)
    return source


def recorded_lengths(directory):
    """The lengths a windowed plan folder (meta.json ``lengths_path``) or a mixed plan folder (``lengths_paths``)
    records as token sources, opened by rows (:func:`open_mapped`): a source, or a list with a source in place
    of each token source (the other entries as recorded, for the plans layer to map); None when the folder
    names only ``.u32`` sidecars or its meta.json cannot be read (the plan's loader then says why). The one
    way the commands and the torch samplers reopen them: the plans layer maps sidecars only."""
    try:
        meta = reader.read_json(os.path.join(os.fspath(directory), "meta.json"), _meta_error)
    except (OSError, UmlosError):
        return None
    if not isinstance(meta, dict):
        return None
    path, paths = meta.get("lengths_path"), meta.get("lengths_paths")
    if isinstance(path, str):
        return open_mapped(path) if names_token_source(path) else None
    if isinstance(paths, list) and any(isinstance(p, str) and names_token_source(p) for p in paths):
        return [open_mapped(p) if isinstance(p, str) and names_token_source(p) else p for p in paths]
    return None


def _meta_error(message: str) -> UmlosError:
    return UmlosError(errors.PLAN_FORMAT_INVALID, message, operator=errors.BATCH_PLAN_OPERATOR)


def load_pretraining(directory, *, tokens=None, lengths=None, backend: str = "auto") -> PretrainingSequences:
    """:func:`~umlos_cuda.batching.plans.windows.load_sequences`, the tokens opened from the folder's
    ``tokens_path`` (:func:`open_mapped`: read by rows) when neither ``tokens`` nor ``lengths`` is given."""
    return load_sequences(directory, tokens=tokens, lengths=lengths, backend=backend, open_tokens=open_mapped)


def load_mixed_pretraining(directory, *, tokens=None, lengths=None, backend: str = "auto") -> SequenceMixture:
    """:func:`~umlos_cuda.batching.plans.windows.sequences_io.load_mixed_sequences`, each component's tokens opened
    from the folder's ``tokens_paths`` (by :func:`open_mapped`, as :func:`load_pretraining` opens one) when
    neither ``tokens`` nor ``lengths`` is given."""
    return load_mixed_sequences(directory, tokens=tokens, lengths=lengths, backend=backend, open_tokens=open_mapped)
