"""The replay buffer: stream samples held, drawn and frozen reproducibly.

Modules:
    rng            the buffer's Philox sub-streams, keyed by the run's manifest
    replay_buffer  :class:`ReplayBuffer`: a bounded store of samples
    snapshot       :class:`BufferSnapshot`: the contents at one moment, fingerprinted
"""
