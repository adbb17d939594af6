"""The planned cache's disk tier: blocks of objects kept as files in a folder that processes share, each file
whole and verified or absent.

What goes in: a folder (``cache_dir``: created with its artifact marker when missing, reopened when it is a
block cache or empty, refused otherwise), the block size, and the blocks a reader needs (an object opened with
its ETag and size, block numbers). What comes out: each block's bytes, read from its file when one is there
and verifies, else fetched from the object store by exactly one of the processes that need it and written for
the others.

The rules:

* **A file names what it holds.** ``<sha256(URL)[:16]>-<sha256(ETag, size)[:16]>-<block_bytes>-<index>.block``:
  an object rewritten in place (another ETag or size) has other names, so no block of the old object is ever
  served for the new one, and readers with other block sizes never share a file.
* **A file verifies itself.** It is ``MAGIC`` (8 bytes), the SHA-256 of its name and payload (32 bytes), then
  the payload, which must be exactly the block's length (the object's size says it). A file that is not a
  regular file, has another length, another magic or another digest (torn, truncated, tampered, copied from
  another block's name) is never served: it is replaced by the block fetched again.
* **Written through the project's writer steps.** Each file is a temp file created with ``O_EXCL | O_NOFOLLOW``
  beside its name, fsynced and renamed over it (:meth:`~umlos_cuda.files.folder.Folder.replace_file`: a link
  at the name is replaced, never followed), the folder fsynced after; everything relative to the folder's
  descriptor; modes from the umask. A SIGKILL at any point leaves a file whole and verified, or absent, or a
  hidden temp that no reader opens (removed by the next process that claims its block, or that opens the
  folder while no one holds it).
* **One fetch per block among the processes sharing the folder.** A process claims a block with a ``flock``
  on ``<name>.lock`` (:class:`~umlos_cuda.files.lock.FolderLock`, non-blocking), looks again for the file
  once it holds the claim, and only then fetches it; a process that finds the block claimed waits for the
  file (polling every :data:`POLL_S` seconds) or for the claim to be free (its holder finished without writing
  it, failed, or died: the kernel drops a ``flock`` on SIGKILL), and then claims it itself. No process waits
  while holding a claim, so no two wait on each other.

What the folder holds in bytes is bounded by its readers (:mod:`.planned`): each process removes the blocks
its own schedule evicts; docs/object-stores.md says what sharing means for that bound.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import stat
import time
from collections.abc import Callable, Iterator

from .. import errors
from ..errors import UmlosError
from ..files.artifacts import ArtifactKind
from ..files.lock import FolderLock, FolderLocked
from ..files.writer import open_in_place
from .client import RemoteObject

#: The artifact kind the folder's marker names.
BLOCK_CACHE = ArtifactKind("block cache")
#: The first bytes of every block file (format version 1).
MAGIC = b"UMLBLK01"
#: Bytes before a block file's payload: the magic and a SHA-256.
HEADER_BYTES = len(MAGIC) + 32
#: Seconds between two looks of a process waiting for a block another process fetches.
POLL_S = 0.01
#: A block file's name (what :func:`block_name` makes), and the temp names the writer gives it.
_NAME = re.compile(r"[0-9a-f]{16}-[0-9a-f]{16}-[0-9]+-[0-9]+\.block")
_TEMP = re.compile(r"\.tmp-[0-9a-f]{8}-(.+)")


def _cache_error(code: str, message: str) -> UmlosError:
    return UmlosError(code, message, operator=errors.REMOTE_OPERATOR)


def block_name(obj: RemoteObject, block_bytes: int, index: int) -> str:
    """The file name of block ``index`` of ``obj`` (module docstring): its URL, its ETag and size, the block
    size and the block's number."""
    where = hashlib.sha256(obj.name.encode("utf-8")).hexdigest()[:16]
    which = hashlib.sha256(f"{obj.info.etag}\n{obj.size}".encode()).hexdigest()[:16]
    return f"{where}-{which}-{block_bytes}-{index}.block"


def block_length(obj: RemoteObject, block_bytes: int, index: int) -> int:
    """How many bytes block ``index`` of ``obj`` holds (the last block may be short)."""
    return max(0, min(block_bytes, obj.size - index * block_bytes))


def encode(name: str, payload: bytes) -> bytes:
    """The bytes of the block file ``name`` holding ``payload``."""
    return MAGIC + hashlib.sha256(name.encode("utf-8") + payload).digest() + payload


def decode(name: str, data: bytes | None, length: int) -> bytes | None:
    """The payload of the block file ``name`` read as ``data``, when it holds ``length`` bytes and verifies;
    None otherwise."""
    if data is None or len(data) != HEADER_BYTES + length or not data.startswith(MAGIC):
        return None
    payload = data[HEADER_BYTES:]
    if hashlib.sha256(name.encode("utf-8") + payload).digest() != data[len(MAGIC):HEADER_BYTES]:
        return None
    return payload


