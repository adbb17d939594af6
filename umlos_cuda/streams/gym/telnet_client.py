"""The puzzle arcade's telnet protocol, as calls: games, difficulties, moves.

What goes in: the address of a ``chuk-puzzles-server`` and commands. What
comes out: :class:`GameInfo` for the menu, :class:`PuzzleObservation` for
the state of a game, :class:`StepResult` for a move.

The protocol as the server implements it (chuk-puzzles-gym 0.10):

- The menu lists games as ``  N) Name - description``; a game starts with
  ``<name or N> <difficulty> <seed>`` (the seed makes the puzzle
  reproducible). An unknown difficulty is not refused: the server says
  ``Invalid difficulty. Choose from: ...`` and starts an easy game, so the
  client checks the difficulty against that list first (and learns the list
  by asking for a difficulty that does not exist).
- In a game, ``mode json`` makes observations and results one JSON object
  per line: ``{"type": "observation", ...}`` (``grid``, ``grid_display``,
  ``is_complete``, ``moves``, ``hints_remaining`` ...), ``{"type":
  "result", "success": ..., "code": ..., "message": ...}`` after a move,
  and ``{"type": "complete", ...}`` when the puzzle is solved. ``show``
  prints the observation, ``hint`` a line ``Hint: <text>`` (or a result
  with code ``HINT_DENIED`` when the budget is spent), ``menu`` goes back.
- Some games end unsolved (a mine, the last guess): the server prints a
  ``GAME OVER!`` banner.

Every other line is kept as text (:attr:`StepResult.lines`); a JSON line
that does not decode, or an observation without its fields, raises
``GYM_PROTOCOL_ERROR``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ... import checks, errors
from ...errors import UINT32_MAX
from ...files.reader import loads_json
from ..failures import failure
from .telnet_wire import TelnetLines

_MENU_LINE = re.compile(r"^\s*(\d+)\)\s+(.+?)\s+-\s+(.*)$")
_DIFFICULTIES = re.compile(r"Invalid difficulty\. Choose from: (.+)$")
#: The fields an observation must carry.
OBSERVATION_FIELDS = ("game", "difficulty", "seed", "moves", "is_complete", "grid_display")
#: The JSON type of each observation field read here ("count": an integer >= 0, never a bool; None: may be null).
OBSERVATION_TYPES = {"game": str, "difficulty": str, "seed": "count", "moves": "count", "is_complete": bool,
                     "grid_display": str, "hints_remaining": ("count", None)}
#: The same for a result's fields (each may be absent).
RESULT_TYPES = {"success": bool, "message": (str, None), "state": (dict, None)}
#: The longest timeout of one command: a finite number the socket layer takes (inf or 1e300 would
#: raise OverflowError there), and longer than any server needs.
MAX_TIMEOUT_S = 86_400
#: The largest puzzle seed (the server's seeds are non-negative integers; 2^31 - 1 keeps every game's generator happy).
MAX_PUZZLE_SEED = (1 << 31) - 1


@dataclass(frozen=True)
class TelnetClientConfig:
    """Where the server is and how long to wait for it.

    Args:
        host, port: the server's address.
        timeout: seconds one command may take before ``GYM_TIMEOUT``.
    """

    host: str = "127.0.0.1"
    port: int = 8023
    timeout: float = 10.0

    def __post_init__(self) -> None:
        fail = partial(failure, errors.GYM_CONFIG_INVALID)
        checks.text(self.host, "host", empty=False, fail=fail,
                    message="{name} must be a non-empty string, got {value!r}")
        checks.integer(self.port, "port", 1, 65535, fail=fail, strict=True,
                       message="{name} must be an integer in [{low}, {high}], got {value!r}")
        checks.number(self.timeout, "timeout", above=0, fail=fail,
                      message="{name} must be a positive number of seconds, got {value!r}")
        if self.timeout > MAX_TIMEOUT_S:
            raise fail(f"timeout must be at most {MAX_TIMEOUT_S} seconds (one day), got {self.timeout!r}")


@dataclass(frozen=True)
class GameInfo:
    """One menu entry: its number, display name and description."""

    number: int
    name: str
    description: str


@dataclass(frozen=True)
class PuzzleObservation:
    """The state of a game, as the server's JSON observation gives it."""

    game: str
    difficulty: str
    seed: int
    moves: int
    is_complete: bool
    grid_display: str
    grid: Any = None
    hints_remaining: int | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict) -> PuzzleObservation:
        """The observation, each field of its JSON type: ``"is_complete": "false"`` is refused, never
        read as true (an unsolved episode would be rewarded)."""
        missing = [name for name in OBSERVATION_FIELDS if name not in data]
        if missing:
            raise failure(errors.GYM_PROTOCOL_ERROR, f"an observation lacks {', '.join(missing)}: {str(data)[:200]}")
        for name, kind in OBSERVATION_TYPES.items():
            if name in data and not _is(data[name], kind):
                raise _wrong_type("an observation", name, data[name], kind)
        return cls(data["game"], data["difficulty"], data["seed"], data["moves"], data["is_complete"],
                   data["grid_display"], data.get("grid"), data.get("hints_remaining"), data)


