"""The index of a sharded token store: ``DIR/meta.json``, read and written.

What goes in: the path of the file (reading), or the store's common
fields and its shard entries (writing). What comes out: the index as a
checked dict (SHARDED_STORE_INVALID names the file and the first field that
is wrong), or its bytes.

Layout (format ``umlos_cuda.sharded_token_store/1``; docs/batching.md,
"Sharded token stores")::

    {"format", "num_samples", "num_tokens", "token_dtype", "vocab_size", "tokenizer_hash",
     "loss_mask", "sample_ids", "dataset_hash",
     "shards": [{"name", "num_samples", "num_tokens", "meta_sha256", "row_digests_sha256",
                 "id_hashes_sha256"}, ...],
     "tokenizer_parts"}

``tokenizer_parts`` (the shards' tokenizer's parts hashed alone, to name the parts another tokenizer differs
in) is written last since a store's meta.json records them; an index written before, or of stores without them,
has none.

Shard ``i`` is named ``f"{i:05d}"`` (``DIR/shards/NNNNN/``, its row digests
``DIR/digests/NNNNN.npy``, its id hashes ``DIR/digests/NNNNN.ids.npy``); the names are checked to be exactly that, so
no entry can point outside the store. The totals must be the sums of the
shards'. The file is read by the bounded reader (regular file, at most
:data:`MAX_INDEX_BYTES`, bounded depth).
"""

from __future__ import annotations

import json
import re

from ... import checks, errors
from ...errors import UmlosError
from ...files.reader import read_json
from ..lengths.fingerprints import PARTS_KEY, check_tokenizer_parts
from .store import LOSS_MASK_RULES, TOKEN_DTYPES

#: meta.json ``format`` of a sharded store.
SHARDED_FORMAT = "umlos_cuda.sharded_token_store/1"
SAMPLE_ID_KINDS = ("line_numbers", "jsonl")
INDEX_FIELDS = ("format", "num_samples", "num_tokens", "token_dtype", "vocab_size", "tokenizer_hash", "loss_mask",
                "sample_ids", "dataset_hash", "shards")
SHARD_FIELDS = ("name", "num_samples", "num_tokens", "meta_sha256", "row_digests_sha256", "id_hashes_sha256")
#: An index lists about 150 bytes a shard: 64 MiB is over 400,000 shards.
MAX_INDEX_BYTES = 64 << 20
SHARDS_FOLDER = "shards"
DIGESTS_FOLDER = "digests"
_SHA256 = re.compile(r"[0-9a-f]{64}")


def shard_name(index: int) -> str:
    """The folder name of shard ``index``: five digits or more (``00000``)."""
    return f"{index:05d}"


def digests_name(index: int) -> str:
    return f"{shard_name(index)}.npy"


def id_hashes_name(index: int) -> str:
    return f"{shard_name(index)}.ids.npy"


#: What the bounded reader calls the index in a message (its size is capped at :data:`MAX_INDEX_BYTES`).
INDEX_WHAT = "sharded store index"


def read_index(path: str) -> dict:
    """The checked index at ``path`` (FileNotFoundError passes through)."""
    return check_index(read_json(path, invalid, max_bytes=MAX_INDEX_BYTES, what=INDEX_WHAT), path)


