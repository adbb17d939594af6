"""Per-row loss-token counts of a token source: how many tokens of each row its loss mask trains on.

What goes in: a length source that holds tokens (a token store's or a sharded store's, opened by rows or whole;
a Megatron prefix's; any source with ``arrays(row)``). What comes out: :func:`loss_counter`'s function of rows
giving each row's count of non-zero loss-mask values (``uint32``), what a mixture whose weights count loss tokens
shares its windows by (docs/batching.md, "Token quotas").

A store's flat ``loss_mask`` is counted once, on first use, piece by piece over its offsets (a running count over
at most :data:`PIECE_TOKENS` mask bytes at a time, the count of row ``r`` the difference at its two offsets): one
pass over the masks, O(N) counts held (4 bytes a row). A Megatron dataset trains on every token (its masks are
all ones), so its counts are its lengths and nothing is read; another token source is counted row by row. Lengths
alone hold no mask: TOKEN_STORE_NOT_FOUND, saying to give the component's token store.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ... import errors
from ...errors import UmlosError

#: Most loss-mask bytes counted at once (the running count is int64: 8 bytes a token of the piece).
PIECE_TOKENS = 1 << 22


def _flat_parts(source) -> list | None:
    """The flat stores under ``source`` (each with ``offsets`` and ``loss_mask_array``), in row order, or None."""
    store = getattr(source, "store", source)
    if hasattr(store, "loss_mask_array") and hasattr(store, "offsets"):
        return [store]
    if callable(getattr(store, "shard", None)) and hasattr(store, "num_parts"):
        return [store.shard(k) for k in range(store.num_parts)]
    return None


def _count_store(store) -> np.ndarray:
    """Each row's loss tokens of one flat store, piece by piece (module docstring)."""
    offsets = np.asarray(store.offsets, dtype=np.int64)
    mask = store.loss_mask_array
    rows = offsets.shape[0] - 1
    out = np.empty(rows, dtype=np.uint32)
    a = 0
    while a < rows:
        b = max(a + 1, min(rows, int(np.searchsorted(offsets, offsets[a] + PIECE_TOKENS, side="right")) - 1))
        base = int(offsets[a])
        running = np.zeros(int(offsets[b]) - base + 1, dtype=np.int64)
        np.cumsum(np.asarray(mask[base:int(offsets[b])]) != 0, out=running[1:])
        out[a:b] = running[offsets[a + 1:b + 1] - base] - running[offsets[a:b] - base]
        a = b
    return out


def loss_counter(source, name: str) -> Callable[[np.ndarray], np.ndarray]:
    """A function of rows (int array) giving each row's loss tokens in ``source`` (module docstring); ``name``
    says which component it is in the refusal."""
    if getattr(source, "trains_on_every_token", False):
        return source.take
    parts = _flat_parts(source)
    if parts is not None:
        held: list[np.ndarray] = []

        def counted(rows: np.ndarray) -> np.ndarray:
            if not held:
                held.append(np.concatenate([_count_store(part) for part in parts]))
            return held[0][np.asarray(rows, dtype=np.int64)]
        return counted
    arrays = getattr(source, "arrays", None)
    if callable(arrays):
        return lambda rows: np.array([np.count_nonzero(arrays(int(r))[1]) for r in np.asarray(rows).tolist()],
                                     dtype=np.uint32)
    raise UmlosError(errors.TOKEN_STORE_NOT_FOUND,
                     f"component {name!r} is read from {getattr(source, 'origin', None) or 'lengths in memory'}, "
                     "which holds no loss mask: weights in loss tokens need each component's token store (give its "
                     "folder, not its length cache, in --mix) or weights in tokens (--mix-unit tokens)",
                     operator=errors.BATCHING_OPERATOR)
