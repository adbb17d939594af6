"""A weighted mixture of several length sources, exact per window: which sample each position holds.

What goes in: a :class:`~.window.WindowDefinition`-style definition of a mixture
(:class:`MixtureDefinition`): the batching config (its order and seed), a window
size ``W``, an optional total number of samples, and components, each a
:class:`~.sources.LengthSource` with its own weight, seed (its own engine order)
and optional epoch cap. What comes out: for window ``m`` of the mixture, the
component and row of each of its positions (:meth:`MixtureDefinition.window`),
and the sample at any position (:meth:`MixtureDefinition.sample`), each by
computing that one window.

The rules (docs/batching.md, "Weighted mixtures", normative):

* Component ``i``'s **stream** is its epochs one after another, each in the
  engine's order for that epoch under the component's seed (the order of a
  windowed plan with ``seed = seed_i``): stream position ``t`` is row
  ``order_i(t // N_i)[t % N_i]``. Upsampling repeats the dataset in a new order
  each epoch; a cap of ``c_i`` epochs ends the stream after ``c_i N_i`` positions.
* Window ``m`` holds ``size_m = min(W, samples left, supply left)`` positions;
  its **quotas** ``q_i`` are :func:`allocate`'s: the largest-remainder rule over
  the live components' weights (exact rationals), where a capped component whose
  quota exceeds what its stream has left gives what is left and the rest is
  re-allocated among the others. Window ``m`` takes the next ``q_i`` positions of
  each stream, so every window holds each component exactly at its quota.
* Inside the window the components are merged by the planner's jittered
  stratified keys: item ``j`` of component ``i`` gets ``((j << 32) + u) // q_i``,
  ``u`` the high 32 bits of Philox draw number ``m 2^32 + t`` (``t`` its place in
  the window's component-by-component list) under the mixture seed; a stable sort
  orders them (ties by component). Every prefix of a window thus holds each
  component in proportion, within one sample.

Under a schedule (:mod:`.schedule`, docs/batching.md "Mixture schedules")
window ``m``'s weights are the schedule's at its first position. With ``unit``
``"tokens"`` or ``"loss_tokens"`` (docs/batching.md, "Token quotas") the weights
count each sample's tokens or loss tokens: the blend shares each window's places
by its greedy over the streams' counts, window by window (windows in a row with
equal quotas share a segment).
Otherwise the quotas change only when a capped component runs out (or the schedule changes), so the whole mixture is
a table of at most ``2 D + 1`` segments of identical windows (``D`` components),
computed when the definition is made: window ``m``'s quotas and stream starts are
O(1) from it, and nothing else is stored. The quotas, the segments and the merge are
:mod:`.blend`'s, which mixtures of pretraining sequences (:mod:`.sequence_mixture`) share.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from fractions import Fraction

import numpy as np

from .... import checks
from ....hashing import hash_canonical
from ....nextbatch import MODE_SEQUENTIAL
from ..buckets import config_error
from ..config import BatchingConfig
from ..planner import engine_order, order_slice, plan_manifest
from .blend import (MAX_CAP, MAX_COMPONENTS, MIXTURE_DOMAIN, UNITS, Blend, Part, Segment, allocate,
                    interleave_order, mixture_key_words)
from ...lengths.sources import LengthSource
from ...tokens.loss_counts import loss_counter
from .schedule import MixSchedule
from .window import DEFAULT_WINDOW, check_windowed_config


@dataclass(frozen=True)
class Component:
    """One dataset of a mixture: its lengths, weight (> 0), seed (its own engine order), an optional cap
    on its epochs and a name (what sample ids show: ``name:row``)."""

    source: LengthSource
    weight: float
    seed: int = 0
    max_epochs: int | None = None
    name: str = ""

    def to_dict(self) -> dict:
        exact = Fraction(self.weight)
        return {"name": self.name, "weight": [exact.numerator, exact.denominator], "seed": self.seed,
                "max_epochs": self.max_epochs, "lengths": self.source.binding()}


@dataclass(frozen=True)
class MixedWindow:
    """One window of a mixture: per position, its component, the component's epoch and its row."""

    component: np.ndarray  # int32 [size]
    epoch: np.ndarray  # int64 [size]
    row: np.ndarray  # uint64 [size]

    def lengths(self, sources, release: bool = False) -> np.ndarray:
        """The lengths of the window's samples (uint32, in position order); ``release``: drop the pages each
        source mapped for them afterwards (:meth:`~.sources.LengthSource.release`)."""
        out = np.empty(self.row.shape[0], dtype=np.uint32)
        for i, source in enumerate(sources):
            mask = self.component == i
            if mask.any():
                out[mask] = source.take(self.row[mask])
                if release:
                    source.release()
        return out


