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

``dataset_fingerprint`` streams the file's bytes into SHA-256 after a
domain tag and the tokenizer fingerprint, so a cache keyed on it is invalid
as soon as either the data or the tokenizer changes.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from typing import Any

from ... import checks, errors
from ...errors import UmlosError
from ...files import reader
from ...hashing import hash_canonical
from .jsonl import require_dataset_file, unreadable
from .tokenizer import load_tokenizer

TOKENIZER_FINGERPRINT_VERSION = 1
DATASET_DOMAIN = b"umlos-cuda dataset fingerprint v1\0"
#: Sections of tokenizer.json that change token ids (all but ``version`` and ``decoder``).
ID_SECTIONS = ("model", "normalizer", "pre_tokenizer", "post_processor", "added_tokens", "truncation", "padding")
_CHUNK = 1 << 20


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


def dataset_digest(tokenizer_hash: str) -> hashlib._Hash:
    """A SHA-256 object primed with the domain tag and ``tokenizer_hash``;
    feeding it the dataset's bytes and taking ``hexdigest()`` gives
    :func:`dataset_fingerprint` (the length builder does so while it reads)."""
    checks.text(tokenizer_hash, "tokenizer_hash", empty=False,
                fail=checks.raising(errors.TOKENIZER_INVALID, operator=errors.BATCHING_OPERATOR),
                message="{name} must be a non-empty string, got {value!r}")
    encoded = tokenizer_hash.encode("utf-8")
    digest = hashlib.sha256(DATASET_DOMAIN)
    digest.update(len(encoded).to_bytes(8, "little") + encoded)
    return digest


def dataset_fingerprint(path: str | os.PathLike[str], tokenizer_hash: str) -> str:
    """SHA-256 (hex) of the domain tag, ``tokenizer_hash`` and the file's
    bytes, read in 1 MiB blocks (memory does not grow with the file)."""
    digest = dataset_digest(tokenizer_hash)
    feed_file(digest, require_dataset_file(path), unreadable)
    return digest.hexdigest()


def feed_file(digest: Any, path: str, error: Callable[[str], UmlosError]) -> None:
    """Stream the regular file at ``path`` into ``digest`` in 1 MiB blocks; a failed
    read (or a FIFO, a folder, a device) raises ``error(message)``."""
    try:
        with reader.open_regular(path, error) as handle:
            while block := handle.read(_CHUNK):
                digest.update(block)
    except FileNotFoundError:
        raise error(f"cannot read {path}: it does not exist") from None
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror or exc}") from exc

