"""The length cache: one token count per sample, in dataset order.

What goes in: sample ids, lengths and the fingerprint of the tokenizer that
counted them. What comes out: two files written atomically side by side,

* ``lengths.jsonl``, the interchange format, one row per sample::

      {"sample_id": "train_00001", "tokenizer_hash": "ab12...", "length": 247}

* ``lengths.jsonl.u32``, a binary sidecar for fast loading: the same lengths
  as little-endian uint32 after a small JSON header that binds them to the
  JSONL (row count, tokenizer hash, size and SHA-256 of the JSONL bytes,
  SHA-256 of the length bytes). docs/batching.md, "Length cache files",
  gives the byte layout.

The JSONL is the source of truth; the sidecar only saves parsing it. So
:meth:`LengthCache.load` uses the sidecar when it is present and agrees with
the JSONL, and otherwise parses the JSONL (``sidecar="require"`` makes a
missing or stale sidecar an error instead). Lengths live in one NumPy array
(4 bytes a sample); the ids, which cost a Python string each, are read from
the JSONL only when asked for, and not at all when they are the line numbers
``"0"``, ``"1"``, ... . Plain ids read from the JSONL stay one array of bytes
(:class:`~.plain_ids.PlainIds`, :attr:`LengthCache.plain_ids`) until a caller
asks for :attr:`LengthCache.sample_ids`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import struct
import warnings
from collections.abc import Iterable, Sequence
from json.encoder import encode_basestring_ascii
from typing import BinaryIO

import numpy as np
import orjson

from ... import checks, errors
from ...files import reader
from ...files.artifacts import FileKind, read_head
from ...files.atomic import PendingFile, check_output_path, write_failed
from ...files.folder import Folder
from ...errors import UINT32_MAX, UmlosError
from .plain_ids import PlainIds
from .rows import parse_block, row_tail, scan_rows

#: Suffix of the binary sidecar, appended to the JSONL's name.
SIDECAR_SUFFIX = ".u32"
SIDECAR_MAGIC = b"UMLOSLEN"
SIDECAR_VERSION = 1
#: The length bytes start at a multiple of this, so the array maps aligned.
SIDECAR_ALIGN = 16
SIDECAR_MODES = ("auto", "require", "ignore")
#: The longest sidecar header read (this project writes a few hundred bytes).
MAX_SIDECAR_HEADER_BYTES = 1 << 16
#: Lengths hashed between two releases of a mapped sidecar's pages (16 MiB).
HASH_PIECE = 1 << 22


def sidecar_path(path: str | os.PathLike[str]) -> str:
    """The sidecar that belongs to the JSONL at ``path``."""
    return os.fspath(path) + SIDECAR_SUFFIX


class LengthCache:
    """Token lengths of a dataset's samples, in dataset order.

    ``lengths`` is a read-only ``uint32`` array; ``sample_ids[i]`` names the
    sample of ``lengths[i]``; ``tokenizer_hash`` is the
    :func:`~umlos_cuda.batching.lengths.fingerprints.tokenizer_fingerprint` of the
    tokenizer that counted them. ``dataset_hash`` is the
    :func:`~umlos_cuda.batching.lengths.fingerprints.dataset_fingerprint` when the
    cache was built from a dataset and loaded with its sidecar, else None.
    ``tokenizer_parts`` is the tokenizer's parts hashed alone when the cache is
    a token store's that records them (a plan built from it keeps them, to name
    the parts another store's tokenizer differs in); a length cache file holds
    none.
    """

    __slots__ = ("lengths", "tokenizer_hash", "dataset_hash", "ids_are_line_numbers", "_sample_ids", "_ids_source",
                 "tokenizer_parts")

    def __init__(self, lengths: np.ndarray, tokenizer_hash: str, *, sample_ids: list[str] | PlainIds | None = None,
                 ids_are_line_numbers: bool = False, ids_source: str | None = None,
                 dataset_hash: str | None = None) -> None:
        # Internal: use from_arrays() or load(), which validate.
        self.lengths = lengths
        self.tokenizer_hash = tokenizer_hash
        self.dataset_hash = dataset_hash
        self.ids_are_line_numbers = ids_are_line_numbers
        self._sample_ids = sample_ids
        self._ids_source = ids_source
        self.tokenizer_parts: dict[str, str] | None = None

    # ------------------------------------------------------------------ access
    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    def __repr__(self) -> str:
        return f"LengthCache({len(self)} samples, tokenizer_hash={self.tokenizer_hash[:12]}...)"

    @property
    def sample_ids(self) -> list[str]:
        """The ids, read on first use (from the JSONL, or made from line numbers)."""
        ids = self._ids()
        return ids.tolist() if isinstance(ids, PlainIds) else ids

    @property
    def plain_ids(self) -> PlainIds | None:
        """The ids as one array of bytes when they were read from the JSONL and are all plain
        (what ``plan build`` writes from without making a string per id); None otherwise."""
        if self.ids_are_line_numbers:
            return None
        ids = self._ids()
        return ids if isinstance(ids, PlainIds) else None

    def first_sample_id(self) -> str:
        """The first row's id, reading one line of the JSONL when the ids are not held: whether a cache
        holds preference pairs shows in its first id (pairs.py), which a windowed plan asks without
        holding 10^9 ids."""
        if self._sample_ids is not None or self.ids_are_line_numbers:
            return self._ids()[0] if self._sample_ids is not None else "0"
        assert self._ids_source is not None  # load() keeps the JSONL's path when it defers the ids
        with reader.open_regular(self._ids_source, _invalid) as handle:
            line = handle.readline(reader.MAX_LINE_BYTES + 1)
        row = reader.loads_json(line, _invalid, f"line 1 of {self._ids_source}")
        sample_id = row.get("sample_id") if isinstance(row, dict) else None
        if not isinstance(sample_id, str):
            raise _invalid(f"line 1 of {self._ids_source} has no string sample_id")
        return sample_id

    def _ids(self) -> list[str] | PlainIds:
        """The ids as held, read on first use."""
        if self._sample_ids is None:
            if self.ids_are_line_numbers:
                self._sample_ids = [str(i) for i in range(len(self))]
            else:
                assert self._ids_source is not None  # load() keeps the JSONL's path when it defers the ids
                ids, lengths, _, _ = _parse_jsonl(self._ids_source)
                if not np.array_equal(lengths, self.lengths):  # the JSONL changed since load()
                    raise UmlosError(errors.LENGTHS_SIDECAR_MISMATCH,
                                     f"{self._ids_source} changed after it was loaded; load it again",
                                     operator=errors.BATCHING_OPERATOR)
                self._sample_ids = ids
        return self._sample_ids

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_arrays(cls, sample_ids: Sequence[str] | None, lengths: Iterable[int] | np.ndarray,
                    tokenizer_hash: str, *, dataset_hash: str | None = None) -> LengthCache:
        """A cache from ids and lengths in dataset order.

        ``sample_ids=None`` means the line numbers ``"0"``, ``"1"``, ...
        (what ``data lengths build`` writes for records without ``id``),
        without making N strings. Ids must be distinct strings, lengths
        integers in [0, 2^32 - 1], and there must be at least one sample.
        """
        _check_hash(tokenizer_hash, "tokenizer_hash")
        if dataset_hash is not None:
            _check_hash(dataset_hash, "dataset_hash")
        array = _as_lengths(lengths)
        ids = None
        if sample_ids is not None:
            ids = list(sample_ids)
            if len(ids) != array.shape[0]:
                raise _invalid(f"{len(ids)} sample ids but {array.shape[0]} lengths; give one id per length")
            for position, sample_id in enumerate(ids):
                checks.text(sample_id, position, fail=_invalid,  # type: ignore[arg-type]  # the name: its position
                            message="sample id #{name} is {type} {value!r}; ids are strings")
            _check_unique(ids, "sample ids")
        array.flags.writeable = False
        return cls(array, tokenizer_hash, sample_ids=ids, ids_are_line_numbers=ids is None, dataset_hash=dataset_hash)

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, sidecar: str = "auto", read_ids: bool = False) -> LengthCache:
        """Read the cache at ``path`` (the JSONL).

        ``sidecar``: ``"auto"`` (default) reads the lengths from the sidecar
        when it exists and matches the JSONL (its size and SHA-256 are
        checked, which reads the JSONL once but parses nothing), otherwise
        parses the JSONL, with a warning when a sidecar was there but stale;
        ``"require"`` raises LENGTHS_SIDECAR_MISMATCH instead of parsing;
        ``"ignore"`` always parses.

        ``read_ids``: read the ids now, in the same read of the JSONL that
        checks the sidecar, instead of on first use (for a caller that will
        use them, as ``plan build`` does: one read instead of two).
        """
        path = os.fspath(path)
        if sidecar not in SIDECAR_MODES:
            raise _invalid(f"sidecar must be one of {', '.join(SIDECAR_MODES)}, got {sidecar!r}")
        _require_file(path)
        if sidecar != "ignore":
            try:
                return _load_with_sidecar(path, read_ids)
            except UmlosError as exc:
                if sidecar == "require" or exc.code != errors.LENGTHS_SIDECAR_MISMATCH:
                    raise
                if os.path.exists(sidecar_path(path)):
                    warnings.warn(f"{exc.message}; reading the lengths from {path} instead", stacklevel=2)
        ids, lengths, tokenizer_hash, _ = _parse_jsonl(path)
        lengths.flags.writeable = False
        line_numbers = ids[-1] == str(len(ids) - 1) and list(ids) == list(map(str, range(len(ids))))
        return cls(lengths, tokenizer_hash, sample_ids=ids, ids_are_line_numbers=line_numbers)

    # ------------------------------------------------------------------ output
    def write(self, path: str | os.PathLike[str], *, force: bool = False, inputs: Iterable = ()) -> None:
        """Write the JSONL and its sidecar, each atomically (temp file, fsync,
        rename). ``force`` replaces an existing length cache (and nothing
        else); otherwise an existing file raises OUTPUT_EXISTS before anything
        is written. ``inputs``: paths the output must not be (OUTPUT_IS_INPUT)."""
        with LengthCacheWriter(path, self.tokenizer_hash, force=force, dataset_hash=self.dataset_hash,
                               inputs=inputs) as writer:
            step = 1 << 16
            for start in range(0, len(self), step):
                stop = min(start + step, len(self))
                ids = None if self.ids_are_line_numbers else self.sample_ids[start:stop]
                writer.add(ids, self.lengths[start:stop])


class LengthCacheWriter:
    """Stream rows into a length cache: ``add()`` chunks, then close.

    Memory stays at the lengths array (4 bytes a sample) whatever the ids
    are: rows go to the JSONL's temp file as they come. On a clean exit both
    files are written in full (the JSONL's temp file and the sidecar's), then
    the JSONL is published, then the sidecar; on an exception neither file
    appears (a replaced pair's old sidecar is removed before the new JSONL is
    published, so a stale sidecar never sits beside a new JSONL, and a
    published JSONL whose sidecar cannot be published is removed again).
    ``dataset_hash`` may be set until the block ends; :meth:`cache` gives the
    result afterwards.

    ``folder``: write ``path`` as a new name inside this open folder instead
    (a token store's temp folder, which the output layer publishes whole).
    """

    def __init__(self, path: str | os.PathLike[str], tokenizer_hash: str, *, force: bool = False,
                 dataset_hash: str | None = None, inputs: Iterable = (), folder: Folder | None = None) -> None:
        _check_hash(tokenizer_hash, "tokenizer_hash")
        self.folder = folder
        self.inputs = tuple(inputs)
        if folder is None:
            self.path, self.sidecar = check_length_cache_output(path, force, self.inputs)
        else:
            self.path, self.sidecar = folder.join(os.fspath(path)), folder.join(sidecar_path(path))
            self._name = os.fspath(path)
        self.force = force
        self.tokenizer_hash = tokenizer_hash
        self.dataset_hash = dataset_hash
        self.ids_are_line_numbers = True  # until an id says otherwise
        self._lengths: np.ndarray | None = None
        self._row_tail = f', "tokenizer_hash": {encode_basestring_ascii(tokenizer_hash)}, "length": '
        self._chunks: list[np.ndarray] = []
        self._count = 0
        self._digest = hashlib.sha256()
        self._size = 0
        self._pending: PendingFile | None = None
        self._handle: BinaryIO | None = None

    def __enter__(self) -> LengthCacheWriter:
        if self.folder is None:
            self._pending = PendingFile(self.path, force=self.force, kind=LENGTH_CACHE, inputs=self.inputs)
            self._handle = self._pending.handle
        else:
            self._handle = self.folder.create(self._name)
        return self

    def add(self, sample_ids: Sequence[str] | None, lengths: Sequence[int] | np.ndarray) -> None:
        """Append rows; ``sample_ids=None`` means the line numbers ``str(row)``."""
        array = _as_lengths(lengths, allow_empty=True)
        ids: Sequence[str] | range
        if sample_ids is None:
            ids = range(self._count, self._count + array.shape[0])
        elif len(sample_ids) != array.shape[0]:
            raise _invalid(f"{len(sample_ids)} sample ids but {array.shape[0]} lengths")
        else:
            ids = sample_ids
            if self.ids_are_line_numbers:
                self.ids_are_line_numbers = all(sample_id == str(row)
                                                for row, sample_id in enumerate(sample_ids, self._count))
        tail = self._row_tail
        text = "".join(
            f'{{"sample_id": {encode_basestring_ascii(str(sample_id))}{tail}{length}}}\n'
            for sample_id, length in zip(ids, array.tolist())
        ).encode("ascii")
        if self._handle is None:
            raise _invalid(f"rows are added to {self.path} inside its `with` block")
        try:
            self._handle.write(text)
        except OSError as exc:
            raise write_failed(self.path, exc) from exc
        self._digest.update(text)
        self._size += len(text)
        self._chunks.append(array)
        self._count += array.shape[0]

    def __exit__(self, kind, value, traceback) -> None:
        try:
            if kind is not None:
                raise value
            if self._count == 0:
                raise _invalid(f"no rows were written to {self.path}; a length cache holds at least one sample")
            lengths = np.concatenate(self._chunks).astype("<u4", copy=False)
            self._chunks = []
            sidecar = _sidecar_bytes(lengths, {
                "count": self._count,
                "tokenizer_hash": self.tokenizer_hash,
                "dataset_hash": self.dataset_hash,
                "jsonl_size": self._size,
                "jsonl_sha256": self._digest.hexdigest(),
                "sample_ids": "line_numbers" if self.ids_are_line_numbers else "jsonl",
            })
            if self._pending is not None:
                self._publish(self._pending, sidecar)
            elif self.folder is not None and self._handle is not None:
                self._finish_in_folder(self.folder, self._handle, sidecar)
        except BaseException:
            self._discard()
            raise
        lengths.flags.writeable = False
        self._lengths = lengths

    def _publish(self, pending: PendingFile, sidecar: bytes) -> None:
        """Both files written in full, then published: the JSONL first, the sidecar after."""
        pending.finish()
        side = PendingFile(self.sidecar, force=self.force, size=len(sidecar), kind=SIDECAR, inputs=self.inputs)
        try:
            try:
                side.handle.write(sidecar)
            except OSError as exc:
                raise write_failed(self.sidecar, exc) from exc
            side.finish()
            if self.force:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.sidecar)  # never leave the old sidecar beside the new JSONL
            pending.publish()
        except BaseException:
            side.discard()
            raise
        try:
            side.publish()
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(self.path)  # no JSONL is left without the sidecar this run wrote for it
            side.discard()
            raise

    def _finish_in_folder(self, folder: Folder, handle: BinaryIO, sidecar: bytes) -> None:
        with handle:
            handle.flush()
            os.fsync(handle.fileno())
        folder.write_bytes(sidecar_path(self._name), sidecar)

    def _discard(self) -> None:
        if self._pending is not None:
            self._pending.discard()
        elif self._handle is not None and self.folder is not None:
            with contextlib.suppress(OSError):
                self._handle.close()
            with contextlib.suppress(OSError):
                os.unlink(self._name, dir_fd=self.folder.fd)

    def cache(self) -> LengthCache:
        """The cache just written (its ids are read from the file when asked for)."""
        if self._lengths is None:
            raise _invalid(f"{self.path} has not been written yet")
        return LengthCache(self._lengths, self.tokenizer_hash, ids_are_line_numbers=self.ids_are_line_numbers,
                           ids_source=self.path, dataset_hash=self.dataset_hash)


def check_length_cache_output(path: str | os.PathLike[str], force: bool, inputs: Iterable = ()) -> tuple[str, str]:
    """The JSONL and sidecar paths of a length cache to write, refused before
    any work (OUTPUT_PATH_INVALID, OUTPUT_EXISTS, OUTPUT_IS_INPUT): ``force``
    replaces a length cache, never a file of another kind nor an input."""
    jsonl = check_output_path(path, force, kind=LENGTH_CACHE, inputs=inputs)
    return jsonl, check_output_path(sidecar_path(jsonl), force, kind=SIDECAR, inputs=inputs)


def _is_length_cache(path: str) -> bool:
    """A length cache file: its first line is a row ``{"sample_id", "tokenizer_hash",
    "length"}`` (or the file is empty), or a sidecar of ours sits beside it."""
    head = read_head(path, 1 << 16)
    if head == b"":
        return True
    first = head.split(b"\n", 1)[0] if head else b""
    try:  # nesting measured first (files/reader.py): no parse of a line deeper than the input layer allows
        row = json.loads(first) if first and reader.json_depth(first) <= reader.MAX_JSON_DEPTH else None
    except ValueError:
        row = None
    if isinstance(row, dict) and set(row) == {"sample_id", "tokenizer_hash", "length"}:
        return True
    return _is_sidecar(sidecar_path(path))


def _is_sidecar(path: str) -> bool:
    head = read_head(path, len(SIDECAR_MAGIC))
    return head == b"" or head == SIDECAR_MAGIC


#: A length cache's JSONL: the one file kind ``--force`` recognises by its content (a file holds no marker).
LENGTH_CACHE = FileKind("length cache", _is_length_cache)
#: The binary sidecar beside it.
SIDECAR = FileKind("length cache sidecar", _is_sidecar)


# ---------------------------------------------------------------------- sidecar
def _sidecar_bytes(lengths: np.ndarray, fields: dict) -> bytes:
    data = lengths.tobytes()
    header = dict(fields, format_version=SIDECAR_VERSION, lengths_sha256=hashlib.sha256(data).hexdigest())
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("ascii")
    prefix = SIDECAR_MAGIC + struct.pack("<I", len(text)) + text
    prefix += b"\0" * (-len(prefix) % SIDECAR_ALIGN)
    return prefix + data


def read_sidecar_header(path: str) -> tuple[dict, int]:
    """The sidecar's header fields and the offset of its length bytes (a regular file whose header
    is at most :data:`MAX_SIDECAR_HEADER_BYTES`, read by files/reader.py)."""
    try:
        with reader.open_regular(path, _sidecar_error) as handle:
            size = sidecar_header_size(handle.read(SIDECAR_PREAMBLE), path)
            text = handle.read(size)
    except FileNotFoundError:
        raise _sidecar_error(f"{path} does not exist") from None
    except OSError as exc:
        raise _sidecar_error(f"cannot read {path}: {exc.strerror or exc}") from exc
    return parse_sidecar_header(text, size, path)


#: Bytes before a sidecar's header text: the magic and the header's length (uint32).
SIDECAR_PREAMBLE = len(SIDECAR_MAGIC) + 4


def sidecar_header_size(head: bytes, where: str) -> int:
    """The header length the first :data:`SIDECAR_PREAMBLE` bytes ``head`` of the sidecar at ``where`` (a file, an
    object) announce, checked before the header is read: the magic, and at most :data:`MAX_SIDECAR_HEADER_BYTES`."""
    if len(head) < SIDECAR_PREAMBLE or head[:len(SIDECAR_MAGIC)] != SIDECAR_MAGIC:
        raise _sidecar_error(f"{where} is not a length cache sidecar (no {SIDECAR_MAGIC.decode()} magic)")
    (size,) = struct.unpack("<I", head[len(SIDECAR_MAGIC):SIDECAR_PREAMBLE])
    if size > MAX_SIDECAR_HEADER_BYTES:
        raise _sidecar_error(f"{where} announces a header of {size:,} bytes; a sidecar's header is at most "
                             f"{MAX_SIDECAR_HEADER_BYTES:,} (write the cache again)")
    return size


def parse_sidecar_header(text: bytes, size: int, where: str) -> tuple[dict, int]:
    """The header fields in ``text`` (the ``size`` bytes announced after the preamble of the sidecar at ``where``)
    and the offset of its length bytes; LENGTHS_SIDECAR_MISMATCH for a short, malformed or unknown header."""
    if len(text) != size:
        raise _sidecar_error(f"{where} has a truncated or malformed header")
    header = reader.loads_json(text, _sidecar_error, f"the header of {where}")
    checks.instance(header, where, dict, fail=_sidecar_error, message="{name} has a truncated or malformed header")
    if header.get("format_version") != SIDECAR_VERSION:
        raise _sidecar_error(f"{where} has format_version {header.get('format_version')!r}; "
                             f"this reader reads {SIDECAR_VERSION}")
    offset = SIDECAR_PREAMBLE + size
    return header, offset + (-offset % SIDECAR_ALIGN)


def _load_with_sidecar(path: str, read_ids: bool = False) -> LengthCache:
    side = sidecar_path(path)
    header, offset = read_sidecar_header(side)
    count = checks.integer(header.get("count"), "count", 1, None, message="has count {value!r}", strict=True,
                           fail=lambda message: _sidecar_error(f"{side} {message}"))
    try:
        jsonl_size = os.stat(path).st_size
        data_size = os.stat(side).st_size - offset
    except OSError as exc:
        raise _sidecar_error(f"cannot stat {path} or {side}: {exc.strerror or exc}") from exc
    if data_size != 4 * count:
        raise _sidecar_error(f"{side} holds {data_size} bytes of lengths; {count} samples need {4 * count}")
    if header.get("jsonl_size") != jsonl_size:
        raise _sidecar_error(f"{side} was written for a JSONL of {header.get('jsonl_size')} bytes; "
                             f"{path} has {jsonl_size}")
    with reader.open_regular(side, _sidecar_error) as handle:
        mapped = np.memmap(handle, dtype="<u4", mode="r", offset=offset, shape=(count,))
    lengths, release = np.asarray(mapped), _releaser(mapped)
    if piecewise_sha256(lengths, release) != header.get("lengths_sha256"):
        raise _sidecar_error(f"{side}: its length bytes do not match their SHA-256 in the header")
    malformed = "{name} has a malformed tokenizer_hash or dataset_hash"
    tokenizer_hash = checks.text(header.get("tokenizer_hash"), side, fail=_sidecar_error, message=malformed)
    dataset_hash = header.get("dataset_hash")
    if dataset_hash is not None:
        checks.text(dataset_hash, side, fail=_sidecar_error, message=malformed)
    ids_kind = checks.choice(header.get("sample_ids"), side, ("line_numbers", "jsonl"), fail=_sidecar_error,
                             message="{name} has sample_ids {value!r}; expected line_numbers or jsonl")
    if read_ids and ids_kind == "jsonl":
        ids = _ids_agreeing(path, header, lengths, tokenizer_hash)
        if ids is not None:
            return LengthCache(lengths, tokenizer_hash, sample_ids=ids, dataset_hash=dataset_hash)
    # One read of the JSONL: its SHA-256, and every row against what the sidecar says (rows.py).
    _, jsonl_sha256, bad = scan_rows(path, lengths, tokenizer_hash, ids_kind == "line_numbers", _invalid,
                                     release=release)
    if jsonl_sha256 != header.get("jsonl_sha256"):
        raise _sidecar_error(f"{side} was written for other JSONL content than {path} holds now")
    if bad is not None:
        raise _sidecar_error(f"{side} disagrees with {path} at row {bad + 1} (its length, tokenizer_hash or "
                             "line-number id): the sidecar was changed after it was written")
    return LengthCache(lengths, tokenizer_hash, ids_are_line_numbers=ids_kind == "line_numbers",
                       ids_source=path, dataset_hash=dataset_hash)


def _releaser(mapped: np.memmap):
    """A call that drops the pages of ``mapped`` this process has read from its resident set
    (``madvise(MADV_DONTNEED)``; they stay in the page cache and map again on the next read), so
    checking a sidecar of 10^9 lengths costs a piece of it in memory, not 4 GB; a no-op where the
    platform has no such advice."""
    handle = getattr(mapped, "_mmap", None)
    if handle is None or not hasattr(mmap, "MADV_DONTNEED"):
        return lambda: None
    return lambda: handle.madvise(mmap.MADV_DONTNEED)


def piecewise_sha256(lengths: np.ndarray, release) -> str:
    """The SHA-256 of ``lengths``' bytes, read :data:`HASH_PIECE` lengths at a time, each piece
    released once hashed."""
    digest = hashlib.sha256()
    for start in range(0, lengths.shape[0], HASH_PIECE):
        digest.update(lengths[start:start + HASH_PIECE].data)
        release()
    return digest.hexdigest()


def _ids_agreeing(path: str, header: dict, lengths: np.ndarray, tokenizer_hash: str) -> list[str] | PlainIds | None:
    """The ids of the JSONL when, parsed, it is what the sidecar says (its SHA-256, tokenizer hash
    and every length) and every row has the writer's shape (as :func:`scan_rows` asks); None
    otherwise, and the caller's check words what disagrees."""
    digest = hashlib.sha256()
    try:
        ids, parsed, parsed_hash, shaped = _parse_jsonl(path, digest)
    except UmlosError:
        return None
    if (not shaped or digest.hexdigest() != header.get("jsonl_sha256") or parsed_hash != tokenizer_hash
            or not np.array_equal(parsed, lengths)):  # rows of another shape were not written beside the sidecar
        return None
    return ids


