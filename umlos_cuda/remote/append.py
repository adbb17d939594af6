"""``data append s3://...``: token stores adopted as the next shards of a sharded store in an object store.

What goes in: the URL of a sharded token store (docs/batching.md, "Sharded token stores") and token store folders
on disk. What comes out: the store under the URL with those folders as its next shards, read back as a
:class:`~.sharded.RemoteShardedStore`; the folders are moved into it (put from where they are, and removed from
disk once the store is published).

One append, not two: the disk append (tokens/adopt.py) runs unchanged on a private folder (mode 0700, beside the
first folder to adopt, so its folders are moved in by ``rename``) holding what it reads of the store: its index
(``meta.json``), its marker and its digests (``digests/``, 40 bytes a row); never a shard's tokens, unless the id
check finds an id hash of a new row among a shard's (then that shard alone is fetched, for its ids). What it
writes there (the new ``shards/NNNNN/``, moved back where they were at once; ``digests/NNNNN*.npy``;
``meta.json``) is then put under the prefix:

1. **One appender at a time.** A lock object (``PREFIX/.lock``: host, pid, start time and a random token; never a
   credential) is created by a conditional PUT (``If-None-Match: *``). When it exists, the append is refused at
   once with SHARDED_STORE_LOCKED naming it and its holder. It is removed when the append ends, on success and on
   every failure this process sees; a SIGKILL leaves it.
2. **Objects a killed append left are harmless.** Shard and digest objects of shard numbers the index does not
   list are never read (a reader follows the index). Under the lock, once the index is read and read again
   unchanged, they are removed, then this append's objects are created in their place.
3. **Every object is created, never overwritten** (a conditional PUT, ``If-None-Match: *``; one request, so each
   is at most 5 GiB on S3): an append whose lock was broken while it ran cannot overwrite a shard another append
   published. Before the index goes up, each object is looked at again and must still have the ETag its PUT
   returned.
4. **The index last, if it is still the one read** (``If-Match`` with its ETag read at the start). A reader sees
   the old store until that PUT and the new one after it: old shards are never rewritten, so a reader that opened
   the old index keeps reading its rows. A refused PUT is REMOTE_OBJECT_CHANGED: nothing was published.

Any failure before step 4 succeeds leaves the index as it was, the folders where they were, and removes the lock;
the objects already put are left, unlisted, for the next append to remove. A SIGKILL leaves the same, and the lock
object, and the private folder (``.umlos-append-*`` beside the first folder: a copy of the index and digests, to
remove).

**Breaking the lock** (``break_lock=True``, ``--break-lock``). An object store cannot tell a dead holder from a
live one (there is no ``flock`` the kernel drops when its process dies), so no timeout is guessed: the user, who
knows the holder is gone (its process is not on its host any more), says so. A lock broken while its holder still
runs is caught at the holder's publish: its ``If-Match`` fails once another append published (step 4), or an
object it put was removed and created again by another (step 3), and it publishes nothing; neither writes over an
object the other created. What cannot be ruled out is another append removing and recreating one of the holder's
objects in the one request between the holder's last look (step 3) and its index PUT. Break a lock only when its
holder is gone.

``data tokenize --append --output URL`` (:func:`tokenize_append_remote`) is the same session around the disk
``tokenize_sharded(..., append=True)``, its private folder in the temporary folder.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from .. import checks, errors
from ..batching.tokens.adopt import INDEX_FILE, append_shards
from ..batching.tokens.index import (DIGESTS_FOLDER, INDEX_WHAT, MAX_INDEX_BYTES, SHARDS_FOLDER, check_index,
                                     digests_name, id_hashes_name, invalid, shard_name)
from ..batching.tokens.logical import ShardedTokenStore
from ..batching.tokens.rows import DIGEST_BYTES
from ..batching.tokens.store import TokenStore
from ..errors import UmlosError
from ..files import reader
from ..files.artifacts import MARKER, MARKER_LIMIT
from ..files.atomic import write_failed
from ..files.folder import Folder
from .bounded import read_object_bytes
from .client import RemoteObject, RetryBudget, client_store, list_objects, remote_error, retrying
from .inputs import copy_object
from .publish import putter
from .sharded import RemoteShardedStore
from .urls import ObjectUrl, parse_url

#: The lock object's name under the prefix (the disk store's lock file has the same name).
LOCK = ".lock"
#: A lock object is a small JSON object; anything larger is not one of ours and is never fetched.
MAX_LOCK_BYTES = 4096
#: The most objects a shard prefix may hold when the id check fetches it (a token store has 7 files).
MAX_SHARD_OBJECTS = 64


@dataclass(frozen=True)
class Appended:
    """What an append into an object store did: the store as published, and the holder of the lock it broke (None
    when it broke none)."""

    store: RemoteShardedStore
    broken: str | None


def append_remote(url: str, folders: Sequence[str | os.PathLike[str]], *, break_lock: bool = False,
                  budget: RetryBudget | None = None) -> Appended:
    """Adopt the token store ``folders`` (in order) as the next shards of the sharded store at ``url`` (module
    docstring: ``data append URL STORE...``); ``break_lock`` removes the lock object first (its holder is gone:
    the user says so)."""
    paths = [os.path.abspath(os.fspath(folder)) for folder in folders]
    if not paths:
        raise UmlosError(errors.INVALID_ARGUMENT, "data append needs at least one token store to adopt",
                         operator=errors.BATCHING_OPERATOR)
    for path in paths:  # a mistyped folder is refused before the store is locked (the append opens them again)
        TokenStore.open(path)
    with _session(url, break_lock, budget, beside=os.path.dirname(paths[0])) as session:
        local = append_shards(session.root, paths, opener=session.opener)
        # The folders go back where they were at once (a rename each), and are put from there: a process killed
        # while it puts them leaves them where the user had them, for the same command to adopt again.
        shards = dict(enumerate(paths, session.first))
        for number, path in shards.items():
            os.rename(local.shard_path(number), path)
        store = session.publish(local, shards)
        for path in paths:  # published: moved into the store, as a disk append moves them
            shutil.rmtree(path, ignore_errors=True)
        return Appended(store, session.broken)


def tokenize_append_remote(url: str, dataset: Any, tokenizer: Any, *, break_lock: bool = False,
                           budget: RetryBudget | None = None, **options: Any) -> Appended:
    """Tokenize the input files of ``dataset`` as the next shards of the sharded store at ``url``
    (``data tokenize --append --output URL``: :func:`~umlos_cuda.batching.tokens.partition.tokenize_sharded` with
    ``append``, on the private folder; ``options`` are its own), then publish them as :func:`append_remote` does."""
    from ..batching.tokens.partition import tokenize_sharded

    with _session(url, break_lock, budget, beside=None) as session:
        local = tokenize_sharded(dataset, tokenizer, session.root, append=True, opener=session.opener, **options)
        store = session.publish(local, {number: local.shard_path(number)
                                        for number in range(session.first, local.num_parts)})
        return Appended(store, session.broken)


@dataclass
class _Session:
    """An append's hold on the store at ``target``: its lock taken, ``root`` the private folder holding what the
    disk append reads of it (``index``, as read at the start; ``first``, the number of its first new shard)."""

    target: ObjectUrl
    budget: RetryBudget
    root: str
    index: _Index
    broken: str | None

    @property
    def first(self) -> int:
        return len(json.loads(self.index.data)["shards"])

    def opener(self, path: str) -> ShardedTokenStore:
        """The disk append's reader of the private folder: a shard fetched when the id check opens it."""
        return _FetchingStore.open_fetching(path, self.target, self.budget)

    def publish(self, local: ShardedTokenStore, shards: dict[int, str]) -> RemoteShardedStore:
        """Steps 3 and 4 for what the disk append wrote (``shards``: new shard number to its folder), then the store
        opened from the URL, its index compared with the folder's."""
        _publish(self.target, local, shards, self.index, self.budget)
        published = RemoteShardedStore.open(str(self.target), budget=self.budget)
        if published.meta != local.meta:
            raise remote_error(errors.REMOTE_OBJECT_CHANGED, f"{self.index.obj.name} differs from the index this "
                               "append put, right after it was put: another writer published to the same prefix")
        return published


