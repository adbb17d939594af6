"""A windowed plan in memory: the definition, the lengths it reads, the index, the fingerprint.

What goes in: a :class:`~.window.WindowDefinition`, a :class:`~.sources.LengthSource`
and a number of epochs (:meth:`WindowedPlan.build` makes the index in one pass), or
those and a stored index (:mod:`.io`). What comes out: any microbatch by its global
index within its epoch (:meth:`WindowedPlan.microbatch`, one window planned), every
microbatch from a cursor on (:meth:`WindowedPlan.iter_from`, each window planned
once), whole windows (:meth:`WindowedPlan.window`). Nothing here holds more than
one window's arrays and the index.

The fingerprint (docs/batching.md, "Windowed plans") is SHA-256 of the canonical
CBOR of ``["umlos_windowed_plan_v1", header, [index_digest, ...]]``: ``header`` is
the definition (the batching config, ``window``, ``edge``, N, epochs), the engine's
``sampling_mode``, ``sampler_config_hash`` and ``manifest_hash``, a packed plan's ``pack_config``
(only when it packs: unpacked plans hash as before), and the binding of
the lengths (:meth:`~.sources.LengthSource.binding`); ``index_digest`` of epoch
``e`` is SHA-256 of the tag ``umlos_windowed_plan_index_v1``, the canonical CBOR of
``[e, K, C]`` and the index's little-endian int64 bytes. The microbatches follow
from the definition and the lengths, so the fingerprint covers them; ``plan
verify`` (:mod:`.verify`) replans windows and checks them against the index.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace as dataclass_replace
from collections.abc import Callable, Iterator
from functools import partial

import numpy as np

from .... import checks, errors
from ....hashing import cbor_canonical, hash_canonical, sha256_array
from ..planner import EpochArrays, engine_order, join_arrays
from ..plan import MicrobatchSpec, RowPart, plan_error
from .index import build_index, locate
from .packed import microbatch_packs
from .window import COUNT_FIELDS, WindowDefinition, plan_window

#: meta.json ``format`` of a windowed plan folder.
WINDOWED_FORMAT = "umlos_cuda.windowed_plan/1"
#: Most epochs one windowed plan may have (the index holds ``E (K + 1) C`` integers).
MAX_EPOCHS = 1 << 16


def index_digest(epoch: int, index: np.ndarray) -> str:
    """The digest of one epoch's index (see the module docstring)."""
    digest = hashlib.sha256(b"umlos_windowed_plan_index_v1")
    digest.update(cbor_canonical([int(epoch), int(index.shape[0]) - 1, int(index.shape[1])]))
    digest.update(np.ascontiguousarray(index, dtype="<i8").tobytes())
    return digest.hexdigest()


