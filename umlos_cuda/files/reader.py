"""The one bounded input layer: every file the LLM stack reads goes through here.

What goes in: a path, an error factory ``error(message) -> UmlosError`` (so
each artifact keeps its own documented code: a plan file fails with
PLAN_FORMAT_INVALID, a token store file with TOKEN_STORE_INVALID, ...) and
the bounds of what is read. What comes out: bytes, a JSON value, the lines
of a JSONL file, a ``.npy`` array (memory-mapped or read), the members of a
``.npz`` archive or a read-only map of a whole file; or ``error(message)``
with a message that names the file and says what is wrong.

The rules, each against one way a hostile or broken file could hang a
command, exhaust its memory or escape as a raw traceback:

* **Regular files only.** A path is opened with ``O_NONBLOCK`` (opening a
  FIFO with no writer then returns at once instead of blocking forever) and
  checked with ``fstat`` on the open descriptor, so nothing can be swapped
  in between a check and the open. A folder, FIFO, socket or device is
  refused. Symbolic links are followed: a dataset or a model folder linked
  from shared storage is ordinary, and what the link names is checked like
  any other file (writers never write through links: files/atomic.py).
* **Sizes before content.** A whole-file read checks ``fstat``'s size
  against its cap first, and reads at most one byte more than the cap, so a
  file that grows after the check is still refused. JSONL is read line by
  line with a cap on each line's length (and, where the caller knows it, on
  the number of lines); nothing reads a whole JSONL file into memory.
* **Depth before parsing.** :func:`json_depth` measures the nesting of a
  JSON text with a few passes of C-speed byte operations, before
  :func:`json.loads` (whose scanner recurses once per level) sees it; a text
  nested deeper than :data:`MAX_JSON_DEPTH` is refused, so no reader raises
  ``RecursionError``.
* **Headers against the bytes.** A ``.npy`` header's dtype and shape must
  describe exactly the bytes after it before anything is allocated or
  mapped (a 140-byte file that claims 2^38 elements is refused, not
  allocated); object arrays are never unpickled. A ``.npz`` archive must
  hold exactly the members the caller lists, each stored (not compressed)
  and each checked like a ``.npy`` file against its size in the archive, so
  an extra deflated member cannot expand into gigabytes. A zstd file must
  state its decompressed size in its frame header, which is checked against
  a cap before anything is decompressed (:func:`read_zstd`).

FileNotFoundError passes through every function but :func:`read_npy`
(which says ``PATH is missing``), because what a missing file means differs
(no plan here, an optional file, a file a command should write again);
every other failure is ``error(message)``.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import queue
import re
import stat
import threading
import zipfile
from collections.abc import Callable, Iterator
from typing import IO, Any, BinaryIO, Literal

import numpy as np

from ..errors import UmlosError

ErrorFactory = Callable[[str], UmlosError]

#: The largest JSON file read whole (meta.json, stats.json, batches.json, tokenizer configs, ...).
#: The largest of these grow with a plan (batches.json: about 80 bytes per microbatch), so the cap
#: is generous; a file over it is not one this project wrote.
MAX_JSON_BYTES = 256 << 20
#: The deepest nesting of a JSON value read: every file and message of this project nests a few
#: levels; a hostile one nested a hundred thousand levels deep would exhaust the parser's stack.
MAX_JSON_DEPTH = 64
#: The longest line of a JSONL file (a dataset record, a length cache row, a plan's microbatch,
#: a window log record), not counting its line end.
MAX_LINE_BYTES = 64 << 20
#: The largest ``.npz`` archive read (a batch file holds one microbatch: a few megabytes).
MAX_NPZ_BYTES = 1 << 30
#: The largest ``.npy`` header read (numpy's own default for untrusted files).
MAX_NPY_HEADER_BYTES = 10_000
#: The UTF-8 byte-order mark some editors put at the start of a text file.
UTF8_BOM = b"\xef\xbb\xbf"

_FILE_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


# ---------------------------------------------------------------------- opening
def open_regular(path: str | os.PathLike[str], error: ErrorFactory) -> BinaryIO:
    """``path`` opened for reading in binary, when it is a regular file (see the module docstring)."""
    path = os.fspath(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError:  # a NUL byte or a lone surrogate (a path read from a file or a --config): no path at all
        raise error(f"cannot read {path!r}: a path holds no NUL byte and no lone surrogate") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _FILE_KINDS if test(mode)), "not a file")
            raise error(f"{path} is {kind}, not a regular file; give the path of the file itself")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)  # regular files never block; reads should not see EAGAIN either
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def file_size(handle: BinaryIO) -> int:
    """The size of an open file, from ``fstat``."""
    return os.fstat(handle.fileno()).st_size


def read_bytes(path: str | os.PathLike[str], error: ErrorFactory, *, max_bytes: int, what: str = "file") -> bytes:
    """The bytes of the regular file at ``path``, refused when over ``max_bytes``."""
    path = os.fspath(path)
    with open_regular(path, error) as handle:
        size = file_size(handle)
        check_size(path, size, max_bytes, what, error)
        try:
            data = handle.read(size + 1)  # read(n) allocates n bytes: ask for what fstat says is there
            if len(data) > size:  # it grew after the check: read on, in bounded steps, up to the cap
                parts, total = [data], len(data)
                while total <= max_bytes and (block := handle.read(min(1 << 20, max_bytes + 1 - total))):
                    parts.append(block)
                    total += len(block)
                data = b"".join(parts)
        except OSError as exc:
            raise error(f"cannot read {path}: {exc.strerror or exc}") from None
    check_size(path, len(data), max_bytes, what, error)
    return data



def read_text(path: str | os.PathLike[str], error: ErrorFactory, *, max_bytes: int, what: str = "file") -> str:
    """The UTF-8 text of the regular file at ``path`` (:func:`read_bytes`'s bounds), refused with the
    byte where it stops being UTF-8. A missing file raises FileNotFoundError: callers word that."""
    data = read_bytes(path, error, max_bytes=max_bytes, what=what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"cannot read {os.fspath(path)}: it is not UTF-8 text ({exc.reason} at byte {exc.start})") from None

def check_size(path: str, size: int, max_bytes: int, what: str, error: ErrorFactory) -> None:
    """``error`` when ``size`` (a file's, an object's) is over ``max_bytes``: checked before anything is read."""
    if size > max_bytes:
        raise error(f"{path} is {size:,} bytes, over the {max_bytes:,} a {what} may have: "
                    "it is not a file of this kind (check the path)")


def same_bytes(path: str | os.PathLike[str], data: bytes, error: ErrorFactory) -> bool:
    """Whether the regular file at ``path`` holds exactly ``data``; its size is compared first, so a
    huge (or sparse) file is never read."""
    with open_regular(path, error) as handle:
        if file_size(handle) != len(data):
            return False
        try:
            return handle.read(len(data) + 1) == data
        except OSError as exc:
            raise error(f"cannot read {os.fspath(path)}: {exc.strerror or exc}") from None


def map_file(path: str | os.PathLike[str], error: ErrorFactory) -> np.ndarray:
    """A read-only ``uint8`` map of the whole regular file at ``path`` (an empty array for an empty file)."""
    path = os.fspath(path)
    with open_regular(path, error) as handle:
        if file_size(handle) == 0:
            return np.zeros(0, dtype=np.uint8)
        try:
            mapped: Any = handle  # numpy's stubs type the file argument narrowly; any file object works
            return np.memmap(mapped, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as exc:
            raise error(f"cannot map {path}: {getattr(exc, 'strerror', None) or exc}") from None


# ---------------------------------------------------------------------- JSON
_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
_OPEN, _CLOSE = np.frombuffer(b"[{", np.uint8), np.frombuffer(b"]}", np.uint8)


def json_depth(data: bytes) -> int:
    """How deeply the JSON text ``data`` nests arrays and objects (0 for a scalar).

    Exact for valid JSON, and never below the depth ``json.loads`` reaches on
    an invalid text before it fails: escapes are removed first (so ``\\"`` is
    no quote), then every byte but quotes and brackets, then every string,
    and what remains is a sequence of brackets whose running balance is the
    depth. Each step is one C-speed pass over the bytes.
    """
    if b"[" not in data and b"{" not in data:
        return 0
    structure = _STRING.sub(b"", _ESCAPE.sub(b"", data).translate(None, _NOT_STRUCTURE))
    codes = np.frombuffer(structure, dtype=np.uint8)
    steps = np.isin(codes, _OPEN).astype(np.int64) - np.isin(codes, _CLOSE).astype(np.int64)
    return int(np.cumsum(steps).max(initial=0))


def loads_json(data: bytes | str, error: ErrorFactory, where: str, *, max_depth: int = MAX_JSON_DEPTH,
               not_json: str = "is not valid JSON") -> Any:
    """The JSON value of ``data`` (UTF-8 bytes or text); ``error`` names ``where`` when it is not UTF-8,
    not JSON (``{where} {not_json} (why)``), or nested deeper than ``max_depth``."""
    if isinstance(data, str):
        raw = data.encode("utf-8", "surrogatepass")
        text = data
    else:
        raw = data
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error(f"{where} is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    # A text cannot nest deeper than it has opening brackets: most lines skip the measurement.
    depth = json_depth(raw) if raw.count(b"[") + raw.count(b"{") > max_depth else 0
    if depth > max_depth:
        raise error(f"{where} nests {depth} levels deep; at most {max_depth} are read (it is not a file of this kind)")
    try:
        return json.loads(text)
    except ValueError as exc:  # JSONDecodeError, and integers of more than 4300 digits
        raise error(f"{where} {not_json} ({exc})") from None
    except RecursionError:  # pragma: no cover - json_depth refuses what could recurse this far
        raise error(f"{where} nests too deeply to parse") from None


def read_json(path: str | os.PathLike[str], error: ErrorFactory, *, max_bytes: int = MAX_JSON_BYTES,
              max_depth: int = MAX_JSON_DEPTH, what: str = "JSON file") -> Any:
    """The JSON value in the regular file at ``path``, at most ``max_bytes`` long and ``max_depth`` deep
    (FileNotFoundError passes through, for callers that say what a missing file means)."""
    path = os.fspath(path)
    return loads_json(read_bytes(path, error, max_bytes=max_bytes, what=what), error, path, max_depth=max_depth)


# ---------------------------------------------------------------------- JSONL
def iter_lines(path: str | os.PathLike[str], error: ErrorFactory, *, max_line_bytes: int | None = None,
               max_lines: int | None = None, line_error: ErrorFactory | None = None) -> Iterator[tuple[int, bytes]]:
    """``(number, raw)`` for each line of the regular file at ``path``, ``number`` counting from 0 and
    ``raw`` the line's bytes with its line end (the lines joined are the file's bytes). A line longer
    than ``max_line_bytes`` (its line end not counted), or a line past the first ``max_lines``, is
    refused before it is read into memory whole, with ``line_error`` when given (a dataset's bad
    line is a bad record, not an unreadable file). ``max_line_bytes`` defaults to
    :data:`MAX_LINE_BYTES`."""
    path = os.fspath(path)
    with open_regular(path, error) as handle:
        yield from lines_of(handle, path, error, max_line_bytes=max_line_bytes, max_lines=max_lines,
                            line_error=line_error)


def lines_of(handle: BinaryIO, path: str, error: ErrorFactory, *, max_line_bytes: int | None = None,
             max_lines: int | None = None, line_error: ErrorFactory | None = None) -> Iterator[tuple[int, bytes]]:
    """:func:`iter_lines` of a file the caller opened (and checked) itself, from its position."""
    max_line_bytes = MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes
    line_error = line_error or error
    number = 0
    while True:
        try:
            raw = handle.readline(max_line_bytes + 1)
        except OSError as exc:
            raise error(f"cannot read {path}: {exc.strerror or exc}") from None
        if not raw:
            return
        if len(raw) > max_line_bytes and not (len(raw) == max_line_bytes + 1 and raw.endswith(b"\n")):
            raise line_error(f"{path} line {number + 1} is longer than {max_line_bytes:,} bytes, the longest "
                             "line read (is it one record per line?)")
        if max_lines is not None and number >= max_lines:
            raise line_error(f"{path} has more than {max_lines:,} lines")
        yield number, raw
        number += 1


def line_blocks(path: str | os.PathLike[str], error: ErrorFactory, *, block_bytes: int = 1 << 22,
                max_line_bytes: int | None = None, line_error: ErrorFactory | None = None,
                digest: Any = None) -> Iterator[tuple[int, bytes]]:
    """``(number, block)`` for consecutive runs of whole lines of the regular file at ``path``: ``block``
    is the bytes of lines ``number, number + 1, ...`` with their line ends (the blocks joined are the
    file's bytes; only the last may end without a line end), about ``block_bytes`` each, for callers
    that parse many lines at once. The bounds are :func:`iter_lines`': a line longer than
    ``max_line_bytes`` (its line end not counted) is refused with ``line_error`` before it is held
    whole, after the blocks before it were yielded, so memory stays under ``block_bytes`` plus one
    line. Every byte read also goes to ``digest.update`` when a digest is given, in order, in a
    second thread while the caller works on the block (hashlib lets go of the interpreter while it
    hashes); the digest is complete when the iteration ends."""
    path = os.fspath(path)
    max_line_bytes = MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes
    line_error = line_error or error
    block_bytes = max(1, min(block_bytes, max_line_bytes))  # a line that starts in a block ends in the next
    number, carry = 0, b""
    with open_regular(path, error) as handle, _digesting(digest) as update:
        while True:
            try:
                block = handle.read(block_bytes)
            except OSError as exc:
                raise error(f"cannot read {path}: {exc.strerror or exc}") from None
            if not block:
                break
            end = block.find(b"\n")
            if carry and (len(carry) + (end if end >= 0 else len(block)) > max_line_bytes):
                raise line_error(f"{path} line {number + 1} is longer than {max_line_bytes:,} bytes, the longest "
                                 "line read (is it one record per line?)")
            data = carry + block if carry else block
            cut = data.rfind(b"\n") + 1
            carry = b"" if cut else data
            if cut:
                if cut < len(data):  # the unfinished last line is read again with the next block (no copy kept)
                    try:
                        handle.seek(cut - len(data), os.SEEK_CUR)
                    except OSError as exc:
                        raise error(f"cannot read {path}: {exc.strerror or exc}") from None
                    data = data[:cut]
                update(data)
                yield number, data
                number += int(np.count_nonzero(np.frombuffer(data, dtype=np.uint8) == 10))
        if len(carry) > max_line_bytes:  # only when max_line_bytes is 0
            raise line_error(f"{path} line {number + 1} is longer than {max_line_bytes:,} bytes, the longest "
                             "line read (is it one record per line?)")
        if carry:
            update(carry)
            yield number, carry


@contextlib.contextmanager
def _digesting(digest: Any) -> Iterator[Callable[[bytes], None]]:
    """A function that hands each block to ``digest.update`` in one worker thread, in the order given
    (at most two blocks wait, so memory stays bounded); on leaving, every block handed over has been
    hashed (nothing, when ``digest`` is None)."""
    if digest is None:
        yield lambda block: None
        return
    blocks: queue.Queue = queue.Queue(2)
    failed: list[BaseException] = []

    def work() -> None:
        while (block := blocks.get()) is not None:
            if not failed:  # after a failure, blocks are only taken (a full queue never blocks the reader)
                try:
                    digest.update(block)
                except BaseException as exc:  # raised in the caller's thread, after the last block
                    failed.append(exc)

    worker = threading.Thread(target=work, name="line-blocks-digest", daemon=True)
    worker.start()
    try:
        yield blocks.put
    finally:
        blocks.put(None)
        worker.join()
    if failed:
        raise failed[0]


def strip_bom(number: int, raw: bytes) -> bytes:
    """``raw`` without the UTF-8 byte-order mark when it is line 0 and starts with one."""
    return raw[len(UTF8_BOM):] if number == 0 and raw.startswith(UTF8_BOM) else raw


# ---------------------------------------------------------------------- .npy
def npy_header(handle: IO[bytes], where: str, error: ErrorFactory) -> tuple[np.dtype, tuple[int, ...], bool]:
    """The dtype, shape and Fortran order of the ``.npy`` header at ``handle``'s position (which ends
    where the data begins). Versions 1.0 and 2.0, headers up to :data:`MAX_NPY_HEADER_BYTES`, no
    object dtypes."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(handle)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(handle, max_header_size=MAX_NPY_HEADER_BYTES)
        elif version == (2, 0):
            shape, fortran, dtype = fmt.read_array_header_2_0(handle, max_header_size=MAX_NPY_HEADER_BYTES)
        else:
            raise ValueError(f"format version {version[0]}.{version[1]} is not read here (1.0 and 2.0 are)")
    except (ValueError, OSError, EOFError, SyntaxError, TypeError) as exc:
        raise error(f"{where} is not a readable .npy file ({_one_line(exc)})") from None
    if dtype.hasobject:
        raise error(f"{where} holds Python objects ({dtype}); arrays here are never unpickled")
    return dtype, tuple(int(d) for d in shape), bool(fortran)


