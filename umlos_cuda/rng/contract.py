"""The RNG consumption contract (docs/spec/rng.md §4): declared draws, checked.

Every operator declares one line, ``RNG consumption: exactly K draws from
stream S``, with ``S`` one of the sub-streams or ``none`` (and ``K = 0``
exactly when ``S`` is ``none``). :func:`consumes` makes that declaration in
code, as a decorator or a context manager; the :class:`Accountant` of the
stream records every sub-stream's offset before the operator runs and
compares the deltas after it returns. Any delta other than the declared one
(``K`` on ``S``, 0 on every other sub-stream) aborts with
``RNG_CONSUMPTION_VIOLATION``: the operator, the expected and actual deltas
per sub-stream, the replay token and the RNG and state fingerprints go into
the failure record, which is also appended to the trace tape when one is
attached.

A declaration counts everything drawn between entry and return, nested
operators included: an operator that calls another declares the sum (as
the kernel's ActivateNonParamModule_v1 declares the 31 ``cluster`` draws of
the k-means it runs). Each operator is checked at its own return, the
innermost first. An operator that raises is not checked: it did not return,
and its exception goes on unchanged.

Declarations are kept per master stream, one per operator name, so that
:meth:`Accountant.declarations` is the audit table of what may draw what.
This module knows streams only through the object it is given (``STREAMS``,
``offsets``, ``fingerprint()``), which keeps it free of :mod:`.streams`.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import checks, errors
from ..errors import UmlosError

#: The stream of an operator that draws nothing.
NONE = "none"
#: The operator named when a declaration itself is malformed.
CONTRACT_OPERATOR = "UML_OS.Random.ConsumptionContract_v1"


@dataclass(frozen=True)
class Declaration:
    """``operator`` draws exactly ``draws`` values from ``stream`` per call."""

    operator: str
    stream: str
    draws: int

    @property
    def line(self) -> str:
        """The declaration as docs/spec/rng.md §4 writes it."""
        return f"RNG consumption: exactly {self.draws} draw{'' if self.draws == 1 else 's'} from stream {self.stream}"

    def expected(self, streams: tuple[str, ...]) -> dict[str, int]:
        """The delta each sub-stream must show when the operator returns."""
        return {name: (self.draws if name == self.stream else 0) for name in streams}


@dataclass
class _Frame:
    declaration: Declaration
    before: dict[str, int]


class Accountant:
    """Checks declared consumption on one :class:`~umlos_cuda.rng.RngStreams`.

    What the failure records of a violation carry besides the deltas is set
    with :meth:`attach`: the trace ``tape`` to append them to (any object
    with ``append(record)``, such as ``CheckpointStore.tape``), the step
    ``t``, a ``state_fp`` callable returning the trainer's 32-byte state
    fingerprint and the data ``cursor`` (``(epoch, index, order_hash)``)
    used by the default state fingerprint.
    """

    def __init__(self, streams: Any) -> None:
        self._streams = streams
        self._open: list[_Frame] = []
        self._table: dict[str, Declaration] = {}
        self.tape: Any = None
        self.t: int | None = None
        self.state_fp: Callable[[], bytes] | None = None
        self.cursor: tuple[int, int, bytes] | None = None

    def attach(self, tape: Any = None, *, t: int | None = None, state_fp: Callable[[], bytes] | None = None,
               cursor: tuple[int, int, bytes] | None = None) -> Accountant:
        """Set what records carry (only the arguments given); returns self."""
        if tape is not None:
            self.tape = tape
        if t is not None:
            self.t = checks.uint64(t, "t", fail=checks.raising(errors.RNG_DECLARATION_INVALID,
                                                                operator=CONTRACT_OPERATOR))
        if state_fp is not None:
            self.state_fp = state_fp
        if cursor is not None:
            self.cursor = cursor
        return self

    # -- declarations -----------------------------------------------------------------
    def declare(self, operator: str, stream: str = NONE, draws: int = 0) -> Declaration:
        """Record ``operator``'s declaration (the same one again is a no-op)."""
        declaration = _checked_declaration(operator, stream, draws, self._streams.STREAMS)
        known = self._table.get(operator)
        if known is not None and known != declaration:
            raise UmlosError(
                errors.RNG_DECLARATION_INVALID,
                f"operator {operator} already declared '{known.line}'; an operator has exactly one "
                f"declaration, not also '{declaration.line}'",
                operator=CONTRACT_OPERATOR,
            )
        self._table[operator] = declaration
        return declaration

    def declarations(self) -> tuple[Declaration, ...]:
        """Every declaration made on this stream, sorted by operator name."""
        return tuple(self._table[name] for name in sorted(self._table))

    def table(self) -> str:
        """The declarations as a text table, one operator a line (for audits)."""
        rows = [("operator", "stream", "draws")] + [(d.operator, d.stream, str(d.draws)) for d in self.declarations()]
        width = max(len(row[0]) for row in rows)
        return "\n".join(f"{op:<{width}}  {stream:<7}  {draws}" for op, stream, draws in rows)

    def open_operators(self) -> list[str]:
        """The operators running now, outermost first."""
        return [frame.declaration.operator for frame in self._open]

    # -- accounting -------------------------------------------------------------------
    def enter(self, declaration: Declaration) -> _Frame:
        frame = _Frame(declaration, self._streams.offsets)
        self._open.append(frame)
        return frame

    def leave(self, frame: _Frame, returned: bool) -> None:
        """Close ``frame``; when the operator returned, check its deltas."""
        if not self._open or self._open[-1] is not frame:
            raise UmlosError(errors.RNG_DECLARATION_INVALID,
                             f"operator {frame.declaration.operator} ended while "
                             f"{self.open_operators()[-1] if self._open else 'no operator'} "
                             "was the innermost one running",
                             operator=CONTRACT_OPERATOR)
        self._open.pop()
        if not returned:
            return
        after = self._streams.offsets
        names = self._streams.STREAMS
        actual = {name: after[name] - frame.before[name] for name in names}
        expected = frame.declaration.expected(names)
        if actual != expected:
            raise self._violation(frame.declaration, expected, actual)

    def fingerprints(self) -> tuple[bytes, bytes]:
        """``(rng_fingerprint_t, state_fp_t)`` now: the stream's fingerprint, and
        the trainer's ``state_fp()`` or, without one, the data-plane
        StateFingerprint_v1 (items 4 and 6; item 4 only when a cursor is attached)."""
        rng_fp = self._streams.fingerprint()
        if self.state_fp is not None:
            state_fp = self.state_fp()
            checks.instance(state_fp, "state_fp()", bytes, length=32,
                            fail=checks.raising(errors.FINGERPRINT_INPUT_INVALID, operator=CONTRACT_OPERATOR),
                            message="{name} must return 32 bytes, got {type}")
            return rng_fp, state_fp
        from .state_fingerprint import StateFingerprint

        fingerprint = StateFingerprint()
        if self.cursor is not None:
            fingerprint.add_data_cursor(*self.cursor)
        return rng_fp, fingerprint.add_rng(self._streams).digest()

    def _violation(self, declaration: Declaration, expected: dict[str, int], actual: dict[str, int]) -> UmlosError:
        shown = ", ".join(f"{name} {actual[name]:+d} (expected {expected[name]})" for name in actual)
        error = UmlosError(
            errors.RNG_CONSUMPTION_VIOLATION,
            f"operator {declaration.operator} declared '{declaration.line}' but drew: {shown}",
            operator=declaration.operator,
            t=self.t,
            expected=expected,
            actual=actual,
        )
        rng_fp, state_fp = self.fingerprints()
        token = self._streams.replay_token
        error.record.update(replay_token=token.hex(), rng_fingerprint_t=rng_fp.hex(), state_fp_t=state_fp.hex())
        if self.tape is not None:
            self.tape.append(failure_record(error, token, rng_fp, state_fp))
        return error


