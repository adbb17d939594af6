"""The per-window index of a windowed plan, built in one streaming pass.

What goes in: a :class:`~.window.WindowDefinition`, a length source and a number of
epochs. What comes out: an ``int64`` array ``[E, K + 1, C]``: for epoch ``e``, the
running totals of :data:`~.window.COUNT_FIELDS` (microbatches, samples, skipped
samples, tokens, padded tokens) before window ``k`` of the ``K = ceil(N / W)``
windows, so ``index[e, k + 1] - index[e, k]`` are window ``k``'s counts and
``index[e, K]`` the epoch's. Memory: one window's rows and lengths at a time, and
``E (K + 1) C`` integers, O(N / W).

Random access: global microbatch ``j`` of epoch ``e`` lies in the window
``w = searchsorted(index[e, :, 0], j, "right") - 1`` (the last whose running total
is at most ``j``), as its local microbatch ``j - index[e, w, 0]``; producing it costs
planning that one window (:func:`locate`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .window import COUNT_FIELDS, WindowDefinition, count_window


def build_index(definition: WindowDefinition, source, num_epochs: int, *, backend: str = "auto",
                progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """The index of epochs ``0 .. num_epochs - 1`` (see the module docstring); ``progress(done, total)``
    after each window."""
    k = definition.num_windows
    index = np.zeros((num_epochs, k + 1, len(COUNT_FIELDS)), dtype=np.int64)
    total = num_epochs * k
    for epoch in range(num_epochs):
        for w in range(k):
            index[epoch, w + 1] = count_window(definition, source, epoch, w, backend).as_tuple()
            if progress is not None:
                progress(epoch * k + w + 1, total)
        np.cumsum(index[epoch], axis=0, out=index[epoch])
    return index


def locate(index: np.ndarray, epoch: int, j: int) -> tuple[int, int]:
    """``(window, local microbatch)`` of microbatch ``j`` of ``epoch`` (``0 <= j`` < the epoch's microbatches)."""
    running = index[epoch, :, 0]
    w = int(np.searchsorted(running, j, side="right")) - 1
    return w, j - int(running[w])
