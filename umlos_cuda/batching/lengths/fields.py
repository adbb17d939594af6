"""Which fields of a record a length build reads, and what each is (records/chunk.py :class:`Field`).

What goes in: the field options (``text_field``; ``prompt_field`` and
``response_field``; ``prompt_field``, ``chosen_field`` and
``rejected_field``, or ``chosen_field`` and ``rejected_field`` alone;
``prompt_field``, ``completion_field`` and ``label_field``;
``messages_field``; ``length_field``; and ``conversational``), already
checked for their combination by the builder (lengths/builder.py,
lengths/preference.py), but for ``length_field``, which is checked here.
What comes out: the fields, each with its kind and role: ``text``,
``prompt``, ``response``, ``chosen``, ``rejected``, ``completion``
(strings; lists of messages, kind ``json``, for conversational preference
records and for chosen and rejected without a prompt), ``label`` (true or
false), ``messages`` (any JSON value, rendered by the chat template),
``length`` (an integer token count, read as is). The roles name the columns
in the dataset fingerprint, so which column a value came from does not
matter, only what it is used as.
"""

from __future__ import annotations

from ... import errors
from ...errors import UmlosError
from ..records.chunk import Field

DEFAULT_TEXT_FIELD = "text"


def record_fields(text_field: str | None = None, prompt_field: str | None = None, response_field: str | None = None,
                  length_field: str | None = None, *, chosen_field: str | None = None,
                  rejected_field: str | None = None, messages_field: str | None = None,
                  completion_field: str | None = None, label_field: str | None = None,
                  conversational: bool = False) -> tuple[Field, ...]:
    """The fields to read for these options (see the module docstring)."""
    others = {"text_field": text_field, "prompt_field": prompt_field, "response_field": response_field,
              "chosen_field": chosen_field, "rejected_field": rejected_field, "messages_field": messages_field,
              "completion_field": completion_field, "label_field": label_field,
              "conversational": conversational or None}
    if length_field is not None:
        given = ", ".join(f"{name}={value!r}" for name, value in others.items() if value is not None)
        if given:
            raise UmlosError(errors.LENGTHS_INVALID, "a length field is read instead of counting text; give it "
                             "without --text-field, --prompt-field, --response-field, --chosen-field, "
                             "--rejected-field, --completion-field, --label-field, --messages-field or "
                             f"--conversational (got {given})", operator=errors.BATCHING_OPERATOR)
        return (Field(length_field, "integer", "length"),)
    if messages_field is not None:
        return (Field(messages_field, "json", "messages"),)
    kind = "json" if conversational else "string"
    if chosen_field is not None and rejected_field is not None:
        sides = (Field(chosen_field, kind, "chosen"), Field(rejected_field, kind, "rejected"))
        if prompt_field is None:  # an implicit prompt: conversations that share their first messages
            return tuple(Field(side.name, "json", side.role) for side in sides)
        return (Field(prompt_field, kind, "prompt"), *sides)
    if completion_field is not None and label_field is not None and prompt_field is not None:
        return (Field(prompt_field, kind, "prompt"), Field(completion_field, kind, "completion"),
                Field(label_field, "boolean", "label"))
    if prompt_field is not None and response_field is not None:
        return Field(prompt_field, "string", "prompt"), Field(response_field, "string", "response")
    return (Field(DEFAULT_TEXT_FIELD if text_field is None else text_field, "string", "text"),)