def _nbytes(dtype: np.dtype, shape: tuple[int, ...]) -> int:
    return dtype.itemsize * math.prod(shape)  # Python integers: no overflow, whatever the header claims


def load_npy(path: str | os.PathLike[str], error: ErrorFactory, *, mmap: bool,
             check: Callable[[np.dtype, tuple[int, ...]], None] | None = None) -> np.ndarray:
    """The array in the ``.npy`` file at ``path``, memory-mapped read-only when ``mmap``, after its
    header was checked against the file's size (and by ``check(dtype, shape)`` when given, before
    that)."""
    path = os.fspath(path)
    with open_regular(path, error) as handle:
        dtype, shape, fortran = npy_header(handle, path, error)
        if check is not None:
            check(dtype, shape)
        offset, size = handle.tell(), file_size(handle)
        nbytes = check_npy_bytes(path, dtype, shape, size - offset, error)
        order: Literal["C", "F"] = "F" if fortran else "C"
        try:
            if mmap:
                mapped: Any = handle  # numpy's stubs type the file argument narrowly; any file object works
                return np.memmap(mapped, dtype=dtype, mode="r", offset=offset, shape=shape, order=order)
            array = np.fromfile(handle, dtype=dtype, count=math.prod(shape))
        except (OSError, ValueError) as exc:
            raise error(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if array.size != math.prod(shape):
        raise error(f"{path} ended before its {nbytes:,} bytes of data")
    return array.reshape(shape, order=order)


def check_npy_bytes(where: str, dtype: np.dtype, shape: tuple[int, ...], data_bytes: int, error: ErrorFactory) -> int:
    """The bytes a ``.npy`` header's ``dtype`` and ``shape`` describe, when they are the ``data_bytes`` that follow
    it; ``error`` naming ``where`` otherwise (a truncated or forged file, read or mapped from nothing)."""
    nbytes = _nbytes(dtype, shape)
    if data_bytes != nbytes:
        raise error(f"{where} holds {data_bytes:,} bytes after its header, but its header says "
                    f"{dtype.str} of shape {shape}, which is {nbytes:,} bytes: the file is truncated or forged")
    return nbytes


def npy_expectation(where: str, dtype: str, shape: tuple[int, ...] | None, error: ErrorFactory,
                    expected: str = "expected") -> Callable[[np.dtype, tuple[int, ...]], None]:
    """The ``check(dtype, shape)`` of :func:`read_npy`: a one-dimensional array of ``dtype`` (and ``shape`` when
    given), else ``error`` (``{where} holds ...; {expected} {dtype} of shape ...``)."""

    def check(found: np.dtype, found_shape: tuple[int, ...]) -> None:
        if found.str != dtype or len(found_shape) != 1 or (shape is not None and found_shape != shape):
            want = f"{dtype} of shape {shape}" if shape is not None else f"one-dimensional {dtype}"
            raise error(f"{where} holds {found.str} of shape {found_shape}; {expected} {want}")

    return check


def read_npy(path: str | os.PathLike[str], dtype: str, shape: tuple[int, ...] | None, mmap: bool,
             error: ErrorFactory, expected: str = "expected") -> np.ndarray:
    """The one-dimensional array of ``dtype`` (and ``shape`` when given) in the ``.npy`` file at
    ``path`` (:func:`load_npy`); ``error`` when it is of another type or shape (the message says
    ``{expected} {dtype} of shape ...``)."""
    path = os.fspath(path)
    try:
        return load_npy(path, error, mmap=mmap, check=npy_expectation(path, dtype, shape, error, expected))
    except FileNotFoundError:
        raise error(f"{path} is missing") from None


# ---------------------------------------------------------------------- .npz
def read_npz(path: str | os.PathLike[str], members: tuple[str, ...], error: ErrorFactory, *,
             max_bytes: int = MAX_NPZ_BYTES) -> dict[str, np.ndarray]:
    """Every member of the ``.npz`` archive at ``path``, which must hold exactly the arrays named in
    ``members`` (``NAME.npy`` each), stored uncompressed, each header matching its size, the archive
    at most ``max_bytes``."""
    path = os.fspath(path)
    with open_regular(path, error) as handle:
        size = file_size(handle)
        check_size(path, size, max_bytes, ".npz file", error)
        return _parse_npz(handle, size, path, members, error)


def read_npz_bytes(data: bytes, where: str, members: tuple[str, ...], error: ErrorFactory) -> dict[str, np.ndarray]:
    """:func:`read_npz`'s checks on an archive already in memory (a decompressed file: :func:`read_zstd`),
    ``where`` naming it in messages."""
    return _parse_npz(io.BytesIO(data), len(data), where, members, error)


def _parse_npz(handle: BinaryIO, size: int, path: str, members: tuple[str, ...],
               error: ErrorFactory) -> dict[str, np.ndarray]:
    try:
        with zipfile.ZipFile(handle) as archive:
            infos = archive.infolist()
            _check_members(path, infos, members, size, error)
            return {info.filename[:-len(".npy")]: _read_member(archive, info, path, error) for info in infos}
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, NotImplementedError) as exc:
        raise error(f"{path} is not a readable .npz file ({_one_line(exc)})") from None


