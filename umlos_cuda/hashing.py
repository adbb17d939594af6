"""CBOR_CANONICAL and SHA-256, exactly as resolution R2 fixes them; the SHA-256 of an array's bytes.

Every hash the engine emits (manifest_hash, kernel_replay_token, epoch_seed,
sampler_config_hash, data_replay_t, checkpoint hashes) goes through these two
functions, so the byte rules live in one place: text map keys, CBOR unsigned
integers for every ``uintNN`` of the specification, byte strings for hashes and tokens,
CBOR booleans for flags. The digests of the files the batching stack writes
(lengths, offsets, plan epochs) hash arrays through :func:`update_array`.
"""

from __future__ import annotations

import hashlib
from typing import Any

import cbor2
import numpy as np

#: Bytes per digest update, so a memory-mapped array is read (and paged in) a piece at a time.
ARRAY_HASH_PIECE = 1 << 24

#: The hash that stands for "nothing before": the ``prev`` of a tape's first
#: record, the trace hashes of a checkpoint without a tape, the previous
#: certificate and lineage root of a store's first commit.
ZERO_HASH = bytes(32)


def cbor_canonical(value: Any) -> bytes:
    """``CBOR_CANONICAL(x) = cbor2.dumps(x, canonical=True)`` (R2)."""
    return cbor2.dumps(value, canonical=True)


def sha256(data: bytes) -> bytes:
    """The 32-byte SHA-256 digest (R2: ``hashlib.sha256``)."""
    return hashlib.sha256(data).digest()


def hash_canonical(value: Any) -> bytes:
    """``SHA-256(CBOR_CANONICAL(value))``, the contract-critical primitive of R2."""
    return sha256(cbor_canonical(value))


def update_array(digest, array: np.ndarray) -> None:
    """Feed the bytes of the C-contiguous ``array`` to ``digest``, :data:`ARRAY_HASH_PIECE` bytes at a time."""
    view = array.reshape(-1).data.cast("B")
    for start in range(0, len(view), ARRAY_HASH_PIECE):
        digest.update(view[start:start + ARRAY_HASH_PIECE])


def sha256_array(array: np.ndarray) -> str:
    """The SHA-256 (hex) of an array's bytes, as they are in memory (give it the dtype the file holds)."""
    digest = hashlib.sha256()
    update_array(digest, np.ascontiguousarray(array))
    return digest.hexdigest()
