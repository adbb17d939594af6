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
``state.epoch`` is the cursor's place in the plan (:meth:`PlanTrainerData.progress`):
the Trainer's own value counts the batches of the current run only (its
skip is off), so after a resume it would leave out every microbatch
trained before.

**Tape.** ``plan_tape=store`` (a :class:`~umlos_cuda.checkpoint.CheckpointStore` whose run is started, on
rank 0; ``plan_tape=True`` on every other rank) records each optimizer step on the store's tape as
``plan.step`` records, the same as examples/train_ddp.py writes, through the same
:class:`~umlos_cuda.batching.plans.explain.StepRecorder`: each microbatch's global index (from the cursor,
:meth:`PlanTrainerData.next_unit`) and the dataset rows the collator handed it (the collator adds ``rows``,
which ``training_step`` takes out before the model sees the batch), gathered from every rank at the step's
end. The tape is committed (a commit of the tape alone) before the Trainer writes each checkpoint and at the
end of training, so ``umlos-cuda plan explain PLAN --check-tape STORE`` checks afterwards that the run trained
every microbatch of its plan once, each its plan's rows, across kills and resumes. A run killed after the tape's
commit and before the Trainer's checkpoint is written resumes from the checkpoint before, and its tape then
shows those steps twice (the check names the step).

**Evaluation.** ``eval_dataset=PlanEvalData(validation_plan, store)`` (or a
dict of them, or one given to ``evaluate``) is evaluated over that plan's
microbatches (``_plan_eval.py``): one epoch, every microbatch once, rank
``r`` of ``W`` the global microbatches ``i % W == r``, from the first at
every evaluation, so the microbatches and the gathered losses, in global
order, are the same at every world size; the Trainer's own evaluation loop
runs on them (``eval_loss`` is its mean of the microbatches' losses,
``compute_metrics`` works as usual). A rank without a microbatch in the
last step evaluates masked padding whose loss is NaN, left out by the
Trainer's ``logging_nan_inf_filter`` (required then).

``transformers`` is imported only when a class is built.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from ._plan_eval import EVAL_PADDING, PlanEvalData, check_eval_layout, recorded_dataset

__all__ = ["CURSOR_FILE", "EVAL_PADDING", "PlanEvalData", "PlanTrainerData", "plan_trainer_class"]

#: The cursor's file in a Trainer checkpoint folder.
CURSOR_FILE = "plan_cursor.json"

#: Trainer classes built by :func:`plan_trainer_class`, one per base.
_CLASSES: dict[type, type] = {}


