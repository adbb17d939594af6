"""Building ``UmlosError`` for the checkpoint package.

Every failure here raises ``umlos_cuda.errors.UmlosError`` with one of the
``CHECKPOINT_*`` or ``TRACE_*`` codes of ``umlos_cuda/errors.py``; the operator
in its failure record says which UML_OS operator failed (validate, serialize,
restore, commit, migrate, or the tape writer).
"""

from __future__ import annotations

from typing import Any

from .. import errors
from ..errors import UmlosError

VALIDATE = errors.CHECKPOINT_VALIDATE_OPERATOR
SERIALIZE = errors.CHECKPOINT_SERIALIZE_OPERATOR
RESTORE = errors.CHECKPOINT_RESTORE_OPERATOR
COMMIT = errors.CHECKPOINT_COMMIT_OPERATOR
MIGRATE = errors.CHECKPOINT_MIGRATE_OPERATOR
TAPE = errors.TAPE_OPERATOR


def error(code: str, message: str, *, operator: str = VALIDATE, t: int | None = None, **details: Any) -> UmlosError:
    """A ``UmlosError`` for ``code`` with the checkpoint operator in its record."""
    return UmlosError(code, message, operator=operator, t=t, **details)
