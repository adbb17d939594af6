"""Token loss masks from character spans, as transformers computes ``assistant_masks``.

What goes in: one encoding's token character offsets (``Encoding.offsets``
of the ``tokenizers`` library) and the ``(start, end)`` character spans of
the assistant's output. What comes out: one uint8 per token, 1 on every
token that overlaps a span.

The rule is the loop of ``apply_chat_template(..., return_assistant_tokens_mask=True)``
(transformers 5.x): walk the tokens in order with a pointer into the spans;
move the pointer past every span that ends at or before the token's start;
once past the last span, stop; mask the token when it ends after the current
span's start. A token cut across a span's edge is thus masked. When the
token starts and the span ends both rise (every real template), the pointer
is a binary search and the mask is computed on arrays; otherwise the loop
runs as written.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def token_mask(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """The 0/1 mask of the tokens whose ``offsets`` overlap ``spans``."""
    count = len(offsets)
    mask = np.zeros(count, dtype=np.uint8)
    if not spans or not count:
        return mask
    bounds = np.asarray(offsets, dtype=np.int64).reshape(count, 2)
    span_array = np.asarray(spans, dtype=np.int64).reshape(len(spans), 2)
    starts, ends = bounds[:, 0], bounds[:, 1]
    if np.all(starts[1:] >= starts[:-1]) and np.all(span_array[1:, 1] >= span_array[:-1, 1]):
        pointer = np.searchsorted(span_array[:, 1], starts, side="right")
        inside = pointer < len(spans)
        mask[inside] = ends[inside] > span_array[pointer[inside], 0]
        return mask
    index = 0
    for token, (start, end) in enumerate(offsets):
        while index < len(spans) and start >= spans[index][1]:
            index += 1
        if index == len(spans):
            break
        if end > spans[index][0]:
            mask[token] = 1
    return mask
