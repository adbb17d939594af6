"""Curricula: which buffer samples a window trains on, configured and measured.

Modules:
    policies  the sampling policies (difficulty buckets, failure replay, quotas, novelty)
    config    ``policy.yaml``: a list of policies, validated strictly
    metrics   what each window's curriculum did, and a plot of it
"""
