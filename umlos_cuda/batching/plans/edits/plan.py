"""An edited plan in memory: a parent plan of any kind, the edit, and the fingerprint that chains them.

What goes in: an opened parent plan and its :class:`~..kinds.kind.PlanKind`, and a :class:`~.edit.SkipUnits`.
What comes out: :class:`EditedPlan`, which hands out the parent's units minus those the edit leaves out, in the
parent's order, through the interface every sampler and loader already reads (``num_epochs``,
``epoch_microbatches``, ``microbatch_at``, ``sample``, and the parent's rows, configuration and sources, which an
edit does not change). Why a wrapper of any kind rather than an edit layer inside each kind: an edit changes which
units a run takes, never what a unit holds, so one module serves whole, windowed and mixed plans and cut
sequences alike (an edited plan of an edited plan too), and no kind's reader, writer or verifier changes.

The fingerprint is SHA-256 of the canonical CBOR of ``["umlos_edited_plan_v1", parent fingerprint, the canonical
edit, the units of each epoch]``: it names the parent, so a changed parent makes another plan.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from dataclasses import replace

import numpy as np

from .... import errors
from ....hashing import hash_canonical
from ..plan import plan_error
from .edit import SkipRows, SkipUnits

#: The tag the fingerprint starts with.
FINGERPRINT_TAG = "umlos_edited_plan_v1"
#: What an edited plan reads from its parent unchanged: the rows, configuration and sources, which no edit
#: touches. Nothing that takes a unit index is passed through (a unit of an edited plan is not its parent's).
PASSED_THROUGH = frozenset({"config", "dataset", "definition", "lengths", "meta", "row_parts", "sample_ids", "source",
                            "units", "unit_index", "components", "tokens", "tokenizer_hash"})


class EditedPlan:
    """``parent`` (opened, of ``parent_kind``) with the units ``edit`` names left out (module docstring);
    ``parent_path``: where it was read from, which the folder records."""

    def __init__(self, parent: Any, parent_kind: Any, edit: SkipUnits, *, parent_path: str | None = None) -> None:
        shard = getattr(getattr(parent, "meta", None), "shard", None)
        if shard is not None:
            raise plan_error(errors.PLAN_NOT_FOUND, f"{parent_path or 'the plan'} is shard {shard['rank']} of "
                                                    f"{shard['world_size']}: edit the full plan, then shard it")
        if isinstance(edit, SkipRows) and (parent_kind.unit != "microbatch" or not parent_kind.rows
                                           or getattr(parent.config, "pack", None) is not None):
            raise plan_error(errors.BATCHING_CONFIG_INVALID, f"{parent_path or 'the plan'} is a {parent_kind.name}"
                             f"{' that packs' if parent_kind.rows and parent_kind.unit == 'microbatch' else ''}: "
                             "rows are left out of unpacked microbatches of rows only (a packed row or a cut sample "
                             "is a layout of several documents); leave out its steps (--skip-steps)")
        self.parent, self.parent_kind, self.edit, self.parent_path = parent, parent_kind, edit, parent_path
        self._units = [parent.epoch_microbatches(e) - edit.skipped(e) for e in range(parent.num_epochs)]

    def __getattr__(self, name: str) -> Any:
        if name in PASSED_THROUGH:
            return getattr(self.__dict__["parent"], name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __getstate__(self) -> dict:
        return dict(self.__dict__)

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    @property
    def num_epochs(self) -> int:
        return self.parent.num_epochs

    @property
    def fingerprint(self) -> str:
        return hash_canonical([FINGERPRINT_TAG, self.parent.fingerprint, self.edit.canonical(), self._units]).hex()

    def epoch_microbatches(self, epoch: int) -> int:
        """Units of ``epoch`` (microbatches, or samples of a plan of samples): the parent's less those left out."""
        self.parent.epoch_microbatches(epoch)  # the parent's own refusal of an epoch it does not have
        return self._units[epoch]

    def parent_index(self, epoch: int, k: int) -> int:
        """The parent's unit that unit ``k`` of ``epoch`` is (PLAN_CURSOR_INVALID past the epoch's end)."""
        if not 0 <= k < self.epoch_microbatches(epoch):
            raise plan_error(errors.PLAN_CURSOR_INVALID, f"unit {k} is past the end of epoch {epoch} of the edited "
                                                         f"plan ({self._units[epoch]} units)")
        return self.edit.parent_index(epoch, k)

    def microbatch_at(self, epoch: int, k: int) -> Any:
        """Microbatch ``k`` of ``epoch``: the parent's microbatch it is (a whole plan's, or one window planned),
        less the rows the edit leaves out of it (its bucket and ``max_len`` the parent's)."""
        index = self.parent_index(epoch, k)
        spec = parent_microbatch(self.parent, epoch, index)
        kept = self.edit.kept(epoch, index, spec.rows)
        if kept is None:
            return spec
        which = np.flatnonzero(kept)
        return replace(spec, samples=tuple(spec.samples[i] for i in which), rows=np.asarray(spec.rows)[which],
                       spans=None if spec.spans is None else np.asarray(spec.spans)[which],
                       pieces=None if spec.pieces is None else tuple(spec.pieces[i] for i in which))

    def sample(self, *args: Any) -> Any:
        """A plan of samples' sample: ``sample(epoch, k, tokens)``, or a mixture's ``sample(k, tokens)`` (one
        epoch), as the parent takes it, ``k`` mapped to the parent's."""
        if hasattr(self.parent, "components"):
            k, *rest = args
            return self.parent.sample(self.parent_index(0, int(k)), *rest)
        epoch, k, *rest = args
        return self.parent.sample(int(epoch), self.parent_index(int(epoch), int(k)), *rest)

    def origin(self) -> dict:
        """``plan explain``'s origin: the parent's fingerprint and path, and every edit from the first plan built
        from its sources (a parent's own edits first)."""
        from ..explain.rows import NO_ORIGIN

        before = NO_ORIGIN if self.parent_kind.origin is None else self.parent_kind.origin(self.parent)
        return {"parent": self.parent.fingerprint, "parent_path": self.parent_path,
                "edits": [*before["edits"], self.edit.to_dict()]}

    def unit_rows(self, epoch: int, k: int) -> np.ndarray:
        """The dataset rows of microbatch ``k`` of ``epoch`` (for an edit of this plan)."""
        return self.microbatch_at(epoch, k).rows

    def __repr__(self) -> str:
        return (f"EditedPlan({self.parent_kind.name}, {len(self.edit.ranges)} range(s) skipped, "
                f"fingerprint={self.fingerprint})")


