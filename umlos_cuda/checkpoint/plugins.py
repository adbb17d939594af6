"""Finding the subsystems that extend checkpoints and tapes in another process.

A subsystem registers its cursor kinds and tape record types when its module
is imported (:mod:`.extensions`). A process that reads a store without
importing it (``umlos-cuda checkpoint verify``, a restore in a fresh
interpreter) learns of it through an *entry point* of the group
:data:`GROUP`, declared by the package that ships the subsystem::

    [project.entry-points."umlos_cuda.checkpoint"]
    batching = "umlos_cuda.batching.plans.checkpoint_kinds"

The first time a reader meets a kind or record type no one registered, it
imports every module the group names (once per process) and looks again.
Only installed packages declare entry points, so a file read from a store
never chooses what is imported. A module that fails to import is remembered
with its error, which the reader's refusal quotes.
"""

from __future__ import annotations

from importlib import metadata

#: The entry-point group whose modules register cursor kinds and record types.
GROUP = "umlos_cuda.checkpoint"

_loaded = False
#: ``"name (module): error"`` for each entry point that failed to load.
failures: list[str] = []


def load() -> None:
    """Import every module of :data:`GROUP` (the first call only)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    failures.clear()
    for point in metadata.entry_points(group=GROUP):
        try:
            point.load()
        except Exception as exc:  # a broken plugin must not turn a refusal into a traceback
            failures.append(f"{point.name} ({point.value}): {type(exc).__name__}: {exc}")


def hint() -> str:
    """What to tell a user whose kind or record type is unknown."""
    text = (f"import the module that registers it, or install the package that declares it as an entry point "
            f"of the group {GROUP!r}")
    if failures:
        text += f"; entry points that failed to load: {'; '.join(failures)}"
    return text
