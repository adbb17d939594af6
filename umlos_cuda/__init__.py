"""umlos-cuda: a reproducible, world-size-independent sample order for ML data loaders.

Each sample's index is a pure function of ``(manifest, dataset, epoch,
position)``: O(1) per position after O(num_blocks) work per epoch, the same on
1 GPU or 512, before or after a restart. See README.md and docs/.

Public entry points (resolution R10)::

    m = umlos_cuda.Manifest.load("run.yaml")
    b = umlos_cuda.next_batch(m, "train", world_size=8, rank=0, stage="train",
                              cursor=umlos_cuda.Cursor(0, 0))
    umlos_cuda.epoch_indices(m, "train", epoch=0, start=0, count=1_000_000)
"""

from .cursor import Cursor
from .errors import UmlosError
from .manifest import Manifest
from .nextbatch import Batch, check_dataset_length, epoch_indices, next_batch, sampler_config_hash
from .presets import PRESETS

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "Cursor",
    "Manifest",
    "PRESETS",
    "UmlosError",
    "check_dataset_length",
    "epoch_indices",
    "next_batch",
    "sampler_config_hash",
]
