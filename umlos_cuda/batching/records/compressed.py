"""Decompress a ``.gz`` or ``.zst`` JSONL file as a stream, within bounds, to its last byte.

What goes in: a regular file opened by files/reader.py, its path and its
compression (``"gzip"``: the standard library's ``gzip``; ``"zstd"``: the
``zstandard`` package, extra ``data``). What comes out: a buffered binary
stream of the decompressed bytes, read line by line by records/jsonl.py with
the same 64 MiB line cap as a plain file, so memory never holds more than a
line and a buffer whatever the file expands to.

Bounds: the decompressed stream may not exceed :func:`expansion_cap` of the
compressed size, :data:`MAX_RATIO` times it plus :data:`SLACK_BYTES` (gzip
cannot expand more than about 1,032 times, so no gzip file meets the cap; a
zstd frame can expand without limit, and one that does is a bomb, refused in
bounded time). The columns read of a Parquet or Arrow file are held to the
same cap (records/source.py).

Whole or refused: a stream that is not gzip or zstd, or fails its checksum,
raises DATASET_UNREADABLE naming the file, and so does one that ends before
its end: a gzip member without its trailer, a zstd frame without its last
block (each frame is decoded by its own ``decompressobj``, whose ``eof`` says
that the frame ended), or a file of no bytes (every compressor writes a
header). What cannot be seen: a zstd file of several frames cut exactly
between two of them is a whole zstd file of fewer frames (the format records
no frame count), as a gzip file of several members cut between two is.
"""

from __future__ import annotations

import gzip
import io
import zlib
from typing import Any, BinaryIO

from ... import errors
from ...errors import UmlosError

#: Decompressed bytes allowed per compressed byte (above gzip's largest possible ratio).
MAX_RATIO = 1100
#: Decompressed bytes allowed whatever the compressed size (small files of long lines).
SLACK_BYTES = 64 << 20
COMPRESSIONS = ("gzip", "zstd")
#: Compressed bytes handed to a zstd frame decoder at a time: a zstd block of 4 bytes can decode to
#: 128 KiB, so one feed decodes to at most 32 MiB, however the file was made.
ZSTD_FEED_BYTES = 1 << 10


def expansion_cap(compressed_size: int) -> int:
    """The most bytes a file of ``compressed_size`` bytes may decode to (see the module docstring)."""
    return MAX_RATIO * compressed_size + SLACK_BYTES


def open_decompressed(handle: BinaryIO, path: str, compression: str, compressed_size: int) -> BinaryIO:
    """The decompressed bytes of ``handle`` as a buffered stream (see the module docstring)."""
    if compression == "gzip":
        inner: Any = gzip.GzipFile(fileobj=handle, mode="rb")
    elif compression == "zstd":
        try:
            import zstandard
        except ImportError:
            raise _unreadable(f"reading {path} (zstd) needs the zstandard package: pip install "
                              "'umlos-cuda[data]'") from None
        inner = _ZstdFrames(handle, zstandard.ZstdDecompressor())
    else:
        raise ValueError(f"compression {compression!r} is not one of {', '.join(COMPRESSIONS)}")
    if compressed_size == 0:
        raise truncated(path, f"it has no bytes, and every {compression} stream starts with a header")
    bounded = _Bounded(inner, path, compression, expansion_cap(compressed_size))
    return io.BufferedReader(bounded, buffer_size=1 << 20)


class _ZstdFrames(io.RawIOBase):
    """The decoded bytes of consecutive zstd frames, each through its own ``decompressobj`` fed
    :data:`ZSTD_FEED_BYTES` at a time; :class:`_Truncated` when the file ends inside a frame."""

    def __init__(self, handle: BinaryIO, decompressor: Any) -> None:
        self.handle, self.decompressor = handle, decompressor
        self.frame: Any = None  # the decoder of the frame begun and not yet ended
        self.pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self.pending:
            data = self.handle.read(ZSTD_FEED_BYTES)
            if not data:
                if self.frame is not None:
                    raise _Truncated("the file ends inside a zstd frame (before its last block)")
                return 0
            self.pending = memoryview(self._decode(data))
        count = min(len(buffer), len(self.pending))
        buffer[:count] = self.pending[:count]
        self.pending = self.pending[count:]
        return count

    def _decode(self, data: bytes) -> bytes:
        out = []
        while data:
            if self.frame is None:
                self.frame = self.decompressor.decompressobj()
            out.append(self.frame.decompress(data))
            data = b""
            if self.frame.eof:  # the frame ended: what follows it begins the next
                data, self.frame = self.frame.unused_data, None
        return b"".join(out)


class _Truncated(EOFError):
    """The compressed stream ended before its end (the message says where)."""


class _Bounded(io.RawIOBase):
    """The decompressor's bytes, counted against the cap; every failure of the decompressor is a
    DATASET_UNREADABLE naming the file."""

    def __init__(self, inner: Any, path: str, compression: str, cap: int) -> None:
        self.inner, self.path, self.compression, self.cap, self.total = inner, path, compression, cap, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            count = self.inner.readinto(buffer)
        except _Truncated as exc:
            raise truncated(self.path, str(exc)) from None
        except EOFError as exc:  # gzip: "Compressed file ended before the end-of-stream marker was reached"
            raise truncated(self.path, f"the gzip stream ends early ({exc})") from None
        except (OSError, zlib.error, ValueError) as exc:
            raise self._broken(exc) from None
        except Exception as exc:  # zstandard.ZstdError derives from Exception only
            if type(exc).__name__ != "ZstdError":
                raise
            raise self._broken(exc) from None
        self.total += count
        if self.total > self.cap:
            raise bomb(self.path, self.cap)
        return count

    def _broken(self, exc: BaseException) -> UmlosError:
        why = " ".join(str(exc).split()) or type(exc).__name__
        return _unreadable(f"{self.path} is not a readable {self.compression} stream ({why}); check the file, or "
                           "pass --format for what it holds")

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            super().close()


def bomb(path: str, cap: int) -> UmlosError:
    """DATASET_UNREADABLE for a file that decodes to more than ``cap`` bytes (:func:`expansion_cap`)."""
    return _unreadable(f"{path} expands to more than {cap:,} bytes ({MAX_RATIO} times its compressed size and "
                       f"{SLACK_BYTES >> 20} MiB): a compression bomb, not a dataset")


def truncated(path: str, why: str) -> UmlosError:
    """DATASET_UNREADABLE for a file that ends before its end: no record of it is read."""
    return _unreadable(f"{path} is truncated: {why}; a copy cut short keeps only its first part: copy the file "
                       "again from its source")


def _unreadable(message: str) -> UmlosError:
    return UmlosError(errors.DATASET_UNREADABLE, message, operator=errors.BATCHING_OPERATOR)
