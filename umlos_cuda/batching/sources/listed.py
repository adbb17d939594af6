"""Several sources read as one, with global row numbers: what a list of paths opens as.

What goes in: opened sources, in order (each a :class:`~umlos_cuda.batching.lengths.sources.LengthSource`;
token sources for a list of Megatron prefixes, as Megatron-LM's data path lists them). What comes out: a
length source whose row ``r`` is row ``r - start[i]`` of source ``i``, bound as an ``ArrayLengths`` of all the
lengths in order (so a plan over the list opens with the lengths held in memory, and the reverse), and a
token source when every part is one (the parts must then name one tokenizer).
"""

from __future__ import annotations

import hashlib

import numpy as np

from ... import errors
from ...errors import UmlosError
from ..lengths.sources import LengthSource

#: Rows hashed at a time by :meth:`SourceList.binding` (each part released after each piece).
_PIECE = 1 << 20


class SourceList(LengthSource):
    """The parts as one source (module docstring); ``origin`` is the list of the parts' origins."""

    def __init__(self, parts: list[LengthSource]) -> None:
        if not parts:
            raise UmlosError(errors.BATCHING_CONFIG_INVALID, "a list of sources names none",
                             operator=errors.BATCHING_OPERATOR)
        self.parts = list(parts)
        self.starts = np.cumsum([0] + [part.count for part in self.parts], dtype=np.int64)
        self.count = int(self.starts[-1])
        self.origin = None  # a list: origins() records it
        self.tokens = all(callable(getattr(part, "arrays", None)) for part in self.parts)
        hashes = {getattr(part, "tokenizer_hash", None) for part in self.parts}
        if self.tokens and len(hashes) != 1:
            raise UmlosError(errors.BATCH_STORE_MISMATCH, f"the listed token sources name {len(hashes)} tokenizers "
                             f"({', '.join(sorted(map(str, hashes)))}); one dataset has one",
                             operator=errors.BATCHING_OPERATOR)
        self.tokenizer_hash = hashes.pop() if len(hashes) == 1 else None
        self._sha256: str | None = None

    def __len__(self) -> int:
        return self.count

    def origins(self) -> list[str | None]:
        """Each part's origin, in order: what a plan records for the list."""
        return [part.origin for part in self.parts]

    def _locate(self, rows: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.starts, rows, side="right") - 1

    def take(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty(rows.shape[0], dtype=np.uint32)
        parts = self._locate(rows)
        for part in np.unique(parts).tolist():
            chosen = parts == part
            out[chosen] = self.parts[part].take(rows[chosen] - self.starts[part])
        return out

    def binding(self) -> dict:
        if self._sha256 is None:
            digest = hashlib.sha256()
            for part in self.parts:
                for start in range(0, part.count, _PIECE):
                    rows = np.arange(start, min(start + _PIECE, part.count), dtype=np.int64)
                    digest.update(np.ascontiguousarray(part.take(rows), dtype="<u4").tobytes())
                    part.release()
            self._sha256 = digest.hexdigest()
        return {"kind": "array", "count": self.count, "lengths_sha256": self._sha256}

    def release(self) -> None:
        for part in self.parts:
            part.release()

    def identity(self) -> dict | None:
        """Each part's identity, in order (None when no part has one)."""
        parts = [part.identity() for part in self.parts]
        return None if all(part is None for part in parts) else {"parts": parts}

    def arrays(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """Global row ``row``'s tokens and loss mask, from its part (token sources only)."""
        part = int(self._locate(np.asarray([row]))[0])
        return self.parts[part].arrays(row - int(self.starts[part]))  # type: ignore[attr-defined]
