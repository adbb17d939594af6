"""JSONL records: kept here for the importers of ``umlos_cuda.batching.lengths.jsonl``.

The reader moved to umlos_cuda/batching/records/jsonl.py (with the other
formats' readers); this module re-exports its names.
"""

from ..records.chunk import RecordChunk, SkippedLines
from ..records.jsonl import (BOM, DEFAULT_ID_FIELD, RecordProblem, invalid_record, read_chunks, require_dataset_file,
                             stream_chunks, unreadable)

__all__ = ["BOM", "DEFAULT_ID_FIELD", "RecordChunk", "RecordProblem", "SkippedLines", "invalid_record", "read_chunks",
           "require_dataset_file", "stream_chunks", "unreadable"]
