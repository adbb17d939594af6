"""Lines over the puzzle server's telnet connection, one command at a time.

What goes in: a host, a port and command lines. What comes out: for each
command, the lines the server answered, with telnet negotiation removed.

The server (``chuk-puzzles-server``) speaks telnet in character mode: it
echoes every character it receives, answers a command when the line ends,
then prints a ``"> "`` prompt. Nothing in its output says that an answer is
complete, so each command is followed by a *sync line*, a word that is no
command (``zzsync<N>``, N counting up): the server handles lines strictly in
order, so once the echo of the sync word arrives, the whole answer to the
command before it has arrived too. No timing is involved. The answer of a
command is what lies between the echo of the command and the echo of its
sync word (the server's "Unknown command" reply to the previous sync word,
and the prompts, are dropped).

On connect the server waits up to one second for the client's first bytes
before it greets (it probes for telnet negotiation); the client sends a
telnet ``IAC NOP`` at once, so the greeting comes without that wait, and it
sends nothing else until the greeting has begun, since the server drops the
first bytes it reads.

Failures, each an ``UmlosError``: a refused or closed connection
(``GYM_CONNECTION_FAILED``), no complete answer before the deadline
(``GYM_TIMEOUT``), and bytes that are not lines of UTF-8 text, a line
longer than :data:`MAX_LINE_BYTES` or an answer of more than
:data:`MAX_ANSWER_BYTES` (``GYM_PROTOCOL_ERROR``).
"""

from __future__ import annotations

import contextlib
import socket
import time

from ... import errors
from ..failures import failure

IAC, NOP, SB, SE = 255, 241, 250, 240
WILL, WONT, DO, DONT = 251, 252, 253, 254
#: The longest line accepted from the server (an observation of the largest grid is ~10 kB).
MAX_LINE_BYTES = 1 << 20
#: The most bytes one answer (or the greeting) may take, lines and telnet commands together: a
#: server that floods lines, each under the line cap, is refused here instead of filling memory.
MAX_ANSWER_BYTES = 16 << 20
#: The sync word's stem; the server has no command of this name in the menu or in a game.
SYNC_STEM = "zzsync"
PROMPT = "> "


class TelnetStripper:
    """Removes telnet commands from a byte stream, chunk by chunk (a command
    may be split across chunks): ``IAC IAC`` is a literal 255, ``IAC
    WILL/WONT/DO/DONT x`` three bytes, ``IAC SB ... IAC SE`` a block, any
    other ``IAC x`` two bytes."""

    def __init__(self) -> None:
        self._state = "data"

    def feed(self, data: bytes) -> bytes:
        out = bytearray()
        state = self._state
        for byte in data:
            if state == "data":
                if byte == IAC:
                    state = "iac"
                else:
                    out.append(byte)
            elif state == "iac":
                if byte == IAC:
                    out.append(IAC)
                    state = "data"
                elif byte in (WILL, WONT, DO, DONT):
                    state = "option"
                elif byte == SB:
                    state = "sub"
                else:
                    state = "data"
            elif state == "option":
                state = "data"
            elif state == "sub":
                if byte == IAC:
                    state = "sub_iac"
            elif state == "sub_iac":
                state = "data" if byte == SE else "sub"
        self._state = state
        return bytes(out)


