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
plan's row length. A plan whose over-long policy cuts samples hands out
:class:`~umlos_cuda.torch.PlanKey` keys, and the collator cuts each row to
the key's token range (``_plan_keys.py``). A plan of preference pairs is
collated as its rows (chosen, rejected alternating), or with
``pairs=True`` as ``chosen_*`` and ``rejected_*`` tensors.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._plan_keys import PlanItem, PlanKey, as_item, takes_ranges, with_pack
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
        plan, :class:`PackedBatchSampler`), ``(row, input_ids, loss_mask, k)``;
        for a :class:`~umlos_cuda.torch.PlanKey` (a plan that cuts samples), a
        :class:`~umlos_cuda.torch.PlanItem`: the whole row and the range to cut."""
        if isinstance(key, PlanKey):
            ids, mask = self.source.arrays(int(key.row))
            return PlanItem(int(key.row), ids, mask, key.pack, (int(key.start), int(key.stop)))
        if isinstance(key, tuple):
            row, k = key
            return (*self[row], int(k))
        ids, mask = self.source.arrays(int(key))
        return int(key), ids, mask

    def __getitems__(self, keys: list) -> list:
        """The items of one microbatch, ``[self[key] for key in keys]``: what a ``DataLoader`` with a
        ``batch_sampler`` asks for in one call (its fetcher uses ``__getitems__`` when the dataset has it). Plain
        rows of a source that reads many at once (``arrays_many``: a token store, a planned cache) are read in
        one call; other keys one at a time."""
        many = getattr(self.source, "arrays_many", None)
        if many is None or not all(type(key) is int or isinstance(key, np.integer) for key in keys):
            return [self[key] for key in keys]
        rows = [int(key) for key in keys]
        return [(row, ids, mask) for row, (ids, mask) in zip(rows, many(rows))]


class PackedBatchSampler:
    """``batch_sampler`` for a packed plan: the microbatches of a
    :class:`~umlos_cuda.torch.PlanBatchSampler` as ``(row, k)`` pairs, ``k``
    the packed row each sample belongs to (a plan that cuts samples: its
    :class:`~umlos_cuda.torch.PlanKey` keys with ``pack = k``). ``state_dict``,
    ``load_state_dict``, ``set_epoch`` and ``len()`` are the wrapped
    sampler's (``sampler``)."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler

    def __iter__(self):
        for rows in self.sampler:
            last = self.sampler.last_microbatch
            sizes = self.sampler.microbatch(last["epoch"], last["index"]).pack_sizes
            packs = np.repeat(np.arange(len(sizes)), sizes) if sizes is not None else np.arange(len(rows))
            yield [with_pack(key, k) for key, k in zip(rows, packs.tolist())]

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
    and ``separator_ids`` are the plan's separator tokens. For a plan whose
    over-long policy cuts samples, items carry the token range the plan takes
    (:class:`~umlos_cuda.torch.PlanKey` keys, which ``PlanBatchSampler`` hands
    out) and the collator cuts it as ``collate_microbatch`` does; a whole row
    of such a plan is refused, never collated uncut.

    ``pairs=True`` (a plan of preference pairs, ``group_size`` 2, not packed):
    the preset's tensors of each side, ``chosen_<name>`` and
    ``rejected_<name>``, pair ``i`` in row ``i`` of both, one width
    (:func:`~umlos_cuda.batching.preference.split_pairs` of the collated
    microbatch; ``collate_preference_microbatch`` for ``shifted``).
    """

    def __init__(self, plan: Any, *, pad_id: int = 0, separator_ids=(), preset: str = "shifted", dtype: Any = None,
                 attention: str = "auto", mask_dtype: str = "bool", cu_seq_lens_dtype: Any = "int32",
                 rows: bool | None = None, pairs: bool = False) -> None:
        from ..batching.plans.config import BatchingConfig
        from ..batching.plans.kinds import open_row_plan

        if isinstance(plan, BatchingConfig):
            self.config = plan
        else:
            opened = plan if hasattr(plan, "config") else open_row_plan(plan, "PlanCollator")
            self.config = opened.config
        self.pad_id = pad_id
        from ..batching.collate import collate_error, plan_separator_ids

        #: The over-long policy when it cuts samples (then every item carries its token range), else None.
        self.cut = self.config.overlong if takes_ranges(self.config) else None
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
        self.pairs = bool(pairs)
        if self.pairs and getattr(self.config, "group_size", 1) != 2:
            raise collate_error("pairs=True takes a plan of preference pairs (group_size 2, built from a length cache "
                                "of pairs); this plan's microbatches are single rows")
        if self.pairs and self.config.pack is not None:
            raise collate_error("a packed plan of pairs keeps each pair inside one packed row (segments 2k and "
                                "2k + 1), so it has no row per side: collate it without pairs=True and read its "
                                "segments")

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

        parts = self._items(items)
        if self.config.pack is not None:
            batch = self._packed(parts, self.config.pack.max_length)
        else:
            ids = [part.input_ids for part in parts]
            masks = [part.loss_mask for part in parts]
            batch = collate_arrays(ids, masks, self.width(max(len(row) for row in ids)), pad_id=self.pad_id)
        if self.pairs:
            from ..batching.preference import SIDES, split_pairs

            sides = split_pairs(batch)
            arrays = {f"{side}_{name}": value for side in SIDES
                      for name, value in apply_preset(getattr(sides, side), **self.options).items()}
        else:
            arrays = apply_preset(batch, **self.options)
        tensors = {name: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
                   for name, value in arrays.items()}
        if self.rows:
            tensors["rows"] = torch.tensor([part.row for part in parts], dtype=torch.int64)
        return tensors

    def _items(self, items: list) -> list[PlanItem]:
        """The items as :class:`PlanItem`, each cut to its token range; COLLATE_INPUT_INVALID for an item that is
        no :class:`TokenDataset` item, a whole row of a plan that cuts samples, or rows that are not pairs."""
        from ..batching.collate import collate_error, take_span

        parts = []
        for index, item in enumerate(items):
            part = as_item(item)
            if part is None:
                raise collate_error(f"item {index} is {type(item).__name__}; PlanCollator takes TokenDataset items "
                                    "(row, input_ids, loss_mask[, packed row])")
            if part.span is not None:
                ids, mask = take_span(part.input_ids, part.loss_mask, part.row, part.span)
                part = part._replace(input_ids=ids, loss_mask=mask)
            elif self.cut is not None:
                raise collate_error(f"row {part.row} came whole, and this plan takes a token range of each sample "
                                    f"(over-long policy {self.cut.policy.value}, max_length {self.cut.max_length}): "
                                    "index the TokenDataset with PlanBatchSampler's keys (PlanKey), which carry the "
                                    "range")
            parts.append(part)
        if self.pairs:
            rows = [part.row for part in parts]
            if len(rows) % 2 or any(rows[k] % 2 or rows[k + 1] != rows[k] + 1 for k in range(0, len(rows) - 1, 2)):
                raise collate_error(f"a microbatch of pairs holds rows 2p, 2p + 1 side by side (chosen, rejected); "
                                    f"these items hold rows {rows[:8]}{' ...' if len(rows) > 8 else ''}: batch them "
                                    "with PlanBatchSampler over the plan of pairs")
        return parts

    def _packed(self, parts: list[PlanItem], width: int):
        from ..batching.collate import collate_arrays, collate_error
        from ..batching.packing.rows import pack_rows

        if any(part.pack is None for part in parts):
            raise collate_error("a packed plan's items carry their packed row: wrap the sampler in "
                                "PackedBatchSampler and index a TokenDataset")
        grouped: list[list[dict]] = []
        for part in parts:
            if part.pack == len(grouped):
                grouped.append([])
            grouped[-1].append({"sample_id": str(part.row), "input_ids": part.input_ids, "loss_mask": part.loss_mask})
        built = pack_rows(grouped, self.separator_ids, max_length=width)
        return collate_arrays([r.input_ids for r in built], [r.loss_mask for r in built], width, pad_id=self.pad_id,
                              max_len=width, segment_ids=[r.segment_ids for r in built],
                              position_ids=[r.position_ids for r in built])
