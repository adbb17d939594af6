"""Batch files: one collated microbatch per file, written, read and fingerprinted.

Modules:
    npz          the six-array file format (the seed's layout) and the folder that holds the files
    compact      the compact encoding: tokens once, masks bit-packed or derived
    layouts      the layouts a folder can have (compact, compact + zstd, npz), read and written alike
    fingerprint  content fingerprints of batches: what the model saw
    provenance   what a folder of a plan of any kind but the whole plan records of that kind and its token sources
    writer       write a plan's microbatches (``umlos-cuda batch generate``), whatever its kind of rows
    reader       read them back by epoch, index or rank, verified
"""
