"""Load a Hugging Face ``tokenizers`` tokenizer from local files, no network.

What goes in: a path, either a ``tokenizer.json`` file or a model directory
holding one (as ``save_pretrained`` writes it). What comes out: a
:class:`LoadedTokenizer`, the ``tokenizers.Tokenizer`` plus what the
directory adds around it and what changes the token ids a training run sees:
the chat template (``chat_template.jinja``, else ``chat_template`` in
``tokenizer_config.json``; with named templates in ``additional_chat_templates/``,
a dict of them, ``chat_template.jinja`` as ``"default"``, as transformers reads them) and the special
tokens named there or in
``special_tokens_map.json`` (``eos_token`` and the like; the additional ones under either name
transformers has written them, ``additional_special_tokens`` or ``extra_special_tokens``).

Only the fast ``tokenizer.json`` format is read: a directory with only
SentencePiece or vocab files raises TOKENIZER_INVALID saying so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ... import checks, errors
from ...errors import UmlosError
from ...files import reader

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
#: The largest tokenizer.json read (those of large vocabularies are tens of megabytes); the files
#: beside it are read up to files.reader.MAX_JSON_BYTES.
MAX_TOKENIZER_BYTES = 1 << 30
CHAT_TEMPLATE_FILE = "chat_template.jinja"
#: The folder of named templates beside it (``NAME.jinja``), as transformers' save_pretrained writes them.
CHAT_TEMPLATE_DIR = "additional_chat_templates"
#: The special-token roles of tokenizer_config.json read here.
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
                      "additional_special_tokens")
#: transformers 5's name for ``additional_special_tokens``: its save_pretrained writes the list under this key
#: (a dict under it names model-specific tokens, such as ``image_token``).
EXTRA_SPECIAL_TOKENS = "extra_special_tokens"


@dataclass(frozen=True)
class LoadedTokenizer:
    """A tokenizer and the files around it that change what a model sees."""

    tokenizer: Any  # tokenizers.Tokenizer
    chat_template: str | list | dict | None = None
    special_tokens: dict[str, Any] = field(default_factory=dict)
    path: str | None = None

    def eos_token_id(self, override: str | None = None) -> int:
        """The id of the end-of-sequence token: ``override`` (a token's text)
        or the directory's ``eos_token``. Raises TOKENIZER_INVALID when there
        is none or the vocabulary lacks it."""
        token = override if override is not None else self.special_tokens.get("eos_token")
        where = self.path or "this tokenizer"
        if token is None:
            raise _invalid(f"{where} names no eos_token (tokenizer_config.json or special_tokens_map.json); "
                           "pass the end-of-sequence token's text, e.g. --eos '</s>'")
        token_id = self.tokenizer.token_to_id(token)
        if token_id is None:
            raise _invalid(f"the end-of-sequence token {token!r} is not in the vocabulary of {where}")
        return token_id


def load_tokenizer(source: Any) -> LoadedTokenizer:
    """``source``: a path (file or directory), a ``tokenizers.Tokenizer`` or a
    :class:`LoadedTokenizer` (returned as is)."""
    if isinstance(source, LoadedTokenizer):
        return source
    from tokenizers import Tokenizer

    if isinstance(source, Tokenizer):
        return LoadedTokenizer(source)
    checks.instance(source, "tokenizer", (str, os.PathLike), fail=_invalid,
                    message="a tokenizer is a path, a tokenizers.Tokenizer or a LoadedTokenizer, got {type}")
    path = os.fspath(source)
    if os.path.isdir(path):
        file = os.path.join(path, TOKENIZER_FILE)
        if not os.path.lexists(file):
            raise _invalid(f"{path} has no {TOKENIZER_FILE}; only the fast tokenizer format of the tokenizers "
                           "library is read (convert the tokenizer with transformers' save_pretrained)")
        config = _read_json(os.path.join(path, CONFIG_FILE))
        special = _special_tokens(config, _read_json(os.path.join(path, SPECIAL_TOKENS_FILE)))
        text = _read_text(os.path.join(path, CHAT_TEMPLATE_FILE))
        named = _named_templates(os.path.join(path, CHAT_TEMPLATE_DIR))
        template: str | dict[str, str] | None = text
        if named:  # as transformers: the .jinja files replace the config's template, chat_template.jinja as "default"
            template = named if text is None else {"default": text, **named}
        elif template is None:
            template = config.get("chat_template")
        if template is not None:
            checks.instance(template, "chat_template", (str, list, dict), fail=_invalid,
                            message=checks.literal(os.path.join(path, CONFIG_FILE))
                            + ": {name} must be a string or a list, got {type}")
        return LoadedTokenizer(_tokenizer_from_file(Tokenizer, file), template, special, path)
    if not os.path.exists(path):
        raise _invalid(f"no tokenizer at {path}: give a tokenizer.json file or a directory holding one "
                       "(tokenizers are read from local files, never downloaded)")
    return LoadedTokenizer(_tokenizer_from_file(Tokenizer, path), path=path)


def _tokenizer_from_file(tokenizer_class, path: str):
    """The file's bytes are read here (a regular file of at most :data:`MAX_TOKENIZER_BYTES`,
    files/reader.py), not by the library, which would block on a FIFO and read any size."""
    try:
        text = reader.read_text(path, _invalid, max_bytes=MAX_TOKENIZER_BYTES, what="tokenizer.json")
    except FileNotFoundError:
        raise _invalid(f"no tokenizer at {path}: the file does not exist") from None
    try:
        return tokenizer_class.from_str(text)
    except Exception as exc:  # the library raises plain Exception for every parse error
        raise _invalid(f"the tokenizers library cannot load {path}: {exc}") from exc


def _special_tokens(config: dict, special_map: dict) -> dict[str, Any]:
    """The special-token roles, as token text (the files store either the text
    or an AddedToken object with a ``content`` field)."""
    found: dict[str, Any] = {}
    for key in SPECIAL_TOKEN_KEYS:
        value = config.get(key, special_map.get(key))
        if key == "additional_special_tokens":
            value = _additional(config, special_map, value, found)
        if value is None:
            continue
        if key == "additional_special_tokens":
            checks.instance(value, key, list, fail=_invalid, message="{name} must be a list, got {type}")
            found[key] = [_token_text(item, key) for item in value]
        else:
            found[key] = _token_text(value, key)
    return found


def _additional(config: dict, special_map: dict, value: Any, found: dict[str, Any]) -> Any:
    """The additional special tokens whichever transformers wrote them: a non-empty
    ``extra_special_tokens`` list wins over ``additional_special_tokens`` (as transformers 5 reads them,
    and its save_pretrained renames the one into the other, changing no id); a dict there (model-specific
    tokens by name) is kept in ``found`` under its own key."""
    extra = config.get(EXTRA_SPECIAL_TOKENS, special_map.get(EXTRA_SPECIAL_TOKENS))
    if isinstance(extra, dict):
        found[EXTRA_SPECIAL_TOKENS] = {name: _token_text(token, EXTRA_SPECIAL_TOKENS) for name, token in extra.items()}
        return value
    if extra:
        checks.instance(extra, EXTRA_SPECIAL_TOKENS, list, fail=_invalid,
                        message="{name} must be a list or an object, got {type}")
        return extra
    return value


def _token_text(value: Any, key: str) -> str:
    if isinstance(value, dict):
        value = value.get("content")
    return checks.text(value, key, fail=_invalid,
                       message="{name} must be a token's text or an object with 'content', got {value!r}")


def _read_json(path: str) -> dict:
    """An optional JSON file beside tokenizer.json ({} when absent), read by files/reader.py."""
    text = _read_text(path)
    if text is None:
        return {}
    data = reader.loads_json(text, _invalid, path, not_json="is not JSON")
    return checks.instance(data, path, dict, fail=_invalid, message="{name} must hold a JSON object, got {type}")


def _named_templates(folder: str) -> dict[str, str]:
    """The ``NAME.jinja`` templates of ``folder`` by name ({} when there is no such folder)."""
    if not os.path.isdir(folder):
        return {}
    found = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".jinja"):
            text = _read_text(os.path.join(folder, name))
            if text is not None:
                found[name[:-len(".jinja")]] = text
    return found


def _read_text(path: str) -> str | None:
    """An optional text file beside tokenizer.json (None when absent), read by files/reader.py."""
    try:
        return reader.read_text(path, _invalid, max_bytes=reader.MAX_JSON_BYTES, what="tokenizer file")
    except FileNotFoundError:
        return None


def _invalid(message: str) -> UmlosError:
    return UmlosError(errors.TOKENIZER_INVALID, message, operator=errors.BATCHING_OPERATOR)
