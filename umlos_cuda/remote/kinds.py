"""Which kind of token store a prefix in an object store holds: its marker says, as a folder's does.

What goes in: the URL of a prefix (``s3://bucket/prefix``). What comes out: the store opened as what its
``umlos-artifact.json`` names (files/artifacts.py): a :class:`~.sharded.RemoteShardedStore` for a sharded
token store (which always carries its marker), else a :class:`~.store.RemoteTokenStore` (a flat store, which
carries one since markers exist, or none when written before them).

Reading the marker costs a HEAD (and a GET of at most :data:`~umlos_cuda.files.artifacts.MARKER_LIMIT` bytes
when it is there); an object over that size is no marker and is never fetched.
"""

from __future__ import annotations

from ..batching.tokens.adopt import SHARDED_STORE
from ..files.artifacts import MARKER, MARKER_LIMIT, marker_artifact
from .client import RemoteObject, RetryBudget
from .sharded import RemoteShardedStore
from .store import RemoteTokenStore
from .urls import ObjectUrl, parse_url


def marked_kind(url: ObjectUrl, budget: RetryBudget) -> str | None:
    """The artifact name the marker under ``url`` states, or None when there is none (or it is no marker)."""
    try:
        marker = RemoteObject.open(url, url.key(MARKER), budget)
    except FileNotFoundError:
        return None
    if marker.size > MARKER_LIMIT:
        return None
    return marker_artifact(marker.read(0, marker.size))


def open_remote_store(path: str, *, budget: RetryBudget | None = None) -> RemoteTokenStore | RemoteShardedStore:
    """The token store at ``path``, sharded or flat as its marker says (module docstring)."""
    budget = budget if budget is not None else RetryBudget()
    if marked_kind(parse_url(path), budget) == SHARDED_STORE.name:
        return RemoteShardedStore.open(path, budget=budget)
    return RemoteTokenStore.open(path, budget=budget)
