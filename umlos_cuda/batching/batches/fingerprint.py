"""Content fingerprints of batches: what the model saw, not how it was planned.

What goes in: collated microbatches in training order (anything with
``input_ids`` and ``loss_mask``: a :class:`CollatedBatch`, a batch file's
arrays), or a plan and its token source. What comes out: a SHA-256 hex
fingerprint of the first N microbatches, and a :class:`BatchFingerprint`
that also keeps each microbatch's digest, so a later run that differs is
told which microbatch differs first.

Canonical bytes (docs/batching.md, "Fingerprints"; all little-endian):

* the digest of one microbatch is SHA-256 of ``b"umlos_batch_microbatch_v1\\0"``,
  its shape ``rows, width`` (two uint32), its ``input_ids`` as int32 and
  its ``loss_mask`` as uint8, both row-major over the padded ``[rows,
  width]`` arrays;
* the fingerprint is SHA-256 of ``b"umlos_batch_fingerprint_v1\\0"``, the
  number of microbatches hashed (uint64) and their 32-byte digests in order.

Padding is part of the bytes: a run that pads to the bucket and one that
pads to the longest sample fingerprint differently, as their tensors differ.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any, cast

import numpy as np

from ... import checks, errors
from ...files.atomic import atomic_output
from ...errors import UmlosError
from ..collate import collate_microbatch, plan_separator_ids
from ..plans.integrity import check_rows_match_plan
from ..plans.rows import iter_microbatches
from ...files.reader import read_json

FINGERPRINT_FORMAT = "umlos_cuda.batch_fingerprint/1"
DEFAULT_N_BATCHES = 100
MICROBATCH_TAG = b"umlos_batch_microbatch_v1\0"
FINGERPRINT_TAG = b"umlos_batch_fingerprint_v1\0"


def microbatch_digest(input_ids: np.ndarray, loss_mask: np.ndarray) -> str:
    """SHA-256 (hex) of one microbatch's canonical bytes."""
    ids = np.asarray(input_ids)
    mask = np.asarray(loss_mask)
    if ids.ndim != 2 or mask.shape != ids.shape:
        raise _invalid(f"input_ids and loss_mask must be two arrays of one [rows, width] shape, "
                       f"got {ids.shape} and {mask.shape}")
    digest = hashlib.sha256(MICROBATCH_TAG)
    digest.update(struct.pack("<II", *ids.shape))
    digest.update(np.ascontiguousarray(ids, dtype="<i4").data)
    digest.update(np.ascontiguousarray(mask, dtype="u1").data)
    return digest.hexdigest()


def combine_digests(digests: Iterable[str]) -> str:
    """The fingerprint of microbatches with these digests, in order."""
    raw = [bytes.fromhex(d) for d in digests]
    digest = hashlib.sha256(FINGERPRINT_TAG)
    digest.update(struct.pack("<Q", len(raw)))
    for item in raw:
        digest.update(item)
    return digest.hexdigest()


