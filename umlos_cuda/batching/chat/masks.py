"""Token loss masks from character spans, as transformers computes ``assistant_masks``.

What goes in: one encoding's token character offsets (``Encoding.offsets``
of the ``tokenizers`` library) and the ``(start, end)`` character spans of
the assistant's output. What comes out: one uint8 per token, 1 on every
token that overlaps a span (:func:`token_mask`); or the masks of a chunk's
encodings, concatenated (:func:`chunk_masks`, what the token store writes;
:func:`stacked_masks` when the offsets are one array already, as
umlos_cuda/batching/chat/byte_offsets.py computes them from the ids).

The rule is the loop of ``apply_chat_template(..., return_assistant_tokens_mask=True)``
(transformers 5.x): walk the tokens in order with a pointer into the spans;
move the pointer past every span that ends at or before the token's start;
once past the last span, stop; mask the token when it ends after the current
span's start. A token cut across a span's edge is thus masked. When the
token starts and the span ends both rise (every real template), the pointer
is a binary search and the mask is computed on arrays; otherwise the loop
runs as written. :func:`chunk_masks` searches the tokens of every encoding
of a chunk at once: each encoding's offsets and spans are shifted by its
place in the chunk times one more than the largest of them all, so that
the encodings follow one another: a token whose pointer passes its own
spans lands on a later encoding's, which starts after the token ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np



def token_mask(offsets: Sequence[tuple[int, int]] | np.ndarray, spans: Sequence[tuple[int, int]]) -> np.ndarray:
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


def chunk_masks(offsets: Sequence[Sequence[tuple[int, int]]], spans: Sequence[Sequence[tuple[int, int]]]
                ) -> np.ndarray:
    """The :func:`token_mask` of each encoding's ``offsets`` and its ``spans``, concatenated: one search for
    the whole chunk when every encoding's token starts and span ends rise, each encoding's own otherwise."""
    tokens, counts = _stacked(offsets)
    return stacked_masks(tokens, counts, spans)


def stacked_masks(tokens: np.ndarray, counts: np.ndarray, spans: Sequence[Sequence[tuple[int, int]]]
                  ) -> np.ndarray:
    """:func:`chunk_masks` of the encodings' offsets already stacked: ``tokens`` an ``(n, 2)`` int64 array of
    every encoding's offsets in turn, ``counts`` how many each has (as umlos_cuda/batching/chat/byte_offsets.py
    gives them)."""
    span_array, span_counts = _stacked(spans)
    mask = np.zeros(tokens.shape[0], dtype=np.uint8)
    if not tokens.shape[0] or not span_array.shape[0]:
        return mask
    stride = int(max(tokens.max(), span_array.max())) + 1
    record = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    starts, ends = tokens[:, 0] + record * stride, tokens[:, 1] + record * stride
    span_record = np.repeat(np.arange(len(span_counts), dtype=np.int64), span_counts)
    span_starts, span_ends = span_array[:, 0] + span_record * stride, span_array[:, 1] + span_record * stride
    if not (np.all(starts[1:] >= starts[:-1]) and np.all(span_ends[1:] >= span_ends[:-1])):
        each = np.split(tokens, np.cumsum(counts)[:-1])
        return np.concatenate([token_mask(o, s) for o, s in zip(each, spans)])
    pointer = np.searchsorted(span_ends, starts, side="right")  # past a token's own spans: a later encoding's,
    inside = pointer < span_ends.shape[0]  # which starts after the token ends (it masks nothing)
    mask[inside] = ends[inside] > span_starts[pointer[inside]]
    return mask


def _stacked(pairs: Sequence[Sequence[tuple[int, int]]]) -> tuple[np.ndarray, np.ndarray]:
    """All the pairs as one ``(n, 2)`` int64 array, and how many each sequence has."""
    counts = np.fromiter(map(len, pairs), dtype=np.int64, count=len(pairs))
    total = int(counts.sum())
    flat = np.fromiter(chain.from_iterable(chain.from_iterable(pairs)), dtype=np.int64, count=2 * total)
    return flat.reshape(total, 2), counts