# ---------------------------------------------------------------------- .zst
def read_zstd(path: str | os.PathLike[str], error: ErrorFactory, *, max_bytes: int,
              max_output: int, what: str = "file") -> bytes:
    """The decompressed bytes of the one-frame zstd file at ``path``: the compressed file is read
    whole within ``max_bytes`` (:func:`read_bytes`), then its frame header must state its decompressed
    size and that size must be at most ``max_output``, both before anything is decompressed, so a
    small frame that expands into gigabytes (a decompression bomb) is refused unexpanded. Trailing
    bytes after the frame, a frame whose data disagrees with its stated size, and a missing
    ``zstandard`` package (the ``data`` extra) are ``error(message)`` too."""
    path = os.fspath(path)
    data = read_bytes(path, error, max_bytes=max_bytes, what=what)
    try:
        import zstandard
    except ImportError:
        raise error(f"reading {path} (zstd) needs the zstandard package: pip install 'umlos-cuda[data]'") from None
    try:
        size = zstandard.get_frame_parameters(data).content_size
    except zstandard.ZstdError as exc:
        raise error(f"{path} is not a zstd frame ({_one_line(exc)})") from None
    if size in (zstandard.CONTENTSIZE_UNKNOWN, zstandard.CONTENTSIZE_ERROR):
        raise error(f"{path}: its zstd frame does not state its decompressed size, which this reader needs "
                    "before decompressing")
    if size > max_output:
        raise error(f"{path} would decompress to {size:,} bytes, over the {max_output:,} a {what} may hold: "
                    "refused before decompressing")
    try:
        out = zstandard.ZstdDecompressor().decompress(data, max_output_size=size, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise error(f"{path} is not a readable zstd file ({_one_line(exc)})") from None
    if len(out) != size:
        raise error(f"{path} decompressed to {len(out):,} bytes; its frame header says {size:,}")
    return out


def _check_members(path: str, infos: list[zipfile.ZipInfo], members: tuple[str, ...], size: int,
                   error: ErrorFactory) -> None:
    names = [info.filename for info in infos]
    wanted = {f"{name}.npy" for name in members}
    unknown = sorted(set(names) - wanted)
    if unknown:
        raise error(f"{path} holds members this format does not have: {', '.join(unknown[:5])}")
    missing = [name for name in members if f"{name}.npy" not in names]
    if missing:
        raise error(f"{path} lacks {', '.join(missing)}")
    if len(names) != len(set(names)):
        raise error(f"{path} holds a member twice")
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
            raise error(f"{path}: member {info.filename} is compressed; the members of this format are stored")
    if sum(info.file_size for info in infos) > size:
        raise error(f"{path}: its members claim more bytes than the archive holds")


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, path: str, error: ErrorFactory) -> np.ndarray:
    where = f"{path} member {info.filename}"
    with archive.open(info) as member:
        dtype, shape, fortran = npy_header(member, where, error)
        header_bytes = member.tell()
        nbytes = _nbytes(dtype, shape)
        if header_bytes + nbytes != info.file_size:
            raise error(f"{where} holds {info.file_size - header_bytes:,} bytes after its header, but its header "
                        f"says {dtype.str} of shape {shape}, which is {nbytes:,} bytes")
        array = np.empty(shape, dtype=dtype, order="F" if fortran else "C")
        view = array.reshape(-1, order="A").view(np.uint8).data if nbytes else memoryview(bytearray())
        stream: Any = member  # a ZipExtFile: readinto fills the array in place, no copy
        done = 0
        while done < nbytes:
            count = stream.readinto(view[done:])
            if not count:
                raise error(f"{where} ends before its {nbytes:,} bytes of data")
            done += count
        member.read(1)  # reaching the end checks the member's CRC-32
    return array


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
