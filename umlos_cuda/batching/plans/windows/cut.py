"""Concatenate-and-cut pretraining sequences, a window of the engine's order at a time.

What goes in: a :class:`CutDefinition` (the number of documents N, the sequence length L, the window
W, the order's seed and mode, the EOS id to append or None, the tail rule) and a
:class:`~.sources.LengthSource` of document lengths. What comes out: the per-window token index
(:func:`build_cut_index`, one streaming pass, ``int64 [E, K + 1]``) and, for sample ``k`` of an
epoch, the pieces of documents it is made of (:func:`sample_pieces`), read from one window and,
when the sample crosses the window's edge, the first documents of the next ones.

The rules (docs/batching.md, "Pretraining sequences", normative). Epoch ``e``'s documents are the
rows of the engine's epoch order over N positions (the order a token-budget plan with the same
seed, stage, order and block size follows), each followed by ``eos`` when it is given (the store's
documents are taken as stored: ``data tokenize`` appends no EOS to plain text; a Megatron ``.bin``
written with ``--append-eod`` already ends each document with one, so give ``eos=None`` there).
Joined in that order they are the epoch's token stream of ``T`` tokens. Sample ``k`` is the stream's
tokens ``[k L, k L + L + 1)``: inputs are the first L, labels the last L, so consecutive samples
share one token, as Megatron's ``GPTDataset`` (``add_extra_token_to_sequence``) cuts them. The tail:
``drop`` (default) keeps ``S = (T - 1) // L`` samples, Megatron's count for one epoch, and the last
``T - S L`` tokens (1 to L) are in no sample; ``pad`` keeps ``S = ceil(T / L)`` samples, the last one
padded, so every token of every document is the input of exactly one sample per epoch. Each epoch is
cut on its own (Megatron concatenates the epochs of a run into one stream, so over E epochs it has
``(E T - 1) // L`` samples, at most E - 1 more than ``E`` drop epochs here).

Window ``w`` is the positions ``[w W, min((w + 1) W, N))`` of the order; the index holds, per epoch,
the running count of stream tokens before each window, so sample ``k`` starts in the last window
whose running count is at most ``k L`` (a binary search). Memory: one window's rows and lengths.
"""

from __future__ import annotations

from collections.abc import Callable

from dataclasses import dataclass, field
from functools import partial

import numpy as np

from .... import checks, errors
from ....manifest.core import DEFAULT_BLOCK_SIZE, Manifest
from ....modes import DEFAULT_MODE
from ....nextbatch import MODE_SHUFFLE
from ..config import BatchingConfig
from ..plan import plan_error
from ..planner import order_slice, plan_manifest
from ..config import MAX_WINDOW

#: Tail rules (see the module docstring).
TAIL_DROP = "drop"
TAIL_PAD = "pad"
TAIL_RULES = (TAIL_DROP, TAIL_PAD)
#: Default documents per window: about 4 M tokens at a thousand tokens a document, so sample k at random reads
#: a millisecond's worth; 2^12 divides the engine's default block size, so a block order's window is in one block.
DEFAULT_CUT_WINDOW = 1 << 12
#: Positions of the order the index pass reads at once (whole windows).
INDEX_CHUNK = 1 << 20
#: Longest sequence length a definition takes.
MAX_SEQUENCE_LENGTH = 1 << 24

_config_error = partial(plan_error, errors.BATCHING_CONFIG_INVALID)


