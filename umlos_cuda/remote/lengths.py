"""A length cache's ``.u32`` sidecar in an object store: its header read bounded, its length bytes fetched once.

What goes in: the URL of a sidecar copied into an object store as it was written (``s3://bucket/lengths.jsonl.u32``,
docs/batching.md, "Length cache files"). What comes out: the length source a local sidecar opens as
(lengths/sources.py's ``MappedLengths``): ``take(rows)``, ``binding()`` from the header's SHA-256 (so a plan built
from the local sidecar opens with this one), ``check_bytes()``.

The checks are the local reader's, by the same functions (lengths/cache.py, lengths/sources.py): the preamble
(12 bytes, one GET) gives the header's length, refused over its cap before the header is fetched
(``sidecar_header_size``), the header is parsed by ``parse_sidecar_header``, and the object's recorded size
must be exactly the lengths it announces (``sidecar_facts``), all LENGTHS_SIDECAR_MISMATCH naming the object.
The length bytes are fetched whole on first use (one GET; at most :data:`MAX_LENGTHS` of them, 4 bytes each)
and checked against the ETag and size recorded at opening (:mod:`.client`); ``open_remote_sidecar`` hashes them
against the header's SHA-256, as ``open_sidecar`` does a local file's.

A length cache's JSONL is not read from an object store: at 10^9 samples it is 100 GB, read line by line for
its ids (a whole plan) or to check its sidecar row by row. Its URL is REMOTE_UNAVAILABLE saying to give the
sidecar's (a windowed plan reads the sidecar alone) or to read the cache from disk.
"""

from __future__ import annotations

import numpy as np

from .. import errors
from ..batching.lengths.cache import (SIDECAR_PREAMBLE, SIDECAR_SUFFIX, _sidecar_error, parse_sidecar_header,
                                      sidecar_header_size)
from ..batching.lengths.sources import MappedLengths, sidecar_facts
from .client import RemoteObject, RetryBudget, remote_error
from .urls import is_remote, parse_url

#: The most lengths read from an object store (4 bytes each: 1 GiB in memory); a larger sidecar is read from disk.
MAX_LENGTHS = 1 << 28


def is_remote_length_cache(path: str) -> bool:
    """Whether ``path`` is the URL of a length cache: its sidecar (``.u32``) or its JSONL (``.jsonl``)."""
    return is_remote(path) and path.endswith((SIDECAR_SUFFIX, ".jsonl"))


class RemoteSidecar(MappedLengths):
    """A ``.u32`` sidecar read from an object store (module docstring); ``RemoteSidecar(URL)`` reads its header."""

    def __init__(self, path: str, *, budget: RetryBudget | None = None) -> None:
        url = parse_url(path)
        budget = budget if budget is not None else RetryBudget()
        try:
            obj = RemoteObject.open(url, url.prefix, budget)
        except FileNotFoundError:
            raise _sidecar_error(f"{path} does not exist") from None
        size = sidecar_header_size(obj.read(0, min(obj.size, SIDECAR_PREAMBLE)), path)
        text = obj.read(SIDECAR_PREAMBLE, min(obj.size, SIDECAR_PREAMBLE + size))
        header, offset = parse_sidecar_header(text, size, path)
        count, sha = sidecar_facts(header, offset, obj.size, path)
        if count > MAX_LENGTHS:
            raise _sidecar_error(f"{path} holds {count:,} lengths; a sidecar read from an object store holds at most "
                                 f"{MAX_LENGTHS:,} (its lengths are read whole): read it from disk")
        self.count, self.path, self.offset, self.origin = count, path, offset, path
        self.object, self.budget = obj, budget
        self._sha256 = sha
        self.tokenizer_hash = header.get("tokenizer_hash")
        self._lengths: np.ndarray | None = None

    def __reduce__(self):
        return (_reopen, (self.path, self.budget))

    @property
    def lengths(self) -> np.ndarray:  # type: ignore[override]
        """The length bytes, fetched whole on first use (opening reads the header only)."""
        if self._lengths is None:
            data = self.object.read(self.offset, self.offset + 4 * self.count)
            self._lengths = np.frombuffer(data, dtype="<u4", count=self.count)
        return self._lengths

    def release(self) -> None:
        """Nothing to drop: the lengths are this process's own memory, 4 bytes each."""


def open_remote_length_cache(path: str) -> RemoteSidecar:
    """The sidecar at ``path``, its bytes checked against their SHA-256 (as ``open_sidecar`` checks a file's);
    REMOTE_UNAVAILABLE for a length cache's JSONL (module docstring)."""
    if not path.endswith(SIDECAR_SUFFIX):
        raise remote_error(errors.REMOTE_UNAVAILABLE, f"{path} is a length cache's JSONL, which is not read from an "
                           f"object store (it is read line by line): give its sidecar, {path}{SIDECAR_SUFFIX}, which a "
                           "windowed plan (--window) reads alone, or read the cache from disk")
    source = RemoteSidecar(path)
    source.check_bytes()
    return source


def _reopen(path: str, budget: RetryBudget) -> RemoteSidecar:
    return RemoteSidecar(path, budget=budget)
