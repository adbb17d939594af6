"""Pretraining sequences in a ``DataLoader``: this rank's batches of samples and the samples as tensors.

What goes in: pretraining sequences (``umlos-cuda plan cut``, docs/batching.md "Pretraining
sequences") or a mixture of them (``plan cut --mix``), as a folder or a
:class:`~umlos_cuda.batching.plans.windows.PretrainingSequences` /
:class:`~umlos_cuda.batching.plans.windows.sequence_mixture.SequenceMixture`,
a batch size, a rank and a world size. What comes out: :class:`SequenceBatchSampler`, a
``batch_sampler`` whose items are lists of ``(epoch, k)`` keys, and :class:`SequenceDataset`,
whose item ``(epoch, k)`` is sample ``k`` of that epoch as tensors (``input_ids``, ``labels``,
``loss_mask``, ``position_ids``, ``segment_ids``), collated from the token source by the plan, its
``labels`` shifted; with ``preset="hf"``, what a ``transformers`` causal LM takes as ``model(**batch)``
(``input_ids``, unshifted ``labels``, ``position_ids``), which shifts the labels once itself.

The sampler is :class:`~umlos_cuda.torch.PlanBatchSampler` with the sample as the unit of the
cursor (the resume rule of windows/resume.py): from cursor ``c``, rank ``r`` of ``R`` takes the
samples ``k >= c`` with ``k mod R == r``, ``batch_size`` of them a batch, so every batch step
consumes ``batch_size x R`` consecutive samples, and ``state_dict()`` / ``PlanCursor.of`` are the
``plan`` cursor of the checkpoint store, restorable at any world size (a batch size other than
the saved one is allowed too: the cursor counts samples). The keys carry the epoch, so a worker
process needs nothing of the sampler's state.

The dataset opens the folder in each process that reads it (workers included): a mapped token
source is not sent through a pipe; given an opened plan, it is pickled as is.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from .. import checks, errors
from ..errors import UmlosError
from ._dist import argument_error, as_argument_error
from ._plan_sampler import PlanBatchSampler
from ._sampler_base import DatasetBase

#: The arrays of a sample the dataset hands out (``documents``, a list of rows, is left out: it does not stack).
TENSORS = ("input_ids", "labels", "loss_mask", "position_ids", "segment_ids")
#: The conventions a sample is handed out in (:class:`SequenceDataset`).
PRESETS = ("shifted", "hf")


def _open(sequences):
    """A :class:`PretrainingSequences` or a :class:`SequenceMixture` from itself or its folder (by its marker;
    PLAN_NOT_FOUND for anything else)."""
    from ..batching.plans.windows import PretrainingSequences
    from ..batching.plans.windows.sequence_mixture import SequenceMixture
    from ..batching.plans.kinds import plan_kind_of

    if isinstance(sequences, (PretrainingSequences, SequenceMixture)):
        return sequences
    if not isinstance(sequences, (str, os.PathLike)):
        raise argument_error(errors.PLAN_NOT_FOUND, "sequences must be PretrainingSequences, a SequenceMixture or "
                                                    f"their folder, got {type(sequences).__name__}")
    kind = plan_kind_of(sequences)
    if kind.unit != "sample":
        raise argument_error(errors.PLAN_NOT_FOUND, f"{os.fspath(sequences)} is a {kind.name}, not pretraining "
                                                    "sequences or a mixture of them")
    return kind.open(sequences)


class SequenceBatchSampler(PlanBatchSampler):
    """``batch_sampler`` over pretraining sequences (see the module docstring).

    Args:
        sequences: a :class:`~umlos_cuda.batching.plans.windows.PretrainingSequences`, a mixture of them
            (``SequenceMixture``) or either's folder.
        batch_size: samples a batch of this rank (the last of an epoch may be short).
        rank, world_size: as :class:`~umlos_cuda.torch.PlanBatchSampler`.
        epoch, sample_index: the starting cursor (default 0, 0).
    """

    _items = "batches of samples"

    def __init__(self, sequences, batch_size: int, rank: int | None = None, world_size: int | None = None, *,
                 epoch: int = 0, sample_index: int = 0) -> None:
        try:
            self.batch_size = checks.integer(batch_size, "batch_size", 1, None, fail=lambda message: argument_error(
                errors.BATCHING_CONFIG_INVALID, message), message=checks.AT_LEAST)
        except UmlosError as exc:
            raise as_argument_error(exc) from None
        super().__init__(sequences, rank, world_size, epoch=epoch, microbatch_index=sample_index)

    @staticmethod
    def _open_plan(plan):
        return _open(plan)

    def __len__(self) -> int:
        """Batches this rank yields from the cursor to the end of its epoch: ``ceil(steps_remaining /
        batch_size)`` on every rank but one whose samples ran out a batch early (it yields no empty batch)."""
        return -(-len(self._mine(self.epoch, self.microbatch_index)) // self.batch_size)

    @property
    def batches_remaining(self) -> int:
        """Batch steps from the cursor to the end of its epoch, the same on every rank (for the last collective)."""
        return -(-self.steps_remaining // self.batch_size)

    def _steps(self, batches: int) -> int:
        return batches * self.batch_size

    def _generate(self, epoch: int, start: int, owner: object) -> Iterator[list[Any]]:
        mine = self._mine(epoch, start)
        steps = self.steps_from(epoch, start)
        for batch, first in enumerate(range(0, len(mine), self.batch_size)):
            keys = [(epoch, k) for k in mine[first:first + self.batch_size]]
            if self._owner is owner:
                self.epoch, self.microbatch_index = self._after(epoch, start, min(steps, first + self.batch_size))
                self._handed = batch + 1
                if batch == 0:
                    self._link = self._loader_link()
            self.last_microbatch = {"epoch": epoch, "index": keys[0][1]}
            yield keys
        if self._owner is owner:  # a rank whose samples ran out a batch early ends the epoch too
            self.epoch, self.microbatch_index = self._after(epoch, start, steps)


class SequenceDataset(DatasetBase):
    """Map-style dataset of pretraining sequences: item ``(epoch, k)`` is sample ``k`` of ``epoch`` as a dict of
    tensors, collated from ``tokens`` (default: the plan's token source), in the convention ``preset`` names:

    * ``shifted`` (default): int64/uint8/int32 tensors (:data:`TENSORS`), ``labels[t]`` the token that position
      ``t`` predicts (the next one), to be weighted by ``loss_mask``; a loop computes
      ``cross_entropy(logits, labels)`` itself, with no further shift. Over a mixture (one epoch) a sample also
      holds ``component``, the index of the dataset it came from.
    * ``hf``: what a ``transformers`` causal LM takes as ``model(**batch)``, which shifts its ``labels`` once
      itself: ``input_ids``, ``labels`` and ``position_ids``, int64 ``[L]``, the labels unshifted
      (:func:`hf_labels`). There is no ``attention_mask``: ``transformers`` finds the sample's documents from the
      restarting ``position_ids`` (the forward must run without a cache, ``use_cache=False``). A model shifting
      ``L`` labels trains ``L - 1`` predictions: the last one (the next sample's first token) is not trained,
      as in ``transformers``' own grouped-text recipe.
    """

    def __init__(self, sequences, *, tokens=None, preset: str = "shifted") -> None:
        from ..batching.presets import preset_error

        self._given = sequences
        self._tokens = tokens
        self._plan = _open(sequences)
        self.preset = checks.choice(preset, "preset", PRESETS, fail=preset_error)

    def __getstate__(self) -> dict:
        opened = not isinstance(self._given, (str, os.PathLike))
        return {"given": self._given, "tokens": self._tokens, "plan": self._plan if opened else None,
                "preset": self.preset}

    def __setstate__(self, state: dict) -> None:
        self._given, self._tokens, self.preset = state["given"], state["tokens"], state["preset"]
        self._plan = state["plan"] if state["plan"] is not None else _open(self._given)

    @property
    def plan(self):
        return self._plan

    def __len__(self) -> int:
        """The samples of epoch 0 (a key names its epoch: every epoch's samples are items)."""
        return self._plan.epoch_microbatches(0)

    def __getitem__(self, key) -> dict:
        import torch

        epoch, k = key
        mixture = hasattr(self._plan, "components")  # one epoch, its samples numbered across datasets
        if mixture:
            self._plan.epoch_microbatches(int(epoch))  # PLAN_CURSOR_INVALID unless epoch 0
            sample = self._plan.sample(int(k), self._tokens)
        else:
            sample = self._plan.sample(int(epoch), int(k), self._tokens)
        if self.preset == "hf":
            return {"input_ids": torch.from_numpy(sample["input_ids"]),
                    "labels": torch.from_numpy(hf_labels(sample["labels"], sample["loss_mask"])),
                    "position_ids": torch.from_numpy(sample["position_ids"])}
        tensors = {name: torch.from_numpy(sample[name]) for name in TENSORS}
        if mixture:
            tensors["component"] = torch.tensor(sample["component"])
        return tensors


def hf_labels(labels: np.ndarray, loss_mask: np.ndarray) -> np.ndarray:
    """The ``hf`` labels of a sample's shifted ``labels`` and ``loss_mask``: moved one position right, -100 at
    position 0 and wherever the shifted label is not trained on (loss mask 0, or -100 already), so that a model
    which shifts them gets ``labels[t]`` at position ``t`` exactly where the loss mask keeps it."""
    from ..batching.presets import IGNORE_INDEX, unshifted_labels

    return unshifted_labels(np.where(np.asarray(loss_mask) != 0, labels, IGNORE_INDEX))
