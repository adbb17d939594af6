"""A sharded token store opened for reading: one logical store over many shards.

What goes in: the folder ``DIR`` that :func:`~umlos_cuda.batching.tokens.adopt.append_shards`
wrote (``DIR/meta.json``, the index: tokens/index.py; ``DIR/shards/NNNNN/``,
each a classic token store, tokens/store.py; ``DIR/digests/NNNNN.npy`` and
``NNNNN.ids.npy``, each shard's row digests and id hashes, tokens/rows.py). What comes out: a token source
with global rows (tokens/concat.py), so plans built from its
``length_cache()``, collation and ``batch generate --source DIR`` work as
with one store.

Opening reads the index only. A shard is opened on first use, and then
checked against the index: its folder is a real folder (a symbolic link is
refused: the store's bytes are its own), its ``meta.json`` hashes to the
index's ``meta_sha256`` (which binds the shard's array digests, so a shard
swapped for another store is caught) and agrees with the index's counts
and common fields. :meth:`ShardedTokenStore.verify` verifies every shard on
its own (``TokenStore.verify``: array digests, vocabulary, masks), then
recomputes every row digest and the logical dataset hash.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import stat
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from ... import errors
from ...errors import UmlosError
from ...files.reader import read_bytes, read_npy
from .concat import ConcatenatedSource
from ..lengths.fingerprints import PARTS_KEY, tokenizer_difference
from .index import COMMON_FIELDS, DIGESTS_FOLDER, SHARDS_FOLDER, digests_name, id_hashes_name, invalid, read_index
from .rows import DIGEST_BYTES, bytes_sha256, logical_hash, row_digests
from .store import StoreFacts, TokenStore

#: A shard as either reader opens it (a folder's :class:`TokenStore`, an object store's).
StoreT = TypeVar("StoreT", bound=StoreFacts)

#: A shard's meta.json is small (about 700 bytes).
MAX_SHARD_META_BYTES = 1 << 20


class ShardedFacts(ConcatenatedSource):
    """What a sharded store answers from its checked index ``meta`` alone, wherever its shards are read from: a
    folder (:class:`ShardedTokenStore`) or an object store (:class:`~umlos_cuda.remote.sharded.RemoteShardedStore`);
    ``open_shard(i)`` opens shard ``i`` on first use (global rows: tokens/concat.py)."""

    def __init__(self, root: str, meta: dict, open_shard: Callable[[int], Any]) -> None:
        self.root = root
        self.meta = meta
        super().__init__([entry["num_samples"] for entry in meta["shards"]], open_shard,
                         tokenizer_hash=meta["tokenizer_hash"],
                         ids_are_line_numbers=meta["sample_ids"] == "line_numbers",
                         dataset_hash=meta["dataset_hash"], fail=invalid, where=root)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.root!r}, {len(self)} samples in {self.num_parts} shards)"

    @property
    def num_tokens(self) -> int:
        return int(self.meta["num_tokens"])

    @property
    def vocab_size(self) -> int | None:
        return self.meta["vocab_size"]

    @property
    def token_dtype(self) -> str:
        return self.meta["token_dtype"]

    @property
    def tokenizer_parts(self) -> dict[str, str] | None:
        """The shards' tokenizer's parts hashed alone, when the index records them."""
        return self.meta.get(PARTS_KEY)

    @property
    def sample_ids(self) -> list[str]:
        return self.length_cache().sample_ids

    def identity(self) -> dict:
        """The tokenizer and the logical dataset hash (over every row's digest of tokens and mask, checked by
        ``data verify``): what an artifact cut from this store records to know it again, the same wherever the
        store is read from."""
        return {"tokenizer_hash": self.tokenizer_hash, "dataset_hash": self.dataset_hash}


class ShardedTokenStore(ShardedFacts):
    """A sharded token store (:meth:`open`); ``shard(i)`` is shard ``i``'s
    :class:`~umlos_cuda.batching.tokens.store.TokenStore`, ``meta`` the index."""

    def __init__(self, root: str, meta: dict) -> None:
        super().__init__(root, meta, self._open_shard)
        self._views: list[tuple[np.ndarray, np.ndarray, np.ndarray] | None] = [None] * self.num_parts

    @classmethod
    def open(cls, directory: str | os.PathLike[str]) -> ShardedTokenStore:
        """The sharded store in ``directory``; TOKEN_STORE_NOT_FOUND when there is no ``meta.json``."""
        root = os.path.abspath(os.fspath(directory))
        path = os.path.join(root, "meta.json")
        if not os.path.lexists(path):
            raise UmlosError(errors.TOKEN_STORE_NOT_FOUND, f"no sharded token store at {root}: {path} does not exist "
                             "(write one with `umlos-cuda data tokenize --sharded`)", operator=errors.BATCHING_OPERATOR)
        try:
            meta = read_index(path)
        except FileNotFoundError:
            raise invalid(f"{path} is missing") from None
        for name in (SHARDS_FOLDER, DIGESTS_FOLDER):  # never read (nor later written) through a link
            check_folder(os.path.join(root, name), f"the store's {name} folder")
        return cls(root, meta)

    def __reduce__(self):
        return (_reopen, (self.root,))

    # ------------------------------------------------------------------ rows
    def arrays(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids, loss_mask)`` of global row ``row`` (read-only views): what collation reads.

        The hot path (a collator reads every row of an epoch): one bounds check, a binary search of the
        shard starts, and two slices of plain ndarray views of the shard's maps with its offsets, not
        ``TokenStore.arrays`` (whose full argument check and ``np.memmap`` slices cost more than all of it).
        """
        if type(row) is not int or not 0 <= row < self._total:
            row = self.check_row(row)
        index = bisect.bisect_right(self.starts, row) - 1
        view = self._views[index]
        if view is None:
            shard = self.shard(index)
            view = self._views[index] = (np.asarray(shard.tokens), np.asarray(shard.loss_mask_array),
                                         np.asarray(shard.offsets))
        tokens, mask, offsets = view
        local = row - self.starts[index]
        start, stop = offsets[local], offsets[local + 1]
        return tokens[start:stop], mask[start:stop]

    def shard(self, index: int) -> TokenStore:
        """Shard ``index`` (0-based), opened and checked against the index on first use."""
        return self.part(index)

    def shard_path(self, index: int) -> str:
        return os.path.join(self.root, SHARDS_FOLDER, self.meta["shards"][index]["name"])

    def digests_path(self, index: int) -> str:
        return os.path.join(self.root, DIGESTS_FOLDER, digests_name(index))

    def _open_shard(self, index: int) -> TokenStore:
        path = self.shard_path(index)
        check_shard_folder(path)
        entry = self.meta["shards"][index]
        check_shard_meta(_shard_meta_bytes(path), entry, path)
        return check_shard(TokenStore.open(path), self.meta, entry, path)

    def id_hashes_path(self, index: int) -> str:
        return os.path.join(self.root, DIGESTS_FOLDER, id_hashes_name(index))

    def row_digests(self, index: int) -> np.ndarray:
        """uint8 [n, 32]: shard ``index``'s stored row digests, checked against the index."""
        entry = self.meta["shards"][index]
        data = self._stored(self.digests_path(index), "|u1", entry["num_samples"] * DIGEST_BYTES, entry,
                            "row_digests_sha256")
        return data.reshape(entry["num_samples"], DIGEST_BYTES)

    def id_hashes(self, index: int) -> np.ndarray:
        """uint64 [n]: the 64-bit hashes of shard ``index``'s sample ids (tokens/rows.py), checked against the index."""
        entry = self.meta["shards"][index]
        return self._stored(self.id_hashes_path(index), "<u8", entry["num_samples"], entry, "id_hashes_sha256")

    def _stored(self, path: str, dtype: str, count: int, entry: dict, field: str) -> np.ndarray:
        data = read_npy(path, dtype, (count,), False, invalid, expected="the index says")
        if bytes_sha256(data) != entry[field]:
            raise invalid(f"{path} does not hash to the index's {field} for shard {entry['name']}: the file changed "
                          "after the shard was adopted")
        return data

    # ------------------------------------------------------------------ checks
    def verify(self) -> dict:
        """Verify every shard on its own (:meth:`TokenStore.verify`), recompute its row digests against
        ``DIR/digests/``, the logical dataset hash against the index, and check that no sample id is
        in two shards; SHARDED_STORE_INVALID (or the shard's TOKEN_STORE_INVALID) names what differs."""
        parts = []
        for index in range(self.num_parts):
            shard = self.shard(index)
            shard.verify()
            stored, hashes = self.row_digests(index), self.id_hashes(index)
            computed, computed_hashes = row_digests(shard, self.starts[index])
            if not np.array_equal(stored, computed):
                row = int(np.flatnonzero((stored != computed).any(axis=1))[0])
                raise invalid(f"{self.digests_path(index)}: row {row} of shard {self.meta['shards'][index]['name']} "
                              "does not digest to what was stored when it was adopted")
            if not np.array_equal(hashes, computed_hashes):
                raise invalid(f"{self.id_hashes_path(index)} does not hold the hashes of shard "
                              f"{self.meta['shards'][index]['name']}'s sample ids")
            parts.append(stored)
        recomputed = logical_hash(parts, len(self), self.tokenizer_hash, self.meta["loss_mask"],
                                  self.meta["sample_ids"])
        if recomputed != self.dataset_hash:
            raise invalid(f"{self.root}/meta.json: dataset_hash is not the hash of the shards' row digests "
                          f"({recomputed}): the index was changed")
        try:
            self.length_cache()
        except UmlosError as exc:
            if exc.code != errors.LENGTHS_INVALID:
                raise
            raise invalid(f"{self.root}: two shards hold the same sample id ({exc.message})") from None
        return {"samples": len(self), "tokens": self.num_tokens, "tokenizer_hash": self.tokenizer_hash,
                "shards": self.num_parts}


