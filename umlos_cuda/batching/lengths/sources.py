"""Where a windowed plan reads lengths: a length cache's binary sidecar, memory-mapped, or a seeded formula.

What goes in: the ``.u32`` sidecar of a length cache (docs/batching.md, "Length cache
files"; :func:`open_length_cache` checks it, bounded, and maps it), an array, or
``(seed, count)``. What comes out: a :class:`LengthSource`, whose ``take(rows)``
gives the lengths of any rows (uint32) and whose ``binding()`` is what a plan's
fingerprint records about the lengths. A windowed plan asks for one window's rows
at a time, so it never holds all N lengths in its own memory:

* :class:`MappedLengths` maps the sidecar's length bytes read-only. Only the
  sidecar's header is read on opening (bounded: at most 64 KiB), and the bytes are
  mapped on first use; the length bytes' SHA-256 in that header is what the plan
  binds, and ``verify`` (:mod:`.verify`) hashes the bytes again. A sidecar whose
  size is not its header's, that cannot be mapped, or whose bytes miss their
  SHA-256 is LENGTHS_SIDECAR_MISMATCH, as the length cache's loader says it.
  Pages of a mapping that a process has touched count in its resident set
  although they are the kernel's page cache; ``release()`` (called after each
  window) drops them from the process (``madvise(MADV_DONTNEED)``: a later read
  maps them again from the page cache). With a block order (``block_affine``,
  the plans' default, or ``block_feistel``) a window's rows lie in one block, so
  the RSS of a pass over 10^9 samples stays O(window). With ``feistel`` a
  window's reads touch pages all over the file and the kernel maps whole
  page-cache folios per fault, so the file-backed part of the RSS reaches the
  file's size (shared, reclaimable page cache; the anonymous memory stays
  O(window)), and the windows do not release it
  (:attr:`~.window.WindowDefinition.local_reads`): the next window would map
  the same pages again.
* :class:`ArrayLengths` wraps lengths already in memory (tests, small plans).
* :class:`SyntheticLengths` computes the length of row ``i`` from ``(seed, i)``
  alone, with 64-bit integer arithmetic only (SplitMix64's finaliser of
  ``key + (i + 1) x 0x9E3779B97F4A7C15``, ``key`` from the seed; its top 8 bits
  pick a bin of :data:`SYNTHETIC_QUANTILES`, its low 32 bits times the bin's
  width, shifted right by 32, the value inside it),
  so 10^10 samples need no 40 GB file and every machine computes the same
  lengths. SplitMix64 rather than the engine's Philox: a bench source wants a
  few nanoseconds a length (Philox in NumPy costs about 300), not a
  cryptographic-grade stream. The table holds the 1/256 quantiles of a
  lognormal length distribution (median e^6.6, about 735 tokens; sigma 0.745)
  clipped to [16, 16384], the distribution bench/bench_megatron.py writes.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

from ... import checks, errors
from ...errors import UmlosError
from ...files import reader
from ...hashing import hash_canonical, sha256_array
from .cache import SIDECAR_SUFFIX, LengthCache, piecewise_sha256, read_sidecar_header, sidecar_path
from .pairs import CHOSEN_SUFFIX

#: Bin edges of the synthetic lengths: bin ``b`` gives lengths in ``[Q[b], Q[b + 1])`` (256 bins).
SYNTHETIC_QUANTILES = np.asarray([
    16, 101, 121, 136, 148, 158, 167, 176, 184, 191, 198, 205, 211, 217, 223, 229,
    234, 240, 245, 250, 256, 261, 266, 271, 275, 280, 285, 289, 294, 299, 303, 308,
    312, 316, 321, 325, 329, 334, 338, 342, 346, 351, 355, 359, 363, 367, 371, 375,
    380, 384, 388, 392, 396, 400, 404, 408, 412, 416, 420, 424, 428, 433, 437, 441,
    445, 449, 453, 457, 461, 465, 469, 473, 477, 482, 486, 490, 494, 498, 502, 507,
    511, 515, 519, 523, 528, 532, 536, 540, 545, 549, 553, 558, 562, 566, 571, 575,
    580, 584, 589, 593, 598, 602, 607, 611, 616, 621, 625, 630, 635, 639, 644, 649,
    654, 659, 664, 668, 673, 678, 683, 688, 693, 698, 704, 709, 714, 719, 724, 730,
    735, 740, 746, 751, 757, 762, 768, 774, 779, 785, 791, 797, 803, 808, 814, 820,
    826, 833, 839, 845, 851, 858, 864, 871, 877, 884, 890, 897, 904, 911, 918, 925,
    932, 939, 947, 954, 961, 969, 976, 984, 992, 1000, 1008, 1016, 1024, 1032, 1041, 1049,
    1058, 1067, 1076, 1085, 1094, 1103, 1112, 1122, 1132, 1142, 1152, 1162, 1172, 1182, 1193, 1204,
    1215, 1226, 1238, 1249, 1261, 1273, 1286, 1298, 1311, 1324, 1337, 1351, 1365, 1379, 1393, 1408,
    1424, 1439, 1455, 1471, 1488, 1505, 1523, 1541, 1560, 1579, 1599, 1619, 1640, 1662, 1685, 1708,
    1732, 1757, 1783, 1810, 1838, 1867, 1897, 1929, 1962, 1997, 2034, 2073, 2114, 2157, 2203, 2253,
    2305, 2362, 2423, 2489, 2562, 2642, 2731, 2831, 2945, 3076, 3231, 3420, 3658, 3977, 4452, 5333,
    16384,
], dtype=np.uint64)
_LOW = SYNTHETIC_QUANTILES[:-1].astype(np.uint32)
_SPAN = np.diff(SYNTHETIC_QUANTILES)
_GOLDEN, _MIX1, _MIX2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
#: Most samples a source may hold (row numbers are uint64 and positions int64).
MAX_SAMPLES = 1 << 62


def _lengths_error(message: str) -> UmlosError:
    """Lengths a plan cannot take (not one-dimensional integers in uint32, a count out of range)."""
    return UmlosError(errors.BATCHING_CONFIG_INVALID, message, operator=errors.BATCH_PLAN_OPERATOR)


def _sidecar_error(message: str) -> UmlosError:
    """A sidecar that does not hold what its header says (as the length cache's own loader says it)."""
    return UmlosError(errors.LENGTHS_SIDECAR_MISMATCH, message, operator=errors.BATCHING_OPERATOR)


class LengthSource:
    """``count`` lengths, read by rows: the interface a windowed plan plans from.

    ``origin``: the path this source was opened from, as given, which a plan records to reopen it
    (``umlos_cuda.batching.sources.open_source`` sets it; a length cache's is its sidecar; None for
    lengths held in memory)."""

    count: int
    origin: str | None = None

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The lengths of ``rows`` (uint32, in the order given)."""
        raise NotImplementedError

    def binding(self) -> dict:
        """What the plan's fingerprint records about these lengths."""
        raise NotImplementedError

    def release(self) -> None:
        """Drop whatever reading a window left resident (nothing, by default)."""

    def identity(self) -> dict | None:
        """The hashes a token source keeps of its tokens and tokenizer, read from its own metadata (no pass over
        the tokens), which an artifact cut from it records and compares when it reopens it: the lengths' binding
        cannot tell a store re-tokenized in place with equal lengths. None: lengths alone have none."""
        return None


def source_identity(source) -> dict | None:
    """``source.identity()`` (:meth:`LengthSource.identity`) for any source that has one (a token store opened
    whole does too), None for one that has none: what an artifact cut from it records."""
    identity = getattr(source, "identity", None)
    return identity() if callable(identity) else None


def identity_differences(recorded, source) -> str | None:
    """What differs between the identity an artifact ``recorded`` of its token source and ``source``'s now, by
    name (``tokens_sha256 'b…' (recorded 'a…')``); None when they agree or either is unknown (lengths alone)."""
    now = source_identity(source)
    if recorded is None or now is None or now == recorded:
        return None
    if not isinstance(recorded, dict) or not isinstance(now, dict):
        return "its identity"
    return ", ".join(f"{key} {now.get(key)!r} (recorded {recorded.get(key)!r})"
                     for key in sorted(set(recorded) | set(now)) if recorded.get(key) != now.get(key))


class ArrayLengths(LengthSource):
    """Lengths held in memory (uint32); bound by the SHA-256 of their bytes, as whole-epoch plans are."""

    def __init__(self, lengths) -> None:
        array = np.asarray(lengths)
        if array.ndim != 1 or array.dtype.kind not in "iu":
            raise _lengths_error(f"lengths must be a one-dimensional integer array, got {array.dtype} {array.shape}")
        if array.size and (int(array.min()) < 0 or int(array.max()) > 0xFFFFFFFF):
            raise _lengths_error("lengths must lie in [0, 2^32 - 1]")
        self.lengths = array.astype("<u4", copy=False)
        self.count = int(self.lengths.shape[0])
        self._sha256: str | None = None

    def take(self, rows: np.ndarray) -> np.ndarray:
        return self.lengths[rows]

    def binding(self) -> dict:
        if self._sha256 is None:
            self._sha256 = sha256_array(np.ascontiguousarray(self.lengths))
        return {"kind": "array", "count": self.count, "lengths_sha256": self._sha256}


def sidecar_facts(header: dict, offset: int, size: int, where: str) -> tuple[int, str]:
    """``(count, lengths_sha256)`` of the sidecar at ``where`` (a file, an object) whose header is ``header``, its
    length bytes from ``offset``, when its ``size`` is exactly those bytes; LENGTHS_SIDECAR_MISMATCH otherwise."""
    count = checks.integer(header.get("count"), f"{where} count", 0, MAX_SAMPLES, fail=_sidecar_error)
    sha = checks.text(header.get("lengths_sha256"), f"{where} lengths_sha256", fail=_sidecar_error)
    if size != offset + 4 * count:
        raise _sidecar_error(f"{where} is {size:,} bytes; its header announces {count:,} lengths from "
                             f"byte {offset}, {offset + 4 * count:,} bytes in all")
    return count, sha


class MappedLengths(ArrayLengths):
    """The length bytes of a ``.u32`` sidecar, memory-mapped read-only (see the module docstring).

    ``binding()`` takes the SHA-256 from the sidecar's header without reading the bytes;
    :meth:`check_bytes` hashes them (``plan verify``, and a build that asks to).
    """

    def __init__(self, path) -> None:
        path = os.fspath(path)
        header, offset = read_sidecar_header(path)
        with reader.open_regular(path, _sidecar_error) as handle:
            size = reader.file_size(handle)
        count, sha = sidecar_facts(header, offset, size, path)
        self.count, self.path, self.offset = count, path, offset
        self.origin = path
        self._sha256 = sha
        self.tokenizer_hash = header.get("tokenizer_hash")
        self._map: mmap.mmap | None = None
        self._lengths: np.ndarray | None = None

    @property
    def lengths(self) -> np.ndarray:  # type: ignore[override]
        """The mapped length bytes (mapped on first use: opening a plan reads the header only)."""
        if self._lengths is None:
            if not self.count:
                self._lengths = np.zeros(0, dtype="<u4")
                return self._lengths
            try:
                with reader.open_regular(self.path, _sidecar_error) as handle:
                    if reader.file_size(handle) != self.offset + 4 * self.count:
                        raise _sidecar_error(f"{self.path} changed size since it was opened")
                    self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
            except OSError as exc:
                raise _sidecar_error(f"cannot map {self.path}: {exc.strerror or exc}") from None
            self._lengths = np.frombuffer(self._map, dtype="<u4", count=self.count, offset=self.offset)
        return self._lengths

    def release(self) -> None:
        if self._map is not None and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)

    def check_bytes(self) -> None:
        """LENGTHS_SIDECAR_MISMATCH unless the length bytes hash to the header's SHA-256: read in
        pieces of ``HASH_PIECE`` lengths (lengths/cache.py), each released once hashed, so the RSS stays a piece."""
        if piecewise_sha256(self.lengths, self.release) != self._sha256:
            raise _sidecar_error(f"{self.path}: its length bytes do not match their SHA-256 in the header")