@dataclass(frozen=True)
class BatchFingerprint:
    """A fingerprint with what it covers: ``n_batches`` asked for, the
    ``digests`` of the microbatches hashed (fewer when the sequence is
    shorter), their ``positions`` (``(epoch, index)`` in a plan, or None),
    and the ``plan_fingerprint`` they came from (or None)."""

    fingerprint: str
    n_batches: int
    digests: tuple[str, ...]
    positions: tuple[tuple[int, int], ...] | None = None
    plan_fingerprint: str | None = None

    def __post_init__(self) -> None:
        _check_n(self.n_batches)
        if not self.digests or any(not _is_hex(d) for d in self.digests):
            raise _invalid("digests must be a non-empty list of SHA-256 hex digests")
        if self.positions is not None and len(self.positions) != len(self.digests):
            raise _invalid(f"{len(self.positions)} positions for {len(self.digests)} digests")
        if len(self.digests) > self.n_batches:
            raise _invalid(f"{len(self.digests)} digests but n_batches is {self.n_batches}")
        if self.fingerprint != combine_digests(self.digests):
            raise _invalid("the fingerprint is not the one its digests give")

    def name(self, position: int) -> str:
        """How messages name microbatch ``position`` of the sequence."""
        if self.positions is None:
            return f"microbatch {position} of the sequence"
        epoch, index = self.positions[position]
        return f"epoch {epoch} microbatch {index} (position {position})"

    def to_json(self) -> dict:
        return {"format": FINGERPRINT_FORMAT, "fingerprint": self.fingerprint, "n_batches": self.n_batches,
                "plan_fingerprint": self.plan_fingerprint, "digests": list(self.digests),
                "positions": None if self.positions is None else [list(p) for p in self.positions]}

    @classmethod
    def from_json(cls, data: Any) -> BatchFingerprint:
        checks.record(data, _SAVED_FIELDS, fail=_invalid, not_a_map=_SAVED, unknown=_SAVED, missing=_SAVED)
        checks.equal(data["format"], "format", FINGERPRINT_FORMAT, fail=_invalid, message=_SAVED)
        positions = data["positions"]
        if positions is not None:
            for pair in checks.instance(positions, "positions", list, fail=_invalid, message=_POSITIONS):
                for number in checks.instance(pair, "positions", list, length=2, fail=_invalid, message=_POSITIONS):
                    checks.integer(number, "positions", 0, None, strict=True, fail=_invalid, message=_POSITIONS)
            positions = tuple(tuple(p) for p in positions)
        digests = checks.instance(data["digests"], "digests", list, fail=_invalid, message="{name} must be a list")
        plan = data["plan_fingerprint"]
        if plan is not None and not _is_hex(plan):
            raise _invalid("plan_fingerprint must be null or a SHA-256 hex digest")
        return cls(data["fingerprint"], data["n_batches"], tuple(digests), positions, plan)

    def save(self, path: str | os.PathLike[str], *, force: bool = False, inputs=()) -> None:
        """Write it as JSON, atomically (never over one of ``inputs``)."""
        with atomic_output(path, force=force, inputs=inputs) as handle:
            handle.write((json.dumps(self.to_json(), indent=2) + "\n").encode("ascii"))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> BatchFingerprint:
        try:
            data = read_json(path, _invalid)
        except FileNotFoundError:
            raise _invalid(f"cannot read {os.fspath(path)}: it does not exist") from None
        try:
            return cls.from_json(data)
        except UmlosError as exc:
            raise _invalid(f"{os.fspath(path)}: {exc.message}") from None


#: A saved fingerprint's fields, sorted as its message names them (:meth:`BatchFingerprint.from_json` checks values).
_SAVED_FIELDS = dict.fromkeys(("digests", "fingerprint", "format", "n_batches", "plan_fingerprint", "positions"),
                              checks.field(checks.anything))
_SAVED = checks.literal(f"a saved batch fingerprint is a JSON object with format {FINGERPRINT_FORMAT!r} and "
                        f"exactly the fields {', '.join(_SAVED_FIELDS)}")
_POSITIONS = "positions must be null or a list of [epoch, index] pairs of non-negative integers"

def batch_fingerprint(batches: Iterable[Any], n_batches: int = DEFAULT_N_BATCHES, *,
                      positions: Iterable[tuple[int, int]] | None = None,
                      plan_fingerprint: str | None = None) -> BatchFingerprint:
    """The :class:`BatchFingerprint` of the first ``n_batches`` of ``batches``."""
    n = _check_n(n_batches)
    digests = tuple(microbatch_digest(*_arrays(batch, i)) for i, batch in enumerate(islice(batches, n)))
    if not digests:
        raise _invalid("there are no microbatches to fingerprint")
    kept = None
    if positions is not None:  # the pairs as given (a cast: tuple() does not keep their length in the type)
        kept = cast(tuple[tuple[int, int], ...], tuple(tuple(p) for p in islice(positions, len(digests))))
    return BatchFingerprint(combine_digests(digests), n, digests, kept, plan_fingerprint)


def compute_batch_fingerprint(batches: Iterable[Any], n_batches: int = DEFAULT_N_BATCHES) -> str:
    """SHA-256 (hex) over the first ``n_batches`` microbatches' ``input_ids`` and ``loss_mask``."""
    return batch_fingerprint(batches, n_batches).fingerprint


def verify_batch_fingerprint(batches: Iterable[Any], expected: str | BatchFingerprint,
                             n_batches: int = DEFAULT_N_BATCHES, *,
                             positions: Iterable[tuple[int, int]] | None = None) -> BatchFingerprint:
    """Recompute the fingerprint and compare it with ``expected``: a hex
    string (over ``n_batches``), or a :class:`BatchFingerprint` (over its own
    ``n_batches``, and then a mismatch names the first microbatch that
    differs). Returns the fingerprint computed; BATCH_FINGERPRINT_MISMATCH
    when it differs."""
    _check_expected(expected)
    if isinstance(expected, BatchFingerprint):
        n_batches = expected.n_batches
    got = batch_fingerprint(batches, n_batches, positions=positions)
    compare_fingerprints(got, expected)
    return got


