"""A token store published into an object store so that no reader ever sees it half-written: its index last.

What goes in: a token store folder written on disk (``umlos-cuda data tokenize``: the writer's own checks and
atomic files), and the URL it is to be read from. What comes out: the store's files under the URL's prefix,
``meta.json`` put after every other file, then the store opened from there
(:class:`~.store.RemoteTokenStore`) and checked to hold what the folder holds.

An object store has no rename, so the sharded store's rule on disk (write aside, publish by writing the
index last) becomes: a store is there when its ``meta.json`` is (a reader finds TOKEN_STORE_NOT_FOUND before),
and ``meta.json`` is put only once every array it describes is in place. A prefix that already holds a
``meta.json`` is OUTPUT_EXISTS unless ``force``; with ``force`` its ``meta.json`` is removed first (the old
store is gone for new readers, and one that had it open fails with REMOTE_OBJECT_CHANGED on its next read,
never with a mix of the two stores), then the files are put, ``meta.json`` last. Each file is read through the
bounded reader (regular files only) and streamed whole, under the :class:`~.client.RetryBudget`; a put that fails
past it is REMOTE_REQUEST_FAILED and leaves no ``meta.json``, so no store.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from .. import errors
from ..errors import UmlosError
from ..files import reader
from .client import RemoteObject, RetryBudget, client_store, remote_error, retrying
from .store import RemoteTokenStore
from .urls import parse_url

#: The file put last: a store is there once it is.
INDEX = "meta.json"


def _not_a_store(message: str) -> UmlosError:
    return UmlosError(errors.TOKEN_STORE_INVALID, message, operator=errors.REMOTE_OPERATOR)


def putter(store: Any, key: str, path: str, **options: Any) -> Callable[[], Any]:
    """A whole PUT of the regular file ``path`` at ``key``, the file opened again on each try and streamed
    (the client library splits a large file into parts unless ``options`` ask for a conditional PUT, which is
    one request); ``options`` go to ``obstore.put`` (``mode``: remote/append.py's conditional PUTs)."""
    import obstore

    def put() -> Any:
        with reader.open_regular(path, _not_a_store) as handle:
            return obstore.put(store, key, handle, **options)

    return put


def publish_store(folder: str | os.PathLike[str], url: str, *, force: bool = False,
                  budget: RetryBudget | None = None) -> RemoteTokenStore:
    """The token store in ``folder`` put under ``url``, its ``meta.json`` last (module docstring), opened from
    there and checked against the folder's ``meta.json``."""
    import obstore

    folder = os.fspath(folder)
    target = parse_url(url)
    budget = budget if budget is not None else RetryBudget()
    store = client_store(target, budget)
    names = sorted(name for name in os.listdir(folder) if os.path.isfile(os.path.join(folder, name)))
    if INDEX not in names:
        raise _not_a_store(f"{folder} holds no {INDEX}: it is not a token store to publish")
    index_key = target.key(INDEX)
    try:
        RemoteObject.open(target, index_key, budget)
        exists = True
    except FileNotFoundError:
        exists = False
    if exists and not force:
        raise remote_error(errors.OUTPUT_EXISTS, f"{target.name(index_key)} exists: a token store is published "
                           "there; give --force to replace it (readers that have it open then fail with "
                           "REMOTE_OBJECT_CHANGED), or another prefix")
    if exists:
        retrying(lambda: obstore.delete(store, index_key), target.name(index_key), budget, verb="removing")
    for name in [name for name in names if name != INDEX] + [INDEX]:
        path, key = os.path.join(folder, name), target.key(name)
        retrying(putter(store, key, path), target.name(key), budget, verb="writing")
    published = RemoteTokenStore.open(str(target), budget=budget)
    local = reader.read_json(os.path.join(folder, INDEX), _not_a_store)
    if published.meta != local:
        raise remote_error(errors.REMOTE_OBJECT_CHANGED, f"{target.name(index_key)} differs from {folder}/{INDEX} "
                           "right after it was put: another writer published to the same prefix")
    return published
