"""The plan fingerprint: SHA-256 over the canonical content of a plan.

Canonical content, in this order (docs/batching.md, "Plan fingerprint"):

* per epoch, ``epoch_digest`` = SHA-256 of the tag ``umlos_batch_plan_epoch_v1``,
  the canonical CBOR of ``[epoch, index_base, index_step, M, S, row dtype]``,
  then the little-endian bytes of ``offsets`` (int64), ``samples`` (the
  plan's row dtype), ``bucket_ids`` (int16) and ``max_len`` (uint32); a
  packed plan's epoch adds the number of rows R to the CBOR list and the
  bytes of ``row_offsets`` and ``pack_rows`` (int64) after ``max_len``; a
  split plan's epoch (over-long policy ``split``) then adds the text
  ``"pieces"`` to the CBOR list and the bytes of ``pieces`` (uint32) last;
* the fingerprint = SHA-256 of the canonical CBOR of
  ``["umlos_batch_plan_v1", header, [epoch_digest, ...]]`` where ``header`` is
  meta.json without ``fingerprint`` and ``epoch_digests`` (the configuration,
  the engine's mode and ``sampler_config_hash``, the hashes of the lengths,
  ids and tokenizer, the shard).

The arrays are what the binary files hold, so no conversion is hashed; the
JSONL and stats.json are derived from them and checked by ``plan verify``.
No timestamp is part of a plan, so the same inputs give the same bytes.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ...hashing import cbor_canonical, hash_canonical, update_array
from dataclasses import replace


def epoch_digest(epoch: int, index_base: int, index_step: int, offsets, samples, bucket_ids, max_len,
                 row_offsets=None, pack_rows=None, pieces=None) -> str:
    digest = hashlib.sha256(b"umlos_batch_plan_epoch_v1")
    samples = np.asarray(samples)
    head = [int(epoch), int(index_base), int(index_step), len(bucket_ids), int(samples.shape[0]),
            samples.dtype.str]
    arrays = [(offsets, "<i8"), (samples, samples.dtype.newbyteorder("<")), (bucket_ids, "<i2"), (max_len, "<u4")]
    if pack_rows is not None:
        head.append(len(row_offsets) - 1)
        arrays += [(row_offsets, "<i8"), (pack_rows, "<i8")]
    if pieces is not None:
        head.append("pieces")
        arrays.append((pieces, "<u4"))
    digest.update(cbor_canonical(head))
    for array, dtype in arrays:
        update_array(digest, np.ascontiguousarray(np.asarray(array).astype(dtype, copy=False)))
    return digest.hexdigest()


def plan_fingerprint(header: dict, digests) -> str:
    return hash_canonical(["umlos_batch_plan_v1", header, list(digests)]).hex()


def epoch_plan_digest(plan) -> str:
    """:func:`epoch_digest` of an :class:`~umlos_cuda.batching.plans.plan.EpochPlan`."""
    return epoch_digest(plan.epoch, plan.index_base, plan.index_step, plan.offsets, plan.samples,
                        plan.bucket_ids, plan.max_len, plan.row_offsets, plan.pack_rows, plan.pieces)


def finish_meta(meta, epochs):
    """``meta`` with its epoch digests and fingerprint computed from ``epochs``."""

    digests = tuple(epoch_plan_digest(e) for e in epochs)
    return replace(meta, epoch_digests=digests, fingerprint=plan_fingerprint(meta.header(), digests))