# ---------------------------------------------------------------------- JSONL
def _parse_jsonl(path: str, digest=None) -> tuple[list[str] | PlainIds, np.ndarray, str, bool]:
    """The ids, lengths and tokenizer hash of the JSONL at ``path``, a block of lines at a time, and
    whether every row has the writer's shape (rows.py), byte for byte.

    A block of rows in the writer's own shape is read whole (rows.parse_block); any other block
    goes row by row (:func:`_parse_lines`), so what is refused, and the message, is the same.
    The ids are one :class:`PlainIds` when all are plain (:func:`_joined_ids`), else a list.
    Every byte read also goes to ``digest.update`` when a digest is given."""
    parts: list[list[str] | PlainIds] = []
    chunks: list[np.ndarray] = []
    tokenizer_hash: str | None = None
    tail = b""
    shaped = True
    size = 0
    try:
        for number, block in reader.line_blocks(path, _invalid, digest=digest):
            size += len(block)
            if tokenizer_hash is None:  # the first row names the tokenizer the block's rows must have
                cut = block.find(b"\n") + 1 or len(block)
                rows: list[str] = []
                parts.append(rows)
                tokenizer_hash, shaped = _parse_lines(path, number, block[:cut], rows, chunks, None)
                tail = row_tail(tokenizer_hash)
                number, block = number + 1, block[cut:]
            fast = parse_block(block, tail) if block else None
            if fast is not None:
                parts.append(fast[0])
                chunks.append(fast[1])
            elif block:
                rows = []
                parts.append(rows)
                shaped &= _parse_lines(path, number, block, rows, chunks, tokenizer_hash)[1]
    except FileNotFoundError:
        raise _invalid(f"length cache {path} does not exist (build one with `umlos-cuda data lengths build`)") from None
    if tokenizer_hash is None:
        raise _invalid(f"{path} has no rows; a length cache holds at least one sample")
    ids = _joined_ids(parts, size)
    _check_unique(ids, f"sample ids of {path}")
    return ids, np.concatenate(chunks), tokenizer_hash, shaped