@contextlib.contextmanager
def _session(url: str, break_lock: bool, budget: RetryBudget | None, *, beside: str | None) -> Iterator[_Session]:
    """The store at ``url`` locked (its lock broken first with ``break_lock``), its index, marker and digests copied
    into a private folder (mode 0700, in ``beside``, else the temporary folder) and an interrupted append's objects
    removed; the folder removed and the lock released when the block ends."""
    target = parse_url(url)
    budget = budget if budget is not None else RetryBudget()
    _index_object(target, budget)  # no store there: refused before the lock is taken (a lock object is a write)
    lock = _Lock(target, budget)
    broken = lock.break_() if break_lock else None
    lock.take()
    try:
        try:
            work = tempfile.mkdtemp(prefix=".umlos-append-", dir=beside)
        except OSError as exc:
            raise write_failed(os.path.join(beside or tempfile.gettempdir(), ".umlos-append-*"), exc) from exc
        try:
            root = os.path.join(work, "store")
            index = _mirror(target, root, budget)
            session = _Session(target, budget, root, index, broken)
            _remove_leftovers(target, session.first, index, budget)
            yield session
        finally:
            shutil.rmtree(work, ignore_errors=True)
    finally:
        lock.release()


# ---------------------------------------------------------------------- the lock
class _Lock:
    """The lock object ``PREFIX/.lock`` (module docstring, step 1)."""

    def __init__(self, target: ObjectUrl, budget: RetryBudget) -> None:
        self.target, self.budget = target, budget
        self.key = target.key(LOCK)
        self.name = target.name(self.key)
        self.store = client_store(target, budget)
        started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        self.body = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": started,
                                "token": uuid.uuid4().hex}, sort_keys=True).encode()
        self.held = False

    def take(self) -> None:
        """Create the lock object; SHARDED_STORE_LOCKED naming it and its holder when it exists."""
        import obstore
        from obstore.exceptions import AlreadyExistsError

        def create() -> None:
            try:
                obstore.put(self.store, self.key, self.body, mode="create")
            except AlreadyExistsError:
                try:
                    mine = self._current() == self.body  # a retry after a reply lost finds this process's own lock
                except (FileNotFoundError, UmlosError):
                    mine = False
                if not mine:
                    raise self._locked() from None

        retrying(create, self.name, self.budget, verb="writing")
        self.held = True

    def release(self) -> None:
        """Remove the lock object when it is still this process's (a lock broken and taken by another append is
        that append's)."""
        import obstore

        if not self.held:
            return
        self.held = False
        with contextlib.suppress(UmlosError, FileNotFoundError):
            if self._current() == self.body:
                retrying(lambda: obstore.delete(self.store, self.key), self.name, self.budget, verb="removing")

    def break_(self) -> str | None:
        """Remove the lock object; who held it (None when there was none)."""
        import obstore

        try:
            holder = self._holder(self._current())
        except FileNotFoundError:
            return None
        except UmlosError:  # over its cap: never fetched, removed all the same
            holder = _UNNAMED
        retrying(lambda: obstore.delete(self.store, self.key), self.name, self.budget, verb="removing")
        return holder

    def _current(self) -> bytes:
        """The lock object's bytes now (FileNotFoundError when there is none); refused over its cap."""
        obj = RemoteObject.open(self.target, self.key, self.budget)
        return read_object_bytes(obj, _lock_error, max_bytes=MAX_LOCK_BYTES, what="append lock")

    def _locked(self) -> UmlosError:
        try:
            holder = self._holder(self._current())
        except FileNotFoundError:
            holder = "an append that has just finished"
        except UmlosError:  # over its cap: never fetched
            holder = _UNNAMED
        store = str(self.target)
        return UmlosError(errors.SHARDED_STORE_LOCKED, f"{store} is being appended to: {self.name} exists, held by "
                          f"{holder}; one writer at a time: nothing was done, run this append again when that one has "
                          "finished. An object store cannot tell a dead holder from a live one: if that append was "
                          f"killed (its process is gone from its host), run `umlos-cuda data append {store} STORE... "
                          "--break-lock`", operator=errors.BATCHING_OPERATOR)

    def _holder(self, data: bytes) -> str:
        """``data`` (a lock object's bytes) as a message names its holder."""
        try:
            body = reader.loads_json(data, _lock_error, self.name)
        except UmlosError:
            body = None
        if not isinstance(body, dict) or not all(isinstance(body.get(name), (str, int)) for name in
                                                 ("host", "pid", "started")):
            return _UNNAMED
        return f"process {body['pid']} on host {body['host']!r} since {body['started']}"


