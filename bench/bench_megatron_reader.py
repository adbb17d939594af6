"""Per-sequence read speed of the Megatron-LM indexed dataset reader, beside megatron-core's own.

Writes a Megatron ``.bin``/``.idx`` pair of ``--samples`` sequences (uint16
ids, lognormal lengths; the writer of bench/bench_collate.py), opens it with
:class:`~umlos_cuda.batching.tokens.megatron.MegatronDataset` and, when
megatron-core is importable, with its ``IndexedDataset``
(``megatron.core.datasets.indexed_dataset``), and times two passes over
every sequence, best of ``--repeat`` (rounds alternate between readers):
in order (row 0, 1, ...), and at random (one fixed permutation of the rows,
the order a shuffled epoch reads in). Readers:

* ``megatron-core``: ``IndexedDataset[row]``, the real thing (run under the
  bench venv of bench/megatron/setup.sh: megatron-core 0.19 needs Python
  >= 3.12 and torch, which the project never depends on);
* ``ours input_ids``: ``MegatronDataset.input_ids(row)``, the same result as
  megatron-core's (the sequence's tokens, a read-only view of the ``.bin``);
* ``ours arrays``: ``MegatronDataset.arrays(row)``, tokens and loss mask, what
  a collator reads;
* ``before`` (in-order pass only): the reader's former per-sequence path,
  reproduced here (a full range check, then slicing the ``np.memmap`` of the
  ``.bin`` and viewing it as the token dtype);
* ``core-like``: megatron-core's per-sequence path reproduced from its
  ``indexed_dataset.py`` (index arrays indexed for pointer and length, then
  ``np.frombuffer`` over a ``memoryview`` of the ``.bin`` map), without its
  ``lru_cache`` and ``__getitem__`` wrapper: a lower bound on its cost that
  runs without megatron-core;
* ``floor memmap`` / ``floor ndarray`` (in-order pass only): bare loops slicing
  an ``np.memmap`` / a plain ndarray with precomputed offsets, no check.

Every reader's total token count is asserted equal before timing, and when
megatron-core is there every sequence it returns is compared with ours.
The last line prints megatron-core's time over ours (> 1: ours faster).
Everything is local and deterministic; the folder defaults to a temporary one.

    python bench/bench_megatron_reader.py [--samples 200000] [--repeat 3] [--folder DIR]
    bench/.venv-megatron/bin/python bench/bench_megatron_reader.py   # with megatron-core
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


def core_indexed_dataset():
    """megatron-core's ``IndexedDataset`` class, or None where megatron-core is not installed."""
    import logging
    import warnings
    logging.disable(logging.WARNING)  # torch's "No CUDA runtime is found" on a CPU machine
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed"
            from megatron.core.datasets.indexed_dataset import IndexedDataset
    except ImportError:
        return None
    finally:
        logging.disable(logging.NOTSET)
    # "Could not determine rank ... Defaulting to rank 0": a bench runs outside torch.distributed on purpose
    warnings.filterwarnings("ignore", message="Could not determine rank", category=UserWarning)
    return IndexedDataset


def read_before(dataset: MegatronDataset, rows: list[int]) -> int:
    """Every sequence through the former path: checks.integer, then a memmap slice and view."""
    total = 0
    data, pointers, sizes, dtype, ones = dataset.data, dataset.pointers, dataset.sizes, dataset.dtype, dataset._ones
    for row in rows:
        row = checks.integer(row, dataset.prefix, 0, len(dataset) - 1, fail=_invalid)
        start, size = int(pointers[row]), int(sizes[row])
        ids = data[start:start + size * dtype.itemsize].view(dtype)
        total += ones[:ids.shape[0]].shape[0]
    return total


def read_arrays(dataset: MegatronDataset, rows: list[int]) -> int:
    total = 0
    for row in rows:
        _ids, mask = dataset.arrays(row)
        total += mask.shape[0]
    return total


def read_input_ids(dataset: MegatronDataset, rows: list[int]) -> int:
    total = 0
    for row in rows:
        total += dataset.input_ids(row).shape[0]
    return total


def read_core(dataset, rows: list[int]) -> int:
    """megatron-core's ``IndexedDataset[row]`` (a uint16 ndarray over its .bin map)."""
    total = 0
    for row in rows:
        total += dataset[row].shape[0]
    return total


