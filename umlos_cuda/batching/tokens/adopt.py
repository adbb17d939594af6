"""Create a sharded token store, or append shards to one, by adopting written token stores.

What goes in: the store folder ``DIR`` and classic token stores already
written (by ``data tokenize``, :func:`~umlos_cuda.batching.tokens.partition.tokenize_shard`,
or Ray workers: anywhere on the same file system, typically a hidden
staging folder beside ``DIR``). What comes out: the
:class:`~umlos_cuda.batching.tokens.logical.ShardedTokenStore`, the stores
now its last shards.

One writer at a time: the whole append, from reading the index to
replacing it, holds an exclusive lock on ``DIR/.lock`` (files/lock.py: a
``flock`` the kernel drops when the holder dies, the file removed when the
append ends, so the store's files are what they were). A second append is
refused at once, before it verifies, hashes or writes anything, with
SHARDED_STORE_LOCKED naming the store and the holder's pid. Refused, not
made to wait: two appends into one store at once are a pipeline's mistake
(a job restarted while the first still runs, two jobs adopting from one
staging folder) to be seen, not hidden; the holder keeps the lock while it
verifies and hashes its shards, minutes for large ones, so no timeout would
fit every store; and a refused append loses nothing (its staged folders
stay where they are, the retry is the same command). ``umlos-cuda
checkpoint`` refuses a second writer the same way.

Steps, in this order, under the lock (each shard's bytes are never rewritten):

1. the store's shards folder is read: a shard folder the index does not
   list (left by an append killed after moving it in) is refused
   (SHARDED_STORE_INVALID naming it and the command that adopts it) unless
   it is among the folders to adopt; a folder that is a shard of another
   sharded store (moving it would break that store), or one this store
   already lists, is refused (SHARDED_STORE_MISMATCH);
2. every staged store is opened and verified on its own, and checked
   against the store: tokenizer, token dtype, vocabulary, loss-mask rule and
   id kind (SHARDED_STORE_MISMATCH);
3. its row digests and id hashes are computed (tokens/rows.py); the older
   shards' are read from ``DIR/digests/`` (never their tokens or ids); no
   sample id may be already in the store or in another staged store
   (SHARDED_STORE_MISMATCH naming both: the hashes nominate, the ids of the
   shards holding a repeated hash decide); the new logical dataset hash is
   computed;
4. before anything is written, the index is read again (it must be the one
   of step 1) and every name the append will take is checked: a shard name
   already in ``shards/`` is refused as in step 1; a digest file of a shard
   number the index does not list can only be left by an interrupted append
   (the lock says no writer is in the store), so it is removed;
5. the digests are written to ``DIR/digests/NNNNN.npy`` (``.ids.npy``), each
   file created exclusively (``O_EXCL``), and the staged folders renamed to
   ``DIR/shards/NNNNN`` (one ``rename`` each: the same file system), both
   fsynced;
6. last, ``DIR/meta.json`` is replaced in one rename. Until then the old
   index lists only the old shards, so the store reads as before.

An exception (Ctrl-C and SIGTERM included) before step 6 ends puts the
staged folders back where they were and removes the digest files this
append created, and only those: the store is unchanged. A SIGKILL in step 5
leaves the moved folders in ``DIR/shards/`` unlisted (and the lock file,
unlocked): the store still reads as before (nothing reads an unlisted
shard); the next append names them and says how to adopt them (give
``DIR/shards/NNNNN`` itself, which is adopted in place).

Creating (``create=True``) runs steps 2 and 3 first (every refusal comes
before a store is replaced), then publishes a new folder holding the marker
(``"artifact": "sharded token store"``) and empty ``shards/`` and
``digests/`` folders, through the output layer (``force`` replaces only a
sharded token store, never an input, and never one another append holds),
its lock taken before it appears under its name, then appends to it:
"creating is appending to an empty store". It has no ``meta.json`` until
the last step, so an interrupted creation is never read as a store.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ... import checks, errors
from ...errors import UmlosError
from ...files.artifacts import identify
from ...files.atomic import write_failed
from ...files.folder import Folder
from ...files.lock import FolderLock, FolderLocked
from ...files.reader import read_bytes
from ...files.writer import ArtifactKind, check_output_folder, output_folder
from .index import (COMMON_FIELDS, DIGESTS_FOLDER, MAX_INDEX_BYTES, SHARDS_FOLDER, digests_name, id_hashes_name,
                    index_bytes, invalid, mismatch, shard_name)
from ..lengths.fingerprints import PARTS_KEY, tokenizer_difference
from .logical import MAX_SHARD_META_BYTES, ShardedTokenStore, check_shard_folder, shard_common
from .rows import bytes_sha256, logical_hash, row_digests
from .store import TokenStore

#: The artifact kind of a sharded token store (it always carries its marker).
SHARDED_STORE = ArtifactKind("sharded token store")
INDEX_FILE = "meta.json"
#: The writers' lock (files/lock.py), present only while an append runs (or after one was killed).
LOCK_FILE = ".lock"


def append_shards(directory: str | os.PathLike[str], folders: Sequence[str | os.PathLike[str]], *,
                  create: bool = False, force: bool = False,
                  opener: Callable[[str], ShardedTokenStore] = ShardedTokenStore.open) -> ShardedTokenStore:
    """Adopt the token stores ``folders`` (in order) as the next shards of the sharded store
    ``directory`` (module docstring); with ``create``, make the store first (OUTPUT_EXISTS if
    ``directory`` exists, unless ``force``, which replaces only a sharded token store).
    SHARDED_STORE_LOCKED when another append holds the store. ``opener(root)`` opens the store as the append
    reads it: an append into an object store (remote/append.py) gives one whose shards are fetched when the id
    check needs one (its folder holds the index and digests alone)."""
    with adopting(directory, create=create, force=force, opener=opener) as adopt:
        return adopt(folders)


@contextlib.contextmanager
def adopting(directory: str | os.PathLike[str], *, create: bool = False, force: bool = False,
             opener: Callable[[str], ShardedTokenStore] = ShardedTokenStore.open,
             ) -> Iterator[Callable[[Sequence[str | os.PathLike[str]]], ShardedTokenStore]]:
    """A function that adopts folders into ``directory`` as :func:`append_shards` does, for writers that make
    the folders first (``tokenize --append``, the Ray job): an append takes the store's lock when the block
    starts and holds it to its end, so a second writer is refused before the shards are tokenized, not after
    (a creation locks its new store as it publishes it)."""
    root = os.path.abspath(os.fspath(directory))
    if create:
        yield lambda folders: _create(root, _paths(folders), force)
        return
    opener(root)  # not a store: refused before its folder is locked (a lock file is a write)
    with _locked(root):
        yield lambda folders: _append(root, _paths(folders), opener)


def _paths(folders: Sequence[str | os.PathLike[str]]) -> list[str]:
    paths = [os.path.abspath(os.fspath(folder)) for folder in folders]
    if not paths:
        raise UmlosError(errors.INVALID_ARGUMENT, "append_shards needs at least one token store to adopt",
                         operator=errors.BATCHING_OPERATOR)
    if len(set(paths)) != len(paths):
        raise mismatch(f"a token store is named twice among the folders to adopt: {', '.join(paths)}")
    return paths


def _append(root: str, paths: list[str], opener: Callable[[str], ShardedTokenStore]) -> ShardedTokenStore:
    """Steps 1 to 6 (module docstring), the store's lock held."""
    old = opener(root)  # the index this append replaces, read under the lock
    _refuse_unlisted(old, paths)
    staged = _open_staged(paths, root, old)
    _check_together(staged, old)
    return _commit(root, _prepare(root, staged, old))