_UNNAMED = "a writer this append cannot name (the lock object is not one umlos-cuda wrote)"


def _lock_error(message: str) -> UmlosError:
    return UmlosError(errors.SHARDED_STORE_LOCKED, message, operator=errors.BATCHING_OPERATOR)


# ---------------------------------------------------------------------- what the disk append reads
@dataclass(frozen=True)
class _Index:
    """The index as read at the start: its object (size and ETag) and bytes."""

    obj: RemoteObject
    data: bytes


def _mirror(target: ObjectUrl, root: str, budget: RetryBudget) -> _Index:
    """``root`` made to hold the store's index, marker, empty ``shards/`` and its ``digests/``: what the disk
    append reads of a store (module docstring); each object refused over its cap before it is fetched."""
    obj = _index_object(target, budget)
    if obj.info.etag is None:
        raise remote_error(errors.REMOTE_UNAVAILABLE, f"{obj.name} has no ETag: an append replaces the index only "
                           "if it is still the one it read (If-Match), which this store cannot do; append on disk")
    data = read_object_bytes(obj, invalid, max_bytes=MAX_INDEX_BYTES, what=INDEX_WHAT)
    meta = check_index(reader.loads_json(data, invalid, obj.name), obj.name)
    os.mkdir(root, 0o700)
    with Folder.open(root) as folder:
        folder.write_bytes(INDEX_FILE, data)
        _fetch(target, MARKER, MARKER_LIMIT, folder, [], budget)
        folder.mkdir(SHARDS_FOLDER).close()
        with folder.mkdir(DIGESTS_FOLDER):
            pass
        for number, entry in enumerate(meta["shards"]):
            rows = entry["num_samples"]
            for name, size in ((digests_name(number), rows * DIGEST_BYTES), (id_hashes_name(number), rows * 8)):
                _fetch(target, f"{DIGESTS_FOLDER}/{name}", size + reader.MAX_NPY_HEADER_BYTES + 12, folder,
                       [DIGESTS_FOLDER], budget)
    return _Index(obj, data)


