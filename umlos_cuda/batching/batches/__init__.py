"""Batch files: one collated microbatch per ``.npz``, written, read and fingerprinted.

Modules:
    npz          the file format and the folder that holds the files
    fingerprint  content fingerprints of batches: what the model saw
    writer       write a plan's microbatches (``umlos-cuda batch generate``)
    reader       read them back by epoch, index or rank, verified
"""
