"""The block-diagonal causal mask of a packed row.

``mask[i, j]`` is True when token ``i`` may attend to token ``j``: both are
in the same segment and ``j <= i``. Tokens of different sequences never see
each other, so a packed row computes, for each of its sequences, what the
sequence alone would (tests/test_batching_packing.py proves it with
``torch.nn.functional.scaled_dot_product_attention``, whose boolean
``attn_mask`` means the same: True = attend).

Padding with any segment id works: padding tokens that share an id attend
to each other only (with id -1, or the last segment's id, which
leaves the real tokens unchanged because they come first).
"""

from __future__ import annotations

import numpy as np

from .packing.config import config_error

FRAMEWORKS = ("auto", "numpy", "torch")


def create_segment_attention_mask(segment_ids, framework: str = "auto"):
    """Boolean mask ``[..., T, T]`` for segment ids ``[..., T]`` (one row or a batch).

    ``framework``: ``numpy`` (a NumPy array), ``torch`` (a torch tensor, on
    the input's device when it is one), or ``auto`` (default): torch when
    ``segment_ids`` is a torch tensor, else NumPy.
    """
    if framework not in FRAMEWORKS:
        raise config_error(f"framework must be one of {', '.join(FRAMEWORKS)}, got {framework!r}")
    is_torch = type(segment_ids).__module__.startswith("torch")
    if framework == "torch" or (framework == "auto" and is_torch):
        import torch

        ids = segment_ids if is_torch else torch.as_tensor(np.asarray(segment_ids))
        if ids.dim() < 1:
            raise config_error("segment_ids must have at least one dimension")
        length = ids.shape[-1]
        causal = torch.ones(length, length, dtype=torch.bool, device=ids.device).tril()
        return (ids.unsqueeze(-1) == ids.unsqueeze(-2)) & causal
    ids = np.asarray(segment_ids.cpu().numpy() if is_torch else segment_ids)
    if ids.ndim < 1:
        raise config_error("segment_ids must have at least one dimension")
    length = ids.shape[-1]
    causal = np.tri(length, dtype=bool)
    return (ids[..., :, None] == ids[..., None, :]) & causal
