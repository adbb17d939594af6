"""Preference records: which kind the field options ask for (paired or unpaired, strings or conversations).

What goes in: the field options of a length build or a token store
(``prompt_field``, ``chosen_field``, ``rejected_field``, ``completion_field``,
``label_field``, ``conversational``, and the others they exclude). What
comes out: :class:`PreferenceKind`, or None for records that are not
preference data, or LENGTHS_INVALID naming the options that do not go
together.

The kinds, the forms TRL's ``DPOTrainer`` and ``KTOTrainer`` take (docs/batching.md, "Preference data"):

* **pairs**: a prompt, a chosen and a rejected completion; two rows a record
  (``X/chosen``, ``X/rejected``: lengths/pairs.py);
* **implicit pairs** (conversations only): a chosen and a rejected
  conversation whose shared first messages are the prompt (TRL's
  ``extract_prompt``); two rows a record as above;
* **unpaired** (KTO): a prompt, a completion and a label, true when the
  completion is desirable; one row a record (``X/desirable`` or
  ``X/undesirable``: lengths/unpaired.py).

Strings (the default) go through the instruction template, each row a
prompt/response row (umlos_cuda/batching/templates.py); with
``conversational`` each field is a list of messages rendered with the
tokenizer's chat template as TRL renders and tokenizes them
(umlos_cuda/batching/chat/preference.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ... import errors
from ...errors import UmlosError


@dataclass(frozen=True)
class PreferenceKind:
    """A kind of preference record: ``paired`` (chosen and rejected) or unpaired (completion and label),
    ``conversational`` (lists of messages) or strings, ``implicit`` (pairs without a prompt field)."""

    paired: bool
    conversational: bool
    implicit: bool = False

    @property
    def rows_per_record(self) -> int:
        return 2 if self.paired else 1

    @property
    def name(self) -> str:
        form = "implicit-prompt pairs" if self.implicit else "pairs" if self.paired else "unpaired records"
        return f"conversational {form}" if self.conversational else f"string {form}"


def preference_kind(*, text_field: str | None = None, prompt_field: str | None = None,
                    response_field: str | None = None, chosen_field: str | None = None,
                    rejected_field: str | None = None, completion_field: str | None = None,
                    label_field: str | None = None, messages_field: str | None = None,
                    conversational: bool = False) -> PreferenceKind | None:
    """The kind these options ask for (see the module docstring); None when they name no preference
    field and not ``conversational``; LENGTHS_INVALID for options that do not go together."""
    paired = chosen_field is not None or rejected_field is not None
    unpaired = completion_field is not None or label_field is not None
    if not (paired or unpaired or conversational):
        return None
    given = {"text_field": text_field, "prompt_field": prompt_field, "response_field": response_field,
             "chosen_field": chosen_field, "rejected_field": rejected_field, "completion_field": completion_field,
             "label_field": label_field, "messages_field": messages_field}
    shown = ", ".join(f"{name}={value!r}" for name, value in given.items() if value is not None) or "no field"
    if messages_field is not None or text_field is not None or response_field is not None:
        raise _invalid("preference records are read from a prompt, a chosen and a rejected field (or a completion "
                       "and a label field), without a text, response or messages field; a messages field is "
                       f"counted alone; got {shown}")
    if paired and unpaired:
        raise _invalid(f"give a chosen and a rejected field (pairs) or a completion and a label field (unpaired "
                       f"records), not both; got {shown}")
    if not (paired or unpaired):
        raise _invalid("conversational goes with preference fields (--chosen-field and --rejected-field, or "
                       "--completion-field and --label-field); chat records are read with --messages-field")
    if paired:
        if chosen_field is None or rejected_field is None:
            raise _invalid(f"a chosen and a rejected field go together; got {shown}")
        if prompt_field is None and not conversational:
            raise _invalid("without a prompt field, chosen and rejected are conversations that share their first "
                           "messages (an implicit prompt): give conversational=True (--conversational); string "
                           f"completions need a prompt field; got {shown}")
        return PreferenceKind(True, conversational, implicit=prompt_field is None)
    if completion_field is None or label_field is None or prompt_field is None:
        raise _invalid(f"unpaired records need a prompt, a completion and a label field together; got {shown}")
    return PreferenceKind(False, conversational)


def _invalid(message: str) -> UmlosError:
    return UmlosError(errors.LENGTHS_INVALID, message, operator=errors.BATCHING_OPERATOR)