class SyntheticLengths(LengthSource):
    """``count`` lengths computed from ``(seed, row)`` (see the module docstring); nothing is stored."""

    def __init__(self, count: int, seed: int = 0) -> None:
        self.count = checks.integer(count, "count", 1, MAX_SAMPLES, fail=_lengths_error)
        self.seed = checks.integer(seed, "seed", 0, (1 << 64) - 1, fail=_lengths_error)
        self._key = np.uint64(int.from_bytes(hash_canonical(["umlos_synthetic_lengths_v1", self.seed])[:8], "little"))

    def take(self, rows: np.ndarray) -> np.ndarray:
        z = (np.asarray(rows, dtype=np.uint64) + np.uint64(1)) * _GOLDEN
        z += self._key
        z ^= z >> np.uint64(30)
        z *= _MIX1
        z ^= z >> np.uint64(27)
        z *= _MIX2
        z ^= z >> np.uint64(31)
        bins = (z >> np.uint64(56)).astype(np.intp)
        z &= np.uint64(0xFFFFFFFF)
        z *= _SPAN[bins]
        z >>= np.uint64(32)
        return _LOW[bins] + z.astype(np.uint32)

    def binding(self) -> dict:
        return {"kind": "synthetic", "count": self.count, "seed": self.seed,
                "generator": "umlos_synthetic_lengths_v1"}


