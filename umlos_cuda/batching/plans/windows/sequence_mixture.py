"""A weighted mixture of pretraining sequences, exact per window: which dataset's sample each position holds.

What goes in: components, each a dataset's pretraining sequences (:class:`~.sequences.PretrainingSequences`:
its own token source, cut definition and seed) with a weight, an optional cap on its epochs and a
name; a window size ``W``, an optional total number of samples and the mixture seed. What comes out:
:class:`SequenceMixture`: for output sample ``k``, the component and that component's epoch and
sample (:meth:`~SequenceMixture.locate`, one mixed window merged), its pieces of documents or its
arrays collated from the component's tokens (:meth:`~SequenceMixture.sample`), every sample from a
cursor on, the resume rule's interface, and the fingerprint.

The rules (docs/batching.md, "Mixtures of pretraining sequences"): component ``i``'s **stream** is its
samples epoch after epoch, each epoch cut in the component's own engine order for that epoch
(docs/batching.md, "Pretraining sequences"); stream position ``t`` is sample ``t mod S_i`` of epoch
``t // S_i``, ``S_i`` the samples an epoch of the component has. ``S_i`` is the same every epoch: an
epoch is a permutation of the same documents, so its stream has the same ``T_i`` tokens and the tail
rule keeps the same number of samples; it is checked against every epoch's index when the mixture is
made. A cap of ``c_i`` epochs ends the stream after ``c_i S_i`` positions. The streams are blended by
:mod:`.blend`, the rules of sample mixtures (docs/batching.md, "Weighted mixtures"): per window of ``W``
output samples, each component exactly at its largest-remainder quota, merged by the jittered
stratified keys under the mixture seed.

Each component's index holds exactly the epochs the mixture reads, ``max(1, ceil(used_i / S_i))``
(``used_i``: the positions of its stream the whole mixture takes, from the segments table), so the
folder is O(sum of E_i N_i / W_i) and a definition has one index.

The fingerprint is SHA-256 of the canonical CBOR of ``["umlos_mixed_sequences_v1", header]``: ``header``
(:meth:`SequenceMixture.header`) holds the format, ``W``, ``num_samples``, the mixture seed, the
total, and per component its name, exact weight, cap, its sequences' header (definition, epochs,
lengths' binding, engine order) and its sequences' fingerprint (which covers its index).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from functools import partial

import numpy as np

from .... import checks, errors
from ....hashing import hash_canonical
from ..buckets import config_error
from ..plan import plan_error
from .blend import MAX_COMPONENTS, Blend, Part
from .schedule import MixSchedule
from .cut import INDEX_CHUNK, CutDefinition
from .sequences import PretrainingSequences, lengths_of
from .window import DEFAULT_WINDOW

#: The ``format`` of a mixture of pretraining sequences.
MIXED_SEQUENCES_FORMAT = "umlos_cuda.mixed_sequences/1"

_cursor = partial(plan_error, errors.PLAN_CURSOR_INVALID)


@dataclass(frozen=True)
class SequenceComponent:
    """One dataset of a mixture: its pretraining sequences (its index holding the epochs the mixture reads),
    weight (> 0), an optional cap on its epochs and a name (what a sample records)."""

    sequences: PretrainingSequences
    weight: float
    max_epochs: int | None = None
    name: str = ""


def epoch_tokens(definition: CutDefinition, source) -> int:
    """The stream tokens of any epoch of ``definition`` over ``source`` (a length or token source): the documents'
    lengths plus the EOS, summed in chunks; no order is needed (every epoch holds every document once)."""
    lengths = lengths_of(source)
    n = definition.num_documents
    total = 0
    for start in range(0, n, INDEX_CHUNK):
        total += int(lengths.take(np.arange(start, min(start + INDEX_CHUNK, n), dtype=np.uint64)).sum(dtype=np.int64))
        lengths.release()
    return total + definition.extra * n


class SequenceMixture:
    """A mixture of pretraining sequences (module docstring); :meth:`build` makes it from cut definitions and
    token sources, :func:`~.sequences_io.load_mixed_sequences` opens a saved one."""

    def __init__(self, components, window: int = DEFAULT_WINDOW, num_samples: int | None = None,
                 seed: int = 42, schedule: MixSchedule | None = None) -> None:
        components = tuple(components)
        if not 1 <= len(components) <= MAX_COMPONENTS:
            raise config_error(f"a mixture takes 1 to {MAX_COMPONENTS} components, got {len(components)}")
        per_epoch = []
        for i, c in enumerate(components):
            if not isinstance(c, SequenceComponent) or not isinstance(c.sequences, PretrainingSequences):
                raise config_error(f"component {i} must be a SequenceComponent over PretrainingSequences")
            counts = {c.sequences.epoch_samples(e) for e in range(c.sequences.num_epochs)}
            if len(counts) != 1:
                raise config_error(f"component {i}'s epochs hold {sorted(counts)} samples; every epoch of one "
                                   "dataset holds the same")
            per_epoch.append(_samples_per_epoch(i, c.name, c.sequences.definition, counts.pop()))
        self.components = components
        self.window, self.num_samples, self.seed, self.schedule = window, num_samples, seed, schedule
        self.per_epoch = tuple(per_epoch)
        self.blend = Blend(tuple(Part(c.weight, s, c.max_epochs, c.name) for c, s in zip(components, per_epoch)),
                           window, num_samples, seed, schedule)
        for i, (c, want) in enumerate(zip(components, self.blend.epochs_read())):
            if c.sequences.num_epochs != want:
                raise config_error(f"component {i} ({c.name!r}) holds {c.sequences.num_epochs} epoch(s); the mixture "
                                   f"reads {want}")

    @classmethod
    def build(cls, parts, window: int = DEFAULT_WINDOW, num_samples: int | None = None, seed: int = 42, *,
              schedule: MixSchedule | None = None, backend: str = "auto") -> SequenceMixture:
        """From ``parts``: ``(definition, source, weight, max_epochs, name)`` each (a
        :class:`~.cut.CutDefinition` and its length or token source). Each stream's samples per epoch come
        from its lengths' sum (no order read), the blend from them, and then each component's index is built
        for the epochs the blend reads (one streaming pass an epoch)."""
        parts = list(parts)
        if not 1 <= len(parts) <= MAX_COMPONENTS:
            raise config_error(f"a mixture takes 1 to {MAX_COMPONENTS} components, got {len(parts)}")
        shares = []
        for i, (definition, source, weight, cap, name) in enumerate(parts):
            lengths = lengths_of(source)
            if lengths.count != definition.num_documents:
                raise plan_error(errors.PLAN_LENGTHS_MISMATCH, f"component {i}: the lengths hold {lengths.count} "
                                 f"documents; the definition cuts {definition.num_documents}")
            samples = definition.samples(epoch_tokens(definition, lengths))
            shares.append(Part(weight, _samples_per_epoch(i, name, definition, samples), cap, name))
        blend = Blend(tuple(shares), window, num_samples, seed, schedule)
        components = []
        for (definition, source, weight, cap, name), epochs in zip(parts, blend.epochs_read()):
            components.append(SequenceComponent(PretrainingSequences.build(definition, source, epochs,
                                                                           backend=backend), weight, cap, name))
        return cls(components, window, num_samples, seed, schedule)

    # ------------------------------------------------------------------ identity
    @property
    def total(self) -> int:
        return self.blend.total

    @property
    def num_windows(self) -> int:
        return self.blend.num_windows

    def header(self) -> dict:
        return {"format": MIXED_SEQUENCES_FORMAT, "window": self.window, "num_samples": self.num_samples,
                "seed": self.seed, "total": self.total,
                "components": [{"name": c.name, "weight": _exact(c.weight), "max_epochs": c.max_epochs,
                                "sequences": c.sequences.header(), "fingerprint": c.sequences.fingerprint}
                               for c in self.components],
                **({} if self.schedule is None else {"schedule": self.schedule.to_dict()})}  # only when scheduled

    @property
    def fingerprint(self) -> str:
        return hash_canonical(["umlos_mixed_sequences_v1", self.header()]).hex()

    # ------------------------------------------------------------------ the resume rule (resume.py)
    @property
    def num_epochs(self) -> int:
        """1: a mixture is one pass (its components' epochs are inside it)."""
        return 1

    def epoch_microbatches(self, epoch: int) -> int:
        """The mixture's samples (the resume rule's unit is one sample); ``epoch`` must be 0."""
        _epoch(epoch)
        return self.total

    def microbatch_at(self, epoch: int, k: int):
        """Sample ``k`` for :class:`~.resume.WindowedRankReader`: collated when every component has a token
        source, else ``(component, its pieces)``."""
        _epoch(epoch)
        if any(c.sequences.tokens is None for c in self.components):
            i, _, _ = self.locate(k)
            return i, tuple(self.pieces(k))
        return self.sample(k)

    # ------------------------------------------------------------------ samples
    def merged(self, m: int) -> tuple[np.ndarray, np.ndarray]:
        """Mixed window ``m``: each place's component and stream position (:meth:`~.blend.Blend.merged`)."""
        return self.blend.merged(m)

    def locate(self, k: int) -> tuple[int, int, int]:
        """``(component, its epoch, its sample)`` at output sample ``k``: one mixed window merged."""
        return self.blend.locate(k, fail=_cursor)

    def pieces(self, k: int):
        """Output sample ``k``'s pieces of its component's documents (:class:`~.cut.Piece`), no token read."""
        i, epoch, j = self.locate(k)
        return self.components[i].sequences.pieces(epoch, j)

    def sample(self, k: int, tokens=None) -> dict:
        """Output sample ``k`` collated from its component's tokens (``tokens``: one token source per component,
        default each component's own), as :meth:`~.sequences.PretrainingSequences.sample` collates it, with
        ``component`` (its index), ``component_name``, ``component_epoch`` and ``component_sample``."""
        i, epoch, j = self.locate(k)
        sample = self.components[i].sequences.sample(epoch, j, None if tokens is None else tokens[i])
        return {**sample, "component": i, "component_name": self.components[i].name, "component_epoch": epoch,
                "component_sample": j}

    def iter_from(self, k: int = 0, tokens=None) -> Iterator[tuple[int, dict]]:
        """``(k, sample)`` from output sample ``k`` on; resuming merges one mixed window."""
        checks.integer(k, "sample", 0, self.total, fail=_cursor)
        for j in range(k, self.total):
            yield j, self.sample(j, tokens)

    def __repr__(self) -> str:
        return (f"SequenceMixture({len(self.components)} components, {self.total} samples, window {self.window}, "
                f"{self.num_windows} windows, fingerprint={self.fingerprint})")


def _samples_per_epoch(i: int, name: str, definition: CutDefinition, samples: int) -> int:
    """``samples``, refused when an epoch of the component cuts no sample at all."""
    if samples < 1:
        raise config_error(f"component {i} ({name!r}) has no sample of {definition.sequence_length} + 1 tokens in "
                           "an epoch")
    return samples


def _exact(weight) -> list[int]:
    exact = Fraction(weight)
    return [exact.numerator, exact.denominator]


def _epoch(epoch: int) -> int:
    return checks.integer(epoch, "epoch", 0, 0, fail=_cursor,
                          message="{name} {value!r} is not in the plan; a mixture has the one epoch 0")
