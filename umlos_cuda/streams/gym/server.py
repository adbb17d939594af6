"""Run the puzzle server (``chuk-puzzles-gym``) on a chosen address.

The package's own entry point, ``chuk-puzzles-server``, always listens on
0.0.0.0:8023. Tests, examples and ``umlos-cuda gym serve`` need a server on
127.0.0.1 and a free port, so this module starts the same server class
(``TelnetServer`` with the package's ``ArcadeHandler``) on the address it is
given. With port 0 the system picks a free port; the address actually bound
is printed as one line ``listening HOST PORT`` and, with ``--port-file``,
written to that file, which is how a parent process learns it. The port file
goes through the output layer (umlos_cuda/files/atomic.py): checked before
the server starts (a missing folder, a link or a FIFO there is refused with
OUTPUT_PATH_INVALID), written under an unguessable temp name created with
``O_EXCL | O_NOFOLLOW`` beside it, and renamed over a previous port file
(only a regular file is replaced).

Run as ``python -m umlos_cuda.streams.gym.server --port 0 --port-file F``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from functools import partial
from typing import Any

from ... import checks, errors
from ...errors import UmlosError
from ..failures import failure


def _server_classes():
    try:
        from chuk_protocol_server.servers.telnet_server import TelnetServer
        from chuk_puzzles_gym.server import ArcadeHandler
    except ImportError as exc:
        raise failure(errors.GYM_CONFIG_INVALID, f"the puzzle server is not installed ({exc}); install the extra: "
                                                 "pip install 'umlos-cuda[gym]'") from None
    return TelnetServer, ArcadeHandler


def server_version() -> str | None:
    """The installed ``chuk-puzzles-gym`` version, or None."""
    from importlib import metadata

    try:
        return metadata.version("chuk-puzzles-gym")
    except metadata.PackageNotFoundError:
        return None


def check_address(host: Any, port: Any) -> None:
    """GYM_CONFIG_INVALID unless ``host`` is a non-empty string and ``port`` an integer in
    [0, 65535]: checked before anything listens, so a bad value is one line, not a traceback
    from the socket layer after the server started (the port file is the output layer's)."""
    fail = partial(failure, errors.GYM_CONFIG_INVALID)
    checks.text(host, "host", empty=False, fail=fail, message="{name} must be a non-empty string, got {value!r}")
    checks.integer(port, "port", 0, 65535, strict=True, fail=fail,
                   message="{name} must be an integer in [{low}, {high}] (0: a free one), got {value!r}")


async def serve(host: str, port: int, port_file: str | None = None, log_level: str = "WARNING") -> None:
    """Listen on ``host:port`` until cancelled; announce the bound port."""
    from ...files.atomic import atomic_output, check_output_path

    check_address(host, port)
    if port_file:
        check_output_path(port_file, force=True)  # before listening: a wrong path fails at once
    telnet_server, handler = _server_classes()
    logging.getLogger().setLevel(log_level)  # the server's module configures INFO when imported
    server = telnet_server(host, port, handler)
    try:
        server.server = await server._create_server()
    except OSError as exc:  # an address this machine does not have, a port in use, a name that does not resolve
        raise failure(errors.GYM_CONFIG_INVALID, f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound_host, bound_port = server.server.sockets[0].getsockname()[:2]
    if port_file:
        with atomic_output(port_file, force=True) as handle:
            handle.write(f"{bound_host} {bound_port}\n".encode("ascii"))
    print(f"listening {bound_host} {bound_port}", flush=True)
    async with server.server:
        await server.server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m umlos_cuda.streams.gym.server", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    port = checks.integer_parser("--port", None, None, fail=argparse.ArgumentTypeError,
                                 message="{name} must be an integer, got {value!r}")  # serve() checks its range
    parser.add_argument("--port", type=port, default=0, help="0: a free port chosen by the system")
    parser.add_argument("--port-file", help="write 'HOST PORT' here once listening")
    parser.add_argument("--log-level", default="WARNING", help="the server's logging level (default WARNING)")
    args = parser.parse_args(argv)
    try:
        asyncio.run(serve(args.host, args.port, args.port_file, args.log_level))
    except KeyboardInterrupt:
        return 0
    except UmlosError as exc:  # a refused port file: the command line's one-line failure, no traceback
        print(f"error {exc.code}: {exc.message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
