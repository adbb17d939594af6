"""Per-row digests and the logical dataset hash of a sharded token store.

What goes in: a token store (one shard) and where its rows start in the
logical store. What comes out: one 32-byte SHA-256 digest per row, and the
logical dataset hash over every row of every shard.

Why per-row digests: the logical hash must not depend on how the rows are
cut into shards (3 shards + 1 appended must equal the same rows in one
shard), and appending must not re-read the older shards' tokens. A SHA-256
over the concatenated token bytes would need them all again at each
append (a digest's state cannot be stored and resumed); a hash of per-shard
hashes would change with the cut. A hash over per-row digests in global
order has neither problem: each shard's digests are computed once, when it
is adopted, stored beside it (``DIR/digests/NNNNN.npy``, 32 bytes a row,
about 1/20 of a uint16 store of 300-token rows), and an append reads only
those files. Beside them, ``DIR/digests/NNNNN.ids.npy`` holds each sample
id's 64-bit hash (:func:`id_hash`, 8 bytes a row), from which an append
finds an id repeated across shards without re-reading the older shards' ids
(a hash that repeats is then confirmed on the ids themselves).

Row digest (normative)::

    SHA-256( u64(len(id)) || id || u64(n) || tokens as uint32 LE [n] || loss mask uint8 [n] )

where ``id`` is the sample id's UTF-8 bytes (the row number's decimal text
for a store whose ids are row numbers), ``n`` the row's token count and
``u64`` little-endian. Tokens are widened to uint32 so that the digest is
that of the ids, not of the store's dtype.

Logical dataset hash (normative)::

    SHA-256( "umlos-cuda sharded dataset v1\\0" || text(tokenizer_hash) || text(loss_mask)
             || text(sample_ids) || u64(N) || row digest 0 || ... || row digest N-1 )

with ``text(s) = u64(len(utf8(s))) || utf8(s)``, ``loss_mask`` the rule
(``all``, ``template``, ``assistant``) and ``sample_ids`` the id kind
(``jsonl`` or ``line_numbers``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np

#: Bytes of one row digest.
DIGEST_BYTES = 32
#: What the logical hash starts with (its version).
LOGICAL_PREFIX = b"umlos-cuda sharded dataset v1\0"
#: Tokens widened to uint32 at a time.
_WINDOW_TOKENS = 1 << 22


def _u64(value: int) -> bytes:
    return int(value).to_bytes(8, "little")


def _text(value: str) -> bytes:
    data = value.encode("utf-8")
    return _u64(len(data)) + data


def row_digests(store, first_row: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(uint8 [N, 32], uint64 [N])``: the digest of each row of ``store`` (a
    :class:`~umlos_cuda.batching.tokens.store.TokenStore`), its ids those of
    the store, or ``first_row + row`` for a store whose ids are row numbers;
    and each id's 64-bit hash (:func:`id_hash`)."""
    count = len(store)
    out = np.empty((count, DIGEST_BYTES), dtype=np.uint8)
    hashes = np.empty(count, dtype="<u8")
    offsets = np.asarray(store.offsets, dtype=np.int64)
    if store.ids_are_line_numbers:
        ids: Iterable[str] = (str(first_row + row) for row in range(count))
    else:
        ids = store.sample_ids
    id_iter = iter(ids)
    tokens, masks = store.tokens, store.loss_mask_array
    row = 0
    while row < count:
        # a window of whole rows, at least one, widened to uint32 once
        stop = int(np.searchsorted(offsets, offsets[row] + _WINDOW_TOKENS, side="right")) - 1
        stop = min(max(stop, row + 1), count)
        base = int(offsets[row])
        wide = np.ascontiguousarray(tokens[base:int(offsets[stop])], dtype="<u4").data.cast("B")
        mask = np.ascontiguousarray(masks[base:int(offsets[stop])]).data.cast("B")
        for index in range(row, stop):
            start, end = int(offsets[index]) - base, int(offsets[index + 1]) - base
            name = next(id_iter).encode("utf-8")
            hashes[index] = int.from_bytes(hashlib.blake2b(name, digest_size=8).digest(), "little")
            digest = hashlib.sha256(_u64(len(name)) + name)
            digest.update(_u64(end - start))
            digest.update(wide[4 * start:4 * end])
            digest.update(mask[start:end])
            out[index] = np.frombuffer(digest.digest(), dtype=np.uint8)
        row = stop
    return out, hashes


def id_hash(sample_id: str) -> int:
    """The 64-bit hash of a sample id stored per row beside the digests (BLAKE2b, 8 bytes, little-endian):
    an append finds ids repeated across shards from these 8 bytes a row, never re-reading the older
    shards' ids, and reads the ids only of rows whose hashes collide."""
    return int.from_bytes(hashlib.blake2b(sample_id.encode("utf-8"), digest_size=8).digest(), "little")


def logical_hash(digests: Iterable[np.ndarray], num_samples: int, tokenizer_hash: str, loss_mask: str,
                 sample_ids: str) -> str:
    """The logical dataset hash over the row digests of every shard, in order (module docstring)."""
    total = hashlib.sha256(LOGICAL_PREFIX + _text(tokenizer_hash) + _text(loss_mask) + _text(sample_ids)
                           + _u64(num_samples))
    for part in digests:
        total.update(np.ascontiguousarray(part, dtype=np.uint8).data.cast("B"))
    return total.hexdigest()


def bytes_sha256(array: np.ndarray) -> str:
    """SHA-256 of an array's bytes (what the index records of a shard's digest and id-hash files)."""
    return hashlib.sha256(np.ascontiguousarray(array).data.cast("B")).hexdigest()
