"""The base class of every sampler here: ``torch.utils.data.Sampler`` when
torch is installed, else ``object``, so the samplers also work (and their
tests run) in a process without torch."""

from __future__ import annotations

try:
    from torch.utils.data import Sampler as SamplerBase
except ImportError:  # pragma: no cover - exercised where torch is absent
    SamplerBase = object

__all__ = ["SamplerBase"]
