"""A token store in an object store, read by byte ranges: the flat token store's files, never downloaded whole.

What goes in: ``s3://bucket/prefix`` (or ``gs://``, ``az://``, ``file://``) of a folder written by ``umlos-cuda
data tokenize`` and copied there as it is (docs/batching.md, "Token store": ``meta.json``, ``tokens.npy``,
``loss_mask.npy``, ``offsets.npy``). What comes out: a :class:`RemoteTokenStore` that answers what a
:class:`~umlos_cuda.batching.tokens.store.TokenStore` answers for collation and plans (``len``, ``lengths``,
``offsets``, ``arrays(row)``, ``tokenizer_hash``, ``identity()``, ``meta``), and the byte ranges of each row
(:meth:`RemoteTokenStore.spans`, and its :meth:`~RemoteTokenStore.object_table`), which the planned cache
(:mod:`.planned`) fetches ahead of use.

Opening reads ``meta.json`` (bounded, checked as a local one is: tokens/store.py's ``check_meta``), records
the size and ETag of the three arrays, reads their ``.npy`` headers (one small GET each) and the offsets
(``8 (N + 1)`` bytes, checked to rise from 0 to the token count, as a local store's are); every later range is
checked against what was recorded (:mod:`.client`). A row read with :meth:`arrays` outside a planned cache
costs two GETs (its tokens and its loss mask); read in plan order through :mod:`.planned`.

A pickled store is its URL and budget: a ``DataLoader`` worker opens it again.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .. import checks, errors
from ..batching.tokens.store import StoreFacts, check_meta, check_offsets, store_error
from ..errors import UmlosError
from ..files.reader import MAX_JSON_BYTES, loads_json
from .bounded import npy_data_offset, read_object_bytes
from .client import RemoteObject, RetryBudget, remote_error
from .objects import ObjectTable
from .urls import ObjectUrl, parse_url

#: The arrays of a token store, with the dtype of each (the tokens' from meta.json).
ARRAYS = ("tokens", "loss_mask", "offsets")
#: The most offsets read at opening (8 bytes each: 1 GiB, 134 M samples); a store with more is read from disk.
MAX_OFFSETS = 1 << 27


def _invalid(message: str) -> UmlosError:
    return store_error(errors.TOKEN_STORE_INVALID, message)


class RemoteTokenStore(StoreFacts):
    """A token store read from an object store (module docstring); open it with :meth:`open`. What it answers
    from meta.json and its offsets (``len``, ``lengths``, ``tokenizer_hash``, ``identity()``, ...) is
    :class:`~umlos_cuda.batching.tokens.store.StoreFacts`, as a local store's."""

    def __init__(self, url: ObjectUrl, meta: dict, objects: dict[str, RemoteObject], starts: dict[str, int],
                 offsets: np.ndarray, budget: RetryBudget) -> None:
        self.url, self.meta, self.objects, self.starts, self.budget = url, meta, objects, starts, budget
        self.root = str(url)
        self.origin = self.root
        self.offsets = offsets
        self.token_dtype = np.dtype(meta["token_dtype"])
        self._lengths: np.ndarray | None = None

    @classmethod
    def open(cls, path: str, *, budget: RetryBudget | None = None,
             read_meta: Callable[[RemoteObject], bytes] | None = None) -> RemoteTokenStore:
        """The store at ``path``; TOKEN_STORE_NOT_FOUND when its ``meta.json`` is not there, TOKEN_STORE_INVALID
        for a file that is missing or not what meta.json says, REMOTE_* for the store's own failures.
        ``read_meta(obj)``, when given, reads meta.json's bytes in place of the default (refused from its size
        when over the JSON cap): a sharded store's shard caps it lower and refuses it, before it is parsed or
        anything else is read, when it does not hash to its index entry."""
        url = parse_url(path)
        budget = budget if budget is not None else RetryBudget()
        checks.instance(budget, "budget", RetryBudget, fail=lambda message: UmlosError(
            errors.INVALID_ARGUMENT, message, operator=errors.REMOTE_OPERATOR))
        meta_name = url.name(url.key("meta.json"))
        try:
            meta_object = RemoteObject.open(url, url.key("meta.json"), budget)
        except FileNotFoundError:
            raise store_error(errors.TOKEN_STORE_NOT_FOUND, f"no token store at {url}: {meta_name} does not "
                              "exist (copy a folder written by `umlos-cuda data tokenize` there, files as they "
                              "are)") from None
        data = read_meta(meta_object) if read_meta is not None else \
            read_object_bytes(meta_object, _invalid, max_bytes=MAX_JSON_BYTES, what="JSON file")
        meta = check_meta(loads_json(data, _invalid, meta_name), meta_name)
        n, total = int(meta["num_samples"]), int(meta["num_tokens"])
        if n + 1 > MAX_OFFSETS:
            raise _invalid(f"{url} holds {n:,} samples; a store read from an object store holds at most "
                           f"{MAX_OFFSETS - 1:,} (its offsets are read at opening): read it from disk")
        shapes = {"tokens": (meta["token_dtype"], total), "loss_mask": ("|u1", total), "offsets": ("<i8", n + 1)}
        objects, starts = {}, {}
        for name in ARRAYS:
            key = url.key(f"{name}.npy")
            try:
                objects[name] = RemoteObject.open(url, key, budget)
            except FileNotFoundError:
                raise _invalid(f"{url.name(key)} is missing") from None
            dtype, count = shapes[name]
            starts[name] = npy_data_offset(objects[name], dtype, count, _invalid, expected="meta.json says")
        raw = objects["offsets"].read(starts["offsets"], objects["offsets"].size)
        offsets = np.frombuffer(raw, dtype="<i8")
        check_offsets(offsets, meta, objects["offsets"].name)
        return cls(url, meta, objects, starts, offsets, budget)

    def __reduce__(self):
        return (_reopen, (self.root, self.budget))

    def __repr__(self) -> str:
        return f"RemoteTokenStore({self.root!r}, {len(self)} samples, {self.num_tokens} tokens)"

    def length_cache(self):
        """REMOTE_UNAVAILABLE: the store's length cache (its sample ids, which a whole plan with ids compares) is
        not read from an object store yet."""
        raise remote_error(errors.REMOTE_UNAVAILABLE, f"{self.root}: the sample ids of a token store (its "
                           "lengths.jsonl) are not read from an object store yet, and a whole plan that names its "
                           "samples by id compares them: use a windowed plan (--window), which compares the "
                           "lengths only, or read the store from disk")

    # ------------------------------------------------------------------ byte ranges
    def spans(self, row: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """The byte ranges ``[start, stop)`` of row ``row`` in ``tokens.npy`` and in ``loss_mask.npy``."""
        row = checks.integer(row, "row", 0, len(self) - 1, fail=_invalid,
                             message="sample {value!r} is not in the store; rows are 0 to {high}")
        starts, stops = self.byte_ranges(np.array([row], dtype=np.int64))
        return (int(starts[0, 0]), int(stops[0, 0])), (int(starts[0, 1]), int(stops[0, 1]))

    def byte_ranges(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`spans` of many rows at once (int64 ``rows`` of this store, checked by the caller): the starts and
        the stops, int64 ``[n, 2]`` each, column 0 in ``tokens.npy`` and column 1 in ``loss_mask.npy``."""
        first, last = self.offsets[rows], self.offsets[rows + 1]
        size = self.token_dtype.itemsize
        tokens, mask = self.starts["tokens"], self.starts["loss_mask"]
        return (np.stack((tokens + first * size, mask + first), axis=1),
                np.stack((tokens + last * size, mask + last), axis=1))

    def object_table(self) -> ObjectTable:
        """What the planned cache reads (:mod:`.objects`): this store's tokens (object 0) and loss mask (1)."""
        return ObjectTable([0, len(self)], lambda part: self)

    def decode(self, token_bytes: bytes, mask_bytes: bytes) -> tuple[np.ndarray, np.ndarray]:
        """A row's ``(input_ids, loss_mask)`` from the bytes of its two ranges (read-only arrays)."""
        ids = np.frombuffer(token_bytes, dtype=self.token_dtype)
        mask = np.frombuffer(mask_bytes, dtype=np.uint8)
        return ids, mask

    def arrays(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """Row ``row``'s tokens and loss mask, fetched now (two ranged GETs; :mod:`.planned` fetches ahead)."""
        (a, b), (c, d) = self.spans(row)
        return self.decode(self.objects["tokens"].read(a, b), self.objects["loss_mask"].read(c, d))

    def __getitem__(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        return self.arrays(row)


def _reopen(root: str, budget: RetryBudget) -> RemoteTokenStore:
    return RemoteTokenStore.open(root, budget=budget)
