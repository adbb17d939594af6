"""Preference records (prompt, chosen, rejected) as two adjacent rows, and how a cache says it holds them.

What goes in: chunks of preference records (a prompt, a chosen and a
rejected completion each), or a length cache's sample ids. What comes out:
chunks of rows in the shape of prompt/response records, and whether the
ids are those of pairs.

Record ``X`` (its id, or its 0-based line number) becomes two rows, side
by side and in this order:

* ``X/chosen``: ``template(prompt) + chosen`` and the end-of-sequence token;
* ``X/rejected``: ``template(prompt) + rejected`` and the end-of-sequence token;

each exactly the sample of a prompt/response record (the instruction
template of umlos_cuda/batching/templates.py, loss mask 0 over the prompt),
so the length cache and the token store need no new format.

The ids are the record of being pairs: a length cache holds pairs when its
first id ends with ``/chosen``, and then every row ``2p`` must be some
``X/chosen`` followed by ``X/rejected`` (LENGTHS_INVALID otherwise: an odd
number of rows, or a row out of place). The ids travel with every form of
the cache (its JSONL, which is the source of truth, a token store's
``lengths.jsonl``, a cache built in Python), where a flag in the binary
sidecar would be lost with the sidecar and a plan would then split the
pairs without a word. ``plan build`` reads the ids and plans the pairs
(umlos_cuda/batching/plans/groups.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ... import errors
from ...errors import UmlosError
from ..records.chunk import RecordChunk

CHOSEN_SUFFIX = "/chosen"
REJECTED_SUFFIX = "/rejected"
#: Rows per preference record.
PAIR_ROWS = 2


def pair_ids(record_id: str) -> tuple[str, str]:
    """The ids of the two rows of record ``record_id``: chosen, then rejected."""
    return record_id + CHOSEN_SUFFIX, record_id + REJECTED_SUFFIX


def pair_rows(chunk: RecordChunk) -> RecordChunk:
    """A chunk of preference records (values: prompt, chosen, rejected) as a chunk of
    prompt/response rows, two a record (values: prompt, response); ``first_line`` and
    ``bytes_read`` stay those of the records."""
    prompts, chosen, rejected = chunk.values
    ids: list[str] = []
    responses: list[str] = []
    for record_id, good, bad in zip(chunk.sample_ids, chosen, rejected):
        ids.extend(pair_ids(record_id))
        responses.extend((good, bad))
    return RecordChunk(ids, [[p for p in prompts for _ in range(PAIR_ROWS)], responses], chunk.first_line,
                       chunk.bytes_read)


def holds_pairs(sample_ids: Sequence[str], where: str = "the length cache") -> bool:
    """Whether ``sample_ids`` are those of preference pairs (see the module docstring):
    False when the first id does not end with ``/chosen``; True when every pair of rows is
    ``X/chosen``, ``X/rejected``; LENGTHS_INVALID when the first id says pairs and a later row does not."""
    count = len(sample_ids)
    if count == 0 or not sample_ids[0].endswith(CHOSEN_SUFFIX):
        return False
    if count % PAIR_ROWS:
        raise _invalid(f"{where} holds {count} rows, an odd number, but its ids name preference pairs (the first is "
                       f"{sample_ids[0]!r}); each record is two rows, X/chosen then X/rejected: build it again with "
                       "`data lengths build --prompt-field P --chosen-field C --rejected-field R`")
    cut = len(CHOSEN_SUFFIX)
    for row in range(0, count, PAIR_ROWS):
        good, bad = sample_ids[row], sample_ids[row + 1]
        if not good.endswith(CHOSEN_SUFFIX) or bad != good[:-cut] + REJECTED_SUFFIX:
            raise _invalid(f"{where} names preference pairs (its first id is {sample_ids[0]!r}) but rows {row + 1} and "
                           f"{row + 2} are {good!r} and {bad!r}; each pair is X/chosen then X/rejected, side by side")
    return True


def check_pairing(sample_ids: Sequence[str] | None, group_size: int, fail: Callable[[str], UmlosError]) -> None:
    """``fail`` unless the ids and the plan agree: ids of pairs need ``group_size`` 2 (a plan of
    rows one by one would split them), and ``group_size`` 2 needs ids of pairs or the row numbers
    (``sample_ids=None``: rows ``2p`` and ``2p + 1`` are pair ``p``)."""
    if sample_ids is None:
        return
    paired = holds_pairs(sample_ids)
    if paired and group_size != PAIR_ROWS:
        raise fail(f"the sample ids name preference pairs ({sample_ids[0]!r}, {sample_ids[1]!r}, ...); plan them with "
                   "group_size=2 so each pair stays in one microbatch (`plan build` does so by itself)")
    if not paired and group_size == PAIR_ROWS:
        raise fail(f"group_size 2 plans rows 2p and 2p + 1 as a preference pair, but the sample ids are not "
                   f"those of pairs (the first is {sample_ids[0]!r}, not X/chosen); build the lengths with "
                   "`data lengths build --prompt-field P --chosen-field C --rejected-field R`")


def _invalid(message: str) -> UmlosError:
    return UmlosError(errors.LENGTHS_INVALID, message, operator=errors.BATCHING_OPERATOR)
