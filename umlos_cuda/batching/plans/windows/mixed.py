"""Token-budget microbatches of a weighted mixture, planned a mixed window at a time.

What goes in: a :class:`~.mixture.MixtureDefinition`. What comes out: a
:class:`MixedPlan`: the per-window index (built in one streaming pass, as a
windowed plan's, :mod:`.index`), any microbatch by its global index (one mixed
window planned), every microbatch from a cursor on, and the fingerprint.

Window ``m`` of the mixture (its positions in :meth:`~.mixture.MixtureDefinition.window_of`'s
order) is planned exactly as a windowed plan plans a window of the engine's order
(docs/batching.md, "Windowed plans": buckets, cuts per bucket in position order,
the jittered interleaving with draws ``m 2^32 + j``, edge rule ``flush``), and a packed
config (``config.pack``) packs it exactly as :mod:`.packed` packs a window (rows close with
the mixed window; the index's ``padded_tokens`` are rows times ``max_length``), the
interleaving keyed by the manifest of :func:`~..planner.plan_manifest` over the
mixture's total. A microbatch's ``rows`` index the components read one after another
(component ``i``'s row ``r`` is ``starts[i] + r``, :attr:`~.mixture.MixtureDefinition.starts`), the
dataset a batch sampler hands out and :meth:`MixedPlan.dataset` opens; its sample ids are ``name:row``, the
component's name and its row. (The plan's arrays hold mixture positions, ``m W + local``.)

The fingerprint is SHA-256 of the canonical CBOR of ``["umlos_mixed_plan_v1",
header, index_digest]``: ``header`` holds the format, the config, the mixture's
definition (:meth:`~.mixture.MixtureDefinition.to_dict`: window, num_samples,
total, and each component's name, exact weight, seed, cap and lengths binding)
and the count names, and ``pack_config`` only when the plan packs (unpacked mixed plans hash
as before); ``index_digest`` is :func:`~.plan.index_digest` of epoch 0
(a mixture is one pass).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from .... import checks, errors
from ....errors import UmlosError
from ....hashing import hash_canonical
from ..plan import MicrobatchSpec, RowPart, plan_error
from ..planner import EpochArrays, index_dtype, plan_manifest, plan_ordered
from .index import locate
from .mixture import MixedWindow, MixtureDefinition
from .packed import microbatch_packs
from .plan import index_digest
from .window import COUNT_FIELDS, count_lengths
from ...sources.listed import SourceList

#: The ``format`` of a mixed plan's header.
MIXED_FORMAT = "umlos_cuda.mixed_plan/1"


@dataclass(frozen=True)
class MixedWindowPlan:
    """One mixed window: its positions (:class:`~.mixture.MixedWindow`) and its microbatches, whose
    ``samples`` are mixture positions."""

    mixed: MixedWindow
    arrays: EpochArrays


def build_mixed_index(definition: MixtureDefinition, *, backend: str = "auto",
                      progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """``int64 [1, K + 1, C]``: the running counts (:data:`~.window.COUNT_FIELDS`) before each mixed window."""
    k = definition.num_windows
    index = np.zeros((1, k + 1, len(COUNT_FIELDS)), dtype=np.int64)
    sources = definition.sources
    for m in range(k):
        lengths = definition.window_of(m, backend).lengths(sources, definition.local_reads)
        index[0, m + 1] = count_lengths(lengths, definition.config).as_tuple()
        if progress is not None:
            progress(m + 1, k)
    np.cumsum(index[0], axis=0, out=index[0])
    return index


class MixedPlan:
    """A mixture's token-budget plan (module docstring); :meth:`build` makes the index in one pass."""

    def __init__(self, definition: MixtureDefinition, index: np.ndarray, *, backend: str = "auto") -> None:
        expected = (1, definition.num_windows + 1, len(COUNT_FIELDS))
        if tuple(index.shape) != expected:
            raise plan_error(errors.PLAN_NOT_REPRODUCIBLE,
                             f"a mixed plan's index has shape {expected}, got {tuple(index.shape)}")
        self.definition = definition
        self.index = index
        self.backend = backend
        self.manifest = plan_manifest(definition.config, definition.total)
        self._cached: tuple[int, MixedWindowPlan] | None = None

    @classmethod
    def build(cls, definition: MixtureDefinition, *, backend: str = "auto",
              progress: Callable[[int, int], None] | None = None) -> MixedPlan:
        return cls(definition, build_mixed_index(definition, backend=backend, progress=progress), backend=backend)

    # ------------------------------------------------------------------ identity
    def header(self) -> dict:
        pack = self.definition.config.pack  # ``pack_config`` only in a packed plan, as a windowed plan's
        return {"format": MIXED_FORMAT, "config": self.definition.config.to_dict(),
                **({} if pack is None else {"pack_config": pack.to_dict()}),
                "mixture": self.definition.to_dict(), "count_fields": list(COUNT_FIELDS)}

    @property
    def fingerprint(self) -> str:
        return hash_canonical(["umlos_mixed_plan_v1", self.header(), index_digest(0, self.index[0])]).hex()

    @property
    def num_microbatches(self) -> int:
        return int(self.index[0, -1, 0])

    @property
    def num_epochs(self) -> int:
        """1: a mixture is one pass (its components' epochs are inside it), the resume rule's one epoch."""
        return 1

    def epoch_microbatches(self, epoch: int) -> int:
        """The mixture's microbatches; ``epoch`` must be 0 (:class:`~.resume.ResumablePlan`)."""
        _epoch(epoch)
        return self.num_microbatches

    def epoch_indices(self, epoch: int) -> range:
        """The global indices of the microbatches of the one epoch 0, in order."""
        _epoch(epoch)
        return range(self.num_microbatches)

    @property
    def source_fingerprint(self) -> str:
        """The plan's own fingerprint (a mixed plan is never a shard)."""
        return self.fingerprint

    def row_parts(self) -> tuple[RowPart, ...]:
        """The components, in order, each a dataset whose rows the plan's rows index after the earlier ones'
        (:class:`~..plan.RowPart`: its name, the lengths it binds, its tokenizer)."""
        return tuple(RowPart(c.name, c.source.binding(), c.source, getattr(c.source, "tokenizer_hash", None))
                     for c in self.definition.components)

    def counts(self) -> dict:
        return dict(zip(COUNT_FIELDS, (int(v) for v in self.index[0, -1])))

    @property
    def config(self):
        """The batching config (buckets, budget, packing), as every plan of rows has one."""
        return self.definition.config

    def dataset(self) -> SourceList:
        """The dataset the microbatches' rows index: the components' token sources one after another (what a
        ``TokenDataset`` over this plan reads); TOKEN_STORE_NOT_FOUND naming a component read from lengths only."""
        for component in self.definition.components:
            if not callable(getattr(component.source, "arrays", None)):
                raise UmlosError(errors.TOKEN_STORE_NOT_FOUND, f"component {component.name!r} was planned from "
                                 f"{component.source.origin or 'lengths in memory'}, which holds no tokens: read the "
                                 "plan's rows from every component's token source, in component order "
                                 "(TokenDataset([STORE, ...]))",
                                 operator=errors.BATCHING_OPERATOR)
        return SourceList(list(self.definition.sources))

    # ------------------------------------------------------------------ microbatches
    def window(self, m: int) -> MixedWindowPlan:
        """Mixed window ``m`` and its microbatches (the last one planned is kept)."""
        checks.integer(m, "window", 0, self.definition.num_windows - 1, fail=_cursor)
        if self._cached is None or self._cached[0] != m:
            mixed = self.definition.window_of(m, self.backend)
            lengths = mixed.lengths(self.definition.sources, self.definition.local_reads)
            config = self.definition.config
            buckets = config.bucket_spec.bucket_ids(lengths)
            n = int(lengths.shape[0])
            local = np.arange(n, dtype=index_dtype(n))
            arrays = plan_ordered(lengths, local, buckets, config, self.manifest, 0, draw_base=m << 32)
            base = np.uint64(m * self.definition.window)
            arrays = replace(arrays, samples=arrays.samples.astype(np.uint64) + base,
                             skipped=arrays.skipped.astype(np.uint64) + base)
            self._cached = (m, MixedWindowPlan(mixed, arrays))
        return self._cached[1]

    def microbatch(self, j: int) -> MicrobatchSpec:
        """Microbatch ``j`` of the mixture: one mixed window planned."""
        checks.integer(j, "microbatch_index", 0, self.num_microbatches - 1, fail=_cursor)
        m, local = locate(self.index, 0, j)
        return self._spec(self.window(m), m, local, j)

    def microbatch_at(self, epoch: int, j: int) -> MicrobatchSpec:
        """Microbatch ``j`` of the one epoch 0, so :class:`~.resume.WindowedRankReader` resumes a mixture."""
        _epoch(epoch)
        return self.microbatch(j)

    def iter_from(self, microbatch_index: int = 0) -> Iterator[tuple[int, MicrobatchSpec]]:
        """``(index, microbatch)`` from ``microbatch_index`` on; resuming costs one window."""
        checks.integer(microbatch_index, "microbatch_index", 0, self.num_microbatches, fail=_cursor)
        if microbatch_index == self.num_microbatches:
            return
        m, local = locate(self.index, 0, microbatch_index)
        j = microbatch_index
        for window in range(m, self.definition.num_windows):
            planned = self.window(window)
            for step in range(local, int(planned.arrays.bucket_ids.shape[0])):
                yield j, self._spec(planned, window, step, j)
                j += 1
            local = 0

    def _spec(self, planned: MixedWindowPlan, m: int, local: int, j: int) -> MicrobatchSpec:
        arrays = planned.arrays
        positions = np.asarray(arrays.samples[int(arrays.offsets[local]):int(arrays.offsets[local + 1])])
        at = (positions - np.uint64(m * self.definition.window)).astype(np.int64)
        names = [c.name for c in self.definition.components]
        component, row = planned.mixed.component[at], planned.mixed.row[at]
        ids = tuple(f"{names[c]}:{r}" for c, r in zip(component.tolist(), row.tolist()))
        rows = row + self.definition.starts[component].astype(np.uint64)
        packs, pack_sizes = microbatch_packs(arrays, local, ids)
        return MicrobatchSpec(j, ids, int(arrays.bucket_ids[local]), int(arrays.max_len[local]), rows, packs,
                              pack_sizes)

    def __repr__(self) -> str:
        d = self.definition
        return (f"MixedPlan({len(d.components)} components, {d.total} samples, window {d.window}, "
                f"{d.num_windows} windows, fingerprint={self.fingerprint})")


_cursor = partial(plan_error, errors.PLAN_CURSOR_INVALID)


def _epoch(epoch: int) -> int:
    return checks.integer(epoch, "epoch", 0, 0, fail=_cursor,
                          message="{name} {value!r} is not in the plan; a mixed plan has the one epoch 0")