def _joined_ids(parts: list[list[str] | PlainIds], size: int) -> list[str] | PlainIds:
    """The ids of ``parts`` (in order) as one :class:`PlainIds` when every id is plain and the
    array is no larger than ``size`` (the JSONL's bytes: one long id does not pad every other
    beyond what the file holds); as one list otherwise."""
    arrays = [part if isinstance(part, PlainIds) else PlainIds.encode(part) for part in parts]
    if all(a is not None for a in arrays):
        count = sum(map(len, parts))
        if count * max(a.width for a in arrays) <= size:  # type: ignore[union-attr]  # none is None
            return PlainIds.join(arrays) if len(arrays) > 1 else arrays[0]  # type: ignore[arg-type,return-value]
    ids: list[str] = []
    for part in parts:
        ids += part.tolist() if isinstance(part, PlainIds) else part
    return ids


def _parse_lines(path: str, first: int, block: bytes, ids: list[str], chunks: list[np.ndarray],
                 tokenizer_hash: str | None) -> tuple[str, bool]:
    """Append the rows of ``block`` (lines ``first``, ``first + 1``, ...) to ``ids`` and ``chunks``,
    one at a time; returns the tokenizer hash (the first row's when ``tokenizer_hash`` is None) and
    whether every row is byte for byte what the writer writes for it."""
    lengths: list[int] = []
    shaped = True
    start = 0
    number = first
    while start < len(block):
        stop = block.find(b"\n", start) + 1 or len(block)
        line = block[start:stop]
        if not line.strip():
            raise _invalid(f"{path} line {number + 1} is empty")
        sample_id, row_hash, length = _row(path, number, line)
        if tokenizer_hash is None:
            tokenizer_hash = row_hash
        elif row_hash != tokenizer_hash:
            raise _invalid(f"{path} line {number + 1} has tokenizer_hash {row_hash!r} but line 1 has "
                           f"{tokenizer_hash!r}; one cache holds the lengths of one tokenizer")
        ids.append(sample_id)
        lengths.append(length)
        shaped = shaped and line == (f'{{"sample_id": {encode_basestring_ascii(sample_id)}, "tokenizer_hash": '
                                     f'{encode_basestring_ascii(row_hash)}, "length": {length}}}\n').encode("ascii")
        start, number = stop, number + 1
    chunks.append(np.asarray(lengths, dtype=np.uint32))
    assert tokenizer_hash is not None  # the block holds at least one line
    return tokenizer_hash, shaped


