"""Check a record's ``messages`` value and shape it as transformers hands it to a template.

What goes in: the JSON value of a record's messages field. What comes out:
a new list of new dicts, or :class:`MessagesInvalid` saying what is wrong
(:class:`ContentUnsupported` for a part that is not text).

A conversation is a non-empty list of objects, each with a string ``role``
and a ``content`` that is a string or a list of **content parts**, the
OpenAI and Hugging Face form ``[{"type": "text", "text": "..."}, ...]``;
other keys (``name``, ``reasoning_content``, ...) are kept and reach the
template. Then, as ``apply_chat_template`` does (``_normalize_chat_messages``,
``_alias_reasoning_fields``): keys whose value is ``null`` are dropped, and a
message with reasoning under ``reasoning_content``, ``thinking`` or
``reasoning`` gets it under both ``thinking`` and ``reasoning_content``
(templates read one or the other).

Content parts reach the template as the list they are, as transformers
passes them (it renders a list as the template reads it, and drops null keys
of messages only, not of parts): a template that reads ``message['content']``
as text renders or refuses a list exactly as it does there. Each part must be
an object with a string ``type``; a ``"text"`` part needs a string ``text``.
Any other type (``image``, ``image_url``, ``input_audio``, ``file``, ...) is
refused with CHAT_CONTENT_UNSUPPORTED: media are not supported yet, and a
record that silently lost its image would train on a question about nothing.
JSON values are already the plain types transformers reduces everything to.
"""

from __future__ import annotations

from typing import Any

from ... import errors

#: Names a message's reasoning comes under; transformers fills the first two from the first one set.
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
#: The one content part type rendered: text.
TEXT_PART = "text"


class MessagesInvalid(ValueError):
    """A messages value that is not a conversation (the message says why; ``code`` is the failure's code)."""

    code = errors.DATASET_RECORD_INVALID


class ContentUnsupported(MessagesInvalid):
    """A message content part that is not text: media are not supported yet."""

    code = errors.CHAT_CONTENT_UNSUPPORTED


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
        if not isinstance(message.get("role"), str):
            raise MessagesInvalid(f"has message {index} that {_lacks(message, 'role')} 'role'; "
                                  "each message has a string 'role'")
        content = message.get("content")
        if isinstance(content, list):
            _check_parts(index, content)
        elif not isinstance(content, str):
            raise MessagesInvalid(f"has message {index} that {_lacks(message, 'content')} 'content'; each message "
                                  "has a 'content' that is a string or a list of text parts")
        message = {key: item for key, item in message.items() if item is not None}
        reasoning = next((message[key] for key in REASONING_FIELDS if message.get(key) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        messages.append(message)
    return messages


def _check_parts(index: int, parts: list) -> None:
    """Content parts: objects with a string ``type``, text ones with a string ``text``; others refused."""
    for position, part in enumerate(parts):
        where = f"has message {index} whose content part {position}"
        if not isinstance(part, dict):
            raise MessagesInvalid(f"{where} is of type {_json_type(part)}; a content part is an object such as "
                                  '{"type": "text", "text": "..."}')
        kind = part.get("type")
        if not isinstance(kind, str):
            raise MessagesInvalid(f"{where} {_lacks(part, 'type')} 'type'; a content part is an object such as "
                                  '{"type": "text", "text": "..."}')
        if kind != TEXT_PART:
            raise ContentUnsupported(f"{where} is of type {kind[:40]!r}; only text parts are supported (media are "
                                     "not yet): leave such records out, or skip them with --skip-bad-lines")
        if not isinstance(part.get("text"), str):
            raise MessagesInvalid(f"{where} is a text part that {_lacks(part, 'text')} 'text'; a text part is "
                                  '{"type": "text", "text": "..."} with a string text')


def _lacks(item: dict, key: str) -> str:
    return "lacks" if item.get(key) is None else f"has a non-string ({_json_type(item[key])})"


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
