"""Content fingerprints: which tokenizer counted the lengths, which data they describe.

What goes in: a tokenizer (path, ``tokenizers.Tokenizer`` or
:class:`~umlos_cuda.batching.lengths.tokenizer.LoadedTokenizer`), or a dataset
file and a tokenizer fingerprint. What comes out: a SHA-256 hex digest.

``tokenizer_fingerprint`` hashes the canonical form of everything that
changes the token ids: the model (its type, vocabulary, merges and options
such as ``unk_token`` or ``byte_fallback``), the normalizer, pre-tokenizer
and post-processor, the added tokens, truncation and padding, the special
tokens named beside the tokenizer and the chat template when its directory
has one. Not hashed, since it changes no id: the decoder and the file's
format version. The canonical form is the tokenizer as the installed
``tokenizers`` library serializes it again after loading (so key order, white
space and the older ``"a b"`` spelling of merges do not matter), encoded as
canonical CBOR (the byte rules of every other hash here, umlos_cuda/hashing.py).

``dataset_fingerprint`` is the fingerprint of the rows a length build reads
(umlos_cuda/batching/records/fingerprint.py: SHA-256 over the tokenizer
hash and the canonical values of the sample ids and the fields read, the
same whatever the format), so a cache keyed on it is invalid as soon as
either the data or the tokenizer changes, and not when the same rows are
re-encoded as Parquet or read through ``datasets``.
"""

from __future__ import annotations

import json
from typing import Any

from ... import checks, errors
from ...hashing import hash_canonical
from ..records.jsonl import DEFAULT_ID_FIELD
from ..records.source import Records
from .fields import record_fields
from .tokenizer import load_tokenizer

TOKENIZER_FINGERPRINT_VERSION = 1
#: The tokenizer hash recorded when lengths were read from a column, without a tokenizer.
UNKNOWN_TOKENIZER = "unknown"
#: Sections of tokenizer.json that change token ids (all but ``version`` and ``decoder``).
ID_SECTIONS = ("model", "normalizer", "pre_tokenizer", "post_processor", "added_tokens", "truncation", "padding")


def canonical_tokenizer(tokenizer: Any) -> dict[str, Any]:
    """The value :func:`tokenizer_fingerprint` hashes (useful to see why two differ)."""
    loaded = load_tokenizer(tokenizer)
    data = json.loads(loaded.tokenizer.to_str())
    form: dict[str, Any] = {name: data.get(name) for name in ID_SECTIONS}
    form["chat_template"] = loaded.chat_template
    form["special_tokens"] = loaded.special_tokens
    form["fingerprint_version"] = TOKENIZER_FINGERPRINT_VERSION
    return form


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """SHA-256 (hex) of :func:`canonical_tokenizer`."""
    return hash_canonical(canonical_tokenizer(tokenizer)).hex()


def check_tokenizer_hash(tokenizer_hash: str) -> str:
    """``tokenizer_hash`` when it is a non-empty string; else TOKENIZER_INVALID."""
    return checks.text(tokenizer_hash, "tokenizer_hash", empty=False,
                       fail=checks.raising(errors.TOKENIZER_INVALID, operator=errors.BATCHING_OPERATOR),
                       message="{name} must be a non-empty string, got {value!r}")


def dataset_fingerprint(dataset: Any, tokenizer_hash: str, *, text_field: str | None = None,
                        prompt_field: str | None = None, response_field: str | None = None,
                        length_field: str | None = None, id_field: str = DEFAULT_ID_FIELD,
                        format: str | None = None, chosen_field: str | None = None,
                        rejected_field: str | None = None, messages_field: str | None = None,
                        completion_field: str | None = None, label_field: str | None = None,
                        conversational: bool = False) -> str:
    """The fingerprint ``data lengths build`` records for ``dataset`` read with these fields
    (default: the ``text`` field) and ``tokenizer_hash``: one streaming read, memory bounded by a chunk."""
    check_tokenizer_hash(tokenizer_hash)
    fields = record_fields(text_field, prompt_field, response_field, length_field, chosen_field=chosen_field,
                           rejected_field=rejected_field, messages_field=messages_field,
                           completion_field=completion_field, label_field=label_field, conversational=conversational)
    records = Records(dataset, fields, id_field=id_field, format=format)
    for _ in records.chunks():
        pass
    return records.fingerprint(tokenizer_hash)
