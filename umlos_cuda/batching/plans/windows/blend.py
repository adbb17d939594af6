"""The one weighted mixture, generic over what it mixes: which stream position each place of a window holds.

What goes in: per component a :class:`Part` (its weight, how many positions one epoch of its stream
holds, an optional cap on its epochs, a name), a window size ``W``, an optional total and the mixture
seed. What comes out (:class:`Blend`): the table of segments of identical windows, window ``m``'s
quotas and where each stream stands when it starts (O(1) from the table), window ``m``'s places
merged (:meth:`Blend.merge`: component and stream position of each place, O(W)), and the component,
its epoch and its position in that epoch at any place (:meth:`Blend.locate`, one window merged).

A stream position means whatever the components hold: a sample mixture's is a row of the component's
epoch order (:mod:`.mixture`), a mixture of pretraining sequences' is a sample of the component's cut
(:mod:`.sequence_mixture`); a new kind of component is a new meaning of a position, not a new mixture.
Every mixture follows the rules of docs/batching.md, "Weighted mixtures" (normative), kept here once:

* window ``m`` holds ``size_m = min(W, samples left, supply left)`` places; its **quotas** ``q_i`` are
  :func:`allocate`'s: the largest-remainder rule over the live components' weights (exact rationals),
  where a capped component whose quota exceeds what its stream has left gives what is left and the rest
  is re-allocated among the others; the window takes the next ``q_i`` positions of each stream;
* inside the window the components are merged by the planner's jittered stratified keys: item ``j`` of
  component ``i`` gets ``((j << 32) + u) // q_i``, ``u`` the high 32 bits of Philox draw number
  ``m 2^32 + t`` (``t`` its place in the window's component-by-component list) under the mixture seed;
  a stable sort orders them (ties by component), so each component's positions stay in stream order.

* no stream is read for more than ``MAX_EPOCHS`` (2^16) epochs: a total far past what the components
  hold is refused when the blend is made, before anything sized by the total is allocated.

The quotas change only when a capped component runs out, so a mixture is at most ``2 D + 1`` segments
(``D`` components), computed when the blend is made. Under a schedule (:mod:`.schedule`) window ``m``'s
weights are the schedule's at its first place ``m W``; each change point adds at most ``2 D + 1`` segments
more and each window of a ramp is a segment of its own. A component's stream position is always the sum of
its earlier quotas, so a change of weights repeats or skips no position of any stream.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from math import isfinite, lcm

import numpy as np

from .... import checks
from ....epoch import philox_key_words
from ....hashing import hash_canonical
from ....philox import philox_draws
from ..buckets import config_error
from ..builder import MAX_EPOCHS
from ..config import MAX_WINDOW
from .schedule import MAX_RAMP_WINDOWS, MixSchedule

#: Most components one mixture may have.
MAX_COMPONENTS = 1 << 12
#: Most epochs a component's cap may be.
MAX_CAP = 1 << 32
#: Philox domain of the mixture's interleaving jitter ("MIX!"; the planner's is "PLAN").
MIXTURE_DOMAIN = 0x4D495821
#: What a mixture's weights count: samples (the largest-remainder quotas), tokens or loss-bearing tokens.
UNITS = ("samples", "tokens", "loss_tokens")
#: Most windows a token-unit blend may have (each may be a segment of its own, its quotas computed from its streams'
#: lengths when the mixture is defined or opened).
MAX_TOKEN_WINDOWS = 1 << 18
#: ``lengths(i, start, count)``: the lengths (in the weights' unit) of stream ``i``'s positions ``start ..``.
StreamLengths = Callable[[int, int, int], np.ndarray]


@dataclass(frozen=True)
class Segment:
    """``windows`` identical windows from window ``first``: ``size`` positions, ``quotas[i]`` from component
    ``i``, whose stream starts at ``starts[i]`` in the segment's first window."""

    first: int
    windows: int
    size: int
    quotas: tuple[int, ...]
    starts: tuple[int, ...]


