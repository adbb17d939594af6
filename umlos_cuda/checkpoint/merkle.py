"""The Merkle tree of a checkpoint: RFC 6962 §2.1 over file entries.

A container lists its files as entries ``(path, size, sha256)`` sorted by the
UTF-8 bytes of ``path``. The leaf data of an entry is
``CBOR_CANONICAL([path, size, sha256])`` and the tree is Certificate
Transparency's (RFC 6962 §2.1), which domain-separates leaves from interior
nodes and never duplicates a node, so no two different entry lists share a
root::

    MTH([])      = SHA-256(b"")
    MTH([d0])    = SHA-256(0x00 || d0)
    MTH(D[0:n])  = SHA-256(0x01 || MTH(D[0:k]) || MTH(D[k:n]))
                   with k the largest power of two smaller than n

``checkpoint_merkle_root`` is MTH of all entries; ``tensors_root_hash``,
``optimizer_state_root_hash`` and ``dp_accountant_state_root_hash`` are MTH
of the entries under ``tensors/``, ``optimizer/`` and ``dp/``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..hashing import cbor_canonical, sha256

LEAF_PREFIX = b"\x00"
NODE_PREFIX = b"\x01"
#: MTH of the empty list (RFC 6962: the hash of an empty string).
EMPTY_ROOT = sha256(b"")


def leaf_data(path: str, size: int, digest: bytes) -> bytes:
    """The leaf data of one file entry: ``CBOR_CANONICAL([path, size, sha256])``."""
    return cbor_canonical([path, size, digest])


def leaf_hash(data: bytes) -> bytes:
    return sha256(LEAF_PREFIX + data)


def node_hash(left: bytes, right: bytes) -> bytes:
    return sha256(NODE_PREFIX + left + right)


def _split(n: int) -> int:
    """The largest power of two strictly smaller than ``n`` (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    """RFC 6962 MTH of the leaf data ``leaves`` (in order)."""
    if not leaves:
        return EMPTY_ROOT
    return _mth([leaf_hash(data) for data in leaves], 0, len(leaves))


def _mth(hashes: list[bytes], lo: int, hi: int) -> bytes:
    if hi - lo == 1:
        return hashes[lo]
    k = _split(hi - lo)
    return node_hash(_mth(hashes, lo, lo + k), _mth(hashes, lo + k, hi))


def entries_root(entries: Sequence[dict]) -> bytes:
    """MTH of file entries ``{path, size, sha256}`` (already in path order)."""
    return merkle_root([leaf_data(e["path"], e["size"], e["sha256"]) for e in entries])
