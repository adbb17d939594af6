"""Chat records in a dataset: a messages field rendered, with its assistant spans, as the record is read.

What goes in: a tokenizer, optionally a template file that overrides its
own, and then each record's messages value. What comes out: for each record
a :class:`~.turns.ChatText` (the text the tokenizer encodes, and the spans
its loss is taken on), or :class:`~..records.jsonl.RecordProblem` saying
why the record is not a conversation this template renders.

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
            raise RecordProblem(str(exc), exc.code) from None
        try:
            return assistant_spans(self.template, messages, add_generation_prompt=self.add_generation_prompt)
        except RenderFailed as exc:
            raise RecordProblem(f"does not render with {self.template.where}: {exc}") from None
