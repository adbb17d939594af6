"""Chat records: ``messages`` rendered with the tokenizer's own chat template, and assistant loss masks.

Modules:
    environment  the Jinja environment, as transformers builds it (sandbox, ``{% generation %}``, globals)
    limits       how much work one render may do (steps, characters, ``*`` and ``**``; the worker's budget)
    steps        the step counter, compiled into a template's code: a count a loop iteration or a call
    guards       caps on the arguments that size a filter's or a ``str`` method's work
    template     which template renders a tokenizer's conversations, and its variables
    messages     check a messages value (content parts included) and shape it as transformers hands it to a template
    render       render one conversation: the text and its generation spans
    turns        the assistant spans: the template's markers, or the generation-prompt difference
    masks        token masks from character spans, as transformers' ``assistant_masks``
    byte_offsets a byte-level BPE's token offsets from its ids, where they are provably the tokenizer's own
    chunks       a chunk of records rendered in a worker under the budget, then encoded there (``ChatWork``)
    encode       one conversation to ids and an assistant mask (``encode_chat``)
    preference   conversational preference records (pairs, implicit-prompt pairs, unpaired) rendered as TRL does,
                 in the same workers (``PreferenceRender``)
    completions  where a rendered completion's tokens start (TRL's prompt length), and its loss masks
"""

from typing import TYPE_CHECKING

from ...reexports import lazy

if TYPE_CHECKING:  # the re-exports, imported on first use (umlos_cuda/reexports.py)
    from .encode import ChatSample, chat_encoder, encode_chat
    from .chunks import ChatRender
    from .template import ChatTemplate, chat_template_of

__all__ = ["ChatRender", "ChatSample", "ChatTemplate", "chat_encoder", "chat_template_of", "encode_chat"]

__getattr__, __dir__ = lazy(__name__, __file__)
