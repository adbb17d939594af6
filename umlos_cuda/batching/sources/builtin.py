"""The source kinds of this release, in the order a path is tried against them.

==================== ============================================ ==========================================
kind                 a path is one when                           it opens as (read by rows)
==================== ============================================ ==========================================
remote length        an object-store URL ending in ``.u32`` (or   ``RemoteSidecar``, its bytes hashed (not on
sidecar              ``.jsonl``: refused, saying to give the      reopening)
                     sidecar's)
remote token store   an ``s3://``, ``gs://``, ``az://``, ``file://``  ``StoreLengths`` over a ``RemoteTokenStore``
                     URL (umlos_cuda/remote/urls.py)              (its offsets read at opening), or
                                                                  ``ShardedLengths`` over a ``RemoteShardedStore``
                                                                  when the prefix's marker says sharded, or a
                                                                  ``RemoteMegatron`` for a Megatron prefix
                                                                  (umlos_cuda/remote/kinds.py)
sharded token store  a folder carrying the sharded store's marker ``ShardedLengths`` (tokens/offsets.py)
token store          any other folder                             ``StoreLengths`` (tokens/offsets.py)
Megatron prefix      ``PREFIX.idx`` exists (``.idx``/``.bin`` ok) ``MappedMegatron`` (tokens/mapped.py)
length sidecar       its name ends in ``.u32``                    ``MappedLengths``, its bytes hashed (not on reopening)
length cache         any other path                               its sidecar mapped, checked against the JSONL
==================== ============================================ ==========================================

The remote kinds are tried first because their test is the path's text alone (nothing on disk is asked about a
URL). The remote token store and the three after it are token sources; the length cache comes last because it
takes any file (a path that is none of the others is read as one, and its reader says what is wrong with it).
"""

from __future__ import annotations

import os

from ... import errors
from ...errors import UmlosError
from ..lengths.cache import SIDECAR_SUFFIX, LengthCache
from ..lengths.sources import LengthSource, MappedLengths, open_length_cache, open_sidecar
from ..tokens.logical import ShardedTokenStore
from ..tokens.mapped import MappedMegatron
from ..tokens.megatron import idx_path
from ..tokens.offsets import ShardedLengths, StoreLengths
from ..tokens.sources import is_sharded_store, megatron_prefix, open_token_source
from ..tokens.store import TokenStore
from ...remote.kinds import open_remote_store
from ...remote.lengths import RemoteSidecar, is_remote_length_cache, open_remote_length_cache
from ...remote.megatron import RemoteMegatron
from ...remote.sharded import RemoteShardedStore
from ...remote.urls import is_remote
from .kind import SourceKind


def _token_cache(path: str, read_ids: bool) -> LengthCache:
    """A token source's own length cache (a sharded store's is its shards', in order, under its logical dataset
    hash; a Megatron prefix names its rows by number)."""
    return open_token_source(path).length_cache()


def _sidecar_cache(path: str, read_ids: bool) -> LengthCache:
    """The length cache a sidecar mirrors: the JSONL beside it (the sidecar alone holds no ids or tokenizer)."""
    jsonl = path[:-len(SIDECAR_SUFFIX)]
    if not os.path.isfile(jsonl):
        raise UmlosError(errors.LENGTHS_INVALID, f"{path} is a length sidecar, which holds lengths only; a whole plan "
                         f"also records each row's id and the tokenizer, from the length cache it mirrors ({jsonl}), "
                         "which is not there: give that cache, or plan windows (--window), which read the sidecar "
                         "alone", operator=errors.BATCH_PLAN_OPERATOR)
    return LengthCache.load(jsonl, read_ids=read_ids)


def _remote_lengths(path: str) -> LengthSource:
    """The lengths of the token source at the URL ``path``: a Megatron pair (read by rows already), or a token
    store, sharded or flat as its marker says (umlos_cuda/remote/kinds.py)."""
    source = open_remote_store(path)
    if isinstance(source, RemoteMegatron):
        return source
    return ShardedLengths(source) if isinstance(source, RemoteShardedStore) else StoreLengths(source)


REMOTE_LENGTH_CACHE = SourceKind("remote length sidecar", is_remote_length_cache, open_remote_length_cache,
                                 reopen=RemoteSidecar)
REMOTE_TOKEN_STORE = SourceKind("remote token store", is_remote, _remote_lengths, tokens=True)
SHARDED_STORE = SourceKind("sharded token store", is_sharded_store,
                           lambda path: ShardedLengths(ShardedTokenStore.open(path)), tokens=True, whole=_token_cache)
TOKEN_STORE = SourceKind("token store", os.path.isdir, lambda path: StoreLengths(TokenStore.open(path)), tokens=True,
                         whole=_token_cache)
MEGATRON_PREFIX = SourceKind("Megatron prefix", lambda path: os.path.lexists(idx_path(megatron_prefix(path))),
                             lambda path: MappedMegatron(megatron_prefix(path)), tokens=True, whole=_token_cache)
LENGTH_SIDECAR = SourceKind("length sidecar", lambda path: path.endswith(SIDECAR_SUFFIX), open_sidecar,
                            reopen=MappedLengths, whole=_sidecar_cache)
LENGTH_CACHE = SourceKind("length cache", lambda path: True, open_length_cache,
                          whole=lambda path, read_ids: LengthCache.load(path, read_ids=read_ids))

#: Tried in this order, after every kind registered at run time.
BUILT_IN = (REMOTE_LENGTH_CACHE, REMOTE_TOKEN_STORE, SHARDED_STORE, TOKEN_STORE, MEGATRON_PREFIX, LENGTH_SIDECAR,
            LENGTH_CACHE)
