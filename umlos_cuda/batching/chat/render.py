"""Render one conversation with a chat template: the text, and its assistant spans.

What goes in: a :class:`~.template.ChatTemplate`, checked messages
(umlos_cuda/batching/chat/messages.py) and ``add_generation_prompt``. What
comes out: :class:`Rendered`, the text ``apply_chat_template(...,
tokenize=False)`` gives, and the ``(start, end)`` character spans of its
``{% generation %}`` blocks (what transformers turns into
``return_assistant_tokens_mask``); or :class:`RenderFailed` with the
template's own message (``raise_exception``, an undefined value, a sandbox
refusal) or the limit it went past (:attr:`RenderFailed.limit`: a render
limit of umlos_cuda/batching/chat/limits.py, memory, Python's recursion limit).
"""

from __future__ import annotations

from dataclasses import dataclass

from .environment import GenerationSpans
from .limits import RenderLimitExceeded, check_length
from .steps import Steps
from .template import ChatTemplate


class RenderFailed(ValueError):
    """The template raised, or went past a render limit (``limit``), on this conversation."""

    def __init__(self, message: str, *, limit: bool = False) -> None:
        super().__init__(message)
        self.limit = limit


@dataclass(frozen=True)
class Rendered:
    """A rendered conversation and the character spans of its ``{% generation %}`` blocks."""

    text: str
    generation: tuple[tuple[int, int], ...]


def render(template: ChatTemplate, messages: list[dict], *, add_generation_prompt: bool = False) -> Rendered:
    """Render ``messages`` as transformers does: ``tools`` and ``documents``
    ``None``, the special tokens as variables, output piece by piece with the
    characters so far counted for the generation spans."""
    compiled = template.compiled
    pieces = []
    try:
        with Steps(), GenerationSpans() as state:
            for piece in compiled.generate(messages=messages, tools=None, documents=None,
                                           add_generation_prompt=add_generation_prompt, **template.variables):
                pieces.append(piece)
                state[0] += len(piece)
                check_length(state[0])
            spans = tuple(state[1])
    except Exception as exc:  # what a template raises (RecursionError, MemoryError too) is the record's failure
        limit = isinstance(exc, (RenderLimitExceeded, MemoryError, RecursionError))
        raise RenderFailed(f"{type(exc).__name__}: {_one_line(exc)}", limit=limit) from exc
    return Rendered("".join(pieces), spans)


def _one_line(exc: BaseException) -> str:
    return (" ".join(str(exc).split()) or "no message")[:300]
