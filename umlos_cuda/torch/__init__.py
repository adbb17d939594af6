"""PyTorch integration: samplers backed by the NextBatch_v2 engine.

* :class:`DistributedSampler`: drop-in for ``torch.utils.data.DistributedSampler``
  (same arguments and defaults, padding included), with an O(num_blocks)
  shuffle and ``state_dict()`` that resumes mid-epoch at any world size.
* :class:`NextBatchSampler`: a ``batch_sampler`` yielding this rank's
  NextBatch_v2 micro-batches from a manifest; its state is the cursor.
* :class:`DistributedEvalSampler` with :class:`MaskedDataset`: exact
  distributed evaluation (every sample once, equal steps, masked padding).
* :class:`PlanBatchSampler` with :class:`TokenDataset` and :class:`PlanCollator`
  (and :class:`PackedBatchSampler` for a packed plan): plan microbatches from a
  token store, collated to int32 tensors, or to the tensors a ``transformers``
  model takes (``preset="hf"`` or ``"padding_free"``; docs/batching.md); a plan
  that truncates or splits samples hands out :class:`PlanKey` keys, which
  carry the token range the collator cuts.
* :class:`PlanEvalData`: one evaluation over a plan (a validation plan), every
  microbatch of an epoch once, the same at every world size, masked padding
  for a rank left without one in the last step.
* :class:`SequenceBatchSampler` with :class:`SequenceDataset`: pretraining sequences
  (``umlos-cuda plan cut``) by batches of samples, their cursor the plan cursor.
* :func:`run_distributed`: the entry point of a torchrun script; it ends every
  rank cleanly (a DDP job on gloo otherwise aborts at exit now and then).
* :mod:`umlos_cuda.torch.trainer` (imported by name, not from here): a plan as
  the data source of ``transformers.Trainer`` or TRL's ``SFTTrainer``, its
  cursor in their checkpoints (docs/training.md).

Importing this package does not need torch; the samplers subclass
``torch.utils.data.Sampler`` when torch is installed. See docs/integrations.md.

Importing it also silences one warning that is not the user's to act on:
torchdata's ``StatefulDataLoader`` (which docs/integrations.md recommends
with these samplers) calls ``torch.set_vital``, deprecated since torch 2.13,
on every construction. The filter matches that message from that torchdata
module only; every other warning, torch's and torchdata's included, shows.
"""

import warnings as _warnings

from ._dist import SamplerArgumentError, SamplerTypeError, resolve_world
from ._distributed_sampler import DistributedSampler
from ._eval_sampler import DistributedEvalSampler
from ._launch import run_distributed
from ._nextbatch_sampler import NextBatchSampler
from ._order import sampler_manifest
from ._padding import MaskedDataset, Padding
from ._plan_collate import PackedBatchSampler, PlanCollator, TokenDataset
from ._plan_eval import PlanEvalData
from ._plan_keys import PlanItem, PlanKey
from ._plan_sampler import PlanBatchSampler
from ._sequences import SequenceBatchSampler, SequenceDataset

_warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning,
                         module="torchdata.stateful_dataloader.stateful_dataloader")

__all__ = [
    "DistributedEvalSampler",
    "DistributedSampler",
    "MaskedDataset",
    "NextBatchSampler",
    "PackedBatchSampler",
    "Padding",
    "PlanBatchSampler",
    "PlanCollator",
    "PlanEvalData",
    "PlanItem",
    "PlanKey",
    "SamplerArgumentError",
    "SamplerTypeError",
    "SequenceBatchSampler",
    "SequenceDataset",
    "TokenDataset",
    "resolve_world",
    "run_distributed",
    "sampler_manifest",
]
