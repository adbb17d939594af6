"""Create a sharded token store, or append shards to one, by adopting written token stores.

What goes in: the store folder ``DIR`` and classic token stores already
written (by ``data tokenize``, :func:`~umlos_cuda.batching.tokens.partition.tokenize_shard`,
or Ray workers: anywhere on the same file system, typically a hidden
staging folder beside ``DIR``). What comes out: the
:class:`~umlos_cuda.batching.tokens.logical.ShardedTokenStore`, the stores
now its last shards.

Steps, in this order (each shard's bytes are never rewritten):

1. every staged store is opened and verified on its own, and checked
   against the store: tokenizer, token dtype, vocabulary, loss-mask rule and
   id kind (SHARDED_STORE_MISMATCH);
2. its row digests and id hashes are computed (tokens/rows.py); the older
   shards' are read from ``DIR/digests/`` (never their tokens or ids); no
   sample id may be already in the store or in another staged store
   (SHARDED_STORE_MISMATCH naming both: the hashes nominate, the ids of the
   shards holding a repeated hash decide); the new logical dataset hash is
   computed;
3. the digests are written to ``DIR/digests/NNNNN.npy`` (``.ids.npy``) and the staged
   folders renamed to ``DIR/shards/NNNNN`` (one ``rename`` each: the same
   file system), both fsynced;
4. last, ``DIR/meta.json`` is replaced in one rename. Until then the old
   index lists only the old shards, so the store reads as before.

An exception (Ctrl-C and SIGTERM included) before step 4 ends puts the
staged folders back where they were and removes the new digest files:
the store is unchanged. A SIGKILL in step 3 leaves the moved folders in
``DIR/shards/`` unlisted: the store still reads as before (nothing reads an
unlisted shard); the next append refuses to overwrite them and says how to
adopt them (give ``DIR/shards/NNNNN`` itself, which is adopted in place).
One writer at a time: the index is re-read just before it is replaced and a
change meanwhile is refused.

Creating (``create=True``) runs steps 1 and 2 first (every refusal comes
before a store is replaced), then publishes a new folder holding the marker
(``"artifact": "sharded token store"``) and empty ``shards/`` and
``digests/`` folders, through the output layer (``force`` replaces only a
sharded token store, never an input), then appends to it: "creating is
appending to an empty store". It has no ``meta.json`` until the last step,
so an interrupted creation is never read as a store.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ... import errors
from ...errors import UmlosError
from ...files.artifacts import identify
from ...files.atomic import write_failed
from ...files.folder import Folder
from ...files.reader import read_bytes
from ...files.writer import ArtifactKind, check_output_folder, output_folder
from .index import (COMMON_FIELDS, DIGESTS_FOLDER, MAX_INDEX_BYTES, SHARDS_FOLDER, digests_name, id_hashes_name,
                    index_bytes, invalid, mismatch, shard_name)
from .logical import MAX_SHARD_META_BYTES, ShardedTokenStore, check_shard_folder, shard_common
from .rows import bytes_sha256, logical_hash, row_digests
from .store import TokenStore

#: The artifact kind of a sharded token store (it always carries its marker).
SHARDED_STORE = ArtifactKind("sharded token store")
INDEX_FILE = "meta.json"


def append_shards(directory: str | os.PathLike[str], folders: Sequence[str | os.PathLike[str]], *,
                  create: bool = False, force: bool = False) -> ShardedTokenStore:
    """Adopt the token stores ``folders`` (in order) as the next shards of the sharded store
    ``directory`` (module docstring); with ``create``, make the store first (OUTPUT_EXISTS if
    ``directory`` exists, unless ``force``, which replaces only a sharded token store)."""
    paths = [os.path.abspath(os.fspath(folder)) for folder in folders]
    if not paths:
        raise UmlosError(errors.INVALID_ARGUMENT, "append_shards needs at least one token store to adopt",
                         operator=errors.BATCHING_OPERATOR)
    if len(set(paths)) != len(paths):
        raise mismatch(f"a token store is named twice among the folders to adopt: {', '.join(paths)}")
    root = os.path.abspath(os.fspath(directory))
    if create:
        target = check_output_folder(root, SHARDED_STORE, force=force, inputs=paths, operator=errors.BATCHING_OPERATOR)
        staged = _open_staged(paths, root)
        _check_together(staged, None)
        prepared = _prepare(root, staged, None)  # every refusal comes before a store is replaced
        with output_folder(target, SHARDED_STORE, force=force, inputs=paths,
                           operator=errors.BATCHING_OPERATOR) as folder:
            folder.mkdir(SHARDS_FOLDER).close()
            folder.mkdir(DIGESTS_FOLDER).close()
        try:
            return _commit(root, prepared)
        except BaseException:
            _remove_if_empty(root)
            raise
    old = ShardedTokenStore.open(root)
    staged = _open_staged(paths, root)
    _check_together(staged, old)
    return _commit(root, _prepare(root, staged, old))


def _remove_if_empty(root: str) -> None:
    """Remove the store just created for an adoption that failed, when it holds no index and no shard
    (the adopted folders were moved back): the marker, empty folders and digest files are ours."""
    with contextlib.suppress(OSError):
        if os.path.lexists(os.path.join(root, INDEX_FILE)) or os.listdir(os.path.join(root, SHARDS_FOLDER)):
            return
        with Folder.open(os.path.dirname(root), follow=True) as parent:
            parent.remove(os.path.basename(root))


def _open_staged(paths: list[str], root: str) -> list[TokenStore]:
    """Each staged folder opened and verified on its own."""
    stores = []
    for path in paths:
        if os.path.islink(path):
            raise invalid(f"{path} is a symbolic link; adopt the token store folder itself (it is moved into "
                          f"{root}/shards)")
        store = TokenStore.open(path)
        store.verify()
        stores.append(store)
    return stores


def _check_together(staged: list[TokenStore], old: ShardedTokenStore | None) -> None:
    """SHARDED_STORE_MISMATCH unless every staged store shares the store's fields (and, for row-number
    ids, the store stays one shard); repeated ids are found later, from the id hashes."""
    common = {name: old.meta[name] for name in COMMON_FIELDS} if old is not None else shard_common(staged[0])
    where = old.root if old is not None else staged[0].root
    for store in staged:
        found = shard_common(store)
        for name in COMMON_FIELDS:
            if found[name] != common[name]:
                raise mismatch(f"{store.root} has {name} {found[name]!r}; {where} has {common[name]!r}: a sharded "
                               "store holds the rows of one tokenizer, dtype, vocabulary, loss-mask rule and id kind")
    if common["sample_ids"] == "line_numbers" and len(staged) + (old.num_parts if old is not None else 0) > 1:
        raise mismatch("the samples of " + ", ".join(s.root for s in staged) + " are named by row number; a store "
                       "named so has one shard (row numbers repeat in every shard): tokenize the files as one "
                       "multi-file dataset (`data tokenize --sharded` with a glob or list), whose rows get content "
                       "ids, or give the rows ids (--id-field)")


@dataclass(frozen=True)
class _Prepared:
    """Steps 1 and 2 done: what steps 3 and 4 write (the new shards' digests and id hashes, the new index)."""

    staged: list[TokenStore]
    parts: list[tuple[np.ndarray, np.ndarray]]
    first_new: int
    before: bytes | None
    data: bytes


def _prepare(root: str, staged: list[TokenStore], old: ShardedTokenStore | None) -> _Prepared:
    """Steps 1 and 2 (module docstring): everything that can refuse the shards, before anything is written."""
    index_path = os.path.join(root, INDEX_FILE)
    before = _index_bytes_now(index_path) if old is not None else None
    old_parts = [old.row_digests(i) for i in range(old.num_parts)] if old is not None else []
    if old is not None:
        recomputed = logical_hash(old_parts, len(old), old.tokenizer_hash, old.meta["loss_mask"],
                                  old.meta["sample_ids"])
        if recomputed != old.dataset_hash:
            raise invalid(f"{index_path}: dataset_hash is not the hash of the stored row digests; the store was "
                          "changed (run its verify)")
    first = len(old) if old is not None else 0
    common = {name: old.meta[name] for name in COMMON_FIELDS} if old is not None else shard_common(staged[0])
    entries = list(old.meta["shards"]) if old is not None else []
    new_parts, new_hashes = [], []
    start = first
    for store in staged:
        digests, hashes = row_digests(store, start)
        start += len(store)
        new_parts.append(digests)
        new_hashes.append(hashes)
        meta_bytes = read_bytes(os.path.join(store.root, "meta.json"), invalid, max_bytes=MAX_SHARD_META_BYTES,
                                what="token store meta.json")
        entries.append({"name": shard_name(len(entries)), "num_samples": len(store), "num_tokens": store.num_tokens,
                        "meta_sha256": hashlib.sha256(meta_bytes).hexdigest(),
                        "row_digests_sha256": bytes_sha256(digests), "id_hashes_sha256": bytes_sha256(hashes)})
    if common["sample_ids"] != "line_numbers":
        _refuse_repeated_ids(staged, new_hashes, old)
    total = first + sum(len(store) for store in staged)
    dataset_hash = logical_hash([*old_parts, *new_parts], total, common["tokenizer_hash"], common["loss_mask"],
                                common["sample_ids"])
    return _Prepared(staged, list(zip(new_parts, new_hashes)), len(entries) - len(staged), before,
                     index_bytes(common, entries, dataset_hash))


def _commit(root: str, prepared: _Prepared) -> ShardedTokenStore:
    """Steps 3 and 4: the prepared shards moved in and the index replaced."""
    try:
        _move_and_publish(root, prepared.staged, prepared.parts, prepared.first_new, prepared.before,
                          os.path.join(root, INDEX_FILE), prepared.data)
    except OSError as exc:  # opening the store's folders (a link planted there is refused, never followed)
        raise write_failed(root, exc) from exc
    return ShardedTokenStore.open(root)


def _move_and_publish(root: str, staged: list[TokenStore], new_parts: list[tuple[np.ndarray, np.ndarray]],
                      first_new: int,
                      before: bytes | None, index_path: str, data: bytes) -> None:
    """Steps 3 and 4 (module docstring), rolled back on any exception before the index is replaced."""
    with Folder.open(root, follow=True) as folder:
        same, found = identify(folder, SHARDED_STORE)
        if not same:
            raise UmlosError(errors.OUTPUT_PATH_INVALID, f"{root} is {'a ' + found if found else 'a folder'} without "
                             "the sharded token store marker; umlos-cuda appends only to a store it wrote",
                             operator=errors.BATCHING_OPERATOR)
        with folder.sub(SHARDS_FOLDER) as shards, folder.sub(DIGESTS_FOLDER) as digests_folder:
            moved: list[tuple[str, str]] = []
            written: list[str] = []
            committed = False
            try:
                for offset, (store, (digests, hashes)) in enumerate(zip(staged, new_parts)):
                    name = shard_name(first_new + offset)
                    for file_name, array in ((digests_name(first_new + offset), digests.reshape(-1)),
                                             (id_hashes_name(first_new + offset), hashes)):
                        digests_folder.replace_file(file_name, _npy_bytes(array))
                        written.append(file_name)
                    _move_in(store.root, shards, name, root)
                    moved.append((store.root, name))
                shards.sync()
                digests_folder.sync()
                for source, _ in moved:
                    _sync_parent(source)
                if _index_bytes_now(index_path) != before:
                    raise invalid(f"{index_path} changed while shards were being appended (another writer?); "
                                  "nothing was appended: append again")
                try:
                    _replace_index(folder, data)
                    committed = True
                    folder.sync()
                except OSError as exc:
                    raise write_failed(folder.join(INDEX_FILE), exc) from exc
            except BaseException:
                if not committed:  # the old index still rules: put everything back
                    _roll_back(shards, digests_folder, moved, written)
                raise


def _replace_index(folder: Folder, data: bytes) -> None:
    """Step 4, the commit point: the new index replaces the old in one rename."""
    folder.replace_file(INDEX_FILE, data)


def _move_in(source: str, shards: Folder, name: str, root: str) -> None:
    target = shards.join(name)
    if os.path.abspath(source) == target:
        check_shard_folder(target)  # an orphan of an interrupted append, adopted in place
        return
    if shards.lstat(name) is not None:
        raise invalid(f"{target} exists but {root}/meta.json does not list it: an append was interrupted after "
                      f"moving it there; adopt it by giving {target} as the first folder to append, or move it away")
    try:
        os.rename(source, name, dst_dir_fd=shards.fd)
    except OSError as exc:
        if exc.errno == errno.EXDEV:
            raise UmlosError(errors.OUTPUT_WRITE_FAILED, f"cannot move {source} into {shards.path}: they are on "
                             "different file systems; write the shards to a staging folder beside the store",
                             operator=errors.BATCHING_OPERATOR) from exc
        raise write_failed(target, exc) from exc


def _roll_back(shards: Folder, digests_folder: Folder, moved: list[tuple[str, str]], written: list[str]) -> None:
    for source, name in reversed(moved):
        if shards.join(name) != source:
            with contextlib.suppress(OSError):
                os.rename(name, source, src_dir_fd=shards.fd)
    for name in written:
        with contextlib.suppress(OSError):
            digests_folder.remove(name)


def _sync_parent(path: str) -> None:
    with contextlib.suppress(OSError), Folder.open(os.path.dirname(path), follow=True) as parent:
        parent.sync()


def _index_bytes_now(path: str) -> bytes | None:
    try:
        return read_bytes(path, invalid, max_bytes=MAX_INDEX_BYTES, what="sharded store index")
    except FileNotFoundError:
        return None


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


def _ids_of(store: TokenStore) -> Callable[[], list[str]]:
    return lambda: store.sample_ids


def _refuse_repeated_ids(staged: list[TokenStore], new_hashes: list[np.ndarray],
                         old: ShardedTokenStore | None) -> None:
    """SHARDED_STORE_MISMATCH when a sample id of a staged store is in the store or in another staged store.
    The 64-bit id hashes (8 bytes a row, the older shards' read from ``DIR/digests/``) nominate candidates;
    only the shards holding a candidate have their ids read, and a real repeat is named."""
    parts = ([old.id_hashes(i) for i in range(old.num_parts)] if old is not None else []) + new_hashes
    ordered = np.sort(np.concatenate(parts))
    candidates = ordered[1:][ordered[1:] == ordered[:-1]]
    if candidates.size == 0:
        return
    stores: list[TokenStore] = [old.shard(i) for i in range(old.num_parts)] if old is not None else []
    stores += staged  # opening an older shard reads its meta.json and maps its arrays, never its ids
    owners: list[tuple[str, Callable[[], list[str]]]] = [(store.root, _ids_of(store)) for store in stores]
    seen: dict[str, str] = {}
    for (where, ids), hashes in zip(owners, parts):
        rows = np.flatnonzero(np.isin(hashes, candidates))
        if rows.size == 0:
            continue
        names = ids()
        for row in rows.tolist():
            sample_id = names[row]
            if sample_id in seen:
                raise mismatch(f"sample id {sample_id!r} of {where} is already in {seen[sample_id]}; ids are unique "
                               "across shards (the same rows adopted twice, or two files with the same content)")
            seen[sample_id] = where
