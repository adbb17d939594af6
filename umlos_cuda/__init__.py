"""umlos-cuda: a reproducible, world-size-independent sample order for ML data loaders.

Each sample's index is a pure function of ``(manifest, dataset, epoch,
position)``: O(1) per position after O(num_blocks) work per epoch, the same on
1 GPU or 512, before or after a restart. See README.md and docs/.

Public entry points (resolution R10)::

    m = umlos_cuda.Manifest.load("run.yaml")
    b = umlos_cuda.next_batch(m, "train", world_size=8, rank=0, stage="train",
                              cursor=umlos_cuda.Cursor(0, 0))
    umlos_cuda.epoch_indices(m, "train", epoch=0, start=0, count=1_000_000)
    umlos_cuda.position_of(m, "train", epoch=0, index=42)   # the inverse: where sample 42 appears

The UML_OS kernel's data-plane contracts (docs/rng.md): ``RngStreams``
(the RNG master and its sub-streams, with ``umlos_cuda.rng.consumes``),
``StateFingerprint``, ``probe_indices`` and ``functional_fp``, and
``next_batch_v1`` (NextBatch_v1).
"""

from ._version import __version__ as __version__  # re-exported: umlos_cuda.__version__
from .cursor import Cursor
from .errors import UmlosError
from .manifest.core import Manifest
from .nextbatch import Batch, check_dataset_length, epoch_indices, next_batch, sampler_config_hash
from .rng.nextbatch_v1 import BatchV1, next_batch_v1
from .position import position_of
from .presets import PRESETS
from .rng.probes import functional_fp, probe_indices
from .rng.streams import RngStreams
from .rng.state_fingerprint import StateFingerprint

__all__ = [
    "Batch",
    "BatchV1",
    "Cursor",
    "Manifest",
    "PRESETS",
    "RngStreams",
    "StateFingerprint",
    "UmlosError",
    "check_dataset_length",
    "epoch_indices",
    "functional_fp",
    "next_batch",
    "next_batch_v1",
    "position_of",
    "probe_indices",
    "sampler_config_hash",
]
