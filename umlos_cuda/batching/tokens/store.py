"""The token store: a tokenized dataset as flat, memory-mapped arrays.

What goes in: a folder written by ``umlos-cuda data tokenize``
(umlos_cuda/batching/tokens/writer.py). What comes out: random access to
sample ``i``'s token ids and loss mask, as read-only views of memory-mapped
files, whatever the dataset's size. Layout (docs/batching.md, "Token store")::

    DIR/meta.json           format, counts, token dtype, vocabulary size, hashes (below)
    DIR/tokens.npy          every sample's token ids, concatenated (uint16, or uint32 past 65,536 ids)
    DIR/loss_mask.npy       one uint8 per token: 1 where the token is trained on
    DIR/offsets.npy         int64 [N + 1]: sample i is tokens[offsets[i]:offsets[i + 1]]
    DIR/lengths.jsonl(.u32) the length cache of the same samples (ids, lengths)

Like Megatron-LM's indexed dataset, nothing is one Python object per
sample; :meth:`TokenStore.sample` builds a :class:`Sample` for the edges.
The length cache carries the sample ids, so a plan is built from
``DIR/lengths.jsonl`` like from any other cache. Opening checks shapes and
counts (cheap); :meth:`TokenStore.verify` also re-hashes the arrays.

A pickled store is its path: a ``DataLoader`` worker reopens the files
instead of copying them.
"""

from __future__ import annotations

import mmap as mmap_module
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ... import checks, errors
from ...errors import UmlosError
from ...files.reader import read_json, read_npy
from ..lengths.cache import LengthCache
from ..lengths.fingerprints import PARTS_KEY, check_tokenizer_parts
from ...hashing import sha256_array
from ..samples import Sample, SampleMeta

#: meta.json ``format``.
STORE_FORMAT = "umlos_cuda.token_store/1"
TOKEN_DTYPES = ("<u2", "<u4")
META_FIELDS = ("format", "num_samples", "num_tokens", "token_dtype", "tokenizer_hash", "dataset_hash", "loss_mask",
               "sample_ids", "tokens_sha256", "loss_mask_sha256", "offsets_sha256")
#: meta.json fields a store may lack: ``vocab_size`` (the tokenizer's, with added tokens) is written since
#: stores check their token ids against it; a store written before has only its dtype's range.
#: ``tokenizer_parts`` (the tokenizer's parts hashed alone, last) is written since a tokenizer mismatch names
#: the parts that differ; a store written before, or lengths read from a column, has none.
OPTIONAL_FIELDS = ("vocab_size", PARTS_KEY)
#: ``loss_mask`` in meta.json: every token trained on, the instruction template's rule, the assistant turns, or
#: the tokens after a rendered prompt's (conversational preference records, umlos_cuda/batching/chat/completions.py).
LOSS_MASK_RULES = ("all", "template", "assistant", "completion")
LENGTHS_FILE = "lengths.jsonl"


class StoreFacts:
    """What a token store answers from its meta.json and its offsets alone, wherever its arrays are read from:
    a folder (:class:`TokenStore`) or an object store (:class:`~umlos_cuda.remote.store.RemoteTokenStore`).
    A subclass sets ``meta`` (checked by :func:`check_meta`), ``offsets`` (int64 ``[N + 1]``) and
    ``_lengths = None``."""

    meta: dict
    offsets: np.ndarray
    _lengths: np.ndarray | None

    @property
    def lengths(self) -> np.ndarray:
        """``uint32 [N]``, computed from the offsets on first use (4 bytes a sample in memory): opening
        copies nothing, so a plan that reads lengths by rows (tokens/offsets.py) stays O(window)."""
        if self._lengths is None:
            lengths = np.diff(self.offsets).astype(np.uint32)
            lengths.flags.writeable = False
            self._lengths = lengths
        return self._lengths

    def __len__(self) -> int:
        return int(self.meta["num_samples"])

    @property
    def num_samples(self) -> int:
        return len(self)

    @property
    def num_tokens(self) -> int:
        return int(self.meta["num_tokens"])

    @property
    def tokenizer_hash(self) -> str:
        return self.meta["tokenizer_hash"]

    @property
    def tokenizer_parts(self) -> dict[str, str] | None:
        """The tokenizer's parts hashed alone, when meta.json records them (to name the parts two differ in)."""
        return self.meta.get(PARTS_KEY)

    @property
    def dataset_hash(self) -> str | None:
        return self.meta["dataset_hash"]

    @property
    def vocab_size(self) -> int | None:
        """The tokenizer's vocabulary size (added tokens included), when meta.json records it."""
        return self.meta.get("vocab_size")

    @property
    def ids_are_line_numbers(self) -> bool:
        return self.meta["sample_ids"] == "line_numbers"

    def identity(self) -> dict:
        """The tokenizer and the SHA-256 of the tokens and loss mask, as meta.json records them (checked against
        the arrays by ``data verify``): what an artifact cut from this store records to know it again
        (:meth:`~..lengths.sources.LengthSource.identity`)."""
        return {"tokenizer_hash": self.tokenizer_hash, "tokens_sha256": self.meta["tokens_sha256"],
                "loss_mask_sha256": self.meta["loss_mask_sha256"]}


