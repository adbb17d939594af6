"""Records rendered where they are encoded: a chunk's conversations to texts, or why not.

What goes in: a render (:class:`ChatRender` for chat records;
umlos_cuda/batching/chat/preference.py ``PreferenceRender`` for
conversational preference records, TRL's forms), and then, in a render
worker (a ``--workers`` process of umlos_cuda/batching/lengths/workers.py,
under the render budget of umlos_cuda/batching/chat/limits.py), a chunk of
records whose conversations the reader handed on as read. What comes out:
the rows of the records that render, as columns (for a chat record one row,
its :class:`~.turns.ChatText`: the text the tokenizer encodes and the spans
its loss is taken on; for a preference record one or two rows, each its
text, its prompt's text and the record's offset); and for each other record
(not a conversation this template renders; a content part that is not text;
a chat record with nothing to train on: no assistant turn, only ``user``
messages or a role the template does not mark, such as ``"bot"``, whose loss
mask would be all zeros; a pair without a shared prompt) a
:class:`~umlos_cuda.batching.records.chunk.RowFailure` saying why, which the
reader names with its line and raises or skips (``--skip-bad-lines``) in line
order (records/source.py ``Records.accept``), in the length cache and the
token store alike. The render also says, in the reader, which rows the
records it kept make (:meth:`RecordRender.rows`: their ids).

:class:`ChatWork` is what the workers run: render the chunk, then hand the
rows of the records that rendered to the encoding work (the length builder's
``ChunkEncoder.lengths``, the token store's ``encode_chunk``), in the same
process, so a record crosses the pipe once as its messages and comes back as
its tokens. Each record renders under the budget (``budget.item``; all the
renders of a preference record together): past its CPU or wall-clock seconds
the worker ends and the pool gives that record up with the reason
(``given_up``), which this renders as the record's failure,
CHAT_RENDER_BUDGET_EXCEEDED, as it does a render past a counted limit
(umlos_cuda/batching/chat/limits.py). A render that needs no more than the
first failure (no ``--skip-bad-lines``: the command stops there) stops there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from ... import errors
from ..lengths import budget
from ..records.chunk import RecordChunk, RowFailure, RowIds
from .environment import compile_template
from .messages import MessagesInvalid, checked_messages
from .render import RenderFailed
from .template import ChatTemplate
from .turns import assistant_spans


class RecordRender:
    """Render a chunk's records one by one under the budget (the loop every render shares).

    A render is a frozen dataclass with ``template`` and ``first_failure_only`` (stop at the first failure)
    that says how one record renders (:meth:`one`: its rows, each a tuple of :attr:`width` values, or a
    failure) and which rows the records the reader kept make (:meth:`rows`)."""

    template: ChatTemplate
    first_failure_only: bool
    #: Values a row holds (the columns of the chunk handed on to the encoding).
    width: ClassVar[int] = 1
    __dataclass_fields__: ClassVar[dict[str, Any]]  # each render is a dataclass (``dataclasses.replace`` takes it)

    def __call__(self, values: list, given_up: Mapping[int, str] | None = None
                 ) -> tuple[list[list], list[RowFailure]]:
        """The columns of the rows of the records that render, in order, and the failures of the others
        (``given_up``: offset to why the pool gave that record up)."""
        compile_template(self.template.source)  # compiled (once a process) before any record's budget counts
        rows: list[tuple] = []
        refused: list[RowFailure] = []
        for offset, record in enumerate(zip(*values)):
            if given_up and offset in given_up:
                outcome: Sequence[tuple] | RowFailure = RowFailure(offset, errors.CHAT_RENDER_BUDGET_EXCEEDED,
                                                                   self.refusal(given_up[offset]))
            else:
                with budget.item(offset):
                    outcome = self.one(offset, record)
            if not isinstance(outcome, RowFailure):
                rows.extend(outcome)
                continue
            refused.append(outcome)
            if self.first_failure_only:
                break
        return [list(column) for column in zip(*rows)] if rows else [[] for _ in range(self.width)], refused

    def one(self, offset: int, record: tuple) -> Sequence[tuple] | RowFailure:
        """The rows of the record at ``offset`` (its values, one a field read), or why it makes none."""
        raise NotImplementedError

    def refusal(self, why: str) -> str:
        """A failure's problem, as it follows the record's place in a message, for a render that failed ``why``."""
        raise NotImplementedError

    def rows(self, chunk: RecordChunk) -> RecordChunk:
        """The chunk of rows the records of ``chunk`` make (the records the reader kept): one a record."""
        return chunk

    def _failed(self, offset: int, exc: MessagesInvalid | RenderFailed, problem: str) -> RowFailure:
        """The failure of a record whose messages are not a conversation (``exc.code``) or whose render failed
        (past a counted limit: CHAT_RENDER_BUDGET_EXCEEDED)."""
        if isinstance(exc, MessagesInvalid):
            return RowFailure(offset, exc.code, problem)
        return RowFailure(offset, errors.CHAT_RENDER_BUDGET_EXCEEDED if exc.limit else errors.DATASET_RECORD_INVALID,
                          problem)


@dataclass(frozen=True)
class ChatRender(RecordRender):
    """Render a chunk's messages values (the field ``field``) with ``template``, one row a record, its ChatText;
    ``first_failure_only``: stop at the first failure."""

    template: ChatTemplate
    add_generation_prompt: bool = False
    first_failure_only: bool = False
    field: str = "messages"

    def one(self, offset: int, record: tuple) -> Sequence[tuple] | RowFailure:
        try:
            messages = checked_messages(record[0])
        except MessagesInvalid as exc:
            return self._failed(offset, exc, f"has {self.field!r} that {exc}")
        try:
            chat = assistant_spans(self.template, messages, add_generation_prompt=self.add_generation_prompt)
        except RenderFailed as exc:
            return self._failed(offset, exc, self.refusal(str(exc)))
        if not self.add_generation_prompt and not any(end > start for start, end in chat.spans):
            roles = ", ".join(dict.fromkeys(repr(message["role"]) for message in messages))
            return RowFailure(offset, errors.DATASET_RECORD_INVALID,
                              f"has {self.field!r} that has no assistant turn to train on (its roles: {roles}): its "
                              "loss mask would be all zeros; the loss is taken on the messages of role 'assistant' "
                              "(or the template's {% generation %} blocks): rename the role, or drop the record")
        return ((chat,),)

    def refusal(self, why: str) -> str:
        return f"has {self.field!r} that does not render with {self.template.where}: {why}"


@dataclass(frozen=True)
class ChatWork:
    """What a render worker runs on a chunk: the ``render`` (a :class:`RecordRender`), then ``then`` (a function
    of a chunk whose values are the columns of the rows of the records that rendered) on those; returns
    ``(then's result, failures)``, ``then``'s result None without ``then`` or when the failures end the command."""

    render: RecordRender
    then: Callable[[RecordChunk], Any] | None = None

    def __call__(self, chunk: RecordChunk, given_up: Mapping[int, str] | None = None) -> tuple[Any, list[RowFailure]]:
        columns, refused = self.render(chunk.values, given_up)
        if self.then is None or (refused and self.render.first_failure_only):
            return None, refused
        rendered = replace(chunk, sample_ids=RowIds(0, len(columns[0])), values=columns, read=None)
        return self.then(rendered), refused
