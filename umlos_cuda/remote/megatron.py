"""A Megatron-LM indexed dataset in an object store: its ``.idx`` read bounded at opening, its ``.bin`` by ranges.

What goes in: the URL of a Megatron prefix copied into an object store as it was written
(``s3://bucket/data/web_text_document``, or the same ending in ``.idx`` or ``.bin``: the objects
``PREFIX.idx`` and ``PREFIX.bin``). What comes out: a length source and token source as the source layer opens
a local prefix (tokens/mapped.py's ``MappedMegatron``): ``take(rows)`` and ``binding()`` of the ``.idx`` sizes
(bound as an ``ArrayLengths`` of them, so a plan built from the local pair opens with this one),
``arrays(row)`` the row's tokens fetched by one ranged GET of the ``.bin`` and a loss mask of ones,
``length_cache()`` with row numbers for ids, ``verify()`` (no negative token id).

The checks are the local reader's, by the same functions (tokens/megatron.py): the ``.idx`` header (34 bytes,
one GET) is checked by ``check_idx_header`` against the object's recorded size before anything after it is
fetched, the counts are refused past :data:`MAX_SEQUENCES` (the index is read whole: 12 bytes a sequence and
8 a document index), then every size, pointer and document index by ``check_index_arrays`` against the
``.bin``'s recorded size: MEGATRON_INDEX_INVALID naming the object. Each range of the ``.bin`` is checked
against the ETag and size recorded at opening (:mod:`.client`).

A pickled dataset is its URL, tokenizer hash and budget: a ``DataLoader`` worker opens it again.
"""

from __future__ import annotations

import numpy as np

from .. import checks
from ..batching.lengths.sources import ArrayLengths
from ..batching.tokens.megatron import (HEADER_BYTES, UNKNOWN_TOKENIZER, VERIFY_WINDOW, PairFacts, _invalid, bin_path,
                                        check_idx_header, check_index_arrays, idx_path, refuse_negative)
from .client import RemoteObject, RetryBudget
from .urls import ObjectUrl, parse_url

#: The most sequences read from an object store (the index is read whole at opening: 12 bytes a sequence, and
#: at most as many document indices again, 8 bytes each: about 2.5 GiB); a larger dataset is read from disk.
MAX_SEQUENCES = (1 << 27) - 1


def megatron_url(path: str) -> str:
    """The prefix a Megatron URL names: itself, or without its ``.idx``/``.bin`` suffix."""
    return path[:-4] if path.endswith((".idx", ".bin")) else path


class RemoteMegatron(PairFacts, ArrayLengths):
    """A Megatron-LM pair read from an object store (module docstring); open it with :meth:`open`. What it answers
    from the index's sizes (``len``, ``num_tokens``, ``length_cache()``, ``arrays(row)`` with a loss mask of ones)
    is :class:`~umlos_cuda.batching.tokens.megatron.PairFacts`, as a local pair's."""

    def __init__(self, prefix: str, dtype: np.dtype, sizes: np.ndarray, pointers: np.ndarray,
                 document_indices: np.ndarray, data: RemoteObject, tokenizer_hash: str, budget: RetryBudget) -> None:
        super().__init__(sizes)
        self.prefix = self.origin = prefix
        self.dtype, self.sizes, self.pointers, self.document_indices = dtype, sizes, pointers, document_indices
        self.data, self.tokenizer_hash, self.budget = data, tokenizer_hash, budget
        self.dataset_hash = None
        self.ids_are_line_numbers = True
        self._ones = np.ones(int(sizes.max(initial=0)), dtype=np.uint8)
        self._ones.flags.writeable = False

    @classmethod
    def open(cls, path: str, *, tokenizer_hash: str = UNKNOWN_TOKENIZER,
             budget: RetryBudget | None = None) -> RemoteMegatron:
        """The pair at the URL ``path`` (its prefix, or either object); MEGATRON_INDEX_INVALID when an object is
        missing or the index is not one, REMOTE_* for the store's own failures."""
        prefix = megatron_url(path)
        url = parse_url(prefix)
        budget = budget if budget is not None else RetryBudget()
        checks.text(tokenizer_hash, "tokenizer_hash", empty=False, fail=_invalid,
                    message="{name} must be a non-empty string, got {value!r}")
        index, data = (_object(url, suffix, budget) for suffix in (".idx", ".bin"))
        where = idx_path(prefix)
        dtype, count, documents = check_idx_header(index.read(0, min(index.size, HEADER_BYTES)), index.size, where)
        if count > MAX_SEQUENCES or documents > count + 1:
            raise _invalid(f"{where} holds {count:,} sequences and {documents:,} document indices; a Megatron index "
                           f"read from an object store holds at most {MAX_SEQUENCES:,} sequences and one document "
                           "index more (it is read whole at opening): read it from disk")
        body = index.read(HEADER_BYTES, HEADER_BYTES + 12 * count + 8 * documents)
        sizes = np.frombuffer(body, dtype="<i4", count=count)
        pointers = np.frombuffer(body, dtype="<i8", count=count, offset=4 * count)
        document_indices = np.frombuffer(body, dtype="<i8", count=documents, offset=12 * count)
        check_index_arrays(prefix, dtype, sizes, pointers, document_indices, data.size)
        return cls(prefix, dtype, sizes, pointers, document_indices, data, tokenizer_hash, budget)

    def __reduce__(self):
        return (_reopen, (self.prefix, self.tokenizer_hash, self.budget))

    def __repr__(self) -> str:
        return f"RemoteMegatron({self.prefix!r}, {len(self)} sequences, {self.dtype})"

    # ------------------------------------------------------------------ rows
    def input_ids(self, row: int) -> np.ndarray:
        """Sequence ``row``'s tokens, fetched now (one ranged GET of the ``.bin``; read-only)."""
        row = checks.integer(row, self.prefix, 0, self.count - 1, fail=_invalid,
                             message="sequence {value!r} is not in {name}; rows are 0 to {high}")
        start, size = int(self.pointers[row]), int(self.sizes[row])
        return np.frombuffer(self.data.read(start, start + size * self.dtype.itemsize), dtype=self.dtype)

    def verify(self) -> dict:
        """As a local pair's: no sequence holds a negative token id (a signed dtype can store ids no tokenizer
        produces); the ``.bin`` is read in ranges of a bounded number of tokens."""
        if self.dtype.kind == "i":
            width = self.dtype.itemsize
            usable = self.data.size - self.data.size % width
            for start in range(0, usable, VERIFY_WINDOW * width):
                part = np.frombuffer(self.data.read(start, min(start + VERIFY_WINDOW * width, usable)),
                                     dtype=self.dtype)
                if part.size and int(part.min()) < 0:
                    refuse_negative(self, start + np.flatnonzero(part < 0) * width)
        return {"samples": len(self), "tokens": self.num_tokens, "tokenizer_hash": self.tokenizer_hash}


def _object(url: ObjectUrl, suffix: str, budget: RetryBudget) -> RemoteObject:
    key = url.prefix + suffix
    try:
        return RemoteObject.open(url, key, budget)
    except FileNotFoundError:
        raise _invalid(f"{url.name(key)} does not exist (a Megatron dataset is PREFIX.idx with PREFIX.bin; "
                       f"{idx_path(str(url))} and {bin_path(str(url))} here)") from None


def _reopen(prefix: str, tokenizer_hash: str, budget: RetryBudget) -> RemoteMegatron:
    return RemoteMegatron.open(prefix, tokenizer_hash=tokenizer_hash, budget=budget)
