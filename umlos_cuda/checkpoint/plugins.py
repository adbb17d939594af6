"""Finding the subsystems that extend checkpoints and tapes in another process.

A subsystem registers its cursor kinds and tape record types when its module
is imported (:mod:`.extensions`). A process that reads a store without
importing it (``umlos-cuda checkpoint verify``, a restore in a fresh
interpreter) learns of it through an *entry point* of the group
:data:`GROUP`, declared by the package that ships the subsystem::

    [project.entry-points."umlos_cuda.checkpoint"]
    batching = "umlos_cuda.batching.plans.checkpoint_kinds"

The first time a reader meets a kind or record type no one registered, it
imports every module the group names (once per process) and looks again
(:class:`umlos_cuda.plugins.EntryPoints`).
"""

from __future__ import annotations

from ..plugins import EntryPoints

#: The entry-point group whose modules register cursor kinds and record types.
GROUP = "umlos_cuda.checkpoint"
#: Its modules, imported on first need.
ENTRY_POINTS = EntryPoints(GROUP)
load = ENTRY_POINTS.load
hint = ENTRY_POINTS.hint
