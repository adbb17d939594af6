"""Read a Megatron-LM indexed dataset (``PREFIX.idx`` + ``PREFIX.bin``), or several, as a token source.

What goes in: the path prefix of a dataset written by Megatron-LM's
``IndexedDatasetBuilder`` (``tools/preprocess_data.py``). What comes out:
the same read interface as :class:`~umlos_cuda.batching.tokens.store.TokenStore`
(``lengths``, ``arrays(row)``, ``length_cache()``), so a plan is built from
the ``.idx`` sizes and batches are collated from the ``.bin``, with no
re-tokenizing. Each *sequence* of the index is one sample, its id the row
number; Megatron stores no loss mask, so every token is trained on.

The ``.idx`` layout (Megatron-LM ``megatron/core/datasets/indexed_dataset.py``,
``_IndexWriter``; all integers little-endian)::

    9 bytes        magic  b"MMIDIDX\\x00\\x00"
    uint64         version, 1
    uint8          dtype code of the .bin tokens: 1 uint8, 2 int8, 3 int16,
                   4 int32, 5 int64, 6 float64, 7 float32, 8 uint16
    uint64         S, the sequence count
    uint64         D, the document count (the length of document_indices)
    int32   [S]    sequence lengths, in tokens
    int64   [S]    sequence pointers: byte offsets into the .bin
    int64   [D]    document indices: sequence index where each document
                   ends, from 0 to S (D = documents + 1)
    int8    [S]    sequence modes, only in multimodal datasets

Everything is checked when the pair opens (MEGATRON_INDEX_INVALID): magic,
version, an integer dtype code, a file size that fits the counts exactly,
sizes that are not negative, pointers aligned to the dtype and inside the
``.bin`` (checked without int64 overflow: a pointer near 2^63 cannot wrap
back inside), document indices ascending from 0 to S. Both files are
memory-mapped; nothing is one Python object per sequence.

Reading a sequence is the hot path (a collator reads every row of an
epoch), so it touches no ``np.memmap`` object: slicing a memmap runs its
Python-level ``__array_finalize__`` per slice, which was most of the cost.
Instead the ``.bin`` is viewed once as a plain ndarray of tokens
(``np.frombuffer`` over the map, which keeps the map alive) and each
sequence's token start and end are precomputed as int64 arrays (pointers
are checked aligned, so ``pointer // itemsize`` is exact; when sequences lie
back to back, as Megatron writes them, starts and ends are two views of one
array of S + 1 bounds, 8 bytes a sequence in memory); a read
is one bounds check and one ndarray slice (bench/bench_megatron_reader.py).

Several prefixes (Megatron-LM's data path is a list of them) are one
dataset: :class:`MegatronDatasetList` reads them in the order given with
global row numbers (tokens/concat.py), so ``data megatron A B`` writes one
length cache and ``batch generate --source A B`` collates from both.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import numpy as np

from ... import checks, errors
from ...errors import UmlosError
from ...files import reader
from ..lengths.cache import LengthCache
from .concat import ConcatenatedSource

IDX_MAGIC = b"MMIDIDX\x00\x00"
IDX_VERSION = 1
#: Megatron-LM's DType codes.
DTYPE_CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
               8: np.uint16}
#: magic, version, dtype code, sequence count, document count.
HEADER_BYTES = len(IDX_MAGIC) + 8 + 1 + 8 + 8
#: Tokens scanned at a time by :meth:`MegatronDataset.verify` (and an object store's reader).
VERIFY_WINDOW = 1 << 24
#: Tokenizer hash of a dataset opened without naming its tokenizer.
UNKNOWN_TOKENIZER = "unknown"


def idx_path(prefix: str) -> str:
    return prefix + ".idx"


def bin_path(prefix: str) -> str:
    return prefix + ".bin"


class PairFacts:
    """What a Megatron pair answers from its index's ``sizes`` (and ``lengths``, the same as uint32) and a
    subclass's ``input_ids(row)``, wherever its ``.bin`` is read from: memory-mapped (:class:`MegatronDataset`)
    or by ranges from an object store (:class:`~umlos_cuda.remote.megatron.RemoteMegatron`). Row ids are row
    numbers; the loss mask is all ones (``_ones``, as long as the longest sequence)."""

    #: An indexed dataset trains on every token (its loss mask is all ones): counting loss tokens reads no row.
    trains_on_every_token = True
    sizes: np.ndarray
    lengths: np.ndarray
    tokenizer_hash: str
    _ones: np.ndarray

    def input_ids(self, row: int) -> np.ndarray:
        raise NotImplementedError

    def __len__(self) -> int:
        return int(self.sizes.shape[0])

    @property
    def num_samples(self) -> int:
        return len(self)

    @property
    def num_tokens(self) -> int:
        return int(self.sizes.sum(dtype=np.int64))

    def sample_id(self, row: int) -> str:
        return str(int(row))

    def length_cache(self) -> LengthCache:
        """Lengths from the ``.idx`` sizes, ids the row numbers: build a plan from it."""
        return LengthCache.from_arrays(None, self.lengths, self.tokenizer_hash)

    def arrays(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids, loss_mask)`` of sequence ``row``: what collation reads."""
        ids = self.input_ids(row)
        return ids, self._ones[:ids.shape[0]]

    def __getitem__(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        return self.arrays(row)


class MegatronDataset(PairFacts):
    """A Megatron-LM indexed dataset opened for reading (:meth:`open`).

    ``sizes`` (int32), ``pointers`` (int64), ``document_indices`` (int64)
    and ``modes`` (int8, or None) are the index's arrays, memory-mapped;
    ``lengths`` is ``sizes`` as uint32. ``tokenizer_hash`` is what the caller
    names (the index does not record its tokenizer).
    """

    def __init__(self, prefix: str, dtype: np.dtype, sizes: np.ndarray, pointers: np.ndarray,
                 document_indices: np.ndarray, modes: np.ndarray | None, data: np.ndarray,
                 tokenizer_hash: str) -> None:
        self.prefix = prefix
        self.dtype = dtype
        self.sizes = sizes
        self.pointers = pointers
        self.document_indices = document_indices
        self.modes = modes
        self.data = data  # the .bin as bytes
        self.tokenizer_hash = tokenizer_hash
        self.dataset_hash = None
        self.ids_are_line_numbers = True
        self.lengths = sizes.astype(np.uint32)
        self.lengths.flags.writeable = False
        self._ones = np.ones(int(sizes.max(initial=0)), dtype=np.uint8)
        self._ones.flags.writeable = False
        # The per-sequence path (module docstring): a plain read-only token view and token offsets.
        width = dtype.itemsize
        self._tokens = np.frombuffer(data, dtype=dtype, count=data.shape[0] // width) if data.shape[0] \
            else np.zeros(0, dtype=dtype)
        self._tokens.flags.writeable = False
        starts = np.asarray(pointers, dtype=np.int64) // width
        ends = starts + np.asarray(sizes, dtype=np.int64)
        if starts.shape[0] and np.array_equal(starts[1:], ends[:-1]):
            # sequences back to back, as Megatron writes them: one array of S + 1 bounds (8 bytes a
            # sequence, not 16), starts and ends two views of it
            bounds = np.append(starts, ends[-1:])
            starts, ends = bounds[:-1], bounds[1:]
        self._starts, self._ends = starts, ends
        self._count = int(sizes.shape[0])

    @classmethod
    def open(cls, prefix: str | os.PathLike[str], *, tokenizer_hash: str = UNKNOWN_TOKENIZER) -> MegatronDataset:
        """The pair ``prefix.idx`` / ``prefix.bin`` (a path ending in ``.idx`` or ``.bin`` is taken as its prefix)."""
        prefix = os.fspath(prefix)
        if prefix.endswith((".idx", ".bin")):
            prefix = prefix[:-4]
        checks.text(tokenizer_hash, "tokenizer_hash", empty=False, fail=_invalid,
                    message="{name} must be a non-empty string, got {value!r}")
        index, dtype, count, documents = read_idx_header(prefix)
        plain = HEADER_BYTES + 12 * count + 8 * documents
        sizes = _view(index, HEADER_BYTES, "<i4", count)
        pointers = _view(index, HEADER_BYTES + 4 * count, "<i8", count)
        document_indices = _view(index, HEADER_BYTES + 12 * count, "<i8", documents)
        modes = _view(index, plain, "i1", count) if index.shape[0] > plain else None
        data = _map(bin_path(prefix))
        check_index_arrays(prefix, dtype, sizes, pointers, document_indices, int(data.shape[0]))
        return cls(prefix, dtype, sizes, pointers, document_indices, modes, data, tokenizer_hash)

    def __reduce__(self):
        return (_reopen, (self.prefix, self.tokenizer_hash))

    def __repr__(self) -> str:
        return f"MegatronDataset({self.prefix!r}, {len(self)} sequences, {self.dtype})"

    def input_ids(self, row: int) -> np.ndarray:
        """Sequence ``row``'s tokens (a read-only view of the ``.bin``)."""
        if type(row) is not int or not 0 <= row < self._count:  # the common case skips the full check
            row = checks.integer(row, self.prefix, 0, self._count - 1, fail=_invalid,
                                 message="sequence {value!r} is not in {name}; rows are 0 to {high}")
        return self._tokens[self._starts[row]:self._ends[row]]

    def loss_mask(self, row: int) -> np.ndarray:
        """All ones: an indexed dataset trains on every token."""
        return self._ones[:len(self.input_ids(row))]

    def verify(self) -> dict:
        """Check that no sequence holds a negative token id (Megatron files
        record no digests, so this is what they can prove): a signed dtype
        (int8, int16, int32, int64) can store ids no tokenizer produces.
        The ``.bin`` is scanned in bounded windows; MEGATRON_INDEX_INVALID
        names the first sequence that holds one."""
        if self.dtype.kind == "i":
            width = self.dtype.itemsize
            tokens = self.data[:self.data.shape[0] - self.data.shape[0] % width].view(self.dtype)
            for start in range(0, tokens.shape[0], VERIFY_WINDOW):
                part = tokens[start:start + VERIFY_WINDOW]
                if part.size and int(part.min()) < 0:
                    refuse_negative(self, (start + np.flatnonzero(part < 0)) * width)
        return {"samples": len(self), "tokens": self.num_tokens, "tokenizer_hash": self.tokenizer_hash}


def refuse_negative(dataset: Any, positions: np.ndarray) -> None:
    """MEGATRON_INDEX_INVALID for the first sequence of ``dataset`` (its ``prefix``, ``dtype``, ``sizes``,
    ``pointers`` and ``input_ids(row)``: a mapped pair's or an object store's) holding one of the byte ``positions``
    of its ``.bin`` (bytes between sequences are no token): what ``verify`` says of a negative token id."""
    order = np.argsort(dataset.pointers, kind="stable")
    starts = np.asarray(dataset.pointers)[order]
    ends = starts + np.asarray(dataset.sizes, dtype=np.int64)[order] * dataset.dtype.itemsize
    slot = np.searchsorted(starts, positions, side="right") - 1
    inside = (slot >= 0) & (positions < ends[np.maximum(slot, 0)])
    if inside.any():
        row = int(order[slot[np.argmax(inside)]])
        value = int(dataset.input_ids(row).min())
        raise _invalid(f"{bin_path(dataset.prefix)}: sequence {row} holds token id {value}; token ids are never "
                       f"negative (the {dataset.dtype} file was not written from a tokenizer's ids)")


class MegatronDatasetList(ConcatenatedSource):
    """Several Megatron-LM indexed datasets read as one, in the order given (Megatron-LM's data path
    without weights): row ``r`` is a global row over the prefixes (tokens/concat.py), ids are the
    global row numbers, every part is opened (and checked) by :meth:`open`. ``prefix`` is the list."""

    #: Every token is in the loss, as in each of its datasets.
    trains_on_every_token = True

    def __init__(self, datasets: list[MegatronDataset], tokenizer_hash: str) -> None:
        self.datasets = datasets
        self.prefix = [dataset.prefix for dataset in datasets]
        super().__init__([len(dataset) for dataset in datasets], datasets.__getitem__, tokenizer_hash=tokenizer_hash,
                         ids_are_line_numbers=True, dataset_hash=None, fail=_invalid,
                         where=" + ".join(self.prefix))

    @classmethod
    def open(cls, prefixes, *, tokenizer_hash: str = UNKNOWN_TOKENIZER) -> MegatronDatasetList:
        """The datasets at ``prefixes`` (each as :meth:`MegatronDataset.open` takes it), one prefix named once."""
        given = [os.fspath(prefix) for prefix in prefixes]
        if not given:
            raise _invalid("no Megatron prefix given (an empty list)")
        datasets = [MegatronDataset.open(prefix, tokenizer_hash=tokenizer_hash) for prefix in given]
        seen: dict[tuple[int, int], str] = {}
        for dataset in datasets:
            info = os.stat(bin_path(dataset.prefix))
            key = (info.st_dev, info.st_ino)
            if key in seen:
                raise _invalid(f"{dataset.prefix} and {seen[key]} are the same dataset (a prefix named twice, or a "
                               "link); each is read once")
            seen[key] = dataset.prefix
        return cls(datasets, tokenizer_hash)

    def __reduce__(self):
        return (_reopen_list, (self.prefix, self.tokenizer_hash))

    def __repr__(self) -> str:
        return f"MegatronDatasetList({len(self.datasets)} prefixes, {len(self)} sequences)"

    @property
    def num_tokens(self) -> int:
        return sum(dataset.num_tokens for dataset in self.datasets)

    @property
    def document_count(self) -> int:
        return sum(max(int(dataset.document_indices.shape[0]) - 1, 0) for dataset in self.datasets)

    def length_cache(self) -> LengthCache:
        """Lengths from every ``.idx``'s sizes, in order; ids the global row numbers."""
        return LengthCache.from_arrays(None, self.lengths, self.tokenizer_hash)

    def verify(self) -> dict:
        """:meth:`MegatronDataset.verify` of each dataset."""
        for dataset in self.datasets:
            dataset.verify()
        return {"samples": len(self), "tokens": self.num_tokens, "tokenizer_hash": self.tokenizer_hash}


def _reopen_list(prefixes: list[str], tokenizer_hash: str) -> MegatronDatasetList:
    return MegatronDatasetList.open(prefixes, tokenizer_hash=tokenizer_hash)


def _reopen(prefix: str, tokenizer_hash: str) -> MegatronDataset:
    return MegatronDataset.open(prefix, tokenizer_hash=tokenizer_hash)


def read_idx_header(prefix: str) -> tuple[np.ndarray, np.dtype, int, int]:
    """The ``.idx`` of ``prefix`` mapped read-only, with its header checked: ``(index, dtype, S, D)``.

    The one parser of the header (:meth:`MegatronDataset.open` and tokens/mapped.py's
    ``MappedMegatron`` both use it): the magic, the version, an integer dtype code, a file size that
    fits the counts exactly (with or without the sequence modes) and at least one sequence, each
    MEGATRON_INDEX_INVALID. Reads the header's 34 bytes; the arrays after it are the caller's to view."""
    index = _map(idx_path(prefix))
    dtype, count, documents = check_idx_header(index[:HEADER_BYTES].tobytes(), int(index.shape[0]), idx_path(prefix))
    return index, dtype, count, documents


def check_idx_header(header: bytes, size: int, where: str) -> tuple[np.dtype, int, int]:
    """``(dtype, S, D)`` of the ``.idx`` at ``where`` (a file, an object) whose first bytes are ``header`` (up to
    :data:`HEADER_BYTES`) and whose size is ``size``, when they are a Megatron-LM index's (:func:`read_idx_header`
    says what is checked); MEGATRON_INDEX_INVALID naming ``where`` otherwise. The size is checked against the
    counts before anything after the header is read."""
    if size < HEADER_BYTES or len(header) < HEADER_BYTES:
        raise _invalid(f"{where} has {size} bytes; the header alone has {HEADER_BYTES}")
    if header[:len(IDX_MAGIC)] != IDX_MAGIC:
        raise _invalid(f"{where} does not start with {IDX_MAGIC!r}: not a Megatron-LM index (MMapIndexedDataset)")
    version, code, count, documents = struct.unpack("<QBQQ", header[len(IDX_MAGIC):HEADER_BYTES])
    if version != IDX_VERSION:
        raise _invalid(f"{where} has version {version}; this reader reads version {IDX_VERSION}")
    if code not in DTYPE_CODES or np.dtype(DTYPE_CODES[code]).kind not in "iu":
        named = DTYPE_CODES[code].__name__ if code in DTYPE_CODES else "none"
        integer_codes = ", ".join(f"{c} {t.__name__}" for c, t in DTYPE_CODES.items() if np.dtype(t).kind in "iu")
        raise _invalid(f"{where} has dtype code {code} ({named}); token ids need an integer code, one of "
                       + integer_codes)
    plain = HEADER_BYTES + 12 * count + 8 * documents
    if size not in (plain, plain + count):
        raise _invalid(f"{where} has {size} bytes; {count} sequences and {documents} document indices need {plain} "
                       f"(or {plain + count} with sequence modes)")
    if count == 0:
        raise _invalid(f"{where} holds no sequence")
    return np.dtype(DTYPE_CODES[code]).newbyteorder("<"), int(count), int(documents)


def check_index_arrays(prefix: str, dtype: np.dtype, sizes, pointers, document_indices, bin_size: int) -> None:
    """MEGATRON_INDEX_INVALID unless every row is readable (:func:`check_rows`) and the document indices ascend
    from 0 to the sequence count: the checks of a whole index, a file's or an object store's (``prefix`` a path
    or a URL)."""
    count = sizes.shape[0]
    check_rows(prefix, dtype, sizes, pointers, bin_size)
    if document_indices.shape[0] < 1 or int(document_indices[0]) != 0 or int(document_indices[-1]) != count \
            or (document_indices.shape[0] > 1 and int(np.diff(document_indices).min()) < 0):
        raise _invalid(f"{idx_path(prefix)}: document indices must ascend from 0 to the sequence count {count}")


def check_rows(prefix: str, dtype: np.dtype, sizes, pointers, bin_size: int, first: int = 0) -> None:
    """MEGATRON_INDEX_INVALID unless every size is not negative and every pointer is aligned with its
    sequence inside the ``.bin``; ``sizes`` and ``pointers`` may be a piece of the index starting at
    sequence ``first`` (tokens/mapped.py checks a mapped index a piece at a time)."""
    if sizes.shape[0] and int(sizes.min()) < 0:
        raise _invalid(f"{idx_path(prefix)}: sequence {first + int(np.argmin(sizes))} has a negative length")
    width = dtype.itemsize
    # pointer + size * width can wrap past 2^63 in int64 and look small: compare the size with the room
    # left after the pointer instead, which cannot overflow once 0 <= pointer <= bin_size.
    room = (np.int64(bin_size) - np.clip(pointers, 0, bin_size)) // width
    bad = np.flatnonzero((pointers < 0) | (pointers > bin_size) | (pointers % width != 0)
                         | (sizes.astype(np.int64) > room))
    if bad.size:
        row = int(bad[0])
        start, end = int(pointers[row]), int(pointers[row]) + int(sizes[row]) * width  # Python integers: exact
        raise _invalid(f"{idx_path(prefix)}: sequence {first + row} points at bytes {start} to {end}, "
                       f"outside the {bin_size}-byte {bin_path(prefix)} or not aligned to {width} bytes")


def _map(path: str) -> np.ndarray:
    """The file mapped read-only (a regular file: files/reader.py), an empty array when empty."""
    try:
        return reader.map_file(path, _invalid)
    except FileNotFoundError:
        raise _invalid(f"{path} does not exist (a Megatron dataset is PREFIX.idx with PREFIX.bin)") from None


def _view(buffer: np.ndarray, offset: int, dtype: str, count: int) -> np.ndarray:
    return np.frombuffer(buffer, dtype=dtype, count=count, offset=offset)


def _invalid(message: str) -> UmlosError:
    return UmlosError(errors.MEGATRON_INDEX_INVALID, message, operator=errors.BATCHING_OPERATOR)

