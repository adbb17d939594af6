"""A batch plan in memory: metadata, and per epoch the microbatches as arrays.

What goes in: :class:`BatchPlanMeta` and one :class:`EpochPlan` per epoch
(arrays from the planner, or memory-mapped from a plan folder). What comes
out: microbatches, one at a time (:class:`MicrobatchSpec`, the fields of
microbatches.jsonl plus the dataset ``rows``), from any position
(``iter_from``). Nothing here is per sample: a 10^8-sample plan is four
arrays per epoch. Plan folders (:mod:`.io`) and shards (:mod:`.sharding`)
are built on this module, which imports neither.

Microbatch indices are *global*: the position in the epoch's sequence of the
unsharded plan. A shard keeps them (its microbatch ``j`` is global
``rank + j * world_size``), so a cursor ``(epoch, microbatch_index)`` means
the same thing at every world size.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import checks, errors
from ...errors import UmlosError
from ..lengths.fingerprints import PARTS_KEY
from ..lengths.plain_ids import PlainIds
from .config import BatchingConfig
from .units import plan_units

if TYPE_CHECKING:
    from .units import Units

#: meta.json ``format``.
PLAN_FORMAT = "umlos_cuda.batch_plan/1"
#: meta.json's ``version`` field.
PLAN_VERSION = "1.0"


def plan_error(code: str, message: str) -> UmlosError:
    return UmlosError(code, message, operator=errors.BATCH_PLAN_OPERATOR)


@dataclass(frozen=True)
class MicrobatchSpec:
    """One microbatch: a line of microbatches.jsonl (``samples`` are sample ids) and ``rows``,
    the dataset rows (what a ``DataLoader`` indexes). In a packed plan
    ``packs`` lists each packed row's sample ids (their concatenation is
    ``samples``) and ``pack_sizes`` their counts; both are None otherwise.
    In a plan with an over-long policy (:mod:`.overlong`), ``spans`` is
    each sample's token range ``[start, stop)`` (int64 ``[count, 2]``: the
    tokens collation takes) and, in a split plan, ``pieces`` each sample's
    piece number; both are None otherwise (whole samples)."""

    index: int
    samples: tuple[str, ...]
    bucket_id: int
    max_len: int
    rows: np.ndarray = field(repr=False, compare=False)
    packs: tuple[tuple[str, ...], ...] | None = None
    pack_sizes: tuple[int, ...] | None = field(default=None, repr=False, compare=False)
    spans: np.ndarray | None = field(default=None, repr=False, compare=False)
    pieces: tuple[int, ...] | None = None

    @property
    def batch_size(self) -> int:
        return len(self.samples)

    def packed_rows(self) -> list[np.ndarray] | None:
        """The dataset rows of each packed row (None when the plan does not pack)."""
        if self.pack_sizes is None:
            return None
        return np.split(self.rows, np.cumsum(self.pack_sizes)[:-1])

    def to_json(self) -> dict:
        """The microbatches.jsonl object (key order fixed: the files are byte-identical;
        ``pieces`` only in a split plan)."""
        line = {"index": self.index, "samples": list(self.samples), "bucket_id": self.bucket_id,
                "max_len": self.max_len, "packs": None if self.packs is None else [list(p) for p in self.packs]}
        if self.pieces is not None:
            line["pieces"] = list(self.pieces)
        return line


@dataclass(frozen=True)
class RowPart:
    """One dataset whose rows a plan's microbatches index. A plan of rows reads its parts one after another
    (one part, or a mixture's components in order: part ``i``'s row ``r`` is the plan's row
    ``r + sum of the earlier parts' counts``). ``name``: what sample ids show of it (empty for a plan of one
    dataset); ``binding``: its lengths as the plan's fingerprint records them (``{"kind": "array", "count",
    "lengths_sha256"}``, or another kind's record with its ``count``); ``source``: the lengths it was planned from
    (None for a whole plan, which holds them); ``tokenizer_hash``: the tokenizer the plan names for it (None:
    none). What a consumer checks a token source against (plans/integrity.py, :func:`check_rows_match_plan`)."""

    name: str
    binding: dict
    source: Any = field(default=None, repr=False, compare=False)
    tokenizer_hash: str | None = None

    @property
    def count(self) -> int:
        return int(self.binding["count"])


@dataclass(frozen=True)
class BatchPlanMeta:
    """What a plan was built from and what it is (meta.json).

    ``config`` is the :class:`BatchingConfig`; ``sampling_mode`` and
    ``sampler_config_hash`` are the engine's, from its metadata;
    ``manifest_hash`` names the manifest the order comes from
    (``planner.plan_manifest``). ``lengths_sha256`` binds the lengths
    (uint32 little-endian bytes), ``sample_ids_sha256`` the ids (None when
    they are the row numbers). ``shard`` is None for a full plan, else
    ``{"rank", "world_size", "source_fingerprint"}``. ``fingerprint`` is
    filled once the content is known (:mod:`.fingerprint`). ``units`` is
    None unless the config splits or has an over-long policy; then
    ``{"samples", "units"}``: the rows on the split's side and the units
    they became (:mod:`.units`), in the header only then. ``tokenizer_parts``
    is the tokenizer's parts hashed alone (to name the parts a store's
    tokenizer differs in), where the lengths came with them; written last and
    outside the fingerprint, which it adds nothing to (``tokenizer_hash`` is
    their whole).
    """

    config: BatchingConfig
    num_epochs: int
    num_samples: int
    tokenizer_hash: str
    dataset_hash: str | None
    lengths_sha256: str
    sample_ids_sha256: str | None
    sampling_mode: str
    sampler_config_hash: str
    manifest_hash: str
    index_dtype: str
    shard: dict | None = None
    fingerprint: str | None = None
    epoch_digests: tuple[str, ...] = ()
    units: dict | None = None
    tokenizer_parts: dict[str, str] | None = None

    @property
    def source_fingerprint(self) -> str | None:
        """The full plan's fingerprint (a shard's source; the plan's own otherwise)."""
        return self.shard["source_fingerprint"] if self.shard else self.fingerprint

    def header(self) -> dict:
        """The fields the fingerprint covers (everything but the fingerprint and digests)."""
        return {
            "format": PLAN_FORMAT,
            "version": PLAN_VERSION,
            **self.config.to_dict(),
            "base_seed": self.config.seed,
            "pack_config": None if self.config.pack is None else self.config.pack.to_dict(),
            "num_epochs": self.num_epochs,
            "num_samples": self.num_samples,
            "tokenizer_hash": self.tokenizer_hash,
            "dataset_hash": self.dataset_hash,
            "lengths_sha256": self.lengths_sha256,
            "sample_ids": "line_numbers" if self.sample_ids_sha256 is None else "file",
            "sample_ids_sha256": self.sample_ids_sha256,
            "sampler_config_hash": self.sampler_config_hash,
            "manifest_hash": self.manifest_hash,
            "index_dtype": self.index_dtype,
            "shard": self.shard,
            **({} if self.units is None else {"units": self.units}),
        }

    def to_json(self) -> dict:
        parts = {} if self.tokenizer_parts is None else {PARTS_KEY: self.tokenizer_parts}  # last, not hashed
        return {**self.header(), "fingerprint": self.fingerprint, "epoch_digests": list(self.epoch_digests), **parts}


