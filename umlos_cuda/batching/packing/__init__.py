"""Sequence packing: several sequences in one row of ``max_length`` tokens.

Modules:
    config     :class:`PackingConfig`: row length, mode, separator, oversize policy
    trees      first-fit and best-fit in O(n log n), the Python fallback
    pack       :func:`pack_lengths`: the row of every sequence, from lengths alone
    rows       :class:`PackedRow` and its layout: ids, loss mask, segments, positions
    sequences  :func:`pack_sequences`: token sequences in, the packing decision and metrics out
    columns    :func:`pack_token_arrays`, :func:`pack_token_source`: the same from flat arrays or a token source
    pieces     where a lazy view reads its pieces' tokens from: objects, flat arrays, a token source
    view       :class:`PackedRows`: that decision, its rows laid out on demand
    metrics    how well a packing fills its rows
"""