class WindowedPlan:
    """A windowed plan (see the module docstring). Build one with :meth:`build`; save and open one
    with :func:`~.io.save_windowed_plan` and :func:`~.io.load_windowed_plan`."""

    def __init__(self, definition: WindowDefinition, source, index: np.ndarray, engine: dict | None = None,
                 *, backend: str = "auto") -> None:
        self.definition = definition
        self.source = source
        self.index = index
        self.backend = backend
        self.engine = engine or _engine(definition)
        self._cached: tuple[int, int, EpochArrays] | None = None

    @classmethod
    def build(cls, definition: WindowDefinition, source, num_epochs: int = 1, *, backend: str = "auto",
              progress: Callable[[int, int], None] | None = None) -> WindowedPlan:
        """The plan of epochs ``0 .. num_epochs - 1``: the index in one streaming pass."""
        num_epochs = checks.integer(num_epochs, "num_epochs", 1, MAX_EPOCHS, fail=_config)
        if source.count != definition.num_samples:
            raise plan_error(errors.PLAN_LENGTHS_MISMATCH, f"the lengths hold {source.count} samples; the "
                                                           f"definition plans {definition.num_samples}")
        index = build_index(definition, source, num_epochs, backend=backend, progress=progress)
        return cls(definition, source, index, backend=backend)

    # ------------------------------------------------------------------ identity
    @property
    def config(self):
        return self.definition.config

    @property
    def num_epochs(self) -> int:
        return int(self.index.shape[0])

    def header(self) -> dict:
        """What the fingerprint covers besides the index."""
        return {
            "format": WINDOWED_FORMAT,
            "config": self.config.to_dict(),
            **({} if self.config.pack is None else {"pack_config": self.config.pack.to_dict()}),
            "window": self.definition.to_dict(),
            "num_epochs": self.num_epochs,
            "lengths": self.source.binding(),
            "count_fields": list(COUNT_FIELDS),
            **self.engine,
        }

    def index_digests(self) -> list[str]:
        return [index_digest(e, self.index[e]) for e in range(self.num_epochs)]

    @property
    def fingerprint(self) -> str:
        return hash_canonical(["umlos_windowed_plan_v1", self.header(), self.index_digests()]).hex()

    # ------------------------------------------------------------------ counts
    def epoch_microbatches(self, epoch: int) -> int:
        return int(self.index[self._epoch(epoch), -1, 0])

    def epoch_indices(self, epoch: int) -> range:
        """The global indices of ``epoch``'s microbatches, in order (every one: a windowed plan is never a shard)."""
        return range(self.epoch_microbatches(epoch))

    @property
    def source_fingerprint(self) -> str:
        """The plan's own fingerprint (a windowed plan is never a shard)."""
        return self.fingerprint

    def row_parts(self) -> tuple[RowPart, ...]:
        """The one dataset the rows index: the lengths the plan binds (:class:`~..plan.RowPart`)."""
        return (RowPart("", self.source.binding(), self.source, getattr(self.source, "tokenizer_hash", None)),)

    def epoch_counts(self, epoch: int) -> dict:
        """The epoch's totals (:data:`~.window.COUNT_FIELDS`)."""
        return dict(zip(COUNT_FIELDS, (int(v) for v in self.index[self._epoch(epoch), -1])))

    def window_counts(self, epoch: int, w: int) -> dict:
        e = self._epoch(epoch)
        return dict(zip(COUNT_FIELDS, (int(v) for v in self.index[e, w + 1] - self.index[e, w])))

    # ------------------------------------------------------------------ microbatches
    def window(self, epoch: int, w: int) -> EpochArrays:
        """Window ``w``'s microbatches (the last window planned is kept, so iterating plans each once)."""
        e = self._epoch(epoch)
        checks.integer(w, "window", 0, self.definition.num_windows - 1, fail=_cursor)
        cached = self._cached
        if cached is None or cached[:2] != (e, w):
            cached = (e, w, plan_window(self.definition, self.source, e, w, self.backend))
            self._cached = cached
        return cached[2]

    def microbatch(self, epoch: int, j: int) -> MicrobatchSpec:
        """Microbatch ``j`` of ``epoch`` (its global index in the epoch): one window is planned."""
        e = self._epoch(epoch)
        checks.integer(j, "microbatch_index", 0, self.epoch_microbatches(e) - 1, fail=_cursor)
        w, local = locate(self.index, e, j)
        return _spec(self.window(e, w), local, j)

    def microbatch_at(self, epoch: int, k: int) -> MicrobatchSpec:
        """:meth:`microbatch`, under the name :class:`~.resume.ResumablePlan` reads."""
        return self.microbatch(epoch, k)

    def iter_from(self, epoch: int = 0, microbatch_index: int = 0) -> Iterator[tuple[int, int, MicrobatchSpec]]:
        """``(epoch, index, microbatch)`` from the cursor ``(epoch, microbatch_index)`` to the end of the plan
        (the index may be the epoch's length: the epoch is done). Resuming costs one window."""
        e = self._epoch(epoch)
        checks.integer(microbatch_index, "microbatch_index", 0, self.epoch_microbatches(e), fail=_cursor)
        for current in range(e, self.num_epochs):
            first = microbatch_index if current == e else 0
            total = self.epoch_microbatches(current)
            if first >= total:
                continue
            w, local = locate(self.index, current, first)
            j = first
            for window in range(w, self.definition.num_windows):
                arrays = self.window(current, window)
                for step in range(local, int(arrays.bucket_ids.shape[0])):
                    yield current, j, _spec(arrays, step, j)
                    j += 1
                local = 0

    def epoch_arrays(self, epoch: int) -> EpochArrays:
        """Every window of ``epoch`` joined: the epoch's microbatches as one set of arrays (O(N) in memory; skipped
        rows in ascending order), what a whole plan made by the same windows holds."""
        e = self._epoch(epoch)
        return join_arrays([self.window(e, w) for w in range(self.definition.num_windows)])

    def as_batch_plan(self, lengths=None):
        """The same microbatches as a whole plan (O(N)), for what writes O(N) files anyway (``plan shard``; ``batch
        generate`` writes a windowed plan's microbatches as they are): the plan of ``config.window = W`` (None
        when one window holds the epoch), so microbatch ``k`` of epoch ``e`` is the same in both and the whole plan
        rebuilds and verifies as any plan. ``lengths``: a length cache of the same lengths whose ids and hashes it
        records (a token store's, to collate from it); default: the source's lengths, rows named by number.
        PLAN_LENGTHS_MISMATCH when ``lengths`` are not this plan's."""
        from ..builder import BatchPlanBuilder

        count = self.definition.num_samples
        window = self.definition.window if self.definition.window < count else None
        config = dataclass_replace(self.config, window=window)
        if lengths is None:
            lengths = np.asarray(self.source.take(np.arange(count, dtype=np.int64)), dtype=np.uint32)
            builder = BatchPlanBuilder(lengths, config, tokenizer_hash=getattr(self.source, "tokenizer_hash", None),
                                       backend=self.backend)
        else:
            builder = BatchPlanBuilder(lengths, config, backend=self.backend)
        binding = self.source.binding()
        expected = binding["lengths_sha256"] if binding.get("kind") == "array" else \
            sha256_array(np.asarray(self.source.take(np.arange(count, dtype=np.int64)), dtype="<u4"))
        if sha256_array(builder.lengths) != expected:
            raise plan_error(errors.PLAN_LENGTHS_MISMATCH, f"the {builder.lengths.shape[0]} lengths given are not "
                                                           f"the {count} lengths the windowed plan binds")
        return builder.build(self.num_epochs)

    def _epoch(self, epoch: int) -> int:
        return checks.integer(epoch, "epoch", 0, self.num_epochs - 1, fail=_cursor,
                              message="{name} {value!r} is not in the plan; it has epochs 0 to {high}")

    def __repr__(self) -> str:
        d = self.definition
        return (f"WindowedPlan({self.num_epochs} epochs of {d.num_samples} samples, window {d.window}, "
                f"{d.num_windows} windows an epoch, fingerprint={self.fingerprint})")


def _spec(arrays: EpochArrays, local: int, j: int) -> MicrobatchSpec:
    rows = np.asarray(arrays.samples[int(arrays.offsets[local]):int(arrays.offsets[local + 1])])
    ids = tuple(str(r) for r in rows.tolist())
    packs, pack_sizes = microbatch_packs(arrays, local, ids)
    return MicrobatchSpec(j, ids, int(arrays.bucket_ids[local]), int(arrays.max_len[local]), rows, packs, pack_sizes)


def _engine(definition: WindowDefinition) -> dict:
    return engine_order(definition.config, definition.manifest)


_cursor = partial(plan_error, errors.PLAN_CURSOR_INVALID)
_config = partial(plan_error, errors.BATCHING_CONFIG_INVALID)
