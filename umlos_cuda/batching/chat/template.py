"""Which chat template renders a tokenizer's conversations, and with which variables.

What goes in: a loaded tokenizer (umlos_cuda/batching/lengths/tokenizer.py,
which reads ``chat_template.jinja``, ``tokenizer_config.json`` and
``additional_chat_templates/`` once, for the fingerprint too) and optionally a
template file that overrides its own. What comes out: a
:class:`ChatTemplate`, compiled, or CHAT_TEMPLATE_INVALID.

The choice is ``transformers``' ``get_chat_template`` without tools: the one
template, or of named templates (a list of ``{"name", "template"}`` in the
config, or the ``.jinja`` files of ``additional_chat_templates/``) the one
named ``default``. The variables are those ``apply_chat_template`` passes:
``messages``, ``add_generation_prompt``, ``tools`` and ``documents`` (both
``None``) and the tokenizer's named special tokens (``bos_token``,
``eos_token``, ``unk_token``, ``sep_token``, ``pad_token``, ``cls_token``,
``mask_token``, those the files name), as text.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ... import errors
from ...errors import UmlosError
from ...files import reader
from ..lengths.tokenizer import LoadedTokenizer, load_tokenizer
from .environment import GENERATION_TAG, compile_template

#: The special tokens transformers passes to a template (``SPECIAL_TOKENS_ATTRIBUTES``; not the additional ones).
TEMPLATE_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
#: The largest template compiled, wherever it comes from (``--chat-template``, ``chat_template.jinja``,
#: ``tokenizer_config.json``, ``additional_chat_templates/``): real ones are kilobytes, and Jinja takes
#: seconds to compile a megabyte of tags (a 28 MB one was still compiling after 40 s).
MAX_TEMPLATE_BYTES = 1 << 20


@dataclass(frozen=True)
class ChatTemplate:
    """A compiled chat template and the variables it renders with."""

    source: str
    variables: dict[str, str] = field(default_factory=dict)
    where: str = "the chat template"

    @property
    def has_generation_markers(self) -> bool:
        """True when the template marks assistant output with ``{% generation %}`` (transformers' test)."""
        return GENERATION_TAG.search(self.source) is not None

    @property
    def compiled(self):
        return compile_template(self.source)


def chat_template_of(tokenizer: Any, override: str | os.PathLike[str] | None = None) -> ChatTemplate:
    """The template that renders ``tokenizer``'s conversations: ``override`` (a
    Jinja file) or the tokenizer's own; compiled, or CHAT_TEMPLATE_INVALID."""
    loaded = load_tokenizer(tokenizer)
    variables = {key: str(loaded.special_tokens[key]) for key in TEMPLATE_TOKENS if key in loaded.special_tokens}
    if override is not None:
        where = os.fspath(override)
        try:
            source = reader.read_text(where, invalid, max_bytes=MAX_TEMPLATE_BYTES, what="chat template")
        except FileNotFoundError:
            raise invalid(f"the chat template {where} does not exist") from None
    else:
        source, where = _own_template(loaded)
        size = len(source.encode("utf-8", "surrogatepass"))
        if size > MAX_TEMPLATE_BYTES:
            raise invalid(f"{where} is {size:,} bytes, over the {MAX_TEMPLATE_BYTES:,} a chat template may have; "
                          "pass a smaller one with --chat-template FILE")
    try:
        compile_template(source)
    except Exception as exc:  # jinja2.TemplateSyntaxError, or a template too deep for the parser
        raise invalid(f"{where} does not compile: {_one_line(exc)}") from exc
    return ChatTemplate(source, variables, where)


def _own_template(loaded: LoadedTokenizer) -> tuple[str, str]:
    where = loaded.path or "this tokenizer"
    template = loaded.chat_template
    if template is None:
        raise invalid(f"{where} has no chat template (chat_template.jinja, or 'chat_template' in "
                      "tokenizer_config.json); pass one with --chat-template FILE")
    if isinstance(template, str):
        return template, f"the chat template of {where}"
    if isinstance(template, list):
        named = {}
        for item in template:
            if not (isinstance(item, dict) and isinstance(item.get("name"), str)
                    and isinstance(item.get("template"), str)):
                raise invalid(f"{where}: each named chat template is an object with a string 'name' and "
                              f"'template', got {str(item)[:80]!r}")
            named[item["name"]] = item["template"]
        template = named
    if "default" not in template:
        raise invalid(f"{where} has named chat templates {sorted(template)} and none named 'default'; pass the "
                      "one to use with --chat-template FILE")
    return template["default"], f"the default chat template of {where}"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]


def invalid(message: str) -> UmlosError:
    return UmlosError(errors.CHAT_TEMPLATE_INVALID, message, operator=errors.BATCHING_OPERATOR)
