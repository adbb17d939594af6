"""Pretraining sequences: a concatenate-and-cut plan, its fingerprint, and samples collated from tokens.

What goes in: a :class:`~.cut.CutDefinition`, the document lengths (a
:class:`~.sources.LengthSource`, or the token source itself: a token store, a sharded store, Megatron
datasets, anything of tokens/sources.py) and a number of epochs. What comes out:
:class:`PretrainingSequences`, whose :meth:`~PretrainingSequences.sample` gives sample ``k`` of an
epoch as arrays (one window read, plus the next window's first documents at an edge) and
:meth:`~PretrainingSequences.iter_from` every sample from a cursor on (each window read once).

Resuming at any step and world size is :class:`~.resume.WindowedRankReader`'s rule with the sample as
the unit: the checkpoint store's ``plan`` cursor holds this plan's fingerprint, the epoch and the next
global sample ``c`` (in its ``microbatch_index`` field), and rank ``r`` of ``R`` takes the samples
``k >= c`` with ``k mod R == r``; a rank's microbatch of ``B`` samples is ``B`` lockstep steps, so the
cursor saved after it is ``c + B R``.

A collated sample (``L`` = sequence length):

* ``input_ids`` ``int64 [L]``: stream tokens ``k L .. k L + L - 1``; ``labels`` ``int64 [L]``: the
  next token of each (``k L + 1 .. k L + L``), :data:`IGNORE_INDEX` where the padded tail has none;
* ``loss_mask`` ``uint8 [L]``: the store's loss mask of each label token (1 for an appended EOS, 0
  where padded);
* ``position_ids`` ``int64 [L]``: 0 at the sample's start and at each document start inside it
  (Megatron's ``reset_position_ids``), 0 where padded;
* ``segment_ids`` ``int32 [L]``: which document of the sample each input token belongs to (0, 1, ...),
  -1 where padded; ``documents``: the dataset rows of those documents.

The fingerprint is SHA-256 of the canonical CBOR of ``["umlos_windowed_sequences_v1", header,
[digest, ...]]``: ``header`` holds the format, the definition (:meth:`~.cut.CutDefinition.to_dict`),
the number of epochs, the lengths' binding and the engine's ``sampling_mode``,
``sampler_config_hash`` and ``manifest_hash``; ``digest`` of epoch ``e`` is SHA-256 of the tag
``umlos_windowed_sequences_index_v1``, the canonical CBOR of ``[e, K]`` and the epoch's index bytes
(int64 little-endian).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from functools import partial

import numpy as np

from .... import checks, errors
from ....hashing import cbor_canonical, hash_canonical
from ..plan import plan_error
from ..planner import engine_order
from .cut import CutDefinition, WindowReader, build_cut_index, count_chunks, sample_pieces
from ...lengths.sources import ArrayLengths, LengthSource
from ...tokens.sources import check_token_ids

#: meta.json ``format`` of a pretraining sequences folder.
SEQUENCES_FORMAT = "umlos_cuda.windowed_sequences/1"
#: The label of a position without a next token (the padded tail), PyTorch's ignore index.
IGNORE_INDEX = -100
MAX_EPOCHS = 1 << 16

_cursor = partial(plan_error, errors.PLAN_CURSOR_INVALID)


def lengths_of(source) -> LengthSource:
    """A length source for ``source``: a :class:`LengthSource` as is (a
    ``tokens/mapped.py``'s ``MappedMegatron`` is both), else a token source's lengths."""
    if isinstance(source, LengthSource):
        return source
    return ArrayLengths(np.asarray(source.lengths))


def sequences_digest(epoch: int, running: np.ndarray) -> str:
    digest = hashlib.sha256(b"umlos_windowed_sequences_index_v1")
    digest.update(cbor_canonical([int(epoch), int(running.shape[0]) - 1]))
    digest.update(np.ascontiguousarray(running, dtype="<i8").tobytes())
    return digest.hexdigest()


class PretrainingSequences:
    """A concatenate-and-cut plan (module docstring). Build with :meth:`build`; save and open with
    :func:`~.sequences_io.save_sequences` / :func:`~.sequences_io.load_sequences`."""

    def __init__(self, definition: CutDefinition, lengths: LengthSource, index: np.ndarray,
                 engine: dict | None = None, *, tokens=None, backend: str = "auto") -> None:
        self.definition = definition
        self.lengths = lengths
        self._index = index
        # windows of each epoch whose running counts are final (all of them, but in a lazy plan)
        self._counted = [definition.num_windows] * int(index.shape[0])
        self._passes: dict[int, Iterator] = {}
        _check_eos(definition, tokens)
        self.tokens = tokens
        self.backend = backend
        self.engine = engine or _engine(definition)
        self._reader = WindowReader(definition, lengths, backend)

    @classmethod
    def build(cls, definition: CutDefinition, source, num_epochs: int = 1, *, backend: str = "auto",
              lazy: bool = False, progress: Callable[[int, int], None] | None = None) -> PretrainingSequences:
        """The index of epochs ``0 .. num_epochs - 1`` in one streaming pass. ``source``: a length source,
        or a token source (then its lengths, and :meth:`sample` reads its tokens). ``lazy``: count nothing
        yet; each sample counts the chunks of windows it needs, so sample 0 costs one chunk, and anything
        that needs the whole index (``index``, the fingerprint, an epoch's count, saving) completes it.
        ``progress(done, total)``: windows counted so far, of ``num_epochs x K`` (not for a lazy plan)."""
        num_epochs = checks.integer(num_epochs, "num_epochs", 1, MAX_EPOCHS,
                                    fail=partial(plan_error, errors.BATCHING_CONFIG_INVALID))
        lengths = lengths_of(source)
        if lengths.count != definition.num_documents:
            raise plan_error(errors.PLAN_LENGTHS_MISMATCH, f"the lengths hold {lengths.count} documents; the "
                                                           f"definition cuts {definition.num_documents}")
        tokens = source if hasattr(source, "arrays") else None
        _check_eos(definition, tokens)  # before the pass
        if lazy:
            plan = cls(definition, lengths, np.zeros((num_epochs, definition.num_windows + 1), dtype=np.int64),
                       tokens=tokens, backend=backend)
            plan._counted = [0] * num_epochs
            return plan
        index = build_cut_index(definition, lengths, num_epochs, backend=backend, progress=progress)
        return cls(definition, lengths, index, tokens=tokens, backend=backend)

    @property
    def index(self) -> np.ndarray:
        """``int64 [E, K + 1]``, every epoch counted (a lazy plan completes its pass here)."""
        for epoch in range(int(self._index.shape[0])):
            self._count(epoch, self.definition.num_windows)
        return self._index

    def _count(self, epoch: int, windows: int) -> None:
        """Count chunks of epoch ``epoch`` until at least ``windows`` windows are counted."""
        while self._counted[epoch] < windows:
            chunks = self._passes.get(epoch)
            if chunks is None:
                chunks = self._passes[epoch] = count_chunks(self.definition, self.lengths, epoch, self.backend)
            first, sums = next(chunks)
            running = self._index[epoch]
            running[first + 1:first + 1 + sums.shape[0]] = running[first] + np.cumsum(sums)
            self._counted[epoch] = first + int(sums.shape[0])

    def _running(self, epoch: int, token: int) -> np.ndarray:
        """The epoch's running counts, counted at least until one passes stream token ``token`` (or all)."""
        total = self.definition.num_windows
        while self._counted[epoch] < total and self._index[epoch, self._counted[epoch]] <= token:
            self._count(epoch, self._counted[epoch] + 1)
        return self._index[epoch, :self._counted[epoch] + 1]

    # ------------------------------------------------------------------ identity
    @property
    def num_epochs(self) -> int:
        return int(self._index.shape[0])

    def header(self) -> dict:
        return {"format": SEQUENCES_FORMAT, "definition": self.definition.to_dict(), "num_epochs": self.num_epochs,
                "lengths": self.lengths.binding(), **self.engine}

    def index_digests(self) -> list[str]:
        return [sequences_digest(e, self.index[e]) for e in range(self.num_epochs)]

    @property
    def fingerprint(self) -> str:
        return hash_canonical(["umlos_windowed_sequences_v1", self.header(), self.index_digests()]).hex()

    # ------------------------------------------------------------------ counts
    def epoch_tokens(self, epoch: int) -> int:
        e = self._epoch(epoch)
        self._count(e, self.definition.num_windows)
        return int(self._index[e, -1])

    def epoch_samples(self, epoch: int) -> int:
        return self.definition.samples(self.epoch_tokens(epoch))

    def epoch_microbatches(self, epoch: int) -> int:
        """:meth:`epoch_samples`: the resume rule's unit (:class:`~.resume.ResumablePlan`) is one sample."""
        return self.epoch_samples(epoch)

    # ------------------------------------------------------------------ samples
    def microbatch_at(self, epoch: int, k: int):
        """Sample ``k`` for :class:`~.resume.WindowedRankReader`: collated (:meth:`sample`) when the plan has a
        token source, else its pieces (:meth:`pieces`, a tuple), which name its tokens exactly."""
        if self.tokens is None:
            return tuple(self.pieces(epoch, k))
        return self.sample(epoch, k)

    def pieces(self, epoch: int, k: int):
        """Sample ``k``'s pieces of documents (:class:`~.cut.Piece`), without reading tokens."""
        e = self._epoch(epoch)
        length = self.definition.sequence_length
        checks.integer(k, "sample", 0, None, fail=_cursor, message=checks.AT_LEAST)
        running = self._running(e, k * length + length)  # counted past the sample's last token, or all
        if self._counted[e] == self.definition.num_windows:
            checks.integer(k, "sample", 0, self.epoch_samples(e) - 1, fail=_cursor)
        return sample_pieces(self._reader, running, e, k)

    def sample(self, epoch: int, k: int, tokens=None) -> dict:
        """Sample ``k`` of ``epoch`` collated (module docstring) from ``tokens`` (default: the token
        source the plan was built from)."""
        source = tokens if tokens is not None else self.tokens
        if source is None:
            raise plan_error(errors.BATCHING_CONFIG_INVALID, "collating a sample needs a token source (tokens=)")
        return collate_pieces(self.pieces(epoch, k), source, self.definition)

    def iter_from(self, epoch: int = 0, k: int = 0, tokens=None) -> Iterator[tuple[int, int, dict]]:
        """``(epoch, k, sample)`` from the cursor on; resuming reads one window."""
        e = self._epoch(epoch)
        checks.integer(k, "sample", 0, self.epoch_samples(e), fail=_cursor)
        for current in range(e, self.num_epochs):
            for j in range(k if current == e else 0, self.epoch_samples(current)):
                yield current, j, self.sample(current, j, tokens)

    def _epoch(self, epoch: int) -> int:
        return checks.integer(epoch, "epoch", 0, self.num_epochs - 1, fail=_cursor,
                              message="{name} {value!r} is not in the plan; it has epochs 0 to {high}")

    def __repr__(self) -> str:
        d = self.definition
        return (f"PretrainingSequences({self.num_epochs} epochs of {d.num_documents} documents, sequence length "
                f"{d.sequence_length}, window {d.window}, fingerprint={self.fingerprint})")


def _check_eos(definition: CutDefinition, tokens) -> None:
    """BATCHING_CONFIG_INVALID when the token source cannot hold the definition's EOS (past its vocabulary or
    its token type): the model would fail on it hours later, on a device-side assert."""
    if tokens is not None and definition.eos is not None:
        check_token_ids((definition.eos,), tokens, "eos", fail=partial(plan_error, errors.BATCHING_CONFIG_INVALID))


def collate_pieces(pieces, source, definition: CutDefinition) -> dict:
    """The arrays of one sample from its pieces (module docstring)."""
    length = definition.sequence_length
    ids = np.zeros(length + 1, dtype=np.int64)
    mask = np.zeros(length + 1, dtype=np.uint8)
    segments = np.full(length + 1, -1, dtype=np.int32)
    positions = np.zeros(length + 1, dtype=np.int64)
    at = 0
    for segment, piece in enumerate(pieces):
        doc_ids, doc_mask = source.arrays(piece.row)
        stop = min(piece.offset + piece.count, int(doc_ids.shape[0]))
        real = max(0, stop - piece.offset)
        ids[at:at + real] = doc_ids[piece.offset:stop]
        mask[at:at + real] = doc_mask[piece.offset:stop]
        if real < piece.count:  # the piece reaches the appended EOS
            ids[at + real] = int(definition.eos or 0)  # only a definition with an EOS appends one
            mask[at + real] = 1
        segments[at:at + piece.count] = segment
        positions[at:at + piece.count] = np.arange(piece.count)
        at += piece.count
    labels = ids[1:].copy()
    labels[at - 1:] = IGNORE_INDEX
    loss_mask = mask[1:].copy()
    loss_mask[at - 1:] = 0
    return {"input_ids": ids[:length], "labels": labels, "loss_mask": loss_mask, "position_ids": positions[:length],
            "segment_ids": segments[:length], "documents": [piece.row for piece in pieces]}


def _engine(definition: CutDefinition) -> dict:
    return engine_order(definition.order_config, definition.manifest)
