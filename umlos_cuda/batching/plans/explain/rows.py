"""What one unit of a plan trains on, row by row: the records ``plan explain`` lists, built from the plan.

What goes in: a unit of a plan (a :class:`~..plan.MicrobatchSpec`, or the pieces of documents a cut sample is
made of) and the sources it reads (a length source, or a token source, which also gives loss masks). What comes
out: the unit as a plain dict, ``{"index", ..., "tokens", "loss_tokens", "rows": [...]}``, each row a dict of
:data:`ROW_FIELDS` (docs/batching.md, "Explaining a step", is the schema):

* ``sample``: the sample id as the plan names it (a whole plan's ids; a row number; ``name:row`` in a mixture);
* ``row``: the dataset row a batch sampler hands out for it (a mixed plan's: its components read one after
  another); None for a piece of a cut sample, whose sampler hands out ``(epoch, k)`` keys;
* ``component``, ``component_epoch``: the mixture component it comes from and that component's epoch (None
  outside a mixture);
* ``source``, ``document``: the file or folder the document is read from (a listed source's part; None for
  lengths held in memory) and its row there;
* ``piece``: the piece number of a split sample (else None); ``pack``: the packed row of its microbatch it
  sits in (a packed plan; else None);
* ``start``, ``stop``: the token range of the document taken, ``[start, stop)`` (a cut sample's piece may end
  one past the document: the appended EOS); ``tokens``: ``stop - start``;
* ``loss_tokens``: of those tokens, how many the collated batch trains on (the sum of its ``loss_mask``); None
  when no token source is known.

Nothing here reads more than the unit's own rows.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from .... import errors
from ....errors import UmlosError

#: The keys of every row, in order.
ROW_FIELDS = ("sample", "row", "component", "component_epoch", "source", "document", "piece", "pack", "start",
              "stop", "tokens", "loss_tokens")

#: A plan's ``origin`` when its kind says nothing of one: built from its sources, edited never.
NO_ORIGIN: dict[str, Any] = {"parent": None, "edits": []}


def has_tokens(source: Any) -> bool:
    """Whether ``source`` gives token arrays (and so loss masks), not lengths alone."""
    return source is not None and callable(getattr(source, "arrays", None))


def locate(source: Any, rows: np.ndarray) -> tuple[list[str | None], np.ndarray]:
    """Where each of ``rows`` is read: the path of the source (of its part, for a list of sources) and the row
    there."""
    rows = np.asarray(rows, dtype=np.int64)
    starts = getattr(source, "starts", None)
    parts = getattr(source, "parts", None)
    if parts is None or starts is None:
        return [path_of(source)] * int(rows.shape[0]), rows
    which = np.searchsorted(np.asarray(starts), rows, side="right") - 1
    return [path_of(parts[int(i)]) for i in which.tolist()], rows - np.asarray(starts, dtype=np.int64)[which]


def path_of(source: Any) -> str | None:
    """The path ``source`` was opened from: its ``origin`` (a source opened by ``open_source``), a token store's
    folder, a Megatron dataset's prefix; None for one held in memory."""
    for name in ("origin", "root", "prefix"):
        value = getattr(source, name, None)
        if isinstance(value, (str, os.PathLike)):
            return os.fspath(value)
    return None


def component_sources(given: Sequence[Any], recorded: Sequence[Any]) -> list[Any]:
    """The token sources given for a mixture's components, one per component, each holding as many rows as the
    component's recorded source (BATCH_STORE_MISMATCH otherwise)."""
    if len(given) != len(recorded):
        raise _mismatch(f"{len(given)} token source(s) given for a mixture of {len(recorded)} components; give one per "
                        "component, in component order")
    for i, (source, own) in enumerate(zip(given, recorded)):
        if len(source) != own.count:
            raise _mismatch(f"component {i}: the token source given holds {len(source)} rows; the component was "
                            f"planned from {own.count}")
    return list(given)


def _mismatch(message: str) -> UmlosError:
    return UmlosError(errors.BATCH_STORE_MISMATCH, message, operator=errors.BATCHING_OPERATOR)


def mask_sum(source: Any, row: int, start: int, stop: int, *, eos: bool = False, skip_first: bool = False) -> int:
    """Loss-mask ones of ``row``'s tokens ``[start, stop)`` in ``source``; ``eos``: a position at or past the
    document's end is its appended EOS, trained on (a cut sample's rule); ``skip_first``: the first of them is an
    input only (the first token of a cut sample)."""
    mask = source.arrays(int(row))[1]
    real = max(0, min(stop, int(mask.shape[0])) - start)
    ones = int(np.count_nonzero(mask[start:start + real]))
    if eos and stop - start > real:  # the appended EOS (one token: a piece ends at it)
        ones += 1
    if skip_first and stop > start:
        ones -= int(bool(mask[start])) if real else 1
    return ones


