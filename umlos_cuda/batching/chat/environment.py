"""The Jinja environment a chat template renders in, built as Hugging Face ``transformers`` builds it.

What goes in: a template's source. What comes out: a compiled
:class:`jinja2.Template` whose environment is the one
``transformers.utils.chat_template_utils._cached_compile_jinja_template``
makes (transformers 5.x), so a template renders to the same text here and
there:

* an ``ImmutableSandboxedEnvironment`` (a template cannot reach Python
  internals nor change the values it is given) with ``trim_blocks`` and
  ``lstrip_blocks``, and the ``loopcontrols`` extension (``break``, ``continue``);
* the ``{% generation %}...{% endgeneration %}`` block, which renders its body
  unchanged and records where that output starts and ends in the rendered
  text (:class:`GenerationSpans`): the assistant spans of
  ``return_assistant_tokens_mask``. The start is the length of what the
  template has yielded so far, as transformers counts it;
* the globals ``raise_exception(message)`` (raises, which fails the record),
  ``strftime_now(format)``, ``dict`` (a constructor without attribute access)
  and ``namespace`` (refusing underscore-prefixed names), and the ``tojson``
  filter as transformers defines it (``json.dumps`` with ``ensure_ascii=False``
  and no HTML escaping, with ``indent``, ``separators`` and ``sort_keys``).

What differs is what a template may spend, never what it renders: ``*``,
``**``, ``+`` and ``%`` go through :meth:`ChatEnvironment.call_binop`, which
refuses a result over the render limits before computing it
(umlos_cuda/batching/chat/limits.py); the filters and ``str`` methods whose
arguments size their work are checked first (umlos_cuda/batching/chat/guards.py:
``slice``, ``batch``, ``wordwrap``, ``center``, ``indent``, ``format``,
``round``, ``replace``, ``tojson``'s indent, ``str.format`` widths,
``strftime_now``'s); the global ``lipsum`` is gone (one call writes what it
is asked for: a million paragraphs); the code a template compiles to counts
its steps (umlos_cuda/batching/chat/steps.py); and templates compiled here
are cached per source (at most 16).

Three shortcuts change how long a render takes and nothing else (a ChatML
render of bench/bench_chat_tokenize.py went from 0.033 to 0.018 ms): two
strings joined with ``+`` below the limit skip the check's function calls;
the counters of ``loop`` (``loop.first``, ``loop.index``...) skip the
sandbox's attribute checks, which pass them unchanged (numbers and booleans
of Jinja's own object); and a template's globals are one dict, not Jinja's
``ChainMap`` over the environment's, which every render copies key by key.
"""

from __future__ import annotations

import json
import re
from contextvars import ContextVar
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.exceptions
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .guards import check_call, check_format, check_json_indent, guarded_filters
from .limits import MAX_RENDERED_CHARS, check_binop, check_printf
from .steps import count_steps, counted_code

#: How transformers tells a template with generation markers (``render_jinja_template``).
GENERATION_TAG = re.compile(r"\{\%-?\s*generation\s*-?\%\}")

#: The counters of Jinja's own ``loop`` object: numbers and booleans, which the sandbox hands on unchanged
#: (nothing to check: not a method, nor a mutable known to it, nor a name with an underscore).
LOOP_COUNTERS = frozenset(("first", "last", "index", "index0", "revindex", "revindex0", "length", "depth", "depth0"))

_TRACKING: ContextVar[list | None] = ContextVar("umlos_generation_tracking", default=None)


class GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}``: the body's output, and where it lies in the rendered text."""

    tags = {"generation"}  # noqa: RUF012 -- jinja2.ext.Extension declares ``tags`` a set per class

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_generation", []), [], [], body).set_lineno(lineno)

    def _generation(self, caller) -> str:
        output = caller()
        tracking = _TRACKING.get()
        if tracking is not None:  # [characters yielded so far, spans]
            start = tracking[0]
            tracking[1].append((start, start + len(output)))
        return output


class ChatEnvironment(ImmutableSandboxedEnvironment):
    """transformers' sandbox, whose ``*``, ``**``, ``+`` and ``%``, and calls of ``str`` methods that size
    their result, are checked against the render limits first, and whose templates count their steps."""

    intercepted_binops = frozenset(("*", "**", "+", "%"))
    count_steps = staticmethod(count_steps)  # what the counts compiled into a template call (steps.py)

    def _compile(self, source: str, filename: str):  # Jinja's hook for compiling its generated code
        return counted_code(source, filename)

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        if operator == "+" and type(left) is str and type(right) is str \
                and len(left) + len(right) <= MAX_RENDERED_CHARS:  # text joined, most binops of a chat template
            return left + right
        check_binop(operator, left, right)
        return super().call_binop(context, operator, left, right)

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is LoopContext and attribute in LOOP_COUNTERS:  # ``loop.first`` in most templates' loops
            return getattr(obj, attribute)
        return super().getattr(obj, attribute)

    def make_globals(self, d):  # one plain dict a template: Jinja's ChainMap is read key by key every render
        return {**self.globals, **(d or {})}

    def call(__self, __context, __obj, *args, **kwargs):  # Jinja's parameter names: no keyword collides
        check_call(__obj, args, kwargs)
        return super().call(__context, __obj, *args, **kwargs)

    def wrap_str_format(self, value: Any):  # Jinja >= 3.1.5 sandboxes str.format where it is looked up
        if isinstance(getattr(value, "__self__", None), str) and getattr(value, "__name__", "") in ("format",
                                                                                                  "format_map"):
            check_format(value.__self__)
        return super().wrap_str_format(value)


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    check_json_indent(indent)
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):
    check_printf(str(format))
    return datetime.now().strftime(format)


class _TemplateDict:
    """``dict(...)`` and ``dict.fromkeys(...)`` without the type's attributes."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """``namespace(...)`` refusing underscore-prefixed attribute names."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
                "Please rename the attribute.")


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """The template compiled in its own environment (raises Jinja's errors as they are)."""
    environment = ChatEnvironment(trim_blocks=True, lstrip_blocks=True,
                                  extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    environment.filters.update(guarded_filters(environment.filters))
    environment.filters["tojson"] = _tojson
    del environment.globals["lipsum"]
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    environment.globals["dict"] = _TemplateDict()
    environment.globals["namespace"] = _TemplateNamespace
    return environment.from_string(source)


class GenerationSpans:
    """While entered, ``{% generation %}`` blocks append ``(start, end)`` to ``state[1]`` of the ``state`` it
    gives; the renderer keeps ``state[0]``, the characters yielded so far. A class: it is entered at every
    render (:class:`~.steps.Steps` says why)."""

    __slots__ = ("_token", "state")

    def __enter__(self) -> list:
        self.state: list = [0, []]
        self._token = _TRACKING.set(self.state)
        return self.state

    def __exit__(self, *exc: object) -> None:
        _TRACKING.reset(self._token)