class BlockFolder:
    """The block cache at ``path`` (module docstring) for blocks of ``block_bytes``; :meth:`close` it.
    ``fetched_blocks`` counts the blocks this process fetched for the folder, ``found_blocks`` those it read
    from files there, ``dropped_files`` the files it found invalid and replaced."""

    def __init__(self, path: str | os.PathLike[str], block_bytes: int) -> None:
        self.block_bytes = block_bytes
        self.folder = open_in_place(path, BLOCK_CACHE, foreign=self._foreign, operator=errors.REMOTE_OPERATOR)
        self.path = self.folder.path
        self.fetched_blocks = self.found_blocks = self.dropped_files = 0
        self.sweep()

    @staticmethod
    def _foreign(path: str, found: str | None) -> UmlosError:
        what = f"a {found}" if found else "a folder with other files"
        return _cache_error(errors.OUTPUT_PATH_INVALID, f"{path} is {what}, not a block cache umlos-cuda wrote: "
                            "give cache_dir an empty or new folder, or one a planned cache made")

    def close(self) -> None:
        self.folder.close()

    def sweep(self) -> list[str]:
        """Remove the temp files and lock files that killed processes left: each only while this process holds
        its block's claim (a live writer's are left alone). Returns the names removed."""
        removed = []
        for entry in sorted(self.folder.names()):
            temp = _TEMP.fullmatch(entry)
            owner = temp.group(1) if temp else entry[:-len(".lock")] if entry.endswith(".lock") else None
            if owner is None or _NAME.fullmatch(owner) is None:
                continue
            with contextlib.suppress(UmlosError, OSError), self._claim(owner) as claim:
                if claim is not None and temp:
                    self.folder.remove(entry)
                    removed.append(entry)
        return removed

    # ------------------------------------------------------------------ one block
    def read(self, obj: RemoteObject, index: int) -> bytes | None:
        """The payload of block ``index`` of ``obj`` from its file, when one is there and verifies."""
        name = block_name(obj, self.block_bytes, index)
        length = block_length(obj, self.block_bytes, index)
        return decode(name, self.folder.read(name, HEADER_BYTES + length), length)

    def write(self, obj: RemoteObject, index: int, payload: bytes) -> None:
        """Write block ``index`` of ``obj`` (the caller holds its claim): whatever is at its name (a bad file, a
        link, a folder) is replaced, never followed."""
        name = block_name(obj, self.block_bytes, index)
        info = self.folder.lstat(name)
        if info is not None:
            self.dropped_files += 1
            if stat.S_ISDIR(info.st_mode):
                self.folder.remove(name)
        try:
            self.folder.replace_file(name, encode(name, payload))
            self.folder.sync()
        except OSError as exc:
            raise _cache_error(errors.OUTPUT_WRITE_FAILED, f"writing {self.folder.join(name)} failed: "
                               f"{exc.strerror or exc} ({errno.errorcode.get(exc.errno or 0, '?')}); free room "
                               "there, or give the planned cache another cache_dir") from exc

    def remove(self, obj: RemoteObject, index: int) -> None:
        """Remove block ``index`` of ``obj`` (evicted); a file another process is reading stays readable to it."""
        with contextlib.suppress(OSError):
            self.folder.remove(block_name(obj, self.block_bytes, index))

    @contextlib.contextmanager
    def _claim(self, name: str) -> Iterator[FolderLock | None]:
        """The claim on block file ``name`` (None when another process holds it), released when the block ends."""
        try:
            lock: FolderLock | None = FolderLock.take(self.folder, f"{name}.lock")
        except FolderLocked:
            lock = None
        except OSError as exc:
            raise _cache_error(errors.OUTPUT_PATH_INVALID, f"cannot claim {self.folder.join(name)}: "
                               f"{exc.strerror or exc}; a link, a FIFO or another file is at its .lock name: "
                               "remove it, or give the planned cache another cache_dir") from exc
        try:
            yield lock
        finally:
            if lock is not None:
                lock.release()

    # ------------------------------------------------------------------ blocks, fetched once
    def blocks(self, obj: RemoteObject, indices: list[int],
               fetch: Callable[[int, int], bytes]) -> dict[int, bytes]:
        """Blocks ``indices`` (sorted) of ``obj``: each from its file, or fetched by ``fetch(start, stop)`` (bytes
        ``[start, stop)`` of the object; adjacent claimed blocks in one call) and written, by the one process
        that claims it (module docstring)."""
        out: dict[int, bytes] = {}
        pending = list(indices)
        while True:
            waiting = self._round(obj, pending, fetch, out)
            if not waiting:
                return out
            pending = waiting
            time.sleep(POLL_S)

    def _round(self, obj: RemoteObject, pending: list[int], fetch: Callable[[int, int], bytes],
               out: dict[int, bytes]) -> list[int]:
        """One look at each pending block: read it, or claim and fetch it; the blocks others hold."""
        waiting: list[int] = []
        with contextlib.ExitStack() as claims:
            claimed = []
            for index in pending:
                payload = self.read(obj, index)
                if payload is None:
                    lock = claims.enter_context(self._claim(block_name(obj, self.block_bytes, index)))
                    if lock is None:
                        waiting.append(index)
                        continue
                    payload = self.read(obj, index)  # written between the first look and the claim
                    if payload is None:
                        claimed.append(index)
                        continue
                self.found_blocks += 1
                out[index] = payload
            for run in _runs(claimed):
                start = run[0] * self.block_bytes
                data = memoryview(fetch(start, min((run[-1] + 1) * self.block_bytes, obj.size)))
                for index in run:
                    offset = index * self.block_bytes - start
                    payload = bytes(data[offset:offset + self.block_bytes])
                    self.write(obj, index, payload)
                    self.fetched_blocks += 1
                    out[index] = payload
        return waiting


def _runs(indices: list[int]) -> list[list[int]]:
    """``indices`` (sorted) cut into runs of consecutive numbers."""
    runs: list[list[int]] = []
    for index in indices:
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return runs
