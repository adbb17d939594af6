"""``pack_token_arrays`` and ``pack_token_source``: packing without one Python object per sequence.

What goes in: the sequences as flat arrays (every token in one array,
``offsets`` where each sequence starts, an optional flat loss mask) or as
a token source (a token store, a sharded store, a Megatron dataset or list
of them: tokens/sources.py). What comes out: the same lazy
:class:`~.view.PackedRows` as ``pack_sequences``, the same rows for the
same tokens, masks and ids.

``pack_sequences`` takes one :class:`~.rows.SequenceToPack` per sequence:
at 10^6 sequences, making them (each copies its tokens and makes its mask)
costs as long as the packing itself many times over. Here the decision is
computed from the lengths array alone (``np.diff(offsets)``, or the
source's ``lengths``) and the rows asked for are laid out by slicing the
flat arrays (:mod:`.pieces`); the steps in between are ``pack_sequences``'s
own (:func:`~.sequences.pack_pieces`).

What is checked when, for flat arrays: shapes, dtypes, offsets and mask
values at the call (:func:`~.pieces.check_flat`; the mask's pass also
counts the loss tokens); token ids in [0, 2^31 - 1] when their rows are
laid out, with the same code (PACKING_INPUT_INVALID) as a
``SequenceToPack`` would raise at construction. A token source is checked
by its own ``verify()``, which this does not run.
"""

from __future__ import annotations

import numpy as np

from .config import OversizePolicy, PackingConfig, PackingMode
from .pieces import FlatPieces, SourcePieces, check_flat, longest
from .rows import input_error
from .sequences import pack_pieces, packing_config
from .view import PackedRows


def pack_token_arrays(tokens, offsets, loss_mask=None, *, sample_ids=None, max_length: int = 2048,
                      mode: PackingMode | str = PackingMode.FIRST_FIT, separator_ids=(),
                      oversize: OversizePolicy | str = OversizePolicy.REFUSE, config: PackingConfig | None = None,
                      backend: str = "auto") -> PackedRows:
    """Pack the sequences ``tokens[offsets[i]:offsets[i + 1]]`` (see the module docstring).

    Args:
        tokens: one-dimensional integer array (any integer dtype; a
            memory map is read only where rows are laid out).
        offsets: ``N + 1`` non-decreasing integers within ``tokens``; every
            sequence holds at least one token.
        loss_mask: 0s and 1s, one per token of ``tokens``; None: all 1.
        sample_ids: ``N`` strings; None: ``"0"``, ``"1"``, ... (as
            ``pack_sequences`` names sequences given without an id).

    The other arguments are ``pack_sequences``'s. The arrays are read when
    rows are laid out: do not change them in place in between.
    """
    config = packing_config(config, max_length, mode, separator_ids, oversize)
    tokens, offsets, loss_mask, name = check_flat(tokens, offsets, loss_mask, sample_ids)
    lengths = np.diff(offsets)
    pieces = FlatPieces(tokens, offsets, loss_mask, name, longest(lengths, config.max_length))
    return pack_pieces(lengths, pieces, config, backend)


def pack_token_source(source, *, max_length: int = 2048, mode: PackingMode | str = PackingMode.FIRST_FIT,
                      separator_ids=(), oversize: OversizePolicy | str = OversizePolicy.REFUSE,
                      config: PackingConfig | None = None, backend: str = "auto") -> PackedRows:
    """Pack every row of a token source, in its order, each named by ``source.sample_id(row)``.

    ``source`` is an opened source (``open_token_source(path)``: packing
    sits below the token stores and opens none itself). A
    token store is read as flat arrays (:func:`pack_token_arrays`' reader);
    another source row by row (``source.arrays(row)``) for the rows laid
    out, and by its parts' flat masks for the loss tokens when it has them.
    The other arguments are ``pack_sequences``'s.
    """
    if not (hasattr(source, "arrays") and hasattr(source, "lengths") and hasattr(source, "sample_id")):
        raise input_error(f"source must be an opened token source (open_token_source(path)), got "
                          f"{type(source).__name__}")
    config = packing_config(config, max_length, mode, separator_ids, oversize)
    lengths = np.asarray(source.lengths, dtype=np.int64)
    if lengths.size and int(lengths.min()) == 0:
        empty = int(np.flatnonzero(lengths == 0)[0])
        raise input_error(f"sample {source.sample_id(empty)!r} is empty; a packed segment holds at least one token")
    if all(hasattr(source, name) for name in ("tokens", "offsets", "loss_mask_array")):  # a token store
        offsets = np.asarray(source.offsets, dtype=np.int64)
        pieces: FlatPieces | SourcePieces = FlatPieces(source.tokens, offsets, source.loss_mask_array,
                                                       source.sample_id, longest(lengths, config.max_length))
    else:
        pieces = SourcePieces(source)
    return pack_pieces(lengths, pieces, config, backend)
