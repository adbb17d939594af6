"""A Megatron-LM pair read by rows, for plans that must stay O(window).

What goes in: the prefix of a pair. What comes out: :class:`MappedMegatron`, a
:class:`~umlos_cuda.batching.lengths.sources.LengthSource` whose ``take`` reads the ``.idx`` sizes of the rows
asked for (memory-mapped, no copy), and a token source whose ``arrays(row)`` is that row's tokens in the
``.bin`` (a read-only view) and a loss mask of ones, as
:class:`~umlos_cuda.batching.tokens.megatron.MegatronDataset` gives them. ``umlos_cuda.batching.sources``
opens a Megatron prefix as one.

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

from ..lengths.sources import LengthSource
from .megatron import (HEADER_BYTES, UNKNOWN_TOKENIZER, _invalid, _map, _view, bin_path, check_rows, idx_path,
                       read_idx_header)

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