def check_shard_meta(data: bytes, entry: dict, where: str) -> None:
    """SHARDED_STORE_INVALID unless ``data`` (the bytes of the shard's meta.json, at ``where``, a folder or a
    prefix) hashes to the index entry's ``meta_sha256``: checked before the shard's arrays are opened."""
    if hashlib.sha256(data).hexdigest() != entry["meta_sha256"]:
        raise invalid(f"{where}/meta.json does not hash to the index's meta_sha256 for shard {entry['name']}: "
                      "the shard was replaced or changed after it was adopted")


def check_shard(store: StoreT, index: dict, entry: dict, where: str) -> StoreT:
    """``store`` (shard ``entry`` of the sharded store whose index is ``index``, opened from ``where``: a
    :class:`TokenStore` or a remote one) when its common fields and its counts are the index's;
    SHARDED_STORE_INVALID otherwise. One check for both readers of a shard."""
    check_shard_fields(store, index, f"shard {entry['name']} ({where})", invalid)
    if (len(store), store.num_tokens) != (entry["num_samples"], entry["num_tokens"]):
        raise invalid(f"{where} holds {len(store)} samples and {store.num_tokens} tokens; the index says "
                      f"{entry['num_samples']} and {entry['num_tokens']}")
    return store


def check_shard_folder(path: str) -> None:
    """SHARDED_STORE_INVALID unless ``path`` is a real folder (never a link to one)."""
    check_folder(path, "shard", missing="the store's index lists it",
                 link="a shard is a folder inside the store (adopt a copy with `umlos-cuda data append`)")


