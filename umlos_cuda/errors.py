"""The one exception type of umlos-cuda and its failure codes.

Seed 000 §0.K is abort-only: every failure stops the call with a deterministic
code and a failure record. Resolution R8 maps each invalid input to one code and
adds two (``INVALID_RANK``, ``INVALID_MANIFEST``). Callers branch on ``.code``;
the message is for people and says what was wrong and what is allowed.
"""

from __future__ import annotations

from typing import Any

#: Seed 000 §0.K codes, R8 additions, and the few this project adds (each
#: documented in docs/nextbatch.md, "Failure codes").
INVALID_DATASET_KEY = "INVALID_DATASET_KEY"
CARDINALITY_MISMATCH = "CARDINALITY_MISMATCH"
BATCH_SIZE_INCONSISTENT = "BATCH_SIZE_INCONSISTENT"
GLOBAL_POSITION_EXCEEDS_CARDINALITY = "GLOBAL_POSITION_EXCEEDS_CARDINALITY"
INVALID_STAGE_TYPE = "INVALID_STAGE_TYPE"
INVALID_RANK = "INVALID_RANK"  # R8 addition
INVALID_MANIFEST = "INVALID_MANIFEST"  # R8 addition
CONTRACT_VIOLATION = "CONTRACT_VIOLATION"  # seed 000 §5, SeededIntraBlockMap_v1 step 3
UINT64_OVERFLOW = "UINT64_OVERFLOW"  # seed 000 §0.C "abort on detected uint64 overflow"
BLOCK_TABLE_TOO_LARGE = "BLOCK_TABLE_TOO_LARGE"  # O(num_blocks) table would not fit
BACKEND_UNAVAILABLE = "BACKEND_UNAVAILABLE"  # asked for a backend this machine lacks
GOLDEN_MISMATCH = "GOLDEN_MISMATCH"  # a golden trace no longer reproduces

NEXTBATCH_OPERATOR = "UML_OS.Data.NextBatch_v2"


class UmlosError(Exception):
    """Raised on every failure; ``.code`` is the failure code.

    ``.record`` is the seed's failure record: ``t``, ``failure_code``,
    ``failure_operator``, ``dataset_key`` and ``data_replay_t`` (hex, or None
    when the inputs were too malformed to compute it).
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        operator: str = NEXTBATCH_OPERATOR,
        dataset_key: str | None = None,
        data_replay_t: str | None = None,
        t: int | None = None,
        **details: Any,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.record: dict[str, Any] = {
            "t": t,
            "failure_code": code,
            "failure_operator": operator,
            "dataset_key": dataset_key,
            "data_replay_t": data_replay_t,
        }
        if details:
            self.record["diagnostics"] = details


def require_uint64(value: Any, what: str, code: str = INVALID_MANIFEST) -> int:
    """Return ``value`` as an int if it is an integer in [0, 2^64 - 1]; else raise.

    bool is refused although it subclasses int: ``drop_last: true`` written where
    a size belongs is a mistake, not the number 1. NumPy integer scalars are
    accepted because users pass them naturally (``len(array)``-derived values).
    """
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise UmlosError(code, f"{what} must be an integer in [0, 2^64 - 1], got {type(value).__name__} {value!r}")
    value = int(value)
    if not 0 <= value <= UINT64_MAX:
        raise UmlosError(code, f"{what} must be in [0, 2^64 - 1], got {value}")
    return value


UINT64_MAX = (1 << 64) - 1
