"""Who is pulling a batch sampler's iterator: a DataLoader with workers, or the loop itself.

A ``DataLoader`` with ``num_workers > 0`` asks its batch sampler for
``prefetch_factor * num_workers`` batches before the loop has used one, so a
cursor that counts what the sampler handed out runs ahead of what training
consumed, and a plain ``state_dict()`` saved then would skip the prefetched
batches on resume. The sampler cannot see the loop, but it can see who calls
``next()`` on its iterator: every ``torch.utils.data`` loader iterator (and
torchdata's ``StatefulDataLoader``) hands out indices through
``_next_index(self)``, whose ``self`` knows its ``_num_workers``.
torchdata's loader snapshots the sampler at the moment it hands a batch out
and restores exactly; :func:`called_by_torchdata` tells those calls apart.

Both are frame inspections of private torch names: if a torch release
renames them, the checks say "no" and the sampler stays silent, as before.
"""

from __future__ import annotations

import sys


def pulled_by_workers(depth: int = 2) -> bool:
    """True when the frame ``depth`` levels up (the caller of ``next()`` on a
    generator that calls this) is a loader iterator with worker processes."""
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return False
    if frame.f_code.co_name != "_next_index":
        return False
    workers = getattr(frame.f_locals.get("self"), "_num_workers", 0)
    return isinstance(workers, int) and workers > 0


def called_by_torchdata(depth: int = 2) -> bool:
    """True when the function ``depth`` levels up belongs to torchdata (its loader saving a snapshot)."""
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return False
    return str(frame.f_globals.get("__name__", "")).startswith("torchdata.")
