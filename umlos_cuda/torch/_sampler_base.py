"""The base classes of every sampler and dataset here: ``torch.utils.data.Sampler``
and ``Dataset`` when torch is installed, else ``object``, so they also work (and
their tests run) in a process without torch."""

from __future__ import annotations

try:
    from torch.utils.data import Dataset as DatasetBase, Sampler as SamplerBase
except ImportError:  # pragma: no cover - exercised where torch is absent
    DatasetBase = SamplerBase = object

__all__ = ["DatasetBase", "SamplerBase"]
