"""Tensors for a ``DataLoader`` over a batch plan: a token dataset and a collate_fn.

:class:`TokenDataset` indexes a token source (a token store or a Megatron
dataset) by dataset row; :class:`PlanCollator` turns the items of one
microbatch into a dict of tensors with
:func:`~umlos_cuda.batching.collate.collate_arrays`, in the convention its
preset names (int32 and shifted labels by default; ``hf`` and
``padding_free`` for ``transformers`` models). With
:class:`~umlos_cuda.torch.PlanBatchSampler` as ``batch_sampler``, each batch
is one plan microbatch, padded as the plan says: the collator needs only
the plan's :class:`~umlos_cuda.batching.plans.config.BatchingConfig` (pad to the
bucket of the microbatch, whose samples all share it, or to the longest),
not the sampler's state, so it runs in worker processes, which take the
dataset and collator by pickle: a token source pickles as its path and is
reopened (memory-mapped) in the worker.

A packed plan's rows cannot be told from the samples alone, so
:class:`PackedBatchSampler` wraps the sampler and hands out ``(row, k)``
pairs, ``k`` the packed row of the sample within its microbatch; the
collator lays each packed row out with
:func:`~umlos_cuda.batching.packing.rows.pack_rows` and pads it to the
plan's row length.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._sampler_base import DatasetBase


class TokenDataset(DatasetBase):
    """Map-style dataset over a token source: item ``row`` is
    ``(row, input_ids, loss_mask)`` (NumPy views of the memory-mapped files).

    Args:
        store: a token store folder, a Megatron dataset prefix, an opened source (a mixed plan's
            ``plan.dataset()``: its components one after another), or a list of these read as one
            dataset (rows numbered through the list).
        tokenizer_hash: for a Megatron prefix, the tokenizer hash its plan names (default: the plan's).
        plan: the plan whose microbatches index it (a whole or windowed plan, or its folder): the store is
            checked once, here, to be the one the plan was built from (BATCH_STORE_MISMATCH otherwise, as
            ``batch generate`` checks it): another dataset's store of the same row count would hand out its
            rows without a word. :class:`~umlos_cuda.torch.PlanTrainerData` always passes its plan.
    """

    def __init__(self, store: Any, *, tokenizer_hash: str | None = None, plan: Any = None) -> None:
        from ..batching.lengths.sources import LengthSource
        from ..batching.plans.integrity import check_rows_match_plan
        from ..batching.sources import open_source
        from ..batching.tokens.sources import open_token_source

        if plan is not None and not hasattr(plan, "epoch_microbatches"):
            from ..batching.plans.kinds import open_row_plan

            plan = open_row_plan(plan, "TokenDataset")
        meta = getattr(plan, "meta", None)
        if tokenizer_hash is None and meta is not None:  # a Megatron prefix: under the plan's, as batch generate
            tokenizer_hash = meta.tokenizer_hash
        self.source: Any
        if isinstance(store, LengthSource) and callable(getattr(store, "arrays", None)):
            self.source = store  # a source read by rows that has tokens (a SourceList, a mapped store)
        elif isinstance(store, (list, tuple)) and len(store) > 1:
            self.source = open_source(list(store), tokens=True)  # one SourceList: rows numbered through the list
        else:
            self.source = open_token_source(store, tokenizer_hash=tokenizer_hash)
        if plan is not None:
            check_rows_match_plan(self.source, plan)

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, key) -> tuple:
        """``(row, input_ids, loss_mask)``; for a ``(row, k)`` key (a packed
        plan, :class:`PackedBatchSampler`), ``(row, input_ids, loss_mask, k)``."""
        if isinstance(key, tuple):
            row, k = key
            return (*self[row], int(k))
        ids, mask = self.source.arrays(int(key))
        return int(key), ids, mask


class PackedBatchSampler:
    """``batch_sampler`` for a packed plan: the microbatches of a
    :class:`~umlos_cuda.torch.PlanBatchSampler` as ``(row, k)`` pairs, ``k``
    the packed row each sample belongs to. ``state_dict``,
    ``load_state_dict``, ``set_epoch`` and ``len()`` are the wrapped
    sampler's (``sampler``)."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler

    def __iter__(self):
        for rows in self.sampler:
            last = self.sampler.last_microbatch
            sizes = self.sampler.microbatch(last["epoch"], last["index"]).pack_sizes
            packs = np.repeat(np.arange(len(sizes)), sizes) if sizes is not None else np.arange(len(rows))
            yield list(zip(rows, packs.tolist()))

    def __len__(self) -> int:
        return len(self.sampler)

    def state_dict(self, *args, **kwargs) -> dict:
        return self.sampler.state_dict(*args, **kwargs)

    def load_state_dict(self, state) -> None:
        self.sampler.load_state_dict(state)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)


