"""Unpaired preference records (KTO: a prompt, a completion and a label) as rows whose ids carry the label.

What goes in: chunks of unpaired records of strings (values: prompt,
completion, label), or sample ids. What comes out: chunks of
prompt/response rows, one a record, and each row's label read back from its id.

Record ``X`` becomes one row, ``X/desirable`` when its label is true (TRL's
``label=True``: a completion to make more likely) and ``X/undesirable``
when it is false. A row of strings is exactly the sample of a
prompt/response record (the instruction template of
umlos_cuda/batching/templates.py, loss mask 0 over the prompt); a row of
conversations is rendered as umlos_cuda/batching/chat/preference.py says.

The label lives in the id for the reason a pair's does (lengths/pairs.py):
the id travels with every form of the length cache, with the plan (its
sample ids) and with every batch file (``sample_ids``), so a training loop
reads a row's label where it reads the row,
``unpaired_labels(microbatch.samples)``, and no second file can fall out of
step with the rows. The length cache and the token store keep their formats.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ... import errors
from ...errors import UmlosError
from ..records.chunk import RecordChunk

DESIRABLE_SUFFIX = "/desirable"
UNDESIRABLE_SUFFIX = "/undesirable"


def unpaired_id(record_id: str, label: bool) -> str:
    """The id of record ``record_id``'s row: ``X/desirable`` when ``label`` is true, else ``X/undesirable``."""
    return record_id + (DESIRABLE_SUFFIX if label else UNDESIRABLE_SUFFIX)


def unpaired_rows(chunk: RecordChunk) -> RecordChunk:
    """A chunk of unpaired records of strings (values: prompt, completion, label) as a chunk of
    prompt/response rows (values: prompt, completion), the label in each row's id."""
    prompts, completions, labels = chunk.values
    ids = [unpaired_id(record_id, label) for record_id, label in zip(chunk.sample_ids, labels)]
    return RecordChunk(ids, [list(prompts), list(completions)], chunk.first_line, chunk.bytes_read, chunk.shard)


def unpaired_labels(sample_ids: Sequence[str]) -> np.ndarray:
    """Each row's label (True: desirable) from its id; LENGTHS_INVALID naming the first id that
    carries none (the rows are not those of unpaired records)."""
    labels = np.empty(len(sample_ids), dtype=bool)
    for index, sample_id in enumerate(sample_ids):
        text = str(sample_id)
        if text.endswith(DESIRABLE_SUFFIX):
            labels[index] = True
        elif text.endswith(UNDESIRABLE_SUFFIX):
            labels[index] = False
        else:
            raise UmlosError(errors.LENGTHS_INVALID, f"sample {index} has the id {text[:200]!r}, which carries no "
                             "label: the rows of unpaired records end with /desirable or /undesirable (build them "
                             "with --prompt-field P --completion-field C --label-field L)",
                             operator=errors.BATCHING_OPERATOR)
    return labels
