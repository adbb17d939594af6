"""``--config FILE``: the flags of a long invocation kept in a file, with the flags' own names as keys.

    # plan.yaml
    source: corpus
    window: 65536
    bucket-edges: 512,1024,2048     # bucket_edges works too
    mix: [web:0.7, code:0.3]
    pack: true

``umlos-cuda plan build --config plan.yaml --output out`` is ``umlos-cuda plan build --source corpus --window
65536 --bucket-edges 512,1024,2048 --mix web:0.7 code:0.3 --pack --output out``: the keys become their flags
where ``--config`` stands, so a flag given after it on the command line wins and one before it is overridden.
``true`` is the flag alone, ``false`` and ``null`` leave it out, a list gives its values in order; the
command's own parser then checks every flag as if it had been typed (an unknown key is its usage error).

The file is read bounded (a regular file of at most 64 KiB, YAML or JSON, at most 4096 nodes nested 32 deep):
anything but a mapping of flag names to scalars or lists of scalars is INVALID_ARGUMENT naming the file and
the key.
"""

from __future__ import annotations

from typing import Any

from .. import checks, errors
from ..errors import UmlosError

#: What a configuration file may weigh and hold.
MAX_BYTES = 64 << 10
MAX_NODES = 4096
MAX_DEPTH = 32


def expand_config(argv: list[str]) -> list[str]:
    """``argv`` with each ``--config FILE`` (or ``--config=FILE``) replaced by the flags its file holds."""
    out: list[str] = []
    items = iter(argv)
    for item in items:
        if item == "--config" or item.startswith("--config="):
            path = item.partition("=")[2] if "=" in item else next(items, None)
            if not path:
                raise _invalid("--config needs a file")
            out += flags_of(path)
        else:
            out.append(item)
    return out


def flags_of(path: str) -> list[str]:
    """The flags the configuration file ``path`` holds (module docstring)."""
    import yaml

    from ..files import reader
    from ..manifest import yaml_safe

    text = reader.read_text(path, lambda message: _invalid(f"--config {message}"), max_bytes=MAX_BYTES,
                            what="configuration file")
    try:
        values = yaml_safe.load(text, max_nodes=MAX_NODES, max_bytes=MAX_BYTES, max_depth=MAX_DEPTH)
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        raise _invalid(f"--config {path} is not YAML or JSON: {exc}") from None
    if not isinstance(values, dict):
        raise _invalid(f"--config {path} must hold a mapping of flag names to values, got {type(values).__name__}")
    flags: list[str] = []
    for key, value in values.items():
        if not isinstance(key, str) or not key or key.startswith("-") or key == "config":
            raise _invalid(f"--config {path}: {key!r} is not a flag name (write bucket-edges, not --bucket-edges)")
        flags += _flag(key.replace("_", "-"), value, f"{path}: {key}")
    return flags


def _flag(name: str, value: Any, where: str) -> list[str]:
    if value is None or value is False:
        return []
    if value is True:
        return [_argument(f"--{name}", where)]
    if isinstance(value, list):
        if not all(_scalar(item) for item in value):
            raise _invalid(f"--config {where}: a list holds numbers and strings only")
        return [_argument(f"--{name}", where), *(_argument(_text(item), where) for item in value)] if value else []
    if not _scalar(value):
        raise _invalid(f"--config {where}: a value is a number, a string, true, false, null or a list of them")
    return [_argument(f"--{name}", where), _argument(_text(value), where)]


def _argument(text: str, where: str) -> str:
    """``text`` if a command line could hold it: no NUL byte, no lone surrogate (YAML's ``"\\ud800"``), which
    no operating system passes in argv; INVALID_ARGUMENT naming the key otherwise."""
    if "\x00" in text or checks.utf8_length(text) is None:
        raise _invalid(f"--config {where!a}: a flag or value holds a NUL byte or a lone surrogate, which no "
                       "command line can")
    return text


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else repr(value) if isinstance(value, float) else str(value)


def _invalid(message: str) -> UmlosError:
    return UmlosError(errors.INVALID_ARGUMENT, message, operator=errors.CLI_OPERATOR)
