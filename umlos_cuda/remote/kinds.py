"""Which kind of token source a URL names: a Megatron pair by its suffix or its ``.idx``, a store by its marker.

What goes in: the URL of a prefix (``s3://bucket/prefix``). What comes out, tried in this order, as the source
layer tries a local path (tokens/sources.py):

* a URL ending in ``.idx`` or ``.bin``: the Megatron-LM pair of that prefix (:class:`~.megatron.RemoteMegatron`);
* a prefix whose ``umlos-artifact.json`` (files/artifacts.py) names a sharded token store (which always carries
  its marker): a :class:`~.sharded.RemoteShardedStore`;
* a prefix with a ``meta.json``: a flat token store (:class:`~.store.RemoteTokenStore`; it carries a marker
  since markers exist, or none when written before them);
* a prefix without one where ``PREFIX.idx`` exists: the Megatron-LM pair; else TOKEN_STORE_NOT_FOUND, saying
  that neither is there.

Reading the marker costs a HEAD (and a GET of at most :data:`~umlos_cuda.files.artifacts.MARKER_LIMIT` bytes
when it is there); an object over that size is no marker and is never fetched.
"""

from __future__ import annotations

from .. import errors
from ..batching.tokens.adopt import SHARDED_STORE
from ..batching.tokens.megatron import UNKNOWN_TOKENIZER
from ..errors import UmlosError
from ..files.artifacts import MARKER, MARKER_LIMIT, marker_artifact
from .client import RemoteObject, RetryBudget
from .megatron import RemoteMegatron
from .sharded import RemoteShardedStore
from .store import RemoteTokenStore
from .urls import ObjectUrl, parse_url

RemoteSource = RemoteTokenStore | RemoteShardedStore | RemoteMegatron


def marked_kind(url: ObjectUrl, budget: RetryBudget) -> str | None:
    """The artifact name the marker under ``url`` states, or None when there is none (or it is no marker)."""
    try:
        marker = RemoteObject.open(url, url.key(MARKER), budget)
    except FileNotFoundError:
        return None
    if marker.size > MARKER_LIMIT:
        return None
    return marker_artifact(marker.read(0, marker.size))


def _exists(url: ObjectUrl, key: str, budget: RetryBudget) -> bool:
    try:
        RemoteObject.open(url, key, budget)
    except FileNotFoundError:
        return False
    return True


def open_remote_store(path: str, *, budget: RetryBudget | None = None,
                      tokenizer_hash: str = UNKNOWN_TOKENIZER) -> RemoteSource:
    """The token source at ``path`` (module docstring); ``tokenizer_hash`` names a Megatron pair's tokenizer (its
    index records none)."""
    budget = budget if budget is not None else RetryBudget()
    if path.endswith((".idx", ".bin")):
        return RemoteMegatron.open(path, tokenizer_hash=tokenizer_hash, budget=budget)
    url = parse_url(path)
    if marked_kind(url, budget) == SHARDED_STORE.name:
        return RemoteShardedStore.open(path, budget=budget)
    try:
        return RemoteTokenStore.open(path, budget=budget)
    except UmlosError as exc:
        if exc.code != errors.TOKEN_STORE_NOT_FOUND or not url.prefix:
            raise
        if not _exists(url, url.prefix + ".idx", budget):
            raise UmlosError(exc.code, f"{exc.message}; nor is it the prefix of a Megatron dataset "
                             f"({url.name(url.prefix + '.idx')} does not exist either)",
                             operator=exc.record["failure_operator"]) from None
    return RemoteMegatron.open(path, tokenizer_hash=tokenizer_hash, budget=budget)
