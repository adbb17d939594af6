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

What transformers' ``save_pretrained`` rewrites without changing an id is
written in one form (:func:`canonical_tokenizer`), so a folder and its re-save
share one fingerprint: a post-processor that adds no token (the
``TemplateProcessing`` of the bare sequences it writes where there was none)
is no post-processor; padding is none (every encoder here drops it first: a
length must not depend on its batch); an added token named in a special-token
role is special (save_pretrained marks it so; the flag changes decoding, not
ids); named templates are a dict by name (the old list of ``{name, template}``
in tokenizer_config.json), and a dict of only ``default`` is that template
(the one ``chat_template.jinja`` it writes). Each of these leaves a form that
already had it unchanged, so no fingerprint recorded before changes unless
its tokenizer had one of these spellings. ``tokenizer_parts`` digests each
part alone, to say which part two tokenizers differ in.

``dataset_fingerprint`` is the fingerprint of the rows a length build reads
(umlos_cuda/batching/records/fingerprint.py: SHA-256 over the tokenizer
hash and the canonical values of the sample ids and the fields read, the
same whatever the format), so a cache keyed on it is invalid as soon as
either the data or the tokenizer changes, and not when the same rows are
re-encoded as Parquet or read through ``datasets``.
"""

from __future__ import annotations

import json
import re
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
    form["post_processor"] = _adding(form["post_processor"])
    form["padding"] = None  # dropped before every encoding (lengths/builder.py, chat/encode.py)
    form["added_tokens"] = _special_by_role(form["added_tokens"], loaded.special_tokens)
    form["chat_template"] = _by_name(loaded.chat_template)
    form["special_tokens"] = loaded.special_tokens
    form["fingerprint_version"] = TOKENIZER_FINGERPRINT_VERSION
    return form


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """SHA-256 (hex) of :func:`canonical_tokenizer`."""
    return hash_canonical(canonical_tokenizer(tokenizer)).hex()


def _adding(post_processor: Any) -> Any:
    """``post_processor``, or None when it is a ``TemplateProcessing`` whose templates hold only the
    sequences (``$A``, ``$B``) and no token: it adds nothing to any encoding."""
    if not (isinstance(post_processor, dict) and post_processor.get("type") == "TemplateProcessing"):
        return post_processor
    pieces = [*(post_processor.get("single") or ()), *(post_processor.get("pair") or ())]
    bare = all(isinstance(piece, dict) and set(piece) == {"Sequence"} for piece in pieces)
    return None if bare and not post_processor.get("special_tokens") else post_processor


def _special_by_role(added: Any, special_tokens: dict[str, Any]) -> Any:
    """The added tokens, those named in a special-token role marked ``special``."""
    roles: set[str] = set()
    for value in special_tokens.values():  # a role's text, the additional list, or named tokens by name
        roles.update(value.values() if isinstance(value, dict) else value if isinstance(value, list) else [value])
    if not isinstance(added, list) or not roles:
        return added
    return [{**token, "special": True} if isinstance(token, dict) and token.get("content") in roles else token
            for token in added]


def _by_name(template: Any) -> Any:
    """A chat template in one spelling: named ones as a dict (from the list of ``{name, template}``), and a
    dict of only ``default`` as that template. A malformed list is left as it is (the template's reader
    refuses it)."""
    if isinstance(template, list) and all(isinstance(item, dict) and set(item) == {"name", "template"}
                                          for item in template):
        template = {item["name"]: item["template"] for item in template}
    if isinstance(template, dict) and list(template) == ["default"]:
        return template["default"]
    return template


#: What a message about two tokenizer fingerprints adds: what differs, and how to see which part.
DIFFERENT_TOKENIZER = ("two tokenizers that give different ids (their vocabulary, merges, normalizer, pre-tokenizer, "
                       "post-processor, added or special tokens, truncation or chat template; a re-save with "
                       "save_pretrained alone changes none of these); tokenizer_parts(A) and tokenizer_parts(B) of "
                       "umlos_cuda.batching.lengths.fingerprints name the part two tokenizer folders differ in "
                       "(docs/batching.md, Fingerprints)")


def tokenizer_parts(tokenizer: Any) -> dict[str, str]:
    """Each part of :func:`canonical_tokenizer` (the model, the normalizer, ..., the chat template)
    hashed alone: SHA-256 hex by part name, to say which part two tokenizers differ in."""
    return {name: hash_canonical(value).hex() for name, value in canonical_tokenizer(tokenizer).items()
            if name != "fingerprint_version"}


#: The key beside ``tokenizer_hash`` that records :func:`tokenizer_parts` (appended last to a meta.json).
PARTS_KEY = "tokenizer_parts"
#: At most this many parts are read (today's canonical form has 9).
MAX_PARTS = 64
_PART_NAME = re.compile(r"[a-z_]{1,64}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def check_tokenizer_parts(value: Any, name: str, fail: checks.Fail) -> dict[str, str]:
    """``value`` when it is a dict of at most :data:`MAX_PARTS` part names (lower-case words) to SHA-256 hex
    digests, as :func:`tokenizer_parts` writes it; else ``fail`` (the code of the artifact that holds it)."""
    shape = f"{name} must map part names to SHA-256 hex digests (at most {MAX_PARTS} of them)"
    checks.instance(value, name, dict, fail=fail, max_length=MAX_PARTS, message=shape)
    for part, digest in value.items():
        if not (isinstance(part, str) and _PART_NAME.fullmatch(part)
                and isinstance(digest, str) and _SHA256.fullmatch(digest)):
            raise fail(f"{shape}, got {repr(part)[:80]}: {repr(digest)[:80]}")
    return value


def tokenizer_difference(one: dict[str, str] | None, other: dict[str, str] | None) -> str:
    """What a message about two different tokenizer fingerprints adds: the parts they differ in and those equal
    when both artifacts record their parts (``tokenizers differ in: normalizer (model, ... equal)``), else
    :data:`DIFFERENT_TOKENIZER` (an artifact written before parts were recorded)."""
    if one is None or other is None:
        return DIFFERENT_TOKENIZER
    names = [*one, *(name for name in other if name not in one)]
    differ = [name for name in names if one.get(name) != other.get(name)]
    if not differ:  # equal parts, different wholes: another fingerprint version
        return DIFFERENT_TOKENIZER
    equal = [name for name in names if name not in differ]
    return f"tokenizers differ in: {', '.join(differ)}" + (f" ({', '.join(equal)} equal)" if equal else "")


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
