"""Build a :class:`BatchPlan` from lengths and a :class:`BatchingConfig`.

What goes in: a :class:`~umlos_cuda.batching.lengths.cache.LengthCache` (or a
``uint32`` array of lengths with a tokenizer hash), the config and a number
of epochs. What comes out: the plan with its statistics and fingerprint.
Each epoch is :func:`planner.build_epoch`; memory is a few arrays of N.

With a split or an over-long policy in the config, the planner runs on the
units (:mod:`.units`) instead of the rows: the engine's order over the ``U``
units, their lengths; the epoch's entries are then mapped to the units'
dataset rows (and, in a split plan, piece numbers), and stats.json gains
``overlong`` (what the policy did).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import numpy as np

from ... import checks
from .buckets import config_error
from .config import BatchingConfig
from .plan import BatchPlan, BatchPlanMeta, EpochPlan
from ...hashing import sha256_array
from .fingerprint import finish_meta
from .lines import sample_ids_lines
from .stats import epoch_stats, skipped_ids
from .planner import build_epoch, engine_metadata, index_dtype, plan_manifest
from .groups import check_group_rows
from ..lengths.pairs import check_pairing
from .units import plan_units

#: Most epochs one plan may have (each epoch is a few arrays of N).
MAX_EPOCHS = 1 << 16


class BatchPlanBuilder:
    """``BatchPlanBuilder(lengths, batching_config).build(num_epochs)``.

    Args:
        lengths: a LengthCache, or a one-dimensional integer array of lengths
            (then ``tokenizer_hash`` names what counted them, and
            ``sample_ids`` may name the rows; default: the row numbers).
        batching_config: a :class:`BatchingConfig`.
        backend: the engine backend that computes the order (any gives the same order).
    """

    def __init__(self, lengths, batching_config: BatchingConfig, *, tokenizer_hash: str | None = None,
                 sample_ids: Sequence[str] | None = None, dataset_hash: str | None = None,
                 backend: str = "auto") -> None:
        if not isinstance(batching_config, BatchingConfig):
            raise config_error(f"batching_config must be a BatchingConfig, got {type(batching_config).__name__}")
        self.config = batching_config
        self.backend = backend
        if hasattr(lengths, "lengths") and hasattr(lengths, "tokenizer_hash"):  # a LengthCache
            self.lengths = np.asarray(lengths.lengths, dtype=np.uint32)
            self.tokenizer_hash = lengths.tokenizer_hash
            self.tokenizer_parts = getattr(lengths, "tokenizer_parts", None)
            self.dataset_hash = getattr(lengths, "dataset_hash", None)
            line_numbers = getattr(lengths, "ids_are_line_numbers", False)
            plain = None if line_numbers else getattr(lengths, "plain_ids", None)  # kept as bytes (PlainIds)
            self.sample_ids = None if line_numbers else plain if plain is not None else list(lengths.sample_ids)
        else:
            self.lengths = _as_lengths(lengths)
            self.tokenizer_hash = tokenizer_hash or "unknown"
            self.tokenizer_parts = None
            self.dataset_hash = dataset_hash
            self.sample_ids = None if sample_ids is None else list(sample_ids)
        if self.sample_ids is not None and len(self.sample_ids) != self.lengths.shape[0]:
            raise config_error(f"{len(self.sample_ids)} sample ids for {self.lengths.shape[0]} lengths")
        if self.lengths.shape[0] == 0:
            raise config_error("no samples: a plan needs at least one length")
        check_pairing(self.sample_ids, batching_config.group_size, config_error)
        check_group_rows(int(self.lengths.shape[0]), batching_config.group_size)

    def build(self, num_epochs: int = 1, progress: Callable[[int, int], None] | None = None) -> BatchPlan:
        """The plan of epochs ``0 .. num_epochs - 1``; ``progress(done, total)`` after each epoch."""

        num_epochs = checks.integer(num_epochs, "num_epochs", 1, MAX_EPOCHS, fail=config_error)
        n = int(self.lengths.shape[0])
        ids = self.sample_ids
        units = plan_units(self.lengths, ids, self.config)
        planned = self.lengths if units is None else units.lengths
        if planned.shape[0] == 0:
            raise config_error(f"no samples left to plan: the split and over-long policy keep none of the {n}")
        manifest = plan_manifest(self.config, int(planned.shape[0]))
        metadata = engine_metadata(self.config, manifest)
        sample_id = (lambda r: str(r)) if ids is None else ids.__getitem__
        epochs = []
        for epoch in range(num_epochs):
            arrays = build_epoch(planned, self.config, epoch, manifest=manifest, backend=self.backend)
            if units is None:
                skipped = skipped_ids(arrays.skipped, sample_id)
            else:
                skipped = [units.label(u, sample_id) for u in np.asarray(arrays.skipped).tolist()]
            stats = epoch_stats(epoch, arrays.offsets, arrays.samples, arrays.bucket_ids, arrays.max_len,
                                planned, self.config.bucket_spec, skipped, row_offsets=arrays.row_offsets,
                                pack_rows=arrays.pack_rows, pack=self.config.pack)
            samples, pieces = arrays.samples, None
            if units is not None:
                samples = units.rows[arrays.samples].astype(index_dtype(n))
                if units.split_pieces:
                    pieces = units.pieces[arrays.samples].astype("<u4")
                if units.overlong is not None:
                    stats["overlong"] = dict(units.overlong)
            epochs.append(EpochPlan(epoch, arrays.offsets, samples, arrays.bucket_ids, arrays.max_len, stats,
                                    row_offsets=arrays.row_offsets, pack_rows=arrays.pack_rows, pieces=pieces))
            if progress is not None:
                progress(epoch + 1, num_epochs)
        meta = BatchPlanMeta(
            config=self.config,
            num_epochs=num_epochs,
            num_samples=n,
            tokenizer_hash=self.tokenizer_hash,
            dataset_hash=self.dataset_hash,
            lengths_sha256=sha256_array(self.lengths.astype("<u4", copy=False)),
            sample_ids_sha256=None if ids is None else sample_ids_sha256(ids),
            sampling_mode=metadata["sampling_mode"],
            sampler_config_hash=metadata["sampler_config_hash"],
            manifest_hash=metadata["manifest_hash"],
            index_dtype=index_dtype(n).str,
            units=None if units is None else units.record(),
            tokenizer_parts=self.tokenizer_parts,
        )
        return BatchPlan(finish_meta(meta, epochs), epochs, self.lengths, ids)


def sample_ids_sha256(ids: Sequence[str]) -> str:
    """The SHA-256 of sample_ids.jsonl, the bytes plans/lines.py writes (from a PlainIds, the same bytes)."""
    digest = hashlib.sha256()
    for chunk in sample_ids_lines(ids):
        digest.update(chunk)
    return digest.hexdigest()


def _as_lengths(values) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise config_error(f"lengths must be a one-dimensional integer array, got {array.dtype} {array.shape}")
    if array.size and (int(array.min()) < 0 or int(array.max()) > 0xFFFFFFFF):
        raise config_error("lengths must lie in [0, 2^32 - 1]")
    return array.astype(np.uint32, copy=False)

