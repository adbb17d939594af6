"""``pack_sequences``: token sequences in, the packing decision and its metrics out.

The steps:

1. each input becomes a :class:`SequenceToPack` (a ``Sample``, a mapping
   with ``input_ids``, a list of ids, ...);
2. sequences longer than ``max_length`` are handled by the config's
   :class:`OversizePolicy` (:func:`oversize_pieces`): refused, skipped,
   truncated or split, each counted;
3. :func:`pack_lengths` assigns every piece a row;
4. the pieces are grouped by row (input order inside a row) into flat
   arrays, and the metrics are counted from lengths and the loss tokens
   each ``SequenceToPack`` counted when it was made.

The result is a :class:`~.view.PackedRows`: it lays out a row's arrays
(:func:`~.rows.layout_rows`) only when the row is asked for, so the call
costs a few numbers per sequence, not four int32 arrays per token. The
only Python work per sequence is reading its two counts.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import cast

import numpy as np

from ... import errors
from .pieces import ObjectPieces
from .rows import SequenceToPack, as_sequence
from .pack import pack_lengths
from .config import OversizePolicy, PackingConfig, PackingMode, packing_error
from .metrics import PackingMetrics
from .view import PackedRows

_LENGTH = operator.attrgetter("length")


def as_sequences(sequences: Iterable) -> list[SequenceToPack]:
    """Every input as a :class:`SequenceToPack` (:func:`as_sequence`), the
    ``i``-th named ``str(i)`` when it has no id of its own. A list that
    already holds only ``SequenceToPack`` objects is copied as it is (their
    checks ran when they were made; the copy keeps a lazy result from
    seeing later changes to the caller's list), in one C-level type scan."""
    if isinstance(sequences, list) and set(map(type, sequences)) <= {SequenceToPack}:
        return sequences.copy()
    return [as_sequence(item, i) for i, item in enumerate(sequences)]


def oversize_pieces(lengths: np.ndarray, max_length: int, oversize: OversizePolicy | str,
                    sample_ids=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pieces to pack: ``(source, start, length)`` arrays, in input order.

    Sequences of at most ``max_length`` tokens are one piece each. A longer
    one is, by ``oversize``: refused (PACKING_SEQUENCE_TOO_LONG naming the
    first ones, by ``sample_ids`` when given), skipped (no piece), truncated
    (one piece of ``max_length``), or split (pieces of ``max_length``, the
    last one shorter).
    """
    oversize = OversizePolicy.parse(oversize)
    lengths = np.asarray(lengths, dtype=np.int64)
    over = lengths > max_length
    if not over.any():  # the common case: one whole piece per sequence (what the general steps give)
        return np.arange(lengths.shape[0], dtype=np.int64), np.zeros(lengths.shape[0], dtype=np.int64), lengths.copy()
    if oversize is OversizePolicy.REFUSE:
        where = np.flatnonzero(over)
        named = ", ".join(f"{'position ' + str(int(i)) if sample_ids is None else repr(sample_ids[int(i)])} "
                          f"({int(lengths[i])} tokens)" for i in where[:5])
        raise packing_error(errors.PACKING_SEQUENCE_TOO_LONG,
                            f"{where.size} sequence(s) longer than max_length {max_length}: {named}"
                            f"{', ...' if where.size > 5 else ''}; set oversize to skip, truncate or split")
    if oversize is OversizePolicy.SPLIT:
        counts = np.maximum(-(-lengths // max_length), 1)
    else:
        counts = np.where(over & (oversize is OversizePolicy.SKIP), 0, 1)
    source = np.repeat(np.arange(lengths.shape[0], dtype=np.int64), counts)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    start = (np.arange(source.shape[0], dtype=np.int64) - first) * max_length
    piece = np.minimum(lengths[source] - start, max_length)
    return source, start, piece


def pack_sequences(sequences: Iterable, max_length: int = 2048, mode: PackingMode | str = PackingMode.FIRST_FIT, *,
                   separator_ids=(), oversize: OversizePolicy | str = OversizePolicy.REFUSE,
                   config: PackingConfig | None = None, backend: str = "auto") -> PackedRows:
    """Pack ``sequences`` into rows of at most ``max_length`` tokens (see the module docstring).

    ``config`` (a :class:`PackingConfig`) replaces ``max_length``, ``mode``,
    ``separator_ids`` and ``oversize``. Rows are in the order they are
    opened; ``result.metrics`` counts what was packed, skipped, truncated
    and split. The result is a :class:`PackedRows`: ``len``, iteration and
    indexing as on a list of :class:`PackedRow`, each row laid out when it
    is asked for (``result.rows(a, b)``, ``result.microbatches(k)``,
    ``result.materialize()`` for all at once). ``backend`` (``auto``,
    ``native`` or ``python``) picks the implementation of both steps, the
    packing and the layout of the rows; all give the same rows bit for bit.
    """
    config = packing_config(config, max_length, mode, separator_ids, oversize)
    items = as_sequences(sequences)
    lengths = np.fromiter(map(_LENGTH, items), dtype=np.int64, count=len(items))
    return pack_pieces(lengths, ObjectPieces(items), config, backend)


def packing_config(config: PackingConfig | None, max_length: int, mode, separator_ids, oversize) -> PackingConfig:
    """``config``, or the one the other keyword arguments of ``pack_sequences`` describe."""
    if config is not None:
        return config
    # cast: PackingConfig.__post_init__ parses a mode's or policy's name, in its own order of checks
    return PackingConfig(max_length, cast(PackingMode, mode), tuple(separator_ids), cast(OversizePolicy, oversize))


def pack_pieces(lengths: np.ndarray, pieces, config: PackingConfig, backend: str = "auto") -> PackedRows:
    """Steps 2 to 4 of the module docstring on the sequences' ``lengths``
    (int64), whatever holds their tokens (``pieces``, a reader of
    :mod:`.pieces`): what ``pack_sequences`` and the flat-array entry points
    of :mod:`.columns` share."""
    over = lengths > config.max_length
    oversized = bool(over.any())
    refused = config.oversize is OversizePolicy.REFUSE and oversized
    source, start, piece = oversize_pieces(lengths, config.max_length, config.oversize,
                                           _Names(pieces.sample_id) if refused else None)
    rows_of = pack_lengths(piece, config.max_length, config.mode, config.separator_len, backend=backend)
    num_rows = int(rows_of.max()) + 1 if rows_of.size else 0
    order = np.argsort(rows_of, kind="stable")  # pieces grouped by row, input order inside a row
    row_offsets = np.zeros(num_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows_of, minlength=num_rows), out=row_offsets[1:])
    loss_tokens = pieces.loss_tokens(lengths, source, start, piece, oversized)
    skipped = over & (config.oversize is OversizePolicy.SKIP)
    truncated = over & (config.oversize is OversizePolicy.TRUNCATE)
    metrics = PackingMetrics(
        config.max_length, int(lengths.shape[0]), int(piece.shape[0]), num_rows, int(piece.sum()),
        config.separator_len * (int(piece.shape[0]) - num_rows), loss_tokens,
        skipped=int(skipped.sum()), truncated=int(truncated.sum()),
        truncated_tokens=int((lengths[truncated] - config.max_length).sum()),
        split=int((over & (config.oversize is OversizePolicy.SPLIT)).sum()),
        skipped_ids=tuple(map(pieces.sample_id, np.flatnonzero(skipped).tolist())),
    )
    return PackedRows(pieces, row_offsets, source[order], start[order], piece[order], metrics, config, backend)


class _Names:
    """``names[i]``: sequence ``i``'s id, asked only for the few a refusal names."""

    def __init__(self, sample_id) -> None:
        self.sample_id = sample_id

    def __getitem__(self, index: int) -> str:
        return self.sample_id(index)
