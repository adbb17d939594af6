"""A batch plan as the data source of a ``transformers.Trainer``, its cursor in the Trainer's checkpoints.

``transformers.Trainer`` builds its training ``DataLoader`` itself, from
``per_device_train_batch_size`` and a sampler over single samples; a plan's
microbatches (token-budgeted, so of varying row counts) cannot be handed in
through its arguments. So the data source is a mixin over the Trainer
class (:func:`plan_trainer_class`): its ``get_train_dataloader`` returns a
``DataLoader`` whose ``batch_sampler`` is the plan (:class:`PlanTrainerData`)
and whose ``collate_fn`` is :class:`~umlos_cuda.torch.PlanCollator`. Each
plan microbatch is one Trainer batch (one forward and backward);
``gradient_accumulation_steps`` microbatches make one optimizer step, their
loss weighted by the trained tokens of all of them (the Trainer's
``num_items_in_batch``). ``per_device_train_batch_size`` must be 1: the
Trainer multiplies it into the sizes it logs, and a batch is a microbatch.

One Trainer epoch is the whole plan, every plan epoch in turn: the
Trainer's resume arithmetic (``global_step // steps_per_epoch``) assumes
epochs of one length, and a plan's epochs may differ (a packed plan packs
each epoch's order anew); run ``max_steps`` steps or ``num_train_epochs=1``.

**Resume.** The plan cursor is written into each checkpoint folder
(``checkpoint-N/plan_cursor.json``, the sampler's ``state_dict()`` format,
through the atomic writer), before the Trainer writes the checkpoint (when
``control.should_save`` is set at the step's end), or on ``on_save`` for a
save decided later (``save_strategy="best"``), so a checkpoint the Trainer
completed always has its cursor. ``train(resume_from_checkpoint=...)``
loads it into the sampler first; the Trainer's own skip of the first
batches is switched off (``ignore_data_skip=True``), since the restored
cursor already stands after them and skipping again would drop
``global_step * gradient_accumulation_steps`` more. Restoring the cursor
rather than letting the Trainer skip over a sampler started at 0 is the
choice because the skip counts steps within a Trainer epoch of a fixed
length (wrong when plan epochs differ in length), and it walks every
skipped microbatch; the cursor is exact at any epoch length and O(1).

The cursor counts the microbatches the Trainer trained on
(``training_step`` calls), not those the sampler handed out, so
``dataloader_num_workers`` (whose workers fetch ahead) changes nothing.
``transformers`` is imported only when a class is built.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

#: The cursor's file in a Trainer checkpoint folder.
CURSOR_FILE = "plan_cursor.json"

#: Trainer classes built by :func:`plan_trainer_class`, one per base.
_CLASSES: dict[type, type] = {}


#: The longest plan_cursor.json read: the file is a few hundred bytes.
MAX_CURSOR_BYTES = 1 << 16

def _own_dataset(plan: Any) -> Any:
    """The token dataset a plan records (a mixed plan's components); INVALID_ARGUMENT for a plan that records none."""
    dataset = getattr(plan, "dataset", None)
    if not callable(dataset):
        from .. import errors
        from ._dist import argument_error

        raise argument_error(errors.INVALID_ARGUMENT, "give store=: the token store (or Megatron prefix) this plan "
                                                      "was built from; only a mixed plan records its own")
    return dataset()


class PlanTrainerData:
    """The plan, its token dataset and its collator, as one Trainer data source.

    Iterating it is the ``batch_sampler`` of the Trainer's ``DataLoader``:
    the plan's microbatches from the sampler's cursor through the plan's
    last epoch. Its ``len()`` is this rank's microbatches over the whole
    plan, whatever the cursor, so that the Trainer's step arithmetic is the
    same in a fresh and in a resumed run.

    Args:
        plan: a plan of dataset rows (:class:`~umlos_cuda.torch.PlanBatchSampler` takes it) or its folder.
        store: the token store (or Megatron prefix) the plan was built from, another being refused
            (BATCH_STORE_MISMATCH, :class:`~umlos_cuda.torch.TokenDataset`'s ``plan``); default (None), for a
            mixed plan, its components' recorded token sources one after another (``plan.dataset()``).
        rank, world_size: as :class:`~umlos_cuda.torch.PlanBatchSampler`.
        tokenizer_hash: for a Megatron prefix, as :class:`~umlos_cuda.torch.TokenDataset`.
        **collator: :class:`~umlos_cuda.torch.PlanCollator`'s options (default ``preset="hf"``).
    """

    def __init__(self, plan: Any, store: Any = None, *, rank: int | None = None, world_size: int | None = None,
                 tokenizer_hash: str | None = None, **collator: Any) -> None:
        from ._plan_collate import PackedBatchSampler, PlanCollator, TokenDataset
        from ._plan_sampler import PlanBatchSampler

        self.sampler = PlanBatchSampler(plan, rank, world_size)
        self.plan = self.sampler.plan
        self._check_lockstep()
        if store is None:
            store = _own_dataset(self.plan)
        self.dataset = TokenDataset(store, tokenizer_hash=tokenizer_hash, plan=self.plan)  # the store checked
        collator.setdefault("preset", "hf")
        self.collator = PlanCollator(self.plan, **collator)
        self._batches = PackedBatchSampler(self.sampler) if self.plan.config.pack is not None else self.sampler
        #: The cursor the counting starts from, and the microbatches the loop trained on since.
        self._start = (self.sampler.epoch, self.sampler.microbatch_index)
        self.consumed = 0

    def _check_lockstep(self) -> None:
        """Refuse a world size that leaves some rank without a microbatch in an epoch's last step: the Trainer
        has no empty step, so that rank would take the next epoch's first microbatch while the others take
        this epoch's last, and the ranks would train out of step (a plain loop handles it with
        ``PlanBatchSampler.steps_remaining``)."""
        world = self.sampler.world_size
        uneven = [(epoch, self.plan.epoch_microbatches(epoch)) for epoch in range(self.plan.num_epochs)
                  if self.plan.epoch_microbatches(epoch) % world]
        if uneven:
            from .. import errors
            from ._dist import argument_error

            epoch, count = uneven[0]
            raise argument_error(errors.INVALID_ARGUMENT,
                                 f"epoch {epoch} of the plan has {count} microbatches, not a multiple of the "
                                 f"world size {world}: under the Trainer every rank takes one microbatch per step, "
                                 "so the ranks would go out of step at the epoch's end; run at a world size that "
                                 "divides every epoch's microbatch count (umlos-cuda plan info shows them), or "
                                 "use a plain loop with PlanBatchSampler.steps_remaining")

    def __iter__(self) -> Iterator[list]:
        last = self.plan.num_epochs - 1
        while not self._ended(last):
            yield from self._batches  # one pass: to the end of the cursor's epoch, which moves to the next

    def _ended(self, last: int) -> bool:
        sampler = self.sampler
        return sampler.epoch == last and sampler.microbatch_index >= self.plan.epoch_microbatches(last)

    def __len__(self) -> int:
        return sum(self._mine(epoch, 0) for epoch in range(self.plan.num_epochs))

    def _mine(self, epoch: int, start: int) -> int:
        """This rank's microbatches of ``epoch`` from global index ``start`` (the sampler's sharding)."""
        world, rank = self.sampler.world_size, self.sampler.rank
        return len(range(start + (rank - start) % world, self.plan.epoch_microbatches(epoch), world))

    def cursor(self) -> tuple[int, int]:
        """``(epoch, microbatch_index)`` after the microbatches trained on: :attr:`consumed` of this rank's
        microbatches from the start cursor, ``world_size`` global microbatches each."""
        epoch, index = self._start
        left = self.consumed
        while True:
            mine = self._mine(epoch, index)
            if left < mine:
                return epoch, index + left * self.sampler.world_size
            left -= mine
            if epoch + 1 >= self.plan.num_epochs:
                return epoch, self.plan.epoch_microbatches(epoch)
            epoch, index = epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        """The cursor of :meth:`cursor` in :meth:`PlanBatchSampler.state_dict`'s format."""
        epoch, index = self.cursor()
        from ._plan_sampler import STATE_FORMAT

        return {"format": STATE_FORMAT, "plan_fingerprint": self.sampler.fingerprint, "epoch": epoch,
                "microbatch_index": index, "world_size": self.sampler.world_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a cursor (checked by the sampler: same plan, inside it); counting restarts there."""
        self.sampler.load_state_dict(state)
        self._start = (self.sampler.epoch, self.sampler.microbatch_index)
        self.consumed = 0

    def save(self, folder: str) -> str:
        """Write the cursor to ``folder/plan_cursor.json`` (atomically; the folder is created)."""
        from ..files.atomic import atomic_output

        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, CURSOR_FILE)
        data = (json.dumps(self.state_dict(), sort_keys=True) + "\n").encode()
        with atomic_output(path, force=True, size=len(data)) as handle:
            handle.write(data)
        return path

    def load(self, folder: str) -> None:
        """Restore the cursor a checkpoint folder holds (PLAN_CURSOR_INVALID when it has none)."""
        from .. import errors
        from ..files import reader
        from ._dist import argument_error

        path = os.path.join(folder, CURSOR_FILE)

        def invalid(message: str) -> errors.UmlosError:
            return argument_error(errors.PLAN_CURSOR_INVALID, f"{message} (not a plan cursor)")

        try:  # the bounded reader: a regular file, size and depth capped before parsing
            state = reader.read_json(path, invalid, max_bytes=MAX_CURSOR_BYTES, what="plan cursor")
        except FileNotFoundError:
            raise argument_error(errors.PLAN_CURSOR_INVALID,
                                 f"{folder} has no {CURSOR_FILE}: it was not written by a Trainer built with "
                                 "plan_trainer_class, so where its run stood in the plan is unknown") from None
        if not isinstance(state, dict):
            raise invalid(f"{path} holds a JSON {type(state).__name__}, not an object")
        try:
            self.load_state_dict(state)
        except errors.UmlosError as exc:  # the sampler's refusal, said of the file it came from
            raise argument_error(exc.code, f"{path}: {exc.message}") from None


def plan_trainer_class(base: type | None = None) -> type:
    """A subclass of ``base`` (default ``transformers.Trainer``; ``trl.SFTTrainer`` works too) that takes
    ``plan_data=PlanTrainerData(...)`` and trains on it, the cursor in its checkpoints (module docstring)."""
    if base is None:
        from transformers import Trainer

        base = Trainer
    if base not in _CLASSES:
        _CLASSES[base] = type(f"Plan{base.__name__}", (_PlanTrainerMixin, base), {"__module__": __name__})
    return _CLASSES[base]


#: The mixin's base, typed as ``Any``: its methods call the Trainer's (``self.args``, ``super().train``), which
#: come after it in the built class's MRO, not from this base.
_TrainerMethods: Any = object


class _PlanTrainerMixin(_TrainerMethods):
    """The methods :func:`plan_trainer_class` puts before the Trainer's."""

    def __init__(self, *args: Any, plan_data: PlanTrainerData, **kwargs: Any) -> None:
        from .. import errors
        from ._dist import argument_error

        kwargs.setdefault("train_dataset", plan_data.dataset)
        kwargs.setdefault("data_collator", plan_data.collator)
        super().__init__(*args, **kwargs)
        if self.args.per_device_train_batch_size != 1:
            raise argument_error(errors.INVALID_ARGUMENT,
                                 f"per_device_train_batch_size is {self.args.per_device_train_batch_size}; with a plan "
                                 "as the data source each batch is one plan microbatch (its rows set by the plan's "
                                 "token budget): give per_device_train_batch_size=1 and gradient_accumulation_steps "
                                 "for more microbatches per optimizer step")
        self.plan_data = plan_data
        self.args.ignore_data_skip = True  # the restored cursor stands after the trained microbatches already
        self.add_callback(_cursor_callback()(plan_data))

    def get_train_dataloader(self):
        from torch.utils.data import DataLoader

        args = self.args
        workers = args.dataloader_num_workers
        options = {"prefetch_factor": args.dataloader_prefetch_factor,
                   "persistent_workers": args.dataloader_persistent_workers,
                   "multiprocessing_context": args.dataloader_multiprocessing_context} if workers else {}
        return DataLoader(self.plan_data.dataset, batch_sampler=self.plan_data, collate_fn=self.plan_data.collator,
                          num_workers=workers, pin_memory=args.dataloader_pin_memory, **options)

    def training_step(self, *args: Any, **kwargs: Any):
        loss = super().training_step(*args, **kwargs)
        self.plan_data.consumed += 1
        return loss

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any):
        if resume_from_checkpoint is True:
            from transformers.trainer_utils import get_last_checkpoint

            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(f"No valid checkpoint found in output directory ({self.args.output_dir})")
        if resume_from_checkpoint:
            self.plan_data.load(os.fspath(str(resume_from_checkpoint)))
        return super().train(resume_from_checkpoint or None, *args, **kwargs)


def _cursor_callback() -> type:
    """The ``TrainerCallback`` that writes the cursor into each checkpoint folder (built on first use, so that
    importing this module does not import ``transformers``)."""
    global _CursorCallback
    if _CursorCallback is None:
        from transformers import TrainerCallback
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        class CursorCallback(TrainerCallback):
            def __init__(self, data: PlanTrainerData) -> None:
                self.data = data
                self.written: tuple[int, int] | None = None  # (global_step, consumed) of the last write

            def _write(self, args, state) -> None:
                if args.should_save and self.written != (state.global_step, self.data.consumed):
                    self.data.save(os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"))
                    self.written = (state.global_step, self.data.consumed)

            def on_step_end(self, args, state, control, **kwargs):
                if control.should_save:  # before the Trainer writes the checkpoint
                    self._write(args, state)

            def on_epoch_end(self, args, state, control, **kwargs):
                if control.should_save:
                    self._write(args, state)

            def on_save(self, args, state, control, **kwargs):  # a save decided after the step's end
                self._write(args, state)

        _CursorCallback = CursorCallback
    return _CursorCallback


_CursorCallback: type | None = None
