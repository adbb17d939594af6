"""Sharded token stores: one logical token store over many shards (the public names).

A sharded store is a folder ``DIR/``::

    DIR/meta.json              the index, format umlos_cuda.sharded_token_store/1 (tokens/index.py)
    DIR/shards/NNNNN/          shard i: a classic token store (tokens/store.py), verifiable on its own
    DIR/digests/NNNNN.npy      shard i's row digests, 32 bytes a row (tokens/rows.py)
    DIR/umlos-artifact.json    the marker, "artifact": "sharded token store"

One shard per input file of a multi-file dataset, rows named as in the
whole dataset (tokens/partition.py). Rows are addressed by GLOBAL row
number (tokens/concat.py), so a plan built from ``length_cache()``,
collation, ``batch generate --source DIR`` and the torch datasets read it as
one store. Shards are appended without rewriting the others, the index
replaced last (tokens/adopt.py).

The logical dataset hash (``dataset_hash`` of the index and of the length
cache) is SHA-256 over per-row digests of (sample id, length, tokens, loss
mask) in global order: it does not depend on how the rows are cut into
shards, and an append hashes only the new rows and re-reads only the older
digest files (tokens/rows.py says why, and gives the bytes).

Names (what the Ray job codes against): :class:`ShardedTokenStore`
(``.open(directory)``), :func:`append_shards`, :func:`tokenize_shard`,
:func:`tokenize_sharded`, :data:`SHARDED_FORMAT`.
"""

from __future__ import annotations

from .adopt import SHARDED_STORE, append_shards
from .index import SHARDED_FORMAT
from .logical import ShardedTokenStore
from .partition import tokenize_shard, tokenize_sharded

__all__ = ["SHARDED_FORMAT", "SHARDED_STORE", "ShardedTokenStore", "append_shards", "tokenize_shard",
           "tokenize_sharded"]