def allocate(size: int, weights: list, remaining: list[int | None]) -> list[int]:
    """The quotas of a window of ``size`` positions (module docstring): ``floor(size w_i / S)`` for the
    live components (weight > 0 and ``remaining`` not 0; None: no cap), the ``size - sum`` positions left
    going one each to the largest remainders (ties to the lower index); a capped component given more than it
    has left gets what it has left and is taken out, and the rest is allocated again among the others.
    ``weights``: exact rationals or integers, computed on integers over their common denominator."""
    ints = integer_weights(weights)
    quotas = [0] * len(ints)
    active = [i for i, left in enumerate(remaining) if (left is None or left > 0) and ints[i] > 0]
    while active and size:
        total = sum(ints[i] for i in active)
        share = {i: size * ints[i] // total for i in active}
        spare = size - sum(share.values())
        for i in sorted(active, key=lambda i: (-(size * ints[i] % total), i))[:spare]:
            share[i] += 1
        over = [i for i in active if (left := remaining[i]) is not None and share[i] > left]
        if not over:
            for i in active:
                quotas[i] = share[i]
            return quotas
        for i in over:
            quotas[i] = remaining[i]  # type: ignore[assignment]
            size -= quotas[i]
            active.remove(i)
    return quotas


def integer_weights(weights: list) -> list[int]:
    """Exact rational (or integer) weights as integers in the same ratio: over their common denominator."""
    scale = lcm(*(w.denominator for w in weights))
    return [w.numerator * (scale // w.denominator) for w in weights]


def token_quotas(size: int, weights: list, remaining: list[int | None], starts: list[int],
                 lengths: StreamLengths, hint: Sequence[int] | None = None) -> list[int]:
    """The quotas of a window of ``size`` places whose weights count tokens (module docstring): the greedy that
    gives each place to the live component with the smallest ``(T_i + l_i) / w_i`` (``T_i`` its tokens taken in
    the window, ``l_i`` the length of its next stream sample; ties to the lower index). Each component's keys
    ``prefix_i(k) / w_i`` (its running token count after ``k + 1`` samples) only grow, so the greedy is the merge of
    every component's keys (a stable sort, components in index order) and its first ``size`` keys are the window's;
    compared exactly, on int64 when the products fit and on Python integers otherwise.

    ``hint``: the last window's quotas. Each stream's lengths are read for its hint and an eighth more (at least 64)
    instead of ``size``; a component that takes every length read, with more left, is read twice as far and the
    merge done again (its unread keys are larger than its read ones, so one that did not take them all is done)."""
    ints = integer_weights(weights)
    live = [i for i, left in enumerate(remaining) if (left is None or left > 0) and ints[i] > 0]
    scale = lcm(*(ints[i] for i in live))
    ends = {i: size if (left := remaining[i]) is None else min(size, left) for i in live}
    read = {i: ends[i] if hint is None else min(ends[i], hint[i] + max(64, hint[i] // 8)) for i in live}
    held = {i: np.zeros(0, dtype=np.int64) for i in live}
    while True:
        for i in live:
            if held[i].shape[0] < read[i]:
                more = np.asarray(lengths(i, starts[i] + held[i].shape[0], read[i] - held[i].shape[0]), dtype=np.int64)
                held[i] = np.concatenate((held[i], more))
        prefixes = [np.cumsum(held[i]) for i in live]
        top = max(int(p[-1]) * (scale // ints[i]) for i, p in zip(live, prefixes))
        if top < 1 << 62:
            keys = np.concatenate([p * (scale // ints[i]) for i, p in zip(live, prefixes)])
        else:  # weights whose common denominator is large (floats taken exactly): Python integers, exact, slower
            keys = np.concatenate([np.array([int(v) * (scale // ints[i]) for v in p.tolist()], dtype=object)
                                   for i, p in zip(live, prefixes)])
        owner = np.repeat(np.arange(len(live)), [p.shape[0] for p in prefixes])
        taken = np.bincount(owner[np.argsort(keys, kind="stable")[:size]], minlength=len(live)).tolist()
        short = [i for i, q in zip(live, taken) if q == read[i] < ends[i]]
        if not short:
            break
        for i in short:
            read[i] = min(ends[i], 2 * read[i])
    quotas = [0] * len(remaining)
    for i, q in zip(live, taken):
        quotas[i] = q
    return quotas


def schedule(window: int, num_samples: int | None, weights: list,
             supplies: list[int | None], plan: MixSchedule | None = None,
             lengths: StreamLengths | None = None) -> tuple[tuple[Segment, ...], int]:
    """The segments of identical windows (module docstring) and the mixture's total number of places;
    ``supplies[i]``: the positions component ``i``'s stream holds (None: no end); ``plan``: the weights of each
    window instead of ``weights`` (:mod:`.schedule`); ``lengths``: the weights count tokens (each window its own
    segment, :func:`token_quotas`). A short window is the last."""
    remaining = list(supplies)
    starts = [0] * len(supplies)
    segments: list[Segment] = []
    m = done = 0
    while True:
        if plan is not None:
            weights = list(plan.window_ratios(m, window))
        live = [i for i, left in enumerate(remaining) if (left is None or left > 0) and weights[i] > 0]
        if not live:
            break
        supply = None if any(remaining[i] is None for i in live) else sum(remaining[i] for i in live)  # type: ignore
        size = window
        if num_samples is not None:
            size = min(size, num_samples - done)
        if supply is not None:
            size = min(size, supply)
        if size <= 0:
            break
        if lengths is not None:
            quotas = token_quotas(size, weights, remaining, starts, lengths, segments[-1].quotas if segments else None)
        else:
            quotas = allocate(size, weights, remaining)
        count = 1
        if size == window and lengths is None:
            bounds = [remaining[i] // quotas[i] for i in live  # type: ignore[operator]
                      if remaining[i] is not None and quotas[i]]
            if num_samples is not None:
                bounds.append((num_samples - done) // window)
            change = None if plan is None else plan.next_change(m, window)
            if change is not None:
                bounds.append(change - m)
            count = max(min(bounds), 1) if bounds else 1
        last = segments[-1] if segments else None
        if lengths is not None and last is not None and (last.size, last.quotas) == (size, tuple(quotas)):
            segments[-1] = Segment(last.first, last.windows + 1, size, last.quotas, last.starts)  # equal windows
        else:
            segments.append(Segment(m, count, size, tuple(quotas), tuple(starts)))
        for i, q in enumerate(quotas):
            starts[i] += count * q
            if remaining[i] is not None:
                remaining[i] -= count * q  # type: ignore[operator]
        m += count
        done += count * size
        if size < window:
            break
    if not segments:
        raise config_error("the mixture holds no samples")
    return tuple(segments), done


def interleave_order(component: np.ndarray, quotas: np.ndarray, seed: int, m: int) -> np.ndarray:
    """The merge of window ``m``'s positions given component by component (module docstring)."""
    total = int(component.shape[0])
    first = np.concatenate(([0], np.cumsum(quotas)[:-1])).astype(np.int64)
    j = (np.arange(total, dtype=np.int64) - first[component]).astype(np.uint64)
    key, w2, w3 = mixture_key_words(seed)
    r0, _ = philox_draws(np.arange(total, dtype=np.uint64) + np.uint64(m << 32), key, w2, w3, MIXTURE_DOMAIN)
    keys = ((j << np.uint64(32)) + (r0 >> np.uint64(32))) // quotas[component]
    return np.argsort(keys, kind="stable")


def mixture_key_words(seed: int) -> tuple[tuple[int, int], int, int]:
    """Philox key and counter words of a mixture's interleaving, from the mixture seed."""
    return philox_key_words(hash_canonical(["umlos_mixture_interleave_v1", int(seed)])[:16])


@dataclass(frozen=True)
class Part:
    """What the mixture needs of one component, whatever its stream holds: its ``weight`` (> 0), how many
    positions one epoch of its stream holds (``per_epoch``, >= 1), an optional cap on its epochs and a ``name``."""

    weight: float
    per_epoch: int
    max_epochs: int | None = None
    name: str = ""


def check_weight(value, name: str) -> Fraction:
    """A component's weight as an exact rational: a finite number > 0 (a bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not isfinite(value) or value <= 0:
        raise config_error(f"{name} must be a finite number > 0, got {value!r}")
    return Fraction(value)


def _check_parts(parts: tuple[Part, ...], window: int, num_samples: int | None, seed: int) -> None:
    """The rules every mixture's components keep, whatever they hold (one place for all of them)."""
    checks.integer(window, "window", 1, MAX_WINDOW, fail=config_error)
    checks.integer(seed, "seed", 0, (1 << 64) - 1, fail=config_error)
    if not 1 <= len(parts) <= MAX_COMPONENTS:
        raise config_error(f"a mixture takes 1 to {MAX_COMPONENTS} components, got {len(parts)}")
    names: set[str] = set()
    for i, part in enumerate(parts):
        check_weight(part.weight, f"component {i} weight")
        if part.max_epochs is not None:
            checks.integer(part.max_epochs, f"component {i} max_epochs", 1, MAX_CAP, fail=config_error)
        checks.integer(part.per_epoch, f"component {i} ({part.name!r}) positions per epoch", 1, None,
                       fail=config_error, message=checks.AT_LEAST)
        if part.name in names:
            raise config_error(f"component names must differ; {part.name!r} is given twice")
        names.add(part.name)
    if num_samples is None:
        if any(part.max_epochs is None for part in parts):
            raise config_error("a mixture without num_samples needs max_epochs on every component")
    else:
        checks.integer(num_samples, "num_samples", 1, None, fail=config_error, message=checks.AT_LEAST)


def _check_plan(plan, components: int, window: int, num_samples: int | None) -> None:
    """A schedule fits the mixture: a :class:`~.schedule.MixSchedule` of one weight per component whose ramps cover
    at most :data:`~.schedule.MAX_RAMP_WINDOWS` windows (each is a segment of its own)."""
    if not isinstance(plan, MixSchedule) or plan.width != components:
        raise config_error(f"a mixture's schedule must be a MixSchedule of {components} weights per piece")
    ramps = plan.ramp_windows(window, num_samples)
    if ramps > MAX_RAMP_WINDOWS:
        raise config_error(f"the schedule's ramps cover {ramps} windows of {window}; at most {MAX_RAMP_WINDOWS} "
                           "(each is a segment of its own: a larger window or shorter ramps)")


def _check_token_windows(window: int, num_samples: int | None, supplies: tuple[int | None, ...]) -> None:
    """A token-unit blend's windows are segments of their own: at most :data:`MAX_TOKEN_WINDOWS` of them, refused
    before any quota is computed (the bound is on ``num_samples``, else on what the capped streams hold)."""
    places = num_samples if num_samples is not None else sum(s for s in supplies if s is not None)
    windows = -(-places // window)
    if windows > MAX_TOKEN_WINDOWS:
        raise config_error(f"a mixture whose weights count tokens may have at most {MAX_TOKEN_WINDOWS} windows "
                           f"(each may be a segment of its own); {places} samples in windows of {window} are "
                           f"{windows}: a larger window")


@dataclass(frozen=True)
class Blend:
    """The one weighted mixture (module docstring), generic over what its components hold: ``parts`` (each
    component's weight, positions per epoch, cap and name), ``window`` (W), ``num_samples`` (None: until every
    stream runs out), the mixture ``seed`` and an optional schedule ``plan`` (:mod:`.schedule`: the weights of
    each window, instead of the parts' own). A sample mixture (:mod:`.mixture`) and a mixture of pretraining
    sequences (:mod:`.sequence_mixture`) are a blend plus what a stream position means for them. ``lengths``: each
    stream's lengths in the unit the weights count (None: they count samples; module docstring, token quotas)."""

    parts: tuple[Part, ...]
    window: int
    num_samples: int | None
    seed: int
    plan: MixSchedule | None = None
    lengths: StreamLengths | None = field(default=None, repr=False, compare=False)
    segments: tuple[Segment, ...] = field(init=False, repr=False, compare=False)
    total: int = field(init=False, repr=False, compare=False)
    _firsts: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _merged: list = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts = tuple(self.parts)
        _check_parts(parts, self.window, self.num_samples, self.seed)
        if self.plan is not None:
            _check_plan(self.plan, len(parts), self.window, self.num_samples)
        if self.lengths is not None:
            _check_token_windows(self.window, self.num_samples, self.supplies)
        object.__setattr__(self, "parts", parts)
        segments, total = schedule(self.window, self.num_samples, list(self.weights), list(self.supplies), self.plan,
                                   self.lengths)
        object.__setattr__(self, "segments", segments)
        object.__setattr__(self, "total", total)
        object.__setattr__(self, "_firsts", tuple(s.first for s in segments))
        object.__setattr__(self, "_merged", [])
        for part, epochs in zip(parts, self.epochs_read()):  # before anything sized by the total is allocated
            if epochs > MAX_EPOCHS:
                raise config_error(f"component {part.name!r} would be read for {epochs} epochs; at most {MAX_EPOCHS} "
                                   "(cap it, lower its weight or the mixture's samples)")

    @property
    def weights(self) -> tuple[Fraction, ...]:
        return tuple(Fraction(part.weight) for part in self.parts)

    @property
    def supplies(self) -> tuple[int | None, ...]:
        """Positions each stream holds (None: no end, an uncapped component)."""
        return tuple(None if p.max_epochs is None else p.max_epochs * p.per_epoch for p in self.parts)

    @property
    def num_windows(self) -> int:
        last = self.segments[-1]
        return last.first + last.windows

    def segment(self, m: int) -> Segment:
        """The segment holding window ``m``."""
        checks.integer(m, "window", 0, self.num_windows - 1, fail=config_error)
        return self.segments[bisect.bisect_right(self._firsts, m) - 1]

    def quotas(self, m: int) -> tuple[int, ...]:
        return self.segment(m).quotas

    def stream_starts(self, m: int) -> tuple[int, ...]:
        """Where each component's stream stands when window ``m`` starts."""
        s = self.segment(m)
        return tuple(start + (m - s.first) * q for start, q in zip(s.starts, s.quotas))

    def stream_ends(self) -> tuple[int, ...]:
        """How many positions of each stream the whole mixture takes."""
        last = self.segments[-1]
        return tuple(start + last.windows * q for start, q in zip(last.starts, last.quotas))

    def epochs_read(self) -> tuple[int, ...]:
        """How many epochs of each stream the whole mixture reads (at least one)."""
        return tuple(max(1, -(-used // part.per_epoch)) for used, part in zip(self.stream_ends(), self.parts))

    def order(self, m: int) -> tuple[np.ndarray, np.ndarray]:
        """Window ``m``'s places component by component (``int32``: component ``i`` ``q_i`` times, in order)
        and the permutation that merges them (:func:`interleave_order`)."""
        quotas = self.quotas(m)
        component = np.repeat(np.arange(len(quotas), dtype=np.int32), quotas)
        return component, interleave_order(component, np.asarray(quotas, dtype=np.uint64), self.seed, m)

    def merge(self, m: int) -> tuple[np.ndarray, np.ndarray]:
        """Window ``m``'s places in order: the component (``int32``) and its stream position (``int64``) of each."""
        component, order = self.order(m)
        quotas = np.asarray(self.quotas(m), dtype=np.int64)
        first = np.concatenate(([0], np.cumsum(quotas)[:-1])).astype(np.int64)
        starts = np.asarray(self.stream_starts(m), dtype=np.int64)
        positions = np.arange(component.shape[0], dtype=np.int64) - first[component] + starts[component]
        return component[order], positions[order]

    def merged(self, m: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`merge`, the last window merged kept (random access within a window merges it once)."""
        if not self._merged or self._merged[0] != m:
            self._merged[:] = (m, *self.merge(m))
        return self._merged[1], self._merged[2]

    def locate(self, k: int, fail=config_error) -> tuple[int, int, int]:
        """``(component, its epoch, its position in that epoch)`` at place ``k`` of the mixture: one window merged
        (``fail``: the error a place out of range raises)."""
        checks.integer(k, "sample", 0, self.total - 1, fail=fail)
        component, position = self.merged(k // self.window)
        i, t = int(component[k % self.window]), int(position[k % self.window])
        epoch, j = divmod(t, self.parts[i].per_epoch)
        return i, epoch, j