def _index_object(target: ObjectUrl, budget: RetryBudget) -> RemoteObject:
    """The store's index object (its size and ETag read now); TOKEN_STORE_NOT_FOUND when there is none."""
    key = target.key(INDEX_FILE)
    try:
        return RemoteObject.open(target, key, budget)
    except FileNotFoundError:
        raise UmlosError(errors.TOKEN_STORE_NOT_FOUND, f"no sharded token store at {target}: {target.name(key)} does "
                         "not exist (publish one first: write it on disk with `umlos-cuda data tokenize --sharded` "
                         "and copy it there, files as they are)", operator=errors.BATCHING_OPERATOR) from None


def _fetch(target: ObjectUrl, relative: str, max_bytes: int, folder: Folder, folders: list[str],
           budget: RetryBudget) -> None:
    """The object ``relative`` under the prefix copied to ``folder/folders.../<its name>``, refused
    (SHARDED_STORE_INVALID) when it is missing or over ``max_bytes``, before its body is fetched."""
    try:
        obj = RemoteObject.open(target, target.key(relative), budget)
    except FileNotFoundError:
        raise invalid(f"{target.name(target.key(relative))} is missing: the store's index needs it") from None
    reader.check_size(obj.name, obj.size, max_bytes, relative, invalid)
    copy_object(obj, folder, folders, relative.rsplit("/", 1)[-1], error=_copy_failed)


def _copy_failed(message: str) -> UmlosError:
    return UmlosError(errors.OUTPUT_WRITE_FAILED, message, operator=errors.REMOTE_OPERATOR)


class _FetchingStore(ShardedTokenStore):
    """The store as the disk append reads it from the private folder: a shard is fetched into it when the id check
    opens it (its folder is empty until then)."""

    target: ObjectUrl
    budget: RetryBudget

    @classmethod
    def open_fetching(cls, path: str, target: ObjectUrl, budget: RetryBudget) -> _FetchingStore:
        store = cls.open(path)
        assert isinstance(store, _FetchingStore)
        store.target, store.budget = target, budget
        return store

    def _open_shard(self, index: int):
        name = self.meta["shards"][index]["name"]
        if not os.path.lexists(self.shard_path(index)):
            _fetch_shard(self.target, f"{SHARDS_FOLDER}/{name}", self.root, self.budget)
        return super()._open_shard(index)


def _fetch_shard(target: ObjectUrl, relative: str, root: str, budget: RetryBudget) -> None:
    """Every object under ``PREFIX/relative/`` copied into ``root/relative/``: at most
    :data:`MAX_SHARD_OBJECTS`, each a plain name (a shard is a flat folder), else SHARDED_STORE_INVALID."""
    below = target.key(relative) + "/"
    found = list_objects(target, below, target.name(below), budget, most=MAX_SHARD_OBJECTS)
    names = [key[len(below):] for key, _ in found]
    if len(found) > MAX_SHARD_OBJECTS or any(name in ("", ".", "..") or "/" in name for name in names):
        raise invalid(f"{target.name(below)} is not a shard: a shard is a flat folder of a token store's files "
                      f"(at most {MAX_SHARD_OBJECTS})")
    with Folder.open(root) as folder:
        for (key, info), name in zip(found, names):
            obj = RemoteObject(target, key, info, budget)
            copy_object(obj, folder, relative.split("/"), name, error=_copy_failed)


