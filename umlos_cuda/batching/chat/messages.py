"""Check a record's ``messages`` value and shape it as transformers hands it to a template.

What goes in: the JSON value of a record's messages field. What comes out:
a new list of new dicts, or :class:`MessagesInvalid` saying what is wrong.

A conversation is a non-empty list of objects, each with a string ``role``
and a string ``content``; other keys (``name``, ``reasoning_content``, ...)
are kept and reach the template. Then, as ``apply_chat_template`` does
(``_normalize_chat_messages``, ``_alias_reasoning_fields``): keys whose
value is ``null`` are dropped, and a message with reasoning under
``reasoning_content``, ``thinking`` or ``reasoning`` gets it under both
``thinking`` and ``reasoning_content`` (templates read one or the other).
JSON values are already the plain types transformers reduces everything to.
"""

from __future__ import annotations

from typing import Any

#: Names a message's reasoning comes under; transformers fills the first two from the first one set.
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class MessagesInvalid(ValueError):
    """A messages value that is not a conversation (the message says why)."""


def checked_messages(value: Any) -> list[dict]:
    """``value`` as the list of messages a template sees; :class:`MessagesInvalid` when it is not one."""
    if not isinstance(value, list):
        raise MessagesInvalid(f"is of type {_json_type(value)}; it must be a list of messages "
                              "(objects with 'role' and 'content')")
    if not value:
        raise MessagesInvalid("is an empty list; a conversation holds at least one message")
    messages = []
    for index, message in enumerate(value):
        if not isinstance(message, dict):
            raise MessagesInvalid(f"has message {index} of type {_json_type(message)}; "
                                  "each message is an object with 'role' and 'content'")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                what = "lacks" if message.get(key) is None else f"has a non-string ({_json_type(message[key])})"
                raise MessagesInvalid(f"has message {index} that {what} {key!r}; "
                                      "each message has a string 'role' and a string 'content'")
        message = {key: item for key, item in message.items() if item is not None}
        reasoning = next((message[key] for key in REASONING_FIELDS if message.get(key) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        messages.append(message)
    return messages


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
