"""Per-sequence read speed of the Megatron-LM indexed dataset reader.

Writes a Megatron ``.bin``/``.idx`` pair of ``--samples`` sequences (uint16
ids, lognormal lengths; the writer of bench/bench_collate.py), opens it with
:class:`~umlos_cuda.batching.tokens.megatron.MegatronDataset` and times one
pass reading every sequence, best of ``--repeat``:

* ``before``: the reader's former per-sequence path, reproduced here
  (a range check, then slicing the ``np.memmap`` of the ``.bin`` and
  viewing it as the token dtype);
* ``after``: ``MegatronDataset.arrays(row)`` as it is now (one bounds check
  and one plain ndarray slice with precomputed token offsets);
* ``floor memmap``: a bare loop slicing an ``np.memmap`` of the tokens with
  precomputed offsets and no check at all, the cost of the data structure
  megatron-core's ``IndexedDataset`` reads through (it slices ``np.memmap``
  too, via ``np.frombuffer`` per sequence);
* ``floor ndarray``: the same bare loop over a plain ndarray view;
* ``core-like``: megatron-core's per-sequence path reproduced from its
  ``indexed_dataset.py`` (``_IndexReader`` arrays indexed for the pointer
  and length, then ``np.frombuffer`` over a ``memoryview`` of the ``.bin``
  map, as ``_MMapBinReader.read`` does), without its ``lru_cache`` and
  Python-level ``IndexedDataset.get`` wrapper, so a lower bound on its cost.

megatron-core's ``IndexedDataset`` itself is not measured: it needs Python
>= 3.12 and a multi-GB torch, neither installable on the machine this bench
was written on, so the floors stand in for it. Everything is local and
deterministic; the folder defaults to a temporary one.

    python bench/bench_megatron_reader.py [--samples 200000] [--repeat 3] [--folder DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_collate import best_of, write_source

from umlos_cuda import checks
from umlos_cuda.batching.tokens.megatron import MegatronDataset, _invalid


def read_before(dataset: MegatronDataset) -> int:
    """Every sequence through the former path: checks.integer, then a memmap slice and view."""
    total = 0
    data, pointers, sizes, dtype, ones = dataset.data, dataset.pointers, dataset.sizes, dataset.dtype, dataset._ones
    for row in range(len(dataset)):
        row = checks.integer(row, dataset.prefix, 0, len(dataset) - 1, fail=_invalid)
        start, size = int(pointers[row]), int(sizes[row])
        ids = data[start:start + size * dtype.itemsize].view(dtype)
        total += ones[:ids.shape[0]].shape[0]
    return total


def read_after(dataset: MegatronDataset) -> int:
    total = 0
    for row in range(len(dataset)):
        _ids, mask = dataset.arrays(row)
        total += mask.shape[0]
    return total


def read_floor(tokens: np.ndarray, starts: list[int], ends: list[int]) -> int:
    total = 0
    for start, end in zip(starts, ends):
        total += tokens[start:end].shape[0]
    return total


def read_core_like(prefix: str, dataset: MegatronDataset) -> int:
    """megatron-core's read path (docstring): index arrays, then np.frombuffer per sequence."""
    buffer = memoryview(np.memmap(prefix + ".bin", mode="r", order="C"))
    pointers, lengths = dataset.pointers, dataset.sizes
    total = 0
    for row in range(len(dataset)):
        pointer, length = pointers[row], lengths[row]
        total += np.frombuffer(buffer, dtype=np.uint16, count=length, offset=pointer).shape[0]
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--folder", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        folder = args.folder or temporary
        prefix = os.path.join(folder, "bench")
        lengths = write_source(prefix, args.samples)
        dataset = MegatronDataset.open(prefix)
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).tolist()
        ends = np.cumsum(lengths).tolist()
        mapped = np.memmap(prefix + ".bin", dtype=np.uint16, mode="r")
        plain = np.fromfile(prefix + ".bin", dtype=np.uint16)
        expected = int(lengths.sum())
        runs = {"before": lambda: read_before(dataset), "after": lambda: read_after(dataset),
                "floor memmap": lambda: read_floor(mapped, starts, ends),
                "floor ndarray": lambda: read_floor(plain, starts, ends),
                "core-like": lambda: read_core_like(prefix, dataset)}
        for name, run in runs.items():
            assert run() == expected, name
        best = best_of(args.repeat, *runs.values())
        print(f"{args.samples} sequences, {expected} tokens, best of {args.repeat}")
        print(f"{'reader':<14} {'seconds':>8} {'us/seq':>7} {'vs after':>8}")
        for name, seconds in zip(runs, best):
            print(f"{name:<14} {seconds:8.3f} {seconds / args.samples * 1e6:7.2f} {seconds / best[1]:8.2f}x")


if __name__ == "__main__":
    main()