#: The longest plan_cursor.json read: the file is a few hundred bytes.
MAX_CURSOR_BYTES = 1 << 16

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
            store = recorded_dataset(self.plan)
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

    def next_unit(self) -> tuple[int, int]:
        """``(epoch, global index)`` of the microbatch this rank trains next: the first at or after :meth:`cursor`
        that is this rank's (``index % world_size == rank``; every epoch's count is a multiple of the world size)."""
        epoch, index = self.cursor()
        return epoch, index + (self.sampler.rank - index) % self.sampler.world_size

    def progress(self) -> float:
        """The share of this rank's microbatches of the whole plan trained on, the cursor's place in the plan: the
        Trainer's ``state.epoch`` (one Trainer epoch is the whole plan), after a resume too."""
        epoch, index = self.cursor()
        done = sum(self._mine(e, 0) for e in range(epoch)) + self._mine(epoch, 0) - self._mine(epoch, index)
        return done / len(self)

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
    ``plan_data=PlanTrainerData(...)`` and trains on it, the cursor in its checkpoints, records its steps on a
    checkpoint store's tape given as ``plan_tape``, and evaluates a :class:`PlanEvalData` given as
    ``eval_dataset`` (module docstring)."""
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

    def __init__(self, *args: Any, plan_data: PlanTrainerData, plan_tape: Any = None, **kwargs: Any) -> None:
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
        cursor, epoch, tape = _callbacks()
        self.add_callback(cursor(plan_data))
        self.plan_steps = None if plan_tape is None else _step_recorder(plan_tape, plan_data)
        if self.plan_steps is not None:
            self.add_callback(tape(self.plan_steps, None if plan_tape is True else plan_tape))
        # first, so that every callback's on_step_end, the log and the checkpoint see the corrected epoch
        self.callback_handler.callbacks.insert(0, epoch(plan_data))
        _warn_token_counts(self, plan_data.collator)

    def _plan_loader(self, dataset: Any, batch_sampler: Any, collate_fn: Any):
        """A ``DataLoader`` over a plan's microbatches with the Trainer's loader arguments (not prepared by
        ``accelerate``: the batch sampler is this rank's share already)."""
        from torch.utils.data import DataLoader

        args = self.args
        workers = args.dataloader_num_workers
        options = {"prefetch_factor": args.dataloader_prefetch_factor,
                   "persistent_workers": args.dataloader_persistent_workers,
                   "multiprocessing_context": args.dataloader_multiprocessing_context} if workers else {}
        return DataLoader(dataset, batch_sampler=batch_sampler, collate_fn=collate_fn, num_workers=workers,
                          pin_memory=args.dataloader_pin_memory, **options)

    def get_train_dataloader(self):
        return self._plan_loader(self.plan_data.dataset, self.plan_data, self.plan_data.collator)

    def get_eval_dataloader(self, eval_dataset: Any = None):
        """A :class:`PlanEvalData` (as ``eval_dataset``, one of a dict of them, or given to ``evaluate``) is
        evaluated over its plan's microbatches; any other eval dataset as the base class does."""
        data = self.eval_dataset[eval_dataset] if isinstance(eval_dataset, str) else (
            eval_dataset if eval_dataset is not None else self.eval_dataset)
        if not isinstance(data, PlanEvalData):
            return super().get_eval_dataloader(eval_dataset)
        check_eval_layout(data, self.args.logging_nan_inf_filter)
        return self._plan_loader(data.dataset, data, data.collate_fn)

    def prediction_step(self, model: Any, inputs: dict, prediction_loss_only: bool, ignore_keys: Any = None):
        """The base class's. On a :class:`PlanEvalData` batch (it holds the padding mark, taken out here) the
        loss is the microbatch's own mean over its trained tokens, and NaN for a padding step, which the Trainer
        leaves out of ``eval_loss`` (``logging_nan_inf_filter``). ``average_tokens_across_devices`` is off for
        it: that divides each rank's loss sum by the tokens of every rank's microbatch in the step, so the value
        would depend on which microbatches share a step, which is the world size."""
        if EVAL_PADDING not in inputs:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
        padding = inputs.pop(EVAL_PADDING)
        averaging, self.args.average_tokens_across_devices = self.args.average_tokens_across_devices, False
        try:
            loss, logits, labels = super().prediction_step(model, inputs, prediction_loss_only,
                                                           ignore_keys=ignore_keys)
        finally:
            self.args.average_tokens_across_devices = averaging
        if padding and loss is not None:
            import torch

            loss = torch.full_like(loss, float("nan"))
        return loss, logits, labels

    def training_step(self, model: Any, inputs: dict, *args: Any, **kwargs: Any):
        if self.plan_steps is not None:  # the collator's rows: what this microbatch trains, for the tape
            rows = inputs.pop("rows")
            self.plan_steps.add(*self.plan_data.next_unit(), rows.tolist())
        loss = super().training_step(model, inputs, *args, **kwargs)
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


def _step_recorder(plan_tape: Any, plan_data: PlanTrainerData) -> Any:
    """The :class:`~umlos_cuda.batching.plans.explain.StepRecorder` of a Trainer given ``plan_tape`` (module
    docstring, "Tape"), the collator made to hand out each microbatch's ``rows``. INVALID_ARGUMENT for a
    ``plan_tape`` that is neither a checkpoint store whose run is started nor ``True`` on a rank other than 0."""
    from .. import errors
    from ..batching.plans.explain.tape import StepRecorder
    from ..checkpoint import CheckpointStore
    from ._dist import argument_error

    rank = plan_data.sampler.rank
    if plan_tape is True:
        if rank == 0:
            raise argument_error(errors.INVALID_ARGUMENT, "plan_tape=True is for ranks other than 0, which send their "
                                                          "steps to rank 0's; rank 0 gives the CheckpointStore")
        tape = None
    elif isinstance(plan_tape, CheckpointStore):
        if rank != 0:
            raise argument_error(errors.INVALID_ARGUMENT, f"rank {rank} was given a CheckpointStore as plan_tape: "
                                                          "rank 0 writes the tape; give plan_tape=True on the others")
        if plan_tape.tape.event_count == 0:
            raise argument_error(errors.INVALID_ARGUMENT, f"plan_tape {plan_tape.path}: start the run first "
                                                          "(store.start_run(...)), so that its steps can be committed")
        tape = plan_tape.tape
    else:
        raise argument_error(errors.INVALID_ARGUMENT, f"plan_tape is a {type(plan_tape).__name__}: give rank 0 the "
                                                      "CheckpointStore the steps are recorded in (True on other ranks)")
    plan_data.collator.rows = True
    return StepRecorder(tape, plan_data.sampler.fingerprint)


def _gathered(units: list) -> list:
    """Every rank's units of the step, on every rank (this rank's alone outside a process group of several)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return units
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, units)
    return [unit for part in parts for unit in part]


def _callbacks() -> tuple[type, type, type]:
    """The ``TrainerCallback`` classes (built on first use, so that importing this module does not import
    ``transformers``): one writes the cursor into each checkpoint folder, one sets ``state.epoch``, one records
    each step on the tape (``plan_tape``)."""
    global _classes
    if _classes is None:
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

        class EpochCallback(TrainerCallback):
            """``state.epoch`` from the cursor. The Trainer sets it to ``epoch + (step + 1) / steps_in_epoch``
            with ``step`` counted from this run's first batch, since its own skip is off
            (``ignore_data_skip``): after a resume that leaves out every microbatch trained before it."""

            def __init__(self, data: PlanTrainerData) -> None:
                self.data = data

            def on_step_end(self, args, state, control, **kwargs):
                state.epoch = self.data.progress()

        class TapeCallback(TrainerCallback):
            """At each step's end, the step's units on the tape (rank 0; the other ranks send theirs), and the
            tape committed before the Trainer writes a checkpoint, and at the end of training."""

            def __init__(self, recorder: Any, store: Any) -> None:
                self.recorder, self.store = recorder, store
                self.pending = False  # records appended since the last commit

            def _commit(self) -> None:
                if self.store is not None and self.pending:
                    self.store.commit()
                    self.pending = False

            def on_step_end(self, args, state, control, **kwargs):
                units = _gathered(self.recorder.units)
                if self.store is None:
                    self.recorder.units = []
                    return
                self.recorder.units = units
                self.pending |= bool(self.recorder.end_step(state.global_step))
                if control.should_save:
                    self._commit()

            def on_save(self, args, state, control, **kwargs):  # a save decided after the step's end
                self._commit()

            def on_train_end(self, args, state, control, **kwargs):
                self._commit()

        _classes = (CursorCallback, EpochCallback, TapeCallback)
    return _classes


_classes: tuple[type, type, type] | None = None


def _warn_token_counts(trainer: Any, collator: Any) -> None:
    """Warn when the Trainer would count tokens by summing a 4-D attention mask: TRL's ``SFTTrainer`` logs
    ``num_tokens`` as ``attention_mask.sum()``, the Trainer ``num_input_tokens_seen`` too under
    ``include_num_input_tokens_seen="non_padding"``; a ``[rows, 1, width, width]`` mask sums the pairs of tokens
    that attend to each other (about ``width / 2`` per token), not the tokens."""
    if collator.options.get("attention") != "4d" or collator.options["preset"].value != "hf":
        return
    counted = [name for name, counts in (
        ("TRL's num_tokens", hasattr(trainer, "_total_train_tokens")),  # SFTTrainer's running count
        ("num_input_tokens_seen", trainer.args.include_num_input_tokens_seen == "non_padding")) if counts]
    if counted:
        import warnings

        warnings.warn(f"{' and '.join(counted)} will be counted as attention_mask.sum(), and the hf preset's 4-D "
                      "mask (a packed plan) sums token pairs, not tokens: the count would be about width / 2 times "
                      "too high. Give PlanTrainerData preset='padding_free' (no attention_mask: the tokens are "
                      "counted as position_ids.size(1), exactly)", UserWarning, stacklevel=3)
