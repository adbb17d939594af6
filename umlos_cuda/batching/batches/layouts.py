"""Batch file layouts: how a collated microbatch is laid out on disk, and read back.

What goes in: a layout's name (``compact``, the default, or ``npz``, the
six-array layout of npz.py, byte for byte as before), an optional
compression (``zstd``, compact only; the ``zstandard`` package of the
``data`` extra, imported when used) and, for compact files, the token type
the writer chose from the store (compact.py). What comes out: a
:class:`Layout` that names its files, makes their bytes, reads them through
the bounded reader (files/reader.py) and turns them back into the same dict
whatever the layout: the six int32 arrays of collation and the plan's
``sample_ids``, ``rows``, ``row_sizes``, ``bucket_id``, ``epoch``,
``index``, ``max_len``, ``plan_fingerprint`` and ``fingerprint``.

``batches.json`` says which layout a folder holds: an ``npz`` folder's index
is exactly as before (format ``umlos_cuda.batch_files/1``, no layout field),
any other's has format ``umlos_cuda.batch_files/2`` and the fields
``layout``, ``compression`` and ``token_dtype`` (:meth:`Layout.identity`),
so a reader that predates them refuses it instead of misreading it. A folder
whose plan is not a whole plan has format ``umlos_cuda.batch_files/3``
(provenance.py) and the three fields whatever its layout, ``npz`` included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import errors
from ...errors import UmlosError
from ...files import reader
from . import compact
from .fingerprint import microbatch_digest
from .provenance import FILES_FORMAT_V3
from .npz import (FILES_FORMAT, MEMBERS, batch_file_name, check_batch_file, file_arrays, file_error, npz_bytes,
                  plan_members, row_sizes)
from ..collate import CollatedBatch

#: batches.json ``format`` of a folder in a layout other than ``npz``.
FILES_FORMAT_V2 = "umlos_cuda.batch_files/2"
LAYOUTS = ("compact", "npz", "index")
COMPRESSIONS = ("none", "zstd")
DEFAULT_LAYOUT = "compact"
#: zstd level: ratio close to the slower levels' on token ids, at a few hundred MB/s.
ZSTD_LEVEL = 3


@dataclass(frozen=True)
class Layout:
    """A batch file layout: ``name`` (:data:`LAYOUTS`), ``compression`` (None or ``"zstd"``) and
    ``token_dtype`` (``<u2`` or ``<u4`` for compact files, None for the others). ``index`` holds no
    files: batches.json names each microbatch's digest and the reader collates it from the token
    store (reader.py)."""

    name: str = DEFAULT_LAYOUT
    compression: str | None = None
    token_dtype: str | None = None

    def __post_init__(self) -> None:
        if self.name not in LAYOUTS:
            raise config_error(f"the batch file layout must be one of {', '.join(LAYOUTS)}, got {self.name!r}")
        if self.compression not in (None, "zstd"):
            raise config_error(f"the batch file compression must be one of {', '.join(COMPRESSIONS)}, got "
                               f"{self.compression!r}")
        if self.name != "compact" and self.compression is not None:
            raise config_error(f"--compress zstd applies to the compact layout, not {self.name} (the npz layout is "
                               "the seed's uncompressed six-array file, kept byte for byte; index holds no files)")
        if (self.token_dtype in compact.TOKEN_DTYPES) != (self.name == "compact") or \
                (self.name != "compact" and self.token_dtype is not None):
            raise config_error(f"token_dtype must be one of {', '.join(compact.TOKEN_DTYPES)} for the compact "
                               f"layout and None for the others, got {self.token_dtype!r} for {self.name}")

    @classmethod
    def choose(cls, name: str = DEFAULT_LAYOUT, compression: str | None = None, *, source: Any = None,
               separator_ids=()) -> Layout:
        """The layout ``name`` with ``compression`` (``"none"`` is None), its token type chosen from
        ``source`` (compact.py, :func:`~umlos_cuda.batching.batches.compact.token_dtype_for`)."""
        compression = None if compression in (None, "none") else compression
        dtype = compact.token_dtype_for(source, separator_ids) if name == "compact" else None
        layout = cls(name, compression, dtype)
        if compression == "zstd":
            _zstandard(config_error)
        return layout

    @classmethod
    def from_index(cls, data: dict, path: str) -> Layout:
        """The layout a batches.json (already read) names; BATCH_FILE_INVALID when it names none."""
        if data.get("format") == FILES_FORMAT:
            return cls("npz")
        name, compression, dtype = data.get("layout"), data.get("compression"), data.get("token_dtype")
        bare = name in (("index", "npz") if data.get("format") == FILES_FORMAT_V3 else ("index",))
        known = (name == "compact" and compression in (None, "zstd") and dtype in compact.TOKEN_DTYPES) or \
            (bare and compression is None and dtype is None)
        if not known:
            raise file_error(f"{path}: layout {name!r}, compression {compression!r}, token_dtype {dtype!r} is no "
                             f"batch file layout (compact with compression null or 'zstd' and token_dtype one of "
                             f"{', '.join(compact.TOKEN_DTYPES)}; index, or npz in format 3, with both null)")
        return cls(str(name), compression, dtype)

    @property
    def has_files(self) -> bool:
        return self.name != "index"

    @property
    def suffix(self) -> str:
        return ".npz.zst" if self.compression == "zstd" else ".npz"

    def identity(self) -> dict:
        """The fields batches.json records (and a resumed run compares) for a whole plan's folder: none beyond
        the format for ``npz``."""
        if self.name == "npz":
            return {"format": FILES_FORMAT}
        return {"format": FILES_FORMAT_V2, **self.fields()}

    def fields(self) -> dict:
        """``layout``, ``compression`` and ``token_dtype``: what a format-2 or format-3 batches.json records."""
        return {"layout": self.name, "compression": self.compression, "token_dtype": self.token_dtype}

    def file_name(self, epoch: int, index: int) -> str:
        return batch_file_name(epoch, index, self.suffix)

    # ------------------------------------------------------------------ writing
    def plain_bytes(self, epoch: int, microbatch: Any, batch: CollatedBatch, plan_fingerprint: str | None,
                    pad_id: int) -> tuple[bytes, str]:
        """The file's bytes before compression, and the microbatch's content digest."""
        digest = microbatch_digest(batch.input_ids, batch.loss_mask)
        if self.name == "npz":
            return npz_bytes(file_arrays(epoch, microbatch, batch, plan_fingerprint, digest)), digest
        if self.token_dtype is None:  # index: no file (the writer and reader never ask for one)
            raise config_error(f"the {self.name} layout has no batch files")
        return npz_bytes(compact.encode(batch, epoch, microbatch, digest, self.token_dtype, pad_id=pad_id)), digest

    def file_bytes(self, epoch: int, microbatch: Any, batch: CollatedBatch, plan_fingerprint: str | None,
                   pad_id: int) -> tuple[bytes, str]:
        """The file's bytes as written, and the microbatch's content digest."""
        data, digest = self.plain_bytes(epoch, microbatch, batch, plan_fingerprint, pad_id)
        if self.compression == "zstd":
            zstandard = _zstandard(config_error)
            data = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True).compress(data)
        return data, digest

    # ------------------------------------------------------------------ reading
    def read(self, path: str) -> dict[str, np.ndarray]:
        """The members of the file at ``path``, through the bounded reader (BATCH_FILE_INVALID)."""
        members = MEMBERS if self.name == "npz" else compact.MEMBERS
        try:
            if self.compression == "zstd":
                data = reader.read_zstd(path, file_error, max_bytes=reader.MAX_NPZ_BYTES,
                                        max_output=reader.MAX_NPZ_BYTES, what="batch file")
                return reader.read_npz_bytes(data, path, members, file_error)
            return reader.read_npz(path, members, file_error)
        except FileNotFoundError:
            raise file_error(f"{path} is missing (run `umlos-cuda batch generate` again to write it)") from None

    def arrays(self, members: dict[str, np.ndarray], epoch: int, microbatch: Any, plan_fingerprint: str,
               pad_id: int, path: str) -> dict[str, np.ndarray]:
        """The dict a reader hands out (the ``npz`` layout's members) from a file's ``members``."""
        if self.name == "npz":
            return members
        batch = compact.decode(members, pad_id, path)
        out: dict[str, np.ndarray] = batch.as_dict()
        out.update(plan_members(epoch, microbatch, plan_fingerprint, str(members["fingerprint"])))
        return out

    def check(self, path: str, members: dict[str, np.ndarray], epoch: int, microbatch: Any, plan_fingerprint: str,
              digest: str | None, pad_id: int) -> None:
        """BATCH_FILE_INVALID unless the file is ``microbatch``'s, whole and consistent (npz.py's
        :func:`~umlos_cuda.batching.batches.npz.check_batch_file` for ``npz``; for compact files:
        its numbers are the plan's, its members decode, its token type is the folder's, and the
        decoded tokens and mask hash to its recorded digest and to ``digest``)."""
        if self.name == "npz":
            check_batch_file(path, members, epoch, microbatch, plan_fingerprint, digest, pad_id=pad_id)
            return
        expected = {"epoch": epoch, "index": microbatch.index, "max_len": microbatch.max_len}
        for name, value in expected.items():
            found = members[name].item() if members[name].shape == () else None
            if found != value:
                raise file_error(f"{path}: {name} is {found!r}; the plan's microbatch has {value!r}")
        if members["input_ids"].dtype.str != self.token_dtype:
            raise file_error(f"{path}: input_ids is {members['input_ids'].dtype.str}; this folder's files hold "
                             f"{self.token_dtype}")
        if not np.array_equal(members["row_sizes"], row_sizes(microbatch)):
            raise file_error(f"{path} holds other rows than the plan's epoch {epoch} microbatch {microbatch.index}")
        recorded = members["fingerprint"]
        if recorded.dtype.kind != "U" or recorded.shape != ():
            raise file_error(f"{path}: fingerprint is {recorded.dtype} {recorded.shape}; expected a text scalar")
        batch = compact.decode(members, pad_id, path)
        content = microbatch_digest(batch.input_ids, batch.loss_mask)
        if content != str(recorded) or (digest is not None and content != digest):
            raise file_error(f"{path}: its tokens and loss mask hash to {content}; the file records {recorded}"
                             + (f" and batches.json {digest}" if digest is not None else ""))

    def same_content(self, path: str, plain: bytes) -> bool:
        """Whether the file at ``path`` holds exactly ``plain`` (after decompression: a zstd file
        written by another zstd version, or at another level, holds the same content)."""
        if self.compression == "zstd":
            data = reader.read_zstd(path, file_error, max_bytes=reader.MAX_NPZ_BYTES,
                                    max_output=reader.MAX_NPZ_BYTES, what="batch file")
            return data == plain
        return reader.same_bytes(path, plain, file_error)


def _zstandard(error):
    try:
        import zstandard
    except ImportError:
        raise error("zstd batch files need the zstandard package: pip install 'umlos-cuda[data]'") from None
    return zstandard


def config_error(message: str) -> UmlosError:
    return UmlosError(errors.BATCHING_CONFIG_INVALID, message, operator=errors.BATCHING_OPERATOR)

