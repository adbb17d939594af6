"""A sharded token store in an object store: its index read bounded, each shard a :class:`~.store.RemoteTokenStore`.

What goes in: ``s3://bucket/prefix`` (or ``gs://``, ``az://``, ``file://``) of a folder written by ``umlos-cuda
data tokenize --sharded`` (or grown by ``data append``) and copied there as it is (docs/batching.md, "Sharded
token stores": ``meta.json``, the index; ``shards/NNNNN/``, each a flat token store). What comes out: a token
source with global rows (tokens/concat.py), as :class:`~umlos_cuda.batching.tokens.logical.ShardedTokenStore`
answers them on disk (``len``, ``lengths``, ``arrays(row)``, ``tokenizer_hash``, ``identity()``, ``shard(i)``).

The checks are the folder reader's, not a copy of them: the index is refused from its size before its body is
fetched (over tokens/index.py's ``MAX_INDEX_BYTES``), then checked by ``check_index``; a shard is opened on
first use, its ``meta.json`` refused from its size (over ``MAX_SHARD_META_BYTES``) and hashed against the
index's ``meta_sha256`` before anything else of it is read (``check_shard_meta``), then its fields and counts
compared with the index (``check_shard``). A shard's arrays are read by ranges, each checked against the ETag
and size recorded when the shard was opened (:mod:`.client`).

Not read here: the row digests (``digests/``), which only ``data verify`` reads (on disk). A row read with
``arrays`` costs two ranged GETs; read in plan order through the planned cache (:mod:`.planned`), which numbers
the shards' objects by :meth:`RemoteShardedStore.object_table`.

A pickled store is its URL and budget: a ``DataLoader`` worker opens it again.
"""

from __future__ import annotations

from ..batching.tokens.index import INDEX_WHAT, MAX_INDEX_BYTES, SHARDS_FOLDER, check_index, invalid
from ..batching.tokens.logical import MAX_SHARD_META_BYTES, ShardedFacts, check_shard, check_shard_meta
from .. import errors
from ..errors import UmlosError
from ..files.reader import loads_json
from .bounded import read_object_bytes
from .client import RemoteObject, RetryBudget
from .objects import ObjectTable
from .store import RemoteTokenStore
from .urls import ObjectUrl, parse_url


class RemoteShardedStore(ShardedFacts):
    """A sharded token store read from an object store (module docstring); open it with :meth:`open`.
    ``shard(i)`` is shard ``i``'s :class:`~.store.RemoteTokenStore`, ``meta`` the checked index; what it answers
    from the index (``num_tokens``, ``identity()``, ...) is :class:`~umlos_cuda.batching.tokens.logical.ShardedFacts`,
    as the same store's on disk."""

    def __init__(self, url: ObjectUrl, meta: dict, budget: RetryBudget) -> None:
        self.url, self.budget = url, budget
        self.origin = str(url)
        super().__init__(str(url), meta, self._open_shard)

    @classmethod
    def open(cls, path: str, *, budget: RetryBudget | None = None) -> RemoteShardedStore:
        """The sharded store at ``path``; TOKEN_STORE_NOT_FOUND when its index (``meta.json``) is not there,
        SHARDED_STORE_INVALID when it is not a sharded store's index, REMOTE_* for the store's own failures."""
        url = parse_url(path)
        budget = budget if budget is not None else RetryBudget()
        key = url.key("meta.json")
        try:
            index = RemoteObject.open(url, key, budget)
        except FileNotFoundError:
            raise UmlosError(errors.TOKEN_STORE_NOT_FOUND, f"no sharded token store at {url}: {url.name(key)} does "
                             "not exist (copy a folder written by `umlos-cuda data tokenize --sharded` there, files "
                             "as they are)", operator=errors.BATCHING_OPERATOR) from None
        data = read_object_bytes(index, invalid, max_bytes=MAX_INDEX_BYTES, what=INDEX_WHAT)
        return cls(url, check_index(loads_json(data, invalid, index.name), index.name), budget)

    def __reduce__(self):
        return (_reopen, (self.root, self.budget))

    # ------------------------------------------------------------------ shards
    def shard(self, index: int) -> RemoteTokenStore:
        """Shard ``index`` (0-based), opened and checked against the index on first use."""
        return self.part(index)

    def object_table(self) -> ObjectTable:
        """What the planned cache reads (:mod:`.objects`): each shard's tokens and loss mask, objects ``2 i`` and
        ``2 i + 1`` for shard ``i``, its global rows mapped to the shard's as :meth:`arrays` maps them."""
        return ObjectTable(self.starts, self.shard)

    def shard_path(self, index: int) -> str:
        """The URL of shard ``index``'s prefix."""
        return f"{self.root}/{SHARDS_FOLDER}/{self.meta['shards'][index]['name']}"

    def _open_shard(self, index: int) -> RemoteTokenStore:
        where, entry = self.shard_path(index), self.meta["shards"][index]
        try:
            store = RemoteTokenStore.open(where, budget=self.budget,
                                          read_meta=lambda obj: _shard_meta(obj, entry, where))
        except UmlosError as exc:
            if exc.code != errors.TOKEN_STORE_NOT_FOUND:
                raise
            raise invalid(f"shard {entry['name']} ({where}) is missing: the store's index lists it, and "
                          f"{where}/meta.json does not exist") from None
        return check_shard(store, self.meta, entry, where)


def _shard_meta(obj: RemoteObject, entry: dict, where: str) -> bytes:
    """The bytes of a shard's meta.json, refused as the folder reader refuses them: over its cap (from its size,
    before its body is fetched), or not hashing to the index entry."""
    data = read_object_bytes(obj, invalid, max_bytes=MAX_SHARD_META_BYTES, what="token store meta.json")
    check_shard_meta(data, entry, where)
    return data


def _reopen(root: str, budget: RetryBudget) -> RemoteShardedStore:
    return RemoteShardedStore.open(root, budget=budget)
