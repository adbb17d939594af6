"""Token character offsets from a byte-level BPE's ids alone, where they are provably the tokenizer's own.

What goes in: a ``tokenizers.Tokenizer`` (:meth:`ByteOffsets.of`), then a
chunk's token ids, each record's token count and the texts they were encoded
from (:meth:`ByteOffsets.offsets`). What comes out: each token's
``(start, end)`` character offsets in its own text, the ``Encoding.offsets``
that ``encode_batch`` would have given, as one ``(n, 2)`` array; or None
when the tokenizer is not one whose offsets follow from its ids (then
``of`` gives None) or a record's tokens do not spell its text's bytes.

Why: the assistant masks of chat records need each token's offsets
(umlos_cuda/batching/chat/masks.py), and asking the tokenizer for them
costs about a fifth of a render worker's time per record (``encode_batch``
over ``encode_batch_fast``, and the offsets as Python tuples:
docs/performance.md, "Chat masks without the tokenizer's offsets"). For a
byte-level BPE they are known from the ids: every vocabulary entry is the
bytes of the text it stands for, one character of the byte-level alphabet a
byte, and every added token is its content, matched in the text as written.
The tokens of a record are then its text's bytes in order, so token ``i``
covers bytes ``[B_i, B_i + len_i)`` where ``B_i`` is the sum of the lengths
before it; the tokenizer maps each byte-level character back to the whole
character it came from, so a token's character offsets run from the
character of its first byte to one past the character of its last (a
character that byte-level BPE cuts in two gives both tokens its offsets),
which is what this computes.

When that holds, checked once a tokenizer on its parts (:meth:`of`): no
normalizer (it could change the text before the offsets are taken), or only
Unicode normal forms (NFC, NFD, NFKC, NFKD, as Qwen2's NFC), which leave
ASCII as it is, and then only for a chunk whose texts are all ASCII
(:meth:`covers`: whether Python's Unicode tables and the tokenizer's agree
on other text is not this module's to assume); a
pre-tokenizer that is ``ByteLevel`` without ``add_prefix_space``, alone or
in a ``Sequence`` with ``Split`` steps that keep what they split on (a
``Removed`` split drops characters); a BPE model without a subword prefix or
a word suffix (which its entries would spell and the text does not), whose
vocabulary holds the whole byte-level alphabet (so it never emits its
unknown token nor drops a byte), and whose entries are all of that alphabet
(else that id is left out: a chunk that holds it takes the tokenizer's
offsets); added tokens without ``lstrip`` or ``rstrip`` (which take the
spaces beside them into their match), each a model entry of its own length
if it is one; a post-processor that leaves offsets alone without special
tokens (none, ``ByteLevel`` with ``trim_offsets`` off, ``TemplateProcessing``,
a ``Sequence`` of those: ``trim_offsets`` moves offsets off spaces); no
truncation nor padding. Anything else keeps the tokenizer's offsets, as
before. And on every chunk, each record's tokens must add up to its text's
bytes exactly, or the chunk takes the tokenizer's offsets: a tripwire that
the reasoning above makes unreachable, which tests/test_batching_chat.py
checks against ``encode_batch`` on random texts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Post-processors that leave an encoding's offsets as they are when no special tokens are added.
_KEEPING_PROCESSORS = ("TemplateProcessing", "ByteLevel")
#: Normalizers that leave ASCII text as it is (and alignments one to one).
_ASCII_KEEPING_NORMALIZERS = ("NFC", "NFD", "NFKC", "NFKD")


@dataclass(frozen=True, eq=False)
class ByteOffsets:
    """``lengths[id]``: the bytes of the text token ``id`` stands for (0: an id whose offsets are not known);
    ``ascii_only``: the tokenizer normalizes to a Unicode normal form, so only ASCII texts are covered."""

    lengths: np.ndarray
    ascii_only: bool = False

    @classmethod
    def of(cls, tokenizer: Any) -> ByteOffsets | None:
        """The byte lengths of ``tokenizer``'s tokens, or None when its offsets do not follow from its ids."""
        if why_not(tokenizer):
            return None
        return cls(_byte_lengths(tokenizer), ascii_only=bool(_parts(tokenizer.normalizer, "normalizers")))

    def covers(self, texts: Sequence[str]) -> bool:
        """Whether the offsets of ``texts``' tokens follow from their ids (all of them, but ASCII texts only
        behind a normalizer), so that they are encoded without the tokenizer's offsets."""
        return not self.ascii_only or all(text.isascii() for text in texts)

    def offsets(self, ids: np.ndarray, counts: np.ndarray, texts: Sequence[str]) -> np.ndarray | None:
        """The ``(start, end)`` character offsets of each token in its record's text, one ``(n, 2)`` int64 array
        (``ids``: a chunk's token ids, concatenated; ``counts``: each record's number of them; ``texts``: what
        each record was encoded from); None when a token's length is not known or a record's tokens do not
        cover its text's bytes exactly."""
        if ids.shape[0] and int(ids.max()) >= self.lengths.shape[0]:
            return None
        lengths = self.lengths[ids]
        if lengths.shape[0] and int(lengths.min()) < 1:
            return None
        joined = "".join(texts)
        chars = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        ascii_only = joined.isascii()
        encoded = None if ascii_only else joined.encode("utf-8")
        sizes = chars if ascii_only else np.fromiter((len(text.encode("utf-8")) for text in texts),
                                                     dtype=np.int64, count=len(texts))
        ends = np.cumsum(lengths)
        passed = np.concatenate(([0], ends))
        last = np.cumsum(counts)
        if not np.array_equal(passed[last] - passed[last - counts], sizes):
            return None
        starts = ends - lengths  # in bytes of the chunk's texts joined: a record's tokens lie within its own
        if encoded is not None:  # each byte's character: the characters whose first bytes come before it
            character = np.cumsum(np.frombuffer(encoded, dtype=np.uint8) & 0xC0 != 0x80) - 1
            starts, ends = character[starts], character[ends - 1] + 1
        tokens = np.empty((ids.shape[0], 2), dtype=np.int64)
        shift = np.repeat(np.cumsum(chars) - chars, counts)
        tokens[:, 0] = starts - shift
        tokens[:, 1] = ends - shift
        return tokens


