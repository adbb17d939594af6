"""Where the assistant turns of a rendered conversation are: the characters the loss is taken on.

What goes in: a template, checked messages and ``add_generation_prompt``.
What comes out: :class:`ChatText`, the rendered text and the ``(start, end)``
character spans of the assistant's output, in order; or
:class:`~.render.RenderFailed`.

* A template with ``{% generation %}`` markers says itself: the spans are its
  generation blocks, exactly what transformers' ``return_assistant_tokens_mask``
  masks.
* A template without them (most ChatML and Llama-3 templates) gets this
  rule, the **generation-prompt difference**: assistant message ``k`` spans
  from the end of ``render(messages[:k], add_generation_prompt=True)`` to the
  end of ``render(messages[:k + 1])``. That is what a model writes when it is
  asked for turn ``k`` at inference: the content and whatever the template
  closes a turn with (``<|im_end|>`` and its newline, ``<|eot_id|>``), and
  not the header the generation prompt already wrote (``<|im_start|>assistant``).
  Searching for each message's content in the text instead would leave out
  the end-of-turn token, so a model would never learn to stop. The rule
  needs a template whose renders extend one another: each prefix must be the
  start of the next render and of the whole conversation; a template that
  rewrites earlier turns (one that drops the reasoning of all but the last
  turn, say) fails the record, saying so, and needs markers instead.

The rule costs two renders per assistant turn besides the conversation's
own, less one when the conversation ends with an assistant turn and no
generation prompt is asked for (a training record, the common case): the
render through that turn is the conversation's own render, the same call.
"""

from __future__ import annotations

from dataclasses import dataclass

from .render import RenderFailed, render
from .template import ChatTemplate

ASSISTANT = "assistant"


@dataclass(frozen=True)
class ChatText:
    """A rendered conversation and the character spans its loss is taken on."""

    text: str
    spans: tuple[tuple[int, int], ...]


def assistant_spans(template: ChatTemplate, messages: list[dict], *, add_generation_prompt: bool = False) -> ChatText:
    """The rendered text and its assistant spans (markers, or the generation-prompt difference)."""
    whole = render(template, messages, add_generation_prompt=add_generation_prompt)
    if template.has_generation_markers:
        return ChatText(whole.text, whole.generation)
    spans: list[tuple[int, int]] = []
    last = len(messages) - 1
    for index, message in enumerate(messages):
        if message["role"] != ASSISTANT:
            continue
        try:
            before = render(template, messages[:index], add_generation_prompt=True).text
            after = whole.text if index == last and not add_generation_prompt else \
                render(template, messages[:index + 1]).text
        except RenderFailed as exc:
            raise RenderFailed(f"cannot render the conversation up to assistant message {index}, which the "
                               f"template has no {{% generation %}} markers to mark: {exc}", limit=exc.limit) from exc
        if not (after.startswith(before) and whole.text.startswith(after)):
            raise RenderFailed(f"the template renders the conversation before assistant message {index} differently "
                               "from the start of the whole conversation, so that turn cannot be found without "
                               "{% generation %} markers (docs/batching.md, 'Chat records')")
        if spans and len(before) < spans[-1][1]:
            raise RenderFailed(f"assistant message {index} starts before the previous assistant turn ends")
        spans.append((len(before), len(after)))
    return ChatText(whole.text, tuple(spans))