def _row(path: str, number: int, line: bytes) -> tuple[str, str, int]:
    """``(sample_id, tokenizer_hash, length)`` of one row. orjson reads a row that is right (a row
    nested deeper than the input layer allows is never given to it); a row it refuses, or whose
    fields are wrong, is read again by :func:`_checked_row`, which words what is wrong as it always did."""
    if line.count(b"{") + line.count(b"[") <= reader.MAX_JSON_DEPTH:
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            row = None
        if type(row) is dict:
            sample_id, row_hash, length = row.get("sample_id"), row.get("tokenizer_hash"), row.get("length")
            if (type(sample_id) is str and type(row_hash) is str and row_hash and type(length) is int
                    and 0 <= length <= UINT32_MAX):
                return sample_id, row_hash, length
    return _checked_row(path, number, line)


def _checked_row(path: str, number: int, line: bytes) -> tuple[str, str, int]:
    def at_line(message: str) -> UmlosError:
        return _invalid(f"{path} line {number + 1}: {message}")

    where = f"{path} line {number + 1}"
    row = checks.instance(reader.loads_json(line, _invalid, where, not_json="is not JSON"), where, dict,
                          fail=_invalid, message="{name} is {type}; rows are JSON objects")
    if "sample_id" not in row and "length" not in row:  # a dataset (or another JSONL) given as a cache
        keys = ", ".join(sorted(map(str, row))[:6]) or "none"
        raise _invalid(f"{path} line {number + 1} is not a length cache row (its fields: {keys}); a length "
                       'cache has one {"sample_id", "tokenizer_hash", "length"} object per line, made from a '
                       f"dataset by `umlos-cuda data lengths build --dataset {path} --tokenizer TOKENIZER "
                       "--output LENGTHS.jsonl` (or `data tokenize`, whose store holds lengths.jsonl)")
    sample_id, row_hash, length = row.get("sample_id"), row.get("tokenizer_hash"), row.get("length")
    checks.text(sample_id, "sample_id", fail=at_line, message="{name} must be a string, got {value!r}")
    checks.text(row_hash, "tokenizer_hash", fail=at_line, empty=False,
                message="{name} must be a non-empty string, got {value!r}")
    length = checks.integer(length, "length", 0, UINT32_MAX, fail=at_line, strict=True,
                            message="{name} must be an integer in [0, 2^32 - 1], got {value!r}")
    return sample_id, row_hash, length


