"""Token stores in object stores (s3://, gs://, az://, file://), read by byte ranges, ahead of use, in plan order.

What goes in: the URL of a token store (flat or sharded), a Megatron prefix or a length sidecar copied into an
object store as it was written. What comes out: a token (or length) source (``arrays(row)``, ``lengths``,
``tokenizer_hash``) that the source layer opens like a folder (``open_source("s3://...")``,
``TokenDataset("s3://...")``), and a planned cache that reads a rank's rows in the order its sampler hands them
out (docs/object-stores.md).

Modules:
    urls     which paths are remote; their scheme, bucket and prefix
    client   the client library's store, objects opened with their ETag and size, ranges read under a retry budget
    bounded  the bounded reader's rules on objects: JSON capped before its GET, ``.npy`` headers against sizes
    store    :class:`RemoteTokenStore`: the flat token store's files, read by ranges
    sharded  :class:`RemoteShardedStore`: a sharded store's index, checked as on disk, each shard a remote store
    megatron :class:`RemoteMegatron`: a Megatron-LM pair, its ``.idx`` read bounded, its ``.bin`` by ranges
    lengths  :class:`RemoteSidecar`: a length cache's ``.u32`` sidecar, its header read bounded, its lengths once
    kinds    which kind a URL names (a suffix, a marker, an ``.idx``): :func:`open_remote_store`
    objects  a store's object table: each part's tokens and loss mask numbered, where each row's bytes lie
    belady   Belady's rule over a known sequence of block references (a pure function)
    planned  :class:`PlannedTokenSource`: a rank's rows, each block fetched ahead and evicted by Belady's rule
    blockfiles  the planned cache's disk tier: verified block files in a folder processes share, one fetch each
    publish  a store written on disk put under a prefix, its ``meta.json`` last (``data tokenize --output s3://``)
    append   a sharded store's next shards: the disk append on a private copy, then put, the index last (If-Match),
             one appender at a time by a lock object (``data append s3://...``)
"""

from .belady import Schedule, belady
from .client import RetryBudget
from .kinds import open_remote_store
from .lengths import RemoteSidecar
from .megatron import RemoteMegatron
from .planned import PlannedTokenSource
from .publish import publish_store
from .sharded import RemoteShardedStore
from .store import RemoteTokenStore
from .urls import ObjectUrl, is_remote, parse_url

__all__ = ["ObjectUrl", "PlannedTokenSource", "RemoteMegatron", "RemoteShardedStore", "RemoteSidecar",
           "RemoteTokenStore", "RetryBudget", "Schedule", "belady", "is_remote", "open_remote_store", "parse_url",
           "publish_store"]
