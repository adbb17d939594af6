"""The step counter of a chat template, compiled into the template's own code.

What goes in: the Python source Jinja generates for a template (through
``Environment._compile``, the hook Jinja keeps for this:
umlos_cuda/batching/chat/environment.py). What comes out: its code object,
with a count at the head of every loop body and every function body (the
template's ``root``, its blocks, macros and ``caller`` bodies, the loop
function of a ``recursive`` for, the filter of ``{% for ... if ... %}``);
and :class:`Steps`, inside which those counts add up in this context
against :data:`~.limits.MAX_RENDER_STEPS` (:class:`~.limits.RenderLimitExceeded`
past it). Outside it the counts cost a call and count nothing.

Each count is that body's statements, its loop header included, less those
of the loops and functions nested in it, which count themselves: the most
that one pass through the body can execute, whatever branch it takes. Code
runs more than once only in a loop or a call, so the counts add up to at
least the statements a render executes; a template gets at most
:data:`~.limits.MAX_RENDER_STEPS` of them. The ChatML and Llama-3 templates
of the tests count about 7 a message, one with ``{% generation %}`` about
20; a loop that spins counts at least two an iteration.
Work done inside one call into C or into library code (a filter, ``==``
between lists) is not template code and is counted by neither this nor
anything else that counts: the guards of umlos_cuda/batching/chat/guards.py
and the render workers' budget bound it.

Why count at all, now that ``data tokenize`` renders in workers whose CPU
seconds the kernel limits: ``encode_chat`` renders in its caller's process,
where no budget runs; a count is the same on every machine, so a record a
loop makes too heavy is refused on a fast machine and a slow one alike (the
store does not depend on the machine), where CPU seconds are a fallback for
what no count sees; and a budget of 0 turns the CPU limit off.

Why compiled in: the counter was a trace function (``sys.settrace``) that
Python called on every line the template executed: 0.45 ms of the 0.68 ms a
ChatML record of bench/bench_chat_tokenize.py took to render. Compiled in,
it is one call a loop iteration, and the render costs what it costs
untraced (docs/performance.md). A construct that could repeat without a
loop or a call of its own (a comprehension, a ``lambda``), which Jinja
3.1's code generator never writes, is refused rather than left uncounted.
"""

from __future__ import annotations

import ast
from contextvars import ContextVar
from types import CodeType

from .limits import MAX_RENDER_STEPS, RenderLimitExceeded

#: The call each count is: Jinja's generated code reaches the environment by this name everywhere (a parameter
#: of its functions, a global of its module), and the environment's :meth:`count_steps` is :func:`count_steps`.
COUNT_CALL = "environment.count_steps"


class Steps:
    """The steps of a render: ``limit``, and ``left`` of it; counted while entered (``with Steps() as steps:``), in
    this context. A class, not a generator's context manager: it is entered at every render, and costs a
    quarter of one to enter."""

    __slots__ = ("_token", "left", "limit")

    def __init__(self, limit: int = MAX_RENDER_STEPS) -> None:
        self.left = self.limit = limit

    @property
    def used(self) -> int:
        return self.limit - self.left

    def __enter__(self) -> Steps:
        self._token = _STEPS.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _STEPS.reset(self._token)


#: The steps of the render in progress in this context; None: nothing counts.
_STEPS: ContextVar[Steps | None] = ContextVar("umlos_render_steps", default=None)

#: What repeats: a loop's body, and a function's, once a call.
_REPEATED = (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef)
#: What would repeat without a statement to count in (Jinja 3.1 writes none of them).
_UNCOUNTED = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


class UncountedCode(ValueError):
    """The generated code has a construct the counter cannot count in."""


def count_steps(count: int) -> None:
    """Count ``count`` statements against the render in progress (:class:`Steps`)."""
    steps = _STEPS.get()
    if steps is not None:
        steps.left -= count
        if steps.left < 0:
            raise RenderLimitExceeded(f"the chat template ran more than {steps.limit:,} steps "
                                      "(umlos_cuda/batching/chat/limits.py)")


def counted_code(source: str, filename: str) -> CodeType:
    """``source`` (Jinja's generated module) compiled with a count at the head of every repeated body; the line
    numbers stay those of ``source``, which Jinja maps to the template's lines in tracebacks."""
    tree = ast.parse(source, filename)
    heads = []
    for node in ast.walk(tree):
        if isinstance(node, _UNCOUNTED):
            raise UncountedCode(f"the template compiles to a {type(node).__name__} at line {node.lineno}, which the "
                                "step counter cannot count (umlos_cuda/batching/chat/steps.py)")
        if isinstance(node, _REPEATED):
            loop = not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            heads.append((node.body, statements(node.body) + loop))
    for body, weight in heads:  # weighed first, then counted: a count is not a statement of the template's
        count = ast.parse(f"{COUNT_CALL}({weight})").body[0]
        for part in ast.walk(count):
            ast.copy_location(part, body[0])
        body.insert(0, count)
    return compile(tree, filename, "exec")


def statements(body: list[ast.stmt]) -> int:
    """The statements one pass through ``body`` may execute: every one, in every branch, and the header of each
    loop and function nested in it (their bodies count themselves), a loop's ``else`` included."""
    total = 0
    for statement in body:
        total += 1
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            if field == "body" and isinstance(statement, _REPEATED):
                continue
            for child in getattr(statement, field, ()):
                total += statements(child.body) if isinstance(child, (ast.ExceptHandler, ast.match_case)) \
                    else statements([child])
    return total
