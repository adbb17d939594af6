"""A toy source kind, registered by importing this module: what adding a kind of source takes.

A ``.toylen`` file holds one length per line, as decimal text. The kind is this module and its one
registration line; nothing else in the package names it, and every plan, command and loader takes it
through ``open_source`` (tests/test_sources.py).
"""

from __future__ import annotations

import numpy as np

from umlos_cuda.batching.lengths.sources import ArrayLengths
from umlos_cuda.batching.sources import SourceKind, register_source_kind

SUFFIX = ".toylen"


class ToyLengths(ArrayLengths):
    """The lengths of a ``.toylen`` file, read whole (a toy: real kinds read by rows)."""

    def __init__(self, path: str) -> None:
        with open(path, encoding="ascii") as handle:
            super().__init__(np.asarray([int(line) for line in handle if line.strip()], dtype=np.uint32))


def write(path, lengths) -> str:
    with open(path, "w", encoding="ascii") as handle:
        handle.writelines(f"{int(value)}\n" for value in lengths)
    return str(path)


KIND = register_source_kind(SourceKind("toy lengths", lambda path: path.endswith(SUFFIX), ToyLengths))
