"""Chat records in a dataset: a messages field rendered, with its assistant spans, as the record is read.

What goes in: a tokenizer, optionally a template file that overrides its
own, and then each record's messages value. What comes out: for each record
a :class:`~.turns.ChatText` (the text the tokenizer encodes, and the spans
its loss is taken on), or :class:`~..records.jsonl.RecordProblem` saying
why the record is not a conversation this template renders, or that it has
nothing to train on: no assistant turn (only ``user`` messages, or a role the
template does not mark, such as ``"bot"``), whose loss mask would be all zeros
and which would otherwise be trained on silently as nothing.

:class:`ChatRecords` is the converter the JSONL reader applies to the field
(``read_chunks(..., convert=...)``), so a bad record fails with its line
number, or is skipped and counted with ``--skip-bad-lines``, like any other
bad line, in the length cache and the token store alike (both read through
umlos_cuda/batching/lengths/builder.py, so they keep the same records).
"""

from __future__ import annotations

import os
from typing import Any

from ..records.jsonl import RecordProblem
from .messages import MessagesInvalid, checked_messages
from .render import RenderFailed
from .template import chat_template_of
from .turns import ChatText, assistant_spans


class ChatRecords:
    """Render a record's messages value with ``tokenizer``'s chat template (or ``chat_template``, a Jinja file)."""

    def __init__(self, tokenizer: Any, chat_template: str | os.PathLike[str] | None = None, *,
                 add_generation_prompt: bool = False) -> None:
        self.template = chat_template_of(tokenizer, chat_template)
        self.add_generation_prompt = add_generation_prompt

    def __call__(self, value: Any) -> ChatText:
        try:
            messages = checked_messages(value)
        except MessagesInvalid as exc:
            raise RecordProblem(str(exc)) from None
        try:
            chat = assistant_spans(self.template, messages, add_generation_prompt=self.add_generation_prompt)
        except RenderFailed as exc:
            raise RecordProblem(f"does not render with {self.template.where}: {exc}") from None
        if not self.add_generation_prompt and not any(end > start for start, end in chat.spans):
            roles = ", ".join(dict.fromkeys(repr(message["role"]) for message in messages))
            raise RecordProblem(f"has no assistant turn to train on (its roles: {roles}): its loss mask would be all "
                                "zeros; the loss is taken on the messages of role 'assistant' (or the template's "
                                "{% generation %} blocks): rename the role, or drop the record")
        return chat
