"""Building ``UmlosError`` for the checkpoint package, and the shape check of the maps it reads.

Every failure here raises ``umlos_cuda.errors.UmlosError`` with one of the
``CHECKPOINT_*`` or ``TRACE_*`` codes of ``umlos_cuda/errors.py``; the operator
in its failure record says which UML_OS operator failed (validate, serialize,
restore, commit, migrate, or the tape writer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

from .. import checks, errors
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


_ANY = checks.field(checks.anything)


def exact_map(value: Any, keys: Iterable[str], message: str, code: str, *,
              where: Mapping[str, Any] | None = None, **record: Any) -> dict[str, Any]:
    """``value`` if it is a map with exactly ``keys`` whose values meet ``where``, else
    ``code`` (``record``: the operator and more fields of the failure) with ``message``,
    whatever is wrong: a reader names the file or field that is malformed and never
    echoes hostile content (checks.record, with one wording).

    ``where`` maps some keys to what their value must be: a type (an instance of it;
    a bool only where the type is bool), a predicate (``checks.is_uint64``), or a
    value (equal to it, of its very type).
    """
    words = checks.literal(message)
    fields: dict[str, Any] = dict.fromkeys(keys, _ANY)
    for name, rule in (where or {}).items():
        if isinstance(rule, type):
            fields[name] = checks.field(checks.instance, rule, message=words)
        elif callable(rule):
            fields[name] = rule
        else:
            fields[name] = checks.field(checks.equal, rule, message=words)
    fail: Callable[[str], UmlosError] = partial(error, code, **record)
    return checks.record(value, fields, fail=fail, not_a_map=words, unknown=words, missing=words, invalid=words)
