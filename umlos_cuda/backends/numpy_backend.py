"""The NumPy backend: the reference path every other backend must match."""

from __future__ import annotations

import numpy as np

from .. import reference
from ..epoch import build_plan_reference


class NumpyBackend:
    name = "numpy"
    xp = np

    def build_plan(self, seed16: bytes, n: int, block_size: int):
        return build_plan_reference(seed16, n, block_size)

    def map_train(self, plan, start: int, count: int, out=None):
        out = np.empty(count, dtype=np.uint64) if out is None else out
        return reference.map_positions(plan, start, count, out)

    def sequential(self, start: int, count: int, out=None):
        out = np.empty(count, dtype=np.uint64) if out is None else out
        out[:] = np.arange(count, dtype=np.uint64)
        out += np.uint64(start)
        return out


def create() -> NumpyBackend:
    return NumpyBackend()
