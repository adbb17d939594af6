"""``BufferSnapshot``: the contents of a replay buffer at one moment, frozen and fingerprinted.

What goes in: the buffer's samples and their keys (the order they were
added: key ``k`` is the ``k``-th sample ever added), priorities and draw
counts. What comes out: read-only arrays in key order (``keys``,
``lengths``, ``priorities``, ``solved`` (-1 for unknown), ``draw_counts``), the samples as a tuple, and
:attr:`BufferSnapshot.fingerprint`::

    SHA-256( canonical JSON {"format", "count", "added"} || keys (int64 LE)
             || priorities (float64 LE) || each sample's digest (32 bytes) )

The fingerprint binds every sample's content (through its digest), which
samples are in, and their priorities: two snapshots with the same
fingerprint plan the same windows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..types import StreamSample, canonical_json

FORMAT = "umlos-cuda/buffer-snapshot-v1"


@dataclass(frozen=True)
class BufferSnapshot:
    keys: np.ndarray
    samples: tuple[StreamSample, ...]
    priorities: np.ndarray
    draw_counts: np.ndarray
    added: int  # samples ever added to the buffer (evicted and dropped ones included)
    lengths: np.ndarray  # uint32: each sample's token count
    fingerprint: str = ""

    @classmethod
    def build(cls, keys: np.ndarray, samples: Sequence[StreamSample], priorities: np.ndarray,
              draw_counts: np.ndarray, added: int, lengths: np.ndarray | None = None,
              digests: np.ndarray | None = None) -> BufferSnapshot:
        """``lengths`` and ``digests`` (rows of 32 bytes) are computed from the
        samples when not given (the buffer keeps them as arrays)."""
        keys = np.ascontiguousarray(keys, dtype="<i8")
        priorities = np.ascontiguousarray(priorities, dtype="<f8")
        draw_counts = np.ascontiguousarray(draw_counts, dtype="<i8")
        if lengths is None:
            lengths = np.fromiter((s.length for s in samples), dtype=np.uint32, count=len(samples))
        lengths = np.ascontiguousarray(lengths, dtype=np.uint32)
        for array in (keys, priorities, draw_counts, lengths):
            array.setflags(write=False)
        digest = hashlib.sha256(canonical_json({"format": FORMAT, "count": len(samples), "added": added}))
        digest.update(keys.tobytes())
        digest.update(priorities.tobytes())
        if digests is None:
            digest.update(b"".join(bytes.fromhex(s.digest) for s in samples))
        else:
            digest.update(np.ascontiguousarray(digests, dtype=np.uint8).tobytes())
        return cls(keys, tuple(samples), priorities, draw_counts, added, lengths, digest.hexdigest())

    def __len__(self) -> int:
        return len(self.samples)

    @cached_property
    def sample_ids(self) -> list[str]:
        return [s.sample_id for s in self.samples]

    @cached_property
    def solved(self) -> np.ndarray:
        return np.array([-1 if s.solved is None else int(s.solved) for s in self.samples], dtype=np.int8)

    @cached_property
    def difficulties(self) -> list[str | None]:
        return [s.difficulty for s in self.samples]

    @cached_property
    def difficulty_codes(self) -> tuple[np.ndarray, list[str | None]]:
        """``(codes, names)``: ``names[codes[i]]`` is sample ``i``'s difficulty."""
        names = sorted(set(self.difficulties), key=lambda d: (d is None, d or ""))
        index = {name: i for i, name in enumerate(names)}
        return np.fromiter((index[d] for d in self.difficulties), dtype=np.int64, count=len(self.samples)), names
