"""The step counter compiled into chat templates (umlos_cuda/batching/chat/steps.py).

Its counts must keep the scale of what a line tracer (the counter it replaced) sees a template execute, on
real templates and on every construct Jinja compiles to a loop or a function; every way a template can
repeat work must run into the limit; and the compiled code keeps the line numbers Jinja maps tracebacks with.
"""

from __future__ import annotations

import sys
import traceback

import pytest

from test_batching_chat import CHATML, CONVERSATIONS, GENERATION, LLAMA3
from umlos_cuda.batching.chat.environment import compile_template
from umlos_cuda.batching.chat.limits import RenderLimitExceeded
from umlos_cuda.batching.chat.steps import Steps, UncountedCode, counted_code

#: Templates that use each construct Jinja compiles to a loop or a function of its own.
CONSTRUCTS = {
    "macro": "{% macro turn(m) %}[{{ m['role'] }}] {{ m['content'] }}{% endmacro %}"
             "{% for m in messages %}{{ turn(m) }}{% endfor %}",
    "call block": "{% macro each(items) %}{% for m in items %}{{ caller(m) }}{% endfor %}{% endmacro %}"
                  "{% call(m) each(messages) %}{{ m['content'] }}|{% endcall %}",
    "filtered loop": "{% for m in messages if m['role'] == 'assistant' %}{{ m['content'] }}{% else %}none"
                     "{% endfor %}",
    "recursive loop": "{% for m in [messages, messages] recursive %}{% if m is mapping %}{{ m['content'] }}"
                      "{% else %}{{ loop(m) }}{% endif %}{% endfor %}",
    "loop controls": "{% for m in messages %}{% if loop.index is even %}{% continue %}{% endif %}"
                     "{% if loop.index > 3 %}{% break %}{% endif %}{{ m['role'] }}{% endfor %}",
    "blocks": "{% block head %}{% for m in messages %}{{ self.turn() }}{% endfor %}{% endblock %}"
              "{% block turn %}t{% endblock %}",
    "namespace": "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m['content']|length %}"
                 "{% endfor %}{{ ns.n }}",
    "chatml": CHATML, "llama3": LLAMA3, "generation": GENERATION,
}
VARIABLES = {"bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": True}
#: One long conversation besides the test's own: loops that run more than a few times.
LONG = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(40)]


def traced_lines(template, messages) -> int:
    """The lines of template code a render executes, as the counter this one replaced counted them."""
    lines = 0

    def line(frame, event, arg):
        nonlocal lines
        lines += event == "line"
        return line

    previous = sys.gettrace()
    sys.settrace(lambda frame, event, arg: line if frame.f_code.co_filename == "<template>" else None)
    try:
        template.render(messages=messages, **VARIABLES)
    finally:
        sys.settrace(previous)
    return lines


@pytest.mark.parametrize("name", list(CONSTRUCTS))
def test_the_counts_keep_the_scale_of_the_lines_a_template_executes(name):
    """The limit keeps its meaning: what a render counts is within a factor of two, either way, of the line
    events the trace function it replaced saw (those count a generator's every resumption and some jumps as
    lines too; these count every statement of a body, taken or not)."""
    template = compile_template(CONSTRUCTS[name])
    for messages in [*CONVERSATIONS, LONG]:
        with Steps() as steps:
            text = template.render(messages=messages, **VARIABLES)
        lines = traced_lines(template, messages)
        assert lines / 2 <= steps.used <= 2 * lines and lines > 0, (name, messages)
        assert template.render(messages=messages, **VARIABLES) == text  # counted or not, the same text


#: Each way a template repeats work, about a million times: far past a limit of 10,000 steps, yet over in a
#: second if nothing counted it (a test that fails rather than hangs).
RUNAWAY = {
    "nested loops": "{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}",
    "a filter that never lets the body run": "{% for i in range(1000) %}{% for j in range(1000) if false %}"
                                             "{% endfor %}{% endfor %}",
    "continue": "{% for i in range(1000) %}{% for j in range(1000) %}{% continue %}{% endfor %}{% endfor %}",
    "a macro calling itself twice, no loop": "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}"
                                             "{% endmacro %}{{ f(18) }}",
    "a recursive loop": "{% for i in range(1000) recursive %}{% if loop.depth < 2 %}{{ loop(range(1000)) }}"
                        "{% endif %}{% endfor %}",
    "a caller in a loop": "{% macro m() %}{% for i in range(1000) %}{{ caller() }}{% endfor %}{% endmacro %}"
                          "{% call m() %}{% call m() %}x{% endcall %}{% endcall %}",
    "a block called in a loop": "{% block a %}{% for i in range(1000) %}{{ self.b() }}{% endfor %}{% endblock %}"
                                "{% block b %}{% for i in range(1000) %}{% endfor %}{% endblock %}",
}


@pytest.mark.parametrize("name", list(RUNAWAY))
def test_every_way_to_repeat_runs_into_the_limit(name):
    template = compile_template(RUNAWAY[name])
    with pytest.raises(RenderLimitExceeded, match="ran more than 10,000 steps"), Steps(10_000) as steps:
        template.render(messages=[])
    assert steps.left < 0


def test_nothing_counts_outside_a_counted_render():
    """Outside :class:`Steps` the compiled counts count nothing; inside, the limit holds."""
    template = compile_template("{% for i in range(3000) %}{% endfor %}done")
    assert template.render() == "done"
    with Steps(10_000) as steps:
        assert template.render() == "done"
    assert 6000 <= steps.used <= 10_000
    with pytest.raises(RenderLimitExceeded), Steps(3000):
        template.render()


def test_tracebacks_keep_the_template_line():
    """The counts take the line numbers of the statements they precede: Jinja still maps an error to the
    template line that raised it."""
    template = compile_template("{% for m in messages %}\n{{ m }}\n{{ raise_exception('stop here') }}\n{% endfor %}")
    with pytest.raises(Exception, match="stop here") as raised:
        template.render(messages=[1])
    frames = [frame for frame in traceback.extract_tb(raised.value.__traceback__) if frame.filename == "<template>"]
    assert frames and frames[-1].lineno == 3


@pytest.mark.parametrize("source", ["f = lambda: 1", "x = [i for i in range(3)]", "x = (i for i in range(3))",
                                    "x = {i: i for i in range(3)}"])
def test_code_that_repeats_without_a_statement_is_refused(source):
    """Jinja 3.1 writes no comprehension nor lambda; one that a later Jinja wrote would go uncounted."""
    with pytest.raises(UncountedCode, match="cannot count"):
        counted_code(source, "<template>")
