"""One conversation to token ids and an assistant mask, as ``apply_chat_template`` returns them.

What goes in: a tokenizer (path, ``tokenizers.Tokenizer`` or loaded), a
list of messages, ``add_generation_prompt`` and optionally a template file.
What comes out: :class:`ChatSample`, the rendered text, its token ids and
its assistant mask: ``apply_chat_template(messages, return_dict=True,
return_assistant_tokens_mask=True)``'s ``input_ids`` and ``assistant_masks``
for a template with ``{% generation %}`` markers, and the mask of the
generation-prompt difference (umlos_cuda/batching/chat/turns.py) for one
without.

The text is encoded as transformers encodes a rendered chat: without the
special tokens the post-processor would add (the template writes them), and
without the padding or truncation ``tokenizer.json`` may carry (transformers
turns both off unless asked). :func:`chat_encoder` gives that tokenizer; the
length cache and the token store encode chat records with it too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import errors
from ...errors import UmlosError
from ..lengths.tokenizer import load_tokenizer
from .masks import token_mask
from .messages import MessagesInvalid, checked_messages
from .render import RenderFailed
from .template import chat_template_of
from .turns import assistant_spans


@dataclass(frozen=True)
class ChatSample:
    """A rendered conversation, its token ids and its assistant mask (1: trained on)."""

    text: str
    input_ids: list[int]
    assistant_mask: np.ndarray


def chat_encoder(tokenizer: Any):
    """The ``tokenizers.Tokenizer`` of ``tokenizer`` without padding and truncation (a copy when it has either)."""
    encoder = load_tokenizer(tokenizer).tokenizer
    if encoder.padding is None and encoder.truncation is None:
        return encoder
    from tokenizers import Tokenizer

    encoder = Tokenizer.from_str(encoder.to_str())
    encoder.no_padding()
    encoder.no_truncation()
    return encoder


def encode_chat(tokenizer: Any, messages: Any, *, add_generation_prompt: bool = False,
                chat_template: str | os.PathLike[str] | None = None) -> ChatSample:
    """Render and encode one conversation; a malformed one, or one the template
    refuses, raises DATASET_RECORD_INVALID (CHAT_CONTENT_UNSUPPORTED for a content part that is not text,
    CHAT_RENDER_BUDGET_EXCEEDED past a render limit). It renders in this process: the counted limits of
    umlos_cuda/batching/chat/limits.py apply, not the CPU, memory and wall-clock budget of the render
    workers of ``data tokenize``."""
    loaded = load_tokenizer(tokenizer)
    template = chat_template_of(loaded, chat_template)
    try:
        chat = assistant_spans(template, checked_messages(messages), add_generation_prompt=add_generation_prompt)
    except (MessagesInvalid, RenderFailed) as exc:
        if isinstance(exc, MessagesInvalid):
            code = exc.code
        else:
            code = errors.CHAT_RENDER_BUDGET_EXCEEDED if exc.limit else errors.DATASET_RECORD_INVALID
        raise UmlosError(code, f"the conversation {exc}", operator=errors.BATCHING_OPERATOR) from None
    encoding = chat_encoder(loaded).encode(chat.text, add_special_tokens=False)
    return ChatSample(chat.text, list(encoding.ids), token_mask(encoding.offsets, chat.spans))