def parent_microbatch(plan: Any, epoch: int, k: int) -> Any:
    """Global microbatch ``k`` of ``epoch`` of ``plan``: its ``microbatch_at`` (windowed, mixed, edited plans), else
    a whole plan's by its local index."""
    at = getattr(plan, "microbatch_at", None)
    if at is not None:
        return at(epoch, k)
    return plan.microbatch(epoch, plan.get_epoch(epoch).local_index(k))


def unit_row_chunks(plan: Any, epoch: int, first: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """The dataset rows of ``plan``'s microbatches ``first ..`` of ``epoch`` to the epoch's end, in chunks of
    consecutive microbatches ``(k0, offsets, samples)``: microbatch ``k0 + i`` holds
    ``samples[offsets[i]:offsets[i + 1]]``. Why chunks: an edit that reads every microbatch's rows
    (``--skip-samples``) then works on arrays, not on one ``MicrobatchSpec`` per microbatch. A windowed plan's chunk
    is a window's planned arrays (one window held at a time), a whole plan's the epoch's arrays; any other kind (a
    mixed or an edited plan) gives one microbatch a chunk (:func:`parent_microbatch`)."""
    from ..plan import BatchPlan
    from ..windows.index import locate
    from ..windows.plan import WindowedPlan

    if first >= plan.epoch_microbatches(epoch):
        return
    if isinstance(plan, WindowedPlan):
        w, local = locate(plan.index, epoch, first)
        for window in range(w, plan.definition.num_windows):
            arrays = plan.window(epoch, window)
            yield int(plan.index[epoch, window, 0]) + local, np.asarray(arrays.offsets[local:]), arrays.samples
            local = 0
        return
    whole = plan.get_epoch(epoch) if isinstance(plan, BatchPlan) else None
    if whole is not None and (whole.index_base, whole.index_step) == (0, 1):  # not a shard: local is global
        yield first, np.asarray(whole.offsets[first:]), whole.samples
        return
    yield from single_row_chunks(plan, epoch, first)


def single_row_chunks(plan: Any, epoch: int, first: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """:func:`unit_row_chunks` one microbatch a chunk, each read through :func:`parent_microbatch` (any plan of
    rows; the reference the chunked scans are tested and timed against)."""
    for k in range(first, plan.epoch_microbatches(epoch)):
        rows = np.asarray(parent_microbatch(plan, epoch, k).rows)
        yield k, np.array([0, rows.shape[0]], dtype=np.int64), rows