def _create(root: str, paths: list[str], force: bool) -> ShardedTokenStore:
    """``create=True``: steps 2 and 3, then the new store published (locked before it has its name), then
    appended to; a store ``force`` replaces is locked first, so one another append holds is never replaced."""
    target = check_output_folder(root, SHARDED_STORE, force=force, inputs=paths, operator=errors.BATCHING_OPERATOR)
    staged = _open_staged(paths, root, None)
    _check_together(staged, None)
    prepared = _prepare(root, staged, None)  # every refusal comes before a store is replaced
    with contextlib.ExitStack() as held:
        if force and _is_sharded_store(target):
            held.enter_context(_locked(target))
        with output_folder(target, SHARDED_STORE, force=force, inputs=paths,
                           operator=errors.BATCHING_OPERATOR) as folder:
            folder.mkdir(SHARDS_FOLDER).close()
            folder.mkdir(DIGESTS_FOLDER).close()
            held.enter_context(_take_lock(folder, root))
        try:
            return _commit(root, prepared)
        except BaseException:
            _remove_if_empty(root)
            raise


@contextlib.contextmanager
def _locked(root: str) -> Iterator[None]:
    """The store ``root``'s writers' lock held for the block."""
    try:
        folder = Folder.open(root, follow=True)  # the user's path: a link to the store is the user's choice
    except OSError as exc:
        raise write_failed(root, exc) from exc
    with folder, _take_lock(folder, root):
        yield


