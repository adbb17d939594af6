"""The replay buffer's random numbers: Philox sub-streams keyed by the run's manifest.

A buffer draws for four jobs, each from its own sub-stream so that one job's
draws never shift another's: ``eviction`` (the reservoir's slot choice),
``sample`` (``ReplayBuffer.sample``), ``policy`` (what a window's sampling
policy selects) and ``window`` (each window plan's seed). The streams are
those of :mod:`umlos_cuda.rng` (Philox4x32-10, counter ``s * 2^64 + block``,
the same kernels and NumPy twin), under a key of their own derivation::

    seed16 = SHA-256(CBOR_CANONICAL(["umlos_replay_buffer_v1", kernel_replay_token, manifest_hash]))[0:16]

so a buffer never draws the numbers of the trainer's ``init``, ``cluster``
or ``misc`` streams. The state is the key and the four offsets (draws taken
so far); restoring it gives the same draws after.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import numpy as np

from ... import checks, errors
from ...hashing import hash_canonical
from ...manifest.core import Manifest, as_manifest
from ...rng.streams import substream_blocks
from ..failures import failure

BUFFER_DERIVATION = "umlos_replay_buffer_v1"
STATE_FORMAT = "umlos-cuda/replay-buffer-rng-v1"
#: The sub-streams, in the order of their numbers.
STREAMS = ("eviction", "sample", "policy", "window")
_NUMBERS = {name: number for number, name in enumerate(STREAMS)}


def stream_manifest(seed: int) -> Manifest:
    """A manifest for runs that have none of their own: one placeholder dataset, ``seed``."""
    return Manifest.from_dict({
        "seed": seed,
        "global_batch_size": 1,
        "datasets": {"train": {"id": "umlos_cuda.streams", "version": 1, "hash": "", "cardinality": 1}},
    })


class BufferRng:
    """Sequential draws from the buffer's four sub-streams."""

    def __init__(self, seed16: bytes, offsets: Mapping[str, int] | None = None) -> None:
        checks.instance(seed16, "key", bytes, length=16, fail=_invalid, message="a buffer RNG key is 16 bytes")
        self.seed16 = seed16
        self._offsets = {name: 0 for name in STREAMS}
        if offsets is not None:
            self._offsets = _checked_offsets(offsets)

    @classmethod
    def from_manifest(cls, manifest: Any, replay_token: bytes | None = None) -> BufferRng:
        manifest = as_manifest(manifest)
        token = manifest.resolve_replay_token(replay_token)
        return cls(hash_canonical([BUFFER_DERIVATION, token, manifest.hash])[:16])

    def draw(self, stream: str, k: int) -> np.ndarray:
        """The next ``k`` uint32 draws of ``stream``."""
        if stream not in _NUMBERS:
            raise failure(errors.REPLAY_BUFFER_INVALID,
                          f"buffer sub-stream {stream!r} is not one of {', '.join(STREAMS)}")
        k = int(k)
        offset = self._offsets[stream]
        self._offsets[stream] = offset + k
        if k == 0:
            return np.empty(0, dtype=np.uint32)
        first, skip = divmod(offset, 4)
        last = (offset + k - 1) // 4
        words = substream_blocks(self.seed16, _NUMBERS[stream], first, last - first + 1)
        return words.reshape(-1)[skip:skip + k].copy()

    def uniforms(self, stream: str, k: int) -> np.ndarray:
        """``k`` float64 in [0, 1), 53 bits each from two draws."""
        words = self.draw(stream, 2 * k).astype(np.uint64).reshape(-1, 2) if k else np.empty((0, 2), np.uint64)
        return ((words[:, 0] >> np.uint64(5)) * np.float64(1 << 26) + (words[:, 1] >> np.uint64(6))) / float(1 << 53)

    def words64(self, stream: str, k: int) -> np.ndarray:
        """``k`` uint64, each two draws (low word first)."""
        words = self.draw(stream, 2 * k).astype(np.uint64).reshape(-1, 2) if k else np.empty((0, 2), np.uint64)
        return words[:, 0] | (words[:, 1] << np.uint64(32))

    @property
    def offsets(self) -> dict[str, int]:
        return dict(self._offsets)

    def state_dict(self) -> dict[str, Any]:
        return {"format": STATE_FORMAT, "master_seed": self.seed16, "offsets": self.offsets}

    def load_state_dict(self, state: Any) -> None:
        """Put back a state of the same key (another key is another run: refused)."""
        shape = "a buffer RNG state has exactly format, master_seed and offsets"
        checks.record(state, _STATE_FIELDS, fail=_invalid, not_a_map=shape, unknown=shape, missing=shape)
        if state["format"] != STATE_FORMAT:
            raise failure(errors.REPLAY_BUFFER_INVALID,
                          f"buffer RNG state format {state['format']!r} is not {STATE_FORMAT!r}")
        if state["master_seed"] != self.seed16:
            raise failure(errors.REPLAY_BUFFER_INVALID, "the saved buffer RNG belongs to another run (another manifest "
                                                        "or replay token): its key differs from this buffer's")
        self._offsets = _checked_offsets(state["offsets"])


def _checked_offsets(offsets: Any) -> dict[str, int]:
    shape = checks.literal(f"buffer RNG offsets have exactly the keys {', '.join(STREAMS)}")
    return checks.record(offsets, _OFFSET_FIELDS, fail=_invalid, not_a_map=shape, unknown=shape, missing=shape)


_invalid = partial(failure, errors.REPLAY_BUFFER_INVALID)
#: A state's fields (checked by :meth:`BufferRng.load_state_dict`) and its offsets, one per sub-stream.
_STATE_FIELDS = dict.fromkeys(("format", "master_seed", "offsets"), checks.field(checks.anything))
_OFFSET_FIELDS = dict.fromkeys(STREAMS, checks.field(
    checks.integer, strict=True, message="offset {name} must be an integer in [0, 2^64 - 1], got {value!r}"))
