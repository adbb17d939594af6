"""Rolling plan windows: batch plans over snapshots of the replay buffer, logged and replayed.

Modules:
    rolling           :class:`RollingBatchPlanWindow`
    log               the window log: one JSON line per window
    replay            rebuild every logged window offline and prove its fingerprints
    checkpoint_kinds  the ``plan_window`` cursor kind inside checkpoints
"""
