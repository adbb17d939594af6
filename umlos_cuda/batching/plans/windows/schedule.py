"""Mixture schedules: a mixture's weights as a function of how far it has come.

What goes in: pieces, each a first mixture position ``at`` (samples consumed before it), one weight
``>= 0`` per component (exact rationals) and whether the weights ramp linearly to the next piece's
(``ramp``). What comes out (:class:`MixSchedule`): the weights of window ``m`` of a mixture of window
``W`` (:meth:`MixSchedule.window_weights`), the next window whose weights may differ
(:meth:`MixSchedule.next_change`, so :func:`~.blend.schedule` keeps segments of identical windows), and
the canonical form the fingerprint hashes (:meth:`MixSchedule.to_dict`).

The rules (docs/batching.md, "Mixture schedules", normative):

* a window's weights are the schedule's value at its **first position** ``m W``: a window that straddles
  a change point keeps the weights it started with whole, so a change at position ``p`` takes effect
  from window ``ceil(p / W)``;
* in a ramp piece ``k`` the value at position ``p`` is ``w_k + (w_{k+1} - w_k) (p - at_k) / (at_{k+1} - at_k)``
  (exact), so every window of a ramp is its own segment; the last piece holds to the end and cannot ramp;
* a weight of 0 is a component not (yet, or any more) in the mixture: it joins at the first window whose
  weight is > 0 and retires at the first whose weight is 0 again; its stream stands still in between,
  so it resumes where it stopped.
"""

from __future__ import annotations

import bisect
import numbers
from dataclasses import dataclass, field
from fractions import Fraction
from math import isfinite, lcm

from .... import checks
from ....errors import UINT64_MAX, UmlosError
from ....files import reader
from ..buckets import config_error

#: Most pieces one schedule may have.
MAX_PIECES = 1 << 12
#: Most bytes a schedule file may hold (``plan build --mix-schedule``).
MAX_SCHEDULE_BYTES = 1 << 20
#: Most windows the ramps of one schedule may cover (each is a segment of its own, its quotas computed when the
#: mixture is defined or opened: about 35 microseconds a window, some 9 s at this bound).
MAX_RAMP_WINDOWS = 1 << 18


@dataclass(frozen=True)
class Piece:
    """Weights from mixture position ``at`` on: one per component (``>= 0``, at least one > 0; a float is taken as
    its exact binary value, as a component's weight is); ``ramp``: they move linearly to the next piece's weights
    by its ``at``."""

    at: int
    weights: tuple[Fraction, ...]
    ramp: bool = False

    def to_dict(self) -> dict:
        return {"at": self.at, "weights": [[w.numerator, w.denominator] for w in self.weights], "ramp": self.ramp}


def _exact(weight) -> Fraction:
    """A weight as an exact rational: a float (NumPy's too) its binary value, as a component's weight is taken."""
    return Fraction(weight) if isinstance(weight, numbers.Rational) else Fraction(float(weight))


