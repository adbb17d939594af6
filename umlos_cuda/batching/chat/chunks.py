"""Chat records rendered where they are encoded: a chunk's messages values to texts and spans, or why not.

What goes in: a chat template (umlos_cuda/batching/chat/template.py) and
``add_generation_prompt``; then, in a render worker (a ``--workers``
process of umlos_cuda/batching/lengths/workers.py, under the render budget of
umlos_cuda/batching/chat/limits.py), a chunk of records whose messages
values the reader handed on as read. What comes out: for each record that
renders, a :class:`~.turns.ChatText` (the text the tokenizer encodes, and the
spans its loss is taken on); for each other one (it is not a conversation
this template renders, or it has nothing to train on: no assistant turn, only
``user`` messages or a role the template does not mark, such as ``"bot"``,
whose loss mask would be all zeros) a
:class:`~umlos_cuda.batching.records.chunk.RowFailure` saying why, which the
reader names with its line and raises or skips (``--skip-bad-lines``) in line
order (records/source.py ``Records.accept``), in the length cache and the
token store alike.

:class:`ChatWork` is what the workers run: render the chunk, then hand the
records that rendered to the encoding work (the length builder's
``ChunkEncoder.lengths``, the token store's ``encode_chunk``), in the same
process, so a record crosses the pipe once as its messages and comes back as
its tokens. Each record renders under the budget (``budget.item``): past its
CPU or wall-clock seconds the worker ends and the pool gives that record up
with the reason (``given_up``), which this renders as the record's failure.
A render that needs no more than the first failure (no ``--skip-bad-lines``:
the command stops there) stops there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ... import errors
from ..lengths import budget
from ..records.chunk import RecordChunk, RowFailure, RowIds
from .environment import compile_template
from .messages import MessagesInvalid, checked_messages
from .render import RenderFailed
from .template import ChatTemplate
from .turns import ChatText, assistant_spans


@dataclass(frozen=True)
class ChatRender:
    """Render a chunk's messages values with ``template``; ``first_failure_only``: stop at the first failure."""

    template: ChatTemplate
    add_generation_prompt: bool = False
    first_failure_only: bool = False

    def __call__(self, values: list, given_up: Mapping[int, str] | None = None
                 ) -> tuple[list[ChatText], list[RowFailure]]:
        """The ChatText of each record that renders, in order, and the failures of the others (``given_up``:
        offset to why the pool gave that record up)."""
        compile_template(self.template.source)  # compiled (once a process) before any record's budget counts
        texts: list[ChatText] = []
        refused: list[RowFailure] = []
        for offset, value in enumerate(values):
            if given_up and offset in given_up:
                outcome: ChatText | RowFailure = RowFailure(offset, errors.CHAT_RENDER_BUDGET_EXCEEDED,
                                                            self._refusal(given_up[offset]))
            else:
                with budget.item(offset):
                    outcome = self._one(offset, value)
            if isinstance(outcome, ChatText):
                texts.append(outcome)
                continue
            refused.append(outcome)
            if self.first_failure_only:
                break
        return texts, refused

    def _one(self, offset: int, value: Any) -> ChatText | RowFailure:
        try:
            messages = checked_messages(value)
        except MessagesInvalid as exc:
            return RowFailure(offset, errors.DATASET_RECORD_INVALID, str(exc))
        try:
            chat = assistant_spans(self.template, messages, add_generation_prompt=self.add_generation_prompt)
        except RenderFailed as exc:
            code = errors.CHAT_RENDER_BUDGET_EXCEEDED if exc.limit else errors.DATASET_RECORD_INVALID
            return RowFailure(offset, code, self._refusal(str(exc)))
        if not self.add_generation_prompt and not any(end > start for start, end in chat.spans):
            roles = ", ".join(dict.fromkeys(repr(message["role"]) for message in messages))
            return RowFailure(offset, errors.DATASET_RECORD_INVALID,
                              f"has no assistant turn to train on (its roles: {roles}): its loss mask would be all "
                              "zeros; the loss is taken on the messages of role 'assistant' (or the template's "
                              "{% generation %} blocks): rename the role, or drop the record")
        return chat

    def _refusal(self, why: str) -> str:
        return f"does not render with {self.template.where}: {why}"


@dataclass(frozen=True)
class ChatWork:
    """What a render worker runs on a chunk: :class:`ChatRender`, then ``then`` (a function of a chunk whose
    values are the ChatText of the records that rendered) on those; returns ``(then's result, failures)``,
    ``then``'s result None without ``then`` or when the failures end the command."""

    render: ChatRender
    then: Callable[[RecordChunk], Any] | None = None

    def __call__(self, chunk: RecordChunk, given_up: Mapping[int, str] | None = None) -> tuple[Any, list[RowFailure]]:
        texts, refused = self.render(chunk.values[0], given_up)
        if self.then is None or (refused and self.render.first_failure_only):
            return None, refused
        rendered = replace(chunk, sample_ids=RowIds(0, len(texts)), values=[texts], read=None)
        return self.then(rendered), refused