def check_index(meta: object, path: str) -> dict:
    """``meta`` (the JSON value of the index at ``path``, a folder's or an object store's) when it is a sharded
    store's index: its format, exactly its fields, each field's type and range, shard names in order and totals
    that are the shards' sums; SHARDED_STORE_INVALID naming ``path`` otherwise."""

    def at_path(message: str) -> UmlosError:
        return invalid(f"{path}: {message}")

    if not isinstance(meta, dict):
        raise at_path(f"the index must be a JSON object with format {SHARDED_FORMAT!r}, got {type(meta).__name__}")
    checks.equal(meta.get("format"), "format", SHARDED_FORMAT, fail=at_path,
                 message="format {value!r} is not " + repr(SHARDED_FORMAT) + ", the format this reader reads")
    wording = "must have exactly the fields " + ", ".join(INDEX_FIELDS) + "; missing {missing}, unknown {unknown}"
    checks.record(meta, dict.fromkeys(INDEX_FIELDS, checks.field(checks.anything)), fail=at_path,
                  optional={PARTS_KEY: checks.field(checks.anything)}, unknown=wording, missing=wording)
    if PARTS_KEY in meta:
        check_tokenizer_parts(meta[PARTS_KEY], PARTS_KEY, at_path)
    for name in ("num_samples", "num_tokens"):
        checks.integer(meta[name], name, 0, None, fail=at_path, message=checks.NON_NEGATIVE, strict=True)
    checks.choice(meta["token_dtype"], "token_dtype", TOKEN_DTYPES, fail=at_path)
    if meta["vocab_size"] is not None:
        limit = 1 << (16 if meta["token_dtype"] == "<u2" else 32)
        checks.integer(meta["vocab_size"], "vocab_size", 1, limit, fail=at_path, strict=True)
    checks.choice(meta["loss_mask"], "loss_mask", LOSS_MASK_RULES, fail=at_path)
    checks.choice(meta["sample_ids"], "sample_ids", SAMPLE_ID_KINDS, fail=at_path)
    checks.text(meta["tokenizer_hash"], "tokenizer_hash", empty=False, fail=at_path,
                message="{name} must be a non-empty string, got {value!r}")
    checks.text(meta["dataset_hash"], "dataset_hash", pattern=_SHA256, fail=at_path,
                message="{name} must be 64 lowercase hex digits, got {value!r}")
    shards = checks.sequence(meta["shards"], "shards", fail=at_path, empty=False,
                             message="{name} must be a non-empty list of shard entries, got {type}")
    if not isinstance(shards, list):
        raise at_path("shards must be a list")
    samples = tokens = 0
    for number, entry in enumerate(shards):
        where = f"shards[{number}]"

        def at_entry(message: str, where: str = where) -> UmlosError:
            return at_path(f"{where}: {message}")

        shard_wording = "must have exactly the fields " + ", ".join(SHARD_FIELDS) + \
            "; missing {missing}, unknown {unknown}"
        checks.record(entry, dict.fromkeys(SHARD_FIELDS, checks.field(checks.anything)), fail=at_entry,
                      not_a_map="is {type}, not a shard entry (an object)", unknown=shard_wording,
                      missing=shard_wording)
        checks.equal(entry["name"], "name", shard_name(number), fail=at_entry,
                     message="name {value!r} is not " + repr(shard_name(number)) + " (shards are numbered in order)")
        checks.integer(entry["num_samples"], "num_samples", 1, None, fail=at_entry, message=checks.POSITIVE,
                       strict=True)
        checks.integer(entry["num_tokens"], "num_tokens", 0, None, fail=at_entry, message=checks.NON_NEGATIVE,
                       strict=True)
        for name in ("meta_sha256", "row_digests_sha256", "id_hashes_sha256"):
            checks.text(entry[name], name, pattern=_SHA256, fail=at_entry,
                        message="{name} must be 64 lowercase hex digits, got {value!r}")
        samples += entry["num_samples"]
        tokens += entry["num_tokens"]
    if (samples, tokens) != (meta["num_samples"], meta["num_tokens"]):
        raise at_path(f"num_samples {meta['num_samples']} and num_tokens {meta['num_tokens']} are not the sums of "
                      f"the shards' ({samples} and {tokens})")
    if meta["sample_ids"] == "line_numbers" and len(shards) > 1:
        raise at_path("a store whose ids are row numbers has one shard (each shard's rows would repeat them)")
    return meta


def index_bytes(common: dict, shards: list[dict], dataset_hash: str) -> bytes:
    """The bytes of ``meta.json`` for ``common`` (token_dtype, vocab_size, tokenizer_hash, loss_mask,
    sample_ids, and tokenizer_parts where known) and ``shards`` (entries in order)."""
    meta = {
        "format": SHARDED_FORMAT,
        "num_samples": sum(entry["num_samples"] for entry in shards),
        "num_tokens": sum(entry["num_tokens"] for entry in shards),
        "token_dtype": common["token_dtype"],
        "vocab_size": common["vocab_size"],
        "tokenizer_hash": common["tokenizer_hash"],
        "loss_mask": common["loss_mask"],
        "sample_ids": common["sample_ids"],
        "dataset_hash": dataset_hash,
        "shards": [{name: entry[name] for name in SHARD_FIELDS} for entry in shards],
    }
    if common.get(PARTS_KEY) is not None:  # last: an index before it is these bytes without it
        meta[PARTS_KEY] = common[PARTS_KEY]
    return (json.dumps(meta, indent=1) + "\n").encode("ascii")


#: The fields every shard of one store shares (a shard's meta.json against the index).
COMMON_FIELDS = ("tokenizer_hash", "token_dtype", "vocab_size", "loss_mask", "sample_ids")


def invalid(message: str) -> UmlosError:
    return UmlosError(errors.SHARDED_STORE_INVALID, message, operator=errors.BATCHING_OPERATOR)


def mismatch(message: str) -> UmlosError:
    return UmlosError(errors.SHARDED_STORE_MISMATCH, message, operator=errors.BATCHING_OPERATOR)
