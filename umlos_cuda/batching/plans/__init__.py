"""Batch plans: token-budget microbatches of every epoch, on the engine's order.

Modules:
    config            :class:`BatchingConfig`: buckets, token budget, pad policy, seed, order
    buckets           which bucket a length belongs to
    overlong          what a sample longer than max_length becomes: truncated, split, skipped
    splits            train/validation splits by a keyed hash of the sample id
    units             the (row, piece, token range) units a plan orders, after split and over-long policy
    planner           one epoch's microbatches, in NumPy
    packing           packed plans: microbatches of rows, each row several samples
    groups            plans of preference pairs: both rows of a pair in one microbatch
    builder           :class:`BatchPlanBuilder`: lengths and a config to a plan
    plan              :class:`BatchPlan` in memory
    stats             the numbers of one epoch (``stats.json``)
    fingerprint       SHA-256 over a plan's canonical content
    io                plan folders on disk
    verify            every invariant of a plan folder, and that it rebuilds
    sharding          split a plan across ranks
    rows              what every plan of rows answers (whole, windowed, mixed) and the token source of its rows
    checkpoint_kinds  the ``plan`` cursor kind inside checkpoints
    windows/          windowed plans: a window of the order at a time, a per-window index, random access
    explain/          ``plan explain``: what each rank trains on at a step of a run, row by row
    edits/            ``plan edit``: a plan of any kind with units left out, its fingerprint chained to its parent's
"""
