"""The instruction template and its loss-mask rule, for prompt/response records.

What goes in: a prompt, a response and a tokenizer. What comes out: the
training text, and a :class:`~umlos_cuda.batching.samples.Sample` whose
tokens are ``encode(template(prompt) + response)`` followed by the
end-of-sequence token, with loss mask 0 over the first
``len(encode(template(prompt)))`` tokens and 1 over the rest (the completion
and the end token). The template::

    ### Instruction:
    {prompt}

    ### Response:
    {response}

``data lengths build --prompt-field P --response-field R`` counts exactly
these tokens (:func:`sft_length`), so a length cache and the samples a
training loop builds agree.
"""

from __future__ import annotations

from typing import Any

from .samples import Sample, SampleMeta
from .lengths.tokenizer import load_tokenizer

PROMPT_TEMPLATE = "### Instruction:\n{prompt}\n\n### Response:\n"
#: Tokens the rule appends after the encoded text: the end-of-sequence token.
APPENDED_TOKENS = 1


def sft_prompt(prompt: str) -> str:
    """The prompt part of the training text."""
    return PROMPT_TEMPLATE.format(prompt=prompt)


def sft_text(prompt: str, response: str) -> str:
    """The whole training text (without the end-of-sequence token)."""
    return sft_prompt(prompt) + response


def sft_length(encoded_text_length: int) -> int:
    """The sample's length from the length of ``encode(sft_text(...))``."""
    return encoded_text_length + APPENDED_TOKENS


def sft_sample(tokenizer: Any, prompt: str, response: str, meta: SampleMeta, *, eos_token: str | None = None) -> Sample:
    """The training sample of one prompt/response record (the rule above).

    ``eos_token`` overrides the directory's ``eos_token`` (required for a
    bare ``tokenizer.json``, which names none)."""
    loaded = load_tokenizer(tokenizer)
    eos_id = loaded.eos_token_id(eos_token)
    prompt_ids = loaded.tokenizer.encode(sft_prompt(prompt)).ids
    input_ids = loaded.tokenizer.encode(sft_text(prompt, response)).ids + [eos_id]
    masked = min(len(prompt_ids), len(input_ids))
    return Sample(input_ids, [0] * masked + [1] * (len(input_ids) - masked), None, meta)
