"""Plans of rows: what a consumer that writes or reads a plan's microbatches asks of every kind of plan of rows.

What goes in: a plan whose microbatches list dataset rows (a kind with ``rows``: a whole plan or a shard of one,
a windowed plan, a mixed plan, or a kind registered later) and what its rows are read from. What comes out: the
token source of its rows (of each part of them: :func:`open_row_parts`), checked to hold the rows the plan was
made from (:func:`open_row_source`), its
microbatches in order (:func:`iter_microbatches`), and a rank's share of an epoch's (:func:`rank_share`).

:class:`RowPlan` is the protocol every such plan answers, so ``batch generate`` and ``BatchReader`` never ask
which kind a plan is: the plan cursor's (:class:`~.windows.resume.ResumablePlan`: the fingerprint, the epochs,
each epoch's length, microbatch ``k`` by random access) and besides: the full plan's fingerprint
(``source_fingerprint``: a shard names its source's), the configuration (how it packs), the global indices of an
epoch this plan holds (``epoch_indices``: a shard holds its rank's) and the datasets its rows index, one after
another (``row_parts``: one, or a mixture's components).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from ... import errors
from ...errors import UmlosError
from ..sources import open_source
from ..sources.listed import SourceList
from ..tokens.sources import open_token_source
from .config import BatchingConfig
from .integrity import check_parts_match_plan, check_rows_match_plan
from .plan import MicrobatchSpec, RowPart
from .sharding import check_rank
from .windows.resume import ResumablePlan, rank_indices


class RowPlan(ResumablePlan, Protocol):
    """A plan whose microbatches are dataset rows (see the module docstring)."""

    @property
    def source_fingerprint(self) -> str | None: ...

    @property
    def config(self) -> BatchingConfig: ...

    def epoch_indices(self, epoch: int) -> range: ...

    def row_parts(self) -> tuple[RowPart, ...]: ...


def open_row_source(plan: RowPlan, store: Any, *, check: bool = True) -> Any:
    """The token source of ``plan``'s rows: :func:`open_row_parts`, a mixture's parts read as one ``SourceList``
    (global rows, one tokenizer)."""
    return join_parts(open_row_parts(plan, store, check=check))


def open_row_parts(plan: RowPlan, store: Any, *, check: bool = True) -> list[Any]:
    """The token source of each part of ``plan``'s rows (``row_parts``), in order, each checked to hold its part
    unless ``check=False`` (for a caller that checks them itself; :func:`~.integrity.check_rows_match_plan`:
    BATCH_STORE_MISMATCH, naming a mixture's component that differs and its source).

    ``store``: for a plan of one dataset, what ``open_token_source`` opens (a token store, sharded or not, a
    Megatron prefix, several prefixes read as one) under the tokenizer the plan names; for a plan of several (a
    mixture), one token source per component, in the plan's order (BATCH_STORE_MISMATCH naming the components
    when their number differs), or a ``SourceList`` of them. An opened source is taken as is."""
    parts = plan.row_parts()
    if len(parts) == 1:
        source = open_token_source(store, tokenizer_hash=parts[0].tokenizer_hash)
        if check:
            check_rows_match_plan(source, plan)
        return [source]
    given = store.parts if isinstance(store, SourceList) else list(store) if isinstance(store, (list, tuple)) \
        else [store]
    if len(given) != len(parts):
        names = ", ".join(repr(part.name) for part in parts)
        raise UmlosError(errors.BATCH_STORE_MISMATCH, f"the plan reads {len(parts)} datasets one after another "
                         f"({names}); give one token source for each, in that order (--source A B ...), not "
                         f"{len(given)}", operator=errors.BATCHING_OPERATOR)
    pieces = [open_source(item, tokens=True) for item in given]
    if check:
        check_parts_match_plan(pieces, plan)
    return pieces


def join_parts(pieces: list[Any]) -> Any:
    """The token sources of a plan's parts (:func:`open_row_parts`) as the one source its rows index."""
    return pieces[0] if len(pieces) == 1 else SourceList(pieces)


def iter_microbatches(plan: RowPlan) -> Iterator[tuple[int, MicrobatchSpec]]:
    """``(epoch, microbatch)`` of every microbatch ``plan`` holds, epoch by epoch, in order (a windowed plan keeps
    the window it planned last, so each window is planned once)."""
    for epoch in range(plan.num_epochs):
        for index in plan.epoch_indices(epoch):
            yield epoch, plan.microbatch_at(epoch, index)


def rank_share(indices: range, rank: int, world_size: int) -> Sequence[int]:
    """The indices of ``indices`` that rank ``rank`` of ``world_size`` takes (global microbatch ``k`` goes to rank
    ``k mod world_size``, the rule of every plan's sharding and resume); INVALID_RANK for a wrong rank."""
    rank, world_size = check_rank(rank, world_size)
    if indices.step == 1:
        return rank_indices(indices.start, indices.stop, rank, world_size)
    return tuple(k for k in indices if k % world_size == rank)  # a shard's indices, shared again