def unit_counts(components, unit: str) -> list:
    """Per component, a function of rows giving each row's count in ``unit``: its length (``"tokens"``) or its
    loss-mask tokens (``"loss_tokens"``, :func:`~...tokens.loss_counts.loss_counter`: TOKEN_STORE_NOT_FOUND for a
    component read from lengths alone)."""
    if unit == "tokens":
        return [c.source.take for c in components]
    return [loss_counter(c.source, c.name) for c in components]


@dataclass(frozen=True)
class MixtureDefinition:
    """A mixture (module docstring): ``config`` (order, block size, the mixture seed), ``components``,
    ``window`` (W), ``num_samples`` (the total; None: until every component, all capped, runs out) and an
    optional ``schedule`` (:class:`~.schedule.MixSchedule`: each window's weights instead of the components');
    ``unit``: what the weights count, ``"samples"`` (the default), ``"tokens"`` or ``"loss_tokens"`` (docs/batching.md,
    "Token quotas": each window's places shared so each component's tokens are in proportion)."""

    config: BatchingConfig
    components: tuple[Component, ...]
    window: int = DEFAULT_WINDOW
    num_samples: int | None = None
    schedule: MixSchedule | None = None
    unit: str = "samples"
    blend: Blend = field(init=False, repr=False, compare=False)
    _orders: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_windowed_config(self.config)
        components = tuple(self.components)
        if not 1 <= len(components) <= MAX_COMPONENTS:
            raise config_error(f"a mixture takes 1 to {MAX_COMPONENTS} components, got {len(components)}")
        for i, c in enumerate(components):
            if not isinstance(c, Component) or not isinstance(c.source, LengthSource):
                raise config_error(f"component {i} must be a Component over a LengthSource")
            checks.integer(c.seed, f"component {i} seed", 0, (1 << 64) - 1, fail=config_error)
            if c.source.count < 1:
                raise config_error(f"component {i} has no samples")
        if self.unit not in UNITS:
            raise config_error(f"a mixture's unit must be one of {', '.join(UNITS)}, got {str(self.unit)[:64]!r}")
        object.__setattr__(self, "components", components)
        orders = []
        for c in components:
            own = replace(self.config, seed=c.seed)
            orders.append((own, plan_manifest(own, c.source.count)))
        object.__setattr__(self, "_orders", tuple(orders))
        counts = None if self.unit == "samples" else unit_counts(components, self.unit)
        lengths = None if counts is None else partial(self._stream_counts, counts)
        parts = tuple(Part(c.weight, c.source.count, c.max_epochs, c.name) for c in components)
        object.__setattr__(self, "blend", Blend(parts, self.window, self.num_samples, self.config.seed, self.schedule,
                                                lengths))

    def _stream_counts(self, counts, i: int, start: int, count: int) -> np.ndarray:
        """Stream ``i``'s positions ``start .. start + count - 1`` counted in the mixture's unit (what the blend's
        token quotas read): ``counts[i]`` takes rows."""
        return counts[i](self.stream_rows(i, start, count)[1])

    # ------------------------------------------------------------------ shape
    @property
    def sources(self) -> tuple[LengthSource, ...]:
        return tuple(c.source for c in self.components)

    @property
    def starts(self) -> np.ndarray:
        """``int64 [D + 1]``: where each component's rows start when the components are read one after another
        (the dataset a mixed plan's microbatch rows index: component ``i``'s row ``r`` is ``starts[i] + r``)."""
        return np.cumsum([0] + [c.source.count for c in self.components], dtype=np.int64)

    @property
    def local_reads(self) -> bool:
        """Whether a window's rows of each component lie close together, as
        :attr:`~.window.WindowDefinition.local_reads` says for a windowed plan (a component's ``q_i``
        consecutive stream positions): then the pages a window mapped are released after it."""
        return self.config.stage == MODE_SEQUENTIAL or self.config.order != "feistel"

    @property
    def segments(self) -> tuple[Segment, ...]:
        """The segments of identical windows (:class:`~.blend.Blend`)."""
        return self.blend.segments

    @property
    def total(self) -> int:
        return self.blend.total

    @property
    def num_windows(self) -> int:
        return self.blend.num_windows

    def segment(self, m: int) -> Segment:
        """The segment holding window ``m``."""
        return self.blend.segment(m)

    def quotas(self, m: int) -> tuple[int, ...]:
        return self.blend.quotas(m)

    def stream_starts(self, m: int) -> tuple[int, ...]:
        """Where each component's stream stands when window ``m`` starts."""
        return self.blend.stream_starts(m)

    def to_dict(self) -> dict:
        """What a mixture's fingerprint records about the definition (the config is the caller's): each
        component with the engine's ``sampling_mode``, ``sampler_config_hash`` and ``manifest_hash`` of its
        order (``order``), so an engine that orders differently is told apart, and the schedule only when there
        is one, and the unit only when it is not samples (a mixture of fixed weights in samples hashes as it did before
        schedules and token quotas)."""
        schedule = {} if self.schedule is None else {"schedule": self.schedule.to_dict()}  # only when scheduled
        unit = {} if self.unit == "samples" else {"unit": self.unit}  # only when the weights count tokens
        return {"window": self.window, "num_samples": self.num_samples, "total": self.total,
                "components": [{**c.to_dict(), "order": self.engine(i)} for i, c in enumerate(self.components)],
                **schedule, **unit}

    def engine(self, i: int) -> dict:
        """The engine's metadata of component ``i``'s order (as a windowed plan records its own)."""
        return engine_order(*self._orders[i])

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the definition: config, window, total, every component's weight, seed, cap and lengths."""
        pack = [] if self.config.pack is None else [self.config.pack.to_dict()]  # only when it packs
        return hash_canonical(["umlos_mixture_v1", self.config.to_dict(), self.to_dict(), *pack]).hex()

    # ------------------------------------------------------------------ samples
    def stream_rows(self, i: int, start: int, count: int, backend: str = "auto") -> tuple[np.ndarray, np.ndarray]:
        """Component ``i``'s stream positions ``start .. start + count - 1``: (epoch, row) each."""
        n = self.components[i].source.count
        config, manifest = self._orders[i]
        epochs = np.empty(count, dtype=np.int64)
        rows = np.empty(count, dtype=np.uint64)
        done = 0
        while done < count:
            epoch, position = divmod(start + done, n)
            take = min(count - done, n - position)
            rows[done:done + take] = order_slice(config, manifest, n, epoch, position, take, backend)
            epochs[done:done + take] = epoch
            done += take
        return epochs, rows

    def window_of(self, m: int, backend: str = "auto") -> MixedWindow:
        """Window ``m``'s positions: component, component epoch and row of each (module docstring); each
        component's ``q_i`` stream positions are read as one run of its order."""
        quotas = self.quotas(m)
        starts = self.stream_starts(m)
        size = sum(quotas)
        component, order = self.blend.order(m)
        epochs = np.empty(size, dtype=np.int64)
        rows = np.empty(size, dtype=np.uint64)
        at = 0
        for i, (start, q) in enumerate(zip(starts, quotas)):
            if q:
                epochs[at:at + q], rows[at:at + q] = self.stream_rows(i, start, q, backend)
                at += q
        return MixedWindow(component[order], epochs[order], rows[order])

    def sample(self, k: int, backend: str = "auto") -> tuple[int, int, int]:
        """``(component, its epoch, row)`` at position ``k`` of the mixture: the blend locates it (one window
        merged) and the component's order gives its row."""
        i, epoch, j = self.blend.locate(k)
        return i, epoch, int(self.stream_rows(i, epoch * self.components[i].source.count + j, 1, backend)[1][0])


__all__ = ["MAX_CAP", "MAX_COMPONENTS", "MIXTURE_DOMAIN", "Blend", "Component", "MixedWindow", "MixtureDefinition",
           "Segment", "allocate", "interleave_order", "mixture_key_words"]
