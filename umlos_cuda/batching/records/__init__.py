"""Training records as they are kept: JSONL (plain, gzip, zstd), Parquet, Arrow IPC, Hugging Face datasets, shards.

Modules:
    chunk        what every reader hands on: :class:`Field`, :class:`RecordChunk`, :class:`SkippedLines`
    jsonl        JSONL records, line by line, each line checked
    compressed   gzip and zstd JSONL decompressed as a bounded stream, each frame whole
    arrow        Parquet and Arrow IPC files through pyarrow, batch by batch, each read to its end
    columns      the rows of a columnar batch checked as JSONL lines are, then their values
    hf           a ``datasets.Dataset``, and a folder ``save_to_disk`` wrote
    shards       which files a dataset argument names, their order and format
    ids          sample ids of rows that have none (row numbers; shard content hash and row)
    fingerprint  the dataset fingerprint over the canonical values read, format-independent
    source       :class:`Records`: any of the above as one stream of chunks

This package only re-exports (docs/batching.md, "Your data: Parquet, datasets, JSONL").
"""

from typing import TYPE_CHECKING

from ...reexports import lazy

if TYPE_CHECKING:  # the re-exports, imported on first use (umlos_cuda/reexports.py)
    from .chunk import Field, RecordChunk, RowIds, SkippedLines
    from .shards import FORMATS
    from .source import Records, open_records

__all__ = ["FORMATS", "Field", "RecordChunk", "Records", "RowIds", "SkippedLines", "open_records"]

__getattr__, __dir__ = lazy(__name__, __file__)