def _take_lock(folder: Folder, root: str) -> FolderLock:
    """The lock of the store ``root`` (held open as ``folder``); SHARDED_STORE_LOCKED when another append
    holds it, OUTPUT_PATH_INVALID when its name holds something that is no lock file."""
    try:
        return FolderLock.take(folder, LOCK_FILE)
    except FolderLocked as exc:
        holder = f"process {exc.holder}" if exc.holder is not None else "another process"
        raise UmlosError(errors.SHARDED_STORE_LOCKED, f"{root} is being appended to by {holder}, which holds "
                         f"{exc.path}; one writer at a time: nothing was done, run this append again when that one "
                         "has finished", operator=errors.BATCHING_OPERATOR) from None
    except OSError as exc:
        reason = "it is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
        raise UmlosError(errors.OUTPUT_PATH_INVALID, f"cannot lock {folder.join(LOCK_FILE)}, the lock of the "
                         f"sharded token store {root}: {reason}; umlos-cuda creates that file during an append and "
                         "removes it after: when no append is running, remove what is there",
                         operator=errors.BATCHING_OPERATOR) from None


def _remove_if_empty(root: str) -> None:
    """Remove the store just created for an adoption that failed, when it holds no index and no shard
    (the adopted folders were moved back): the marker, empty folders and digest files are ours."""
    with contextlib.suppress(OSError):
        if os.path.lexists(os.path.join(root, INDEX_FILE)) or os.listdir(os.path.join(root, SHARDS_FOLDER)):
            return
        with Folder.open(os.path.dirname(root), follow=True) as parent:
            parent.remove(os.path.basename(root))


def _refuse_unlisted(old: ShardedTokenStore, paths: list[str]) -> None:
    """Step 1: SHARDED_STORE_INVALID when ``shards/`` holds a shard folder the index does not list and that
    is not among ``paths`` (what an append killed after moving it in leaves)."""
    listed = {entry["name"] for entry in old.meta["shards"]}
    shards_path = os.path.join(old.root, SHARDS_FOLDER)
    try:
        with Folder.open(shards_path) as shards:  # opened checked a real folder; never followed
            names = shards.names()
    except OSError as exc:
        raise invalid(f"cannot read {shards_path}: {exc.strerror or exc}") from None
    orphans = sorted(name for name in names if _is_shard_name(name) and name not in listed
                     and os.path.join(shards_path, name) not in paths)
    if orphans:
        raise _unlisted(old.root, orphans)


def _is_shard_name(name: str) -> bool:
    number = checks.integer_or_none(name)
    return number is not None and name == shard_name(number)


def _unlisted(root: str, names: list[str]) -> UmlosError:
    """The refusal of shard folders in ``root/shards`` that the index does not list, with the command that
    adopts them."""
    folders = [os.path.join(root, SHARDS_FOLDER, name) for name in names]
    one = len(names) == 1
    them = "it" if one else "them"
    return invalid(f"{', '.join(folders)} {'is a shard folder' if one else 'are shard folders'} that {root}/meta.json "
                   f"does not list: an append was interrupted after moving {them} there. Adopt {them} in place "
                   f"first: `umlos-cuda data append {root} {' '.join(folders)}` (then append the other stores), or "
                   f"move {them} out of the store")


def _open_staged(paths: list[str], root: str, old: ShardedTokenStore | None) -> list[TokenStore]:
    """Each staged folder checked to be no shard of a sharded store (but an unlisted one of ``old``), then
    opened and verified on its own."""
    stores = []
    for path in paths:
        if os.path.islink(path):
            raise invalid(f"{path} is a symbolic link; adopt the token store folder itself (it is moved into "
                          f"{root}/shards)")
        _refuse_other_shards(path, old)
        store = TokenStore.open(path)
        store.verify()
        stores.append(store)
    return stores


