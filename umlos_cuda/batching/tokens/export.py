"""Export a token store as a Megatron-LM indexed dataset (``PREFIX.bin`` + ``PREFIX.idx``).

What goes in: a token store (``umlos-cuda data tokenize``) and an output
prefix. What comes out: the pair megatron-core's ``IndexedDataset`` reads,
in the MMapIndexedDataset layout :mod:`.megatron` documents and reads back:
the store's tokens as the ``.bin`` (one sequence per sample, in store
order, back to back), and an ``.idx`` with one document per sample
(document indices ``0, 1, ..., N``), so a team can tokenize here and train
with Megatron-LM. Token dtypes: a uint16 store stays uint16 (code 8); a
uint32 store becomes int32 (code 4), or int64 (code 5) when an id does not
fit int32 (Megatron has no uint32 code). Loss masks and sample ids are not
carried: a Megatron dataset has neither (every token is trained on, ids
are row numbers).

Why no artifact marker: megatron-core reads exactly the two files and
nothing else, so a marker file beside them would be a third file no reader
wants, and a marker inside them would change their bytes. The pair is
recognised instead by the ``.idx`` magic (``MMIDIDX``): ``force`` replaces
an ``.idx`` that starts with it and a ``.bin`` whose ``.idx`` does, never
another file (OUTPUT_EXISTS), and never a path the export reads, nor one
inside the store (OUTPUT_IS_INPUT). Both files are written aside in full
(files/atomic.py ``PendingFile``), then the ``.bin`` is published and the
``.idx`` after it, so a reader that finds the ``.idx`` finds its ``.bin``; a
replaced pair's old ``.idx`` is removed before the new ``.bin`` is
published, so an old index never describes a new ``.bin`` (a run killed
between those two steps leaves a ``.bin`` with no ``.idx``, which ``force``
then refuses like any other file: remove it by hand).
"""

from __future__ import annotations

import contextlib
import os
import struct

import numpy as np

from ... import errors
from ...errors import UmlosError
from ...files.artifacts import FileKind, read_head
from ...files.atomic import PendingFile, check_output_path, write_failed
from .megatron import HEADER_BYTES, IDX_MAGIC, IDX_VERSION, MegatronDataset, bin_path, idx_path
from .store import TokenStore

#: Megatron-LM's dtype codes of the token dtypes an export writes.
_CODES = {np.dtype("<u2"): 8, np.dtype("<i4"): 4, np.dtype("<i8"): 5}
#: Tokens written to the .bin at a time.
_CHUNK = 1 << 22
_INT32_MAX = (1 << 31) - 1


def _is_megatron_index(path: str) -> bool:
    return read_head(path, len(IDX_MAGIC)) == IDX_MAGIC


def _is_megatron_data(path: str) -> bool:
    return path.endswith(".bin") and _is_megatron_index(path[:-len(".bin")] + ".idx")


MEGATRON_INDEX = FileKind("Megatron-LM index (.idx)", _is_megatron_index)
MEGATRON_DATA = FileKind("Megatron-LM .bin beside its .idx", _is_megatron_data)


def export_dtype(store: TokenStore) -> np.dtype:
    """The little-endian dtype the store's tokens are written as (module docstring)."""
    if store.tokens.dtype == np.dtype("<u2"):
        return np.dtype("<u2")
    if int(store.tokens.max(initial=0)) <= _INT32_MAX:
        return np.dtype("<i4")
    return np.dtype("<i8")


def index_bytes(sizes: np.ndarray, dtype: np.dtype) -> bytes:
    """The whole ``.idx`` for sequences of ``sizes`` tokens stored back to back, one document each."""
    count = int(sizes.shape[0])
    pointers = np.zeros(count, dtype="<i8")
    np.cumsum(sizes[:-1], dtype="<i8", out=pointers[1:])
    pointers *= dtype.itemsize
    header = IDX_MAGIC + struct.pack("<QBQQ", IDX_VERSION, _CODES[dtype], count, count + 1)
    assert len(header) == HEADER_BYTES
    return b"".join((header, sizes.astype("<i4").tobytes(), pointers.tobytes(),
                     np.arange(count + 1, dtype="<i8").tobytes()))


def export_megatron(store: TokenStore | str | os.PathLike[str], prefix: str | os.PathLike[str], *,
                    force: bool = False, inputs=()) -> MegatronDataset:
    """Write ``store`` as ``prefix.bin`` / ``prefix.idx`` and return the pair opened.

    Every output check runs before any byte is written (OUTPUT_PATH_INVALID,
    OUTPUT_EXISTS, OUTPUT_IS_INPUT); ``inputs``: further paths the command
    reads. The result is opened with :class:`MegatronDataset`, whose checks
    it passes, with the store's tokenizer hash."""
    if not isinstance(store, TokenStore):
        store = TokenStore.open(store)
    prefix = os.fspath(prefix)
    if prefix.endswith((".idx", ".bin")):
        prefix = prefix[:-4]
    reads = (store.root, *inputs)
    data_path, index_path = bin_path(prefix), idx_path(prefix)
    check_output_path(data_path, force, kind=MEGATRON_DATA, inputs=reads)
    check_output_path(index_path, force, kind=MEGATRON_INDEX, inputs=reads)
    sizes = np.diff(np.asarray(store.offsets, dtype=np.int64))
    if sizes.shape[0] and int(sizes.max()) > _INT32_MAX:
        row = int(np.argmax(sizes))
        raise _invalid(f"sample {row} of {store.root} has {int(sizes[row])} tokens; a Megatron index holds at most "
                       f"{_INT32_MAX} a sequence")
    dtype = export_dtype(store)
    index = index_bytes(sizes, dtype)
    data = PendingFile(data_path, force=force, size=store.num_tokens * dtype.itemsize, kind=MEGATRON_DATA,
                       inputs=reads)
    pending = [data]
    try:
        tokens = store.tokens
        for start in range(0, tokens.shape[0], _CHUNK):
            try:
                data.handle.write(tokens[start:start + _CHUNK].astype(dtype, copy=False).tobytes())
            except OSError as exc:
                raise write_failed(data_path, exc) from exc
        data.finish()
        head = PendingFile(index_path, force=force, size=len(index), kind=MEGATRON_INDEX, inputs=reads)
        pending.append(head)
        try:
            head.handle.write(index)
        except OSError as exc:
            raise write_failed(index_path, exc) from exc
        head.finish()
        if force:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(index_path)  # an old index never describes the new .bin
        data.publish()
    except BaseException:
        for file in pending:
            file.discard()
        raise
    try:
        head.publish()
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(data_path)  # no .bin is left without the index this run wrote for it
        head.discard()
        raise
    return MegatronDataset.open(prefix, tokenizer_hash=store.tokenizer_hash)


def _invalid(message: str) -> UmlosError:
    return UmlosError(errors.MEGATRON_INDEX_INVALID, message, operator=errors.BATCHING_OPERATOR)