def failure_record(error: UmlosError, replay_token: bytes, rng_fp: bytes, state_fp: bytes) -> dict[str, Any]:
    """The tape's ``failure`` record of a violation: R8's fields, with
    the per-stream deltas in ``diagnostics`` (``expected_<stream>``,
    ``actual_<stream>``)."""
    from ..checkpoint.tape import failure_fields

    record = failure_fields(error, replay_token=replay_token, rng_fingerprint_t=rng_fp, state_fp_t=state_fp)
    details = error.record.get("diagnostics", {})
    for kind in ("expected", "actual"):
        for name, delta in details.get(kind, {}).items():
            record["diagnostics"][f"{kind}_{name}"] = delta
    return record


class _Consumes:
    """What :func:`consumes` returns: a decorator and a context manager."""

    def __init__(self, streams: Any, stream: str, draws: int, operator: str | None, default_name: str) -> None:
        self._streams = streams
        self._stream = stream
        self._draws = draws
        self._default_name = default_name
        self._frames: list[_Frame] = []
        self.declaration: Declaration | None = None
        if operator is not None:
            self.declaration = streams.accountant.declare(operator, stream, draws)
        else:  # validate now; the name is known at decoration or entry
            _checked_declaration(default_name, stream, draws, streams.STREAMS)

    def _declared(self, name: str) -> Declaration:
        if self.declaration is None:
            self.declaration = self._streams.accountant.declare(name, self._stream, self._draws)
        return self.declaration

    def __call__(self, function: Callable) -> Callable:
        declaration = self._declared(f"{function.__module__}.{function.__qualname__}")
        accountant = self._streams.accountant

        @functools.wraps(function)
        def operator(*args, **kwargs):
            frame = accountant.enter(declaration)
            returned = False
            try:
                result = function(*args, **kwargs)
                returned = True
            finally:
                accountant.leave(frame, returned)
            return result

        operator.rng_declaration = declaration  # type: ignore[attr-defined]
        return operator

    def __enter__(self) -> Declaration:
        declaration = self._declared(self._default_name)
        self._frames.append(self._streams.accountant.enter(declaration))
        return declaration

    def __exit__(self, exc_type, exc, tb) -> None:
        self._streams.accountant.leave(self._frames.pop(), exc_type is None)