def compare_fingerprints(got: BatchFingerprint, expected: str | BatchFingerprint) -> None:
    """BATCH_FINGERPRINT_MISMATCH unless ``got`` is ``expected`` (see :func:`verify_batch_fingerprint`)."""
    _check_expected(expected)
    want = expected.fingerprint if isinstance(expected, BatchFingerprint) else expected
    if got.fingerprint == want:
        return
    summary = f"the first {len(got.digests)} microbatch(es) fingerprint to {got.fingerprint}, not the expected {want}"
    if not isinstance(expected, BatchFingerprint):
        raise UmlosError(errors.BATCH_FINGERPRINT_MISMATCH, summary + " (verify against a saved fingerprint file to "
                         "name the first microbatch that differs)", operator=errors.BATCHING_OPERATOR)
    first = next((i for i, (a, b) in enumerate(zip(got.digests, expected.digests)) if a != b), None)
    if first is None:  # one sequence is a prefix of the other
        first = min(len(got.digests), len(expected.digests))
        detail = f"{len(got.digests)} microbatches were hashed, the expected fingerprint has {len(expected.digests)}"
    else:
        detail = f"its digest is {got.digests[first]}, expected {expected.digests[first]}"
    named = next((f.name(first) for f in (got, expected) if f.positions is not None and first < len(f.digests)),
                 f"microbatch {first} of the sequence")
    raise UmlosError(errors.BATCH_FINGERPRINT_MISMATCH, f"{summary}; the first that differs is {named}: {detail}",
                     operator=errors.BATCHING_OPERATOR, first_mismatch=first)


def _check_expected(expected: Any) -> None:
    if not isinstance(expected, BatchFingerprint) and not _is_hex(expected):
        raise _invalid(f"the expected fingerprint must be a SHA-256 hex digest or a BatchFingerprint, got {expected!r}")


def plan_batches(plan, source, *, pad_id: int = 0, separator_ids=()) -> Iterator[tuple[int, int, Any]]:
    """``(epoch, index, CollatedBatch)`` of a plan of rows (any kind: plans/rows.py), in training order from
    epoch 0, collated from ``source`` (a token store or Megatron dataset; a mixture's components as one)."""

    separator_ids = plan_separator_ids(plan, separator_ids, source)
    for epoch, microbatch in iter_microbatches(plan):
        yield epoch, microbatch.index, collate_microbatch(source, microbatch, pad_id=pad_id,
                                                          separator_ids=separator_ids)


def fingerprint_plan_batches(plan, source, n_batches: int = DEFAULT_N_BATCHES, *, pad_id: int = 0,
                     separator_ids=()) -> BatchFingerprint:
    """The :class:`BatchFingerprint` of a plan's first ``n_batches`` microbatches, collated from ``source``
    (checked to hold the plan's rows: plans/integrity.py)."""

    check_rows_match_plan(source, plan)
    batches = plan_batches(plan, source, pad_id=pad_id, separator_ids=separator_ids)
    items = list(islice(batches, _check_n(n_batches)))
    return batch_fingerprint((b for _, _, b in items), n_batches, positions=[(e, i) for e, i, _ in items],
                             plan_fingerprint=plan.fingerprint)


def _arrays(batch: Any, position: int) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(batch, dict) or hasattr(batch, "keys"):
        ids, mask = batch.get("input_ids"), batch.get("loss_mask")
    else:
        ids, mask = getattr(batch, "input_ids", None), getattr(batch, "loss_mask", None)
    if ids is None or mask is None:
        raise _invalid(f"microbatch {position} ({type(batch).__name__}) has no input_ids and loss_mask")
    return ids, mask


def _check_n(n_batches: Any) -> int:
    return checks.integer(n_batches, "n_batches", 1, None, fail=_invalid, message=checks.POSITIVE)


def _is_hex(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def _invalid(message: str) -> UmlosError:
    return UmlosError(errors.BATCH_FINGERPRINT_INVALID, message, operator=errors.BATCHING_OPERATOR)
