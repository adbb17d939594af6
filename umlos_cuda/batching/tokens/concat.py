"""Several token sources read as one, with global row numbers.

What goes in: the sample count of each part, in order, and a function that
opens part ``i`` (a token store shard, a Megatron prefix). What comes out:
a token source (the protocol of tokens/sources.py) whose row ``r`` is row
``r - start[i]`` of part ``i``, where ``start`` are the cumulative counts:
plans, collation, batch files and fingerprints address samples by global
row and need not know there are parts.

A part is opened on first use (a store of thousands of shards opens in the
time it takes to read its index); a row is located by a binary search of
the starts (``bisect`` over a list: faster per call than ``np.searchsorted``
on a small array). ``lengths`` and ``length_cache()`` open every part.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ... import checks
from ...errors import UmlosError
from ..lengths.cache import LengthCache, first_repeat
from ..samples import Sample, SampleMeta


class ConcatenatedSource:
    """Parts read as one source (module docstring); ``fail(message)`` makes the error of a bad row."""

    def __init__(self, counts: Sequence[int], open_part: Callable[[int], Any], *, tokenizer_hash: str,
                 ids_are_line_numbers: bool, dataset_hash: str | None, fail: Callable[[str], UmlosError],
                 where: str) -> None:
        self.counts = [int(count) for count in counts]
        self.starts = [0]
        for count in self.counts:
            self.starts.append(self.starts[-1] + count)
        self._open_part = open_part
        self._parts: list[Any] = [None] * len(self.counts)
        self.tokenizer_hash = tokenizer_hash
        self.ids_are_line_numbers = ids_are_line_numbers
        self.dataset_hash = dataset_hash
        self._fail = fail
        self._where = where
        self._total = self.starts[-1]
        self._lengths: np.ndarray | None = None
        self._cache: LengthCache | None = None

    # ------------------------------------------------------------------ parts
    @property
    def num_parts(self) -> int:
        return len(self.counts)

    def part(self, index: int) -> Any:
        """Part ``index``, opened on first use."""
        part = self._parts[index]
        if part is None:
            part = self._parts[index] = self._open_part(index)
        return part

    def check_row(self, row: Any) -> int:
        """``row`` as an int in ``[0, N)``, else ``fail`` naming the rows there are."""
        return checks.integer(row, "row", 0, self._total - 1, fail=self._fail,
                              message="sample {value!r} is not in " + self._where + "; rows are 0 to {high}")

    def locate(self, row: int) -> tuple[int, int]:
        """``(part, row within the part)`` of global row ``row``."""
        if type(row) is not int or not 0 <= row < self._total:  # the common case skips the full check
            row = self.check_row(row)
        index = bisect.bisect_right(self.starts, row) - 1
        return index, row - self.starts[index]

    # ------------------------------------------------------------------ the token source protocol
    def __len__(self) -> int:
        return self._total

    @property
    def num_samples(self) -> int:
        return self._total

    @property
    def lengths(self) -> np.ndarray:
        """uint32 [N]: every part's lengths, in order (opens every part)."""
        if self._lengths is None:
            parts = [np.asarray(self.part(i).lengths, dtype=np.uint32) for i in range(self.num_parts)]
            lengths = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32)
            lengths.flags.writeable = False
            self._lengths = lengths
        return self._lengths

    def sample_id(self, row: int) -> str:
        index, local = self.locate(row)
        return str(self.starts[index] + local) if self.ids_are_line_numbers else self.part(index).sample_id(local)

    def length_cache(self) -> LengthCache:
        """The length cache of every row (ids: global row numbers, or the parts' ids in order, which must
        be distinct: LENGTHS_INVALID names a repeat)."""
        if self._cache is None:
            ids = None
            if not self.ids_are_line_numbers:
                ids = [sample_id for i in range(self.num_parts) for sample_id in self.part(i).length_cache().sample_ids]
                self._check_distinct(ids)
            self._cache = LengthCache.from_arrays(ids, self.lengths, self.tokenizer_hash,
                                                  dataset_hash=self.dataset_hash)
            self._cache.tokenizer_parts = getattr(self, "tokenizer_parts", None)  # a sharded store's index's
        return self._cache

    def _check_distinct(self, ids: list[str]) -> None:
        """``fail`` naming the source and the parts of the first id held twice (a part added twice, a copied
        shard), instead of a length cache's message of positions that names neither."""
        repeat = first_repeat(ids)
        if repeat is not None:
            sample_id, first, second = repeat
            (a, row_a), (b, row_b) = self.locate(first), self.locate(second)
            raise self._fail(f"{self._where}: sample id {sample_id!r} is row {row_a} of {self._part_name(a)} and row "
                             f"{row_b} of {self._part_name(b)}; the ids of the parts read as one must differ (a part "
                             "copied or added twice?)")

    def _part_name(self, index: int) -> str:
        """Part ``index`` for a message: its folder or prefix, else its number."""
        part = self.part(index)
        name = getattr(part, "root", None) or getattr(part, "prefix", None)
        return str(name) if name else f"part {index}"

    def input_ids(self, row: int) -> np.ndarray:
        index, local = self.locate(row)
        return self.part(index).input_ids(local)

    def loss_mask(self, row: int) -> np.ndarray:
        index, local = self.locate(row)
        return self.part(index).loss_mask(local)

    def arrays(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids, loss_mask)`` of global row ``row``: what collation reads."""
        index, local = self.locate(row)
        return self.part(index).arrays(local)

    def __getitem__(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        return self.arrays(row)

    def sample(self, row: int, dataset_id: str = "train") -> Sample:
        """Global row ``row`` as a validated :class:`Sample` (one object: for the edges)."""
        ids, mask = self.arrays(row)
        return Sample(ids, mask, None, SampleMeta(self.sample_id(row), dataset_id))
