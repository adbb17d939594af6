"""Modules that installed packages declare under an entry-point group, imported once, on first need.

A registry whose entries live in subsystems above it (the checkpoint cursor kinds, the artifact kinds
``umlos-cuda info`` describes) cannot import those subsystems itself. Each subsystem instead declares the
module that registers its entries as an *entry point* of the registry's group::

    [project.entry-points."umlos_cuda.checkpoint"]
    batching = "umlos_cuda.batching.plans.checkpoint_kinds"

and the registry, the first time it meets a name no one registered, imports every module the group names
(once per process) and looks again. Only installed packages declare entry points, so a file read from disk
never chooses what is imported. A module that fails to import is remembered with its error, which the
registry's refusal quotes.
"""

from __future__ import annotations

from importlib import metadata


class EntryPoints:
    """The modules of one entry-point group (module docstring)."""

    def __init__(self, group: str) -> None:
        self.group = group
        self._loaded = False
        #: ``"name (module): error"`` for each entry point that failed to load.
        self.failures: list[str] = []

    def load(self) -> None:
        """Import every module of the group (the first call only)."""
        if self._loaded:
            return
        self._loaded = True
        self.failures.clear()
        for point in metadata.entry_points(group=self.group):
            try:
                point.load()
            except Exception as exc:  # a broken plugin must not turn a refusal into a traceback
                self.failures.append(f"{point.name} ({point.value}): {type(exc).__name__}: {exc}")

    def hint(self) -> str:
        """What to tell a user whose name no one registered."""
        text = (f"import the module that registers it, or install the package that declares it as an entry point "
                f"of the group {self.group!r}")
        if self.failures:
            text += f"; entry points that failed to load: {'; '.join(self.failures)}"
        return text