@dataclass(frozen=True)
class MixSchedule:
    """A mixture's weights over its positions (module docstring): ``pieces`` in order of ``at``, the first at 0."""

    pieces: tuple[Piece, ...]
    _ats: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _ratios: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        pieces = tuple(self.pieces)
        if not 1 <= len(pieces) <= MAX_PIECES:
            raise config_error(f"a schedule takes 1 to {MAX_PIECES} pieces, got {len(pieces)}")
        width = len(pieces[0].weights) if isinstance(pieces[0], Piece) and isinstance(pieces[0].weights, tuple) else 0
        for k, piece in enumerate(pieces):
            if not isinstance(piece, Piece) or not isinstance(piece.weights, tuple):
                raise config_error(f"schedule piece {k} must be a Piece with a tuple of weights")
            checks.integer(piece.at, f"schedule piece {k} at", 0 if k == 0 else pieces[k - 1].at + 1,
                           0 if k == 0 else UINT64_MAX, fail=config_error,
                           message="{name} must be 0 for the first piece and grow strictly after, below 2^64, "
                           "got {value!r}")
            if len(piece.weights) != width:
                raise config_error(f"schedule piece {k} has {len(piece.weights)} weights; piece 0 has {width}")
            if not all(checks.is_number(w) and isfinite(w) and w >= 0 for w in piece.weights) or not any(piece.weights):
                raise config_error(f"schedule piece {k}: weights must be finite numbers >= 0, at least one > 0")
            if not isinstance(piece.ramp, bool):
                raise config_error(f"schedule piece {k}: ramp must be true or false")
        pieces = tuple(Piece(int(p.at), tuple(map(_exact, p.weights)), p.ramp) for p in pieces)
        if pieces[-1].ramp:
            raise config_error("the last schedule piece holds to the end and cannot ramp")
        object.__setattr__(self, "pieces", pieces)
        object.__setattr__(self, "_ats", tuple(p.at for p in pieces))
        ratios = []
        for k, piece in enumerate(pieces):
            ends = (piece.weights, pieces[k + 1].weights) if piece.ramp else (piece.weights,)
            scale = lcm(*(w.denominator for weights in ends for w in weights))
            start, *target = (tuple(w.numerator * (scale // w.denominator) for w in weights) for weights in ends)
            ratios.append((start, target[0] if target else None))
        object.__setattr__(self, "_ratios", tuple(ratios))

    @property
    def width(self) -> int:
        """How many components the schedule weighs."""
        return len(self.pieces[0].weights)

    def piece_at(self, position: int) -> int:
        """The index of the piece holding mixture position ``position``."""
        return bisect.bisect_right(self._ats, position) - 1

    def weights_at(self, position: int) -> tuple[Fraction, ...]:
        """The weights at mixture position ``position`` (exact; a ramp interpolated)."""
        k = self.piece_at(position)
        piece = self.pieces[k]
        if not piece.ramp:
            return piece.weights
        after = self.pieces[k + 1]
        t = Fraction(position - piece.at, after.at - piece.at)
        return tuple(a + (b - a) * t for a, b in zip(piece.weights, after.weights))

    def window_weights(self, m: int, window: int) -> tuple[Fraction, ...]:
        """Window ``m``'s weights: the value at its first position ``m W``."""
        return self.weights_at(m * window)

    def window_ratios(self, m: int, window: int) -> tuple[int, ...]:
        """Window ``m``'s weights as integers in the same ratio (what the quotas need; no rational arithmetic per
        window): a held piece's over the lcm of its denominators, a ramp's over that times the ramp's length."""
        position = m * window
        k = self.piece_at(position)
        start, target = self._ratios[k]
        if target is None:
            return start
        span = self.pieces[k + 1].at - self.pieces[k].at
        d = position - self.pieces[k].at
        return tuple(a * span + (b - a) * d for a, b in zip(start, target))

    def next_change(self, m: int, window: int) -> int | None:
        """The first window after ``m`` whose weights may differ from window ``m``'s (None: none does)."""
        k = self.piece_at(m * window)
        if self.pieces[k].ramp:
            return m + 1
        if k + 1 == len(self.pieces):
            return None
        return -(-self.pieces[k + 1].at // window)

    def ramp_windows(self, window: int, limit: int | None) -> int:
        """How many windows the ramps cover, up to position ``limit`` (None: no end)."""
        total = 0
        for piece, after in zip(self.pieces, self.pieces[1:]):
            if piece.ramp:
                end = after.at if limit is None else min(after.at, limit)
                total += max(0, -(-end // window) - -(-piece.at // window))
        return total

    def describe(self, names: list[str]) -> list[dict]:
        """The pieces as ``plan info`` reports them: ``at``, ``ramp`` and each component's weight by name (a float)."""
        return [{"at": p.at, "ramp": p.ramp, "weights": dict(zip(names, (float(w) for w in p.weights)))}
                for p in self.pieces]

    @staticmethod
    def lines(described: list[dict]) -> list[str]:
        """``plan info``'s lines of :meth:`describe`'s pieces."""
        out = []
        for piece in described:
            weights = ", ".join(f"{name} {w:.6g}" for name, w in piece["weights"].items())
            shape = "ramping to the next piece's" if piece["ramp"] else "held"
            out.append(f"  schedule from sample {piece['at']}: {weights} ({shape})")
        return out

    def to_dict(self) -> dict:
        """The canonical form a mixture's fingerprint records (exact weights as ``[numerator, denominator]``)."""
        return {"pieces": [p.to_dict() for p in self.pieces]}

    @classmethod
    def from_dict(cls, data, width: int, fail=config_error) -> MixSchedule:
        """The schedule :meth:`to_dict` wrote (a plan's meta.json), ``width`` weights per piece; ``fail`` for anything
        else."""
        record = checks.record(data, {"pieces": checks.field(checks.anything)}, fail=fail, what="schedule")
        if not isinstance(record["pieces"], list):
            raise fail("schedule pieces must be a list")
        pieces = []
        for k, entry in enumerate(record["pieces"]):
            where = f"schedule piece {k}"
            entry = checks.record(entry, dict.fromkeys(("at", "weights", "ramp"), checks.field(checks.anything)),
                                  fail=fail, what=where)
            weights = entry["weights"]
            if (not isinstance(weights, list) or len(weights) != width
                    or not all(isinstance(w, list) and len(w) == 2 and all(type(v) is int for v in w)
                               and w[0] >= 0 and w[1] > 0 for w in weights)):
                raise fail(f"{where}: weights must be {width} pairs [numerator, denominator], integers >= 0 and > 0")
            if type(entry["at"]) is not int:
                raise fail(f"{where}: at must be an integer")
            pieces.append(Piece(entry["at"], tuple(Fraction(*w) for w in weights), entry["ramp"]))
        try:
            schedule = cls(tuple(pieces))
        except UmlosError as exc:  # a config error's message, under the caller's code
            raise fail(exc.message) from None
        if schedule.to_dict() != data:
            raise fail("schedule is not in canonical form (weights in lowest terms)")
        return schedule


def schedule_from_spec(spec, names: list[str], base: list[Fraction], where: str = "the schedule") -> MixSchedule:
    """The schedule a user writes (docs/batching.md, "Mixture schedules"): ``{"unit": "samples" |
    "steps", "global_batch": B (with steps), "pieces": [{"at": A, "weights": {NAME: WEIGHT, ...}, "ramp": false},
    ...]}``; a component a piece does not name keeps its own weight (``base``); ``at`` in steps is ``A B`` samples.
    BATCHING_CONFIG_INVALID naming ``where`` for anything else."""
    def fail(message: str):
        return config_error(f"{where}: {message}")

    record = checks.record(spec, {"pieces": checks.field(checks.anything)}, fail=fail, what="the schedule",
                           optional={"unit": checks.field(checks.text), "global_batch": checks.field(checks.anything)})
    unit = record.get("unit", "samples")
    if unit not in ("samples", "steps"):
        raise fail(f"unit must be 'samples' or 'steps', got {unit[:checks.SHOWN_CHARS]!r}")
    if (unit == "steps") != ("global_batch" in record):
        raise fail("global_batch (samples per step) is given with unit 'steps' and only then")
    scale = 1 if unit == "samples" else checks.integer(record["global_batch"], "global_batch", 1, UINT64_MAX,
                                                       fail=fail, strict=True)
    pieces = record["pieces"]
    if not isinstance(pieces, list) or not 1 <= len(pieces) <= MAX_PIECES:
        raise fail(f"pieces must be a list of 1 to {MAX_PIECES} pieces")
    out = []
    for k, piece in enumerate(pieces):
        what = f"piece {k}"
        entry = checks.record(piece, {"at": checks.field(checks.integer, 0, UINT64_MAX, strict=True),
                                      "weights": checks.field(checks.anything)}, fail=fail, what=what,
                              optional={"ramp": checks.field(checks.anything)})
        given = entry["weights"]
        if not isinstance(given, dict):
            raise fail(f"{what}: weights must be an object of component names and weights")
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise fail(f"{what} weighs {unknown[0][:checks.SHOWN_CHARS]!r}, which is no component "
                       f"(the components are {', '.join(names)})")
        weights = tuple(Fraction(checks.number(given[name], f"{what} weight of {name!r}", at_least=0, fail=fail))
                        if name in given else base[i] for i, name in enumerate(names))
        ramp = entry.get("ramp", False)
        if not isinstance(ramp, bool):
            raise fail(f"{what}: ramp must be true or false")
        out.append(Piece(entry["at"] * scale, weights, ramp))
    try:
        return MixSchedule(tuple(out))
    except UmlosError as exc:  # MixSchedule's rules, named with the file
        raise fail(exc.message) from None


def read_schedule(path: str, names: list[str], base: list[Fraction]) -> MixSchedule:
    """The schedule in the JSON file ``path`` (at most :data:`MAX_SCHEDULE_BYTES`, read by the bounded reader),
    BATCHING_CONFIG_INVALID naming the file for anything it refuses (a missing file included)."""
    try:
        spec = reader.read_json(path, config_error, max_bytes=MAX_SCHEDULE_BYTES, what="schedule file")
    except FileNotFoundError:
        raise config_error(f"{path}: no such schedule file") from None
    return schedule_from_spec(spec, names, base, path)
