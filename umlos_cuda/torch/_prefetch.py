"""What the training loop has consumed of a sampler's pass, when a DataLoader with workers runs ahead.

A ``DataLoader`` with ``num_workers > 0`` asks its (batch) sampler for
``prefetch_factor * num_workers`` batches before the loop has used one, and
for one more each time it hands the loop a batch. A cursor that counts what
the sampler handed out therefore runs that far ahead of what training
consumed, and a ``state_dict()`` saved from it would skip the prefetched
batches on resume. The sampler cannot see the loop, but it can see who calls
``next()`` on its iterator: every ``torch.utils.data`` loader iterator (and
torchdata's ``StatefulDataLoader``) hands out indices through
``_next_index(self)``, and that iterator keeps the batches it has sent to
workers and not yet returned in a dict, ``_task_info``, keyed by task
number (tasks ``[returned, sent)`` when batches come back in order). So a
pass remembers that dict (:class:`LoaderLink`): the batches the loop has
received are the smallest key, or all of them once the dict is empty. The
dict outlives the loader iterator (a ``break`` frees it); a weak reference
to the iterator turns it into a count when the iterator goes, so no
prefetched tensors are kept alive.

torchdata's loader snapshots the sampler itself, at the moment it sends a
batch to a worker, and wants the cursor of what was handed out then;
:func:`called_by_torchdata` tells those calls apart.

These are inspections of private torch names (``_next_index``,
``_num_workers``, ``_task_info``, ``_in_order``, ``_index_sampler``). If a
torch release renamed the loader's ``_task_info``, ``_in_order`` or
``_index_sampler``, the link would not be exact and ``state_dict()`` would
warn; if it renamed ``_next_index`` or ``_num_workers``, the loader would not
be found and the sampler would count what it handed out, as before.
tests/test_torch_prefetch_resume.py fails in both cases.
"""

from __future__ import annotations

import sys
import warnings
import weakref
from types import FrameType
from typing import Any

#: How many frames above the sampler's generator the loader's ``_next_index``
#: may be: a batch sampler wrapping a sampler (``BatchSampler``,
#: ``PackedBatchSampler``) adds one or two.
_SEARCH_FRAMES = 8


def items_per_batch(loader: Any, sampler: Any, batches: bool) -> int | None:
    """How many of ``sampler``'s items make one of ``loader``'s batches, or None when that is unknown.

    ``batches``: the sampler is a batch sampler (one item per batch, also
    through a wrapper with ``.sampler``). Otherwise the loader's own
    ``BatchSampler`` (``batch_size=B``) takes ``B`` items per batch, and a
    loader without automatic batching (``batch_size=None``) one.
    """
    index_sampler = getattr(loader, "_index_sampler", None)
    if index_sampler is sampler:
        return 1
    if getattr(index_sampler, "sampler", None) is not sampler:
        return None
    if batches:
        return 1
    size = getattr(index_sampler, "batch_size", None)
    return size if isinstance(size, int) and size > 0 else None


class LoaderLink:
    """Batches a loader iterator with workers has handed to the loop in one pass.

    ``exact`` is False when the count cannot be known: the loader returns
    batches out of order (``in_order=False``), the sampler sits under a batch
    sampler of unknown size, or torch's internals are not the expected ones.
    """

    def __init__(self, loader: Any, per_batch: int | None) -> None:
        tasks = getattr(loader, "_task_info", None)
        self.exact = isinstance(tasks, dict) and getattr(loader, "_in_order", True) is not False \
            and per_batch is not None
        self._per_batch = per_batch or 1
        self._returned: int | None = None  # frozen count once the loader is gone (None: all)
        try:
            self._ref = weakref.ref(loader, self._freeze) if self.exact else None
        except TypeError:  # not weakly referenceable: not the loader iterator this expects
            self.exact = False
        self._tasks: dict | None = tasks if self.exact else None

    def _freeze(self, _ref: Any) -> None:
        self._returned = self._returned_now()
        self._tasks = None

    def _returned_now(self) -> int | None:
        """The first task the loop has not received, or None when it received every task sent."""
        tasks = self._tasks
        return min(tasks) if tasks else None

    def __getstate__(self) -> dict[str, Any]:
        """A copy (pickle, ``copy.deepcopy`` of a sampler mid-pass) keeps the count as it is now,
        without the loader's dict or the weak reference, which do not pickle."""
        returned = self._returned_now() if self._tasks is not None else self._returned
        return {"exact": self.exact, "_per_batch": self._per_batch, "_returned": returned, "_ref": None,
                "_tasks": None}

    def consumed(self, handed_out: int) -> int:
        """Of the ``handed_out`` items of this pass, how many reached the loop."""
        returned = self._returned_now() if self._tasks is not None else self._returned
        if returned is None:
            return handed_out
        return min(handed_out, returned * self._per_batch)


def loop_count(link: LoaderLink | None, handed_out: int, sampler: str, items: str, argument: str) -> int | None:
    """What a plain ``state_dict()`` of ``sampler`` (a class name) counts: None to keep the sampler's
    own cursor (no loader with workers pulls the pass, the loop has received all ``handed_out``
    items, or torchdata is taking its snapshot), else the ``items`` the loop has received. Where the
    loader cannot say, warns that the state counts what was handed out, naming ``argument``."""
    if link is None or called_by_torchdata():
        return None
    if not link.exact:
        warnings.warn(f"{sampler}.state_dict(): a DataLoader with workers has fetched {items} ahead of the loop "
                      "and cannot say which the loop used (in_order=False, or a batch sampler around this one "
                      f"that it does not know), so this state counts them as used and a resume would skip them; "
                      f"pass state_dict({argument}=K), K the {items} the loop used in this pass", stacklevel=3)
        return None
    used = link.consumed(handed_out)
    return used if used < handed_out else None


def link_for(sampler: Any, batches: bool) -> LoaderLink | None:
    """A :class:`LoaderLink` when a loader with workers is pulling ``sampler``'s pass now, else None.
    Call it from the sampler's generator while it produces an item."""
    loader = _pulling_loader()
    if loader is None:
        return None
    return LoaderLink(loader, items_per_batch(loader, sampler, batches))


def _pulling_loader() -> Any:
    """The loader iterator with worker processes whose ``_next_index`` is on the stack a few frames
    up (above the sampler's generator and any wrapping batch sampler), or None."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(_SEARCH_FRAMES):
        if frame is None:
            return None
        if frame.f_code.co_name == "_next_index":
            loader = frame.f_locals.get("self")
            workers = getattr(loader, "_num_workers", 0)
            return loader if isinstance(workers, int) and workers > 0 else None
        frame = frame.f_back
    return None


def called_by_torchdata() -> bool:
    """True when the first caller outside this package belongs to torchdata (its loader saving a
    snapshot of the sampler), so that a wrapper (``PackedBatchSampler``) passes the call through."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith("umlos_cuda."):
        frame = frame.f_back
    return frame is not None and str(frame.f_globals.get("__name__", "")).startswith("torchdata.")
