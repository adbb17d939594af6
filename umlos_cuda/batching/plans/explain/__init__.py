"""Explaining a step: which documents, token ranges and loss tokens each rank trained on at a step of a run.

Modules:
    steps      the samplers' lockstep rule as arithmetic: step ``K`` at world size ``W`` to each rank's units
    rows       one unit (a microbatch, or a cut sample) row by row: sample, row, component, source, document,
               piece, pack, token range, tokens, loss tokens; the helpers every plan kind's ``explain`` uses
    explainer  :class:`StepExplainer` and :func:`explain`: a plan of any kind, through its kind's ``explain``
    text       the text ``plan explain`` prints: a compact table per rank
    tape       a run's steps on the checkpoint store's tape (``plan.step`` records, :class:`StepRecorder`) and their
               check against the plan

docs/batching.md, "Explaining a step", is the schema of what comes out.
"""

from typing import TYPE_CHECKING

from ....reexports import lazy

if TYPE_CHECKING:  # the re-exports, imported on first use (umlos_cuda/reexports.py)
    from .explainer import EXPLAIN_FORMAT, StepExplainer, explain
    from .rows import ROW_FIELDS
    from .steps import MAX_STEPS, Step, locate_steps, total_steps
    from .tape import STEP_RECORD, StepRecorder, check_tape, step_digest, step_record, unit_rows
    from .text import lines

__all__ = ["EXPLAIN_FORMAT", "MAX_STEPS", "ROW_FIELDS", "STEP_RECORD", "Step", "StepExplainer", "StepRecorder",
           "check_tape", "explain", "lines", "locate_steps", "step_digest", "step_record", "total_steps", "unit_rows"]

__getattr__, __dir__ = lazy(__name__, __file__)