def consumes(streams: Any, stream: str = NONE, draws: int = 0, *, operator: str | None = None) -> _Consumes:
    """Declare ``exactly draws draws from stream`` for an operator, and check it.

    ``streams`` is the run's :class:`~umlos_cuda.rng.RngStreams`. As a
    decorator the operator is named ``module.qualname`` of the function
    unless ``operator`` names it; as a context manager it is named
    ``operator``, or ``file:line`` of the ``with`` statement. The default,
    ``stream="none", draws=0``, declares an operator that draws nothing.
    A malformed or conflicting declaration is ``RNG_DECLARATION_INVALID``;
    a call that draws otherwise is ``RNG_CONSUMPTION_VIOLATION``.
    """
    caller = sys._getframe(1)
    default_name = f"{caller.f_code.co_filename.rsplit('/', 1)[-1]}:{caller.f_lineno}"
    return _Consumes(streams, stream, draws, operator, default_name)


def _checked_declaration(operator: Any, stream: Any, draws: Any, streams: tuple[str, ...]) -> Declaration:
    fail = checks.raising(errors.RNG_DECLARATION_INVALID, operator=CONTRACT_OPERATOR)
    checks.text(operator, "an operator name", empty=False, fail=fail, message="{name} is non-empty text, got {value!r}")
    checks.choice(stream, f"operator {operator}: stream", streams + (NONE,), fail=fail,
                  message="{name} {value!r} is not one of {choices}")
    draws = checks.uint64(draws, f"operator {operator}: the number of draws", fail=fail)
    if (stream == NONE) != (draws == 0):
        raise UmlosError(
            errors.RNG_DECLARATION_INVALID,
            f"operator {operator}: 'exactly {draws} draws from stream {stream}' is not allowed: an operator that "
            f"draws nothing declares 'exactly 0 draws from stream none', one that draws declares K >= 1 from "
            f"one of {', '.join(streams)}",
            operator=CONTRACT_OPERATOR,
        )
    return Declaration(operator, stream, draws)