@dataclass(frozen=True)
class StepResult:
    """What the server answered to one command in a game."""

    lines: tuple[str, ...]
    accepted: bool | None = None  # the result's success; None when the answer held no result
    message: str | None = None
    observation: PuzzleObservation | None = None
    solved: bool = False  # a ``complete`` message, or an observation with is_complete
    game_over: bool = False  # the GAME OVER banner: the game ended unsolved

    @property
    def ended(self) -> bool:
        return self.solved or self.game_over


class TelnetGymClient:
    """One connection to the puzzle server.

    ``games()`` and ``difficulties()`` read the menu; :meth:`start` begins a
    game in JSON mode and returns its first observation; :meth:`step` sends
    a move; :meth:`hint` asks for the server's hint; :meth:`menu` leaves the
    game. Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, config: TelnetClientConfig | None = None, **kwargs) -> None:
        self.config = config or TelnetClientConfig(**kwargs)
        self._lines = TelnetLines(self.config.host, self.config.port, self.config.timeout)
        try:
            self.menu_lines = self._lines.exchange(None)
            self._games = parse_menu(self.menu_lines)
        except BaseException:
            self.close()
            raise
        self._difficulties: tuple[str, ...] | None = None
        self.in_game = False
        self.rules = ""

    # -- the menu ------------------------------------------------------------------------
    def games(self) -> tuple[GameInfo, ...]:
        return self._games

    def difficulties(self) -> tuple[str, ...]:
        """The server's difficulty names (it lists them when given one it does not know)."""
        if self._difficulties is None:
            self.menu()
            lines = self._lines.exchange(f"{self._games[0].number} ?")
            self.in_game = True
            found = [m.group(1) for line in lines if (m := _DIFFICULTIES.search(line))]
            self.menu()
            if not found:
                raise failure(errors.GYM_PROTOCOL_ERROR,
                              "the server did not list its difficulties after an unknown one: "
                                                         f"{lines[:3]}")
            self._difficulties = tuple(name.strip() for name in found[0].split(","))
        return self._difficulties

    def resolve_game(self, game: str) -> str:
        """The word that starts ``game``: its menu number for a display name or
        number, else ``game`` itself (the server's short names, e.g. ``sudoku``)."""
        wanted = str(game).strip().lower()
        for info in self._games:
            if wanted in (str(info.number), info.name.lower()):
                return str(info.number)
        if not re.fullmatch(r"[a-z_]+", wanted):
            raise self._unknown_game(game)
        return wanted

    def _unknown_game(self, game: str):
        names = ", ".join(info.name for info in self._games)
        return failure(errors.GYM_CONFIG_INVALID, f"the puzzle server has no game {game!r}; its games: {names} "
                                                  "(by menu name, number or short name such as sudoku)")

    # -- a game --------------------------------------------------------------------------
    def start(self, game: str, difficulty: str, seed: int) -> PuzzleObservation:
        """Start ``game`` at ``difficulty`` with puzzle ``seed``; the first observation."""
        if difficulty not in self.difficulties():
            raise failure(errors.GYM_CONFIG_INVALID, f"difficulty {difficulty!r} is not one of the server's: "
                                                     f"{', '.join(self.difficulties())}")
        checks.integer(seed, "seed", 0, MAX_PUZZLE_SEED, fail=partial(failure, errors.GYM_CONFIG_INVALID), strict=True,
                       message="a puzzle seed is an integer in [0, 2^31 - 1], got {value!r}")
        self.menu()
        lines = self._lines.exchange(f"{self.resolve_game(game)} {difficulty} {seed}")
        if not any(line.startswith("Seed:") for line in lines):
            raise self._unknown_game(game)
        self.in_game = True
        self.rules = rules_text(lines)
        self._lines.exchange("mode json")
        observation = self.step("show").observation
        if observation is None:
            raise failure(errors.GYM_PROTOCOL_ERROR, "'show' in JSON mode gave no observation")
        return observation

    def step(self, command: str) -> StepResult:
        """Send one command of the game and parse the answer."""
        if not self.in_game:
            raise failure(errors.GYM_CONFIG_INVALID, "no game is running: call start() first")
        return parse_answer(self._lines.exchange(command))

    def hint(self) -> str | None:
        """The server's hint text, or None when it gives none (budget spent, puzzle complete)."""
        for line in self.step("hint").lines:
            if line.startswith("Hint: "):
                return line[len("Hint: "):]
        return None

    def menu(self) -> None:
        """Leave the current game, if any."""
        if self.in_game:
            self._lines.exchange("menu")
            self.in_game = False

    def close(self) -> None:
        lines = getattr(self, "_lines", None)
        if lines is not None:
            lines.close()

    def __enter__(self) -> TelnetGymClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def parse_menu(lines: list[str]) -> tuple[GameInfo, ...]:
    games = []
    for line in lines:
        match = _MENU_LINE.match(line)
        if match:
            number = checks.integer_text(match.group(1), "a menu number", 0, UINT32_MAX,
                                         fail=partial(failure, errors.GYM_PROTOCOL_ERROR),
                                         message="the server's menu lists a game numbered {value!r}, not an "
                                         "integer in [{low}, {high}] in ASCII digits")
            games.append(GameInfo(number, match.group(2).strip(), match.group(3).strip()))
    if not games:
        raise failure(errors.GYM_PROTOCOL_ERROR, f"the server's greeting lists no game: {lines[:5]}")
    return tuple(games)


