"""Where collation reads tokens from: a token store, a sharded token store or Megatron-LM indexed datasets.

What goes in: a path, a token store folder (``umlos-cuda data tokenize``), the URL of one (flat or sharded)
or of a Megatron prefix copied into an object store (``s3://bucket/prefix``: umlos_cuda/remote/),
a sharded token store folder (``data tokenize --sharded``: tokens/sharded.py),
the prefix of a Megatron ``.idx``/``.bin`` pair, or a list of such prefixes
(read as one dataset, like Megatron-LM's data path). What comes out: an
opened source. Every kind answers the same calls, with global row numbers
for the kinds made of parts (tokens/concat.py), which is all collation,
batch files and fingerprints use:

* ``len(source)``, ``source.lengths`` (uint32, dataset order),
  ``source.tokenizer_hash``, ``source.ids_are_line_numbers``,
  ``source.sample_id(row)``, ``source.length_cache()``;
* ``source.arrays(row)`` -> ``(input_ids, loss_mask)``, read-only views;
* ``source.verify()``: what the files can prove about themselves
  (:func:`verify_source`, run by default before batch files are derived).

A token id a command adds to what a source holds (``plan cut --eos``, ``batch generate
--separator-ids``) must be one the source can hold (:func:`check_token_ids`: below its ``vocab_size``,
else inside its token type), or the model fails hours later on a device-side assert.

Whether a source is the one a plan was built from is the plan's question
(``plans/integrity.py``, ``check_source_matches_plan``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ... import errors
from ...errors import UmlosError
from ...files.artifacts import marked_kind
from ...files.folder import Folder
from .adopt import SHARDED_STORE
from .logical import ShardedTokenStore
from .megatron import UNKNOWN_TOKENIZER, MegatronDataset, MegatronDatasetList, idx_path
from .store import TokenStore
from ...remote.kinds import open_remote_store
from ...remote.urls import is_remote


def is_sharded_store(path: str) -> bool:
    """Whether the folder ``path`` carries the sharded token store's marker (it always does)."""
    try:
        with Folder.open(path, follow=True) as folder:
            return marked_kind(folder) == SHARDED_STORE.name
    except OSError:
        return False


def megatron_prefix(path: str) -> str:
    """The Megatron prefix ``path`` names: itself, or without its ``.idx``/``.bin`` suffix."""
    return path[:-4] if path.endswith((".idx", ".bin")) else path


def open_token_source(path: Any, *, tokenizer_hash: str | None = None):
    """A :class:`TokenStore` for a folder (a :class:`ShardedTokenStore` when its marker says it is
    one), a :class:`MegatronDataset` for a prefix whose ``.idx`` exists, a
    :class:`MegatronDatasetList` for a list of prefixes (``tokenizer_hash`` names their tokenizer);
    an already opened source is returned as is."""
    if hasattr(path, "arrays") and hasattr(path, "lengths"):
        return path
    if isinstance(path, (list, tuple)):
        prefixes = [os.fspath(item) for item in path]
        if len(prefixes) == 1:
            return open_token_source(prefixes[0], tokenizer_hash=tokenizer_hash)
        return MegatronDatasetList.open(prefixes, **({} if tokenizer_hash is None
                                                     else {"tokenizer_hash": tokenizer_hash}))
    path = os.fspath(path)
    if is_remote(path):
        return open_remote_store(path, tokenizer_hash=tokenizer_hash or UNKNOWN_TOKENIZER)
    if os.path.isdir(path):
        if is_sharded_store(path):
            return ShardedTokenStore.open(path)
        return TokenStore.open(path)
    prefix = megatron_prefix(path)
    if os.path.lexists(idx_path(prefix)):  # anything else there is refused by the reader, saying what it is
        return MegatronDataset.open(prefix, **({} if tokenizer_hash is None else {"tokenizer_hash": tokenizer_hash}))
    raise UmlosError(errors.TOKEN_STORE_NOT_FOUND, f"{path} is neither a token store folder nor the prefix of a "
                     f"Megatron dataset ({idx_path(prefix)} does not exist)", operator=errors.BATCHING_OPERATOR)


def id_limit(source: Any) -> tuple[int, str] | None:
    """How many token ids ``source`` can hold (they are ``0 .. limit - 1``) and what says so: a store's
    ``vocab_size`` (its meta.json), else its token type (a store's ``token_dtype``, a Megatron pair's
    ``.idx`` dtype); None when the source says neither (a caller's own source). A length source over a
    store answers for its store, several sources (a list of them, Megatron prefixes read as one) for the
    narrowest of them."""
    parts = getattr(source, "parts", None) or getattr(source, "datasets", None)
    if isinstance(parts, list):
        limits = [id_limit(part) for part in parts]
        known = [limit for limit in limits if limit is not None]
        return min(known, key=lambda limit: limit[0]) if known and len(known) == len(limits) else None
    target = getattr(source, "store", source)
    vocab = getattr(target, "vocab_size", None)
    if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0:
        return vocab, "its vocab_size"
    meta = getattr(target, "meta", None)
    dtype = getattr(target, "dtype", None)
    if isinstance(meta, dict) and isinstance(meta.get("token_dtype"), str):
        dtype = np.dtype(meta["token_dtype"])
    if isinstance(dtype, np.dtype) and dtype.kind in "iu":
        return int(np.iinfo(dtype).max) + 1, f"its token type {dtype.name}"
    return None


def check_token_ids(ids: Iterable[int], source: Any, what: str, *, fail: Callable[[str], Exception]) -> tuple[int, ...]:
    """``ids`` (already integers) if ``source`` can hold each (:func:`id_limit`), else ``fail`` naming
    ``what`` (the flag), the id, the source and its limit. A source that states no limit takes any id."""
    ids = tuple(ids)
    limit = id_limit(source)
    if limit is None:
        return ids
    top, reason = limit
    for token in ids:
        if not 0 <= token < top:
            raise fail(f"{what} {token} is not a token id of {source_name(source)}: its ids are 0 to {top - 1} "
                       f"({reason}); give an id of the tokenizer that wrote it")
    return ids


def source_name(source: Any) -> str:
    """Where ``source`` was opened from, for a message: its ``origin``, root folder or prefix(es)."""
    for name in ("origin", "root", "prefix"):
        value = getattr(source, name, None)
        if isinstance(value, (str, os.PathLike)):
            return os.fspath(value)
        if isinstance(value, list) and value:
            return " + ".join(map(str, value))
    parts = getattr(source, "parts", None)
    if isinstance(parts, list) and parts:
        return " + ".join(source_name(part) for part in parts)
    return "the token source"


def verify_source(source) -> None:
    """Re-check what a source's own files can prove before anything is derived from it: a token store's
    digests, loss mask values and vocabulary (:meth:`TokenStore.verify`), a Megatron dataset's token
    ids (:meth:`MegatronDataset.verify`); several sources read as one (a mixture's components) each in turn,
    and a length source over a store its store; a source without ``verify`` (an object a caller built) is its
    caller's to check."""
    parts = getattr(source, "parts", None)
    if isinstance(parts, list):
        for part in parts:
            verify_source(part)
        return
    check = getattr(getattr(source, "store", source), "verify", None)
    if callable(check):
        check()


def _mismatch(message: str) -> UmlosError:
    return UmlosError(errors.BATCH_STORE_MISMATCH, message, operator=errors.BATCHING_OPERATOR)