def open_sidecar(path) -> MappedLengths:
    """The ``.u32`` sidecar ``path`` alone, its bytes checked against their own SHA-256 and mapped: the
    JSONL is not read (at 10^9 samples the JSONL is 100 GB; the sidecar 4 GB), so nothing about the ids
    is known."""
    source = MappedLengths(path)
    source.check_bytes()
    return source


def open_length_cache(path) -> MappedLengths:
    """The lengths of the length cache ``path`` for a windowed plan, checked in bounded memory, then mapped.

    Named by its JSONL, the cache's sidecar is checked against every row of the JSONL
    (``LengthCache.load(sidecar="require")``: one streaming read, the sidecar's pages released as
    they are read, no id kept) and a cache of preference pairs is refused by its first id (windowed
    plans do not keep pairs together yet). Named by its ``.u32`` sidecar: :func:`open_sidecar`.
    """
    path = os.fspath(path)
    if path.endswith(SIDECAR_SUFFIX):
        return open_sidecar(path)
    first = LengthCache.load(path, sidecar="require").first_sample_id()
    if first.endswith(CHOSEN_SUFFIX):
        raise _lengths_error(f"{path} holds preference pairs (its first id is {first!r}); windowed plans take no "
                             "preference pairs yet: plan it without --window")
    return MappedLengths(sidecar_path(path))