# ---------------------------------------------------------------------- leftovers and publishing
def _remove_leftovers(target: ObjectUrl, listed: int, index: _Index, budget: RetryBudget) -> None:
    """Step 2: the shard and digest objects of shard numbers ``listed`` and above (an interrupted append's),
    removed once the index is checked to be the one read (the lock is held)."""
    import obstore

    store = client_store(target, budget)
    keys: list[str] = []
    for folder in (SHARDS_FOLDER, DIGESTS_FOLDER):
        below = target.key(folder) + "/"
        for key, _ in list_objects(target, below, target.name(below), budget):
            head = key[len(below):].split("/", 1)[0].split(".", 1)[0]  # shards/NNNNN/..., digests/NNNNN(.ids).npy
            number = checks.integer_or_none(head)
            if number is not None and head == shard_name(number) and number >= listed:
                keys.append(key)
    if not keys:
        return
    _check_index_unchanged(index, budget)
    for key in keys:
        retrying(partial(obstore.delete, store, key), target.name(key), budget, verb="removing")


def _check_index_unchanged(index: _Index, budget: RetryBudget) -> None:
    """REMOTE_OBJECT_CHANGED unless the index still has the ETag it was read with."""
    now = RemoteObject.open(index.obj.url, index.obj.key, budget)
    if now.info.etag != index.obj.info.etag:
        raise _index_changed(index.obj.name)


def _index_changed(name: str) -> UmlosError:
    return remote_error(errors.REMOTE_OBJECT_CHANGED, f"{name} was replaced since this append read it (another "
                        "append published meanwhile: a lock broken while its holder ran?); nothing was published, "
                        "the folders to adopt are where they were: run this append again")


def _publish(target: ObjectUrl, local: ShardedTokenStore, shards: dict[int, str], index: _Index,
             budget: RetryBudget) -> None:
    """Steps 3 and 4: the new shards' files (from ``shards``: number to folder) and digests created under the
    prefix, looked at again, then the index put if it is still the one read."""
    import obstore
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    store = client_store(target, budget)
    put: dict[str, str | None] = {}
    for number, folder in shards.items():
        names = sorted(os.listdir(folder))
        files = [(f"{SHARDS_FOLDER}/{shard_name(number)}/{name}", os.path.join(folder, name))
                 for name in [*(name for name in names if name != INDEX_FILE), INDEX_FILE]]
        files += [(f"{DIGESTS_FOLDER}/{name}", os.path.join(local.root, DIGESTS_FOLDER, name))
                  for name in (digests_name(number), id_hashes_name(number))]
        for name, path in files:
            key = target.key(name)
            create = putter(store, key, path, mode="create", use_multipart=False)

            def created(create=create, key=key) -> Any:
                try:
                    return create()
                except AlreadyExistsError:
                    raise remote_error(errors.REMOTE_OBJECT_CHANGED, f"{target.name(key)} appeared while this "
                                       "append ran (another writer: a lock broken while its holder ran?); nothing "
                                       "was published: run this append again") from None

            put[key] = retrying(created, target.name(key), budget, verb="writing").get("e_tag")
    for key, etag in put.items():  # step 3: still this append's own objects
        if RemoteObject.open(target, key, budget).info.etag != etag:
            raise remote_error(errors.REMOTE_OBJECT_CHANGED, f"{target.name(key)} was replaced after this append "
                               "put it (another writer: a lock broken while its holder ran?); nothing was "
                               "published: run this append again")
    data = reader.read_bytes(os.path.join(local.root, INDEX_FILE), invalid, max_bytes=MAX_INDEX_BYTES,
                             what=INDEX_WHAT)

    def replace_index() -> None:
        try:
            obstore.put(store, index.obj.key, data, mode={"e_tag": index.obj.info.etag})
        except PreconditionError:
            if read_object_bytes(RemoteObject.open(target, index.obj.key, budget), invalid,
                                 max_bytes=MAX_INDEX_BYTES, what=INDEX_WHAT) != data:  # a retry finds its own
                raise _index_changed(index.obj.name) from None

    retrying(replace_index, index.obj.name, budget, verb="writing")