@dataclass(frozen=True)
class CutDefinition:
    """Everything that decides the pretraining sequences besides the lengths (module docstring)."""

    num_documents: int
    sequence_length: int
    window: int = DEFAULT_CUT_WINDOW
    seed: int = 42
    stage: str = MODE_SHUFFLE
    order: str = DEFAULT_MODE
    sampler_block_size: int = DEFAULT_BLOCK_SIZE
    eos: int | None = None
    tail: str = TAIL_DROP
    order_config: BatchingConfig = field(init=False, repr=False, compare=False)
    manifest: Manifest = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        checks.integer(self.num_documents, "num_documents", 1, None, fail=_config_error, message=checks.AT_LEAST)
        checks.integer(self.sequence_length, "sequence_length", 1, MAX_SEQUENCE_LENGTH, fail=_config_error)
        checks.integer(self.window, "window", 1, MAX_WINDOW, fail=_config_error)
        checks.choice(self.tail, "tail", TAIL_RULES, fail=_config_error)
        if self.eos is not None:
            checks.integer(self.eos, "eos", 0, (1 << 32) - 1, fail=_config_error)
        # the order's fields are a BatchingConfig's, so the documents follow a token-budget plan's order
        config = BatchingConfig(seed=self.seed, stage=self.stage, order=self.order,
                                sampler_block_size=self.sampler_block_size)
        object.__setattr__(self, "order_config", config)
        object.__setattr__(self, "manifest", plan_manifest(config, self.num_documents))

    @property
    def num_windows(self) -> int:
        return -(-self.num_documents // self.window)

    @property
    def extra(self) -> int:
        """Tokens added after each document (1 with ``eos``, else 0)."""
        return 0 if self.eos is None else 1

    def bounds(self, w: int) -> tuple[int, int]:
        start = w * self.window
        return start, min(start + self.window, self.num_documents)

    def samples(self, tokens: int) -> int:
        """Samples of an epoch of ``tokens`` stream tokens (the tail rule)."""
        length = self.sequence_length
        if self.tail == TAIL_PAD:
            return -(-tokens // length)
        return max(0, (tokens - 1) // length)

    def to_dict(self) -> dict:
        return {"num_documents": self.num_documents, "sequence_length": self.sequence_length, "window": self.window,
                "seed": self.seed, "stage": self.stage, "order": self.order,
                "sampler_block_size": self.sampler_block_size, "eos": self.eos, "tail": self.tail}


def window_documents(definition: CutDefinition, source, epoch: int, w: int,
                     backend: str = "auto") -> tuple[np.ndarray, np.ndarray]:
    """Window ``w``'s rows in order and their stream lengths (document + EOS), int64."""
    start, stop = definition.bounds(w)
    rows = order_slice(definition.order_config, definition.manifest, definition.num_documents, epoch, start,
                       stop - start, backend)
    sizes = source.take(rows).astype(np.int64) + definition.extra
    source.release()
    return rows, sizes


def count_chunks(definition: CutDefinition, source, epoch: int, backend: str = "auto"):
    """Yield ``(first window, stream tokens of each window of the chunk)``: the index pass of one epoch, reading
    the order in chunks of whole windows (about :data:`INDEX_CHUNK` positions) and summing each window's
    lengths, so memory is O(max(W, chunk)) and the per-call cost of the order is paid per chunk."""
    k, width = definition.num_windows, definition.window
    per_chunk = max(1, INDEX_CHUNK // width)
    for first in range(0, k, per_chunk):
        start = first * width
        stop = min((first + per_chunk) * width, definition.num_documents)
        rows = order_slice(definition.order_config, definition.manifest, definition.num_documents, epoch, start,
                           stop - start, backend)
        sizes = source.take(rows).astype(np.int64)
        source.release()
        windows = np.add.reduceat(sizes, np.arange(0, stop - start, width))
        windows += definition.extra * np.diff(np.append(np.arange(start, stop, width), stop))
        yield first, windows


def build_cut_index(definition: CutDefinition, source, num_epochs: int, *, backend: str = "auto",
                    progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """``int64 [E, K + 1]``: epoch ``e``'s stream tokens before window ``k``, in one pass (:func:`count_chunks`);
    ``progress(done, total)`` after each chunk of windows (``E x K`` in all)."""
    index = np.zeros((num_epochs, definition.num_windows + 1), dtype=np.int64)
    total = num_epochs * definition.num_windows
    for epoch in range(num_epochs):
        for first, windows in count_chunks(definition, source, epoch, backend):
            index[epoch, first + 1:first + 1 + windows.shape[0]] = windows
            if progress is not None:
                progress(epoch * definition.num_windows + first + windows.shape[0], total)
        np.cumsum(index[epoch], out=index[epoch])
    return index


@dataclass(frozen=True)
class Piece:
    """``count`` stream tokens of the document at ``position`` of the order (dataset row ``row``), from
    its token ``offset`` (an offset equal to the document's length is its EOS)."""

    position: int
    row: int
    offset: int
    count: int


class WindowReader:
    """Windows of one definition, the last two kept (a pass reads each window once; a sample that
    crosses an edge reads the next window's first documents)."""

    def __init__(self, definition: CutDefinition, source, backend: str = "auto") -> None:
        self.definition, self.source, self.backend = definition, source, backend
        self._kept: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def window(self, epoch: int, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(rows, stream lengths, running stream tokens from the window's start [len + 1])``."""
        key = (epoch, w)
        kept = self._kept.get(key)
        if kept is None:
            rows, sizes = window_documents(self.definition, self.source, epoch, w, self.backend)
            running = np.zeros(sizes.shape[0] + 1, dtype=np.int64)
            np.cumsum(sizes, out=running[1:])
            kept = (rows, sizes, running)
            if len(self._kept) >= 2:
                self._kept.pop(next(iter(self._kept)))
            self._kept[key] = kept
        return kept


def sample_pieces(reader: WindowReader, running: np.ndarray, epoch: int, k: int) -> list[Piece]:
    """The pieces of sample ``k`` of ``epoch`` in stream order: ``L + 1`` tokens, fewer at a padded tail.
    ``running``: the epoch's index, or its first entries as long as they reach past the sample's last token."""
    definition = reader.definition
    total = int(running[-1])
    start = k * definition.sequence_length
    want = min(definition.sequence_length + 1, total - start)
    w = int(np.searchsorted(running, start, side="right")) - 1
    pieces: list[Piece] = []
    at = start - int(running[w])  # the offset within window w's stream
    while want > 0:
        rows, sizes, local = reader.window(epoch, w)
        j = int(np.searchsorted(local, at, side="right")) - 1
        base = w * definition.window
        while want > 0 and j < rows.shape[0]:
            offset = at - int(local[j])
            count = min(int(sizes[j]) - offset, want)
            if count > 0:
                pieces.append(Piece(base + j, int(rows[j]), offset, count))
            want -= count
            at += count
            j += 1
        w, at = w + 1, 0
    return pieces