@dataclass(frozen=True)
class EpochPlan:
    """One epoch: ``offsets`` (int64, M + 1), ``samples`` (rows), ``bucket_ids``
    (int16, M), ``max_len`` (uint32, M); microbatch ``j`` has global index
    ``index_base + j * index_step``. ``stats`` is what stats.json holds.
    A packed plan's epoch also has ``row_offsets`` and ``pack_rows``
    (:mod:`.packing`); they are None otherwise. A split plan's epoch has
    ``pieces`` (uint32, S): the piece number of each entry of ``samples``."""

    epoch: int
    offsets: np.ndarray
    samples: np.ndarray
    bucket_ids: np.ndarray
    max_len: np.ndarray
    stats: dict
    index_base: int = 0
    index_step: int = 1
    row_offsets: np.ndarray | None = None
    pack_rows: np.ndarray | None = None
    pieces: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.bucket_ids.shape[0])

    def global_index(self, j: int) -> int:
        return self.index_base + j * self.index_step

    def local_index(self, global_index: int) -> int | None:
        """The position of global microbatch ``global_index`` in this epoch (None: not here)."""
        offset = global_index - self.index_base
        if offset < 0 or offset % self.index_step:
            return None
        return offset // self.index_step

    def first_local_at_or_after(self, global_index: int) -> int:
        """The first local microbatch whose global index is ``>= global_index``."""
        return max(0, -(-(global_index - self.index_base) // self.index_step))

    def rows(self, j: int) -> np.ndarray:
        return np.asarray(self.samples[int(self.offsets[j]):int(self.offsets[j + 1])])

    def entry_pieces(self, j: int) -> np.ndarray | None:
        """The piece numbers of microbatch ``j``'s samples (None unless the plan splits)."""
        if self.pieces is None:
            return None
        return np.asarray(self.pieces[int(self.offsets[j]):int(self.offsets[j + 1])])

    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def padded_rows(self) -> np.ndarray:
        """Padded rows of each microbatch: its packed rows, or its samples when the plan does not pack."""
        return np.diff(np.asarray(self.pack_rows if self.pack_rows is not None else self.offsets, dtype=np.int64))


class BatchPlan:
    """A batch plan: :class:`BatchPlanMeta`, one :class:`EpochPlan` per epoch,
    the lengths it was built from and the sample ids (None: row numbers).

    Build one with :class:`~umlos_cuda.batching.plans.builder.BatchPlanBuilder`;
    write and read one with :func:`~umlos_cuda.batching.plans.io.save_plan` and
    :func:`~umlos_cuda.batching.plans.io.load_plan` (memory-mapped binary form);
    split one across ranks with :func:`~umlos_cuda.batching.plans.sharding.shard_plan`.
    This module knows neither files nor ranks, so those modules build on it.
    """

    def __init__(self, meta: BatchPlanMeta, epochs: Sequence[EpochPlan], lengths: np.ndarray,
                 sample_ids: Sequence[str] | PlainIds | None = None) -> None:
        self.meta = meta
        self.epochs = list(epochs)
        self.lengths = lengths
        self._sample_ids = sample_ids
        self._units: Units | None = None

    @property
    def sample_ids(self) -> Sequence[str] | None:
        """The ids (None: row numbers); plain ids held as bytes become a list on first use."""
        ids = self._sample_ids
        return ids.tolist() if isinstance(ids, PlainIds) else ids

    @property
    def plain_ids(self) -> PlainIds | None:
        """The ids as one array of bytes, when the plan was built from them so (plans/lines.py writes
        its files from them); None otherwise."""
        return self._sample_ids if isinstance(self._sample_ids, PlainIds) else None

    @property
    def units(self) -> Units | None:
        """The :class:`~.units.Units` the plan orders (None: the rows, whole), computed once."""
        if self._units is None and (self.config.split is not None or self.config.overlong is not None):
            self._units = plan_units(self.lengths, self.sample_ids, self.config)
        return self._units

    def unit_index(self, epoch: EpochPlan, start: int = 0, stop: int | None = None):
        """``(units, lengths)``: the unit of each entry ``samples[start:stop]``
        of ``epoch`` (-1 where an entry is no unit of the config) and the
        lengths they index; the rows and ``lengths`` when the plan's units are the rows."""
        samples = np.asarray(epoch.samples[start:stop])
        units = self.units
        if units is None:
            return samples, self.lengths
        pieces = None if epoch.pieces is None else np.asarray(epoch.pieces[start:stop])
        return units.index(samples, pieces), units.lengths

    def entry_spans(self, epoch: EpochPlan, j: int) -> np.ndarray | None:
        """The token range ``[start, stop)`` (int64 ``[count, 2]``) of each sample of local microbatch ``j`` of
        ``epoch`` under the plan's over-long policy (:attr:`MicrobatchSpec.spans`); None without a policy."""
        table = self.units
        if table is None or self.config.overlong is None:
            return None
        units, _ = self.unit_index(epoch, int(epoch.offsets[j]), int(epoch.offsets[j + 1]))
        if units.size and int(units.min()) < 0:
            raise plan_error(errors.PLAN_SAMPLES_INVALID,
                             f"epoch {epoch.epoch} microbatch {j}: entry {int(np.argmin(units))} is no sample or "
                             "piece of the plan's configuration")
        return np.stack((table.starts[units], table.stops[units]), axis=1)

    def __repr__(self) -> str:
        shard = f", shard {self.meta.shard['rank']}/{self.meta.shard['world_size']}" if self.meta.shard else ""
        return (f"BatchPlan({self.num_epochs} epochs, {self.total_microbatches} microbatches, "
                f"{self.meta.num_samples} samples{shard}, fingerprint={self.fingerprint})")

    # ------------------------------------------------------------------ sizes
    @property
    def fingerprint(self) -> str | None:
        return self.meta.fingerprint

    @property
    def config(self) -> BatchingConfig:
        return self.meta.config

    @property
    def num_epochs(self) -> int:
        return len(self.epochs)

    @property
    def total_microbatches(self) -> int:
        return sum(len(e) for e in self.epochs)

    def get_epoch(self, epoch: int) -> EpochPlan:
        epoch = checks.integer(epoch, "epoch", 0, self.num_epochs - 1,
                               fail=partial(plan_error, errors.PLAN_CURSOR_INVALID),
                               message="{name} {value!r} is not in the plan; it has epochs 0 to {high}")
        return self.epochs[epoch]

    def epoch_microbatches(self, epoch: int) -> int:
        """Microbatches of ``epoch`` in the full (unsharded) plan."""
        stats = self.get_epoch(epoch).stats
        return int(stats.get("global_microbatches", stats["microbatches"]))

    def epoch_indices(self, epoch: int) -> range:
        """The global indices of the microbatches of ``epoch`` this plan holds, in order (a shard: its rank's)."""
        plan = self.get_epoch(epoch)
        return range(plan.index_base, plan.index_base + len(plan) * plan.index_step, plan.index_step)

    @property
    def source_fingerprint(self) -> str | None:
        """The full plan's fingerprint (a shard's source; the plan's own otherwise)."""
        return self.meta.source_fingerprint

    def row_parts(self) -> tuple[RowPart, ...]:
        """The one dataset the rows index (:class:`RowPart`): the lengths and tokenizer meta.json binds."""
        meta = self.meta
        binding = {"kind": "array", "count": meta.num_samples, "lengths_sha256": meta.lengths_sha256}
        return (RowPart("", binding, None, meta.tokenizer_hash),)

    # ------------------------------------------------------------------ ids
    def sample_id(self, row: int) -> str:
        return str(int(row)) if self.sample_ids is None else self.sample_ids[int(row)]

    def _ids(self, rows: np.ndarray) -> tuple[str, ...]:
        if self.sample_ids is None:
            return tuple(str(r) for r in rows.tolist())
        ids = self.sample_ids
        return tuple(ids[r] for r in rows.tolist())

    # ------------------------------------------------------------------ iteration
    def microbatch(self, epoch: int, j: int) -> MicrobatchSpec:
        """Local microbatch ``j`` of ``epoch``."""
        plan = self.get_epoch(epoch)
        rows = plan.rows(j)
        ids = self._ids(rows)
        pieces = plan.entry_pieces(j)
        spans = self.entry_spans(plan, j)
        packs = sizes = None
        if plan.pack_rows is not None:
            assert plan.row_offsets is not None  # a packed epoch has both
            bounds = np.asarray(plan.row_offsets[int(plan.pack_rows[j]):int(plan.pack_rows[j + 1]) + 1], dtype=np.int64)
            bounds = (bounds - bounds[0]).tolist()
            sizes = tuple(b - a for a, b in pairwise(bounds))
            packs = tuple(ids[a:b] for a, b in pairwise(bounds))
        return MicrobatchSpec(plan.global_index(j), ids, int(plan.bucket_ids[j]), int(plan.max_len[j]), rows,
                              packs, sizes, spans, None if pieces is None else tuple(pieces.tolist()))

    def microbatch_at(self, epoch: int, index: int) -> MicrobatchSpec:
        """Global microbatch ``index`` of ``epoch`` (every plan of rows answers this); PLAN_CURSOR_INVALID when it is
        not one this plan holds (a shard holds its rank's)."""
        plan = self.get_epoch(epoch)
        local = plan.local_index(index) if checks.is_integer(index) else None
        if local is None or not 0 <= local < len(plan):
            raise plan_error(errors.PLAN_CURSOR_INVALID, f"microbatch {index!r} is not one of epoch {epoch} "
                             f"of this {'shard' if self.meta.shard else 'plan'}")
        return self.microbatch(epoch, local)

    def iter_epoch(self, epoch: int) -> Iterator[MicrobatchSpec]:
        plan = self.get_epoch(epoch)
        for j in range(len(plan)):
            yield self.microbatch(epoch, j)

    def iter_from(self, epoch: int, microbatch_index: int) -> Iterator[tuple[int, int, MicrobatchSpec]]:
        """``(epoch, global index, microbatch)`` from the plan cursor
        ``(epoch, microbatch_index)`` to the end of the plan (resume). The
        index may be the epoch's length (the epoch is done)."""
        check_cursor(self, epoch, microbatch_index)
        for e in range(int(epoch), self.num_epochs):
            plan = self.epochs[e]
            first = plan.first_local_at_or_after(microbatch_index) if e == epoch else 0
            for j in range(first, len(plan)):
                spec = self.microbatch(e, j)
                yield e, spec.index, spec


def check_cursor(plan: Any, epoch: Any, microbatch_index: Any) -> None:
    """A plan cursor must name an epoch of the plan and an index in ``[0, M]``: the one rule for every plan
    with ``num_epochs`` and ``epoch_microbatches`` (a whole plan, a windowed one: windows/resume.py)."""
    for value, what in ((epoch, "epoch"), (microbatch_index, "microbatch_index")):
        checks.integer(value, what, 0, None, fail=partial(plan_error, errors.PLAN_CURSOR_INVALID),
                       message=checks.NON_NEGATIVE)
    checks.integer(epoch, "epoch", 0, plan.num_epochs - 1, fail=partial(plan_error, errors.PLAN_CURSOR_INVALID),
                   message="{name} {value!r} is not in the plan; it has epochs 0 to {high}")
    limit = plan.epoch_microbatches(epoch)
    if microbatch_index > limit:
        raise plan_error(errors.PLAN_CURSOR_INVALID,
                         f"microbatch_index {microbatch_index} is past the end of epoch {epoch} "
                         f"({limit} microbatches; {limit} itself means the epoch is done)")
