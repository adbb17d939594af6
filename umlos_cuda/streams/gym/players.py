"""The shipped players: ``hint`` follows the server's hints, ``random`` guesses.

``HintPlayer`` asks for the server's hint at every step and turns its text
into the game's command with :data:`HINT_COMMANDS` (``Try placing 4 at row
7, column 6`` becomes ``place 7 6 4``); a hint it cannot read, or no hint,
ends the episode (given up). ``RandomPlayer`` places a random value in a
random empty cell of the observation's grid (values 1 to the grid's larger
side), drawing from the episode's Philox stream; it gives up on a game
without a grid of integers. Either is stopped by the episode's step limit.
Neither needs anything the server does not send.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial

from ... import checks, errors
from ..failures import failure
from ..protocols import Player, PlayerContext
from .telnet_client import PuzzleObservation

#: Hint texts of the server's games and the command each one names.
HINT_COMMANDS: tuple[tuple[re.Pattern, str], ...] = tuple((re.compile(pattern), command) for pattern, command in (
    (r"Try placing (?P<v>\d+) at row (?P<r>\d+), column (?P<c>\d+)", "place {r} {c} {v}"),
    (r"Try pressing the light at row (?P<r>\d+), column (?P<c>\d+)", "press {r} {c}"),
    (r"Try shading cell at row (?P<r>\d+), column (?P<c>\d+)", "shade {r} {c}"),
    (r"Try revealing cell \((?P<r>\d+),(?P<c>\d+)\)", "reveal {r} {c}"),
    (r"Try selecting item (?P<i>\d+)", "select {i}"),
    (r"Try deselecting item (?P<i>\d+)", "deselect {i}"),
))


def hint_command(hint: str) -> str | None:
    """The command a hint names, or None for a hint of another form."""
    for pattern, command in HINT_COMMANDS:
        match = pattern.search(hint)
        if match:
            return command.format(**match.groupdict())
    return None


class HintPlayer:
    """Play the server's hint at each step."""

    name = "hint"

    def __call__(self, observation: PuzzleObservation, context: PlayerContext) -> str | None:
        hint = context.hint()
        return None if hint is None else hint_command(hint)


class RandomPlayer:
    """Place a random value in a random empty cell (0 marks an empty cell)."""

    name = "random"

    def __call__(self, observation: PuzzleObservation, context: PlayerContext) -> str | None:
        grid = observation.grid
        if not (isinstance(grid, list) and grid and all(isinstance(row, list) and row for row in grid)
                and all(checks.is_integer(v, strict=True) for row in grid for v in row)):
            return None
        empty = [(r, c) for r, row in enumerate(grid) for c, v in enumerate(row) if v == 0]
        if not empty:
            return None
        cell_draw, value_draw = (int(x) for x in context.draws(2))
        r, c = empty[cell_draw % len(empty)]
        top = max(len(grid), max(len(row) for row in grid))
        return f"place {r + 1} {c + 1} {value_draw % top + 1}"


#: The players ``gym run --policy`` names (the flag keeps its name).
PLAYERS: dict[str, Callable[[], Player]] = {"hint": HintPlayer, "random": RandomPlayer}


def make_player(player) -> Player:
    """A player from its name or a callable (returned as is)."""
    if isinstance(player, str):
        checks.choice(player, "player", PLAYERS, fail=partial(failure, errors.GYM_CONFIG_INVALID),
                      message="{name} {value!r} is not one of {choices} (or pass a callable)")
        return PLAYERS[player]()
    if not callable(player):
        raise failure(errors.GYM_CONFIG_INVALID, f"a player is a name ({', '.join(PLAYERS)}) or a callable, "
                                                 f"got {type(player).__name__}")
    return player
