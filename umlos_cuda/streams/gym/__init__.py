"""The puzzle gym: samples played live on a ``chuk-puzzles-gym`` server.

Modules:
    telnet_wire    lines over the server's telnet connection, one command at a time
    telnet_client  the protocol as calls: games, difficulties, moves
    players        the shipped players (``hint``, ``random``)
    episodes       one episode played, and the samples it becomes
    stream         :class:`GymEpisodeStream` and its :class:`GymConfig`
    server         run the server on a chosen address
    mock           synthetic episodes without a server, for unit tests
"""