def row_record(*, start: int, stop: int, **fields: Any) -> dict:
    """One row, every key of :data:`ROW_FIELDS` present (None where the plan has nothing to say); ``tokens`` is
    ``stop - start``."""
    return {name: fields.get(name) for name in ROW_FIELDS} | {"start": start, "stop": stop, "tokens": stop - start}


def unit_record(index: int, rows: list[dict], **extra: Any) -> dict:
    """A unit: its global index in its epoch, ``extra`` (what its kind says of it), its totals and its rows;
    ``loss_tokens`` is None unless every row has one."""
    losses = [row["loss_tokens"] for row in rows]
    return {"index": index, **extra, "tokens": sum(row["tokens"] for row in rows),
            "loss_tokens": None if any(v is None for v in losses) else sum(losses), "rows": rows}


def microbatch_unit(spec: Any, lengths: np.ndarray, source: Any, *, components: Sequence[str | None] | None = None,
                    component_epochs: Sequence[int | None] | None = None, documents: np.ndarray | None = None,
                    window: int | None = None) -> dict:
    """The unit of one microbatch (a :class:`~..plan.MicrobatchSpec`): each sample's row, the range the collator
    takes (``spec.spans``, else the whole sample: ``lengths``, one per sample), its piece and packed row, and its
    loss tokens from ``source`` when it gives tokens. A mixture gives its rows' ``components``,
    ``component_epochs`` and ``documents`` (rows in each component's source), and as ``source`` one source per
    row (its component's). ``window``: the window that planned the microbatch (None: a whole plan)."""
    rows = np.asarray(spec.rows, dtype=np.int64)
    count = int(rows.shape[0])
    spans = np.asarray(spec.spans, dtype=np.int64) if spec.spans is not None else \
        np.stack((np.zeros(count, dtype=np.int64), np.asarray(lengths, dtype=np.int64)), axis=1)
    packs = [None] * count if spec.pack_sizes is None else \
        np.repeat(np.arange(len(spec.pack_sizes)), spec.pack_sizes).tolist()
    if documents is None:  # one source, read by the rows themselves
        sources, reads = [source] * count, rows
        paths, documents = locate(source, rows)
    else:  # a mixture: each row read from its component's source, by its own row there
        sources, reads = list(source), np.asarray(documents, dtype=np.int64)
        where = [locate(s, reads[b:b + 1]) for b, s in enumerate(sources)]
        paths, documents = [w[0][0] for w in where], np.asarray([int(w[1][0]) for w in where], dtype=np.int64)
    out = []
    for b in range(count):
        start, stop = int(spans[b, 0]), int(spans[b, 1])
        out.append(row_record(
            sample=spec.samples[b], row=int(rows[b]), component=None if components is None else components[b],
            component_epoch=None if component_epochs is None else component_epochs[b], source=paths[b],
            document=int(documents[b]), piece=None if spec.pieces is None else int(spec.pieces[b]), pack=packs[b],
            start=start, stop=stop,
            loss_tokens=mask_sum(sources[b], int(reads[b]), start, stop) if has_tokens(sources[b]) else None))
    return unit_record(int(spec.index), out, bucket_id=int(spec.bucket_id), max_len=int(spec.max_len),
                       window=window)


def pieces_unit(k: int, pieces: Sequence[Any], source: Any, *, ids: Sequence[str] | None = None,
                component: str | None = None, component_epoch: int | None = None) -> dict:
    """The unit of one cut sample ``k``: a row per piece of a document (:class:`~..windows.cut.Piece`), its token
    range (one past the document: the appended EOS) and its loss tokens, those of the sample's labels (its first
    token is an input only), so that they add up to the collated sample's ``loss_mask``. ``ids``: the sample
    ids of the source's rows (default: row numbers; a mixture names them ``name:row``)."""
    rows = np.asarray([piece.row for piece in pieces], dtype=np.int64)
    paths, documents = locate(source, rows)
    out = []
    for i, piece in enumerate(pieces):
        stop = piece.offset + piece.count
        out.append(row_record(
            sample=str(piece.row) if ids is None else ids[i], component=component, component_epoch=component_epoch,
            source=paths[i], document=int(documents[i]), start=piece.offset, stop=stop,
            loss_tokens=mask_sum(source, piece.row, piece.offset, stop, eos=True, skip_first=i == 0)
            if has_tokens(source) else None))
    return unit_record(k, out, bucket_id=None, max_len=None, window=None)