class TelnetLines:
    """A connection to the server, read as lines; :meth:`exchange` sends one command.

    Args:
        host, port: where the server listens.
        timeout: seconds one exchange (or the connect and greeting) may take.
    """

    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._sync = 0
        self._pending = b""
        self._received = 0  # bytes received for the current answer
        self._strip = TelnetStripper()
        deadline = time.monotonic() + timeout
        try:
            self._sock: socket.socket | None = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise failure(errors.GYM_CONNECTION_FAILED, f"cannot connect to the puzzle server at {host}:{port}: {exc}",
                          reason="refused") from None
        try:
            self._sock.sendall(bytes([IAC, NOP]))
            self._received = 0
            self._receive(deadline, "the greeting")  # the server has read its first bytes: commands are safe now
        except OSError as exc:
            self.close()
            raise failure(errors.GYM_CONNECTION_FAILED, f"the puzzle server at {host}:{port} closed the connection "
                                                        f"on connect: {exc}", reason="closed") from None

    def exchange(self, command: str | None) -> list[str]:
        """Send ``command`` (None: only a sync word) and return the lines of its answer."""
        if command is not None and ("\n" in command or "\r" in command or not command.isprintable()):
            raise failure(errors.GYM_CONFIG_INVALID, f"a command is one line of printable text, got {command!r}")
        self._sync += 1
        sync = f"{SYNC_STEM}{self._sync}"
        payload = (f"{command}\n" if command is not None else "") + f"{sync}\n"
        deadline = time.monotonic() + self.timeout
        sock = self._connected()
        self._received = len(self._pending)
        try:
            sock.sendall(payload.encode("utf-8"))
        except OSError as exc:
            self.close()
            raise failure(errors.GYM_CONNECTION_FAILED, f"the puzzle server at {self.host}:{self.port} closed the "
                                                        f"connection while {command!r} was sent: {exc}",
                          reason="closed") from None
        lines: list[str] = []
        while True:
            line = self._next_line(deadline, command)
            if _unprompt(line) == sync:
                return answer_of(lines, command)
            lines.append(line)

    def close(self) -> None:
        sock, self._sock = getattr(self, "_sock", None), None
        if sock is not None:
            with contextlib.suppress(OSError):  # closing a dead socket
                sock.close()

    def __enter__(self) -> TelnetLines:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- reading -------------------------------------------------------------------------
    def _next_line(self, deadline: float, command: str | None) -> str:
        while True:
            end = self._pending.find(b"\n")
            if end >= 0:
                raw, self._pending = self._pending[:end], self._pending[end + 1:]
                if len(raw) > MAX_LINE_BYTES:
                    raise self._protocol(f"a line of {len(raw)} bytes (at most {MAX_LINE_BYTES})")
                try:
                    return raw.rstrip(b"\r").decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise self._protocol(f"a line that is not UTF-8 ({exc.reason} at byte {exc.start}): "
                                         f"{raw[:80]!r}") from None
            if len(self._pending) > MAX_LINE_BYTES:
                raise self._protocol(f"more than {MAX_LINE_BYTES} bytes without a line end")
            self._receive(deadline, repr(command) if command is not None else "the sync word")

    def _connected(self) -> socket.socket:
        if self._sock is None:
            raise failure(errors.GYM_CONNECTION_FAILED, "the connection to the puzzle server is closed",
                          reason="closed")
        return self._sock

    def _receive(self, deadline: float, waiting_for: str) -> None:
        """Read one chunk (at least one byte) into the pending text, or fail."""
        sock = self._connected()
        remaining = deadline - time.monotonic()
        try:
            if remaining <= 0:
                raise TimeoutError
            sock.settimeout(remaining)
            data = sock.recv(1 << 16)
        except TimeoutError:
            self.close()
            raise failure(errors.GYM_TIMEOUT, f"the puzzle server at {self.host}:{self.port} sent no complete answer "
                                              f"to {waiting_for} within {self.timeout:g} s") from None
        except OSError as exc:
            self.close()
            raise failure(errors.GYM_CONNECTION_FAILED, f"the puzzle server at {self.host}:{self.port} closed the "
                                                        f"connection while waiting for {waiting_for} ({exc})",
                          reason="closed") from None
        if not data:
            self.close()
            raise failure(errors.GYM_CONNECTION_FAILED, f"the puzzle server at {self.host}:{self.port} closed the "
                                                        f"connection while waiting for {waiting_for}", reason="closed")
        self._received += len(data)
        if self._received > MAX_ANSWER_BYTES:
            raise self._protocol(f"more than {MAX_ANSWER_BYTES} bytes while this client waited for {waiting_for} "
                                 "(no answer of the puzzle server is that long)")
        self._pending += self._strip.feed(data)

    def _protocol(self, what: str):
        self.close()
        return failure(errors.GYM_PROTOCOL_ERROR, f"the puzzle server at {self.host}:{self.port} sent {what}")


def _unprompt(line: str) -> str:
    while line.startswith(PROMPT):
        line = line[len(PROMPT):]
    return line.rstrip()


def answer_of(lines: list[str], command: str | None) -> list[str]:
    """The answer to ``command`` among the lines read since the previous sync
    word: what follows the echo of the command (all lines when there is no
    command, less the reply to the previous sync word), prompts removed."""
    cleaned = [_unprompt(line) for line in lines]
    if command is not None:
        for i, line in enumerate(cleaned):
            if line == command.strip():
                return _drop_blank_ends(cleaned[i + 1:])
        raise failure(errors.GYM_PROTOCOL_ERROR, f"the puzzle server did not echo the command {command!r} "
                                                 "(it is not the character-mode telnet server this client speaks to)")
    return _drop_blank_ends([line for line in cleaned if not line.startswith(f"{SYNC_STEM}")
                             and not line.startswith("Unknown command")])


def _drop_blank_ends(lines: list[str]) -> list[str]:
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return lines