def rules_text(lines: list[str]) -> str:
    """The rules a game prints when it starts (between its header and the help line)."""
    out, inside = [], False
    for line in lines:
        if line.startswith("Type 'help'"):
            break
        if inside and not set(line) <= {"="}:
            out.append(line)
        if line.startswith("Seed:"):
            inside = True
    return "\n".join(out).strip()


def _protocol(message: str):
    return failure(errors.GYM_PROTOCOL_ERROR, message)


def parse_answer(lines: list[str]) -> StepResult:
    """A :class:`StepResult` from the lines of one answer in JSON mode."""
    accepted = message = observation = None
    solved = game_over = False
    for line in lines:
        text = line.strip()
        if text.startswith("{"):
            data = loads_json(text, _protocol, f"a JSON line of the server ({text[:80]}...)",
                              not_json="does not decode")
            untyped = checks.literal(f"a JSON line without a 'type': {text[:200]}")
            data = checks.instance(data, "line", dict, fail=_protocol, message=untyped)
            kind = checks.text(data.get("type"), "type", fail=_protocol, message=untyped)
            if kind == "observation":
                observation = PuzzleObservation.from_json(data)
                solved = solved or observation.is_complete
            elif kind == "result":
                for name, wanted in RESULT_TYPES.items():
                    if name in data and not _is(data[name], wanted):
                        raise _wrong_type("a result", name, data[name], wanted)
                state = data.get("state") or {}
                if "is_complete" in state and not _is(state["is_complete"], bool):
                    raise _wrong_type("a result's state", "is_complete", state["is_complete"], bool)
                accepted = data.get("success") is True
                message = data.get("message") or ""
                if state.get("is_complete") is True:
                    solved = True
            elif kind == "complete":
                solved = True
        elif text.startswith("GAME OVER"):
            game_over = True
    return StepResult(tuple(lines), accepted, message, observation, solved, game_over and not solved)


def _is(value: Any, kind) -> bool:
    """``value`` is of the JSON type ``kind`` (a type, ``"count"``, None for null, or a tuple of these)."""
    if isinstance(kind, tuple):
        return any(_is(value, k) for k in kind)
    if kind is None:
        return value is None
    if kind == "count":
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    if kind is bool:
        return isinstance(value, bool)
    return isinstance(value, kind)


def _wrong_type(what: str, name: str, value: Any, kind) -> Exception:
    names = {str: "a string", bool: "true or false", dict: "an object", "count": "an integer >= 0", None: "null"}
    wanted = " or ".join(names[k] for k in (kind if isinstance(kind, tuple) else (kind,)))
    return failure(errors.GYM_PROTOCOL_ERROR, f"{what}'s {name} must be {wanted}, got {json.dumps(value)[:80]}; "
                                              "the server speaks another protocol version or is not a puzzle server")
