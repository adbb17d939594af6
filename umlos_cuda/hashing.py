"""CBOR_CANONICAL and SHA-256, exactly as resolution R2 fixes them.

Every hash the engine emits (manifest_hash, kernel_replay_token, epoch_seed,
sampler_config_hash, data_replay_t, checkpoint hashes) goes through these two
functions, so the byte rules live in one place: text map keys, CBOR unsigned
integers for every ``uintNN`` of the specification, byte strings for hashes and tokens,
CBOR booleans for flags.
"""

from __future__ import annotations

import hashlib
from typing import Any

import cbor2

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
