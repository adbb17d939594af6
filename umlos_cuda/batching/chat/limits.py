"""How much work one chat render may do, so that a hostile template cannot hang a command.

What goes in: a render in progress. What comes out: nothing, or
:class:`RenderLimitExceeded` once the render goes past a limit; and
:func:`render_budget`, the CPU, memory and wall-clock budget a render worker
gives each record (umlos_cuda/batching/lengths/budget.py).

Jinja's sandbox keeps a template away from Python's internals but not from
the CPU: ``range`` is capped at 100,000 items, yet two nested loops over it
run 10^10 times, and ``10 ** 10 ** 9`` is one expression that computes for
minutes. The limits here count work, the same on every machine:

* :data:`MAX_RENDER_STEPS` statements of template code executed per render
  (every loop iteration counts at least two; a ChatML template about 7 a
  message), counted by calls compiled into the template's code
  at the head of each loop and function body (umlos_cuda/batching/chat/steps.py);
* :data:`MAX_RENDERED_CHARS` characters of rendered text;
* a ``*`` or ``+`` whose result would be a string or sequence over
  :data:`MAX_RENDERED_CHARS` items, and a ``*`` or ``**`` of integers whose
  result would exceed :data:`MAX_POWER_BITS` bits, are refused before they are
  computed (an integer squared 40 times is 2^40 bits: hours of C);
* the numeric arguments of the filters and methods whose work or output
  they size (``slice``, ``batch``, ``wordwrap``, ``center``, ``indent``,
  ``tojson(indent=)``, ``round``, ``replace``, format widths and precisions),
  capped before the filter runs (umlos_cuda/batching/chat/guards.py).

Python's own recursion limit stops a macro that calls itself. A render that
goes past a limit fails its record with CHAT_RENDER_BUDGET_EXCEEDED. What
these counts cannot see is work done inside one C call (``==`` between two
shared lists doubled 40 times, ``tojson`` or ``pprint`` of a shared structure
of 2^40 leaves, a string doubled with ``~`` until it fills memory): for that,
``data tokenize`` and ``data lengths build`` render in worker processes
under :func:`render_budget` (CPU seconds and wall-clock seconds per record,
memory per worker), which the kernel enforces inside C code too.
"""

from __future__ import annotations

import re
from typing import Any

from ... import checks, errors
from ...epoch import limit_setting
from ..lengths.budget import Budget

#: Statements of template code one render may execute (counted by umlos_cuda/batching/chat/steps.py).
MAX_RENDER_STEPS = 5_000_000
#: Characters one render may write (a dataset line is at most 64 MiB; its text rendered once is less).
MAX_RENDERED_CHARS = 64 << 20
#: Bits of an integer ``a ** b`` or ``a * b`` may produce.
MAX_POWER_BITS = 1 << 16
#: Items a filter's count argument may ask for: ``slice``'s slices, ``batch``'s size, ``wordwrap``'s lines
#: (the cap Jinja's sandbox puts on ``range``).
MAX_ITEMS = 100_000
#: The largest format width or precision (``%10d``, ``{:>10}``, ``strftime``), and ``round``'s digits.
MAX_FORMAT_WIDTH = 4096
#: The largest ``tojson`` indent (a number of spaces, or a string's length).
MAX_JSON_INDENT = 32
#: The render budget's defaults: CPU seconds and wall-clock seconds one record's render may take in a
#: render worker, and the MiB a render worker may grow by; the environment variables that change them.
DEFAULT_CPU_S, DEFAULT_WALL_S, DEFAULT_MEMORY_MIB = 10, 60, 4096
CPU_SETTING, WALL_SETTING, MEMORY_SETTING = ("UMLOS_CHAT_RENDER_CPU_S", "UMLOS_CHAT_RENDER_WALL_S",
                                             "UMLOS_CHAT_RENDER_MEMORY_MIB")


class RenderLimitExceeded(Exception):
    """A render went past one of this module's limits."""


def render_budget() -> Budget:
    """The budget of a render worker: :data:`DEFAULT_CPU_S`, :data:`DEFAULT_WALL_S` and
    :data:`DEFAULT_MEMORY_MIB`, or the environment's settings (0: no limit); INVALID_ARGUMENT for a
    setting that is not a non-negative integer."""
    return Budget(limit_setting(CPU_SETTING, DEFAULT_CPU_S, operator=errors.BATCHING_OPERATOR),
                  limit_setting(MEMORY_SETTING, DEFAULT_MEMORY_MIB, operator=errors.BATCHING_OPERATOR),
                  limit_setting(WALL_SETTING, DEFAULT_WALL_S, operator=errors.BATCHING_OPERATOR),
                  CPU_SETTING, MEMORY_SETTING, WALL_SETTING)


def check_length(chars: int) -> None:
    """Refuse rendered text over :data:`MAX_RENDERED_CHARS`."""
    if chars > MAX_RENDERED_CHARS:
        raise RenderLimitExceeded(f"the chat template wrote more than {MAX_RENDERED_CHARS:,} characters")


def check_binop(operator: str, left: Any, right: Any) -> None:
    """Refuse a ``*``, ``+``, ``**`` or ``%`` whose result is over the limits, before it is computed."""
    if operator == "+":
        if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)) \
                and len(left) + len(right) > MAX_RENDERED_CHARS:
            raise RenderLimitExceeded(f"the chat template joins {len(left):,} and {len(right):,} items, over the "
                                      f"limit of {MAX_RENDERED_CHARS:,}")
    elif operator == "*":
        if _integer(left) and _integer(right) and left.bit_length() + right.bit_length() > MAX_POWER_BITS:
            raise RenderLimitExceeded(f"the chat template multiplies integers of {left.bit_length():,} and "
                                      f"{right.bit_length():,} bits, over {MAX_POWER_BITS:,} bits")
        for sequence, count in ((left, right), (right, left)):
            if isinstance(sequence, (str, bytes, list, tuple)) and isinstance(count, int) \
                    and len(sequence) * count > MAX_RENDERED_CHARS:
                raise RenderLimitExceeded(f"the chat template multiplies a sequence of {len(sequence):,} items "
                                          f"by {count:,}, over the limit of {MAX_RENDERED_CHARS:,}")
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0 \
            and abs(left) > 1 and abs(left).bit_length() * right > MAX_POWER_BITS:
        raise RenderLimitExceeded(f"the chat template computes {left} ** {right}, over {MAX_POWER_BITS:,} bits")
    elif operator == "%" and isinstance(left, str):
        check_printf(left)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: A printf-style (``%``) or ``strftime`` conversion: its flags, width and precision.
_PRINTF = re.compile(r"%(?:\([^)]*\))?[-#0 +_^]*(\*|\d+)?(?:\.(\*|\d+))?")


def check_printf(text: str) -> None:
    """Refuse a ``%`` format string with a width or precision over :data:`MAX_FORMAT_WIDTH`, or one taken from
    the arguments (``*``)."""
    if "%" not in text:
        return
    for match in _PRINTF.finditer(text):
        for number in match.groups():
            if number == "*" or (number is not None and over(number, MAX_FORMAT_WIDTH)):
                raise RenderLimitExceeded(f"the chat template formats with {match.group(0)!r}: a width or precision "
                                          f"over {MAX_FORMAT_WIDTH:,}, or one taken from the arguments")


def over(digits: str, cap: int) -> bool:
    """Whether the decimal ``digits`` say more than ``cap`` (read by the one parser of integers in text, which
    refuses more than 40 digits before reading them: a width of 10^5000 digits is over too)."""
    return checks.integer_or_none(digits, 0, cap) is None