def _refuse_other_shards(path: str, old: ShardedTokenStore | None) -> None:
    """SHARDED_STORE_MISMATCH when ``path`` is a shard folder of a sharded store other than ``old`` (adopting
    it would move it out of that store, whose index may list it) or a shard ``old`` already lists."""
    holder = _store_holding(path)
    if holder is None:
        return
    name = os.path.basename(path)
    if old is None or not _same_folder(holder, old.root):
        raise mismatch(f"{path} is a shard folder of the sharded token store {holder}: adopting it would move it out "
                       f"of that store; to add its rows here, copy it (cp -r {path} STAGING/{name}) and adopt the "
                       "copy")
    if name in {entry["name"] for entry in old.meta["shards"]}:
        raise mismatch(f"{path} is already shard {name} of {old.root}")


def _store_holding(path: str) -> str | None:
    """The sharded store ``path`` is a shard folder of (``STORE/shards/NAME``, STORE carrying the marker)."""
    shards = os.path.dirname(path)
    if os.path.basename(shards) != SHARDS_FOLDER:
        return None
    store = os.path.dirname(shards)
    return store if _is_sharded_store(store) else None


def _is_sharded_store(path: str) -> bool:
    """Whether the folder ``path`` carries the sharded token store marker."""
    try:
        with Folder.open(path, follow=True) as folder:
            return identify(folder, SHARDED_STORE)[0]
    except OSError:
        return False


def _same_folder(one: str, other: str) -> bool:
    try:
        return os.path.samefile(one, other)
    except OSError:
        return False


def _index_common(store: ShardedTokenStore) -> dict:
    """The fields every shard of ``store`` shares, from its index, and its tokenizer's parts where it has them."""
    return {**{name: store.meta[name] for name in COMMON_FIELDS}, PARTS_KEY: store.meta.get(PARTS_KEY)}


def _check_together(staged: list[TokenStore], old: ShardedTokenStore | None) -> None:
    """SHARDED_STORE_MISMATCH unless every staged store shares the store's fields (and, for row-number
    ids, the store stays one shard); repeated ids are found later, from the id hashes."""
    common = _index_common(old) if old is not None else shard_common(staged[0])
    where = old.root if old is not None else staged[0].root
    for store in staged:
        found = shard_common(store)
        for name in COMMON_FIELDS:
            if found[name] != common[name]:
                why = f" ({tokenizer_difference(found[PARTS_KEY], common[PARTS_KEY])})" \
                    if name == "tokenizer_hash" else ""
                raise mismatch(f"{store.root} has {name} {found[name]!r}; {where} has {common[name]!r}: a sharded "
                               "store holds the rows of one tokenizer, dtype, vocabulary, loss-mask rule and id "
                               f"kind{why}")
    if common["sample_ids"] == "line_numbers" and len(staged) + (old.num_parts if old is not None else 0) > 1:
        raise mismatch("the samples of " + ", ".join(s.root for s in staged) + " are named by row number; a store "
                       "named so has one shard (row numbers repeat in every shard): tokenize the files as one "
                       "multi-file dataset (`data tokenize --sharded` with a glob or list), whose rows get content "
                       "ids, or give the rows ids (--id-field)")


@dataclass(frozen=True)
class _Prepared:
    """Steps 2 and 3 done: what steps 4 to 6 write (the new shards' digests and id hashes, the new index)."""

    staged: list[TokenStore]
    parts: list[tuple[np.ndarray, np.ndarray]]
    first_new: int
    before: bytes | None
    data: bytes


def _prepare(root: str, staged: list[TokenStore], old: ShardedTokenStore | None) -> _Prepared:
    """Steps 2 and 3 (module docstring): everything that can refuse the shards, before anything is written."""
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
    common = _index_common(old) if old is not None else shard_common(staged[0])
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
    """Steps 4 to 6: the names checked, the prepared shards moved in and the index replaced."""
    try:
        _move_and_publish(root, prepared)
    except OSError as exc:  # opening the store's folders (a link planted there is refused, never followed)
        raise write_failed(root, exc) from exc
    return ShardedTokenStore.open(root)


