"""Conversational preference records rendered as TRL's ``DPOTrainer`` and ``KTOTrainer`` render them.

What goes in: a chat template, the kind of record
(umlos_cuda/batching/lengths/preference.py) and, in a render worker (the
budgeted workers of umlos_cuda/batching/chat/chunks.py, which run
:class:`PreferenceRender` as they run chat records' ``ChatRender``), chunks of
records whose fields are lists of messages, handed on by the reader as read:
prompt, chosen and rejected; chosen and rejected alone (an implicit prompt);
or prompt, completion and a label. What comes out: the rows of the records
that render (``X/chosen`` and ``X/rejected`` for a pair; ``X/desirable`` or
``X/undesirable`` for an unpaired record), each as its text (prompt and
completion rendered together), its prompt's text (rendered with the
generation prompt) and the record it comes from (its offset in the chunk: the
rows of one record share one prompt length); and the records refused, each a
``RowFailure`` with its code and why (messages that are not a conversation, a
part that is not text, a template that refuses them, a pair without a shared
prompt; CHAT_RENDER_BUDGET_EXCEEDED past a render limit or the budget), which
the reader names with their line and raises or skips in line order. The ids
of the rows are the reader's to give (:meth:`PreferenceRender.rows`): the
worker never sees the records' ids.

The rules are those of TRL 1.16 (``_prepare_dataset`` of
trl/trainer/dpo_trainer.py and kto_trainer.py; trl/data_utils.py):

1. **Implicit prompt.** Without a prompt field, the prompt is the run of
   messages chosen and rejected share from the start, cut at the first
   message where they differ (``extract_prompt``; where one conversation is
   the start of the other, the cut falls one message before the shorter
   one's end, as there). Messages compare without their null keys (what
   ``datasets`` fills in for a missing key). A pair whose first messages
   differ has no prompt and is refused: TRL fails on it.
2. **Renders.** The prompt is rendered with ``add_generation_prompt=True``;
   each row is ``prompt + completion`` rendered without it, both with
   ``tools`` and ``documents`` ``None``, as ``apply_chat_template`` renders
   (umlos_cuda/batching/chat/render.py; messages checked and shaped by
   umlos_cuda/batching/chat/messages.py, content parts included). All the
   renders of one record run under one item of the budget.
3. **Tokens and masks** (umlos_cuda/batching/chat/completions.py): both
   encoded without added special tokens; a row's completion starts where
   its tokens and the prompt's first differ, the earlier of the two rows'
   for a pair (``common_prefix_length``); the row is all of
   ``prompt + completion``'s tokens, loss mask 0 before that start and 1
   from it. A ``{% generation %}`` template is rendered the same way: TRL's
   preference trainers take the completion, not the markers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ... import errors
from ..lengths.pairs import pair_ids
from ..lengths.preference import PreferenceKind
from ..lengths.unpaired import unpaired_id
from ..records.chunk import RecordChunk, RowFailure
from .chunks import RecordRender
from .messages import MessagesInvalid, checked_messages
from .render import RenderFailed, render
from .template import ChatTemplate


class Refused(ValueError):
    """A record that makes no rows: why (``has 'F' that ...``, ``does not render ...``) and the failure's ``code``."""

    def __init__(self, code: str, problem: str) -> None:
        super().__init__(problem)
        self.code = code


@dataclass(frozen=True)
class PreferenceRender(RecordRender):
    """Render chunks of conversational preference records of ``kind`` (fields named ``names``, in read order);
    each row's values: its text, its prompt's text, its record's offset in the chunk."""

    template: ChatTemplate
    kind: PreferenceKind
    names: tuple[str, ...]
    first_failure_only: bool = False
    width: ClassVar[int] = 3

    def one(self, offset: int, record: tuple) -> Sequence[tuple] | RowFailure:
        try:
            prompt, texts = self.record(record)
        except Refused as exc:
            return RowFailure(offset, exc.code, str(exc))
        return [(text, prompt, offset) for text in texts]

    def record(self, values: tuple[Any, ...]) -> tuple[str, list[str]]:
        """The prompt's text and the text of each row of one record (rules 1 and 2 of the module docstring)."""
        talks = len(values) if self.kind.paired else len(values) - 1  # an unpaired record's last field is its label
        checked = [self._messages(name, value) for name, value in zip(self.names[:talks], values[:talks])]
        if self.kind.implicit:
            prompt, *completions = split_prompt(*checked)
        else:
            prompt, *completions = checked
        return self._render(prompt, True), [self._render(prompt + part, False) for part in completions]

    def refusal(self, why: str) -> str:
        return f"does not render with {self.template.where}: {why}"

    def rows(self, chunk: RecordChunk) -> RecordChunk:
        """The rows of the records of ``chunk`` as the reader names them, ids only (their values are the
        worker's): ``X/chosen`` and ``X/rejected`` a pair, ``X/desirable`` or ``X/undesirable`` (its label,
        the last field) an unpaired record."""
        if self.kind.paired:
            ids = [row_id for record_id in chunk.sample_ids for row_id in pair_ids(record_id)]
        else:
            ids = [unpaired_id(record_id, label) for record_id, label in zip(chunk.sample_ids, chunk.values[-1])]
        return RecordChunk(ids, [], chunk.first_line, chunk.bytes_read, chunk.shard)

    def _messages(self, name: str, value: Any) -> list[dict]:
        try:
            return checked_messages(value)
        except MessagesInvalid as exc:
            raise Refused(exc.code, f"has {name!r} that {exc}") from None

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        try:
            return render(self.template, messages, add_generation_prompt=add_generation_prompt).text
        except RenderFailed as exc:
            code = errors.CHAT_RENDER_BUDGET_EXCEEDED if exc.limit else errors.DATASET_RECORD_INVALID
            raise Refused(code, self.refusal(str(exc))) from None


def split_prompt(chosen: list[dict], rejected: list[dict]) -> tuple[list[dict], list[dict], list[dict]]:
    """``(prompt, chosen, rejected)`` of a pair without a prompt field: TRL's ``extract_prompt`` over
    messages (rule 1 of the module docstring); a pair whose first messages differ is refused."""
    shared = min(len(chosen), len(rejected))
    cut = shared - 1  # extract_prompt's loop ends on its last index when no message differs
    for index in range(shared):
        if _without_nulls(chosen[index]) != _without_nulls(rejected[index]):
            cut = index
            break
    if cut <= 0:
        raise Refused(errors.DATASET_RECORD_INVALID, "has chosen and rejected conversations that share no first "
                       "message, so there is no prompt; give the prompt in a field of its own (--prompt-field)")
    return chosen[:cut], chosen[cut:], rejected[cut:]


def _without_nulls(value: Any) -> Any:
    """``value`` with the null keys of every object in it dropped: messages as ``datasets`` compares them."""
    if isinstance(value, dict):
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_without_nulls(item) for item in value]
    return value