def check_folder(path: str, what: str, *, missing: str = "a sharded store has one",
                 link: str = "a sharded store's folders are its own") -> None:
    """SHARDED_STORE_INVALID unless ``path`` is a real folder; ``what`` names it in the message."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise invalid(f"{what} ({path}) is missing: {missing}") from None
    if stat.S_ISLNK(info.st_mode):
        raise invalid(f"{what} ({path}) is a symbolic link; {link}")
    if not stat.S_ISDIR(info.st_mode):
        raise invalid(f"{what} ({path}) is not a folder")


def check_shard_fields(store: StoreFacts, common: dict, what: str, fail) -> None:
    """``fail`` unless ``store``'s tokenizer, dtype, vocabulary, loss-mask rule and id kind are ``common``'s."""
    found = shard_common(store)
    for name in COMMON_FIELDS:
        if found[name] != common[name]:
            why = f" ({tokenizer_difference(found[PARTS_KEY], common.get(PARTS_KEY))})" \
                if name == "tokenizer_hash" else ""
            raise fail(f"{what} has {name} {found[name]!r}; the store's is {common[name]!r}{why}")


def shard_common(store: StoreFacts) -> dict:
    """A classic store's values of the fields every shard of one sharded store shares, and its tokenizer's parts
    (None where its meta.json has none: they name what differs, and are not compared themselves)."""
    meta = store.meta
    return {"token_dtype": meta["token_dtype"], "vocab_size": meta.get("vocab_size"),
            "tokenizer_hash": meta["tokenizer_hash"], "loss_mask": meta["loss_mask"],
            "sample_ids": meta["sample_ids"], PARTS_KEY: meta.get(PARTS_KEY)}


def _shard_meta_bytes(path: str) -> bytes:
    try:
        return read_bytes(os.path.join(path, "meta.json"), invalid, max_bytes=MAX_SHARD_META_BYTES,
                          what="token store meta.json")
    except FileNotFoundError:
        raise invalid(f"shard {path} has no meta.json") from None


def _reopen(root: str) -> ShardedTokenStore:
    return ShardedTokenStore.open(root)
