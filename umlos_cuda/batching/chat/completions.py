"""Where a rendered completion's tokens start: TRL's prompt length, and the loss masks it gives.

What goes in: the token ids of each row (prompt and completion rendered
together), the token ids of each record's prompt (rendered with the
generation prompt) and, for each row, the index of its record's prompt.
What comes out: for each row, the index of its first completion token
(:func:`completion_starts`), and the rows' loss masks, 0 before it and 1
from it (:func:`completion_masks`).

The start is TRL's ``prompt_len`` (``DPOTrainer`` and ``KTOTrainer``
``_prepare_dataset``): the length of the longest common prefix of the
prompt's tokens and the row's (``common_prefix_length``), and for the two
rows of a pair the smaller of theirs. It is not the prompt's token count:
a template may render the prompt alone differently from the prompt
followed by a completion (one that ends its generation prompt with an empty
thought block, say), and the tokens at the boundary may merge; TRL then
starts the completion where the two first differ, and so does this.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def common_prefix(ids: Sequence[int], other: Sequence[int]) -> int:
    """The number of leading tokens ``ids`` and ``other`` share."""
    count = min(len(ids), len(other))
    if count == 0:
        return 0
    differ = np.flatnonzero(np.asarray(ids[:count], dtype=np.int64) != np.asarray(other[:count], dtype=np.int64))
    return int(differ[0]) if differ.size else count


def shared_prompts(records: Sequence[int]) -> tuple[list[int], np.ndarray]:
    """For rows whose records are ``records`` (the rows of one record side by side): the first row
    of each record, whose prompt is encoded once, and each row's index among those prompts."""
    record = np.asarray(records, dtype=np.int64)
    first = np.ones(record.shape[0], dtype=bool)
    first[1:] = record[1:] != record[:-1]
    return np.flatnonzero(first).tolist(), np.cumsum(first) - 1


def completion_starts(rows: Sequence[Sequence[int]], prompts: Sequence[Sequence[int]],
                      prompt_of_row: Sequence[int] | np.ndarray) -> np.ndarray:
    """For each row, its completion's first token: its common prefix with ``prompts[prompt_of_row[row]]``,
    the smallest over the rows that share that prompt (the two rows of a pair)."""
    index = np.asarray(prompt_of_row, dtype=np.int64)
    shared = np.fromiter((common_prefix(row, prompts[p]) for row, p in zip(rows, index.tolist())), dtype=np.int64,
                         count=len(rows))
    smallest = np.full(len(prompts), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(smallest, index, shared)
    return smallest[index]


def completion_masks(lengths: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The rows' loss masks, concatenated: for each row of ``lengths`` tokens, 0 before its start, 1 from it."""
    lengths = np.asarray(lengths, dtype=np.int64)
    first = np.cumsum(lengths) - lengths
    position = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(first, lengths)
    return (position >= np.repeat(np.asarray(starts, dtype=np.int64), lengths)).astype(np.uint8)