def read_floor(tokens: np.ndarray, starts: list[int], ends: list[int]) -> int:
    total = 0
    for start, end in zip(starts, ends):
        total += tokens[start:end].shape[0]
    return total


def read_core_like(prefix: str, dataset: MegatronDataset, rows: list[int]) -> int:
    """megatron-core's read path (docstring): index arrays, then np.frombuffer per sequence."""
    buffer = memoryview(np.memmap(prefix + ".bin", mode="r", order="C"))
    pointers, lengths = dataset.pointers, dataset.sizes
    total = 0
    for row in rows:
        pointer, length = pointers[row], lengths[row]
        total += np.frombuffer(buffer, dtype=np.uint16, count=length, offset=pointer).shape[0]
    return total


def same_sequences(ours: MegatronDataset, core) -> None:
    """Every sequence megatron-core returns equals ours, and so do the index arrays."""
    assert len(core) == len(ours)
    assert np.array_equal(core.sequence_lengths, ours.sizes)
    assert np.array_equal(core.document_indices, ours.document_indices)
    for row in range(len(ours)):
        theirs = core[row]
        assert theirs.dtype == ours.dtype and np.array_equal(theirs, ours.input_ids(row)), row


def table(title: str, runs: dict, best: list[float], samples: int, reference: str) -> None:
    names = list(runs)
    base = best[names.index(reference)]
    print(f"\n{title}")
    print(f"{'reader':<16} {'seconds':>8} {'us/seq':>7} {'vs ' + reference:>14}")
    for name, seconds in zip(names, best):
        print(f"{name:<16} {seconds:8.3f} {seconds / samples * 1e6:7.2f} {seconds / base:13.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--folder", default=None)
    args = parser.parse_args()
    IndexedDataset = core_indexed_dataset()
    with tempfile.TemporaryDirectory() as temporary:
        folder = args.folder or temporary
        prefix = os.path.join(folder, "bench")
        lengths = write_source(prefix, args.samples)
        dataset = MegatronDataset.open(prefix)
        core = IndexedDataset(prefix) if IndexedDataset is not None else None
        in_order = list(range(args.samples))
        shuffled = np.random.default_rng(1).permutation(args.samples).tolist()
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).tolist()
        ends = np.cumsum(lengths).tolist()
        mapped = np.memmap(prefix + ".bin", dtype=np.uint16, mode="r")
        plain = np.fromfile(prefix + ".bin", dtype=np.uint16)
        expected = int(lengths.sum())
        if core is not None:
            same_sequences(dataset, core)
        passes = {}
        for label, rows in (("in order", in_order), ("random order", shuffled)):
            runs = {}
            if core is not None:
                runs["megatron-core"] = lambda rows=rows: read_core(core, rows)
            runs["ours input_ids"] = lambda rows=rows: read_input_ids(dataset, rows)
            runs["ours arrays"] = lambda rows=rows: read_arrays(dataset, rows)
            runs["core-like"] = lambda rows=rows: read_core_like(prefix, dataset, rows)
            if rows is in_order:
                runs["before"] = lambda: read_before(dataset, in_order)
                runs["floor memmap"] = lambda: read_floor(mapped, starts, ends)
                runs["floor ndarray"] = lambda: read_floor(plain, starts, ends)
            for name, run in runs.items():
                assert run() == expected, name
            passes[label] = (runs, best_of(args.repeat, *runs.values()))
        print(f"{args.samples} sequences, {expected} tokens, best of {args.repeat}; numpy {np.__version__}, "
              f"Python {sys.version.split()[0]}"
              + (f", megatron-core {_version('megatron-core')}" if core is not None else
                 ", megatron-core not installed (bench/megatron/setup.sh)"))
        for label, (runs, best) in passes.items():
            table(f"every sequence, {label}", runs, best, args.samples, "ours input_ids")
        if core is not None:
            for label, (runs, best) in passes.items():
                names = list(runs)
                theirs = best[names.index("megatron-core")]
                print(f"megatron-core / ours, {label}: input_ids {theirs / best[names.index('ours input_ids')]:.2f}x, "
                      f"arrays {theirs / best[names.index('ours arrays')]:.2f}x (> 1: ours faster)")


def _version(name: str) -> str:
    from importlib.metadata import version
    return version(name)


if __name__ == "__main__":
    main()
