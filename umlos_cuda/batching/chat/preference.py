"""Conversational preference records rendered as TRL's ``DPOTrainer`` and ``KTOTrainer`` render them.

What goes in: a chat template, the kind of record
(umlos_cuda/batching/lengths/preference.py) and chunks of records whose
fields are lists of messages: prompt, chosen and rejected; chosen and
rejected alone (an implicit prompt); or prompt, completion and a label.
What comes out: :class:`RenderedRows`, a chunk of rows (``X/chosen`` and
``X/rejected`` for a pair; ``X/desirable`` or ``X/undesirable`` for an
unpaired record) whose values are, for each row, the text of prompt and
completion rendered, the prompt rendered with the generation prompt, and
the record it comes from (its offset in the chunk: the rows of one record
share one prompt length); and the records refused, each with its code and
why (messages that are not a conversation, a part that is not text, a
template that refuses them, a pair without a shared prompt).

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
   umlos_cuda/batching/chat/messages.py, content parts included).
3. **Tokens and masks** (umlos_cuda/batching/chat/completions.py): both
   encoded without added special tokens; a row's completion starts where
   its tokens and the prompt's first differ, the earlier of the two rows'
   for a pair (``common_prefix_length``); the row is all of
   ``prompt + completion``'s tokens, loss mask 0 before that start and 1
   from it. A ``{% generation %}`` template is rendered the same way: TRL's
   preference trainers take the completion, not the markers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ... import errors
from ..lengths.pairs import CHOSEN_SUFFIX, REJECTED_SUFFIX
from ..lengths.preference import PreferenceKind
from ..lengths.unpaired import unpaired_id
from ..records.chunk import RecordChunk
from .messages import MessagesInvalid, checked_messages
from .render import RenderFailed, render
from .template import ChatTemplate


class Refused(ValueError):
    """A record that makes no rows: why (``has 'F' that ...``, ``does not render ...``) and the failure's ``code``."""

    def __init__(self, code: str, problem: str) -> None:
        super().__init__(problem)
        self.code = code


@dataclass(frozen=True)
class RenderedRows:
    """The rows of a chunk's records that render (values: row texts, prompt texts, record offsets), and the
    records refused, each with its offset in the chunk."""

    rows: RecordChunk
    refused: list[tuple[int, Refused]]


@dataclass(frozen=True)
class PreferenceRender:
    """Render chunks of conversational preference records of ``kind`` (fields named ``names``, in read order)."""

    template: ChatTemplate
    kind: PreferenceKind
    names: tuple[str, ...]

    def __call__(self, chunk: RecordChunk) -> RenderedRows:
        ids: list[str] = []
        texts: list[str] = []
        prompts: list[str] = []
        records: list[int] = []
        refused: list[tuple[int, Refused]] = []
        for offset, (record_id, values) in enumerate(zip(chunk.sample_ids, zip(*chunk.values))):
            try:
                prompt, rows = self.record(record_id, values)
            except Refused as exc:
                refused.append((offset, exc))
                continue
            for row_id, text in rows:
                ids.append(row_id)
                texts.append(text)
                prompts.append(prompt)
                records.append(offset)
        return RenderedRows(RecordChunk(ids, [texts, prompts, records], chunk.first_line, chunk.bytes_read,
                                        chunk.shard), refused)

    def record(self, record_id: str, values: tuple[Any, ...]) -> tuple[str, list[tuple[str, str]]]:
        """The prompt's text and ``(row id, row text)`` of one record (rules 1 and 2 of the module docstring)."""
        talks = len(values) if self.kind.paired else len(values) - 1  # an unpaired record's last field is its label
        checked = [self._messages(name, value) for name, value in zip(self.names[:talks], values[:talks])]
        if self.kind.implicit:
            prompt, chosen, rejected = split_prompt(*checked)
        elif self.kind.paired:
            prompt, chosen, rejected = checked
        else:
            prompt, completion = checked
            return self._render(prompt, True), [(unpaired_id(record_id, values[2]), self._render(prompt + completion,
                                                                                              False))]
        completions = ((record_id + CHOSEN_SUFFIX, chosen), (record_id + REJECTED_SUFFIX, rejected))
        return self._render(prompt, True), [(row_id, self._render(prompt + part, False))
                                            for row_id, part in completions]

    def _messages(self, name: str, value: Any) -> list[dict]:
        try:
            return checked_messages(value)
        except MessagesInvalid as exc:
            raise Refused(exc.code, f"has {name!r} that {exc}") from None

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        try:
            return render(self.template, messages, add_generation_prompt=add_generation_prompt).text
        except RenderFailed as exc:
            raise Refused(errors.DATASET_RECORD_INVALID, f"does not render with {self.template.where}: {exc}") \
                from None


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
