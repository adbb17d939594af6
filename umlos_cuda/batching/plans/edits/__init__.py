"""Plans edited after the fact: a plan of any kind with some of its units left out, whose fingerprint chains to
its parent's (``plan edit``; docs/batching.md, "Editing a plan").

Modules:
    edit  :class:`SkipUnits`, the canonical edit (units left out, by epoch and range), and :func:`skip_steps`,
          which names the units of a run's steps ``A .. B - 1`` at a world size (steps as ``plan explain``'s);
          :class:`SkipRows` and :func:`skip_rows`: dataset rows left out of microbatches from a cursor on
    plan  :class:`EditedPlan`: the parent's units minus those left out, through the interface samplers read
    io    the folder: :func:`save_edited_plan`, :func:`load_edited_plan` (the parent reopened and checked),
          :func:`edit_plan` (an edit of a plan folder)

The kinds these folders are (``edited windowed plan``, ...) are in ``plans/kinds/edited.py``.
"""

from typing import TYPE_CHECKING

from ....reexports import lazy

if TYPE_CHECKING:  # the re-exports, imported on first use (umlos_cuda/reexports.py)
    from .edit import SkipRows, SkipUnits, skip_rows, skip_steps
    from .io import EDITED_FORMAT, edit_plan, load_edited_plan, save_edited_plan
    from .plan import EditedPlan

__all__ = ["EDITED_FORMAT", "EditedPlan", "SkipRows", "SkipUnits", "edit_plan", "load_edited_plan",
           "save_edited_plan", "skip_rows", "skip_steps"]

__getattr__, __dir__ = lazy(__name__, __file__)
