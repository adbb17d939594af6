"""Decompress a ``.gz`` or ``.zst`` JSONL file as a stream, within bounds.

What goes in: a regular file opened by files/reader.py, its path and its
compression (``"gzip"``: the standard library's ``gzip``; ``"zstd"``: the
``zstandard`` package, extra ``data``). What comes out: a buffered binary
stream of the decompressed bytes, read line by line by records/jsonl.py with
the same 64 MiB line cap as a plain file, so memory never holds more than a
line and a buffer whatever the file expands to.

Bounds: the decompressed stream may not exceed :data:`MAX_RATIO` times the
compressed size plus :data:`SLACK_BYTES` (gzip cannot expand more than about
1,032 times, so no gzip file meets the cap; a zstd frame can expand without
limit, and one that does is a bomb, refused in bounded time). A stream that is
not gzip or zstd, is truncated, or fails its checksum raises
DATASET_UNREADABLE naming the file.
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
        inner = zstandard.ZstdDecompressor().stream_reader(handle, read_across_frames=True)
    else:
        raise ValueError(f"compression {compression!r} is not one of {', '.join(COMPRESSIONS)}")
    cap = MAX_RATIO * compressed_size + SLACK_BYTES
    return io.BufferedReader(_Bounded(inner, path, compression, cap), buffer_size=1 << 20)


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
        except (OSError, EOFError, zlib.error, ValueError) as exc:
            raise self._broken(exc) from None
        except Exception as exc:  # zstandard.ZstdError derives from Exception only
            if type(exc).__name__ != "ZstdError":
                raise
            raise self._broken(exc) from None
        self.total += count
        if self.total > self.cap:
            raise _unreadable(f"{self.path} expands to more than {self.cap:,} bytes ({MAX_RATIO} times its "
                              f"compressed size and {SLACK_BYTES >> 20} MiB): a compression bomb, not a dataset")
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


def _unreadable(message: str) -> UmlosError:
    return UmlosError(errors.DATASET_UNREADABLE, message, operator=errors.BATCHING_OPERATOR)
