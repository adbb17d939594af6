"""Windowed plans: token-budget microbatches planned a window of the engine's order at a time.

Modules:
    window   the definition (config, window W, edge rule) and one window's microbatches or counts
    packed   a packed windowed plan's window counts (rows x max_length padded) and its row checks
    index    the per-window running counts, built in one streaming pass; microbatch -> window
    plan     :class:`WindowedPlan`: random access, resume, fingerprint
    resume   rank r of R reads the global microbatches k mod R == r from the checkpoint's plan cursor
    io       windowed plan folders: meta.json and index.npy, written atomically, read bounded
    verify   a folder's definition, lengths and any sample of its windows replanned and checked
    cut      concatenate-and-cut pretraining sequences: the definition, the token index, sample k's pieces
    sequences  :class:`PretrainingSequences`: random access, resume, fingerprint, collation from a token source
    sequences_io  pretraining sequences folders: meta.json and index.npy (their tokens reopened by ``sources``)
    blend    the quotas per window and the stratified merge of weighted streams, shared by both mixtures below
    schedule  a mixture's weights over its positions (held or ramped pieces, joins and retirements) and its file
    mixture  a weighted mixture of length sources, exact per window: which sample each position holds
    mixed    a mixture's token-budget microbatches, planned a mixed window at a time, and its index
    sequence_mixture  a weighted mixture of pretraining sequences, exact per window (folders: sequences_io)

docs/batching.md, "Windowed plans", is the normative definition.
"""

from typing import TYPE_CHECKING

from ....reexports import lazy

if TYPE_CHECKING:  # the re-exports, imported on first use (umlos_cuda/reexports.py)
    from .cut import CutDefinition
    from .index import build_index, locate
    from .io import load_windowed_plan, save_windowed_plan
    from .mixed import MixedPlan
    from .mixture import Component, MixtureDefinition
    from .plan import WindowedPlan
    from .schedule import MixSchedule, Piece, read_schedule
    from .sequences import PretrainingSequences
    from .sequence_mixture import SequenceComponent, SequenceMixture
    from .sequences_io import load_mixed_sequences, load_sequences, save_mixed_sequences, save_sequences
    from ...lengths.sources import ArrayLengths, LengthSource, MappedLengths, SyntheticLengths
    from .verify import verify_windowed_plan
    from .window import DEFAULT_WINDOW, EDGE_FLUSH, WindowDefinition, count_window, plan_window

__all__ = ["DEFAULT_WINDOW", "EDGE_FLUSH", "ArrayLengths", "Component", "CutDefinition", "LengthSource",
           "MappedLengths", "MixSchedule", "MixedPlan", "MixtureDefinition", "Piece", "PretrainingSequences",
           "SequenceComponent", "SequenceMixture", "SyntheticLengths", "WindowDefinition", "WindowedPlan",
           "build_index", "count_window", "load_mixed_sequences", "load_sequences", "load_windowed_plan", "locate",
           "plan_window", "read_schedule", "save_mixed_sequences", "save_sequences", "save_windowed_plan",
           "verify_windowed_plan"]

__getattr__, __dir__ = lazy(__name__, __file__)