def _move_and_publish(root: str, prepared: _Prepared) -> None:
    """Steps 4 to 6 (module docstring), rolled back on any exception before the index is replaced."""
    index_path = os.path.join(root, INDEX_FILE)
    with Folder.open(root, follow=True) as folder:
        same, found = identify(folder, SHARDED_STORE)
        if not same:
            raise UmlosError(errors.OUTPUT_PATH_INVALID, f"{root} is {'a ' + found if found else 'a folder'} without "
                             "the sharded token store marker; umlos-cuda appends only to a store it wrote",
                             operator=errors.BATCHING_OPERATOR)
        with folder.sub(SHARDS_FOLDER) as shards, folder.sub(DIGESTS_FOLDER) as digests_folder:
            _refuse_changed_index(index_path, prepared.before)
            numbered = list(enumerate(prepared.staged, prepared.first_new))
            taken = [shard_name(number) for number, store in numbered
                     if store.root != shards.join(shard_name(number)) and shards.lstat(shard_name(number)) is not None]
            if taken:
                raise _unlisted(root, taken)
            for number, _ in numbered:
                for file_name in (digests_name(number), id_hashes_name(number)):
                    _remove_leftover(digests_folder, file_name, number)
            moved: list[tuple[str, str]] = []
            written: list[str] = []
            committed = False
            try:
                for (number, store), (digests, hashes) in zip(numbered, prepared.parts):
                    for file_name, array in ((digests_name(number), digests.reshape(-1)),
                                             (id_hashes_name(number), hashes)):
                        digests_folder.write_bytes(file_name, _npy_bytes(array))  # O_EXCL: never over a file
                        written.append(file_name)
                    _move_in(store.root, shards, shard_name(number), root)
                    moved.append((store.root, shard_name(number)))
                shards.sync()
                digests_folder.sync()
                for source, _ in moved:
                    _sync_parent(source)
                _refuse_changed_index(index_path, prepared.before)
                try:
                    _replace_index(folder, prepared.data)
                    committed = True
                    folder.sync()
                except OSError as exc:
                    raise write_failed(folder.join(INDEX_FILE), exc) from exc
            except BaseException:
                if not committed:  # the old index still rules: put back what this append moved, remove what it made
                    _roll_back(shards, digests_folder, moved, written)
                raise


def _refuse_changed_index(index_path: str, before: bytes | None) -> None:
    """SHARDED_STORE_INVALID when the index is not the one this append read (a writer that ignored the lock)."""
    if _index_bytes_now(index_path) != before:
        raise invalid(f"{index_path} changed while shards were being appended (another writer?); nothing was "
                      "appended: append again")


def _remove_leftover(digests_folder: Folder, name: str, number: int) -> None:
    """Step 4: the digest file ``name`` of shard ``number``, which the index does not list, is left by an
    interrupted append (the lock says no writer is in the store): removed, a link unlinked, never followed."""
    info = digests_folder.lstat(name)
    if info is None:
        return
    if stat.S_ISDIR(info.st_mode):
        raise invalid(f"{digests_folder.join(name)} is a folder where shard {shard_name(number)}'s digests go; "
                      "remove it")
    os.unlink(name, dir_fd=digests_folder.fd)


def _replace_index(folder: Folder, data: bytes) -> None:
    """Step 6, the commit point: the new index replaces the old in one rename."""
    folder.replace_file(INDEX_FILE, data)


def _move_in(source: str, shards: Folder, name: str, root: str) -> None:
    target = shards.join(name)
    if os.path.abspath(source) == target:
        check_shard_folder(target)  # an orphan of an interrupted append, adopted in place
        return
    if shards.lstat(name) is not None:  # checked in step 4; a rename would replace an empty folder there
        raise _unlisted(root, [name])
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


def _shard_ids(store: ShardedTokenStore, index: int) -> Callable[[], list[str]]:
    return lambda: store.shard(index).sample_ids


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
    # An older shard is opened only when it holds a candidate (its meta.json read and its arrays mapped, its ids
    # read then): an append into an object store fetches that shard, and no other.
    owners: list[tuple[str, Callable[[], list[str]]]] = \
        [(old.shard_path(i), _shard_ids(old, i)) for i in range(old.num_parts)] if old is not None else []
    owners += [(store.root, _ids_of(store)) for store in staged]
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