def why_not(tokenizer: Any) -> str | None:
    """Why ``tokenizer``'s offsets do not follow from its ids (the module's conditions), or None when they do."""
    from tokenizers import models, pre_tokenizers

    for step in _parts(tokenizer.normalizer, "normalizers"):
        if step.get("type") not in _ASCII_KEEPING_NORMALIZERS:
            return f"it has a {step.get('type')} normalizer, which may change the text"
    if tokenizer.truncation is not None or tokenizer.padding is not None:
        return "it truncates or pads"
    steps = _parts(tokenizer.pre_tokenizer, "pretokenizers")
    if [step.get("type") for step in steps].count("ByteLevel") != 1:
        return "its pre-tokenizer is not one ByteLevel step"
    for step in steps:
        if step.get("type") == "ByteLevel" and step.get("add_prefix_space"):
            return "its ByteLevel pre-tokenizer adds a prefix space"
        if step.get("type") not in ("ByteLevel", "Split") or step.get("behavior") == "Removed":
            return f"its pre-tokenizer has a {step.get('type')} step that may drop characters"
    for step in _parts(tokenizer.post_processor, "processors"):
        if step.get("type") not in _KEEPING_PROCESSORS or step.get("trim_offsets"):
            return f"its {step.get('type')} post-processor may move offsets"
    model = tokenizer.model
    if not isinstance(model, models.BPE):
        return "its model is not BPE"
    if model.continuing_subword_prefix or model.end_of_word_suffix:
        return "its BPE has a subword prefix or a word suffix"
    alphabet = frozenset(pre_tokenizers.ByteLevel.alphabet())
    if not alphabet <= tokenizer.get_vocab(with_added_tokens=False).keys():
        return "its vocabulary lacks part of the byte-level alphabet"
    for index, added in tokenizer.get_added_tokens_decoder().items():
        if added.lstrip or added.rstrip:
            return f"its added token {added.content!r} strips the spaces beside it"
        entry = model.id_to_token(index)
        size = len(added.content.encode("utf-8"))
        if not size or (entry is not None and _entry_bytes(entry, alphabet) not in (size, 0)):
            return f"its added token {added.content!r} has another length as a vocabulary entry"
    return None


def _byte_lengths(tokenizer: Any) -> np.ndarray:
    """The bytes each id stands for: an added token's content, a vocabulary entry's byte-level characters
    (0 for an entry with other characters, which no byte-level text makes)."""
    from tokenizers import pre_tokenizers

    alphabet = frozenset(pre_tokenizers.ByteLevel.alphabet())
    vocabulary = tokenizer.get_vocab(with_added_tokens=False)
    added = tokenizer.get_added_tokens_decoder()
    lengths = np.zeros(max([*vocabulary.values(), *added, -1]) + 1, dtype=np.int64)
    for entry, index in vocabulary.items():
        lengths[index] = _entry_bytes(entry, alphabet)
    for index, token in added.items():
        lengths[index] = len(token.content.encode("utf-8"))
    return lengths


def _entry_bytes(entry: str, alphabet: frozenset[str]) -> int:
    """The bytes a vocabulary entry spells (one a byte-level character), or 0 when it has another character."""
    return len(entry) if alphabet.issuperset(entry) else 0


def _parts(component: Any, members: str) -> list[dict]:
    """A pre-tokenizer's or post-processor's steps, as their JSON (a ``Sequence``'s members; none for None)."""
    if component is None:
        return []
    state = json.loads(component.__getstate__())
    return state[members] if state.get("type") == "Sequence" else [state]
