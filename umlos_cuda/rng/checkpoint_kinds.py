"""The RNG state and the fingerprints in checkpoints and on the trace tape.

This module plugs into the checkpoint package's extension points
(:mod:`umlos_cuda.checkpoint.extensions`) without changing them:

- cursor kind ``rng``: the master stream's state (docs/spec/rng.md §3), the
  file ``data/cursors=rng.cbor`` of a checkpoint. ``encode`` takes an
  :class:`~umlos_cuda.rng.RngStreams` (or its ``state_dict()``); ``decode``
  checks the layout and returns the plain state, which the trainer hands to
  ``RngStreams.load_state_dict``, which checks that the master is its own
  (a replay-token override changes the master, and only the run knows it).
- cursor kind ``fingerprints``: ``{rng_fingerprint, state_fp, functional_fp}``
  at the checkpoint's step, each 32 bytes or null (the checkpoint keeps
  ``functional_fp``; docs/spec/rng.md §6).
- tape record type ``rng.iter``: ``{t, rng_fingerprint_t, state_fp_t,
  functional_fp}``, appended after a step's ``iter`` record (docs/rng.md:
  ``state_fp`` every step, ``functional_fp`` when recomputed).

``pyproject.toml`` declares this module as an entry point of the group
``umlos_cuda.checkpoint``, so a reader in another process (``umlos-cuda
checkpoint verify``, a restore in a fresh interpreter) finds the kinds and
the record type without importing it first.
"""

from __future__ import annotations

from typing import Any

from .. import checks, errors
from ..checkpoint import CursorKind, register_cursor_kind, register_record_type, tape
from ..manifest.core import Manifest
from .streams import RNG_OPERATOR, check_state

__all__ = ["FINGERPRINTS", "RNG", "RNG_ITER", "fingerprints", "step_record"]


def _encode_rng(value: Any) -> dict[str, Any]:
    return check_state(value.state_dict() if hasattr(value, "state_dict") else value)


def _decode_rng(value: Any, manifest: Manifest) -> dict[str, Any]:
    return check_state(value)


#: The fingerprints a checkpoint holds, each 32 bytes or null.
_FINGERPRINTS = dict.fromkeys(("rng_fingerprint", "state_fp", "functional_fp"), tape.nullable(tape.is_hash))
_NOT_FINGERPRINTS = "fingerprints are {{{fields}}}"


def _decode_fingerprints(value: Any, manifest: Manifest | None) -> dict[str, bytes | None]:
    # ValueError: a kind's refusal, which the container words with its own code
    return checks.record(value, _FINGERPRINTS, fail=ValueError, not_a_map=_NOT_FINGERPRINTS, unknown=_NOT_FINGERPRINTS,
                         missing=_NOT_FINGERPRINTS, invalid="{name} is 32 bytes or null")


RNG = register_cursor_kind(CursorKind("rng", _encode_rng, _decode_rng,
                                      "the RNG master seed and sub-stream offsets (docs/spec/rng.md)"))
FINGERPRINTS = register_cursor_kind(CursorKind("fingerprints", lambda value: _decode_fingerprints(value, None),
                                               _decode_fingerprints,
                                               "rng_fingerprint, state_fp and functional_fp at the checkpoint"))
RNG_ITER = register_record_type("rng.iter", {
    "t": tape.is_uint,
    "rng_fingerprint_t": tape.is_hash,
    "state_fp_t": tape.is_hash,
    "functional_fp": tape.nullable(tape.is_hash),
})


def _functional(functional_fp: Any) -> bytes | None:
    if functional_fp is None:
        return None
    return checks.instance(functional_fp, "functional_fp", bytes, length=32,
                           fail=checks.raising(errors.FINGERPRINT_INPUT_INVALID, operator=RNG_OPERATOR),
                           message="{name} must be 32 bytes (umlos_cuda.functional_fp) or None, got {type}")


def step_record(streams: Any, t: int, *, functional_fp: bytes | None = None) -> dict[str, Any]:
    """The ``rng.iter`` record of step ``t``: the stream's ``rng_fingerprint_t``
    and the accountant's ``state_fp_t`` (the trainer's ``state_fp``, or the
    data plane's), with ``functional_fp`` when it was recomputed."""
    t = checks.uint64(t, "t", fail=checks.raising(errors.FINGERPRINT_INPUT_INVALID, operator=RNG_OPERATOR))
    rng_fp, state_fp = streams.accountant.fingerprints()
    return {"type": RNG_ITER, "t": t, "rng_fingerprint_t": rng_fp, "state_fp_t": state_fp,
            "functional_fp": _functional(functional_fp)}


def fingerprints(streams: Any, *, functional_fp: bytes | None = None) -> dict[str, bytes | None]:
    """The ``fingerprints`` cursor of a checkpoint taken now."""
    rng_fp, state_fp = streams.accountant.fingerprints()
    return {"rng_fingerprint": rng_fp, "state_fp": state_fp, "functional_fp": _functional(functional_fp)}