class PlanCollator:
    """``collate_fn`` for plan microbatches of :class:`TokenDataset` items.

    ``preset`` says which tensors (:mod:`~umlos_cuda.batching.presets`):

    * ``shifted`` (default): ``{"input_ids", "labels", "loss_mask",
      "attention_mask", "segment_ids", "position_ids"}``, int32 ``[rows,
      width]`` tensors, labels already shifted, and ``"rows"`` (int64
      dataset rows);
    * ``hf``: ``input_ids``, unshifted ``labels``, ``attention_mask`` and
      ``position_ids``, int64, which a ``transformers`` causal LM takes as
      ``model(**batch)``; for a packed plan the attention mask is the 4-D
      block-diagonal one (``attention="auto"``), boolean for
      ``attn_implementation="sdpa"`` or ``mask_dtype="float32"`` (additive)
      for ``eager``;
    * ``padding_free``: the microbatch as one row with ``position_ids``,
      ``cu_seq_lens_q/k`` and ``max_length_q/k``, as
      ``DataCollatorWithFlattening`` gives them.

    ``dtype``, ``mask_dtype`` and ``cu_seq_lens_dtype`` are those of
    :func:`~umlos_cuda.batching.presets.apply_preset`. ``rows`` adds the
    ``"rows"`` tensor (default: only under ``shifted``, since a model called
    with ``**batch`` would be handed it too).

    ``plan``: a :class:`~umlos_cuda.batching.plans.plan.BatchPlan`, a windowed
    plan, either's folder or a :class:`~umlos_cuda.batching.plans.config.BatchingConfig`. For
    a packed plan, items carry their packed row (:class:`PackedBatchSampler`)
    and ``separator_ids`` are the plan's separator tokens.
    """

    def __init__(self, plan: Any, *, pad_id: int = 0, separator_ids=(), preset: str = "shifted", dtype: Any = None,
                 attention: str = "auto", mask_dtype: str = "bool", cu_seq_lens_dtype: Any = "int32",
                 rows: bool | None = None) -> None:
        from ..batching.plans.config import BatchingConfig
        from ..batching.plans.kinds import open_row_plan

        if isinstance(plan, BatchingConfig):
            self.config = plan
        else:
            opened = plan if hasattr(plan, "config") else open_row_plan(plan, "PlanCollator")
            self.config = opened.config
        self.pad_id = pad_id
        from ..batching.collate import collate_error, plan_separator_ids

        overlong = self.config.overlong
        if overlong is not None and overlong.policy.value != "skip":
            # the items are whole dataset rows; the plan wants token ranges of them (MicrobatchSpec.spans)
            raise collate_error(f"this plan takes token ranges of its samples (over-long policy "
                                f"{overlong.policy.value}, max_length {overlong.max_length}), and a DataLoader over "
                                "TokenDataset hands out whole rows: collate it with collate_microbatch or write its "
                                "batch files (umlos-cuda batch generate)")
        self.separator_ids = plan_separator_ids(self, separator_ids)
        from ..batching.presets import CollationPreset, check_preset

        if attention == "auto" and preset != "shifted":  # one mask form for every microbatch of the plan
            attention = "4d" if self.config.pack is not None else "2d"
        if attention == "2d" and preset == "hf" and self.config.pack is not None:
            raise collate_error("a packed plan's rows need the 4-D block-diagonal mask: a 2-D one lets each token "
                                "attend to the sequences before it in its row (give attention='4d' or 'auto')")
        self.options = check_preset(preset, dtype=dtype, attention=attention, mask_dtype=mask_dtype,
                                    cu_seq_lens_dtype=cu_seq_lens_dtype)
        self.rows = self.options["preset"] is CollationPreset.SHIFTED if rows is None else bool(rows)

    def width(self, longest: int) -> int:
        """The pad length of a microbatch whose longest sample has ``longest`` tokens."""
        from ..batching.plans.config import PadPolicy

        if self.config.pad_policy is not PadPolicy.PAD_TO_BUCKET:
            return longest
        spec = self.config.bucket_spec
        bucket = int(spec.bucket_ids(np.array([longest], dtype=np.uint32))[0])
        return int(spec.max_lengths[bucket]) if bucket >= 0 else longest

    def __call__(self, items: list) -> dict:
        import torch

        from ..batching.collate import collate_arrays
        from ..batching.presets import apply_preset

        rows = [item[0] for item in items]
        if self.config.pack is not None:
            batch = self._packed(items, self.config.pack.max_length)
        else:
            ids = [item[1] for item in items]
            masks = [item[2] for item in items]
            batch = collate_arrays(ids, masks, self.width(max(len(row) for row in ids)), pad_id=self.pad_id)
        arrays = apply_preset(batch, **self.options)
        tensors = {name: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
                   for name, value in arrays.items()}
        if self.rows:
            tensors["rows"] = torch.tensor(rows, dtype=torch.int64)
        return tensors

    def _packed(self, items: list, width: int):
        from ..batching.collate import collate_arrays, collate_error
        from ..batching.packing.rows import pack_rows

        if any(len(item) != 4 for item in items):
            raise collate_error("a packed plan's items carry their packed row: wrap the sampler in "
                                "PackedBatchSampler and index a TokenDataset")
        grouped: list[list[dict]] = []
        for row, ids, mask, k in items:
            if k == len(grouped):
                grouped.append([])
            grouped[-1].append({"sample_id": str(row), "input_ids": ids, "loss_mask": mask})
        built = pack_rows(grouped, self.separator_ids, max_length=width)
        return collate_arrays([r.input_ids for r in built], [r.loss_mask for r in built], width, pad_id=self.pad_id,
                              max_len=width, segment_ids=[r.segment_ids for r in built],
                              position_ids=[r.position_ids for r in built])
