"""One evaluation over a plan: every microbatch of one epoch once, the same microbatches at every world size.

What goes in: a plan (a validation plan, ``umlos-cuda plan build --split
validation``; any plan of dataset rows), its token store, a rank and a
world size. What comes out: :class:`PlanEvalData`, a ``batch_sampler`` for
a ``DataLoader`` (its ``dataset`` and ``collate_fn`` beside it) that hands
rank ``r`` of ``W`` the plan's global microbatches ``i = r, r + W, ...``
of the evaluated epoch (the plan's sharding, the one :class:`PlanBatchSampler`
uses), from the first every time it is iterated: an evaluation depends on
the plan alone, not on a cursor or on the world size.

Every rank takes the same number of steps, ``ceil(M / W)`` for ``M``
microbatches, since a collective inside the evaluation (the Trainer's
gather of the losses) waits for every rank. When ``W`` does not divide
``M``, the ranks without a microbatch in the last step take masked
padding, as :class:`~umlos_cuda.torch.DistributedEvalSampler` does: the
keys of the rank's first microbatch (the epoch's first for a rank that has
none) as :class:`~umlos_cuda.torch.Padding` (so the tensors have the
shapes of a real microbatch, and a pre-sharded plan is read at its own
rank only), every label set
to -100 and every loss mask to 0, and the batch marked
``batch[EVAL_PADDING] = True`` (False on every real one), for the loop to
leave its loss out (the Trainer integration makes it NaN, which the
Trainer's ``logging_nan_inf_filter`` drops from ``eval_loss``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .. import errors
from ..batching.presets import IGNORE_INDEX
from ._dist import argument_error
from ._padding import MaskedDataset, Padding

#: The key of a collated evaluation batch that says it is masked padding (a plain bool: not a model input).
EVAL_PADDING = "plan_padding"


def recorded_dataset(plan: Any) -> Any:
    """The token dataset a plan records (a mixed plan's components, one after another); INVALID_ARGUMENT for a
    plan that records none (a plan of one store names it by its identity only, so the store is given)."""
    dataset = getattr(plan, "dataset", None)
    if not callable(dataset):
        raise argument_error(errors.INVALID_ARGUMENT, "give store=: the token store (or Megatron prefix) this plan "
                                                      "was built from; only a mixed plan records its own")
    return dataset()


class PlanEvalData:
    """An evaluation data source over a plan (see the module docstring).

    Args:
        plan: a plan of dataset rows (whole or windowed) or its folder, such as
            ``plan build --split validation``'s.
        store: the token store (or Megatron prefix) the plan was built from, another being refused
            (BATCH_STORE_MISMATCH); default (None), for a mixed plan, its components' recorded token sources.
        rank, world_size: as :class:`~umlos_cuda.torch.PlanBatchSampler`.
        epoch: the plan epoch evaluated (default 0).
        tokenizer_hash: for a Megatron prefix, as :class:`~umlos_cuda.torch.TokenDataset`.
        **collator: :class:`~umlos_cuda.torch.PlanCollator`'s options (default ``preset="hf"``).
    """

    def __init__(self, plan: Any, store: Any = None, *, rank: int | None = None, world_size: int | None = None,
                 epoch: int = 0, tokenizer_hash: str | None = None, **collator: Any) -> None:
        from ._plan_collate import PlanCollator, TokenDataset
        from ._plan_sampler import PlanBatchSampler

        opened = PlanBatchSampler(plan, rank, world_size, epoch=epoch)  # opens, checks the layout and the epoch
        self.plan, self.rank, self.world_size, self.epoch = opened.plan, opened.rank, opened.world_size, opened.epoch
        #: The plan's global microbatches in the evaluated epoch.
        self.microbatches = self.plan.epoch_microbatches(self.epoch)
        if store is None:
            store = recorded_dataset(self.plan)
        self.dataset = MaskedDataset(TokenDataset(store, tokenizer_hash=tokenizer_hash, plan=self.plan))
        collator.setdefault("preset", "hf")
        self.collator = PlanCollator(self.plan, **collator)
        self.collate_fn = MaskedPlanCollate(self.collator)

    def __len__(self) -> int:
        """Steps of one evaluation, the same on every rank: ``ceil(M / W)``."""
        return -(-self.microbatches // self.world_size)

    @property
    def padded(self) -> bool:
        """True when some rank takes masked padding in the last step (``W`` does not divide ``M``)."""
        return self.microbatches % self.world_size != 0

    def __iter__(self) -> Iterator[list]:
        taken, first = 0, None
        for keys in self._pass(self.rank, self.world_size):
            taken, first = taken + 1, keys if first is None else first
            yield keys
        if taken < len(self):  # this rank's first microbatch, or the epoch's when it has none (W > M)
            fill = first if first is not None else next(iter(self._pass(0, 1)))
            for _ in range(len(self) - taken):
                yield [Padding(key) for key in fill]

    def _pass(self, rank: int, world_size: int) -> Iterator[list]:
        """The keys of this rank's microbatches of the epoch, from a sampler of their own (no cursor is shared)."""
        from ._plan_collate import PackedBatchSampler
        from ._plan_sampler import PlanBatchSampler

        sampler = PlanBatchSampler(self.plan, rank, world_size, epoch=self.epoch)
        return iter(PackedBatchSampler(sampler) if self.plan.config.pack is not None else sampler)


class MaskedPlanCollate:
    """The ``collate_fn`` of :class:`PlanEvalData`: :class:`~umlos_cuda.torch.MaskedDataset` items collated by the
    plan's collator; a padding step masked (labels -100, loss masks 0) and every batch marked (:data:`EVAL_PADDING`)."""

    def __init__(self, collator: Any) -> None:
        self.collator = collator

    def __call__(self, items: list) -> dict:
        import torch

        valid = {bool(real) for _, real in items}
        if len(valid) != 1:
            raise argument_error(errors.INVALID_ARGUMENT, "a batch of PlanEvalData is all real or all padding; this "
                                                          "one mixes both (batch it with PlanEvalData itself)")
        batch = self.collator([item for item, _ in items])
        padding = not valid.pop()
        if padding:
            for name, value in batch.items():
                if name == "labels" or name.endswith("_labels"):
                    batch[name] = torch.full_like(value, IGNORE_INDEX)
                elif name == "loss_mask" or name.endswith("_loss_mask"):
                    batch[name] = torch.zeros_like(value)
        batch[EVAL_PADDING] = padding
        return batch


def check_eval_layout(data: PlanEvalData, filters_nan: bool) -> None:
    """INVALID_ARGUMENT when ``data`` pads a rank and the loop would count the padding's loss (a Trainer with
    ``logging_nan_inf_filter=False`` averages the NaN into ``eval_loss``)."""
    if data.padded and not filters_nan:
        raise argument_error(errors.INVALID_ARGUMENT,
                             f"the evaluated epoch has {data.microbatches} microbatches, not a multiple of the world "
                             f"size {data.world_size}, so a rank takes masked padding in the last step, whose loss is "
                             "NaN; with logging_nan_inf_filter=False the Trainer would average that NaN into "
                             "eval_loss: keep logging_nan_inf_filter=True (the default), or run at a world size that "
                             "divides the microbatch count (umlos-cuda plan info shows it)")
