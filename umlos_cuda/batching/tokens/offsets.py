"""A token store's lengths read from its memory-mapped offsets, by rows: a length source that copies nothing.

What goes in: an opened :class:`~umlos_cuda.batching.tokens.store.TokenStore` (its ``offsets.npy`` mapped,
int64 ``[N + 1]``; or a :class:`~umlos_cuda.remote.store.RemoteTokenStore`, whose offsets were read at
opening) or a :class:`~umlos_cuda.batching.tokens.logical.ShardedTokenStore` (each shard's, global rows; or a
:class:`~umlos_cuda.remote.sharded.RemoteShardedStore`, each shard's offsets read when it is opened).
What comes out: a :class:`~umlos_cuda.batching.lengths.sources.LengthSource` whose
``take(rows)`` is ``offsets[rows + 1] - offsets[rows]`` of the rows asked for, and which is a token
source for pretraining sequences too (``arrays(row)`` is the store's).

Why not ``ArrayLengths(store.lengths)``: that holds 4 bytes a sample (and its ``np.diff`` temporary 8
more), which a windowed plan, a mixture or a cut of 10^9 documents must not. The binding is that of an
``ArrayLengths`` of the same lengths (SHA-256 of their uint32 little-endian bytes, count), hashed a piece
at a time with the mapped pages dropped after each piece (``release``), so a plan built from either
opens with the other. A length that does not fit uint32 is TOKEN_STORE_INVALID (the store's own
``lengths`` would wrap it); the store's opening already refused offsets that decrease.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np

from ..lengths.sources import LengthSource
from .logical import ShardedTokenStore
from .store import OFFSETS_PIECE, TokenStore, _invalid, release_pages

if TYPE_CHECKING:
    from ...remote.sharded import RemoteShardedStore
    from ...remote.store import RemoteTokenStore

_U32_MAX = 0xFFFFFFFF


def _sizes(offsets: np.ndarray, rows: np.ndarray, where: str) -> np.ndarray:
    """The lengths of ``rows`` (int64 indices) from ``offsets``, as uint32, refused when one does not fit."""
    sizes = np.asarray(offsets[rows + 1]) - np.asarray(offsets[rows])
    if sizes.size and (int(sizes.min()) < 0 or int(sizes.max()) > _U32_MAX):
        raise _invalid(f"{where}/offsets.npy cuts a sample of a negative length or of 2^32 tokens or more")
    return sizes.astype(np.uint32)


def _hash_offsets(offsets: np.ndarray, digest, where: str) -> None:
    """Feed ``digest`` the uint32 lengths ``offsets`` cut, a piece at a time (bounded memory)."""
    count = int(offsets.shape[0]) - 1
    for start in range(0, count, OFFSETS_PIECE):
        piece = np.diff(np.asarray(offsets[start:min(start + OFFSETS_PIECE, count) + 1]))
        if int(piece.min()) < 0 or int(piece.max()) > _U32_MAX:
            raise _invalid(f"{where}/offsets.npy cuts a sample of a negative length or of 2^32 tokens or more")
        digest.update(piece.astype("<u4").tobytes())
        release_pages(offsets)


class StoreLengths(LengthSource):
    """The lengths of a token store's rows from its mapped offsets (module docstring)."""

    def __init__(self, store: TokenStore | RemoteTokenStore) -> None:
        self.store = store
        self.root = store.root
        self.count = len(store)
        self.tokenizer_hash = store.tokenizer_hash
        self._sha256: str | None = None

    def __len__(self) -> int:
        return self.count

    def take(self, rows: np.ndarray) -> np.ndarray:
        return _sizes(self.store.offsets, np.asarray(rows, dtype=np.int64), self.root)

    def binding(self) -> dict:
        if self._sha256 is None:
            digest = hashlib.sha256()
            _hash_offsets(self.store.offsets, digest, self.root)
            self._sha256 = digest.hexdigest()
        return {"kind": "array", "count": self.count, "lengths_sha256": self._sha256}

    def release(self) -> None:
        release_pages(self.store.offsets)

    def arrays(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """Row ``row``'s tokens and loss mask (the store's read-only views)."""
        return self.store.arrays(row)

    def identity(self) -> dict:
        return self.store.identity()


class ShardedLengths(LengthSource):
    """The lengths of a sharded store's global rows, each shard's from its mapped offsets (module docstring);
    a shard is opened (and checked against the index) when one of its rows is first read."""

    def __init__(self, store: ShardedTokenStore | RemoteShardedStore) -> None:
        self.store = store
        self.root = store.root
        self.count = len(store)
        self.tokenizer_hash = store.tokenizer_hash
        self._starts = np.asarray(store.starts, dtype=np.int64)
        self._sha256: str | None = None

    def __len__(self) -> int:
        return self.count

    def take(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty(rows.shape[0], dtype=np.uint32)
        parts = np.searchsorted(self._starts, rows, side="right") - 1
        for part in np.unique(parts).tolist():
            chosen = parts == part
            out[chosen] = _sizes(self.store.shard(part).offsets, rows[chosen] - self._starts[part],
                                 self.store.shard_path(part))
        return out

    def binding(self) -> dict:
        if self._sha256 is None:
            digest = hashlib.sha256()
            for part in range(self.store.num_parts):
                _hash_offsets(self.store.shard(part).offsets, digest, self.store.shard_path(part))
            self._sha256 = digest.hexdigest()
        return {"kind": "array", "count": self.count, "lengths_sha256": self._sha256}

    def release(self) -> None:
        for part in self.store._parts:
            if part is not None:
                release_pages(part.offsets)

    def arrays(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """Global row ``row``'s tokens and loss mask (the sharded store's read-only views)."""
        return self.store.arrays(row)

    def identity(self) -> dict:
        return self.store.identity()
