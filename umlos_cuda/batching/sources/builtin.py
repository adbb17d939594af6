"""The source kinds of this release, in the order a path is tried against them.

==================== ============================================ ==========================================
kind                 a path is one when                           it opens as (read by rows)
==================== ============================================ ==========================================
sharded token store  a folder carrying the sharded store's marker ``ShardedLengths`` (tokens/offsets.py)
token store          any other folder                             ``StoreLengths`` (tokens/offsets.py)
Megatron prefix      ``PREFIX.idx`` exists (``.idx``/``.bin`` ok) ``MappedMegatron`` (tokens/mapped.py)
length sidecar       its name ends in ``.u32``                    ``MappedLengths``, its bytes hashed (not on reopening)
length cache         any other path                               its sidecar mapped, checked against the JSONL
==================== ============================================ ==========================================

The first three are token sources; the length cache comes last because it takes any file (a path that is
none of the others is read as one, and its reader says what is wrong with it).
"""

from __future__ import annotations

import os

from ..lengths.cache import SIDECAR_SUFFIX
from ..lengths.sources import MappedLengths, open_length_cache, open_sidecar
from ..tokens.logical import ShardedTokenStore
from ..tokens.mapped import MappedMegatron
from ..tokens.megatron import idx_path
from ..tokens.offsets import ShardedLengths, StoreLengths
from ..tokens.sources import is_sharded_store, megatron_prefix
from ..tokens.store import TokenStore
from .kind import SourceKind

SHARDED_STORE = SourceKind("sharded token store", is_sharded_store,
                           lambda path: ShardedLengths(ShardedTokenStore.open(path)), tokens=True)
TOKEN_STORE = SourceKind("token store", os.path.isdir, lambda path: StoreLengths(TokenStore.open(path)), tokens=True)
MEGATRON_PREFIX = SourceKind("Megatron prefix", lambda path: os.path.lexists(idx_path(megatron_prefix(path))),
                             lambda path: MappedMegatron(megatron_prefix(path)), tokens=True)
LENGTH_SIDECAR = SourceKind("length sidecar", lambda path: path.endswith(SIDECAR_SUFFIX), open_sidecar,
                            reopen=MappedLengths)
LENGTH_CACHE = SourceKind("length cache", lambda path: True, open_length_cache)

#: Tried in this order, after every kind registered at run time.
BUILT_IN = (SHARDED_STORE, TOKEN_STORE, MEGATRON_PREFIX, LENGTH_SIDECAR, LENGTH_CACHE)