# ---------------------------------------------------------------------- checks
def _as_lengths(values, *, allow_empty: bool = False) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise _invalid(f"lengths must be one-dimensional, got shape {array.shape}")
    if array.shape[0] == 0:
        if allow_empty:
            return np.zeros(0, dtype=np.uint32)
        raise _invalid("no lengths; a length cache holds at least one sample")
    if array.dtype.kind not in "iu":
        raise _invalid(f"lengths must be integers, got dtype {array.dtype}")
    if int(array.min()) < 0 or int(array.max()) > UINT32_MAX:
        raise _invalid(f"lengths must lie in [0, 2^32 - 1], got [{int(array.min())}, {int(array.max())}]")
    return array.astype(np.uint32, copy=True)


def _check_hash(value, what: str) -> None:
    checks.text(value, what, fail=_invalid, empty=False,
                message="{name} must be a non-empty string (a hex digest), got {value!r}")


def _check_unique(ids: list[str] | PlainIds, what: str) -> None:
    repeat = first_repeat(ids)
    if repeat is not None:
        sample_id, first, second = repeat
        raise _invalid(f"{what}: {sample_id!r} appears at #{first} and #{second}; ids are unique")


def first_repeat(ids: list[str] | PlainIds) -> tuple[str, int, int] | None:
    """The first id of ``ids`` that repeats an earlier one, with both positions; None when all differ."""
    if ids.distinct() if isinstance(ids, PlainIds) else len(set(ids)) == len(ids):
        return None
    seen: dict[str, int] = {}
    for position, sample_id in enumerate(ids):
        if sample_id in seen:
            return sample_id, seen[sample_id], position
        seen[sample_id] = position
    return None  # pragma: no cover - the sizes above said there is a repeat


def _require_file(path: str) -> None:
    if not os.path.isfile(path):
        what = "is not a regular file" if os.path.exists(path) else "does not exist"
        raise _invalid(f"length cache {path} {what} (build one with `umlos-cuda data lengths build`)")


def _invalid(message: str) -> UmlosError:
    return UmlosError(errors.LENGTHS_INVALID, message, operator=errors.BATCHING_OPERATOR)


def _sidecar_error(message: str) -> UmlosError:
    return UmlosError(errors.LENGTHS_SIDECAR_MISMATCH, message, operator=errors.BATCHING_OPERATOR)
