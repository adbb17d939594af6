"""Sample ids for rows that have none.

What goes in: where the row is (its 0-based line or row number within its
file) and whether the dataset is one input or several shards. What comes
out: the row's id, a string.

* One input (a file, a ``save_to_disk`` folder, a ``datasets.Dataset``):
  the row number as decimal text, ``"0"``, ``"1"``, ... (for JSONL, the
  0-based line number, blank and skipped lines counted). These are the ids
  a length cache stores as ``"sample_ids": "line_numbers"``, at no cost.
* Sharded input (a glob or a list naming two or more files): the first
  :data:`HASH_HEX` hex digits of the shard's content hash, a colon, and the
  row number within the shard: ``"3f9a0c1d2e4b5a69:17"``. The content hash
  is SHA-256 over the columns read from the shard (records/fingerprint.py,
  ``content_hash``: the same canonical values as the dataset fingerprint,
  without ids or tokenizer), so an id depends neither on the file's name nor
  on where it is mounted nor on its format, only on what the shard holds:
  renaming, moving or re-encoding a shard (JSONL to Parquet) keeps its ids;
  changing one of its rows gives its rows new ids and leaves the other
  shards' alone. It costs one extra read of a shard whose rows lack ids, and
  only of such a shard. Two shards with the same content give the same ids,
  which the repeated-id check refuses (the data is there twice).
"""

from __future__ import annotations

#: Hex digits of the shard's content hash in a derived id (64 bits).
HASH_HEX = 16


def shard_row_id(content_hash: str, row: int) -> str:
    """The id of row ``row`` of a shard whose content hash is ``content_hash``."""
    return f"{content_hash[:HASH_HEX]}:{row}"