class TokenStore(StoreFacts):
    """A token store opened for reading (:meth:`open`).

    ``tokens``, ``loss_mask`` and ``offsets`` are the three arrays (read-only,
    memory-mapped unless ``mmap=False``); ``lengths`` is ``uint32 [N]``.
    ``tokenizer_hash`` and ``dataset_hash`` are those of the length cache.
    """

    def __init__(self, root: str, meta: dict, tokens: np.ndarray, loss_mask: np.ndarray, offsets: np.ndarray) -> None:
        self.root = root
        self.meta = meta
        self.tokens = tokens
        self.loss_mask_array = loss_mask
        self.offsets = offsets
        self._lengths: np.ndarray | None = None
        self._cache: LengthCache | None = None

    @classmethod
    def open(cls, directory: str | os.PathLike[str], *, mmap: bool = True) -> TokenStore:
        """The store in ``directory``; TOKEN_STORE_NOT_FOUND when there is none."""
        root = os.path.abspath(os.fspath(directory))
        meta_path = os.path.join(root, "meta.json")
        if not os.path.lexists(meta_path):  # anything else there is refused by the reader, saying what it is
            raise store_error(errors.TOKEN_STORE_NOT_FOUND, f"no token store at {root}: {meta_path} does not exist "
                              "(write one with `umlos-cuda data tokenize`)")
        meta = _read_meta(meta_path)
        n, total = meta["num_samples"], meta["num_tokens"]
        tokens = _load(root, "tokens", meta["token_dtype"], total, mmap)
        loss_mask = _load(root, "loss_mask", "|u1", total, mmap)
        offsets = _load(root, "offsets", "<i8", n + 1, mmap)
        check_offsets(offsets, meta, f"{root}/offsets.npy")
        return cls(root, meta, tokens, loss_mask, offsets)

    def __reduce__(self):
        return (_reopen, (self.root, isinstance(self.tokens, np.memmap)))

    def __repr__(self) -> str:
        return f"TokenStore({self.root!r}, {len(self)} samples, {self.num_tokens} tokens)"

    def length_cache(self) -> LengthCache:
        """The store's length cache (``DIR/lengths.jsonl``): build a plan from it."""
        if self._cache is None:
            path = os.path.join(self.root, LENGTHS_FILE)
            try:
                cache = LengthCache.load(path)
            except UmlosError as exc:
                raise _invalid(f"the store's length cache: {exc.message}") from None
            if not np.array_equal(cache.lengths, self.lengths) or cache.tokenizer_hash != self.tokenizer_hash:
                raise _invalid(f"{path} disagrees with the store's offsets or tokenizer hash")
            cache.tokenizer_parts = self.tokenizer_parts
            self._cache = cache
        return self._cache

    @property
    def sample_ids(self) -> list[str]:
        return self.length_cache().sample_ids

    def sample_id(self, row: int) -> str:
        return str(int(row)) if self.ids_are_line_numbers else self.sample_ids[int(row)]

    # ------------------------------------------------------------------ access
    def _span(self, row: int) -> tuple[int, int]:
        row = checks.integer(row, "row", 0, len(self) - 1, fail=_invalid,
                             message="sample {value!r} is not in the store; rows are 0 to {high}")
        return int(self.offsets[row]), int(self.offsets[row + 1])

    def input_ids(self, row: int) -> np.ndarray:
        """Sample ``row``'s token ids (a read-only view)."""
        start, stop = self._span(row)
        return self.tokens[start:stop]

    def loss_mask(self, row: int) -> np.ndarray:
        """Sample ``row``'s loss mask (uint8, a read-only view)."""
        start, stop = self._span(row)
        return self.loss_mask_array[start:stop]

    def arrays(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids, loss_mask)`` of sample ``row``: what collation reads."""
        start, stop = self._span(row)
        return self.tokens[start:stop], self.loss_mask_array[start:stop]

    def arrays_many(self, rows: Sequence[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        """``[arrays(row) for row in rows]`` (a microbatch's rows), their spans looked up in one pass; a row
        not in the store is refused as :meth:`arrays` refuses it."""
        picked = np.asarray(rows)
        if picked.dtype.kind not in "iu" or picked.ndim != 1 or (picked.size and (
                int(picked.min()) < 0 or int(picked.max()) >= len(self))):
            return [self.arrays(row) for row in rows]  # the row that is not in the store raises there
        starts, stops = self.offsets[picked].tolist(), self.offsets[picked + 1].tolist()
        tokens, mask = self.tokens, self.loss_mask_array
        return [(tokens[a:b], mask[a:b]) for a, b in zip(starts, stops)]

    def __getitem__(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        return self.arrays(row)

    def sample(self, row: int, dataset_id: str = "train") -> Sample:
        """Sample ``row`` as a validated :class:`Sample` (one object: for the edges)."""
        ids, mask = self.arrays(row)
        return Sample(ids, mask, None, SampleMeta(self.sample_id(row), dataset_id))

    # ------------------------------------------------------------------ checks
    def verify(self) -> dict:
        """Re-hash the three arrays (SHA-256 of their bytes) against
        meta.json, check that every token id is below ``vocab_size`` and
        every loss mask value is 0 or 1, and check the length cache;
        TOKEN_STORE_INVALID names the first file that differs.

        The digests sit in meta.json beside the arrays: they catch a file
        changed after it was written, not a store rewritten consistently
        (digests recomputed); the vocabulary bound still catches token ids
        no tokenizer of that size produces."""
        arrays = {"tokens": self.tokens, "loss_mask": self.loss_mask_array, "offsets": self.offsets}
        for name, array in arrays.items():
            if sha256_array(np.asarray(array)) != self.meta[f"{name}_sha256"]:
                raise _invalid(f"{self.root}/{name}.npy does not hash to meta.json's {name}_sha256: "
                               "the file changed after it was written")
        largest = int(self.tokens.max(initial=0))
        if self.vocab_size is not None and largest >= self.vocab_size:
            raise _invalid(f"{self.root}/tokens.npy holds token id {largest}, outside the tokenizer's vocabulary of "
                           f"{self.vocab_size} ids (meta.json vocab_size): not what the tokenizer produced")
        if int(self.loss_mask_array.max(initial=0)) > 1:
            raise _invalid(f"{self.root}/loss_mask.npy holds values other than 0 and 1")
        self.length_cache()
        return {"samples": len(self), "tokens": self.num_tokens, "tokenizer_hash": self.tokenizer_hash}


#: Offsets checked at a time by :func:`rises` (8 MiB of int64).
OFFSETS_PIECE = 1 << 20


def rises(offsets: np.ndarray) -> bool:
    """Whether ``offsets`` never decrease, checked a piece at a time (no O(N) temporary), the pages of a
    mapped array dropped from this process after each piece (:func:`release_pages`)."""
    for start in range(0, max(int(offsets.shape[0]) - 1, 0), OFFSETS_PIECE):
        piece = np.asarray(offsets[start:start + OFFSETS_PIECE + 1])
        if piece.shape[0] > 1 and int(np.diff(piece).min()) < 0:
            return False
        release_pages(offsets)
    return True


def check_offsets(offsets: np.ndarray, meta: dict, where: str) -> None:
    """TOKEN_STORE_INVALID naming ``where`` unless ``offsets`` (int64 ``[N + 1]``) rise from 0 to meta.json's
    token count: the cuts of the tokens into the samples."""
    n, total = meta["num_samples"], meta["num_tokens"]
    if int(offsets[0]) != 0 or int(offsets[-1]) != total or not rises(offsets):
        raise _invalid(f"{where} does not cut the {total} tokens into {n} samples "
                       "(it must rise from 0 to the token count)")


def release_pages(array: np.ndarray) -> None:
    """Drop the pages of the memory map under ``array`` (an ``np.memmap``; anything else is left alone) that
    this process has read from its resident set; they stay in the page cache, and a later read maps them
    again (``madvise(MADV_DONTNEED)`` on a read-only file map loses nothing)."""
    handle = getattr(array, "_mmap", None)
    if handle is not None and hasattr(mmap_module, "MADV_DONTNEED"):
        handle.madvise(mmap_module.MADV_DONTNEED)


def _reopen(root: str, mmap: bool) -> TokenStore:
    return TokenStore.open(root, mmap=mmap)


def _read_meta(path: str) -> dict:
    try:
        meta = read_json(path, _invalid)
    except FileNotFoundError:
        raise _invalid(f"{path} is missing") from None
    return check_meta(meta, path)


def check_meta(meta: Any, path: str) -> dict:
    """``meta`` (the JSON value of the meta.json at ``path``, a folder's or an object store's) when it is a token
    store's: its format, exactly its fields, and each field's type and range; TOKEN_STORE_INVALID naming ``path``
    otherwise."""
    wrong_format = checks.literal(path) + f" has format {{value!r}}; this reader reads {STORE_FORMAT!r}"
    checks.instance(meta, "meta.json", dict, fail=_invalid, message=wrong_format.replace("{value!r}", "{type!r}"))
    checks.equal(meta.get("format"), "format", STORE_FORMAT, fail=_invalid, message=wrong_format)
    wrong_fields = checks.literal(path) + _META_KEYS
    checks.record(meta, _META_FIELDS, optional=_OPTIONAL_FIELDS, fail=_invalid, unknown=wrong_fields,
                  missing=wrong_fields)

    def at_path(message: str) -> UmlosError:
        return _invalid(f"{path}: {message}")

    for name, low, wording in (("num_samples", 1, checks.POSITIVE), ("num_tokens", 0, checks.NON_NEGATIVE)):
        checks.integer(meta[name], name, low, None, fail=at_path, message=wording, strict=True)
    if "vocab_size" in meta:
        limit = 1 << (16 if meta["token_dtype"] == "<u2" else 32)
        checks.integer(meta["vocab_size"], "vocab_size", 1, limit,
                       fail=lambda message: _invalid(f"{path}: {message} (token_dtype {meta['token_dtype']!r})"),
                       strict=True)
    choices = (("token_dtype", TOKEN_DTYPES), ("loss_mask", LOSS_MASK_RULES), ("sample_ids", ("line_numbers", "jsonl")))
    for name, allowed in choices:
        checks.choice(meta[name], name, allowed, fail=at_path)
    hashes = "tokenizer_hash must be a non-empty string and dataset_hash a string or null"
    checks.text(meta["tokenizer_hash"], "tokenizer_hash", empty=False, fail=at_path, message=hashes)
    if meta["dataset_hash"] is not None:
        checks.text(meta["dataset_hash"], "dataset_hash", fail=at_path, message=hashes)
    if PARTS_KEY in meta:
        check_tokenizer_parts(meta[PARTS_KEY], PARTS_KEY, at_path)
    return meta


#: meta.json's fields, checked by :func:`_read_meta` (the keys here, the values there).
_META_FIELDS = dict.fromkeys(META_FIELDS, checks.field(checks.anything))
_OPTIONAL_FIELDS = dict.fromkeys(OPTIONAL_FIELDS, checks.field(checks.anything))
_META_KEYS = (f" must have exactly the fields {', '.join(META_FIELDS)} (and may have {', '.join(OPTIONAL_FIELDS)}); "
              "missing {missing_list}, unknown {unknown_list}")


def _load(root: str, name: str, dtype: str, count: int, mmap: bool) -> np.ndarray:
    array = read_npy(os.path.join(root, f"{name}.npy"), dtype, (count,), mmap, _invalid, expected="meta.json says")
    if not mmap:
        array.flags.writeable = False
    return array


def store_error(code: str, message: str) -> UmlosError:
    return UmlosError(code, message, operator=errors.BATCHING_OPERATOR)


def _invalid(message: str) -> UmlosError:
    return store_error(errors.TOKEN_STORE_INVALID, message)

